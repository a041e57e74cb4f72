/*
 * job.h - one request travelling from an HTTP thread to the worker and back.
 *
 * The HTTP thread parses the body into `req`, enqueues the job and then
 * either waits for `finished` (non-streaming: it sends `body` with `status`)
 * or reads `out` as it grows (streaming: SSE bytes, written by the worker).
 * The two sides share the job through a reference count, so whichever is
 * last frees it: a client that disconnects mid-stream drops its reference
 * and sets `cancelled`, and the worker stops generating at the next token.
 */
#ifndef DS4_SERVER_JOB_H
#define DS4_SERVER_JOB_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "server/api_request.h"

typedef struct job job;
struct job {
    api_request req;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;

    /* worker -> HTTP */
    char *out;               /* streaming bytes, or the final body */
    size_t out_len, out_cap, out_read;
    bool started;            /* the worker took the job (prefill begins) */
    bool headers_sent;       /* HTTP side: a queued stream was answered 200 SSE
                                already; a failure must then be an SSE event */
    bool finished;
    int status;              /* HTTP status of the final body */

    /* HTTP -> worker */
    bool cancelled;
    double submitted_ms;     /* CLOCK_MONOTONIC ms at worker_submit (log) */

    job *next;               /* queue link */
};

job *job_new(void);
void job_ref(job *j);
void job_unref(job *j);

/* Worker side: append bytes (streaming) and wake the reader. */
void job_write(job *j, const char *s, size_t n);
/* Worker side: the final body (non-streaming) or end of stream. */
void job_finish(job *j, int status);
/* Worker side: has the client already got 200 SSE headers (a stream that
 * waited in the queue)? Then a failure is sent as an error event. */
bool job_headers_sent(job *j);
/* Either side. */
bool job_is_cancelled(job *j);
void job_cancel(job *j);

#endif

/*
 * worker.h - the thread that owns the engine and its live sessions (slots).
 *
 * HTTP threads enqueue jobs; the worker gives them free slots in order
 * (--parallel N slots, each one engine session), renders the prompt,
 * decides how much of it the slot's session (or a snapshot) already holds,
 * prefills the rest, generates (all generating slots advance together, one
 * batched decode step per token), and writes the response into the job.
 * One request's failure becomes that request's error response; the worker
 * carries on with the others.
 */
#ifndef DS4_SERVER_WORKER_H
#define DS4_SERVER_WORKER_H

#include <stdbool.h>
#include <stdint.h>

#include "server/engine_port.h"
#include "server/job.h"
#include "server/server_config.h"

typedef struct worker worker;

worker *worker_start(srv_engine *eng, const server_config *cfg, char *err, size_t err_size);
/* Saves the live session (shutdown moment), stops the thread, fails queued
 * jobs with 503. The engine is not closed. */
void worker_stop(worker *w);

/* Returns 0, or -1 when the queue is full (the caller answers 503). */
int worker_submit(worker *w, job *j);

const char *worker_model_id(worker *w);
int worker_ctx(worker *w);
/* Prompt tokens of a request as it would be rendered (count_tokens).
 * Callable from any thread. Returns 0, or -1 when rendering failed. */
int worker_count_tokens(worker *w, const api_request *r, int *n);
int worker_queue_length(worker *w);

/* What /health reports about the slots and the batched decode. */
typedef struct {
    int slots;                 /* --parallel */
    int busy;                  /* slots serving a request */
    int queue;                 /* requests waiting for a slot */
    uint64_t decode_steps;     /* decode_batch calls */
    uint64_t batched_steps;    /* of those, with more than one session */
    uint64_t decode_tokens;    /* tokens fed by them */
    int max_batch;             /* most sessions in one step */
} worker_stats;
void worker_get_stats(worker *w, worker_stats *out);

#endif

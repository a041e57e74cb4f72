/*
 * worker.h - the thread that owns the engine and its one live session.
 *
 * HTTP threads enqueue jobs; the worker takes them in order, renders the
 * prompt, decides how much of it the live session (or a disk snapshot)
 * already holds, prefills the rest, generates, and writes the response into
 * the job. One request's failure becomes that request's error response;
 * the worker carries on with the next.
 */
#ifndef DS4_SERVER_WORKER_H
#define DS4_SERVER_WORKER_H

#include <stdbool.h>

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
int worker_queue_length(worker *w);

#endif

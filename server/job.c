/*
 * job.c - the shared request object (see job.h).
 */
#include "server/job.h"

#include <stdlib.h>
#include <string.h>

job *job_new(void)
{
    job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->status = 200;
    return j;
}

void job_ref(job *j)
{
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
}

void job_unref(job *j)
{
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left) return;
    api_request_free(&j->req);
    free(j->out);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

void job_write(job *j, const char *s, size_t n)
{
    pthread_mutex_lock(&j->mu);
    if (j->out_len + n + 1 > j->out_cap) {
        size_t cap = j->out_cap ? j->out_cap * 2 : 4096;
        while (cap < j->out_len + n + 1) cap *= 2;
        char *q = realloc(j->out, cap);
        if (!q) { pthread_mutex_unlock(&j->mu); return; }
        j->out = q;
        j->out_cap = cap;
    }
    memcpy(j->out + j->out_len, s, n);
    j->out_len += n;
    j->out[j->out_len] = 0;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

void job_finish(job *j, int status)
{
    pthread_mutex_lock(&j->mu);
    j->finished = true;
    j->status = status;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

bool job_is_cancelled(job *j)
{
    pthread_mutex_lock(&j->mu);
    bool c = j->cancelled;
    pthread_mutex_unlock(&j->mu);
    return c;
}

void job_cancel(job *j)
{
    pthread_mutex_lock(&j->mu);
    j->cancelled = true;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

bool job_headers_sent(job *j)
{
    pthread_mutex_lock(&j->mu);
    bool h = j->headers_sent;
    pthread_mutex_unlock(&j->mu);
    return h;
}

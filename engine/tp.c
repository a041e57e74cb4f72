/*
 * tp.c - tensor parallel in one process (tp.h): the rank threads, the
 * sessions' per-rank states, and the session operations run on every rank.
 *
 * A run hands one function to all ranks: rank 0 runs it on the caller's
 * thread, the workers on theirs, and the caller waits for all. A rank
 * that fails reports its status and message; the run returns the first
 * failing rank's, its message prefixed with the rank. The ranks fail
 * together where they can fail at all (the same checks on the same
 * inputs, before any collective), so no rank is left waiting in one.
 */
#include "engine/tp.h"

#include "backend/comm.h"
#include "util/error.h"
#if DS4_HAVE_CUDA
#include "backend/cuda/cuda_comm.h"
#endif

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TP_MAX DS4_COMM_MAX_RANKS

typedef ds4_status (*rank_fn)(void *ctx, int rank);

struct ds4_tp {
    int size;
    dsv4_model *view[TP_MAX];
    ds4_comm *comm[TP_MAX];
    pthread_t th[TP_MAX];
    int started; /* worker threads running: ranks 1..started */
    pthread_mutex_t run_mu; /* one run at a time */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    unsigned long job;
    int n_done;
    bool quit;
    rank_fn fn;
    void *ctx;
    ds4_status st[TP_MAX];
    char msg[TP_MAX][512];
};

typedef struct {
    ds4_tp *tp;
    int rank;
} worker_arg;



static void *worker_main(void *p)
{
    worker_arg *a = p;
    ds4_tp *tp = a->tp;
    int rank = a->rank;
    free(a);
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&tp->mu);
        while (tp->job == seen && !tp->quit) pthread_cond_wait(&tp->go, &tp->mu);
        if (tp->quit) {
            pthread_mutex_unlock(&tp->mu);
            return NULL;
        }
        seen = tp->job;
        rank_fn fn = tp->fn;
        void *ctx = tp->ctx;
        pthread_mutex_unlock(&tp->mu);
        ds4_status st = fn(ctx, rank);
        pthread_mutex_lock(&tp->mu);
        tp->st[rank] = st;
        if (st != DS4_OK) snprintf(tp->msg[rank], sizeof tp->msg[rank], "%s", ds4_last_error());
        if (++tp->n_done == tp->size - 1) pthread_cond_signal(&tp->done);
        pthread_mutex_unlock(&tp->mu);
    }
}

static ds4_status run(ds4_tp *tp, rank_fn fn, void *ctx)
{
    pthread_mutex_lock(&tp->run_mu);
    pthread_mutex_lock(&tp->mu);
    tp->fn = fn;
    tp->ctx = ctx;
    tp->n_done = 0;
    tp->job++;
    pthread_cond_broadcast(&tp->go);
    pthread_mutex_unlock(&tp->mu);
    ds4_status st = fn(ctx, 0);
    pthread_mutex_lock(&tp->mu);
    while (tp->n_done < tp->size - 1) pthread_cond_wait(&tp->done, &tp->mu);
    for (int r = 1; r < tp->size && st == DS4_OK; r++)
        if (tp->st[r] != DS4_OK) st = ds4_fail(tp->st[r], "tensor parallel rank %d: %s", r, tp->msg[r]);
    pthread_mutex_unlock(&tp->mu);
    pthread_mutex_unlock(&tp->run_mu);
    return st;
}

ds4_status ds4_tp_open(const dsv4_model *m, int size, ds4_tp **out)
{
    *out = NULL;
    if (size < 2 || size > TP_MAX)
        return ds4_fail(DS4_ERR_INVALID, "tensor parallel: %d ranks (2..%d allowed)", size, TP_MAX);
    ds4_tp *tp = calloc(1, sizeof *tp);
    if (!tp) return ds4_fail(DS4_ERR_NOMEM, "tensor parallel: out of memory");
    tp->size = size;
    pthread_mutex_init(&tp->run_mu, NULL);
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->go, NULL);
    pthread_cond_init(&tp->done, NULL);
    ds4_status st = ds4_comm_local_create(size, tp->comm);
    for (int r = 0; r < size && st == DS4_OK; r++)
        if (!(tp->view[r] = dsv4_model_shard(m, r, size))) st = DS4_ERR_INVALID;
    for (int r = 1; r < size && st == DS4_OK; r++) {
        worker_arg *a = malloc(sizeof *a);
        if (!a) {
            st = ds4_fail(DS4_ERR_NOMEM, "tensor parallel: out of memory");
            break;
        }
        *a = (worker_arg){tp, r};
        if (pthread_create(&tp->th[r], NULL, worker_main, a) != 0) {
            free(a);
            st = ds4_fail(DS4_ERR_IO, "tensor parallel: cannot start the thread of rank %d", r);
            break;
        }
        tp->started = r;
    }
    if (st != DS4_OK) {
        ds4_tp_close(tp);
        return st;
    }

    *out = tp;
    return DS4_OK;
}

void ds4_tp_close(ds4_tp *tp)
{
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    tp->quit = true;
    pthread_cond_broadcast(&tp->go);
    pthread_mutex_unlock(&tp->mu);
    for (int r = 1; r <= tp->started; r++) pthread_join(tp->th[r], NULL);
    for (int r = 0; r < tp->size; r++) dsv4_model_shard_free(tp->view[r]);
    ds4_comm_local_free(tp->comm, tp->size);
    pthread_mutex_destroy(&tp->run_mu);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->go);
    pthread_cond_destroy(&tp->done);
    free(tp);
}

int ds4_tp_size(const ds4_tp *tp) { return tp->size; }
const dsv4_model *ds4_tp_view(const ds4_tp *tp, int rank) { return tp->view[rank]; }

/* ---- sessions ----------------------------------------------------------- */

struct ds4_tp_session {
    ds4_tp *tp;
    ds4_backend *be[TP_MAX];
    dsv4_state *st[TP_MAX];
    bool cuda;              /* CUDA ranks: each run binds the rank's device to its thread */
    ds4_comm *comm[TP_MAX]; /* the session's own endpoints (CUDA ranks), else NULL */
    void (*comm_free)(ds4_comm **eps, int size);
};

/* A rank's thread before it runs the rank's ops. */
static void bind_rank(ds4_tp_session *d, int rank)
{
#if DS4_HAVE_CUDA
    if (d->cuda) ds4_cuda_bind_thread(d->be[rank]);
#else
    (void)d;
    (void)rank;
#endif
}

/* CUDA ranks: NCCL over distinct GPUs, the host-staged group otherwise. */
static ds4_status session_comm(ds4_tp_session *d)
{
    int n = d->tp->size;
    bool distinct = true;
    for (int r = 0; r < n; r++) {
        if (strcmp(d->be[r]->name, d->be[0]->name) != 0)
            return ds4_fail(DS4_ERR_INVALID, "tensor parallel: rank %d is on the %s backend, rank 0 on %s", r,
                            d->be[r]->name, d->be[0]->name);
        for (int k = 0; k < r; k++) distinct &= d->be[k]->shares_memory ? !d->be[k]->shares_memory(d->be[k], d->be[r]) : true;
    }
    d->cuda = strcmp(d->be[0]->name, "cuda") == 0;
    if (strcmp(d->be[0]->name, "cpu") == 0) return DS4_OK; /* the group's in-process endpoints */
#if DS4_HAVE_CUDA
    if (d->cuda && distinct) {
        d->comm_free = ds4_comm_nccl_free;
        return ds4_comm_nccl_create(n, d->be, d->comm);
    }
#endif
    (void)distinct;
    d->comm_free = ds4_comm_staged_free;
    return ds4_comm_staged_create(n, d->be, d->comm);
}

typedef struct {
    ds4_backend *be;
    ds4_status st;
} prep_ctx;

static void prepare_one(void *ctx, const ds4_weight *w)
{
    prep_ctx *p = ctx;
    if (p->st == DS4_OK) p->st = p->be->weight_prepare(p->be, w);
}

ds4_status ds4_tp_session_open(ds4_tp *tp, ds4_backend **be, int64_t n_ctx, int max_chunk, const ds4_kv_numerics *nm,
                               ds4_tp_session **out)
{
    *out = NULL;
    ds4_tp_session *d = calloc(1, sizeof *d);
    if (!d) {
        for (int r = 0; r < tp->size; r++)
            if (be[r]) be[r]->destroy(be[r]);
        return ds4_fail(DS4_ERR_NOMEM, "tensor parallel: out of memory");
    }
    d->tp = tp;
    for (int r = 0; r < tp->size; r++) d->be[r] = be[r];
    ds4_status st = session_comm(d);
    for (int r = 0; r < tp->size && st == DS4_OK; r++) {
        bind_rank(d, r);
        prep_ctx pc = {be[r], DS4_OK};
        dsv4_model_for_each_weight(tp->view[r], prepare_one, &pc);
        st = pc.st;
        if (st == DS4_OK) st = dsv4_state_create(tp->view[r], be[r], n_ctx, max_chunk, nm, &d->st[r]);
        if (st == DS4_OK) d->st[r]->comm = d->comm_free ? d->comm[r] : tp->comm[r];
        else ds4_error_prefix("tensor parallel rank %d: ", r);
    }
    bind_rank(d, 0); /* the caller's thread runs rank 0 */
    if (st != DS4_OK) {
        ds4_tp_session_close(d);
        return st;
    }
    *out = d;
    return DS4_OK;
}

void ds4_tp_session_close(ds4_tp_session *d)
{
    if (!d) return;
    if (d->comm_free) d->comm_free(d->comm, d->tp->size);
    for (int r = 0; r < d->tp->size; r++) {
        bind_rank(d, r);
        dsv4_state_free(d->st[r]);
        if (d->be[r]) d->be[r]->destroy(d->be[r]);
    }
    free(d);
}

dsv4_state *ds4_tp_session_state(ds4_tp_session *d, int rank) { return d->st[rank]; }

typedef struct {
    ds4_tp_session *d;
    const int32_t *tokens;
    int64_t n;
    float *all_logits, *last_logits;
} prefill_job;

static ds4_status prefill_rank(void *p, int rank)
{
    prefill_job *j = p;
    dsv4_state *s = j->d->st[rank];
    const int V = s->m->cfg.n_vocab;
    bind_rank(j->d, rank);
    for (int64_t i = 0; i < j->n;) {
        int T = j->n - i > s->max_chunk ? s->max_chunk : (int)(j->n - i);
        bool last = i + T == j->n;
        ds4_status st;
        if (rank == 0 && j->all_logits) {
            st = dsv4_forward(s, j->tokens + i, T, true, j->all_logits + (size_t)i * V);
            if (st == DS4_OK && last)
                memcpy(j->last_logits, j->all_logits + (size_t)(j->n - 1) * V, (size_t)V * sizeof(float));
        } else {
            /* the other ranks take part in the head's gather but keep no logits */
            st = dsv4_forward(s, j->tokens + i, T, j->all_logits != NULL, rank == 0 && last ? j->last_logits : NULL);
        }
        if (st != DS4_OK) return st;
        i += T;
    }
    return DS4_OK;
}

ds4_status ds4_tp_prefill(ds4_tp_session *d, const int32_t *tokens, int64_t n, float *all_logits, float *last_logits)
{
    if (n == 0) return DS4_OK;
    prefill_job j = {d, tokens, n, all_logits, last_logits};
    return run(d->tp, prefill_rank, &j);
}

typedef struct {
    ds4_tp_session *const *d;
    const int32_t *tokens;
    int n;
    float *const *logits;
    dsv4_state **st; /* size x n: rank r's states at st + r * n */
} batch_job;

static ds4_status batch_rank(void *p, int rank)
{
    batch_job *j = p;
    bind_rank(j->d[0], rank);
    return dsv4_forward_batch(j->st + (size_t)rank * j->n, j->tokens, j->n, rank == 0 ? j->logits : NULL);
}

ds4_status ds4_tp_decode_batch(ds4_tp_session *const *d, const int32_t *tokens, int n, float *const *logits)
{
    if (n < 1) return ds4_fail(DS4_ERR_INVALID, "tensor parallel: %d sessions in a step", n);
    ds4_tp *tp = d[0]->tp;
    for (int i = 1; i < n; i++)
        if (d[i]->tp != tp) return ds4_fail(DS4_ERR_INVALID, "session %d of %d is of another model than session 0", i, n);
    dsv4_state **st = malloc((size_t)tp->size * (size_t)n * sizeof *st);
    if (!st) return ds4_fail(DS4_ERR_NOMEM, "tensor parallel: out of memory for %d sessions", n);
    ds4_status rc = DS4_OK;
    for (int r = 0; r < tp->size && rc == DS4_OK; r++) {
        for (int i = 0; i < n; i++) st[(size_t)r * n + i] = d[i]->st[r];
        /* every rank's checks before any rank starts: none may stop alone */
        rc = dsv4_batch_check(st + (size_t)r * n, tokens, n);
        if (rc == DS4_OK && n > dsv4_state_batch_rows(st[(size_t)r * n]))
            rc = ds4_fail(DS4_ERR_INVALID, "%d sessions, more than session 0's %d rows", n, dsv4_state_batch_rows(st[(size_t)r * n]));
        if (rc != DS4_OK) ds4_error_prefix("tensor parallel rank %d: ", r);
    }
    batch_job j = {d, tokens, n, logits, st};
    if (rc == DS4_OK) rc = run(tp, batch_rank, &j);
    free(st);
    return rc;
}

void ds4_tp_reset_others(ds4_tp_session *d)
{
    for (int r = 1; r < d->tp->size; r++) {
        bind_rank(d, r);
        dsv4_state_reset(d->st[r]);
    }
    bind_rank(d, 0);
}

ds4_status ds4_tp_restore(ds4_tp_session *d, const void *buf, size_t len)
{
    for (int r = 0; r < d->tp->size; r++) {
        bind_rank(d, r);
        ds4_status st = dsv4_state_restore(d->st[r], buf, len);
        bind_rank(d, 0);
        if (st != DS4_OK) {
            if (r) ds4_error_prefix("tensor parallel rank %d: ", r);
            return st;
        }
    }
    return DS4_OK;
}

/*
 * comm_local.c - the in-process communicator (backend/comm.h): the ranks
 * are threads of one process and exchange data through shared memory.
 *
 * Every collective is a few phases separated by a group barrier: each rank
 * publishes its buffer's address, the ranks work on the published buffers,
 * and a last barrier keeps a fast rank from reusing the slots while a slow
 * one still reads them. The all-reduce splits the elements into `size`
 * ranges; rank r sums range r over the ranks in order 0..size-1 into a
 * shared scratch, and every rank copies the whole scratch back, so the sum
 * order is fixed and all ranks receive the same bits.
 *
 * The barrier sleeps on a condition variable: ranks share the cores with
 * the CPU backend's worker threads, so spinning would take cycles from the
 * ranks still computing.
 */
#include "backend/comm.h"

#include "util/error.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int size;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int waiting;
    unsigned long generation;
    void *slot[DS4_COMM_MAX_RANKS]; /* the buffers published in this collective */
    float *scratch;
    size_t scratch_n;
    int failed; /* set by rank 0 before a barrier, read by all after it */
} local_group;

typedef struct {
    ds4_comm pub; /* first: the endpoint is its ds4_comm */
    local_group *g;
    ds4_status st;
} local_ep;

static local_ep *ep_of(ds4_comm *c) { return (local_ep *)c; }

static void group_barrier(local_group *g)
{
    pthread_mutex_lock(&g->mu);
    unsigned long gen = g->generation;
    if (++g->waiting == g->size) {
        g->waiting = 0;
        g->generation++;
        pthread_cond_broadcast(&g->cv);
    } else {
        while (gen == g->generation) pthread_cond_wait(&g->cv, &g->mu);
    }
    pthread_mutex_unlock(&g->mu);
}

/* After a barrier: whether the group failed (every rank sees the same). */
static int group_failed(local_ep *e)
{
    if (!e->g->failed) return 0;
    if (e->st == DS4_OK)
        e->st = ds4_fail(DS4_ERR_NOMEM, "tensor parallel: out of memory for the all-reduce scratch (rank %d)",
                         e->pub.rank);
    return 1;
}

static void local_allreduce(ds4_comm *c, float *x, size_t n)
{
    local_ep *e = ep_of(c);
    local_group *g = e->g;
    if (g->size == 1 || e->st != DS4_OK) return;
    g->slot[c->rank] = x;
    if (c->rank == 0 && n > g->scratch_n) {
        float *p = realloc(g->scratch, n * sizeof(float));
        if (p) {
            g->scratch = p;
            g->scratch_n = n;
        } else {
            g->failed = 1;
        }
    }
    group_barrier(g);
    if (group_failed(e)) return;
    size_t lo = n * (size_t)c->rank / (size_t)g->size, hi = n * (size_t)(c->rank + 1) / (size_t)g->size;
    const float *first = g->slot[0];
    for (size_t i = lo; i < hi; i++) g->scratch[i] = first[i];
    for (int r = 1; r < g->size; r++) {
        const float *src = g->slot[r];
        for (size_t i = lo; i < hi; i++) g->scratch[i] += src[i];
    }
    group_barrier(g);
    memcpy(x, g->scratch, n * sizeof(float));
    group_barrier(g);
}

static void local_allgather(ds4_comm *c, const float *send, size_t n, float *recv)
{
    local_ep *e = ep_of(c);
    local_group *g = e->g;
    if (e->st != DS4_OK) return;
    if (g->size == 1) {
        memcpy(recv, send, n * sizeof(float));
        return;
    }
    g->slot[c->rank] = (void *)send;
    group_barrier(g);
    for (int r = 0; r < g->size; r++) memcpy(recv + (size_t)r * n, g->slot[r], n * sizeof(float));
    group_barrier(g);
}

static void local_gather(ds4_comm *c, const float *send, size_t n, float *recv, int root)
{
    local_ep *e = ep_of(c);
    local_group *g = e->g;
    if (e->st != DS4_OK) return;
    if (g->size == 1) {
        memcpy(recv, send, n * sizeof(float));
        return;
    }
    g->slot[c->rank] = (void *)send;
    group_barrier(g);
    if (c->rank == root)
        for (int r = 0; r < g->size; r++) memcpy(recv + (size_t)r * n, g->slot[r], n * sizeof(float));
    group_barrier(g);
}

static void local_broadcast(ds4_comm *c, void *buf, size_t bytes, int root)
{
    local_ep *e = ep_of(c);
    local_group *g = e->g;
    if (g->size == 1 || e->st != DS4_OK) return;
    if (c->rank == root) g->slot[root] = buf;
    group_barrier(g);
    if (c->rank != root) memcpy(buf, g->slot[root], bytes);
    group_barrier(g);
}

static void local_barrier(ds4_comm *c)
{
    if (c->size > 1) group_barrier(ep_of(c)->g);
}

static ds4_status local_status(ds4_comm *c) { return ep_of(c)->st; }

ds4_status ds4_comm_local_create(int size, ds4_comm **eps)
{
    if (size < 1 || size > DS4_COMM_MAX_RANKS)
        return ds4_fail(DS4_ERR_INVALID, "tensor parallel: %d ranks (1..%d allowed)", size, DS4_COMM_MAX_RANKS);
    for (int r = 0; r < size; r++) eps[r] = NULL;
    local_group *g = calloc(1, sizeof *g);
    if (!g) return ds4_fail(DS4_ERR_NOMEM, "tensor parallel: out of memory");
    g->size = size;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    for (int r = 0; r < size; r++) {
        local_ep *e = calloc(1, sizeof *e);
        if (!e) {
            ds4_comm_local_free(eps, size);
            if (r == 0) { /* no endpoint holds the group yet */
                pthread_mutex_destroy(&g->mu);
                pthread_cond_destroy(&g->cv);
                free(g);
            }
            return ds4_fail(DS4_ERR_NOMEM, "tensor parallel: out of memory");
        }
        e->g = g;
        e->pub.rank = r;
        e->pub.size = size;
        e->pub.allreduce_sum_f32 = local_allreduce;
        e->pub.allgather_f32 = local_allgather;
        e->pub.gather_f32 = local_gather;
        e->pub.broadcast = local_broadcast;
        e->pub.barrier = local_barrier;
        e->pub.status = local_status;
        eps[r] = &e->pub;
    }
    return DS4_OK;
}

void ds4_comm_local_free(ds4_comm **eps, int size)
{
    local_group *g = NULL;
    for (int r = 0; r < size; r++) {
        if (!eps[r]) continue;
        g = ep_of(eps[r])->g;
        free(eps[r]);
        eps[r] = NULL;
    }
    if (!g) return;
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g->scratch);
    free(g);
}

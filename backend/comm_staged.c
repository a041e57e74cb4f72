/*
 * comm_staged.c - the in-process communicator through host copies
 * (backend/comm.h, ds4_comm_staged_create): each endpoint wraps an
 * endpoint of an in-process group and the rank's backend, and moves its
 * buffers to host memory and back around every collective (download and
 * upload wait for the rank's queued work, so the order with its ops
 * holds). The results are the in-process group's: rank-order sums.
 */
#include "backend/comm.h"

#include "backend/ops.h"
#include "util/error.h"

#include <stdlib.h>

typedef struct {
    ds4_comm pub; /* first: the endpoint is its ds4_comm */
    ds4_comm *inner;
    ds4_backend *be;
    float *h, *h2; /* host copies */
    size_t cap, cap2;
    ds4_status st;
} staged_ep;

static staged_ep *ep_of(ds4_comm *c) { return (staged_ep *)c; }

/* Host room for n floats in *buf; false (status set) when memory is out.
 * Every rank fails the same way only by chance, so a rank that cannot
 * allocate still takes part in the collective with what it has. */
static bool room(staged_ep *e, float **buf, size_t *cap, size_t n)
{
    if (n <= *cap) return true;
    float *p = realloc(*buf, n * sizeof(float));
    if (!p) {
        if (e->st == DS4_OK) e->st = ds4_fail(DS4_ERR_NOMEM, "tensor parallel: out of host memory (rank %d)", e->pub.rank);
        return false;
    }
    *buf = p;
    *cap = n;
    return true;
}

static ds4_status staged_status(ds4_comm *c)
{
    staged_ep *e = ep_of(c);
    return e->st != DS4_OK ? e->st : e->inner->status(e->inner);
}

static void staged_allreduce(ds4_comm *c, float *x, size_t n)
{
    staged_ep *e = ep_of(c);
    if (!room(e, &e->h, &e->cap, n)) return;
    e->be->download(e->be, e->h, x, n * sizeof(float));
    e->inner->allreduce_sum_f32(e->inner, e->h, n);
    e->be->upload(e->be, x, e->h, n * sizeof(float));
}

static void staged_allgather(ds4_comm *c, const float *send, size_t n, float *recv)
{
    staged_ep *e = ep_of(c);
    if (!room(e, &e->h, &e->cap, n) || !room(e, &e->h2, &e->cap2, n * (size_t)c->size)) return;
    e->be->download(e->be, e->h, send, n * sizeof(float));
    e->inner->allgather_f32(e->inner, e->h, n, e->h2);
    e->be->upload(e->be, recv, e->h2, n * (size_t)c->size * sizeof(float));
}

static void staged_gather(ds4_comm *c, const float *send, size_t n, float *recv, int root)
{
    staged_ep *e = ep_of(c);
    bool is_root = c->rank == root;
    if (!room(e, &e->h, &e->cap, n) || (is_root && !room(e, &e->h2, &e->cap2, n * (size_t)c->size))) return;
    e->be->download(e->be, e->h, send, n * sizeof(float));
    e->inner->gather_f32(e->inner, e->h, n, is_root ? e->h2 : NULL, root);
    if (is_root) e->be->upload(e->be, recv, e->h2, n * (size_t)c->size * sizeof(float));
}

static void staged_broadcast(ds4_comm *c, void *buf, size_t bytes, int root)
{
    staged_ep *e = ep_of(c);
    if (!room(e, &e->h, &e->cap, (bytes + sizeof(float) - 1) / sizeof(float))) return;
    if (c->rank == root) e->be->download(e->be, e->h, buf, bytes);
    e->inner->broadcast(e->inner, e->h, bytes, root);
    if (c->rank != root) e->be->upload(e->be, buf, e->h, bytes);
}

static void staged_barrier(ds4_comm *c)
{
    staged_ep *e = ep_of(c);
    if (e->be->sync) e->be->sync(e->be);
    e->inner->barrier(e->inner);
}

ds4_status ds4_comm_staged_create(int size, ds4_backend *const *be, ds4_comm **eps)
{
    ds4_comm *inner[DS4_COMM_MAX_RANKS];
    ds4_status st = ds4_comm_local_create(size, inner);
    if (st != DS4_OK) return st;
    for (int r = 0; r < size; r++) eps[r] = NULL;
    for (int r = 0; r < size; r++) {
        staged_ep *e = calloc(1, sizeof *e);
        if (!e) {
            ds4_comm_local_free(inner, size); /* the whole inner group */
            for (int k = 0; k < r; k++) free(eps[k]);
            for (int k = 0; k < r; k++) eps[k] = NULL;
            return ds4_fail(DS4_ERR_NOMEM, "tensor parallel: out of memory");
        }
        e->inner = inner[r];
        e->be = be[r];
        e->pub.rank = r;
        e->pub.size = size;
        e->pub.allreduce_sum_f32 = staged_allreduce;
        e->pub.allgather_f32 = staged_allgather;
        e->pub.gather_f32 = staged_gather;
        e->pub.broadcast = staged_broadcast;
        e->pub.barrier = staged_barrier;
        e->pub.status = staged_status;
        eps[r] = &e->pub;
    }
    return DS4_OK;
}

void ds4_comm_staged_free(ds4_comm **eps, int size)
{
    ds4_comm *inner[DS4_COMM_MAX_RANKS];
    int have = 0;
    for (int r = 0; r < size; r++) {
        inner[r] = eps[r] ? ep_of(eps[r])->inner : NULL;
        have |= inner[r] != NULL;
    }
    if (have) ds4_comm_local_free(inner, size);
    for (int r = 0; r < size; r++) {
        if (!eps[r]) continue;
        free(ep_of(eps[r])->h);
        free(ep_of(eps[r])->h2);
        free(eps[r]);
        eps[r] = NULL;
    }
}

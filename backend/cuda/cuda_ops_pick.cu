/*
 * cuda_ops_pick.cu - the greedy pick of ops.h (argmax_rows) and the
 * device copy (copy) with which a batched step leaves each session's
 * logits row in that session's own buffer.
 *
 * argmax_rows queues the pick kernel (cuda_argmax.cu) on the backend's
 * stream after whatever produced the logits (a decode step's replayed
 * graph included: the pick is launched after the graph, outside the
 * recording, so the recording and its signature are the same with or
 * without it), then one 4 x n byte download into page-locked memory, and
 * waits: the only bytes of the step that cross to the host. The buffers
 * are the backend's, grown to the largest n seen (a batched step's
 * sessions), never on the forward's scratch (a reallocation there would
 * make a recorded graph stale).
 */
#include "backend/cuda/cuda_backend.cuh"

#include <stdlib.h>
#include <string.h>

struct cb_pick {
    int32_t *d_out; /* the kernel's picks */
    int32_t *h_out; /* page-locked: one DMA, no staging copy */
    int cap;        /* picks both hold */
};

void cb_pick_free(cuda_backend *c)
{
    cb_pick *p = c->pick;
    if (!p) return;
    cudaStreamSynchronize(c->cu->stream);
    if (p->d_out) ds4_cuda_free(c->cu, p->d_out);
    if (p->h_out) cudaFreeHost(p->h_out);
    free(p);
    c->pick = NULL;
}

/* Room for n picks; NULL (message set) when it cannot be had. */
static cb_pick *pick_room(cuda_backend *c, int n)
{
    if (c->pick && c->pick->cap >= n) return c->pick;
    cb_pick_free(c);
    cb_pick *p = (cb_pick *)calloc(1, sizeof *p);
    if (!p) {
        ds4_fail(DS4_ERR_NOMEM, "cuda argmax_rows: out of memory");
        return NULL;
    }
    const int cap = n < 64 ? 64 : n;
    if (ds4_cuda_malloc(c->cu, (size_t)cap * sizeof(int32_t), (void **)&p->d_out) != DS4_OK) {
        free(p);
        return NULL;
    }
    const cudaError_t e = cudaMallocHost((void **)&p->h_out, (size_t)cap * sizeof(int32_t));
    if (e != cudaSuccess) {
        cudaGetLastError();
        ds4_cuda_free(c->cu, p->d_out);
        free(p);
        ds4_fail(DS4_ERR_NOMEM, "cuda argmax_rows: %zu bytes of page-locked memory: %s", (size_t)cap * sizeof(int32_t),
                 cudaGetErrorString(e));
        return NULL;
    }
    p->cap = cap;
    c->pick = p;
    return p;
}

static ds4_status op_argmax_rows(ds4_backend *be, const float *x, int n, int n_vocab, int32_t excluded, int32_t *out)
{
    cb_prof_scope prof_(be, "argmax_rows");
    cuda_backend *c = cb_of(be);
    if (n < 1 || n_vocab < 0 || !x || !out)
        return ds4_fail(DS4_ERR_INVALID, "cuda argmax_rows: %d rows of %d logits (at least one row; x and out set)",
                        n, n_vocab);
    /* never inside a step: the pick's download waits, which a recording cannot */
    if (c->g.mode != CB_STEP_NONE)
        return ds4_fail(DS4_ERR_INVALID, "cuda argmax_rows: called inside a decode step (mode %d)", c->g.mode);
    cb_pick *p = pick_room(c, n);
    if (!p) return DS4_ERR_NOMEM;
    ds4_status st = ds4_cuda_argmax_rows(c->cu, x, n, n_vocab, excluded, p->d_out);
    if (st == DS4_OK) {
        const cudaError_t e = cudaMemcpyAsync(p->h_out, p->d_out, (size_t)n * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                              c->cu->stream);
        const cudaError_t w = e == cudaSuccess ? cudaStreamSynchronize(c->cu->stream) : e;
        if (w != cudaSuccess) {
            cudaGetLastError();
            st = ds4_fail(DS4_ERR_BACKEND, "cuda argmax_rows: %s of %d picks failed: %s",
                          e != cudaSuccess ? "download" : "the wait for", n, cudaGetErrorString(w));
        }
    }
    if (st != DS4_OK) {
        cb_fail_status(be, st, "argmax_rows");
        return st;
    }
    memcpy(out, p->h_out, (size_t)n * sizeof(int32_t));
    cb_free_transient(c); /* as a download does: the step's transient weight copies are done with */
    return DS4_OK;
}

static void op_copy(ds4_backend *be, void *dst, const void *src, size_t bytes)
{
    CB_GRAPH_SKIP(be, 70, dst, src, (unsigned long)bytes);
    if (bytes) cb_fail_status(be, ds4_cuda_copy_d2d(cb_of(be)->cu, dst, src, bytes), "copy");
}

void cb_install_pick(ds4_backend *be)
{
    be->argmax_rows = op_argmax_rows;
    be->copy = op_copy;
}

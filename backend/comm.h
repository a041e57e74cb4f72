/*
 * comm.h - the communicator of a tensor-parallel run (docs/TENSOR-PARALLEL.md):
 * the few collectives the sharded forward pass needs, over the `size` ranks
 * of one group. Each rank holds its own endpoint and calls every collective
 * in the same order as the others (a rank that skips one blocks the rest).
 *
 * Buffers are the rank's device memory (what its backend's alloc returned):
 * host memory for the CPU backend, whose implementation is in-process
 * (comm_local.c: one thread per rank, shared memory). An NCCL
 * implementation for CUDA ranks would fill the same struct.
 *
 * Results are reproducible: the sum of an all-reduce is taken in rank order
 * 0, 1, ..., size-1 for every element, whatever the timing, and every rank
 * receives the same bits.
 */
#ifndef DS4_BACKEND_COMM_H
#define DS4_BACKEND_COMM_H

#include <stddef.h>

#include "include/ds4.h"

typedef struct ds4_comm ds4_comm;
struct ds4_comm {
    int rank, size;
    /* x[i] <- sum over ranks r (in order 0..size-1) of rank r's x[i], i < n. */
    void (*allreduce_sum_f32)(ds4_comm *c, float *x, size_t n);
    /* recv[r * n + i] <- rank r's send[i]: every rank gets every rank's n
     * floats, in rank order. send and recv do not overlap. */
    void (*allgather_f32)(ds4_comm *c, const float *send, size_t n, float *recv);
    /* The same into rank root's recv only (the others' recv is not
     * touched and may be NULL): what only one rank needs, such as the
     * logits, costs the others no buffer. */
    void (*gather_f32)(ds4_comm *c, const float *send, size_t n, float *recv, int root);
    /* Every rank's buf[0..bytes) <- rank root's. */
    void (*broadcast)(ds4_comm *c, void *buf, size_t bytes, int root);
    /* Returns when every rank has called it. */
    void (*barrier)(ds4_comm *c);
    /* DS4_OK, or the first failure of a collective on this endpoint (the
     * message was set on the thread that saw it; the collective's output
     * is then undefined). Sticky: a failed group is not used again. */
    ds4_status (*status)(ds4_comm *c);
};

/* The in-process group of `size` ranks (1..DS4_COMM_MAX_RANKS): fills
 * eps[0..size) with one endpoint per rank, to be used each from its own
 * thread. NULL-filled + message on failure. */
#define DS4_COMM_MAX_RANKS 64
ds4_status ds4_comm_local_create(int size, ds4_comm **eps);
/* Frees the group (every endpoint of it; none may be in a collective). */
void ds4_comm_local_free(ds4_comm **eps, int size);

/* The in-process group for ranks whose buffers are device memory the host
 * cannot address (be[r]: rank r's backend, e.g. CUDA ranks sharing one GPU,
 * where NCCL takes one rank per GPU): each collective downloads the rank's
 * buffer, runs the in-process collective on host copies and uploads the
 * result. Every collective waits for the device: for tests and fallbacks,
 * not speed. */
struct ds4_backend;
ds4_status ds4_comm_staged_create(int size, struct ds4_backend *const *be, ds4_comm **eps);
void ds4_comm_staged_free(ds4_comm **eps, int size);

#endif

/*
 * ops_cpu.h - private glue shared by the CPU implementation of backend/ops.h
 * (ops_cpu*.c): the backend struct, its thread pool, a persistent scratch
 * area and the per-row weight access used by the dense ops.
 *
 * The CPU backend computes in f32 with double-precision reductions where
 * a long sum decides accuracy (RMS norms). Device memory is host memory.
 */
#ifndef DS4_BACKEND_CPU_OPS_CPU_H
#define DS4_BACKEND_CPU_OPS_CPU_H

#include "backend/ops.h"
#include "util/threadpool.h"

typedef struct {
    ds4_backend base;
    ds4_threadpool *pool;
    int n_threads;
    /* Scratch: grown on demand by ops called from the session thread and
     * kept, so that steady-state decode allocates nothing. Two independent
     * areas so an op can hold one while calling matmul (which uses none). */
    void *scratch[2];
    size_t scratch_size[2];
    /* routed experts streamed through this cache (NULL: the mapping) */
    struct ds4_expert_cache *experts;
    /* one-token MoE sublayers done in one region (ops_cpu_moe.c; tests) */
    uint64_t moe_fused_calls;
    /* matmul pairs done in one pool run (ops_cpu_dense.c; tests) */
    uint64_t pair_calls;
    /* one-token grouped products done in one pool run (ops_cpu_dense.c; tests) */
    uint64_t grouped_calls;
} cpu_backend;

static inline cpu_backend *cpu_of(ds4_backend *be) { return (cpu_backend *)be; }

/* Scratch area `which` (0 or 1) of at least `bytes`; NULL if out of memory. */
void *cpu_scratch(ds4_backend *be, int which, size_t bytes);

/* Run fn(arg, i, thread) for i < n on the backend's pool. */
void cpu_parallel(ds4_backend *be, int64_t n, void (*fn)(void *, int64_t, int), void *arg);

/* Number of distinct thread indices cpu_parallel may pass. */
int cpu_thread_slots(ds4_backend *be);

/* Bytes of one row of n values of a weight type (0 if unsupported). */
size_t cpu_row_bytes(ds4_type type, int64_t n);

/* True when the CPU backend can multiply by weights of this type. */
int cpu_type_supported(ds4_type type);

/* Row r of a 2-D weight (or of a 3-D weight's flattened rows) as f32:
 * returns a pointer to the data itself for F32, else dequantizes into tmp
 * (ne[0] floats). */
const float *cpu_weight_row(const ds4_weight *w, int64_t r, float *tmp);

/* All values of a small F32/F16/BF16 parameter as f32 (into tmp, or the data
 * itself for F32). */
const float *cpu_weight_f32(const ds4_weight *w, float *tmp);

/* y[t, r] = W[r,:] . x[t,:] over a weight given as raw rows (used by the
 * matmul op and by the expert slices of the MoE op). */
void cpu_matmul_raw(ds4_backend *be, ds4_type type, const void *data,
                    int64_t rows, int64_t cols, const float *x, int64_t T,
                    float *y);

/* ops tables, one function per file */
void cpu_install_dense(ds4_backend *be);
void cpu_install_hc(ds4_backend *be);
void cpu_install_attention(ds4_backend *be);
void cpu_install_moe(ds4_backend *be);
/* argmax_rows and copy, only with DS4_CPU_PICK=1 (ops_cpu_pick.c) */
void cpu_install_pick(ds4_backend *be);

#endif

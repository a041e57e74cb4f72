/*
 * cuda_backend.cuh - private glue of the CUDA ops (cuda_ops_*.cu): the
 * backend struct, the device copies of weights, scratch, error handling.
 *
 * Weights: the model hands host views (ds4_weight). weight_prepare copies
 * each to device memory once (kept for the backend's life, keyed by the
 * host address and a fingerprint of type, shape and first/last bytes); a
 * weight that was never prepared (op tests) is uploaded for the call into
 * a transient buffer, freed at the next download.
 *
 * Errors: ops return nothing (the contract), so the first failure is kept
 * (cb->failed + the thread's ds4 error message) and reported on stderr;
 * later ops still run, results are then meaningless.
 */
#ifndef DS4_CUDA_BACKEND_CUH
#define DS4_CUDA_BACKEND_CUH

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_internal.cuh"

/* A device copy, keyed by host address and checked against a fingerprint
 * (type, shape and the first and last 64 bytes): a host buffer freed and
 * reused for another tensor (op tests do this) must not hit a stale copy. */
#define CB_FP_BYTES 64
typedef struct {
    const void *host;
    size_t bytes;
    void *dev;
    int type;
    int64_t ne[4];
    uint8_t head[CB_FP_BYTES], tail[CB_FP_BYTES];
} cb_weight_entry;

typedef struct {
    ds4_backend base;
    ds4_cuda *cu;
    cb_weight_entry *w; /* open addressing on host pointer */
    size_t w_cap, w_n;
    void **transient;
    size_t n_transient, cap_transient;
    void *scratch[3];
    size_t scratch_bytes[3];
    int failed;
    int profile; /* DS4_CUDA_PROFILE=1: per-op wall time (synchronizes each op) */
    struct {
        const char *name;
        double seconds;
        uint64_t calls;
    } prof[32];
} cuda_backend;

static inline cuda_backend *cb_of(ds4_backend *be) { return (cuda_backend *)be; }
static inline cudaStream_t cb_stream(ds4_backend *be) { return cb_of(be)->cu->stream; }

/* Record a failure (first one wins) from a status or a CUDA error. */
void cb_fail_status(ds4_backend *be, ds4_status st, const char *op);
void cb_check_launch(ds4_backend *be, const char *op);

/* Device copy of a weight's data (prepared, or uploaded for this call). */
const void *cb_weight(ds4_backend *be, const ds4_weight *w);

/* Bytes of a weight (all its dims). */
size_t cb_weight_bytes(const ds4_weight *w);

/* Scratch area `which` (0..2) of at least bytes; kept between calls. */
void *cb_scratch(ds4_backend *be, int which, size_t bytes);

/* y[t, r] = W[r, :] . x[t, :] for a raw weight on the device, with token
 * strides (elements) for x and y; picks matvec / GEMM / generic kernel. */
void cb_matmul_raw(ds4_backend *be, ds4_type type, const void *d_w, int64_t rows, int64_t cols,
                   const float *x, int64_t x_ld, int T, float *y, int64_t y_ld);

/* Per-op timing for DS4_CUDA_PROFILE=1: waits for the stream before and
 * after the op and adds the wall time to the op's row (printed at destroy).
 * Off by default (no cost then). */
struct cb_prof_scope {
    cuda_backend *c;
    int slot;
    double t0;
    cb_prof_scope(ds4_backend *be, const char *name);
    ~cb_prof_scope();
};

static inline unsigned cb_blocks(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 65535 * 16 ? 65535 * 16 : b);
}

/* install the ops of each file */
void cb_install_dense(ds4_backend *be);
void cb_install_hc(ds4_backend *be);
void cb_install_attention(ds4_backend *be);
void cb_install_moe(ds4_backend *be);

#endif

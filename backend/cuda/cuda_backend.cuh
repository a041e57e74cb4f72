/*
 * cuda_backend.cuh - private glue of the CUDA ops (cuda_ops_*.cu): the
 * backend struct, the device copies of weights, scratch, error handling.
 *
 * Weights: the model hands host views (ds4_weight). weight_prepare copies
 * each to device memory once (kept for the backend's life, keyed by the
 * host address and a fingerprint of type, shape and first/last bytes, and
 * shared by every backend on the device: backend/weight_share.h); a
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
#include "backend/cuda/cuda_rmsnorm_row.cuh"
#include "backend/cuda/cuda_rope_row.cuh"
#include "backend/weight_share.h"

#include <string.h>

/* A device copy, keyed by host address and checked against a fingerprint
 * (type, shape and the first and last bytes): a host buffer freed and
 * reused for another tensor (op tests do this) must not hit a stale copy.
 * The copy itself is shared with the other backends on the same device
 * (backend/weight_share.h); key.host == NULL marks a free slot. */
typedef struct {
    ds4_wshare_key key;
    void *dev;
} cb_weight_entry;

typedef struct {
    ds4_backend base;
    ds4_cuda *cu;
    cb_weight_entry *w; /* open addressing on host pointer */
    size_t w_cap, w_n;
    void **transient;
    size_t n_transient, cap_transient;
    void *scratch[4]; /* cb_scratch's slots (3: rmsnorm_matmul's normalized copy) */
    size_t scratch_bytes[4];
    int failed;              /* an op failed (cb_fail_status): the backend's status from then on */
    ds4_status fail_st;      /* that failure */
    char fail_msg[256];      /* and its message */
    /* decode-step graph (cuda_graph.cu) */
    struct {
        int off;           /* DS4_CUDA_GRAPH=0, profiling, or a capture failed */
        int mode;          /* CB_STEP_* of the step in progress */
        int64_t pos;       /* position of the step in progress */
        int64_t pos_max;   /* sizes (scratch strides) are planned for positions < pos_max */
        int64_t *d_pos;    /* device copy of the step's position */
        uint64_t sig;      /* signature of the step in progress */
        uint64_t graph_sig;
        unsigned graph_gen, warm_gen;
        int warm_ok;       /* the last step ran WARM and can be recorded next */
        size_t n_transient0;
        ds4_op_stats stats0;
        cudaGraphExec_t exec;
        uint64_t n_replays, n_captures;
        uint64_t n_mismatch;  /* DRY steps whose signature differed (re-recorded) */
        double t_begin;       /* host clock at step_begin (DS4_CUDA_GRAPH_VERBOSE) */
        double dry_host_s;    /* host time of the replayed steps' op walks, step_begin..step_end */
        int dry_fp;           /* DS4_CUDA_GRAPH_FP=1: weight fingerprints checked in those walks too (A/B) */
        /* the next step walked ahead (step_ahead): valid for one step_begin */
        int ahead_on;         /* DS4_CUDA_STEP_AHEAD=0 switches the walk ahead off */
        int ahead_ok;         /* a walk ahead is held and was clean */
        const void *ahead_key;
        int64_t ahead_pos;
        uint64_t ahead_sig;
        unsigned ahead_gen;
        ds4_op_stats ahead_stats; /* its ops' counters, added when it is launched */
        uint64_t n_ahead;     /* steps launched at step_begin on a walk ahead */
        double ahead_host_s;  /* host time of the walks ahead (beside the device's step) */
    } g;
    /* DS4_CUDA_ATTN=0 / DS4_CUDA_INDEXER=0: the one-block-per-query
     * attention / indexer kernels instead of the split ones (A/B). The
     * shared memory the split kernels were granted (cudaFuncSetAttribute). */
    int attn_split, indexer_split;
    size_t attn_split_smem, indexer_split_smem[3]; /* the indexer's: a scoring block of 4, 8, 32 keys */
    /* DS4_CUDA_ATTN_PREFILL=N: chunks of N or more queries take the
     * one-pass prefill attention (cuda_attn_prefill.cu; 256, 0 = never) */
    int attn_prefill_min;
    int moe_group_min; /* steps of this many tokens or more take the expert-grouped MoE (DS4_CUDA_MOE_GROUP_MIN) */
    size_t attn_prefill_smem;
    int attn_tc_smem; /* bits: the tensor-core prefill attention's shapes whose shared memory is granted (cuda_attn_prefill_tc.cu) */
    int ist_smem; /* the tensor-core indexer scores' shared memory granted (cuda_indexer_tc.cu) */
    /* the floats the last indexer_qat op rounded (a pass's indexer queries
     * in the official numerics): indexer_topk on rows among them may take
     * cuda_indexer_tc.cu, which is exact for any rows but fast only for
     * such ones; the call that reaches their end clears it */
    const float *idx_qat_rows;
    int64_t idx_qat_len;
    int profile; /* DS4_CUDA_PROFILE=1: per-op wall time (synchronizes each op); 2: also each call */
    struct cb_xcache *xc; /* issue 14: VRAM expert cache (cuda_expert_cache.cu), NULL: all experts resident */
    unsigned *ticket; /* device counter of the router's launch (moe_router), at 0 between launches */
    unsigned *head_cnt; /* CB_HEAD_CNT counters of q_b's heads (query_rope), in ticket's allocation, at 0 */
    /* A decode site's Sinkhorn not yet run (DS4_CUDA_HC_SINK_LATE,
     * cuda_ops_hc.cu): the router or rmsnorm_rope_qkv runs it in an extra
     * block beside its own work (cb_sink_take); a reader of comb before
     * that runs it first (cb_sink_flush). comb NULL: none. */
    ds4_sink_job sink;
    struct cb_ahead *ahead; /* the shared expert's side stream (cuda_ops_moe_ahead.cu), NULL until used */
    struct cb_side *side;   /* the side_begin .. side_join ops' stream (cuda_ops_side.cu), NULL until used */
    struct cb_pick *pick;   /* argmax_rows' device and page-locked buffers (cuda_ops_pick.cu), NULL until used */
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

/* Scratch area `which` (0..3) of at least bytes; kept between calls. */
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

/* ---- decode-step graph (cuda_graph.cu) --------------------------------
 * Modes of a T = 1 forward step: NONE (not a step: plain launches), WARM
 * (plain launches, but positions read from device memory and sizes planned
 * up to pos_max), CAPTURE (launches recorded into a graph), DRY (the graph
 * exists: ops only do their host bookkeeping and note their arguments;
 * the graph is launched at step_end if the arguments match). */
enum { CB_STEP_NONE = 0, CB_STEP_WARM, CB_STEP_CAPTURE, CB_STEP_DRY, CB_STEP_AHEAD };

/* Mix an op's arguments into the step signature (any graph mode). */
void cb_graph_note_v(ds4_backend *be, const uint64_t *v, int n);
static inline uint64_t cb_sig_v(const void *p) { return (uint64_t)(uintptr_t)p; }
static inline uint64_t cb_sig_v(long v) { return (uint64_t)v; }
static inline uint64_t cb_sig_v(unsigned long v) { return (uint64_t)v; }
static inline uint64_t cb_sig_v(long long v) { return (uint64_t)v; }
static inline uint64_t cb_sig_v(int v) { return (uint64_t)(int64_t)v; }
static inline uint64_t cb_sig_v(unsigned v) { return (uint64_t)v; }
static inline uint64_t cb_sig_v(bool v) { return v ? 1u : 0u; }
static inline uint64_t cb_sig_v(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
template <class... A> static inline void cb_graph_note(ds4_backend *be, int op, A... a)
{
    if (cb_of(be)->g.mode == CB_STEP_NONE) return;
    const uint64_t v[] = {(uint64_t)op, cb_sig_v(a)...};
    cb_graph_note_v(be, v, (int)(sizeof v / sizeof v[0]));
}
/* True when launches must be skipped (DRY step: the graph will do them;
 * AHEAD: the next step's walk, cuda_graph.cu). */
static inline bool cb_graph_dry(ds4_backend *be)
{
    const int m = cb_of(be)->g.mode;
    return m == CB_STEP_DRY || m == CB_STEP_AHEAD;
}
/* Note the arguments, then return from the op if the step is DRY. */
#define CB_GRAPH_SKIP(be, ...)                   \
    do {                                         \
        cb_graph_note(be, __VA_ARGS__);          \
        if (cb_graph_dry(be)) return;            \
    } while (0)
/* Position source of a kernel: in a graph step, the device copy (the
 * kernel adds *d_pos to its pos argument, which becomes pos0 - step pos);
 * otherwise NULL and pos0 itself. */
static inline const int64_t *cb_graph_pos(ds4_backend *be, int64_t pos0, int64_t *pos_arg)
{
    cuda_backend *c = cb_of(be);
    if (c->g.mode == CB_STEP_NONE) {
        *pos_arg = pos0;
        return NULL;
    }
    *pos_arg = pos0 - c->g.pos;
    return c->g.d_pos;
}
/* Position bound for sizes and strides: end itself, or in a graph step the
 * planned maximum (so one recording serves positions up to it). */
static inline int64_t cb_graph_pos_bound(ds4_backend *be, int64_t end)
{
    cuda_backend *c = cb_of(be);
    return c->g.mode != CB_STEP_NONE && c->g.pos_max > end ? c->g.pos_max : end;
}
/* Bump the memory generation (a recorded graph holding old pointers is stale). */
static inline void cb_mem_changed(ds4_backend *be) { cb_of(be)->cu->mem_gen++; }
void cb_graph_init(ds4_backend *be);
void cb_graph_destroy(ds4_backend *be);
/* Sum of squares of x[0..n) in double over the whole thread block (f32
 * squares summed per thread in double, then warps, then the warps' sums):
 * every thread gets the total. blockDim a multiple of 32, at most 1024. */
__device__ __forceinline__ double cb_block_sumsq(const float *x, int64_t n)
{
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += (double)x[i] * x[i];
    return cb_block_sum_double(ss);
}

/* The same sum with the warps' sums added by thread 0 in warp order (the
 * order of the compressor's and the hc RMS kernels, whose bits depend on
 * it). red: 32 doubles of shared memory, free again after the next
 * barrier. */
__device__ __forceinline__ double cb_block_sum_double_serial(double ss, double *red)
{
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        double v = 0.0;
        for (int k = 0; k < (int)(blockDim.x >> 5); k++) v += red[k];
        red[0] = v;
    }
    __syncthreads();
    return red[0];
}

/* cb_pos and cb_rope_pair: cuda_rope_row.cuh */
#define CB_HEAD_CNT 256 /* query heads a query_rope launch may count */

/* install the ops of each file */
/* Whether the backend offers the fused ops of ops.h (hc_pre_norm,
 * rmsnorm_rope); DS4_CUDA_FUSE=0 leaves them out, for A/B runs. */
static inline bool cb_fuse_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_FUSE", &on);
}
/* The attention sublayer's merged ops (attention_out, rmsnorm_rope_qkv):
 * also off with DS4_CUDA_FUSE_ATTN=0, for A/B runs against the rest. */
static inline bool cb_fuse_attn_on(void)
{
    static int on = -1;
    return cb_fuse_on() && ds4_env_switch_on("DS4_CUDA_FUSE_ATTN", &on);
}

void cb_install_dense(ds4_backend *be);
void cb_install_hc(ds4_backend *be);
void cb_install_attention(ds4_backend *be);
void cb_install_moe(ds4_backend *be);
void cb_install_moe_ahead(ds4_backend *be);
void cb_ahead_free(cuda_backend *c);
void cb_install_side(ds4_backend *be);
void cb_side_free(cuda_backend *c);
void cb_install_pick(ds4_backend *be);
void cb_pick_free(cuda_backend *c);
/* Free the weight copies made for single calls (cb_weight) once the
 * stream has drained: what a download does after the host waited. */
void cb_free_transient(cuda_backend *c);
/* Whether ops now go to the side stream (between side_begin and side_end):
 * the backend's scratch is one for both streams, so an op that needs it
 * refuses there. */
bool cb_side_current(const cuda_backend *c);

/* The pending Sinkhorn (c->sink) for a kernel that runs it in an extra
 * block after its dependency wait, now no longer pending; comb NULL when
 * there is none. The caller notes it in the step signature. */
ds4_sink_job cb_sink_take(ds4_backend *be);
/* Run the pending Sinkhorn now in a launch of its own if it is comb's
 * (any when comb is NULL); in a DRY step only the bookkeeping. */
void cb_sink_flush(ds4_backend *be, const float *comb);
/* A second context on the backend's device (its own stream and buffers)
 * with a fork and a join event, for work beside the backend's stream
 * (cuda_ops_side.cu, cuda_ops_moe_ahead.cu); false, the failure reported
 * as op's ("cuda: <what>"), when one cannot be made. cb_side_close drains
 * the stream and releases them (any may be NULL). */
bool cb_side_open(ds4_backend *be, ds4_cuda **cu, cudaEvent_t *fork, cudaEvent_t *join, const char *what,
                  const char *op);
void cb_side_close(ds4_cuda *cu, cudaEvent_t fork, cudaEvent_t join);
/* ffn_swiglu's decode form (int8 kernels, 1-16 tokens) applies; the
 * weights' device copies in *dg, *du, *dd */
bool cb_ffn_decode_form(ds4_backend *be, const ds4_weight *gate, const ds4_weight *up, const ds4_weight *down,
                        const float *x, int T, const void **dg, const void **du, const void **dd);

#endif

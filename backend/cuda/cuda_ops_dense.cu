/*
 * cuda_ops_dense.cu - CUDA ops of backend/ops.h on dense activations:
 * weight matmuls (plain and block-diagonal), RMSNorm, RoPE, the embedding
 * lookup. Math: dsv4-model.md §3.1, §3.2, §3.4 (as backend/cpu/ops_cpu_dense.c).
 */
#include "backend/cuda/cuda_backend.cuh"
#include "backend/cuda/cuda_hc_cluster.cuh"
#include "backend/cuda/cuda_numerics.cuh"
#include "backend/cuda/cuda_q8f_rope.cuh"
#include "backend/cuda/cuda_q8m.cuh"
#include "backend/cuda/cuda_tables.cuh"

static void op_matmul(ds4_backend *be, const ds4_weight *w, const float *x, int T, float *y)
{
    cb_prof_scope prof_(be, "matmul");
    cb_matmul_raw(be, w->type, cb_weight(be, w), w->ne[1], w->ne[0], x, w->ne[0], T, y, w->ne[1]);
}

/* Which pair path covers y1 = W1 x, y2 = W2 x of T tokens (launch = 0:
 * only the answer): one token: 1 the fused Q8_0 matvec, 2 the float
 * matvec (one launch each); 9-16 tokens of Q8_0: 3 the tensor-core
 * product with x quantized once for both (a batched step's q_a and kv);
 * 0 none. */
static int matmul_pair_path(ds4_backend *be, const ds4_weight *w1, const ds4_weight *w2, const void *d1,
                            const void *d2, const float *x, int T, float *y1, float *y2, int launch)
{
    ds4_cuda *cu = cb_of(be)->cu;
    const int64_t cols = w1->ne[0];
    if (T > 1) {
        /* as each matmul alone: cb_matmul_raw -> ds4_cuda_matvec_ld -> the int8 path's tensor-core product */
        if (w1->type != DS4_TYPE_Q8_0 || T < 9 || T > DS4_CUDA_MATVEC_MAX_TOK ||
            !ds4_cuda_mmvq_active(w1->type, d1, cols, 16) || !ds4_cuda_mmvq_active(w2->type, d2, cols, 16))
            return 0;
        const ds4_q8m_args a1 = {{d1, d1}, w1->ne[1], cols, 1, x, cols, y1, w1->ne[1], 0, T, 0.0f, 0},
                           a2 = {{d2, d2}, w2->ne[1], cols, 1, x, cols, y2, w2->ne[1], 0, T, 0.0f, 0};
        return ds4_q8split_mma_pair(cu, &a1, &a2, launch) ? 3 : 0;
    }
    /* the int8 pair only where each matmul alone takes the int8 matvec
     * (DS4_CUDA_MMVQ=0: both take the f32 one, so the pair does too) */
    if (w1->type == DS4_TYPE_Q8_0)
        return ds4_cuda_mmvq_active(w1->type, d1, cols, 0) &&
               ds4_q8split_fused_pair(cu, d1, w1->ne[1], y1, d2, w2->ne[1], y2, cols, x, launch) ? 1 : 0;
    if (w1->type == DS4_TYPE_F16 || w1->type == DS4_TYPE_BF16 || w1->type == DS4_TYPE_F32)
        return ds4_cuda_fmv_pair(cu, w1->type, d1, w1->ne[1], y1, d2, w2->ne[1], y2, cols, x, launch) ? 2 : 0;
    return 0;
}

/* Two products of one x: for one token one launch when both matrices take
 * the same one-token kernel (each row computed as in its own launch), for
 * 9-16 tokens of Q8_0 one quantization of x for both products (each as
 * its own matmul computes it), else the two matmuls. */
static void op_matmul_pair(ds4_backend *be, const ds4_weight *w1, const ds4_weight *w2, const float *x, int T,
                           float *y1, float *y2)
{
    const void *d1 = cb_weight(be, w1), *d2 = cb_weight(be, w2);
    const int path = T >= 1 && d1 && d2 && w1->type == w2->type && w1->ne[0] == w2->ne[0] && w1->n_dims == 2 &&
                             w2->n_dims == 2
                         ? matmul_pair_path(be, w1, w2, d1, d2, x, T, y1, y2, 0)
                         : 0;
    if (!path) {
        op_matmul(be, w1, x, T, y1);
        op_matmul(be, w2, x, T, y2);
        return;
    }
    cb_prof_scope prof_(be, "matmul_pair");
    be->stats.matmul_rows += (uint64_t)(w1->ne[1] + w2->ne[1]) * (uint64_t)T;
    CB_GRAPH_SKIP(be, 13, path, d1, d2, w1->ne[1], w2->ne[1], w1->ne[0], x, T, y1, y2);
    /* covered a moment ago, so a refusal now is a device failure (the
     * activation buffer could not be had): reported, never left silent */
    if (!matmul_pair_path(be, w1, w2, d1, d2, x, T, y1, y2, 1))
        cb_fail_status(be, ds4_fail(DS4_ERR_BACKEND, "cuda matmul_pair: path %d launched nothing or half", path),
                       "matmul_pair");
    cb_check_launch(be, "matmul_pair");
}

static void op_matmul_grouped(ds4_backend *be, const ds4_weight *w, int groups, const float *x,
                              int T, float *y)
{
    cb_prof_scope prof_(be, "matmul_grouped");
    const int64_t cols = w->ne[0], rows = w->ne[1] / groups;
    const uint8_t *d = (const uint8_t *)cb_weight(be, w);
    if (!d) return;
    const size_t gbytes = cb_weight_bytes(w) / (size_t)groups;
    const bool fast = cols % 32 == 0 && ds4_cuda_block_elems(w->type) != 0;
    if (fast && T <= DS4_CUDA_MATVEC_MAX_TOK && groups > 1 && (int64_t)T * groups <= 65535) {
        be->stats.matmul_rows += (uint64_t)w->ne[1] * (uint64_t)T;
        CB_GRAPH_SKIP(be, 2, d, groups, rows, cols, x, T, y);
        cb_fail_status(be, ds4_cuda_matvec_grouped(cb_of(be)->cu, w->type, d, groups, rows, cols, x, T, y),
                       "matmul_grouped");
        return;
    }
    for (int g = 0; g < groups; g++)
        cb_matmul_raw(be, w->type, d + (size_t)g * gbytes, rows, cols, x + (size_t)g * cols,
                      (int64_t)groups * cols, T, y + (size_t)g * rows, (int64_t)groups * rows);
}

/* o_a then o_b: one token's o_a also stores its outputs' Q8_0 blocks, and
 * o_b takes them instead of quantizing o_a's 8192 floats in each of its
 * blocks (cuda_q8split_fused.cu, ds4_cuda's q8o; DS4_CUDA_Q8_HANDOFF=0
 * turns it off); the same values, so the two ops' bits. */
static void op_matmul_grouped_chain(ds4_backend *be, const ds4_weight *wa, int groups, const float *x, int T,
                                    float *u, const ds4_weight *wb, float *y)
{
    ds4_cuda *cu = cb_of(be)->cu;
    cu->q8o.want = T == 1;
    cu->q8m_want = T >= 9 && ds4_q8m_oa_on(); /* a batched o_a's blocks for o_b (cuda_q8split_mma.cu) */
    op_matmul_grouped(be, wa, groups, x, T, u);
    cu->q8o.want = 0;
    cu->q8m_want = 0;
    op_matmul(be, wb, u, T, y);
    cu->q8o.y = NULL; /* a copy o_b did not take is not offered to anyone else */
}

/* One block per row: the sum of squares in f32 per thread, then a block
 * reduction in double (the CPU sums in double; long rows keep their accuracy).
 * Small-kernel v2 sizes the block to the row (about 4 values per thread) so
 * that a single decode row is a few loads per thread, not a serial walk. */
__global__ void cb_rmsnorm_kernel(const float *x, const float *w, int n, float eps, float *out)
{
    ds4_pdl_enter();
    const float *xr = x + (size_t)blockIdx.x * n;
    float *o = out + (size_t)blockIdx.x * n;
    const float s = (float)(1.0 / sqrt(cb_block_sumsq(xr, n) / n + eps));
    for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = w ? (xr[i] * s) * w[i] : xr[i] * s;
}

/* cb_rmsnorm_kernel's numbers for rows of at most 4 values per thread
 * (every row the model normalizes): the weights are loaded before the wait
 * on the previous kernel (they are constants), the row once into
 * registers. */
__global__ void __launch_bounds__(1024) cb_rmsnorm_reg_kernel(const float *x, const float *w, int n, float eps,
                                                               float *out)
{
    float wv[4];
    cb_rmsnorm_reg_weights(w, n, wv);
    ds4_pdl_enter();
    cb_rmsnorm_reg_row(x + (size_t)blockIdx.x * n, w, wv, n, eps, out + (size_t)blockIdx.x * n);
}

/* cb_rmsnorm_reg_kernel's rows of n = 4 x its threads (a multiple of 128),
 * each also stored as Q8_0 blocks in the tensor-core products' fragment
 * order (cuda_q8m.cuh qm_quant_put: the quantizer kernel's bytes) for a
 * batched step's next product (ds4_cuda's q8m), which then needs no
 * quantizer launch: block t normalizes row t; blocks from nt to QM_TOK
 * store zeros in their slots, as the quantizer kernel fills the slots a
 * product of nt tokens leaves unused. Value i + k n / 4 of a thread is
 * value lane of block warp + k n / 128. */
__global__ void __launch_bounds__(1024) cb_rmsnorm_q8m_kernel(const float *x, const float *w, int n, float eps,
                                                               float *out, int nt, uint8_t *xq, float *xd)
{
    float wv[4];
    cb_rmsnorm_reg_weights(w, n, wv);
    ds4_pdl_enter();
    const int t = blockIdx.x;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (t < nt) cb_rmsnorm_reg_row_nt(x + (size_t)t * n, w, wv, n, eps, out + (size_t)t * n, (int)blockDim.x, v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wps = blockDim.x >> 5;
#pragma unroll
    for (int k = 0; k < 4; k++) qm_quant_put(v[k], t, warp + k * wps, lane, xq, xd);
}

/* Threads for a row of n: ~4 values each, a multiple of 32, 32..1024. */
static inline int cb_row_threads(int64_t n)
{
    int64_t t = ((n + 3) / 4 + 31) / 32 * 32;
    return t < 32 ? 32 : t > 1024 ? 1024 : (int)t;
}

static void op_rmsnorm(ds4_backend *be, const float *x, const ds4_weight *w, int64_t n_rows, int n,
                       float eps, float *out)
{
    cb_prof_scope prof_(be, "rmsnorm");
    const float *wd = NULL;
    if (w) {
        if (w->type != DS4_TYPE_F32) {
            cb_fail_status(be, ds4_fail(DS4_ERR_UNSUPPORTED, "cuda rmsnorm: weight %s must be F32",
                                        w->name ? w->name : "?"), "rmsnorm");
            return;
        }
        wd = (const float *)cb_weight(be, w);
    }
    if (n == 4096 && ds4_hcc_on(cb_of(be)->cu)) { /* Flash's width: the hyper-connection site's norm order */
        CB_GRAPH_SKIP(be, 15, x, wd, n_rows, n, eps, out);
        if (!ds4_hcc_rmsnorm(cb_of(be)->cu, x, wd, n_rows, eps, out))
            cb_fail_status(be, ds4_fail(DS4_ERR_BACKEND, "cuda rmsnorm: cluster launch failed: %s",
                                        cudaGetErrorString(cudaGetLastError())), "rmsnorm");
        cb_check_launch(be, "rmsnorm");
        return;
    }
    const int threads = cb_row_threads(n);
    static int reg_on = -1; /* DS4_CUDA_RMS_REG=0: the looping kernel, for A/B runs */
    const bool reg = (int64_t)threads * 4 >= n && ds4_env_switch_on("DS4_CUDA_RMS_REG", &reg_on);
    CB_GRAPH_SKIP(be, 3, x, wd, n_rows, n, eps, out, threads);
    ds4_cuda *cu = cb_of(be)->cu;
    ds4_q8_handoff *h = NULL;
    if (reg && (int64_t)threads * 4 == n && n % 128 == 0 && ds4_q8m_norm_takes(cu, n_rows, n) &&
        (h = ds4_q8m_maker(cu, n))) {
        ds4_launch(cb_rmsnorm_q8m_kernel, (unsigned)QM_TOK, threads, 0, cb_stream(be), x, wd, n, eps, out,
                   (int)n_rows, (uint8_t *)h->q, h->d);
        cb_check_launch(be, "rmsnorm");
        ds4_q8m_offer(cu, h, out, n, (int)n_rows); /* for the next tensor-core product (cuda_q8split_mma.cu) */
        return;
    }
    for (int64_t r0 = 0; r0 < n_rows; r0 += 65535) {
        int64_t nr = n_rows - r0 < 65535 ? n_rows - r0 : 65535;
        if (reg)
            ds4_launch(cb_rmsnorm_reg_kernel, (unsigned)nr, threads, 0, cb_stream(be), x + r0 * n, wd, n, eps,
                       out + r0 * n);
        else
            ds4_launch(cb_rmsnorm_kernel, (unsigned)nr, threads, 0, cb_stream(be), x + r0 * n, wd, n, eps,
                       out + r0 * n);
    }
    cb_check_launch(be, "rmsnorm");
}

/* The rmsnorm_matmul op, the q_a norm inside q_b's product (and the
 * indexer's q_b, with the indexer's query products on the backend's
 * stream; the same bits); DS4_CUDA_QB_NORM=0: the separate norm, for A/B */
static bool cb_qb_norm_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_QB_NORM", &on);
}

/* rmsnorm_matmul's one-launch forms: one token of 1024 values into a
 * Q8_0 product that the one-token kernel takes (its split copy, DS4_CUDA_MMVQ
 * on: ds4_q8split_fused_norm) or a float product the float matvec takes
 * (ds4_cuda_fmv_norm); each block normalizes x with the rmsnorm op's code
 * at its thread count, so the two ops' bits. 0: not covered. */
static int rmsnorm_matmul_path(ds4_backend *be, const float *x, const ds4_weight *norm, int T, int n, float eps,
                               const ds4_weight *w, float *y, int launch)
{
    if (T != 1 || n != 1024 || !norm || norm->type != DS4_TYPE_F32 || w->n_dims != 2 || w->ne[0] != n) return 0;
    ds4_cuda *cu = cb_of(be)->cu;
    const void *dw = cb_weight(be, w);
    const float *dn = dw ? (const float *)cb_weight(be, norm) : NULL;
    if (!dn) return 0;
    if (w->type == DS4_TYPE_Q8_0) {
        const ds4_q8f_args f = {{dw, dw}, w->ne[1], n, 1, x, n, y, 0, 1, 0.0f, 0, dn, eps};
        return ds4_cuda_mmvq_active(w->type, dw, n, 0) && ds4_q8split_fused_norm(cu, &f, launch);
    }
    return ds4_cuda_fmv_norm(cu, w->type, dw, w->ne[1], n, x, dn, eps, y, launch);
}

/* rmsnorm_matmul: one launch where rmsnorm_matmul_path covers it;
 * otherwise the two ops on a normalized copy in scratch (slot 3), so that
 * x is left as it is either way (ops.h). The copy serves one call at a
 * time: the model calls this op on the backend's stream only, and the
 * scratch being the backend's (not a stream's), a call beside it fails. */
static void op_rmsnorm_matmul(ds4_backend *be, const float *x, const ds4_weight *norm, int T, int n, float eps,
                              const ds4_weight *w, float *y)
{
    if (!rmsnorm_matmul_path(be, x, norm, T, n, eps, w, y, 0)) {
        if (cb_side_current(cb_of(be))) {
            cb_fail_status(be, ds4_fail(DS4_ERR_BACKEND, "cuda rmsnorm_matmul: its scratch copy is the main "
                                                         "stream's, and it was called on the side stream"),
                           "rmsnorm_matmul");
            return;
        }
        float *xn = (float *)cb_scratch(be, 3, sizeof(float) * (size_t)T * (size_t)n);
        if (!xn) return;
        op_rmsnorm(be, x, norm, T, n, eps, xn);
        op_matmul(be, w, xn, T, y);
        return;
    }
    cb_prof_scope prof_(be, "rmsnorm_matmul");
    be->stats.matmul_rows += (uint64_t)w->ne[1];
    CB_GRAPH_SKIP(be, 18, cb_weight(be, w), cb_weight(be, norm), w->ne[1], n, x, eps, y);
    /* covered a moment ago: a refusal now is a device failure, reported */
    if (!rmsnorm_matmul_path(be, x, norm, T, n, eps, w, y, 1))
        cb_fail_status(be, ds4_fail(DS4_ERR_BACKEND, "cuda rmsnorm_matmul: the covered launch was refused"),
                       "rmsnorm_matmul");
    cb_check_launch(be, "rmsnorm_matmul");
}

/* One thread per (token, head, pair): the heads of a token are independent,
 * and a thread per pair walking the 64 heads serially left one block of 32
 * threads doing dependent loads (~20 us per call). cos/sin in double of the
 * f32 angle, as the CPU; recomputed per head, which costs less than sharing. */
/* (cb_rope_pair, the pair rotation, is in cuda_rope_row.cuh: the attention combine uses it too) */

/* Token t of x at pos_arg + t, or (tab, rope_seqs: a sequence's one row
 * each) at tab[t]; either plus the device position in a graph step. */
__device__ __forceinline__ void cb_rope_body(float *x, int T, int n_heads, int head_dim, int n_rot, const float *om,
                                             const int64_t *d_pos, int64_t pos_arg, const int64_t *tab, int inverse)
{
    ds4_pdl_enter();
    const int64_t pos0 = tab ? 0 : cb_pos(d_pos, pos_arg);
    const int half = n_rot / 2;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)T * n_heads * half) return;
    const int k = (int)(i % half);
    const int64_t th = i / half; /* token * n_heads + head */
    const int t = (int)(th / n_heads);
    cb_rope_pair(x + (size_t)th * head_dim + (head_dim - n_rot) + 2 * k, tab ? cb_pos(d_pos, tab[t]) : pos0 + t, om[k],
                 inverse);
}

__global__ void cb_rope_kernel(float *x, int T, int n_heads, int head_dim, int n_rot,
                               const float *om, const int64_t *d_pos, int64_t pos_arg, int inverse)
{
    cb_rope_body(x, T, n_heads, head_dim, n_rot, om, d_pos, pos_arg, NULL, inverse);
}

/* rmsnorm + RoPE (+ kv_round) of one head row per block, through shared
 * memory: the three kernels' operations in their order, so their numbers
 * (cb_rmsnorm_reg_kernel's thread per value and sums, cb_rope_pair,
 * cb_kv_round_row_block). The weights and omega are read before the wait
 * on the previous kernel. head_dim <= 4 * blockDim.x and <= 1024. */
/* One set of rows for cb_rmsnorm_rope_kernel: rows of n at x (n_heads a
 * token), their norm weight (or NULL) and KV rounding. */
struct cb_rr_rows {
    float *x;
    const float *w;
    int n_heads, rows, fp8_nope, f16_store;
};

/* The positions of a batched step's tokens (one row of each set per
 * token), before the device position is added (cb_pos). */
#define CB_RR_TOKENS 64
struct cb_rr_pos {
    int64_t p[CB_RR_TOKENS];
};

/* Block b takes row b of a, or row b - a.rows of b (rmsnorm_rope_qkv: the
 * query heads and the kv row in one launch). Token t of a set (row / its
 * n_heads) is at pos0 + t, or at tab[t] (+ the device position) when tab
 * is not NULL. */
__device__ __forceinline__ void cb_rmsnorm_rope_body(const cb_rr_rows &a, const cb_rr_rows &b, int n, float eps,
                                                     int n_rot, const float *om, const int64_t *d_pos,
                                                     int64_t pos_arg, const int64_t *tab)
{
    __shared__ float row[1024];
    const int nt = blockDim.x, half = n_rot / 2;
    const bool second = (int)blockIdx.x >= a.rows;
    const cb_rr_rows &P = second ? b : a;
    const int r = second ? (int)blockIdx.x - a.rows : (int)blockIdx.x;
    float wv[4];
    cb_rmsnorm_reg_weights(P.w, n, wv);
    const float omk = (int)threadIdx.x < half ? __ldg(om + threadIdx.x) : 0.0f;
    ds4_pdl_enter();
    const int tok = r / P.n_heads;
    const int64_t pos = tab ? cb_pos(d_pos, tab[tok]) : cb_pos(d_pos, pos_arg) + (int64_t)tok;
    float *xr = P.x + (size_t)r * n;
    cb_norm_rope_row(xr, P.w, wv, n, eps, n_rot, omk, pos, row, nt);
    if (P.fp8_nope || P.f16_store) cb_kv_round_row_block(row, n, P.fp8_nope, P.f16_store); /* ends with a barrier */
    for (int i = threadIdx.x; i < n; i += nt) xr[i] = row[i];
}

/* sj: a site's pending Sinkhorn, run by an extra last block (comb NULL:
 * none; rmsnorm_rope_qkv of one token, cuda_ops_hc.cu) */
__global__ void __launch_bounds__(256) cb_rmsnorm_rope_kernel(cb_rr_rows a, cb_rr_rows b, int n, float eps, int n_rot,
                                                               const float *om, const int64_t *d_pos, int64_t pos_arg,
                                                               const ds4_sink_job sj)
{
    if (sj.comb && blockIdx.x == gridDim.x - 1) {
        ds4_pdl_enter();
        ds4_sink_job_run(sj);
        return;
    }
    cb_rmsnorm_rope_body(a, b, n, eps, n_rot, om, d_pos, pos_arg, NULL);
}

/* rope_seqs: row t (a sequence's one row) at tab.p[t] */
__global__ void cb_rope_tab_kernel(float *x, int n_seq, int n_heads, int head_dim, int n_rot, const float *om,
                                   const int64_t *d_pos, const __grid_constant__ cb_rr_pos tab, int inverse)
{
    cb_rope_body(x, n_seq, n_heads, head_dim, n_rot, om, d_pos, 0, tab.p, inverse);
}

/* Why: a batched step's indexer query rows took a rope launch a sequence
 * in each CSA layer that scores (16 launches of ~2 us for 16 sessions). */
static void op_rope_seqs(ds4_backend *be, float *x, int n_seq, int n_heads, int head_dim, int n_rot,
                         const ds4_weight *omega, const int64_t *pos0, bool inverse)
{
    cb_prof_scope prof_(be, "rope_seqs");
    const float *om = (const float *)cb_weight(be, omega);
    if (!om || n_rot < 2) return;
    for (int s0 = 0; s0 < n_seq; s0 += CB_RR_TOKENS) { /* the table's rows a launch */
        const int n = n_seq - s0 < CB_RR_TOKENS ? n_seq - s0 : CB_RR_TOKENS;
        cb_rr_pos tab;
        memset(&tab, 0, sizeof tab);
        const int64_t *dp = NULL;
        for (int i = 0; i < n; i++) dp = cb_graph_pos(be, pos0[s0 + i], &tab.p[i]);
        for (int i = 0; i < n; i++) cb_graph_note(be, 19, tab.p[i]);
        float *xs = x + (size_t)s0 * n_heads * head_dim;
        CB_GRAPH_SKIP(be, 19, xs, n, n_heads, head_dim, n_rot, om, inverse);
        ds4_launch(cb_rope_tab_kernel, cb_blocks((int64_t)n * n_heads * (n_rot / 2), 128), 128, 0, cb_stream(be), xs,
                   n, n_heads, head_dim, n_rot, om, dp, tab, inverse ? 1 : 0);
        cb_check_launch(be, "rope_seqs");
    }
}

/* rmsnorm_rope_qkv_seqs: token t (a sequence's one row) at tab.p[t] */
__global__ void __launch_bounds__(256)
    cb_rmsnorm_rope_tab_kernel(cb_rr_rows a, cb_rr_rows b, int n, float eps, int n_rot, const float *om,
                               const int64_t *d_pos, const __grid_constant__ cb_rr_pos tab)
{
    cb_rmsnorm_rope_body(a, b, n, eps, n_rot, om, d_pos, 0, tab.p);
}

static void op_rope(ds4_backend *be, float *x, int T, int n_heads, int head_dim, int n_rot,
                    const ds4_weight *omega, int64_t pos0, bool inverse)
{
    cb_prof_scope prof_(be, "rope");
    const float *om = (const float *)cb_weight(be, omega);
    if (!om || n_rot < 2) return;
    int64_t pa;
    const int64_t *dp = cb_graph_pos(be, pos0, &pa);
    CB_GRAPH_SKIP(be, 4, x, T, n_heads, head_dim, n_rot, om, pa, inverse);
    ds4_launch(cb_rope_kernel, cb_blocks((int64_t)T * n_heads * (n_rot / 2), 128), 128, 0, cb_stream(be),
        x, T, n_heads, head_dim, n_rot, om, dp, pa, inverse ? 1 : 0);
    cb_check_launch(be, "rope");
}

/* The shapes cb_rmsnorm_rope_kernel takes (a row's values in registers,
 * the rotated pairs one per thread). */
static bool cb_rmsnorm_rope_fits(int head_dim, int n_rot, const ds4_weight *w)
{
    const int threads = cb_row_threads(head_dim);
    return head_dim <= 1024 && (int64_t)threads * 4 >= head_dim && threads <= 256 && n_rot >= 2 && n_rot % 2 == 0 &&
           n_rot <= head_dim && n_rot / 2 <= threads && (!w || w->type == DS4_TYPE_F32);
}

/* What an rmsnorm_rope launch reads: the norm weight (NULL without one),
 * the RoPE frequencies, the KV rounding of the rows; false when a weight
 * has no device copy (cb_weight has recorded why). */
struct cb_rr_setup {
    const float *wd, *om;
    int fp8, f16, threads;
};
static bool cb_rr_setup_of(ds4_backend *be, const ds4_weight *w, const ds4_weight *omega, int head_dim,
                           const ds4_kv_numerics *nm, cb_rr_setup *s)
{
    s->wd = w ? (const float *)cb_weight(be, w) : NULL;
    s->om = (const float *)cb_weight(be, omega);
    s->fp8 = nm ? nm->fp8_nope : 0;
    s->f16 = nm && nm->f16_store ? 1 : 0;
    s->threads = cb_row_threads(head_dim);
    return (!w || s->wd) && s->om;
}

static void op_rmsnorm_rope(ds4_backend *be, float *x, const ds4_weight *w, int T, int n_heads, int head_dim,
                            float eps, int n_rot, const ds4_weight *omega, int64_t pos0, const ds4_kv_numerics *nm)
{
    /* more rows than a grid holds (a prefill chunk's query heads, 2048 x
     * 64) take the separate ops: in launches of whole tokens this kernel
     * took ~160 us a 65472-row launch against 81 us for the register
     * rmsnorm and 42 us for the RoPE pass over all rows (ncu, 2048-token
     * chunk, docs/BENCHMARKS.md seventeenth session) */
    const bool shape_ok = cb_rmsnorm_rope_fits(head_dim, n_rot, w) && (int64_t)T * n_heads <= 65535;
    if (!shape_ok) {
        op_rmsnorm(be, x, w, (int64_t)T * n_heads, head_dim, eps, x);
        op_rope(be, x, T, n_heads, head_dim, n_rot, omega, pos0, false);
        if (nm) be->kv_round(be, x, (int64_t)T * n_heads, head_dim, nm);
        return;
    }
    cb_prof_scope prof_(be, "rmsnorm_rope");
    cb_rr_setup u;
    if (!cb_rr_setup_of(be, w, omega, head_dim, nm, &u)) return;
    int64_t pa;
    const int64_t *dp = cb_graph_pos(be, pos0, &pa);
    CB_GRAPH_SKIP(be, 12, x, u.wd, T, n_heads, head_dim, eps, n_rot, u.om, pa, u.fp8, u.f16, u.threads);
    const cb_rr_rows a = {x, u.wd, n_heads, T * n_heads, u.fp8, u.f16}, none = {};
    ds4_launch(cb_rmsnorm_rope_kernel, (unsigned)(T * n_heads), u.threads, 0, cb_stream(be), a, none, head_dim, eps,
               n_rot, u.om, dp, pa, ds4_sink_job{});
    cb_check_launch(be, "rmsnorm_rope");
}

/* rmsnorm_rope of the query heads (no weight, no rounding), then of the kv
 * rows: one launch where one kernel takes both, else the two ops. */
static void op_rmsnorm_rope_qkv(ds4_backend *be, float *q, int n_heads, float *kv, const ds4_weight *kv_w, int T,
                                int head_dim, float eps, int n_rot, const ds4_weight *omega, int64_t pos0,
                                const ds4_kv_numerics *nm)
{
    if (!(cb_rmsnorm_rope_fits(head_dim, n_rot, kv_w) && (int64_t)T * (n_heads + 1) <= 65535)) {
        op_rmsnorm_rope(be, q, NULL, T, n_heads, head_dim, eps, n_rot, omega, pos0, NULL);
        op_rmsnorm_rope(be, kv, kv_w, T, 1, head_dim, eps, n_rot, omega, pos0, nm);
        return;
    }
    cb_prof_scope prof_(be, "rmsnorm_rope_qkv");
    cb_rr_setup u;
    if (!cb_rr_setup_of(be, kv_w, omega, head_dim, nm, &u)) return;
    int64_t pa;
    const int64_t *dp = cb_graph_pos(be, pos0, &pa);
    /* a site's pending Sinkhorn, in an extra block beside the rows */
    const ds4_sink_job sj = cb_sink_take(be);
    CB_GRAPH_SKIP(be, 16, q, kv, u.wd, T, n_heads, head_dim, eps, n_rot, u.om, pa, u.fp8, u.f16, u.threads, sj.comb,
                  sj.T);
    const cb_rr_rows a = {q, NULL, n_heads, T * n_heads, 0, 0}, b = {kv, u.wd, 1, T, u.fp8, u.f16};
    ds4_launch(cb_rmsnorm_rope_kernel, (unsigned)(T * (n_heads + 1) + (sj.comb ? 1 : 0)), u.threads, 0, cb_stream(be),
               a, b, head_dim, eps, n_rot, u.om, dp, pa, sj);
    cb_check_launch(be, "rmsnorm_rope_qkv");
}

/* ops.h query_rope in one launch (on unless DS4_CUDA_QB_ROPE=0, for A/B
 * runs): q_b's product normalizing and rotating each of its heads as its
 * blocks finish it, the kv row and a pending Sinkhorn in an extra block
 * (ds4_q8split_fused_norm_rope), where the rmsnorm_rope_qkv launch took
 * 4.79 us a layer in-graph. Full size on an H100: 2K 213.17 / 215.74
 * tokens/s against 209.71 / 210.74 (+2.0%), the logits bit for bit
 * (docs/BENCHMARKS.md, thirty-ninth session) */
static bool cb_qb_rope_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_QB_ROPE", &on);
}

/* DS4_CUDA_QB_ROPE=2 (opt-in): the heads' norm by clusters of a head's
 * four blocks (ds4_q8split_fused_norm_rope's cluster form), written where
 * the ticket form's tail took q_b from 12.13 to 16.27 us a layer in-graph
 * (H100, thirty-ninth session); the same bits, but decode at 2K level with
 * the ticket form (fortieth session). =3 (opt-in): that form with its
 * exchange by pushes, as the site's (forty-first session). 0: not asked. */
static int cb_qb_rope_cluster(void)
{
    static int mode = -1;
    const int m = ds4_env_choice("DS4_CUDA_QB_ROPE", &mode, 1, "23");
    return m >= 2 ? m - 1 : 0;
}

/* query_rope's one-launch form (the op is installed only where
 * cb_qb_rope_on): one token whose q_b rmsnorm_matmul_path covers with the
 * Q8_0 kernel and whose heads the rmsnorm_rope kernel takes. 0: not
 * covered. */
static int query_rope_path(ds4_backend *be, const float *qr, const ds4_weight *q_norm, int T, int n, float eps,
                           const ds4_weight *wq, float *q, int n_heads, float *kv, const ds4_weight *kv_w,
                           int head_dim, int n_rot, const ds4_weight *omega, int64_t pos0, const ds4_kv_numerics *nm,
                           const ds4_sink_job &sj, int launch)
{
    cuda_backend *c = cb_of(be);
    if (T != 1 || n != 1024 || !c->head_cnt || n_heads < 1 || n_heads > CB_HEAD_CNT ||
        !q_norm || q_norm->type != DS4_TYPE_F32 || wq->type != DS4_TYPE_Q8_0 || wq->n_dims != 2 || wq->ne[0] != n ||
        wq->ne[1] != (int64_t)n_heads * head_dim || !cb_rmsnorm_rope_fits(head_dim, n_rot, kv_w))
        return 0;
    const void *dw = cb_weight(be, wq);
    const float *dn = dw ? (const float *)cb_weight(be, q_norm) : NULL;
    cb_rr_setup u;
    if (!dn || !cb_rr_setup_of(be, kv_w, omega, head_dim, nm, &u) || !ds4_cuda_mmvq_active(wq->type, dw, n, 0))
        return 0;
    int64_t pa;
    const int64_t *dp = cb_graph_pos(be, pos0, &pa);
    const ds4_q8f_args f = {{dw, dw}, wq->ne[1], n, 1, qr, n, q, 0, 1, 0.0f, 0, dn, eps};
    const ds4_q8f_rope r = {c->head_cnt, head_dim, n_rot, u.threads, eps, u.om, dp, pa, kv, u.wd, u.fp8, u.f16, sj,
                            cb_qb_rope_cluster()};
    return ds4_q8split_fused_norm_rope(c->cu, &f, &r, launch);
}

/* query_rope: one launch where query_rope_path covers it, else
 * rmsnorm_matmul and rmsnorm_rope_qkv */
static void op_query_rope(ds4_backend *be, const float *qr, const ds4_weight *q_norm, int T, int n, float eps,
                          const ds4_weight *wq, float *q, int n_heads, float *kv, const ds4_weight *kv_w, int head_dim,
                          int n_rot, const ds4_weight *omega, int64_t pos0, const ds4_kv_numerics *nm)
{
    const ds4_sink_job none = {};
    if (!query_rope_path(be, qr, q_norm, T, n, eps, wq, q, n_heads, kv, kv_w, head_dim, n_rot, omega, pos0, nm, none,
                         0)) {
        op_rmsnorm_matmul(be, qr, q_norm, T, n, eps, wq, q);
        op_rmsnorm_rope_qkv(be, q, n_heads, kv, kv_w, T, head_dim, eps, n_rot, omega, pos0, nm);
        return;
    }
    cb_prof_scope prof_(be, "query_rope");
    be->stats.matmul_rows += (uint64_t)wq->ne[1];
    /* a site's pending Sinkhorn, in the extra block beside the kv row */
    const ds4_sink_job sj = cb_sink_take(be);
    int64_t pa;
    (void)cb_graph_pos(be, pos0, &pa);
    CB_GRAPH_SKIP(be, 71, cb_weight(be, wq), cb_weight(be, q_norm), n, qr, eps, q, n_heads, kv, cb_weight(be, kv_w),
                  head_dim, n_rot, cb_weight(be, omega), pa, nm ? nm->fp8_nope : 0, nm && nm->f16_store ? 1 : 0,
                  sj.comb, sj.T);
    /* covered a moment ago: a refusal now is a device failure, reported */
    if (!query_rope_path(be, qr, q_norm, T, n, eps, wq, q, n_heads, kv, kv_w, head_dim, n_rot, omega, pos0, nm, sj, 1))
        cb_fail_status(be, ds4_fail(DS4_ERR_BACKEND, "cuda query_rope: the covered launch was refused"), "query_rope");
    cb_check_launch(be, "query_rope");
}

/* ops.h indexer_query_rope, a CSA layer's indexer queries of one token in
 * one launch (cuda_fmv_iq.cu) instead of the normalizing product, the rope
 * op and the QAT op; DS4_CUDA_IDX_QROPE=0 keeps the three, for A/B (the
 * same numbers; read at backend creation). With compress_two's two
 * launches: full size 2K +1.8% (H100, forty-fourth session). */
static bool cb_idx_qrope_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_IDX_QROPE", &on);
}

/* indexer_query_rope's one launch: one token, a product the normalizing
 * float matvec would take. 0: not covered. */
static int index_query_path(ds4_backend *be, const float *qr, const ds4_weight *q_norm, int T, int n, float eps,
                            const ds4_weight *w, float *qi, int n_heads, int head_dim, int n_rot,
                            const ds4_weight *omega, int64_t pos0, bool qat, int launch)
{
    if (T != 1 || !q_norm || q_norm->type != DS4_TYPE_F32 || q_norm->ne[0] != n || w->n_dims != 2 ||
        w->ne[0] != n || w->ne[1] != (int64_t)n_heads * head_dim)
        return 0;
    const void *dw = cb_weight(be, w);
    const float *dn = dw ? (const float *)cb_weight(be, q_norm) : NULL;
    const float *om = dn ? (const float *)cb_weight(be, omega) : NULL;
    if (!om) return 0;
    int64_t pa;
    const int64_t *dp = cb_graph_pos(be, pos0, &pa);
    return ds4_cuda_fmv_index_query(cb_of(be)->cu, w->type, dw, w->ne[1], n, qr, dn, eps, qi, head_dim, n_rot, om,
                                    dp, pa, qat ? 1 : 0, launch);
}

/* indexer_query_rope: one launch where index_query_path covers it, else
 * rmsnorm_matmul, rope and indexer_qat */
static void op_indexer_query_rope(ds4_backend *be, const float *qr, const ds4_weight *q_norm, int T, int n, float eps,
                                  const ds4_weight *w, float *qi, int n_heads, int head_dim, int n_rot,
                                  const ds4_weight *omega, int64_t pos0, bool qat)
{
    if (!index_query_path(be, qr, q_norm, T, n, eps, w, qi, n_heads, head_dim, n_rot, omega, pos0, qat, 0)) {
        op_rmsnorm_matmul(be, qr, q_norm, T, n, eps, w, qi);
        op_rope(be, qi, T, n_heads, head_dim, n_rot, omega, pos0, false);
        if (qat) be->indexer_qat(be, qi, (int64_t)T * n_heads, head_dim);
        return;
    }
    cb_prof_scope prof_(be, "indexer_query_rope");
    be->stats.matmul_rows += (uint64_t)w->ne[1];
    /* the next indexer_topk may score these rows on the tensor cores, as
     * after the indexer_qat op (cuda_indexer_tc.cu); set on a dry walk too */
    if (qat) cb_of(be)->idx_qat_rows = qi, cb_of(be)->idx_qat_len = (int64_t)T * n_heads * head_dim;
    int64_t pa;
    (void)cb_graph_pos(be, pos0, &pa);
    CB_GRAPH_SKIP(be, 26, cb_weight(be, w), cb_weight(be, q_norm), n, qr, eps, qi, n_heads, head_dim, n_rot,
                  cb_weight(be, omega), pa, qat ? 1 : 0);
    /* covered a moment ago: a refusal now is a device failure, reported */
    if (!index_query_path(be, qr, q_norm, T, n, eps, w, qi, n_heads, head_dim, n_rot, omega, pos0, qat, 1))
        cb_fail_status(be, ds4_fail(DS4_ERR_BACKEND, "cuda indexer_query_rope: the covered launch was refused"),
                       "indexer_query_rope");
    cb_check_launch(be, "indexer_query_rope");
}

/* rmsnorm_rope_qkv for n_seq sequences of one row each (batched decode):
 * one launch with the rows' positions in a table, each row's numbers those
 * of its own rmsnorm_rope_qkv; otherwise one call per sequence. */
static void op_rmsnorm_rope_qkv_seqs(ds4_backend *be, float *q, int n_heads, float *kv, const ds4_weight *kv_w,
                                     int n_seq, int head_dim, float eps, int n_rot, const ds4_weight *omega,
                                     const int64_t *pos0, const ds4_kv_numerics *nm)
{
    if (!(cb_rmsnorm_rope_fits(head_dim, n_rot, kv_w) && n_seq >= 1 && n_seq <= CB_RR_TOKENS)) {
        for (int i = 0; i < n_seq; i++)
            op_rmsnorm_rope_qkv(be, q + (size_t)i * n_heads * head_dim, n_heads, kv + (size_t)i * head_dim, kv_w, 1,
                                head_dim, eps, n_rot, omega, pos0[i], nm);
        return;
    }
    cb_prof_scope prof_(be, "rmsnorm_rope_qkv_seqs");
    cb_rr_setup u;
    if (!cb_rr_setup_of(be, kv_w, omega, head_dim, nm, &u)) return;
    cb_rr_pos tab;
    memset(&tab, 0, sizeof tab);
    const int64_t *dp = NULL;
    for (int i = 0; i < n_seq; i++) dp = cb_graph_pos(be, pos0[i], &tab.p[i]);
    for (int i = 0; i < n_seq; i++) cb_graph_note(be, 17, tab.p[i]);
    CB_GRAPH_SKIP(be, 17, q, kv, u.wd, n_seq, n_heads, head_dim, eps, n_rot, u.om, u.fp8, u.f16, u.threads);
    const cb_rr_rows a = {q, NULL, n_heads, n_seq * n_heads, 0, 0}, b = {kv, u.wd, 1, n_seq, u.fp8, u.f16};
    ds4_launch(cb_rmsnorm_rope_tab_kernel, (unsigned)(n_seq * (n_heads + 1)), u.threads, 0, cb_stream(be), a, b,
               head_dim, eps, n_rot, u.om, dp, tab);
    cb_check_launch(be, "rmsnorm_rope_qkv_seqs");
}

/* One thread per octet of an embedding row, copied into every stream. */
template <int T>
__global__ void cb_embed_kernel(const uint8_t *tab, int64_t row_bytes, int64_t D, const int32_t *tokens,
                                int n_tok, int n_hc, float *X)
{
    ds4_pdl_enter();
    __shared__ ds4_block_luts<T> s_luts;
    const ds4_luts L = s_luts.fill(D);
    __syncthreads();
    const int64_t no = D / 8;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n_tok * no) return;
    const int t = (int)(i / no);
    const int64_t o = i % no;
    float v[8], sc, mn;
    ds4_decode_octet<T>(tab + (int64_t)tokens[t] * row_bytes, o, v, sc, mn, L);
    for (int s = 0; s < n_hc; s++) {
        float *dst = X + ((size_t)t * n_hc + s) * D + o * 8;
        for (int k = 0; k < 8; k++) dst[k] = __fsub_rn(__fmul_rn(sc, v[k]), mn);
    }
}

struct cb_embed_launch {
    template <int T>
    static void run(ds4_backend *be, const uint8_t *tab, int64_t D, const int32_t *tokens, int n, int n_hc,
                    float *X)
    {
        ds4_launch(cb_embed_kernel<T>, cb_blocks((int64_t)n * (D / 8), 256), 256, 0, cb_stream(be),
            tab, D / ds4_qt<T>::BE * ds4_qt<T>::BB, D, tokens, n, n_hc, X);
        cb_check_launch(be, "embed");
    }
};

static void op_embed(ds4_backend *be, const ds4_weight *tok_embd, const int32_t *tokens, int T, int n_hc,
                     float *X)
{
    cb_prof_scope prof_(be, "embed");
    const uint8_t *tab = (const uint8_t *)cb_weight(be, tok_embd);
    const int64_t D = tok_embd->ne[0];
    if (!tab) return;
    const int be_ = ds4_cuda_block_elems(tok_embd->type);
    if (D % 8 != 0 || be_ == 0 || D % be_ != 0) {
        cb_fail_status(be, ds4_fail(DS4_ERR_UNSUPPORTED, "cuda embed: width %lld of type %d",
                                    (long long)D, (int)tok_embd->type), "embed");
        return;
    }
    CB_GRAPH_SKIP(be, 5, tab, tokens, T, n_hc, X);
    DS4_CUDA_FOR_TYPE(tok_embd->type, cb_embed_launch, be, tab, D, tokens, T, n_hc, X);
    cb_fail_status(be, ds4_fail(DS4_ERR_UNSUPPORTED, "cuda embed: type %d", (int)tok_embd->type), "embed");
}

/* ops.h rope_seqs: a batched step's indexer query rows roped in one
 * launch instead of one a sequence (the same numbers). The default from
 * the forty-fifth session (16 sessions +1.3% on an H100, 30 layers,
 * docs/BENCHMARKS.md); DS4_CUDA_ROPE_SEQS=0 keeps a launch a sequence
 * (read at backend creation). */
static bool cb_rope_seqs_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_ROPE_SEQS", &on);
}

void cb_install_dense(ds4_backend *be)
{
    be->matmul = op_matmul;
    be->matmul_grouped = op_matmul_grouped;
    be->matmul_grouped_chain = op_matmul_grouped_chain;
    be->rmsnorm = op_rmsnorm;
    if (cb_fuse_on()) {
        be->rmsnorm_rope = op_rmsnorm_rope;
        if (cb_fuse_attn_on()) {
            be->rmsnorm_rope_qkv = op_rmsnorm_rope_qkv;
            be->rmsnorm_rope_qkv_seqs = op_rmsnorm_rope_qkv_seqs;
        }
        be->matmul_pair = op_matmul_pair;
        if (cb_qb_norm_on()) be->rmsnorm_matmul = op_rmsnorm_matmul;
        if (cb_qb_norm_on() && cb_fuse_attn_on() && cb_qb_rope_on()) be->query_rope = op_query_rope;
        if (cb_qb_norm_on() && cb_idx_qrope_on()) be->indexer_query_rope = op_indexer_query_rope;
    }
    be->rope = op_rope;
    if (cb_rope_seqs_on()) be->rope_seqs = op_rope_seqs;
    be->embed = op_embed;
}

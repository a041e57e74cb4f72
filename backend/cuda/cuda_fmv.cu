/*
 * cuda_fmv.cu - decode matvec for float weights (F16, BF16, F32) on f32
 * activations, f32 accumulation: the HC mixing matrices (24 rows of 16K
 * columns), the compressor, indexer and router projections.
 *
 * One launch per group of up to 4 tokens, no split-K reduce kernel:
 *  - a row belongs to a group of warps: the whole block (8 warps) when the
 *    matrix has few rows, so that a 24-row matrix still spreads its bytes
 *    over 24 SMs with every byte of a row in flight at once; one warp when
 *    there are rows enough to fill the GPU with warps. Groups stride over
 *    the rows (persistent grid, sized to the GPU's occupancy).
 *  - lane j of a group of G lanes reads the row's 16-byte units j, j + G,
 *    ... with streaming loads (__ldcs: weights are read once per token and
 *    must not evict the activations from L2), 8 issued before the first is
 *    used; x comes through L1 (__ldg), shared by every row the SM runs.
 *  - the lanes' sums are added by warp butterflies and, for a block-wide
 *    group, across the warps in shared memory in warp order: the result is
 *    deterministic, and a (row, token) value does not depend on how many
 *    tokens shared the weight pass (each token has its own accumulator and
 *    the same order of operations). cuda_fmv.cuh has the per-value math and
 *    the order, run on the host by the tests.
 * Preconditions (ds4_cuda_fmv_active): 16-byte aligned weights, cols a
 * multiple of 8 (so rows are whole units and stay 16-byte aligned), x
 * 16-byte aligned with x_ld % 4 == 0 (ds4_cuda_matvec_ld checks those).
 * DS4_CUDA_FMV=0 sends these matrices back to the f32-dequantizing kernel of
 * cuda_matvec.cu (for A/B runs).
 * The router's form (ds4_cuda_fmv_route, the moe_router op): a block per
 * row, and the block that finishes last picks the token's experts. The
 * normalizing form (ds4_cuda_fmv_norm, the rmsnorm_matmul op on the
 * indexer's q_b): each block first normalizes the token's 1024 values.
 */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_fmv.cuh"
#include "backend/cuda/cuda_moe_route.cuh"
#include "backend/cuda/cuda_rmsnorm_row.cuh"
#include "backend/cuda/cuda_hc_cluster.cuh"

#include <stdlib.h>
#include <string.h>

#define FMV_WARPS 8
#define FMV_THREADS (FMV_WARPS * 32)
#define FMV_INFLIGHT 8 /* 16-byte loads a lane issues before using the first */

struct ds4_fmv_params {
    const uint8_t *w;
    int64_t rows, units, row_bytes; /* units: 16-byte units per row */
    const float *x;
    int64_t x_ld; /* floats between the NT tokens of x */
    float *y;
    int64_t y_ld; /* floats between the NT tokens of y */
    /* a pair (ds4_cuda_fmv_pair): rows from rows1 on are rows of w2 into y2 */
    const uint8_t *w2;
    int64_t rows1;
    float *y2;
    /* RT (the router, ds4_cuda_fmv_route): the block that finishes last
     * picks the token's experts from y; ticket counts finished blocks */
    cb_route_args route;
    unsigned *ticket;
    /* RT: a site's Sinkhorn run by an extra last block (comb NULL: none) */
    ds4_sink_job sink;
    /* NORM (ds4_cuda_fmv_norm): x normalized by these weights first */
    const float *norm_w;
    float norm_eps;
    /* MULTI (ds4_cuda_fmv_multi; one token): rows from m_end[k - 1] on
     * (0 for k = 0) are rows of wm[k] into ym[k]; m_end of a matrix not
     * there is INT64_MAX */
    const uint8_t *wm[4];
    float *ym[4];
    int64_t m_end[4];
};

/* NORM (ds4_cuda_fmv_norm; one token of FMV_NORM_COLS values): x is first
 * normalized by P.norm_w into shared memory with the rmsnorm op's code at
 * its thread count for that width (cb_rmsnorm_reg_row, 256 threads, the
 * block's), and the rows read it there: the two ops' bits. */
#define FMV_NORM_COLS 1024
template <int T, int NT, int WPR, bool RT = false, bool NORM = false, bool MULTI = false>
__global__ void __launch_bounds__(FMV_THREADS) ds4_fmv_kernel(const ds4_fmv_params P)
{
    static_assert(!NORM || (NT == 1 && !RT && FMV_THREADS * 4 == FMV_NORM_COLS), "a normalized row of one token");
    static_assert(!MULTI || (NT == 1 && !RT && !NORM), "several matrices on one token");
    float nw[4]; /* NORM: this thread's norm weights, constants read before the wait */
    if (NORM) cb_rmsnorm_reg_weights(P.norm_w, FMV_NORM_COLS, nw);
    /* the blocks of rows (RT with a Sinkhorn: all but the extra last one) */
    const unsigned nb = RT && P.sink.comb ? gridDim.x - 1 : gridDim.x;
    if (RT && P.sink.comb && blockIdx.x == nb) {
        ds4_pdl_enter();
        ds4_sink_job_run(P.sink);
        return;
    }
    enum { VPU = ds4_fmv_t<T>::VPU, G = 32 * WPR, GROUPS = FMV_WARPS / WPR };
    __shared__ float s_red[WPR > 1 ? FMV_WARPS : 1][NT];
    __shared__ __align__(16) float s_xn[NORM ? FMV_NORM_COLS : 4];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int j = (warp % WPR) * 32 + lane; /* lane within the row's group */
    const float bias_own = RT ? cb_route_bias_own(P.route) : 0.0f; /* a constant: before the wait */
    ds4_pdl_enter();
    /* in-graph phase times of the router (DS4_CUDA_KTIME): each block's
     * thread 0 keeps its start; block 0 marks its row, the last block its
     * ticket and picks */
    const bool kt = RT && tid == 0;
    if (RT) ds4_kt_start(kt, DS4_KT_ROUTER);
    /* blockIdx.y: the launch's group of NT tokens */
    const float *X = P.x + (int64_t)blockIdx.y * NT * P.x_ld;
    if (NORM) {
        cb_rmsnorm_reg_row(X, P.norm_w, nw, FMV_NORM_COLS, P.norm_eps, s_xn);
        __syncthreads(); /* the rows read every thread's values */
        X = s_xn;
    }
    float *Y = P.y + (int64_t)blockIdx.y * NT * P.y_ld;
    const int64_t stride = (int64_t)nb * GROUPS;
    /* WPR > 1: every warp of the block walks the same rows, so the
     * __syncthreads below are reached by the whole block */
    for (int64_t row = (int64_t)blockIdx.x * GROUPS + warp / WPR; row < P.rows; row += stride) {
        int64_t mrow;
        const uint4 *wr;
        float *Ym;
        if constexpr (MULTI) { /* the row's matrix by the bounds, with fixed indices (no local copy) */
            int64_t lo = 0;
            const uint8_t *wb = P.wm[0];
            Ym = P.ym[0];
#pragma unroll
            for (int k = 1; k < 4; k++)
                if (row >= P.m_end[k - 1]) lo = P.m_end[k - 1], wb = P.wm[k], Ym = P.ym[k];
            mrow = row - lo;
            wr = (const uint4 *)(wb + mrow * P.row_bytes);
        } else {
            const bool second = row >= P.rows1; /* never for one matrix: rows1 = rows */
            mrow = second ? row - P.rows1 : row;
            wr = (const uint4 *)((second ? P.w2 : P.w) + mrow * P.row_bytes);
            Ym = second ? P.y2 + (int64_t)blockIdx.y * NT * P.y_ld : Y;
        }
        float acc[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) acc[t] = 0.0f;
        for (int64_t u0 = j; u0 < P.units; u0 += (int64_t)FMV_INFLIGHT * G) {
            uint4 v[FMV_INFLIGHT];
#pragma unroll
            for (int k = 0; k < FMV_INFLIGHT; k++) {
                const int64_t u = u0 + (int64_t)k * G;
                v[k] = u < P.units ? __ldcs(wr + u) : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
            for (int k = 0; k < FMV_INFLIGHT; k++) {
                const int64_t u = u0 + (int64_t)k * G;
                if (u >= P.units) break;
                float wv[8];
                ds4_fmv_decode<T>(v[k], wv);
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    const float *xp = X + t * P.x_ld + u * VPU;
                    float xv[8];
                    /* NORM: x is in shared memory, not for the read-only path */
                    const float4 a = NORM ? *(const float4 *)xp : ds4_ld_f4(xp);
                    xv[0] = a.x; xv[1] = a.y; xv[2] = a.z; xv[3] = a.w;
                    if (VPU == 8) {
                        const float4 b = NORM ? *(const float4 *)(xp + 4) : ds4_ld_f4(xp + 4);
                        xv[4] = b.x; xv[5] = b.y; xv[6] = b.z; xv[7] = b.w;
                    } else {
                        xv[4] = xv[5] = xv[6] = xv[7] = 0.0f;
                    }
                    acc[t] = ds4_fmv_dot<T>(wv, xv, acc[t]);
                }
            }
        }
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], o);
        if (WPR == 1) {
            if (lane == 0)
#pragma unroll
                for (int t = 0; t < NT; t++) Ym[t * P.y_ld + mrow] = acc[t];
        } else {
            if (lane == 0)
#pragma unroll
                for (int t = 0; t < NT; t++) s_red[warp][t] = acc[t];
            __syncthreads();
            if (tid < NT) {
                float s = 0.0f;
#pragma unroll
                for (int w = 0; w < FMV_WARPS; w++) s += s_red[w][tid];
                Ym[tid * P.y_ld + mrow] = s;
            }
            __syncthreads(); /* s_red is read before the next row writes it */
        }
    }
    if (RT) {
        /* the writer of the block's last row (thread 0) makes its store
         * visible, then takes a ticket: the last block sees every row */
        __shared__ bool s_last;
        __syncthreads();
        ds4_kt_phase(kt && blockIdx.x == 0, DS4_KT_ROUTER, 0);
        if (tid == 0) {
            __threadfence();
            s_last = atomicAdd(P.ticket, 1u) == nb - 1;
            __threadfence();
        }
        __syncthreads();
        if (s_last) {
            ds4_kt_phase(kt, DS4_KT_ROUTER, 1);
            extern __shared__ float s_sc[];
            cb_moe_route_block(P.y, 0, P.route, s_sc, bias_own);
            if (tid == 0) *P.ticket = 0; /* for the next launch */
            ds4_kt_phase(kt, DS4_KT_ROUTER, 2);
        }
    }
}

/* ---- host side -------------------------------------------------------------- */

static bool ds4_fmv_env_on(void)
{
    const char *e = getenv("DS4_CUDA_FMV");
    return !(e && e[0] == '0');
}

extern "C" int ds4_cuda_fmv_active(ds4_type type, const void *d_w, int64_t cols)
{
    if (type != DS4_TYPE_F16 && type != DS4_TYPE_BF16 && type != DS4_TYPE_F32) return 0;
    static int on = -1;
    if (on < 0) on = ds4_fmv_env_on() ? 1 : 0;
    return on && cols > 0 && cols % 8 == 0 && (uintptr_t)d_w % 16 == 0;
}

extern "C" int ds4_cuda_fmv_warps_per_row(const ds4_cuda *cu, int64_t rows)
{
    /* a block per row until there are rows for 16 warps per SM */
    return rows < 16 * (int64_t)cu->n_sm ? FMV_WARPS : 1;
}

/* Blocks for a launch: every SM filled at the kernel's occupancy (asked
 * once per kernel), fewer when there are fewer row groups. */
template <int T, int NT, int WPR, bool NORM = false, bool MULTI = false>
static unsigned ds4_fmv_grid(const ds4_cuda *cu, int64_t rows)
{
    static int per_sm = 0;
    if (per_sm == 0) {
        int n = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, ds4_fmv_kernel<T, NT, WPR, false, NORM, MULTI>,
                                                          FMV_THREADS, 0) !=
                cudaSuccess ||
            n < 1)
            n = 1;
        per_sm = n;
    }
    const int64_t groups = FMV_WARPS / WPR;
    const int64_t need = (rows + groups - 1) / groups, full = (int64_t)per_sm * cu->n_sm;
    return (unsigned)(need < full ? need : full);
}

template <int T, int WPR>
static ds4_status ds4_fmv_launch_w(ds4_cuda *cu, const ds4_fmv_params &P, int nt, int n_groups)
{
    switch (nt) {
#define FMV_CASE(N)                                                                                  \
    case N:                                                                                          \
        ds4_launch(ds4_fmv_kernel<T, N, WPR>, dim3(ds4_fmv_grid<T, N, WPR>(cu, P.rows), (unsigned)n_groups), \
                   FMV_THREADS, 0, cu->stream, P);                                                  \
        break;
        FMV_CASE(1)
        FMV_CASE(2)
        FMV_CASE(3)
        FMV_CASE(4)
#undef FMV_CASE
    default: return ds4_fail(DS4_ERR_INVALID, "cuda fmv: bad token group %d", nt);
    }
    DS4_CUDA_CHECK(cudaGetLastError());
    return DS4_OK;
}

/* n_groups groups of nt tokens, each group nt token rows on from the last */
template <int T>
static ds4_status ds4_fmv_launch(ds4_cuda *cu, const ds4_fmv_params &P, int nt, int wpr, int n_groups)
{
    return wpr == 1 ? ds4_fmv_launch_w<T, 1>(cu, P, nt, n_groups) : ds4_fmv_launch_w<T, FMV_WARPS>(cu, P, nt, n_groups);
}

/* One matrix of rows x cols: rows1 = rows (no pair), no tokens yet. */
static void ds4_fmv_base(ds4_type type, const void *d_w, int64_t rows, int64_t cols, ds4_fmv_params *P)
{
    memset(P, 0, sizeof *P);
    P->w = (const uint8_t *)d_w;
    P->rows = rows;
    P->rows1 = rows;
    P->row_bytes = cols * (type == DS4_TYPE_F32 ? 4 : 2);
    P->units = P->row_bytes / 16;
}

ds4_status ds4_cuda_fmv_dense(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows, int64_t cols,
                              const float *d_x, int64_t x_ld, int64_t n_tok, float *d_y, int64_t y_ld)
{
    if (!ds4_cuda_fmv_active(type, d_w, cols) || (uintptr_t)d_x % 16 != 0 || x_ld % 4 != 0)
        return ds4_fail(DS4_ERR_INVALID, "cuda fmv: weights not taken by the float matvec (type %d, cols %lld)",
                        (int)type, (long long)cols);
    if (ds4_fmv_xr_dense(cu, type, d_w, rows, cols, d_x, x_ld, n_tok, d_y, y_ld)) return DS4_OK;
    ds4_fmv_params P;
    ds4_fmv_base(type, d_w, rows, cols, &P);
    P.x_ld = x_ld;
    P.y_ld = y_ld;
    const int wpr = ds4_cuda_fmv_warps_per_row(cu, rows);
    /* one launch for the whole groups of 4 tokens (a group per blockIdx.y),
     * one for the rest */
    for (int64_t t0 = 0; t0 < n_tok;) {
        const int nt = (int)(n_tok - t0 < 4 ? n_tok - t0 : 4);
        const int64_t ng = nt == 4 ? (n_tok - t0) / 4 : 1;
        if (ng > 65535) return ds4_fail(DS4_ERR_INVALID, "cuda fmv: %lld tokens in one call", (long long)n_tok);
        P.x = d_x + t0 * x_ld;
        P.y = d_y + t0 * y_ld;
        ds4_status st;
        switch (type) {
        case DS4_TYPE_F16: st = ds4_fmv_launch<DS4_TYPE_F16>(cu, P, nt, wpr, (int)ng); break;
        case DS4_TYPE_BF16: st = ds4_fmv_launch<DS4_TYPE_BF16>(cu, P, nt, wpr, (int)ng); break;
        default: st = ds4_fmv_launch<DS4_TYPE_F32>(cu, P, nt, wpr, (int)ng); break;
        }
        if (st != DS4_OK) return st;
        t0 += nt * ng;
    }
    return DS4_OK;
}

/* Two matrices of one float type on one token, one launch; each row is
 * computed as its own matrix's launch computes it (the same warps per row:
 * taken only when the pair's row count keeps each matrix's choice). */
int ds4_cuda_fmv_pair(ds4_cuda *cu, ds4_type type, const void *w1, int64_t rows1, float *y1, const void *w2,
                      int64_t rows2, float *y2, int64_t cols, const float *x, int launch)
{
    if (!ds4_cuda_fmv_active(type, w1, cols) || !ds4_cuda_fmv_active(type, w2, cols) || (uintptr_t)x % 16 != 0)
        return 0;
    const int wpr = ds4_cuda_fmv_warps_per_row(cu, rows1);
    if (ds4_cuda_fmv_warps_per_row(cu, rows2) != wpr || ds4_cuda_fmv_warps_per_row(cu, rows1 + rows2) != wpr)
        return 0;
    if (!launch) return 1;
    ds4_fmv_params P;
    ds4_fmv_base(type, w1, rows1 + rows2, cols, &P);
    P.w2 = (const uint8_t *)w2;
    P.rows1 = rows1;
    P.x = x;
    P.y = y1;
    P.y2 = y2;
    ds4_status st;
    switch (type) {
    case DS4_TYPE_F16: st = ds4_fmv_launch<DS4_TYPE_F16>(cu, P, 1, wpr, 1); break;
    case DS4_TYPE_BF16: st = ds4_fmv_launch<DS4_TYPE_BF16>(cu, P, 1, wpr, 1); break;
    default: st = ds4_fmv_launch<DS4_TYPE_F32>(cu, P, 1, wpr, 1); break;
    }
    return st == DS4_OK;
}

/* The router of one token: logits = W x (a block per row, as
 * ds4_cuda_fmv_dense computes each row) and, in the launch's last block,
 * the picks and weights of cb_moe_route_block, as the moe_route kernel
 * gives them: one launch instead of two. ticket: a device counter at 0
 * (left at 0). 0 when not covered (with launch = 0 only the answer). */
int ds4_cuda_fmv_route(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows, int64_t cols, const float *x,
                       float *logits, const cb_route_args *route, unsigned *ticket, int launch,
                       const ds4_sink_job *sink)
{
    if (!ds4_cuda_fmv_active(type, d_w, cols) || (uintptr_t)x % 16 != 0 || !ticket) return 0;
    if (ds4_cuda_fmv_warps_per_row(cu, rows) != FMV_WARPS || route->n_expert != rows || route->k < 1 ||
        route->k > 64 || rows > 4096)
        return 0;
    if (!launch) return 1;
    ds4_fmv_params P;
    ds4_fmv_base(type, d_w, rows, cols, &P);
    P.x = x;
    P.y = logits;
    P.route = *route;
    P.ticket = ticket;
    P.sink = sink ? *sink : ds4_sink_job{};
    const size_t smem = (size_t)rows * 2 * sizeof(float);
    const unsigned grid = (unsigned)rows + (P.sink.comb ? 1u : 0u);
    switch (type) {
    case DS4_TYPE_F16:
        ds4_launch(ds4_fmv_kernel<DS4_TYPE_F16, 1, FMV_WARPS, true>, dim3(grid), FMV_THREADS, smem,
                   cu->stream, P);
        break;
    case DS4_TYPE_BF16:
        ds4_launch(ds4_fmv_kernel<DS4_TYPE_BF16, 1, FMV_WARPS, true>, dim3(grid), FMV_THREADS, smem,
                   cu->stream, P);
        break;
    default:
        ds4_launch(ds4_fmv_kernel<DS4_TYPE_F32, 1, FMV_WARPS, true>, dim3(grid), FMV_THREADS, smem,
                   cu->stream, P);
        break;
    }
    return cudaGetLastError() == cudaSuccess;
}

/* The normalizing form's launch: the warps a row as the plain matvec
 * takes them for this many rows. */
template <int T> static void ds4_fmv_norm_go(ds4_cuda *cu, const ds4_fmv_params &P)
{
    if (ds4_cuda_fmv_warps_per_row(cu, P.rows) == FMV_WARPS)
        ds4_launch(ds4_fmv_kernel<T, 1, FMV_WARPS, false, true>, dim3(ds4_fmv_grid<T, 1, FMV_WARPS, true>(cu, P.rows)),
                   FMV_THREADS, 0, cu->stream, P);
    else
        ds4_launch(ds4_fmv_kernel<T, 1, 1, false, true>, dim3(ds4_fmv_grid<T, 1, 1, true>(cu, P.rows)), FMV_THREADS,
                   0, cu->stream, P);
}

/* y = W rmsnorm(x) for one token of FMV_NORM_COLS values (the rmsnorm op's
 * values, then each row as ds4_cuda_fmv_dense computes it), x left as it
 * is. 0 when not covered; with launch = 0 only whether it is covered. */
int ds4_cuda_fmv_norm(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows, int64_t cols, const float *x,
                      const float *norm_w, float eps, float *y, int launch)
{
    if (!ds4_cuda_fmv_active(type, d_w, cols) || cols != FMV_NORM_COLS || rows < 1 || !norm_w ||
        (uintptr_t)x % 16 != 0)
        return 0;
    if (!launch) return 1;
    ds4_fmv_params P;
    ds4_fmv_base(type, d_w, rows, cols, &P);
    P.x = x;
    P.y = y;
    P.norm_w = norm_w;
    P.norm_eps = eps;
    switch (type) {
    case DS4_TYPE_F16: ds4_fmv_norm_go<DS4_TYPE_F16>(cu, P); break;
    case DS4_TYPE_BF16: ds4_fmv_norm_go<DS4_TYPE_BF16>(cu, P); break;
    default: ds4_fmv_norm_go<DS4_TYPE_F32>(cu, P); break;
    }
    return 1; /* a launch error is the caller's cb_check_launch's to report */
}

/* y_k = W_k x for n (2-4) float matrices of one type and width on one
 * token (a CSA layer's two compressor pairs), one launch: every row is
 * computed as its own matrix's launch computes it, a block a row, so
 * taken only where each matrix alone gets a block a row. 0 when not
 * covered; with launch = 0 only whether it is covered. */
int ds4_cuda_fmv_multi(ds4_cuda *cu, ds4_type type, int n, const void *const *w, const int64_t *rows, float *const *y,
                       int64_t cols, const float *x, int launch)
{
    if (n < 2 || n > 4 || (uintptr_t)x % 16 != 0) return 0;
    int64_t total = 0;
    for (int k = 0; k < n; k++) {
        if (!ds4_cuda_fmv_active(type, w[k], cols) || rows[k] < 1 ||
            ds4_cuda_fmv_warps_per_row(cu, rows[k]) != FMV_WARPS)
            return 0;
        total += rows[k];
    }
    if (!launch) return 1;
    ds4_fmv_params P;
    ds4_fmv_base(type, w[0], total, cols, &P);
    P.x = x;
    P.y = y[0];
    int64_t end = 0;
    for (int k = 0; k < 4; k++) {
        P.wm[k] = (const uint8_t *)(k < n ? w[k] : w[0]);
        P.ym[k] = k < n ? y[k] : y[0];
        end += k < n ? rows[k] : 0;
        P.m_end[k] = k < n ? end : INT64_MAX;
    }
    switch (type) {
    case DS4_TYPE_F16:
        ds4_launch(ds4_fmv_kernel<DS4_TYPE_F16, 1, FMV_WARPS, false, false, true>,
                   dim3(ds4_fmv_grid<DS4_TYPE_F16, 1, FMV_WARPS, false, true>(cu, total)), FMV_THREADS, 0, cu->stream,
                   P);
        break;
    case DS4_TYPE_BF16:
        ds4_launch(ds4_fmv_kernel<DS4_TYPE_BF16, 1, FMV_WARPS, false, false, true>,
                   dim3(ds4_fmv_grid<DS4_TYPE_BF16, 1, FMV_WARPS, false, true>(cu, total)), FMV_THREADS, 0,
                   cu->stream, P);
        break;
    default:
        ds4_launch(ds4_fmv_kernel<DS4_TYPE_F32, 1, FMV_WARPS, false, false, true>,
                   dim3(ds4_fmv_grid<DS4_TYPE_F32, 1, FMV_WARPS, false, true>(cu, total)), FMV_THREADS, 0,
                   cu->stream, P);
        break;
    }
    return 1; /* a launch error is the caller's cb_check_launch's to report */
}

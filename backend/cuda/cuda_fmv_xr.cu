/*
 * cuda_fmv_xr.cu - the float-weight matvec (cuda_fmv.cu) for 5 to 63
 * tokens on matrices of a block per row, with each thread's activation
 * values held in registers for all the rows it takes.
 *
 * Why: a 16-session decode step gives the compressors' and routers' float
 * products (1024 or 256 rows of 4096 F16 columns) 16 tokens; the matvec
 * takes them 4 a weight pass, and for every row a block reads the 4
 * tokens' whole activation (64 KB) through L1 against the row's 8 KB of
 * weights. ncu (nineteenth session, the 8-layer model's 16-session step):
 * 16 us a call, 54 us a layer, about what L1 delivers for those reads.
 * Here a thread's columns are the same for every row (lane j of the row's
 * 256 takes units j, j + 256, ..), so it loads their values for 8 tokens
 * once (at most 16 values a token: 128 registers) and each row costs only
 * its weights, which the block copies for up to 8 rows at a time into
 * shared memory (cp.async; the first rows before the programmatic-launch
 * wait, the weights being constants).
 *
 * Same bits as cuda_fmv.cu's block-per-row form: each thread's units in
 * order with ds4_fmv_dot, the warp butterfly, the 8 warps' sums added in
 * warp order from 0.0f; so a token's outputs do not depend on how many
 * tokens shared the launch (test_cuda_kernels checks them against the
 * host run of that order, ds4_cuda_host_fmv_dot).
 * DS4_CUDA_FMV_XR=0 leaves these products to cuda_fmv.cu (read once).
 */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_fmv.cuh"
#include "backend/cuda/cuda_mq_device.cuh"

#define XR_THREADS 256 /* 8 warps: the decode kernel's block per row */
#define XR_NT 8        /* tokens a block */
#define XR_RMAX 8      /* rows a stage */
#define XR_STAGE_MAX (64 * 1024) /* bytes of weights a stage at most */

struct ds4_fmv_xr_params {
    const uint8_t *w;
    int64_t rows, units, row_bytes;
    const float *x;
    int64_t x_ld;
    float *y;
    int64_t y_ld;
    int64_t n_tok;
    int rps; /* rows a stage: XR_RMAX or fewer for long rows */
};

/* The block's share of stage k (its rows k rps .. of blockIdx.x + gridDim.x
 * i) copied into buffer k % 2, then committed (an empty group past the
 * end, so that the waits count the same). */
__device__ __forceinline__ void xr_issue(const ds4_fmv_xr_params &P, int64_t n_my, int k, uint4 *s_w)
{
    const int64_t i0 = (int64_t)k * P.rps;
    uint4 *buf = s_w + (size_t)(k & 1) * P.rps * P.units;
    for (int rr = 0; rr < P.rps && i0 + rr < n_my; rr++) {
        const int64_t row = (int64_t)blockIdx.x + (i0 + rr) * gridDim.x;
        const uint4 *src = (const uint4 *)(P.w + row * P.row_bytes);
        for (int64_t u = threadIdx.x; u < P.units; u += XR_THREADS) ds4_mq_cp16(buf + rr * P.units + u, src + u);
    }
    ds4_mq_cp_commit();
}

/* UPL: units a thread (units <= 256 UPL), so UPL x VPU values a token.
 * WS: a row's 8 warp sums by ds4_warp_sums (9 shuffles, each token's sum
 * the butterfly's bits), else a butterfly a token (40). */
template <int T, int UPL, bool WS>
__global__ void __launch_bounds__(XR_THREADS, 1) ds4_fmv_xr_kernel(const ds4_fmv_xr_params P)
{
    enum { VPU = ds4_fmv_t<T>::VPU };
    static_assert(UPL * VPU <= 16, "at most 16 values a token in registers");
    extern __shared__ uint4 s_w[]; /* 2 stages of rps rows */
    __shared__ float s_red[XR_RMAX][XR_THREADS / 32][XR_NT];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int64_t t0 = (int64_t)blockIdx.y * XR_NT;
    const int nt = P.n_tok - t0 < XR_NT ? (int)(P.n_tok - t0) : XR_NT;
    const int64_t n_my = P.rows > (int64_t)blockIdx.x ? (P.rows - 1 - (int64_t)blockIdx.x) / gridDim.x + 1 : 0;
    const int n_st = (int)((n_my + P.rps - 1) / P.rps);

    xr_issue(P, n_my, 0, s_w); /* weights: before the wait */
    ds4_pdl_enter();
    xr_issue(P, n_my, 1, s_w);

    /* the thread's values of its units for the block's tokens (0 past them) */
    float xr[XR_NT][UPL][8];
#pragma unroll
    for (int t = 0; t < XR_NT; t++)
#pragma unroll
        for (int k = 0; k < UPL; k++) {
            const int64_t u = tid + (int64_t)XR_THREADS * k;
            const bool ok = t < nt && u < P.units;
            const float *xp = P.x + (t0 + t) * P.x_ld + u * VPU;
            const float4 a = ok ? ds4_ld_f4(xp) : make_float4(0.f, 0.f, 0.f, 0.f);
            xr[t][k][0] = a.x, xr[t][k][1] = a.y, xr[t][k][2] = a.z, xr[t][k][3] = a.w;
            if (VPU == 8) {
                const float4 b = ok ? ds4_ld_f4(xp + 4) : make_float4(0.f, 0.f, 0.f, 0.f);
                xr[t][k][4] = b.x, xr[t][k][5] = b.y, xr[t][k][6] = b.z, xr[t][k][7] = b.w;
            } else {
                xr[t][k][4] = xr[t][k][5] = xr[t][k][6] = xr[t][k][7] = 0.0f;
            }
        }

    for (int k = 0; k < n_st; k++) {
        ds4_mq_cp_wait<1>(); /* this thread's copies of stage k are in */
        __syncthreads();     /* ... every thread's */
        const uint4 *buf = s_w + (size_t)(k & 1) * P.rps * P.units;
        const int64_t i0 = (int64_t)k * P.rps;
        const int nr = n_my - i0 < P.rps ? (int)(n_my - i0) : P.rps;
        for (int rr = 0; rr < nr; rr++) {
            float acc[XR_NT];
#pragma unroll
            for (int t = 0; t < XR_NT; t++) acc[t] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < UPL; kk++) {
                const int64_t u = tid + (int64_t)XR_THREADS * kk;
                if (u >= P.units) break;
                float wv[8];
                ds4_fmv_decode<T>(buf[rr * P.units + u], wv);
#pragma unroll
                for (int t = 0; t < XR_NT; t++) acc[t] = ds4_fmv_dot<T>(wv, xr[t][kk], acc[t]);
            }
            if constexpr (WS) {
                const float s = ds4_warp_sums<XR_NT>(acc, lane); /* lanes 4 j .. 4 j + 3 hold one token's */
                if ((lane & (32 / XR_NT - 1)) == 0) s_red[rr][warp][ds4_warp_sums_index<XR_NT>(lane)] = s;
            } else {
#pragma unroll
                for (int t = 0; t < XR_NT; t++) {
#pragma unroll
                    for (int o = 16; o > 0; o >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], o);
                }
                if (lane == 0)
#pragma unroll
                    for (int t = 0; t < XR_NT; t++) s_red[rr][warp][t] = acc[t];
            }
        }
        __syncthreads(); /* the stage's sums are in; its buffer is free */
        xr_issue(P, n_my, k + 2, s_w);
        if (tid < nr * XR_NT) {
            const int rr = tid / XR_NT, t = tid % XR_NT;
            if (t < nt) {
                float s = 0.0f;
#pragma unroll
                for (int w = 0; w < XR_THREADS / 32; w++) s += s_red[rr][w][t];
                const int64_t row = (int64_t)blockIdx.x + (i0 + rr) * gridDim.x;
                P.y[(t0 + t) * P.y_ld + row] = s;
            }
        }
        /* s_red is written again only after the next stage's barrier */
    }
    ds4_mq_cp_wait<0>(); /* no copy outlives the block */
}

static bool xr_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_FMV_XR", &on);
}

template <int T, int UPL, bool WS>
static bool xr_go_ws(ds4_cuda *cu, const ds4_fmv_xr_params &P, int64_t n_groups)
{
    const size_t smem = 2 * (size_t)P.rps * (size_t)P.units * 16;
    static int per_sm = -1; /* blocks an SM at the largest stage, asked once per kernel */
    if (per_sm < 0) {
        int n = 0;
        if (cudaFuncSetAttribute(ds4_fmv_xr_kernel<T, UPL, WS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 2 * XR_STAGE_MAX) != cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, ds4_fmv_xr_kernel<T, UPL, WS>, XR_THREADS,
                                                          2 * XR_STAGE_MAX) != cudaSuccess)
            n = 0;
        cudaGetLastError();
        per_sm = n;
    }
    if (per_sm < 1) return false;
    /* every group's blocks resident at once; never more blocks than rows */
    int64_t gx = ((int64_t)per_sm * cu->n_sm + n_groups - 1) / n_groups;
    if (gx > P.rows) gx = P.rows;
    if (gx < 1) gx = 1;
    ds4_launch(ds4_fmv_xr_kernel<T, UPL, WS>, dim3((unsigned)gx, (unsigned)n_groups), XR_THREADS, smem, cu->stream, P);
    return cudaGetLastError() == cudaSuccess;
}

template <int T, int UPL>
static bool xr_go(ds4_cuda *cu, const ds4_fmv_xr_params &P, int64_t n_groups)
{
    return ds4_warp_sums_on() ? xr_go_ws<T, UPL, true>(cu, P, n_groups) : xr_go_ws<T, UPL, false>(cu, P, n_groups);
}

template <int T>
static bool xr_type(ds4_cuda *cu, const ds4_fmv_xr_params &P, int64_t n_groups)
{
    enum { VPU = ds4_fmv_t<T>::VPU };
    const int64_t upl = (P.units + XR_THREADS - 1) / XR_THREADS;
    if (upl <= 1) return xr_go<T, 1>(cu, P, n_groups);
    if (upl <= 2) return xr_go<T, 2>(cu, P, n_groups);
    if (VPU == 4 && upl <= 4) return xr_go<T, 16 / VPU>(cu, P, n_groups);
    return false;
}

/* 1 when taken: float weights that cuda_fmv.cu runs a block per row, at
 * most 16 values a thread and token (4096 F16 / BF16 or F32 columns), 5 to
 * 63 tokens (fewer share one pass of the matvec; 64 and more take
 * cuda_fmv_tall.cu where the caller covers them). */
int ds4_fmv_xr_dense(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows, int64_t cols, const float *d_x,
                     int64_t x_ld, int64_t n_tok, float *d_y, int64_t y_ld)
{
    if (!xr_on() || n_tok < 5 || n_tok > 63 || ds4_cuda_fmv_warps_per_row(cu, rows) != 8) return 0;
    ds4_fmv_xr_params P;
    P.w = (const uint8_t *)d_w;
    P.rows = rows;
    P.row_bytes = cols * (type == DS4_TYPE_F32 ? 4 : 2);
    P.units = P.row_bytes / 16;
    if (P.units > 4 * XR_THREADS || P.row_bytes > XR_STAGE_MAX) return 0;
    P.x = d_x;
    P.x_ld = x_ld;
    P.y = d_y;
    P.y_ld = y_ld;
    P.n_tok = n_tok;
    P.rps = (int)(XR_STAGE_MAX / P.row_bytes < XR_RMAX ? XR_STAGE_MAX / P.row_bytes : XR_RMAX);
    const int64_t n_groups = (n_tok + XR_NT - 1) / XR_NT;
    switch (type) {
    case DS4_TYPE_F16: return xr_type<DS4_TYPE_F16>(cu, P, n_groups);
    case DS4_TYPE_BF16: return xr_type<DS4_TYPE_BF16>(cu, P, n_groups);
    case DS4_TYPE_F32: return xr_type<DS4_TYPE_F32>(cu, P, n_groups);
    default: return 0;
    }
}

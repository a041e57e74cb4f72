/*
 * cuda_hc_ticket.cu - one token's hyper-connection site over 48 blocks,
 * the last of them (by a ticket) finishing it: the bits of the cluster
 * kernel (cuda_hc_cluster.cu), its mixing rows read by 48 SMs instead of 8.
 *
 * Why: the cluster kernel reads a site's 0.8 MB of F16 mixing rows into
 * its 8 blocks, 98 KB an SM. Its phase times (thirty-fifth session, H100)
 * put the column warps' start 1.5 us after the service warp's (the
 * weights' loads issued before the wait stall the issue) and the partial
 * dots 2.3 us after the streams are read: about half of the site's
 * 8.2 us in-graph is one SM's share of the rows arriving, where the whole
 * GPU reads them in a fraction of a microsecond.
 *
 * How: block b = 8 g + q (q the 512-column block, g = 0..5 a group of 16
 * of the 96 (row, stream) segments), 16 warps:
 *  1. before the wait: warp w's 1 KB piece of segment s = 16 g + w (rows r
 *     = s / 4, stream j = s % 4, columns 512 q ..), 16 or 32 bytes a lane;
 *     the biases; the norm weights of the 8 columns this thread would
 *     finish as the last block;
 *  2. after it: the 4 stream values of column 512 q + tid (hc_post's when
 *     fused) into shared memory; warp w's partial dot of its segment over
 *     the 512 columns, lanes in column order and a butterfly (the cluster
 *     kernel's segment sum); blocks g = 0 also the columns' sum of squares
 *     (hcc_sum_cols); both stored to a scratch of the backend;
 *  3. the ticket (the router's pattern, cuda_fmv.cu): the 48th block reads
 *     the partials and sums them in the cluster kernel's orders (a row's
 *     four streams, then the 8 column blocks from 0), forms the
 *     coefficients, recomputes every column's stream values from X (no
 *     block writes X before this one), collapses and normalizes 8 columns
 *     a thread (column 512 q + tid of block q: hcc_norm_scale's warps and
 *     order), and stores X, y, a, post and comb.
 * Only for one token on the backend's stream (the decode step's sites):
 * the ticket and the scratch are the backend's, one site at a time.
 * DS4_CUDA_HCC_TICKET=1 takes it (opt-in until measured).
 */
#include "backend/cuda/cuda_hc_cluster.cuh"
#include "backend/cuda/cuda_backend.cuh"
#include "backend/cuda/cuda_fmv.cuh"

#define HCT_GROUPS (HCC_SEGS / HCC_WARPS)   /* 6 groups of 16 segments */
#define HCT_BLOCKS (HCC_BLOCKS * HCT_GROUPS) /* 48 */

/* The stream values of column d: X's, or hc_post's from F (cb: comb_in,
 * pp: post_in, read once a thread). */
template <bool POST>
__device__ __forceinline__ void hct_streams(const ds4_hcc_args &A, int d, const float *cb, const float *pp,
                                            float (&xv)[HCC_NHC])
{
    float old[HCC_NHC];
#pragma unroll
    for (int k = 0; k < HCC_NHC; k++) old[k] = A.X[(size_t)k * HCC_D + d];
    if (POST) {
        const float f = A.F[d];
#pragma unroll
        for (int j = 0; j < HCC_NHC; j++) xv[j] = ds4_hc_post_value(pp[j], f, cb, old, j, HCC_NHC);
    } else {
#pragma unroll
        for (int j = 0; j < HCC_NHC; j++) xv[j] = old[j];
    }
}

template <int T, bool POST, bool NORM>
__global__ void __launch_bounds__(HCC_THREADS, 1)
    ds4_hct_kernel(const ds4_hcc_args A, unsigned *ticket, float *part, double *ssq)
{
    enum { VPU = ds4_fmv_t<T>::VPU, NU = HCC_THREADS / VPU / 32 }; /* 16-byte units a lane */
    __shared__ float s_x[HCC_NHC][HCC_THREADS];
    __shared__ double s_red[HCC_BLOCKS][HCC_WARPS];
    __shared__ float s_mix[HCC_MIX], s_bs[HCC_MIX], s_cb[HCC_NHC * HCC_NHC], s_pp[HCC_NHC];
    __shared__ float s_rr;
    __shared__ bool s_last;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int q = (int)blockIdx.x % HCC_BLOCKS, g = (int)blockIdx.x / HCC_BLOCKS;
    const int s = g * HCC_WARPS + warp, r = s / HCC_NHC, j = s % HCC_NHC;
    const int64_t n = (int64_t)HCC_NHC * HCC_D;
    const bool kt = tid == 0; /* phase times: block 0's thread 0, then the last block's */

    /* 1. constants, before the wait */
    const size_t esz = T == DS4_TYPE_F32 ? 4 : 2;
    const uint4 *wp =
        (const uint4 *)((const uint8_t *)A.fn + ((size_t)r * n + (size_t)j * HCC_D + (size_t)q * HCC_THREADS) * esz);
    uint4 wv[NU];
#pragma unroll
    for (int m = 0; m < NU; m++) wv[m] = __ldg(wp + lane + 32 * m);
    if (tid < HCC_MIX) s_bs[tid] = __ldg(A.bs + tid);
    float nwv[HCC_BLOCKS];
#pragma unroll
    for (int b = 0; b < HCC_BLOCKS; b++) nwv[b] = NORM ? __ldg(A.nw + b * HCC_THREADS + tid) : 0.0f;
    ds4_pdl_enter();
    ds4_kt_start(kt, DS4_KT_HCT);

    /* 2. this block's columns, its segments' partial dots */
    if (POST && tid < HCC_NHC * HCC_NHC) s_cb[tid] = A.comb_in[tid];
    if (POST && tid < HCC_NHC) s_pp[tid] = A.post_in[tid];
    __syncthreads();
    float xv[HCC_NHC];
    hct_streams<POST>(A, q * HCC_THREADS + tid, s_cb, s_pp, xv);
    double ss = 0.0;
#pragma unroll
    for (int k = 0; k < HCC_NHC; k++) {
        s_x[k][tid] = xv[k];
        ss += (double)xv[k] * xv[k];
    }
    __syncthreads();
    float acc = 0.0f;
#pragma unroll
    for (int m = 0; m < NU; m++) {
        float w[8], x[8];
        ds4_fmv_decode<T>(wv[m], w);
        const float *xp = &s_x[j][(lane + 32 * m) * VPU];
#pragma unroll
        for (int k = 0; k < VPU; k++) x[k] = xp[k];
        acc = ds4_fmv_dot<T>(w, x, acc);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) part[s * HCC_BLOCKS + q] = acc;
    if (g == 0) { /* uniform in the block: hcc_sum_cols's barrier takes all its threads */
        ss = hcc_sum_cols(ss, s_red[0]);
        if (tid == 0) ssq[q] = ss;
    }
    ds4_kt_phase(kt && blockIdx.x == 0, DS4_KT_HCT, 0);

    /* 3. the ticket: the block's stores made visible, then counted */
    __syncthreads();
    if (tid == 0) {
        __threadfence();
        s_last = atomicAdd(ticket, 1u) == HCT_BLOCKS - 1;
        __threadfence();
    }
    __syncthreads();
    if (!s_last) return;
    ds4_kt_phase(kt, DS4_KT_HCT, 1);

    /* every column's stream values again (loads issued before the sums) */
    float xs[HCC_BLOCKS][HCC_NHC];
#pragma unroll
    for (int b = 0; b < HCC_BLOCKS; b++) hct_streams<POST>(A, b * HCC_THREADS + tid, s_cb, s_pp, xs[b]);
    if (tid < HCC_MIX) { /* row tid: the cluster kernel's s_part, then the blocks from 0 */
        float m = 0.0f;
#pragma unroll
        for (int b = 0; b < HCC_BLOCKS; b++) {
            const float *pr = part + (size_t)tid * HCC_NHC * HCC_BLOCKS + b;
            const float pb = ((__ldcg(pr) + __ldcg(pr + HCC_BLOCKS)) + __ldcg(pr + 2 * HCC_BLOCKS)) +
                             __ldcg(pr + 3 * HCC_BLOCKS);
            m = b == 0 ? pb : m + pb;
        }
        s_mix[tid] = m;
    } else if (tid == 32) {
        double v = __ldcg(ssq);
#pragma unroll
        for (int b = 1; b < HCC_BLOCKS; b++) v += __ldcg(ssq + b);
        s_rr = (float)(1.0 / sqrt(v / (double)n + A.rms_eps));
    }
    __syncthreads();
    const float rr = s_rr;
    if (warp == 0) { /* post and comb (its Sinkhorn, or its inputs with comb_raw) */
        const int l = lane & 15;
        if (lane < 4) {
            const float mp = s_mix[4 + l] * rr;
            A.post[l] = 2.0f * cb_sigmoid(mp * A.sc1 + s_bs[4 + l]);
        }
        const float mc = s_mix[8 + l] * rr;
        const float in = mc * A.sc2 + s_bs[8 + l];
        const float c = A.comb_raw ? in : cb_sinkhorn4_lanes(in, A.iters, A.hc_eps);
        if (lane < 16) A.comb[l] = c;
    }
    float pre[HCC_NHC];
#pragma unroll
    for (int k = 0; k < HCC_NHC; k++) pre[k] = hcc_pre_coef(s_mix[k], rr, A.sc0, s_bs[k], A.hc_eps);
    float y[HCC_BLOCKS];
#pragma unroll
    for (int b = 0; b < HCC_BLOCKS; b++) {
        y[b] = 0.0f;
#pragma unroll
        for (int k = 0; k < HCC_NHC; k++) y[b] += pre[k] * xs[b][k];
    }
    ds4_kt_phase(kt, DS4_KT_HCT, 2);
    float rs = 0.0f;
    if (NORM) { /* hcc_norm_scale's sums: warps of 32 columns, 16 warps a block, blocks from 0 */
#pragma unroll
        for (int b = 0; b < HCC_BLOCKS; b++) {
            double v = (double)y[b] * y[b];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0) s_red[b][warp] = v;
        }
        __syncthreads();
        double v = 0.0;
#pragma unroll
        for (int b = 0; b < HCC_BLOCKS; b++) {
            double sb = s_red[b][0];
#pragma unroll
            for (int w = 1; w < HCC_WARPS; w++) sb += s_red[b][w];
            v = b == 0 ? sb : v + sb;
        }
        rs = (float)(1.0 / sqrt(v / HCC_D + A.neps));
        ds4_kt_phase(kt, DS4_KT_HCT, 3);
    }
#pragma unroll
    for (int b = 0; b < HCC_BLOCKS; b++) {
        const int d = b * HCC_THREADS + tid;
        if (POST)
#pragma unroll
            for (int k = 0; k < HCC_NHC; k++) A.X[(size_t)k * HCC_D + d] = xs[b][k];
        A.y[d] = y[b];
        if (NORM) A.a[d] = (y[b] * rs) * nwv[b];
    }
    if (tid == 0) *ticket = 0; /* for the next site */
    ds4_kt_phase(kt, DS4_KT_HCT, 4);
}

/* ---- host side -------------------------------------------------------------- */

bool ds4_hct_on(void)
{
    static int on = -1;
    return ds4_env_flag_on("DS4_CUDA_HCC_TICKET", &on);
}

template <int T, bool POST, bool NORM>
static void hct_launch(ds4_cuda *cu, const ds4_hcc_args &a, unsigned *ticket, float *scratch)
{
    ds4_launch(ds4_hct_kernel<T, POST, NORM>, dim3(HCT_BLOCKS), dim3(HCC_THREADS), 0, cu->stream, a, ticket, scratch,
               (double *)(scratch + HCT_PART_FLOATS));
}

template <int T> static void hct_launch_t(ds4_cuda *cu, const ds4_hcc_args &a, unsigned *ticket, float *scratch)
{
    const bool post = a.F != NULL, norm = a.nw != NULL;
    if (post) return norm ? hct_launch<T, true, true>(cu, a, ticket, scratch)
                          : hct_launch<T, true, false>(cu, a, ticket, scratch);
    return norm ? hct_launch<T, false, true>(cu, a, ticket, scratch) : hct_launch<T, false, false>(cu, a, ticket, scratch);
}

bool ds4_hct_run(ds4_cuda *cu, const ds4_hcc_args &a, unsigned *ticket, float *scratch)
{
    if (a.T != 1 || !ticket || !scratch) return false;
    switch (a.fn_type) {
    case DS4_TYPE_F16: hct_launch_t<DS4_TYPE_F16>(cu, a, ticket, scratch); break;
    case DS4_TYPE_BF16: hct_launch_t<DS4_TYPE_BF16>(cu, a, ticket, scratch); break;
    default: hct_launch_t<DS4_TYPE_F32>(cu, a, ticket, scratch); break;
    }
    return cudaPeekAtLastError() == cudaSuccess;
}

/*
 * cuda_hc_cluster.cu - a hyper-connection site of Flash's shape in one
 * kernel (cuda_hc_cluster.cuh says what it computes).
 *
 * Why: a site was three launches (hc_post, the 24-row mixing matvec, the
 * one-block hc_pre kernel), ~18 us of a decode step's ~190 us per layer at
 * two sites a layer, while its bytes (0.8 MB of mixing rows, 64 KB of
 * streams) take well under a microsecond. Each launch was a chain of
 * memory round trips on one or a few SMs.
 *
 * How: a cluster of 8 blocks per token (per two tokens of a batch, below,
 * ds4_hcc_kernel's TPC; one token's over 16 blocks by default, SPL below:
 * the same sums, half the mixing rows a block); column thread d' (warps 0..15) of
 * block q owns column d = 512 q + d' of all 4 streams (so hc_post is done
 * in place with no hazard). Each block
 *  1. loads its share of the mixing rows into registers before waiting on
 *     the previous kernel (programmatic dependent launch): constants;
 *  2. forms its 4 x 512 stream values (hc_post's expression when fused),
 *     the sum of their squares (double) and the 24 partial dot products;
 *  3. gets the 8 blocks' partials, pushed by each into every block's
 *     shared memory (hcc_push; the pull form, DS4_CUDA_HCC_PUSH=0, reads
 *     them through distributed shared memory after a cluster barrier) and
 *     sums them in rank order (every block sums the same numbers in the
 *     same order, so all hold the same coefficients);
 *  4. collapses its columns; with the norm, a second exchange of the 8
 *     partial sums of squares. A 17th warp runs rank 0's Sinkhorn meanwhile.
 * Global stores come after the last barrier arrival (the pull form) or the
 * last push (the pushes: the streams and the collapsed row go out while
 * the norm's pushes travel): an arrival waits for the thread's outstanding
 * stores, and a push's count is a release too (measured: the first form, storing
 * before its barriers and with the Sinkhorn after the norm, took 11.5 us).
 * Orders (fixed, so the separate ops and the fused one give the same bits):
 * a segment (row r, stream j, a block's 512 columns) is summed per lane in
 * column order (one fma per value), then by a warp butterfly; a row's block
 * partial is ((s0 + s1) + s2) + s3 over the streams; the 8 block partials
 * are summed from rank 0. Sums of squares: per thread over the 4 streams in
 * double, each warp by a butterfly, the block's 16 warps in warp order
 * (hcc_sum_cols), the 8 blocks from rank 0.
 * An L2-prefetch form (mixing rows loaded after the wait, 64 registers, so
 * that blocks could start beside the previous kernel's) measured 1-3%
 * slower in the decode step and was not kept; so were two forms of the
 * rows' reads (thirty-sixth session, docs/CUDA.md "Four forms that lost"):
 * spread over 48 blocks with the last, by a ticket, finishing alone
 * (10.4 us a site against 8.2), and staged into shared memory by the bulk
 * copy (10.35 us).
 * DS4_CUDA_HC_CLUSTER=0 keeps the three-launch path (A/B runs).
 */
#include "backend/cuda/cuda_hc_cluster.cuh"
#include "backend/cuda/cuda_backend.cuh"
#include "backend/cuda/cuda_fmv.cuh"
#include "backend/cuda/cuda_mmvq.cuh"
#include "backend/cuda/cuda_q8m.cuh"

#include <cooperative_groups.h>
#include <stdlib.h>
#include <string.h>

namespace cg = cooperative_groups;

#define HCC_D 4096
#define HCC_NHC 4
#define HCC_MIX 24
#define HCC_BLOCKS 8                      /* blocks per token (the cluster) */
#define HCC_THREADS (HCC_D / HCC_BLOCKS)  /* 512: one column of every stream per thread */
#define HCC_WARPS (HCC_THREADS / 32)      /* 16 */
#define HCC_SEGS (HCC_MIX * HCC_NHC)      /* 96 (row, stream) segments of 512 columns */
#define HCC_SEGW (HCC_SEGS / HCC_WARPS)   /* 6 segments per warp */

/* The cluster barriers are ds4_cluster_arrive / ds4_cluster_wait
 * (cuda_internal.cuh): the kernels below store to global memory only after
 * their last arrival. */

/* Barrier 1 over the 512 column threads (warps 0..15) only: the site
 * kernel's service warp (16) does not take part. */
__device__ __forceinline__ void hcc_bar_cols() { asm volatile("bar.sync 1, %0;" ::"n"(HCC_THREADS) : "memory"); }

/* The sum over the 512 column threads of v, to each of them: a warp
 * butterfly (xor 16 .. 1), then the 16 warps' sums in warp order. red:
 * 16 doubles of shared memory that no other call uses. */
__device__ __forceinline__ double hcc_sum_cols(double v, double *red)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    hcc_bar_cols();
    double s = red[0];
#pragma unroll
    for (int w = 1; w < HCC_WARPS; w++) s += red[w];
    return s;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 /* clusters: the device code below uses them */
/* rs = 1 / sqrt(mean(y^2) + eps) over a 4096-wide row held one value per
 * column thread of the cluster's 8 blocks: squares in double, the block by
 * hcc_sum_cols, the 8 blocks from rank 0. The one order of the norm at
 * this width (the rmsnorm op takes it too), so that a fused site and its
 * separate ops agree bit for bit. A full cluster barrier, then this
 * block's arrival on the next one (the caller waits before it exits). */
__device__ __forceinline__ float hcc_norm_scale(cg::cluster_group &cluster, float y, float eps, double *red,
                                                double *s_sy)
{
    const double sy = hcc_sum_cols((double)y * y, red);
    if (threadIdx.x == 0) *s_sy = sy;
    ds4_cluster_arrive(); /* every block is done with any earlier exchange, s_sy is out */
    ds4_cluster_wait();
    double v = *cluster.map_shared_rank(s_sy, 0);
#pragma unroll
    for (int r = 1; r < HCC_BLOCKS; r++) v += *cluster.map_shared_rank(s_sy, r);
    ds4_cluster_arrive();
    return (float)(1.0 / sqrt(v / HCC_D + eps));
}
#endif

/* hcc_sum_cols for N tokens at once: each token's sum in hcc_sum_cols's
 * order, one barrier for all. red: N x 16 doubles. */
template <int N> __device__ __forceinline__ void hcc_sum_cols_n(double (&v)[N], double (*red)[HCC_WARPS])
{
#pragma unroll
    for (int k = 0; k < N; k++) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v[k] += __shfl_xor_sync(0xffffffffu, v[k], o);
        if ((threadIdx.x & 31) == 0) red[k][threadIdx.x >> 5] = v[k];
    }
    hcc_bar_cols();
#pragma unroll
    for (int k = 0; k < N; k++) {
        double s = red[k][0];
#pragma unroll
        for (int w = 1; w < HCC_WARPS; w++) s += red[k][w];
        v[k] = s;
    }
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* hcc_norm_scale for N tokens (y[k] token k's value of this column): the
 * same sums, one exchange for all. */
template <int N>
__device__ __forceinline__ void hcc_norm_scale_n(cg::cluster_group &cluster, const float (&y)[N], float eps,
                                                 double (*red)[HCC_WARPS], double *s_sy, float (&rs)[N])
{
    double sy[N];
#pragma unroll
    for (int k = 0; k < N; k++) sy[k] = (double)y[k] * y[k];
    hcc_sum_cols_n<N>(sy, red);
#pragma unroll
    for (int k = 0; k < N; k++)
        if (threadIdx.x == k) s_sy[k] = sy[k];
    ds4_cluster_arrive(); /* every block is done with any earlier exchange, s_sy is out */
    ds4_cluster_wait();
#pragma unroll
    for (int k = 0; k < N; k++) {
        double v = *cluster.map_shared_rank(&s_sy[k], 0);
#pragma unroll
        for (int r = 1; r < HCC_BLOCKS; r++) v += *cluster.map_shared_rank(&s_sy[k], r);
        rs[k] = (float)(1.0 / sqrt(v / HCC_D + eps));
    }
    ds4_cluster_arrive();
}

/* hcc_norm_scale_n with pushes (ds4_hcc_kernel's PUSH), in two calls so
 * that the stores which need no norm go out between them. hcc_norm_push:
 * the block's sums, which the first 8 ranks (the first half's, as read
 * above) push to every block's r_sy[k][rank] (CL blocks), counted off the
 * barrier at mb. hcc_norm_take: the wait for them, then the same sums in
 * rank order, from this block's shared memory. */
template <int N, int CL>
__device__ __forceinline__ void hcc_norm_push(const float (&y)[N], double (*red)[HCC_WARPS], double (*r_sy)[HCC_BLOCKS],
                                              uint32_t mb, int rank)
{
    double sy[N];
#pragma unroll
    for (int k = 0; k < N; k++) sy[k] = (double)y[k] * y[k];
    hcc_sum_cols_n<N>(sy, red);
    if (rank < HCC_BLOCKS && (int)threadIdx.x < N * CL) {
        const int k = (int)threadIdx.x / CL, to = (int)threadIdx.x % CL;
#pragma unroll
        for (int kk = 0; kk < N; kk++) /* a constant index: sy stays in registers */
            if (kk == k)
                ds4_push8(ds4_cluster_map((uint32_t)__cvta_generic_to_shared(&r_sy[kk][rank]), to), sy[kk],
                          ds4_cluster_map(mb, to));
    }
}
template <int N>
__device__ __forceinline__ void hcc_norm_take(float eps, const double (*r_sy)[HCC_BLOCKS], uint32_t mb, float (&rs)[N])
{
    ds4_mbar_wait0(mb);
#pragma unroll
    for (int k = 0; k < N; k++) {
        double v = r_sy[k][0];
#pragma unroll
        for (int r = 1; r < HCC_BLOCKS; r++) v += r_sy[k][r];
        rs[k] = (float)(1.0 / sqrt(v / HCC_D + eps));
    }
}
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* The site's first exchange by pushes (ds4_hcc_kernel's PUSH): this block
 * (rank = q + 8 h) pushes its half's RH rows' partials, each made from
 * s_seg as the pull form makes s_part, 4 rows a 16-byte push, into
 * r_part[k][rank] of every block of the cluster; the first 8 ranks push
 * their sums of squares into r_ss[k][rank]; all counted off the barrier
 * at mb, which this waits on. The column threads' wait on the cluster
 * arrival made at the kernel's start comes first: every block's barriers
 * are ready. */
template <int TPC, int SPL, int RH = HCC_MIX / SPL, int CL = HCC_BLOCKS * SPL>
__device__ __forceinline__ void hcc_push(const float (*s_seg)[HCC_SEGS], float (*r_part)[CL][RH],
                                         double (*r_ss)[HCC_BLOCKS], const double (&ss)[TPC], uint32_t mb, int rank)
{
    enum { NCH = RH / 4, NPJ = TPC * NCH * CL };
    static_assert(RH % 4 == 0 && NPJ <= 256, "whole 16-byte pushes, from the first 8 warps");
    const int tid = threadIdx.x, hh = rank / HCC_BLOCKS;
    ds4_cluster_wait();
    if (tid < NPJ) {
        const int tk = tid / (NCH * CL), c = tid / CL % NCH, to = tid % CL;
        float v[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = RH * hh + 4 * c + e;
            v[e] = ((s_seg[tk][r * 4] + s_seg[tk][r * 4 + 1]) + s_seg[tk][r * 4 + 2]) + s_seg[tk][r * 4 + 3];
        }
        ds4_push16(ds4_cluster_map((uint32_t)__cvta_generic_to_shared(&r_part[tk][rank][4 * c]), to),
                   make_float4(v[0], v[1], v[2], v[3]), ds4_cluster_map(mb, to));
    } else if (rank < HCC_BLOCKS && tid >= 256 && tid < 256 + TPC * CL) {
        const int tk = (tid - 256) / CL, to = (tid - 256) % CL;
#pragma unroll
        for (int k = 0; k < TPC; k++) /* a constant index: ss stays in registers */
            if (k == tk)
                ds4_push8(ds4_cluster_map((uint32_t)__cvta_generic_to_shared(&r_ss[k][rank]), to), ss[k],
                          ds4_cluster_map(mb, to));
    }
    ds4_mbar_wait0(mb);
}
#endif

/* The rmsnorm op on rows of 4096 (w F32 or NULL): a cluster per row. In
 * place (out == x) is fine: a thread reads its column before writing it. */
__global__ void __launch_bounds__(HCC_THREADS, 1)
    ds4_hcc_rmsnorm_kernel(const float *x, const float *w, float eps, float *out)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __shared__ double s_red[HCC_WARPS], s_sy;
    cg::cluster_group cluster = cg::this_cluster();
    const int d = (int)cluster.block_rank() * HCC_THREADS + threadIdx.x;
    const float wv = w ? __ldg(w + d) : 1.0f;
    ds4_pdl_enter();
    const size_t row = (size_t)blockIdx.y * HCC_D;
    const float y = x[row + d];
    const float rs = hcc_norm_scale(cluster, y, eps, s_red, &s_sy);
    out[row + d] = w ? (y * rs) * wv : y * rs;
    ds4_cluster_wait();
#endif
}

/* The site: 17 warps a block, TPC tokens a cluster (tokens TPC y ..
 * TPC y + TPC - 1 of grid row y, those below A.T). Warps 0..15 own a
 * column of every stream of each token; warp 16 (the service warp) only
 * takes part in the cluster barriers, and in rank 0 runs the Sinkhorn
 * (~2 us of serial shuffles and divisions; half-warp k for token k) while
 * the column warps collapse and normalize. The tokens of a cluster share
 * its mixing rows (loaded once) and its barrier chain: a batch of 16
 * tokens takes 8 clusters of 2 where 16 clusters of 8 blocks do not all
 * fit on the GPU at once. Each token's sums are those of TPC = 1, in the
 * same order. SPL = 2: 16 blocks a cluster, rank q + 8 h as rank q of the
 * 8-block form but with only half h of the mixing rows (hcc_split).
 * PUSH: the two exchanges by pushes (hcc_push: the same values summed in
 * the same order, so the same bits) instead of cluster barriers and
 * remote loads. */
template <int T, bool POST, bool NORM, int TPC, int SPL, bool PUSH>
__global__ void __launch_bounds__(HCC_THREADS + 32, 1) ds4_hcc_kernel(const ds4_hcc_args A)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    static_assert(TPC == 1 || TPC == 2, "the service warp's half-warps take at most two tokens");
    static_assert(SPL == 1 || SPL == 2, "the rows whole or split in two");
    enum { VPU = ds4_fmv_t<T>::VPU, NU = HCC_THREADS / VPU / 32 }; /* 16-byte units per lane and segment */
    enum { SEGW = HCC_SEGW / SPL, RH = HCC_MIX / SPL }; /* a warp's segments; a block's rows */
    __shared__ float s_x[TPC][HCC_NHC][HCC_THREADS];
    __shared__ float s_seg[TPC][HCC_SEGS];
    __shared__ float s_part[TPC][HCC_MIX]; /* this block's partial dot products (read by the cluster) */
    __shared__ double s_ss[TPC], s_sy[TPC]; /* this block's sums of squares (read by the cluster) */
    __shared__ double s_red[2][TPC][HCC_WARPS];
    __shared__ float s_mix[TPC][HCC_MIX];
    __shared__ float s_rr[TPC]; /* 1 / rms of the flat row */
    /* PUSH: what the cluster's blocks push here. r_part[k][rank][i]: that
     * rank's partial of row RH (rank / 8) + i; r_ss, r_sy: the first 8
     * ranks' sums of squares (of the streams, of the collapsed row); s_mb:
     * the two exchanges' barriers */
    enum { CL = HCC_BLOCKS * SPL };
    __shared__ __align__(16) float r_part[PUSH ? TPC : 1][PUSH ? CL : 1][PUSH ? RH : 4];
    __shared__ double r_ss[PUSH ? TPC : 1][HCC_BLOCKS], r_sy[PUSH ? TPC : 1][HCC_BLOCKS];
    __shared__ __align__(8) uint64_t s_mb[2];
    cg::cluster_group cluster = cg::this_cluster();
    /* SPL 2: rank q + 8 h owns columns 512 q .. and mixing rows 12 h .. 12 h + 11 */
    const int rank = (int)cluster.block_rank(), q = rank % HCC_BLOCKS, hh = rank / HCC_BLOCKS;
    const int t0 = (int)blockIdx.y * TPC, tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31, d = q * HCC_THREADS + tid;
    const int64_t n = (int64_t)HCC_NHC * HCC_D;
    bool tv[TPC]; /* token t0 + k exists */
#pragma unroll
    for (int k = 0; k < TPC; k++) tv[k] = t0 + k < A.T;

    /* in-graph phase times (DS4_CUDA_KTIME): the first cluster's rank 0, its
     * column thread 0 and its service warp's lane 0 */
    const bool kt_col = (blockIdx.x | blockIdx.y) == 0 && tid == 0;
    const bool kt_srv = (blockIdx.x | blockIdx.y) == 0 && tid == HCC_THREADS;
    const uint32_t mb0 = (uint32_t)__cvta_generic_to_shared(&s_mb[0]), mb1 = mb0 + 8;
    if constexpr (PUSH) { /* the barriers ready before any block pushes: this arrival's wait */
        if (tid == 0) {
            ds4_mbar_init(mb0, TPC * (CL * RH * 4 + HCC_BLOCKS * 8));
            if (NORM) ds4_mbar_init(mb1, TPC * HCC_BLOCKS * 8);
            ds4_mbar_init_fence();
        }
        __syncwarp();
        ds4_cluster_arrive_relaxed();
    }
    if (warp == HCC_WARPS) { /* the service warp */
        ds4_pdl_enter();
        ds4_kt_start(kt_srv, DS4_KT_HCC_SERVICE);
        if (!PUSH) ds4_cluster_arrive(); /* the exchange of partial dots */
        ds4_cluster_wait();
        ds4_kt_phase(kt_srv, DS4_KT_HCC_SERVICE, 0);
        __syncthreads(); /* s_mix, s_rr */
        ds4_kt_phase(kt_srv, DS4_KT_HCC_SERVICE, 1);
        if (!PUSH) ds4_cluster_arrive(); /* the norm's exchange, or (no norm) the end */
        if (rank == 0) { /* post and the Sinkhorn: half-warp k for token k (both for TPC 1) */
            /* lane l of half-warp k: token k's entry l; the stores below
             * are the half-warps of existing tokens (TPC 1: lanes 16..31
             * mirror 0..15 and store nothing) */
            const int l = lane & 15, k = TPC == 1 ? 0 : lane >> 4, t = t0 + k;
            const float rr = s_rr[k];
            if (l < 4 && (TPC == 1 ? lane < 4 : tv[TPC - 1] || k == 0)) {
                const float mp = s_mix[k][4 + l] * rr;
                A.post[(size_t)t * 4 + l] = 2.0f * cb_sigmoid(mp * A.sc1 + __ldg(A.bs + 4 + l));
            }
            const float mc = s_mix[k][8 + l] * rr;
            const float in = mc * A.sc2 + __ldg(A.bs + 8 + l);
            /* comb_raw: the input, the Sinkhorn left to a later kernel */
            const float c = A.comb_raw ? in : cb_sinkhorn4_lanes(in, A.iters, A.hc_eps);
            if (TPC == 1 ? lane < 16 : tv[TPC - 1] || k == 0) A.comb[(size_t)t * 16 + l] = c;
            ds4_kt_phase(kt_srv, DS4_KT_HCC_SERVICE, 2);
        }
        if (!PUSH) ds4_cluster_wait();
        if (NORM && !PUSH) {
            ds4_cluster_arrive();
            ds4_cluster_wait();
        }
        ds4_kt_phase(kt_srv, DS4_KT_HCC_SERVICE, 3);
        return;
    }

    /* 1. the constants, before the wait on the previous kernel */
    uint4 wv[SEGW][NU];
    const size_t row_bytes = (size_t)n * (T == DS4_TYPE_F32 ? 4 : 2);
#pragma unroll
    for (int i = 0; i < SEGW; i++) {
        const int s = HCC_NHC * RH * hh + warp * SEGW + i, r = s / HCC_NHC, j = s % HCC_NHC;
        const uint4 *wp = (const uint4 *)((const uint8_t *)A.fn + r * row_bytes +
                                          ((size_t)j * HCC_D + (size_t)q * HCC_THREADS) * (T == DS4_TYPE_F32 ? 4 : 2));
#pragma unroll
        for (int m = 0; m < NU; m++) wv[i][m] = __ldg(wp + lane + 32 * m);
    }
    float bsv[HCC_NHC];
#pragma unroll
    for (int k = 0; k < HCC_NHC; k++) bsv[k] = __ldg(A.bs + k);
    const float nwv = NORM ? __ldg(A.nw + d) : 0.0f;
    ds4_pdl_enter();
    ds4_kt_start(kt_col, DS4_KT_HCC);

    /* 2. the stream values of column d, their squares, the partial dots */
    float xv[TPC][HCC_NHC];
    double ss[TPC];
#pragma unroll
    for (int tk = 0; tk < TPC; tk++) {
        const int t = t0 + tk;
        const float *Xt = A.X + (size_t)t * n;
#pragma unroll
        for (int k = 0; k < HCC_NHC; k++) xv[tk][k] = tv[tk] ? Xt[(size_t)k * HCC_D + d] : 0.0f;
        if (POST && tv[tk]) { /* stored at the end */
            const float f = A.F[(size_t)t * HCC_D + d];
            const float *cb = A.comb_in + (size_t)t * HCC_NHC * HCC_NHC;
            const float *pp = A.post_in + (size_t)t * HCC_NHC;
            float nx[HCC_NHC];
#pragma unroll
            for (int j = 0; j < HCC_NHC; j++) nx[j] = ds4_hc_post_value(pp[j], f, cb, xv[tk], j, HCC_NHC);
#pragma unroll
            for (int j = 0; j < HCC_NHC; j++) xv[tk][j] = nx[j];
        }
        ss[tk] = 0.0;
#pragma unroll
        for (int k = 0; k < HCC_NHC; k++) {
            s_x[tk][k][tid] = xv[tk][k];
            ss[tk] += (double)xv[tk][k] * xv[tk][k];
        }
    }
    ds4_kt_phase(kt_col, DS4_KT_HCC, 0);
    hcc_sum_cols_n<TPC>(ss, s_red[0]); /* its barrier also publishes s_x */
#pragma unroll
    for (int i = 0; i < SEGW; i++) {
        const int s = HCC_NHC * RH * hh + warp * SEGW + i, j = s % HCC_NHC;
        float acc[TPC];
#pragma unroll
        for (int tk = 0; tk < TPC; tk++) acc[tk] = 0.0f;
#pragma unroll
        for (int m = 0; m < NU; m++) {
            float w[8];
            ds4_fmv_decode<T>(wv[i][m], w);
#pragma unroll
            for (int tk = 0; tk < TPC; tk++) {
                float x[8];
                const float *xp = &s_x[tk][j][(lane + 32 * m) * VPU];
#pragma unroll
                for (int k = 0; k < VPU; k++) x[k] = xp[k];
                acc[tk] = ds4_fmv_dot<T>(w, x, acc[tk]);
            }
        }
#pragma unroll
        for (int tk = 0; tk < TPC; tk++) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc[tk] += __shfl_xor_sync(0xffffffffu, acc[tk], o);
            if (lane == 0) s_seg[tk][s] = acc[tk];
        }
    }
    hcc_bar_cols();
    ds4_kt_phase(kt_col, DS4_KT_HCC, 1);
    if constexpr (PUSH) {
        hcc_push<TPC, SPL>(s_seg, r_part, r_ss, ss, mb0, rank);
        ds4_kt_phase(kt_col, DS4_KT_HCC, 2);
        if (tid < HCC_MIX * TPC) { /* as below, from this block's copies */
            const int tk = tid / HCC_MIX, r = tid % HCC_MIX, rb = HCC_BLOCKS * (r / RH), i = r % RH;
            float m = r_part[tk][rb][i];
#pragma unroll
            for (int rk = 1; rk < HCC_BLOCKS; rk++) m += r_part[tk][rb + rk][i];
            s_mix[tk][r] = m;
        } else if (tid >= 64 && tid < 64 + TPC) {
            const int tk = tid - 64;
            double v = r_ss[tk][0];
#pragma unroll
            for (int rk = 1; rk < HCC_BLOCKS; rk++) v += r_ss[tk][rk];
            s_rr[tk] = (float)(1.0 / sqrt(v / (double)n + A.rms_eps));
        }
    } else {
    if (tid < RH * TPC) {
        const int tk = tid / RH, r = RH * hh + tid % RH;
        s_part[tk][r] = ((s_seg[tk][r * 4] + s_seg[tk][r * 4 + 1]) + s_seg[tk][r * 4 + 2]) + s_seg[tk][r * 4 + 3];
    }
#pragma unroll
    for (int tk = 0; tk < TPC; tk++)
        if (tid == tk) s_ss[tk] = ss[tk];
    ds4_cluster_arrive();
    ds4_cluster_wait();
    ds4_kt_phase(kt_col, DS4_KT_HCC, 2);

    /* 3. the cluster's sums, in rank order */
    if (tid < HCC_MIX * TPC) { /* row r's partials from the 8 column slices (of its half), from 0 */
        const int tk = tid / HCC_MIX, r = tid % HCC_MIX, rb = HCC_BLOCKS * (r / RH);
        float m = *cluster.map_shared_rank(&s_part[tk][r], rb);
#pragma unroll
        for (int rk = 1; rk < HCC_BLOCKS; rk++) m += *cluster.map_shared_rank(&s_part[tk][r], rb + rk);
        s_mix[tk][r] = m;
    } else if (tid >= 64 && tid < 64 + TPC) { /* the slices' squares, each slice's from its first half */
        const int tk = tid - 64;
        double v = *cluster.map_shared_rank(&s_ss[tk], 0);
#pragma unroll
        for (int rk = 1; rk < HCC_BLOCKS; rk++) v += *cluster.map_shared_rank(&s_ss[tk], rk);
        s_rr[tk] = (float)(1.0 / sqrt(v / (double)n + A.rms_eps));
    }
    }
    __syncthreads(); /* with the service warp */
    ds4_kt_phase(kt_col, DS4_KT_HCC, 3);
    if (!NORM && !PUSH) ds4_cluster_arrive(); /* done reading the others' shared memory */

    /* 4. coefficients (every thread the same values), collapse, norm */
    float y[TPC];
#pragma unroll
    for (int tk = 0; tk < TPC; tk++) {
        const float rr = s_rr[tk];
        y[tk] = 0.0f;
#pragma unroll
        for (int k = 0; k < HCC_NHC; k++) {
            const float pre = cb_sigmoid(s_mix[tk][k] * rr * A.sc0 + bsv[k]) + A.hc_eps;
            y[tk] += pre * xv[tk][k];
        }
    }
    ds4_kt_phase(kt_col, DS4_KT_HCC, 4);
    float rs[TPC];
    if (NORM && PUSH) hcc_norm_push<TPC, CL>(y, s_red[1], r_sy, mb1, rank);
    if (PUSH) /* the stores that need no norm, while the pushes travel */
#pragma unroll
        for (int tk = 0; tk < TPC; tk++) {
            if (!tv[tk] || (SPL == 2 && warp / (HCC_WARPS / 2) != hh)) continue;
            const int t = t0 + tk;
            float *Xt = A.X + (size_t)t * n;
            if (POST)
#pragma unroll
                for (int j = 0; j < HCC_NHC; j++) Xt[(size_t)j * HCC_D + d] = xv[tk][j];
            A.y[(size_t)t * HCC_D + d] = y[tk];
        }
    if (NORM && PUSH) hcc_norm_take<TPC>(A.neps, r_sy, mb1, rs);
    if (NORM && !PUSH) hcc_norm_scale_n<TPC>(cluster, y, A.neps, s_red[1], s_sy, rs);
    if (NORM) ds4_kt_phase(kt_col, DS4_KT_HCC, 5);
#pragma unroll
    for (int tk = 0; tk < TPC; tk++) {
        /* SPL 2: both halves hold every value of their columns; each stores
         * 8 of the 16 warps' (a warp's 32 columns stay one Q8_0 block) */
        if (!tv[tk] || (SPL == 2 && warp / (HCC_WARPS / 2) != hh)) continue;
        const int t = t0 + tk;
        float *Xt = A.X + (size_t)t * n;
        if (POST && !PUSH)
#pragma unroll
            for (int j = 0; j < HCC_NHC; j++) Xt[(size_t)j * HCC_D + d] = xv[tk][j];
        if (!PUSH) A.y[(size_t)t * HCC_D + d] = y[tk];
        if (NORM) {
            const float av = (y[tk] * rs[tk]) * nwv;
            A.a[(size_t)t * HCC_D + d] = av;
            if (A.q8) { /* a warp holds 32 neighbouring columns: one Q8_0 block (amax from 0, as the products') */
                float amax = fmaxf(0.0f, fabsf(av));
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
                A.q8[(size_t)t * HCC_D + d] = ds4_mmvq_q8_0_q(av, ds4_mmvq_q8_0_id(amax));
                if (lane == 0) A.q8d[((size_t)t * HCC_D + d) / 32] = ds4_mmvq_q8_0_d(amax);
            }
            if (A.q8m) { /* the same block, in the fragment order */
                float amax = fmaxf(0.0f, fabsf(av));
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
                A.q8m[qm_frag_at(t, d >> 5, d & 31)] = (uint8_t)ds4_mmvq_q8_0_q(av, ds4_mmvq_q8_0_id(amax));
                if ((d & 31) == 0) A.q8md[(d >> 5) * QM_TOK + t] = ds4_mmvq_q8_0_d(amax);
            }
        }
    }
    ds4_kt_phase(kt_col, DS4_KT_HCC, 6);
    if (!PUSH) ds4_cluster_wait();
    ds4_kt_phase(kt_col, DS4_KT_HCC, 7);
#endif
}

/* A site's Sinkhorn on its own (a reader of comb found it not yet run). */
__global__ void __launch_bounds__(256) ds4_sink_kernel(const ds4_sink_job j)
{
    ds4_pdl_enter();
    ds4_sink_job_run(j);
}

/* ---- host side -------------------------------------------------------------- */

bool ds4_sink_run(cudaStream_t stream, const ds4_sink_job &j)
{
    if (!j.comb || j.T < 1) return true;
    const int warps = (j.T + 1) / 2 < 8 ? (j.T + 1) / 2 : 8;
    ds4_launch(ds4_sink_kernel, 1, 32 * warps, 0, stream, j);
    return cudaPeekAtLastError() == cudaSuccess;
}

bool ds4_hcc_ok(ds4_cuda *cu, int n_hc, int D, int64_t n_mix, ds4_type fn_type)
{
    if (n_hc != HCC_NHC || D != HCC_D || n_mix != HCC_MIX) return false;
    if (fn_type != DS4_TYPE_F16 && fn_type != DS4_TYPE_BF16 && fn_type != DS4_TYPE_F32) return false;
    return ds4_hcc_on(cu);
}

bool ds4_hcc_on(ds4_cuda *cu)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_HC_CLUSTER", &on) && cu->cc_major >= 9;
}

/* kernel<<<(cl, rows), threads>>> in clusters of cl (8, or 16 with the
 * rows split), with programmatic dependent launch when that is on
 * (ds4_launch's attribute). */
template <typename... KArgs, typename... Args>
static bool hcc_launch_k(ds4_cuda *cu, void (*kernel)(KArgs...), unsigned cl, unsigned rows, unsigned threads,
                         Args &&...args)
{
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr[2];
    ds4_cluster_cfg(cfg, attr, cu, dim3(cl, rows), threads, 0, cl);
    ds4_launch_seq++;
    if (cudaLaunchKernelEx(&cfg, kernel, static_cast<Args &&>(args)...) != cudaSuccess) return false;
    ds4_kt_note_launch((const void *)kernel, ds4_kt_shape(cl, rows, 1, threads), (const void *)cu->stream);
    return true;
}

/* Two tokens a cluster for a batch (DS4_CUDA_HCC_TPC=1: one, A/B): a
 * 16-token step's 16 clusters of 8 blocks took two waves (19 us a site
 * against 10 for one token, ncu, twentieth session). */
static bool hcc_two_a_cluster(int T)
{
    static int tpc = -1;
    if (tpc < 0) {
        const char *e = getenv("DS4_CUDA_HCC_TPC");
        tpc = e && !strcmp(e, "1") ? 1 : 2;
    }
    return T > 1 && tpc == 2;
}

/* A site over 16 blocks (DS4_CUDA_HCC_SPLIT=1, the default: one token's;
 * =2: a batch's too, opt-in; =0: the 8-block form): rank q + 8 h takes
 * columns 512 q .. 512 q + 511 as rank q of the 8-block form and only the
 * mixing rows 12 h .. 12 h + 11, so an SM
 * loads 48 KB of the 0.8 MB of rows before its wait instead of 96 (the
 * column warps began ~1.3 us after the service warp, thirty-sixth
 * session's phase times, behind those loads). Every sum is the 8-block
 * form's: a row's partial is made by one warp of one block as before, and
 * the cluster adds a row's 8 partials from the ranks of its half in slice
 * order; the squares and the collapse are made in both halves alike, the
 * squares read from the first. A cluster of 16 is not portable (sm_90
 * allows it on request where a GPC holds 16 free SMs): the 8-block form
 * runs where cudaOccupancyMaxActiveClusters finds too few (a batch's
 * clusters must all be resident at once, as its 8-block form's are), or
 * the launch is refused. Measured (H100, 30 layers, fortieth session):
 * a site 8.60 -> 7.89 us in-graph, decode at 2K +1.4%; a 16-session step
 * gained nothing from =2. */
static int hcc_split(void)
{
    static int on = -1;
    return ds4_env_choice("DS4_CUDA_HCC_SPLIT", &on, 1, "012");
}

/* The exchanges by pushes (the default; DS4_CUDA_HCC_PUSH=0: the pull
 * form): each block stores its partials into every block's shared memory
 * with st.async, counted off a transaction barrier there, and waits on
 * its own barrier, where the pull form takes a cluster barrier and then
 * remote loads (a round trip each); the same values added in the same
 * order, so the same bits. Measured (H100, 30 layers, forty-first
 * session): a site 7.90 -> 5.70 us in-graph, decode at 2K +3.5%, 32K
 * +3.4%, 16 sessions +0.8%. */
static bool hcc_push_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_HCC_PUSH", &on);
}

/* How many clusters of 16 of the kernel may be resident at once on cu's
 * device, asked once for each kernel instance and device. */
template <int T, bool POST, bool NORM, int TPC, bool PUSH> static int hcc_split_room(ds4_cuda *cu)
{
    static int room[32] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                           -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr[2];
    ds4_cluster_cfg(cfg, attr, cu, dim3(2 * HCC_BLOCKS, 1), HCC_THREADS + 32, 0, 2 * HCC_BLOCKS);
    cfg.numAttrs = 1; /* the cluster shape alone */
    return ds4_cluster_room(cu, (const void *)ds4_hcc_kernel<T, POST, NORM, TPC, 2, PUSH>, &cfg, true, room);
}

/* The 16-block form of TPC tokens a cluster for `clusters` clusters, if
 * the switch asks for it and they fit; false: the caller launches the
 * 8-block form. */
template <int T, bool POST, bool NORM, int TPC, bool PUSH>
static bool hcc_launch_split(ds4_cuda *cu, const ds4_hcc_args &a, unsigned clusters)
{
    if (hcc_split() < (TPC == 1 && a.T == 1 ? 1 : 2) ||
        (unsigned)hcc_split_room<T, POST, NORM, TPC, PUSH>(cu) < clusters)
        return false;
    if (hcc_launch_k(cu, ds4_hcc_kernel<T, POST, NORM, TPC, 2, PUSH>, 2 * HCC_BLOCKS, clusters, HCC_THREADS + 32, a))
        return true;
    cudaGetLastError(); /* refused: the 8-block form takes the launch */
    return false;
}

template <int T, bool POST, bool NORM, bool PUSH> static bool hcc_launch_p(ds4_cuda *cu, const ds4_hcc_args &a)
{
    if (hcc_two_a_cluster(a.T)) {
        const unsigned n = (unsigned)((a.T + 1) / 2);
        return hcc_launch_split<T, POST, NORM, 2, PUSH>(cu, a, n) ||
               hcc_launch_k(cu, ds4_hcc_kernel<T, POST, NORM, 2, 1, PUSH>, HCC_BLOCKS, n, HCC_THREADS + 32, a);
    }
    return hcc_launch_split<T, POST, NORM, 1, PUSH>(cu, a, (unsigned)a.T) ||
           hcc_launch_k(cu, ds4_hcc_kernel<T, POST, NORM, 1, 1, PUSH>, HCC_BLOCKS, (unsigned)a.T, HCC_THREADS + 32, a);
}

template <int T, bool POST, bool NORM> static bool hcc_launch(ds4_cuda *cu, const ds4_hcc_args &a)
{
    return hcc_push_on() ? hcc_launch_p<T, POST, NORM, true>(cu, a) : hcc_launch_p<T, POST, NORM, false>(cu, a);
}

template <int T> static bool hcc_launch_t(ds4_cuda *cu, const ds4_hcc_args &a)
{
    const bool post = a.F != NULL, norm = a.nw != NULL;
    if (post) return norm ? hcc_launch<T, true, true>(cu, a) : hcc_launch<T, true, false>(cu, a);
    return norm ? hcc_launch<T, false, true>(cu, a) : hcc_launch<T, false, false>(cu, a);
}

bool ds4_hcc_run(ds4_cuda *cu, const ds4_hcc_args &a)
{
    if (a.T < 1) return true;
    switch (a.fn_type) {
    case DS4_TYPE_F16: return hcc_launch_t<DS4_TYPE_F16>(cu, a);
    case DS4_TYPE_BF16: return hcc_launch_t<DS4_TYPE_BF16>(cu, a);
    default: return hcc_launch_t<DS4_TYPE_F32>(cu, a);
    }
}

bool ds4_hcc_rmsnorm(ds4_cuda *cu, const float *x, const float *w, int64_t n_rows, float eps, float *out)
{
    for (int64_t r0 = 0; r0 < n_rows; r0 += 65535) {
        const int64_t nr = n_rows - r0 < 65535 ? n_rows - r0 : 65535;
        if (!hcc_launch_k(cu, ds4_hcc_rmsnorm_kernel, HCC_BLOCKS, (unsigned)nr, HCC_THREADS, x + r0 * HCC_D, w, eps,
                          out + r0 * HCC_D))
            return false;
    }
    return true;
}

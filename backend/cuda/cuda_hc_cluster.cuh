/*
 * cuda_hc_cluster.cuh - a hyper-connection site of Flash's shape (4 streams
 * of 4096, 24 mixing rows) in one kernel: optionally the previous
 * sublayer's hc_post, then the mixing matvec, the RMS of the flat row, the
 * coefficients with their Sinkhorn, the collapse and optionally the
 * sublayer's RMSNorm (cuda_hc_cluster.cu). cuda_ops_hc.cu takes it for
 * hc_pre, hc_pre_norm and hc_post_pre_norm when the shape and the GPU allow.
 * Also the per-value pieces both files' kernels share (hc_post's value,
 * the sigmoid, the Sinkhorn on one warp), so that they agree bit for bit.
 */
#ifndef DS4_CUDA_HC_CLUSTER_CUH
#define DS4_CUDA_HC_CLUSTER_CUH

#include "backend/cuda/cuda_internal.cuh"

/* X'[j] = post[j] F + sum_k comb[k][j] X[k] for one (token, d), shared by
 * cb_hc_post_kernel and the fused site so that both give the same bits.
 * The roundings are spelled out (a rounded product, then one fma per
 * source stream): left to contraction, the compiler fused post[j] F into
 * the first term in one kernel and not in the other. */
__device__ __forceinline__ float ds4_hc_post_value(float post_j, float f, const float *comb, const float *old,
                                                   int j, int n_hc)
{
    float s = __fmul_rn(post_j, f);
    for (int k = 0; k < n_hc; k++) s = __fmaf_rn(comb[k * n_hc + j], old[k], s);
    return s;
}

__device__ __forceinline__ float cb_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* Lane l of a warp holds A[l / 4][l % 4] of the 4 x 4 comb matrix (every
 * lane takes part in the shuffles; each half-warp gathers within itself,
 * so lanes 16..31 may mirror 0..15 or hold a second matrix). Row and
 * column values are gathered in index order and summed from 0.0f in that
 * order, so the sums, and the result, are those of cb_sinkhorn<4> bit for
 * bit. */
__device__ __forceinline__ float cb_sinkhorn4_lanes(float a, int iters, float eps)
{
    const int l = threadIdx.x & 15, i = l >> 2, j = l & 3;
    float v[4];
#pragma unroll
    for (int k = 0; k < 4; k++) v[k] = __shfl_sync(0xffffffffu, a, 4 * i + k, 16);
    float mx = v[0];
#pragma unroll
    for (int k = 1; k < 4; k++) mx = v[k] > mx ? v[k] : mx;
    const float e = expf(a - mx);
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++) s += __shfl_sync(0xffffffffu, e, 4 * i + k, 16);
    a = e / s + eps;
    for (int it = 0; it < iters; it++) {
        if (it > 0) {
            s = 0.0f;
#pragma unroll
            for (int k = 0; k < 4; k++) s += __shfl_sync(0xffffffffu, a, 4 * i + k, 16);
            a /= s + eps;
        }
        s = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) s += __shfl_sync(0xffffffffu, a, 4 * k + j, 16);
        a /= s + eps;
    }
    return a;
}

/* The job of a block that adopts a site's Sinkhorn (the router's and
 * rmsnorm_rope_qkv's extra block, the standalone kernel): warp w takes
 * tokens 2w and 2w + 1 (a half-warp each), then 2 (w + warps) ..., reading
 * the inputs and storing the matrices in place, cb_sinkhorn4_lanes's bits.
 * After the caller's dependency wait: the inputs are the site's stores. */
__device__ __forceinline__ void ds4_sink_job_run(const ds4_sink_job &j)
{
    const int lane = threadIdx.x & 31, l = lane & 15, nw = (int)blockDim.x >> 5;
    for (int t0 = 2 * ((int)threadIdx.x >> 5); t0 < j.T; t0 += 2 * nw) {
        const int t = t0 + (lane >> 4);
        const float a = t < j.T ? j.comb[(size_t)t * 16 + l] : 0.0f;
        const float c = cb_sinkhorn4_lanes(a, j.iters, j.eps);
        if (t < j.T) j.comb[(size_t)t * 16 + l] = c;
    }
}

struct ds4_hcc_args {
    float *X; /* [T, 4, 4096], updated in place when F is set */
    int T;
    const void *fn; /* [24, 16384] mixing rows (F16, BF16 or F32) */
    ds4_type fn_type;
    float rms_eps, sc0, sc1, sc2, hc_eps;
    const float *bs; /* [24] biases */
    int iters;
    /* the previous sublayer's hc_post, or F == NULL; post_in and comb_in may
     * be the same memory as post and comb (read before they are written) */
    const float *F, *post_in, *comb_in;
    float *y, *post, *comb;
    const float *nw; /* RMSNorm weight [4096] of the sublayer, or NULL (then a is not written) */
    float neps;
    float *a;
    /* DS4_CUDA_HC_SINK_LATE: comb gets this site's Sinkhorn inputs instead
     * of its matrices (a ds4_sink_job's, cuda_ops_hc.cu) */
    int comb_raw;
    /* the sublayer input's Q8_0 blocks (ds4_cuda's q8s; NULL = none, else
     * a is written): values in q8 (a's layout), a scale per 32 in q8d, as
     * the fused Q8_0 products would quantize a */
    int8_t *q8;
    float *q8d;
    /* the same for 9-16 tokens in the tensor-core products' fragment order
     * (ds4_cuda's q8ms; cuda_q8m.cuh qm_frag_at) */
    uint8_t *q8m;
    float *q8md;
};

/* Whether the kernel takes this shape on this device: n_hc 4, D 4096, 24
 * mixing rows of a float type, a GPU with thread-block clusters (sm_90+),
 * and DS4_CUDA_HC_CLUSTER not 0. */
bool ds4_hcc_ok(ds4_cuda *cu, int n_hc, int D, int64_t n_mix, ds4_type fn_type);

/* Launch it (ds4_hcc_ok must hold); false if the launch failed. */
bool ds4_hcc_run(ds4_cuda *cu, const ds4_hcc_args &a);

/* The Sinkhorn of j in a launch of its own on stream (one block); false if
 * the launch failed. */
bool ds4_sink_run(cudaStream_t stream, const ds4_sink_job &j);

/* The GPU has clusters and DS4_CUDA_HC_CLUSTER is not 0. */
bool ds4_hcc_on(ds4_cuda *cu);

/* The rmsnorm op on n_rows rows of 4096 (w F32 or NULL), in the sum order
 * of the site kernel's norm, so that hc_pre then rmsnorm gives the bits of
 * the fused site (ds4_hcc_on must hold); false if a launch failed. */
bool ds4_hcc_rmsnorm(ds4_cuda *cu, const float *x, const float *w, int64_t n_rows, float eps, float *out);

#endif

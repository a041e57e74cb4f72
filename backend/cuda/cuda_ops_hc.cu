/*
 * cuda_ops_hc.cu - CUDA ops for the manifold-constrained hyper-connections:
 * the collapse with its Sinkhorn-normalized mixing matrix, the expand back
 * into the streams, the final head collapse. Math: dsv4-model.md §3.3,
 * §3.8 (comb[i][j]: i = source stream), as backend/cpu/ops_cpu_hc.c.
 *
 * Flash's shape (n_hc 4, D 4096, 24 mixing rows) on sm_90+ takes one
 * kernel per site (cuda_hc_cluster.cu: hc_pre, hc_pre_norm,
 * hc_post_pre_norm). Otherwise the mixing logits are a small matmul (n_mix
 * rows) through the weight kernels, the coefficients and the collapse one
 * fused kernel per token (n_hc 4) or the generic kernels below.
 */
#include "backend/cuda/cuda_backend.cuh"
#include "backend/cuda/cuda_hc_cluster.cuh"
#include "backend/cuda/cuda_q8m.cuh"

#define HC_MAX 16

/* mix[t, :] *= 1 / sqrt(mean(X_t^2) + eps) over the flat n_hc*D row. */
__global__ void cb_hc_rms_scale_kernel(const float *X, int64_t n, float *mix, int n_mix, float eps)
{
    ds4_pdl_enter();
    __shared__ double red[32];
    const float *f = X + (size_t)blockIdx.x * n;
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += (double)f[i] * f[i];
    const float r = (float)(1.0 / sqrt(cb_block_sum_double_serial(ss, red) / (double)n + eps));
    for (int k = threadIdx.x; k < n_mix; k += blockDim.x) mix[(size_t)blockIdx.x * n_mix + k] *= r;
}

/* Sinkhorn of §3.3 on an N x N matrix of logits held by one thread (row =
 * source). N is a template constant for the model's n_hc = 4 so that the
 * matrix lives in registers: 20 serial iterations through global memory
 * took ~80 us per call. */
template <int N>
__device__ __forceinline__ void cb_sinkhorn(float *A, int n, int iters, float eps)
{
    if (N) n = N;
#pragma unroll
    for (int i = 0; i < (N ? N : HC_MAX); i++) {
        if (i >= n) break;
        float *row = A + i * n, mx = row[0], s = 0.0f;
#pragma unroll
        for (int j = 1; j < (N ? N : HC_MAX); j++)
            if (j < n) mx = row[j] > mx ? row[j] : mx;
#pragma unroll
        for (int j = 0; j < (N ? N : HC_MAX); j++)
            if (j < n) s += (row[j] = expf(row[j] - mx));
#pragma unroll
        for (int j = 0; j < (N ? N : HC_MAX); j++)
            if (j < n) row[j] = row[j] / s + eps;
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0) {
#pragma unroll
            for (int i = 0; i < (N ? N : HC_MAX); i++) {
                if (i >= n) break;
                float s = 0.0f;
#pragma unroll
                for (int j = 0; j < (N ? N : HC_MAX); j++)
                    if (j < n) s += A[i * n + j];
#pragma unroll
                for (int j = 0; j < (N ? N : HC_MAX); j++)
                    if (j < n) A[i * n + j] /= s + eps;
            }
        }
#pragma unroll
        for (int j = 0; j < (N ? N : HC_MAX); j++) {
            if (j >= n) break;
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < (N ? N : HC_MAX); i++)
                if (i < n) s += A[i * n + j];
#pragma unroll
            for (int i = 0; i < (N ? N : HC_MAX); i++)
                if (i < n) A[i * n + j] /= s + eps;
        }
    }
}

/* pre (into pre_out [T, n_hc]), post, comb with Sinkhorn: one thread per
 * token, the matrix in a local array (registers when N is known). */
template <int N>
__global__ void cb_hc_coeffs_kernel(const float *mix, int T, int n_hc, float sc0, float sc1, float sc2,
                                    const float *bs, int iters, float eps, float *pre_out, float *post,
                                    float *comb)
{
    ds4_pdl_enter();
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    if (N) n_hc = N;
    const int n_mix = (2 + n_hc) * n_hc;
    const float *m = mix + (size_t)t * n_mix;
    for (int i = 0; i < n_hc; i++) {
        pre_out[(size_t)t * n_hc + i] = cb_sigmoid(m[i] * sc0 + bs[i]) + eps;
        post[(size_t)t * n_hc + i] = 2.0f * cb_sigmoid(m[n_hc + i] * sc1 + bs[n_hc + i]);
    }
    float A[(N ? N : HC_MAX) * (N ? N : HC_MAX)];
#pragma unroll
    for (int k = 0; k < (N ? N * N : HC_MAX * HC_MAX); k++)
        if (k < n_hc * n_hc) A[k] = m[2 * n_hc + k] * sc2 + bs[2 * n_hc + k];
    cb_sinkhorn<N>(A, n_hc, iters, eps);
    float *out = comb + (size_t)t * n_hc * n_hc;
#pragma unroll
    for (int k = 0; k < (N ? N * N : HC_MAX * HC_MAX); k++)
        if (k < n_hc * n_hc) out[k] = A[k];
}

/* The whole hc_pre (or, HEAD, hc_head) after the mixing matvec, for the
 * model's n_hc = 4 (small-kernel v2), one block of 1024 threads per token: the RMS of the
 * flat 4*D row (the old one-block kernel walked 16K floats with 256
 * threads), the coefficients on one warp (the old kernel ran the Sinkhorn
 * in one thread), then the collapse y = sum_i pre_i X_i. Three launches
 * become one; every value is computed by the same expressions as the
 * generic kernels above, only the double RMS sum is ordered differently. */
template <bool HEAD>
__global__ void __launch_bounds__(1024)
    cb_hc_fused4_kernel(const float *X, int D, const float *mix, int n_mix, float rms_eps, float sc0, float sc1,
                        float sc2, const float *bs, int iters, float eps, float *pre_out, float *post, float *comb,
                        float *y)
{
    ds4_pdl_enter();
    __shared__ float s_pre[4];
    const int t = blockIdx.x;
    const int64_t n = 4 * (int64_t)D;
    const float *Xt = X + (size_t)t * n;
    const double ss = cb_block_sumsq(Xt, n);
    if (threadIdx.x < 32) {
        const float r = (float)(1.0 / sqrt(ss / (double)n + rms_eps));
        const float *m = mix + (size_t)t * n_mix;
        const int l = threadIdx.x & 15;
        if (l < 4) {
            const float mi = m[l] * r;
            const float p = cb_sigmoid(mi * sc0 + bs[l]) + eps;
            if (threadIdx.x < 4) {
                s_pre[l] = p;
                pre_out[(size_t)t * 4 + l] = p;
            }
        }
        if (!HEAD) {
            if (threadIdx.x < 4) {
                const float mp = m[4 + l] * r;
                post[(size_t)t * 4 + l] = 2.0f * cb_sigmoid(mp * sc1 + bs[4 + l]);
            }
            const float mc = m[8 + l] * r;
            const float a = cb_sinkhorn4_lanes(mc * sc2 + bs[8 + l], iters, eps);
            if (threadIdx.x < 16) comb[(size_t)t * 16 + l] = a;
        }
    }
    __syncthreads();
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float s = 0.0f;
        for (int k = 0; k < 4; k++) s += s_pre[k] * Xt[(size_t)k * D + d];
        y[(size_t)t * D + d] = s;
    }
}

/* cb_hc_fused4_kernel's numbers (the same per-thread values and sums, the
 * same expressions) for a flat row of VPT * 1024 values: the row is loaded
 * once into registers (thread t holds values t + 1024 m, which are also
 * the X[k][d] its collapse needs: m = 4 k + d / 1024), the base before the
 * wait on the previous kernel (a constant), and warp 0 runs the Sinkhorn
 * after the collapse, so the other warps do not wait for it. COEF false:
 * no post and Sinkhorn here; the token's r goes to r_out for
 * cb_hc_coeffs4_kernel. */
template <bool HEAD, int VPT, bool NORM, bool COEF = true>
__global__ void __launch_bounds__(1024)
    cb_hc_fused4_reg_kernel(const float *X, int D, const float *mix, int n_mix, float rms_eps, float sc0, float sc1,
                            float sc2, const float *bs, int iters, float eps, float *pre_out, float *post,
                            float *comb, float *y, const float *nw, float neps, float *a, float *r_out)
{
    enum { NT = 1024 };
    __shared__ float s_pre[4];
    const int tid = threadIdx.x, l = tid & 15;
    float nwv[VPT / 4];
    if (NORM)
#pragma unroll
        for (int j = 0; j < VPT / 4; j++) nwv[j] = __ldg(nw + tid + j * NT);
    float bsv[3];
    bsv[0] = tid < 32 && l < 4 ? __ldg(bs + l) : 0.0f;
    bsv[1] = !HEAD && tid < 4 ? __ldg(bs + 4 + l) : 0.0f;
    bsv[2] = !HEAD && tid < 32 ? __ldg(bs + 8 + l) : 0.0f;
    ds4_pdl_enter();
    const int t = blockIdx.x;
    const int64_t n = 4 * (int64_t)D;
    const float *Xt = X + (size_t)t * n;
    float xv[VPT];
#pragma unroll
    for (int m = 0; m < VPT; m++) xv[m] = Xt[tid + (size_t)m * NT];
    double ss = 0.0;
#pragma unroll
    for (int m = 0; m < VPT; m++) ss += (double)xv[m] * xv[m];
    ss = cb_block_sum_double(ss);
    float r = 0.0f;
    const float *mr = mix + (size_t)t * n_mix;
    if (tid < 32) {
        r = (float)(1.0 / sqrt(ss / (double)n + rms_eps));
        if (!COEF && tid == 0) r_out[t] = r;
        if (l < 4) {
            const float mi = mr[l] * r;
            const float p = cb_sigmoid(mi * sc0 + bsv[0]) + eps;
            if (tid < 4) {
                s_pre[l] = p;
                pre_out[(size_t)t * 4 + l] = p;
            }
        }
    }
    __syncthreads();
    /* value m = 4 k + j of this thread is X[k][tid + 1024 j] */
    float yv[VPT / 4];
#pragma unroll
    for (int j = 0; j < VPT / 4; j++) {
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) sum += s_pre[k] * xv[(VPT / 4) * k + j];
        yv[j] = sum;
        y[(size_t)t * D + tid + (size_t)j * NT] = sum;
    }
    if (NORM) { /* rmsnorm of y: cb_rmsnorm_reg_kernel's values and sums (1024 threads, the same thread per value) */
        double sy = 0.0;
#pragma unroll
        for (int j = 0; j < VPT / 4; j++) sy += (double)yv[j] * yv[j];
        const float rs = (float)(1.0 / sqrt(cb_block_sum_double(sy) / D + neps));
#pragma unroll
        for (int j = 0; j < VPT / 4; j++) a[(size_t)t * D + tid + (size_t)j * NT] = (yv[j] * rs) * nwv[j];
    }
    if (COEF && !HEAD && tid < 32) { /* warp 0: post and the Sinkhorn, after its own few outputs */
        if (tid < 4) {
            const float mp = mr[4 + l] * r;
            post[(size_t)t * 4 + l] = 2.0f * cb_sigmoid(mp * sc1 + bsv[1]);
        }
        const float mc = mr[8 + l] * r;
        const float a = cb_sinkhorn4_lanes(mc * sc2 + bsv[2], iters, eps);
        if (tid < 16) comb[(size_t)t * 16 + l] = a;
    }
}

/* cb_block_sum_double's total for a 1024-thread block, taken by a
 * 512-thread one whose thread r holds the sums s[0], s[1] of threads r and
 * r + 512 (warps w and w + 16): the same warp trees, the warps' sums in
 * the same slots of red, the same last tree. The total on warp 0 (0.0
 * elsewhere); one barrier. */
__device__ __forceinline__ double cb_half_block_sum(double (&s)[2], double *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int v = 0; v < 2; v++) {
        for (int off = 16; off > 0; off >>= 1) s[v] += __shfl_xor_sync(0xffffffffu, s[v], off);
        if (lane == 0) red[warp + 16 * v] = s[v];
    }
    __syncthreads();
    double tot = 0.0;
    if (threadIdx.x < 32) {
        tot = red[lane];
        for (int off = 16; off > 0; off >>= 1) tot += __shfl_xor_sync(0xffffffffu, tot, off);
    }
    return tot;
}

/* cb_hc_fused4_reg_kernel<false, 16, NORM, false> (D = 4096) on 512
 * threads, two blocks an SM: thread r stands for that kernel's threads r
 * and r + 512 (its warps w and w + 16), holds both their values and keeps
 * their sums apart; each warp sum goes to its slot of the same 32, which
 * one warp adds in the same tree, so every value and sum is that kernel's.
 * Why: at 47 registers that kernel holds one 1024-thread block an SM, so
 * an SM's tokens of a prefill chunk wait for each other's load, barriers
 * and norm in turn (77 us a 2048-token site, ncu); two blocks overlap (52 us). */
template <bool NORM>
__global__ void __launch_bounds__(512, 2)
    cb_hc_fused4_half_kernel(const float *X, const float *mix, int n_mix, float rms_eps, float sc0, const float *bs,
                             float eps, float *pre_out, float *y, const float *nw, float neps, float *a, float *r_out)
{
    enum { NT = 512, D = 4096, VT = 1024 };
    __shared__ float s_pre[4];
    __shared__ double red[32];
    const int tid = threadIdx.x, l = tid & 15;
    const float b0 = tid < 32 && l < 4 ? __ldg(bs + l) : 0.0f;
    ds4_pdl_enter();
    const int t = blockIdx.x;
    const float *Xt = X + (size_t)t * 4 * D;
    float xv[2][16];
#pragma unroll
    for (int v = 0; v < 2; v++)
#pragma unroll
        for (int m = 0; m < 16; m++) xv[v][m] = Xt[tid + NT * v + (size_t)m * VT];
    double ss[2] = {0.0, 0.0};
#pragma unroll
    for (int v = 0; v < 2; v++)
#pragma unroll
        for (int m = 0; m < 16; m++) ss[v] += (double)xv[v][m] * xv[v][m];
    const double tot = cb_half_block_sum(ss, red);
    if (tid < 32) {
        const float r = (float)(1.0 / sqrt(tot / (double)(4 * D) + rms_eps));
        if (tid == 0) r_out[t] = r;
        if (l < 4) {
            const float mi = mix[(size_t)t * n_mix + l] * r;
            const float p = cb_sigmoid(mi * sc0 + b0) + eps;
            if (tid < 4) {
                s_pre[l] = p;
                pre_out[(size_t)t * 4 + l] = p;
            }
        }
    }
    __syncthreads();
    /* value m = 4 k + j of virtual thread u is X[k][u + 1024 j] */
    float yv[2][4];
#pragma unroll
    for (int v = 0; v < 2; v++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float sum = 0.0f;
#pragma unroll
            for (int k = 0; k < 4; k++) sum += s_pre[k] * xv[v][4 * k + j];
            yv[v][j] = sum;
            y[(size_t)t * D + tid + NT * v + (size_t)j * VT] = sum;
        }
    if (NORM) {
        double sy[2] = {0.0, 0.0};
#pragma unroll
        for (int v = 0; v < 2; v++)
#pragma unroll
            for (int j = 0; j < 4; j++) sy[v] += (double)yv[v][j] * yv[v][j];
        __syncthreads(); /* red's first sums are read */
        const double toty = cb_half_block_sum(sy, red);
        if (tid == 0) red[0] = toty;
        __syncthreads();
        const float rs = (float)(1.0 / sqrt(red[0] / D + neps));
#pragma unroll
        for (int v = 0; v < 2; v++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int d = tid + NT * v + j * VT;
                a[(size_t)t * D + d] = (yv[v][j] * rs) * __ldg(nw + d);
            }
    }
}

/* post and comb of cb_hc_fused4_reg_kernel's warp 0 (the same expressions
 * on the same r), a warp per token. Why: in that kernel the Sinkhorn's ~20
 * dependent shuffle rounds run after the collapse and hold the token's
 * 1024-thread block, one an SM, until they end: at a prefill chunk's 2048
 * tokens ~15 tokens an SM wait for them in turn (116 us a site, 8-layer
 * prefill at an 8K frontier, ncu). Here all tokens' rounds overlap. */
__global__ void cb_hc_coeffs4_kernel(const float *mix, int n_mix, const float *r_in, int T, float sc1, float sc2,
                                     const float *bs, int iters, float eps, float *post, float *comb)
{
    ds4_pdl_enter();
    const int t = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31, l = lane & 15;
    if (t >= T) return; /* whole warps: T is the same for a warp's lanes */
    const float r = r_in[t];
    const float *mr = mix + (size_t)t * n_mix;
    if (lane < 4) {
        const float mp = mr[4 + l] * r;
        post[(size_t)t * 4 + l] = 2.0f * cb_sigmoid(mp * sc1 + __ldg(bs + 4 + l));
    }
    const float mc = mr[8 + l] * r;
    const float a = cb_sinkhorn4_lanes(mc * sc2 + __ldg(bs + 8 + l), iters, eps);
    if (lane < 16) comb[(size_t)t * 16 + l] = a;
}

/* head: pre only */
__global__ void cb_hc_head_coeffs_kernel(const float *mix, int T, int n_hc, float sc0, const float *bs,
                                         float eps, float *pre_out)
{
    ds4_pdl_enter();
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    for (int i = 0; i < n_hc; i++)
        pre_out[(size_t)t * n_hc + i] = cb_sigmoid(mix[(size_t)t * n_hc + i] * sc0 + bs[i]) + eps;
}

/* y[t, d] = sum_i pre[t, i] X[t, i, d] */
__global__ void cb_hc_collapse_kernel(const float *X, int T, int n_hc, int D, const float *pre, float *y)
{
    ds4_pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)T * D) return;
    const int64_t t = i / D, d = i % D;
    const float *Xt = X + (size_t)t * n_hc * D;
    float s = 0.0f;
    for (int k = 0; k < n_hc; k++) s += pre[t * n_hc + k] * Xt[(size_t)k * D + d];
    y[i] = s;
}

/* X'[j] = post[j] F + sum_i comb[i][j] X[i], in place */
__global__ void cb_hc_post_kernel(float *X, int T, int n_hc, int D, const float *F, const float *post,
                                  const float *comb)
{
    ds4_pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)T * D) return;
    const int64_t t = i / D, d = i % D;
    float *Xt = X + (size_t)t * n_hc * D;
    const float *A = comb + (size_t)t * n_hc * n_hc, *p = post + (size_t)t * n_hc;
    float old[HC_MAX];
    for (int k = 0; k < n_hc; k++) old[k] = Xt[(size_t)k * D + d];
    for (int j = 0; j < n_hc; j++) Xt[(size_t)j * D + d] = ds4_hc_post_value(p[j], F[(size_t)t * D + d], A, old, j, n_hc);
}

/* cb_hc_post_kernel for n_hc = 4 (Flash): a thread per token and four
 * adjacent columns, grid (column blocks, tokens), so a thread's comb and
 * post are one token's (five 16-byte loads the block shares) and X, F move
 * in 16-byte pieces with no 64-bit division per value. Each value is
 * ds4_hc_post_value's, so the bits are the generic kernel's. The generic
 * kernel ran a 2048-token site at ~2.2 TB/s (133 us, 8-layer prefill at an
 * 8K frontier, ncu). */
__global__ void __launch_bounds__(256) cb_hc_post4_kernel(float4 *X, int D4, const float4 *F, const float4 *post,
                                                          const float4 *comb)
{
    ds4_pdl_enter();
    const int d = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (d >= D4) return;
    const int64_t t = blockIdx.y;
    float A[16];
    const float4 *ct = comb + 4 * t;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float4 c = __ldg(ct + i);
        A[4 * i] = c.x, A[4 * i + 1] = c.y, A[4 * i + 2] = c.z, A[4 * i + 3] = c.w;
    }
    const float4 p = __ldg(post + t), f = F[t * D4 + d];
    float4 *Xt = X + t * 4 * D4 + d;
    float4 o[4];
#pragma unroll
    for (int k = 0; k < 4; k++) o[k] = Xt[(int64_t)k * D4];
    const float pv[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float old[4] = {o[0].x, o[1].x, o[2].x, o[3].x};
        float4 r;
        r.x = ds4_hc_post_value(pv[j], f.x, A, old, j, 4);
        old[0] = o[0].y, old[1] = o[1].y, old[2] = o[2].y, old[3] = o[3].y;
        r.y = ds4_hc_post_value(pv[j], f.y, A, old, j, 4);
        old[0] = o[0].z, old[1] = o[1].z, old[2] = o[2].z, old[3] = o[3].z;
        r.z = ds4_hc_post_value(pv[j], f.z, A, old, j, 4);
        old[0] = o[0].w, old[1] = o[1].w, old[2] = o[2].w, old[3] = o[3].w;
        r.w = ds4_hc_post_value(pv[j], f.w, A, old, j, 4);
        Xt[(int64_t)j * D4] = r;
    }
}

/* The 16-byte form takes n_hc = 4, D a multiple of 4, 16-byte aligned
 * rows, and T within a grid's y; DS4_CUDA_HC_POST4=0 keeps the generic
 * kernel (A/B). */
static bool hc_post4_ok(int T, int n_hc, int D, const float *X, const float *F, const float *post, const float *comb)
{
    static int on = -1;
    return n_hc == 4 && D % 4 == 0 && T >= 1 && T <= 65535 && ((uintptr_t)X | (uintptr_t)F | (uintptr_t)post | (uintptr_t)comb) % 16 == 0 &&
           ds4_env_switch_on("DS4_CUDA_HC_POST4", &on);
}

/* mix = fn . flat X (unscaled), into scratch 1, with room for pre after it. */
static float *hc_mix(ds4_backend *be, const float *X, int T, int n_hc, int D, const ds4_weight *fn)
{
    const int64_t n = (int64_t)n_hc * D, n_mix = fn->ne[1];
    float *mix = (float *)cb_scratch(be, 1, (size_t)T * (size_t)n_mix * sizeof(float) + (size_t)T * HC_MAX * 4);
    if (!mix) return NULL;
    cb_matmul_raw(be, fn->type, cb_weight(be, fn), n_mix, n, X, n, T, mix, n_mix);
    return mix;
}

/* Generic n_hc: mix *= 1 / rms(flat X), in place. */
static void hc_rms_scale(ds4_backend *be, const float *X, int T, int n_hc, int D, float *mix, int64_t n_mix,
                         float rms_eps)
{
    ds4_launch(cb_hc_rms_scale_kernel, T, 256, 0, cb_stream(be), X, (int64_t)n_hc * D, mix, (int)n_mix, rms_eps);
}

/* From this many tokens (a prefill chunk) the fused kernel leaves post and
 * the Sinkhorn to cb_hc_coeffs4_kernel (same bits); DS4_CUDA_HC_COEF=0
 * keeps them in the fused kernel (A/B). */
static bool hc_coef_split(int T)
{
    static int on = -1;
    return T >= 64 && ds4_env_switch_on("DS4_CUDA_HC_COEF", &on);
}

/* The prefill site's collapse (and norm) on cb_hc_fused4_half_kernel;
 * DS4_CUDA_HC_HALF=0 keeps the 1024-thread kernel (A/B). Same bits. */
static bool hc_half_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_HC_HALF", &on);
}

/* Post and comb of T tokens from the mixing rows and the r the fused kernel
 * wrote (r_buf), a warp per token. */
static void hc_coeffs4(ds4_backend *be, const float *mix, int n_mix, const float *r_buf, int T, const float *sc,
                       const float *bs, int iters, float hc_eps, float *post, float *comb)
{
    ds4_launch(cb_hc_coeffs4_kernel, (unsigned)((T + 7) / 8), 256, 0, cb_stream(be), mix, n_mix, r_buf, T, sc[1], sc[2],
               bs, iters, hc_eps, post, comb);
}

/* The register form of the fused kernel: the flat row (4 D) is exactly
 * 16 values per thread of 1024, as for Flash (D = 4096).
 * DS4_CUDA_HC_REG=0 keeps the looping kernel, for A/B runs. */
static bool hc_reg_ok(int D)
{
    static int on = -1;
    return D == 4096 && ds4_env_switch_on("DS4_CUDA_HC_REG", &on);
}

static int hc_args_ok(ds4_backend *be, int n_hc, const ds4_weight *scale, int n_scale)
{
    if (n_hc < 1 || n_hc > HC_MAX || scale->type != DS4_TYPE_F32 || scale->ne[0] < n_scale) {
        cb_fail_status(be, ds4_fail(DS4_ERR_UNSUPPORTED, "cuda hc: n_hc %d (max %d) or scale not F32[%d]",
                                    n_hc, HC_MAX, n_scale), "hc");
        return 0;
    }
    return 1;
}

/* A cluster of 8 blocks a token is a decode-step design: at a prefill
 * chunk's 2048 tokens every cluster re-reads the 0.8 MB of mixing rows and
 * walks its barrier chain per token (~1.2 ms a site, 8-layer model, ncu).
 * From this many tokens (where the mixing product takes the tall kernel,
 * cuda_fmv_tall.cu, the input read once) the site runs as its separate
 * kernels; DS4_CUDA_HCC_PREFILL=1 keeps the cluster for every T. */
#define HC_CLUSTER_MAX_T 64
static bool hc_cluster_prefill_on(void)
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("DS4_CUDA_HCC_PREFILL");
        on = e && !strcmp(e, "1");
    }
    return on == 1;
}

/* A one-token site stores its Sinkhorn's inputs instead of running it at
 * its end, where a site's column threads waited ~2-3 us for it
 * (twenty-fifth session's phase times); comb is read only by the next
 * site's hc_post, a sublayer later. The next kernel that can (the router,
 * rmsnorm_rope_qkv) runs it in an extra block beside its own work; a
 * site or hc_post that reads comb before that (or a host copy, a free)
 * runs it first in a launch of its own.
 * Same bits: the same function of the same inputs. Full size, 2K: 150.4 ->
 * 154.7 tokens/s (twenty-sixth session). DS4_CUDA_HC_SINK_LATE=0: at the
 * site's end (A/B); read once. */
static bool hc_sink_late_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_HC_SINK_LATE", &on);
}

ds4_sink_job cb_sink_take(ds4_backend *be)
{
    cuda_backend *c = cb_of(be);
    const ds4_sink_job none = {};
    if (!c->sink.comb || cb_side_current(c)) return none; /* on the side stream no later site waits for it */
    const ds4_sink_job j = c->sink;
    c->sink = none;
    return j;
}

void cb_sink_flush(ds4_backend *be, const float *comb)
{
    cuda_backend *c = cb_of(be);
    if (!c->sink.comb || (comb && comb != c->sink.comb)) return;
    const ds4_sink_job j = c->sink;
    c->sink = ds4_sink_job{};
    cb_graph_note(be, 64, j.comb, j.T, j.iters, j.eps);
    if (cb_graph_dry(be)) return;
    if (!ds4_sink_run(cb_stream(be), j))
        cb_fail_status(be, ds4_fail(DS4_ERR_BACKEND, "cuda hc sinkhorn: launch failed: %s",
                                    cudaGetErrorString(cudaGetLastError())), "hc_sinkhorn");
}

/* comb is about to be written with matrices: a pending Sinkhorn of it is void. */
static void hc_sink_overwritten(ds4_backend *be, const float *comb)
{
    cuda_backend *c = cb_of(be);
    if (c->sink.comb && c->sink.comb == comb) c->sink = ds4_sink_job{};
}

/* The one-kernel site of cuda_hc_cluster.cu, when it takes the shape: the
 * previous sublayer's hc_post first when F is set, the sublayer's norm into
 * a when norm is set. False: not taken (the caller runs the other kernels). */
static bool hc_cluster_site(ds4_backend *be, float *X, int T, int n_hc, int D, const ds4_weight *fn,
                            const ds4_weight *scale, const ds4_weight *base, int iters, float rms_eps, float hc_eps,
                            const float *F, const float *post_in, const float *comb_in, float *y, float *post,
                            float *comb, const ds4_weight *norm, float norm_eps, float *a, const char *name)
{
    /* X: written only when F is set (the fused hc_post); hc_pre passes its
     * const input through this one signature */
    cuda_backend *c = cb_of(be);
    if (T > 65535 || !ds4_hcc_ok(c->cu, n_hc, D, fn->ne[1], fn->type)) return false; /* a token per grid row */
    if (T >= HC_CLUSTER_MAX_T && !hc_cluster_prefill_on()) return false;
    if (norm && !(norm->type == DS4_TYPE_F32 && norm->ne[0] == D)) return false;
    if (scale->type != DS4_TYPE_F32 || scale->ne[0] < 3) return false;
    const void *w = cb_weight(be, fn);
    if (!w || (uintptr_t)w % 16 != 0) return false;
    const float *sc = (const float *)scale->data;
    ds4_hcc_args A = {};
    A.X = X;
    A.T = T;
    A.fn = w;
    A.fn_type = fn->type;
    A.rms_eps = rms_eps;
    A.sc0 = sc[0], A.sc1 = sc[1], A.sc2 = sc[2];
    A.hc_eps = hc_eps;
    A.bs = (const float *)cb_weight(be, base);
    A.iters = iters;
    A.F = F, A.post_in = post_in, A.comb_in = comb_in;
    A.y = y, A.post = post, A.comb = comb;
    A.nw = norm ? (const float *)cb_weight(be, norm) : NULL;
    A.neps = norm_eps;
    A.a = a;
    if (!A.bs || (norm && !A.nw)) return true; /* cb_weight recorded the failure */
    /* the Sinkhorns (hc_sink_late_on): comb_in's, if still pending, runs
     * first in a launch of its own (the adopting kernels take it in a
     * decode step); this site's is left pending (an older one for other
     * memory run first) */
    if (F) cb_sink_flush(be, comb_in);
    hc_sink_overwritten(be, comb);
    A.comb_raw = T == 1 && hc_sink_late_on() && !cb_side_current(c);
    if (A.comb_raw) {
        cb_sink_flush(be, NULL);
        c->sink = ds4_sink_job{comb, T, iters, hc_eps};
    }
    /* the sublayer input announced by ops.h sublayer_input: its Q8_0 blocks
     * for the sublayer's products (ds4_cuda's q8s) */
    ds4_q8_handoff *q8s = &c->cu->q8s;
    if (a && A.nw && T == 1 && q8s->asked == a && ds4_q8_handoff_reserve(c->cu, q8s, D)) {
        A.q8 = q8s->q;
        A.q8d = q8s->d;
    }
    q8s->asked = NULL;
    /* for 9-16 tokens, in the tensor-core products' order (ds4_cuda's q8ms) */
    ds4_q8_handoff *q8ms = &c->cu->q8ms;
    if (a && A.nw && T >= 9 && T <= QM_TOK && q8ms->asked == a && ds4_q8_handoff_reserve(c->cu, q8ms, QM_TOK * D)) {
        A.q8m = (uint8_t *)q8ms->q;
        A.q8md = q8ms->d;
    }
    q8ms->asked = NULL;
    cb_graph_note(be, 14, X, T, w, sc[0], sc[1], sc[2], A.bs, iters, hc_eps, rms_eps, F, post_in, comb_in, y, post, comb,
                  A.nw, norm_eps, a, A.comb_raw, A.q8, A.q8d);
    if (A.q8) { /* offered until the sublayer ends */
        q8s->y = a;
        q8s->n = D;
    }
    if (A.q8m) {
        q8ms->y = a;
        q8ms->n = D;
        q8ms->nt = T;
    }
    if (cb_graph_dry(be)) return true;
    if (!ds4_hcc_run(c->cu, A)) cb_fail_status(be, ds4_fail(DS4_ERR_BACKEND, "cuda %s: cluster launch failed: %s", name,
                                                            cudaGetErrorString(cudaGetLastError())), name);
    cb_check_launch(be, name);
    return true;
}

static void op_hc_pre(ds4_backend *be, const float *X, int T, int n_hc, int D, const ds4_weight *fn,
                      const ds4_weight *scale, const ds4_weight *base, int iters, float rms_eps,
                      float hc_eps, float *y, float *post, float *comb)
{
    cb_prof_scope prof_(be, "hc_pre");
    if (!hc_args_ok(be, n_hc, scale, 3)) return;
    if (hc_cluster_site(be, (float *)X, T, n_hc, D, fn, scale, base, iters, rms_eps, hc_eps, NULL, NULL, NULL, y, post,
                        comb, NULL, 0.0f, NULL, "hc_pre"))
        return;
    hc_sink_overwritten(be, comb);
    const float *sc = (const float *)scale->data; /* three host scalars, passed by value */
    const float *bs = (const float *)cb_weight(be, base);
    float *mix = hc_mix(be, X, T, n_hc, D, fn);
    if (!mix || !bs) return;
    float *pre = mix + (size_t)T * fn->ne[1];
    CB_GRAPH_SKIP(be, 6, X, T, n_hc, D, sc[0], sc[1], sc[2], bs, iters, hc_eps, rms_eps, y, post, comb);
    if (n_hc == 4 && fn->ne[1] >= 24) { /* the model's case: one fused kernel per token */
        if (hc_reg_ok(D) && hc_coef_split(T)) {
            float *r_buf = pre + (size_t)4 * T; /* the pre region holds HC_MAX floats a token */
            if (hc_half_on())
                ds4_launch(cb_hc_fused4_half_kernel<false>, T, 512, 0, cb_stream(be), X, mix, (int)fn->ne[1], rms_eps,
                           sc[0], bs, hc_eps, pre, y, (const float *)nullptr, 0.0f, (float *)nullptr, r_buf);
            else
                ds4_launch(cb_hc_fused4_reg_kernel<false, 16, false, false>, T, 1024, 0, cb_stream(be), X, D, mix,
                           (int)fn->ne[1], rms_eps, sc[0], sc[1], sc[2], bs, iters, hc_eps, pre, post, comb, y,
                           (const float *)nullptr, 0.0f, (float *)nullptr, r_buf);
            hc_coeffs4(be, mix, (int)fn->ne[1], r_buf, T, sc, bs, iters, hc_eps, post, comb);
        } else if (hc_reg_ok(D))
            ds4_launch(cb_hc_fused4_reg_kernel<false, 16, false>, T, 1024, 0, cb_stream(be), X, D, mix,
                       (int)fn->ne[1], rms_eps, sc[0], sc[1], sc[2], bs, iters, hc_eps, pre, post, comb, y,
                       (const float *)nullptr, 0.0f, (float *)nullptr, (float *)nullptr);
        else
            ds4_launch(cb_hc_fused4_kernel<false>, T, 1024, 0, cb_stream(be), X, D, mix, (int)fn->ne[1], rms_eps,
                       sc[0], sc[1], sc[2], bs, iters, hc_eps, pre, post, comb, y);
        cb_check_launch(be, "hc_pre");
        return;
    }
    hc_rms_scale(be, X, T, n_hc, D, mix, fn->ne[1], rms_eps);
    if (n_hc == 4)
        ds4_launch(cb_hc_coeffs_kernel<4>, cb_blocks(T, 64), 64, 0, cb_stream(be), mix, T, n_hc, sc[0], sc[1], sc[2], bs,
                                                                           iters, hc_eps, pre, post, comb);
    else
        ds4_launch(cb_hc_coeffs_kernel<0>, cb_blocks(T, 64), 64, 0, cb_stream(be), mix, T, n_hc, sc[0], sc[1], sc[2], bs,
                                                                           iters, hc_eps, pre, post, comb);
    ds4_launch(cb_hc_collapse_kernel, cb_blocks((int64_t)T * D, 256), 256, 0, cb_stream(be), X, T, n_hc, D, pre, y);
    cb_check_launch(be, "hc_pre");
}

/* hc_pre then rmsnorm(y) into a in one kernel where the register kernel
 * takes the shape (Flash: D = 4096, n_hc = 4; the norm an F32 weight),
 * else the two ops. */
static void op_hc_pre_norm(ds4_backend *be, const float *X, int T, int n_hc, int D, const ds4_weight *fn,
                           const ds4_weight *scale, const ds4_weight *base, int iters, float rms_eps, float hc_eps,
                           float *y, float *post, float *comb, const ds4_weight *norm, float norm_eps, float *a)
{
    if (!(n_hc == 4 && fn->ne[1] >= 24 && hc_reg_ok(D) && norm && norm->type == DS4_TYPE_F32 && norm->ne[0] == D)) {
        op_hc_pre(be, X, T, n_hc, D, fn, scale, base, iters, rms_eps, hc_eps, y, post, comb);
        be->rmsnorm(be, y, norm, T, D, norm_eps, a);
        return;
    }
    cb_prof_scope prof_(be, "hc_pre_norm");
    if (!hc_args_ok(be, n_hc, scale, 3)) return;
    if (hc_cluster_site(be, (float *)X, T, n_hc, D, fn, scale, base, iters, rms_eps, hc_eps, NULL, NULL, NULL, y, post,
                        comb, norm, norm_eps, a, "hc_pre_norm"))
        return;
    hc_sink_overwritten(be, comb);
    const float *sc = (const float *)scale->data;
    const float *bs = (const float *)cb_weight(be, base);
    const float *nw = (const float *)cb_weight(be, norm);
    float *mix = hc_mix(be, X, T, n_hc, D, fn);
    if (!mix || !bs || !nw) return;
    float *pre = mix + (size_t)T * fn->ne[1];
    CB_GRAPH_SKIP(be, 11, X, T, D, sc[0], sc[1], sc[2], bs, iters, hc_eps, rms_eps, y, post, comb, nw, norm_eps, a);
    if (hc_coef_split(T)) {
        float *r_buf = pre + (size_t)4 * T; /* the pre region holds HC_MAX floats a token */
        if (hc_half_on())
            ds4_launch(cb_hc_fused4_half_kernel<true>, T, 512, 0, cb_stream(be), X, mix, (int)fn->ne[1], rms_eps, sc[0],
                       bs, hc_eps, pre, y, nw, norm_eps, a, r_buf);
        else
            ds4_launch(cb_hc_fused4_reg_kernel<false, 16, true, false>, T, 1024, 0, cb_stream(be), X, D, mix,
                       (int)fn->ne[1], rms_eps, sc[0], sc[1], sc[2], bs, iters, hc_eps, pre, post, comb, y, nw,
                       norm_eps, a, r_buf);
        hc_coeffs4(be, mix, (int)fn->ne[1], r_buf, T, sc, bs, iters, hc_eps, post, comb);
    } else
        ds4_launch(cb_hc_fused4_reg_kernel<false, 16, true>, T, 1024, 0, cb_stream(be), X, D, mix, (int)fn->ne[1],
                   rms_eps, sc[0], sc[1], sc[2], bs, iters, hc_eps, pre, post, comb, y, nw, norm_eps, a, (float *)nullptr);
    cb_check_launch(be, "hc_pre_norm");
}

static void op_hc_post(ds4_backend *be, float *X, int T, int n_hc, int D, const float *F, const float *post,
                       const float *comb);

/* hc_post of the sublayer before, then hc_pre_norm: one kernel where the
 * cluster site takes the shape, else the two ops. */
static void op_hc_post_pre_norm(ds4_backend *be, float *X, int T, int n_hc, int D, const float *F, const float *post_in,
                                const float *comb_in, const ds4_weight *fn, const ds4_weight *scale,
                                const ds4_weight *base, int iters, float rms_eps, float hc_eps, float *y, float *post,
                                float *comb, const ds4_weight *norm, float norm_eps, float *a)
{
    {
        cb_prof_scope prof_(be, "hc_post_pre_norm");
        if (hc_args_ok(be, n_hc, scale, 3) &&
            hc_cluster_site(be, X, T, n_hc, D, fn, scale, base, iters, rms_eps, hc_eps, F, post_in, comb_in, y, post,
                            comb, norm, norm_eps, a, "hc_post_pre_norm"))
            return;
    }
    op_hc_post(be, X, T, n_hc, D, F, post_in, comb_in);
    op_hc_pre_norm(be, X, T, n_hc, D, fn, scale, base, iters, rms_eps, hc_eps, y, post, comb, norm, norm_eps, a);
}

/* ops.h sublayer_input: x, the input the next site writes (ds4_cuda's
 * q8s): one token's cluster site then stores its Q8_0 blocks, and the
 * fused Q8_0 products that read x take them until x is released (NULL) */
static void op_sublayer_input(ds4_backend *be, const float *x, int T)
{
    ds4_q8_handoff *q8s = &cb_of(be)->cu->q8s, *q8ms = &cb_of(be)->cu->q8ms;
    q8s->asked = x && T == 1 && ds4_q8_handoff_s_on() ? x : NULL;
    q8s->y = NULL;
    q8ms->asked = x && T >= 9 && T <= QM_TOK && ds4_q8m_site_on() ? x : NULL;
    q8ms->y = NULL;
}

static void op_hc_post(ds4_backend *be, float *X, int T, int n_hc, int D, const float *F, const float *post,
                       const float *comb)
{
    cb_prof_scope prof_(be, "hc_post");
    if (n_hc < 1 || n_hc > HC_MAX) return;
    cb_sink_flush(be, comb);
    CB_GRAPH_SKIP(be, 7, X, T, n_hc, D, F, post, comb);
    if (hc_post4_ok(T, n_hc, D, X, F, post, comb)) {
        const int D4 = D / 4;
        ds4_launch(cb_hc_post4_kernel, dim3((unsigned)((D4 + 255) / 256), (unsigned)T), 256, 0, cb_stream(be),
                   (float4 *)X, D4, (const float4 *)F, (const float4 *)post, (const float4 *)comb);
        cb_check_launch(be, "hc_post");
        return;
    }
    ds4_launch(cb_hc_post_kernel, cb_blocks((int64_t)T * D, 256), 256, 0, cb_stream(be), X, T, n_hc, D, F, post, comb);
    cb_check_launch(be, "hc_post");
}

static void op_hc_head(ds4_backend *be, const float *X, int T, int n_hc, int D, const ds4_weight *fn,
                       const ds4_weight *scale, const ds4_weight *base, float rms_eps, float hc_eps, float *y)
{
    cb_prof_scope prof_(be, "hc_head");
    if (!hc_args_ok(be, n_hc, scale, 1)) return;
    const float *sc = (const float *)scale->data;
    const float *bs = (const float *)cb_weight(be, base);
    float *mix = hc_mix(be, X, T, n_hc, D, fn);
    if (!mix || !bs) return;
    float *pre = mix + (size_t)T * fn->ne[1];
    CB_GRAPH_SKIP(be, 8, X, T, n_hc, D, sc[0], bs, hc_eps, rms_eps, y);
    if (n_hc == 4 && fn->ne[1] >= 4) {
        if (hc_reg_ok(D))
            ds4_launch(cb_hc_fused4_reg_kernel<true, 16, false>, T, 1024, 0, cb_stream(be), X, D, mix,
                       (int)fn->ne[1], rms_eps, sc[0], 0.f, 0.f, bs, 0, hc_eps, pre, (float *)nullptr,
                       (float *)nullptr, y, (const float *)nullptr, 0.0f, (float *)nullptr, (float *)nullptr);
        else
            ds4_launch(cb_hc_fused4_kernel<true>, T, 1024, 0, cb_stream(be), X, D, mix, (int)fn->ne[1], rms_eps,
                       sc[0], 0.f, 0.f, bs, 0, hc_eps, pre, nullptr, nullptr, y);
        cb_check_launch(be, "hc_head");
        return;
    }
    hc_rms_scale(be, X, T, n_hc, D, mix, fn->ne[1], rms_eps);
    ds4_launch(cb_hc_head_coeffs_kernel, cb_blocks(T, 64), 64, 0, cb_stream(be), mix, T, n_hc, sc[0], bs, hc_eps, pre);
    ds4_launch(cb_hc_collapse_kernel, cb_blocks((int64_t)T * D, 256), 256, 0, cb_stream(be), X, T, n_hc, D, pre, y);
    cb_check_launch(be, "hc_head");
}

void cb_install_hc(ds4_backend *be)
{
    be->hc_pre = op_hc_pre;
    be->hc_post = op_hc_post;
    be->hc_head = op_hc_head;
    if (cb_fuse_on()) {
        be->hc_pre_norm = op_hc_pre_norm;
        be->hc_post_pre_norm = op_hc_post_pre_norm;
        be->sublayer_input = op_sublayer_input;
    }
}

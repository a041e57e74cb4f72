/*
 * cuda_fmv_tall.cu - float-weight products with few rows over many tokens
 * (a prefill chunk's mHC mixing, 24 x 16384 F32, and routers, 256 x 4096):
 * out[t, r] = sum_k x[t, k] W[r, k], f32 accumulation.
 *
 * Why: the decode matvec (cuda_fmv.cu) runs such a product a row per block
 * for 4 tokens at a time, so every row re-reads every token's activation:
 * a 512-token chunk's 33.5 MB of mixing input is read 24 times, most of a
 * 24-row product's time. cuBLAS's SGEMM puts the skinny product on a few
 * blocks. Here a block takes 64 tokens x 32 rows over one slice of the
 * columns (tiles of 32 columns staged in shared memory), so the input is
 * read once and the weights once per 64 tokens; the slices' partial sums
 * are added in slice order by a second kernel, so the result does not
 * depend on scheduling. The sums run in another order than the decode
 * matvec's, so a prefilled token's mixing differs from its decode in the
 * last bits (as the bf16 GEMM of the quantized matrices does).
 */
#include "backend/cuda/cuda_blocks.cuh"
#include "backend/cuda/cuda_internal.cuh"

#define FT_TT 64 /* tokens a block */
#define FT_RT 32 /* rows a block */
#define FT_KC 32 /* columns a shared tile */

template <int T> __device__ __forceinline__ float ds4_ft_w(const uint8_t *w, int64_t i);
template <> __device__ __forceinline__ float ds4_ft_w<DS4_TYPE_F32>(const uint8_t *w, int64_t i)
{
    return __ldg((const float *)w + i);
}
template <> __device__ __forceinline__ float ds4_ft_w<DS4_TYPE_F16>(const uint8_t *w, int64_t i)
{
    return ds4_f16(__ldg((const unsigned short *)w + i));
}
template <> __device__ __forceinline__ float ds4_ft_w<DS4_TYPE_BF16>(const uint8_t *w, int64_t i)
{
    return ds4_bf16(__ldg((const unsigned short *)w + i));
}

/* part[z, t, r] = the sum over columns [z kslice, (z + 1) kslice), one fma
 * per column in column order. A block of 64 threads takes 64 tokens x 32
 * rows; thread (a, b) holds tokens 8 a .. 8 a + 7 and rows 4 b .. 4 b + 3
 * in registers, so a column of the shared tiles costs it three 16-byte
 * shared loads for 32 fmas (one token x one row a thread took a shared
 * load per fma, which bounded the kernel by shared-memory issue at ~15
 * TFLOPS). The tiles hold a column's 64 token values and 32 row values
 * side by side (padded rows against bank conflicts on the transposing
 * stores). Holding the next tile's values in registers during the fmas
 * (127 registers, 8 blocks an SM instead of 6) was slower: 472 us a
 * 2048-token call against 358 (docs/BENCHMARKS.md, twelfth session). */
#define FT_THREADS 64
#define FT_XP (FT_TT + 4)
#define FT_WP (FT_RT + 4)
template <int T>
__global__ void __launch_bounds__(FT_THREADS) ds4_fmv_tall_kernel(const uint8_t *w, int64_t rows, int64_t cols,
                                                                  const float *x, int64_t x_ld, int64_t n_tok,
                                                                  int64_t kslice, float *part)
{
    ds4_pdl_enter();
    __shared__ __align__(16) float sx[FT_KC][FT_XP]; /* sx[k][t] */
    __shared__ __align__(16) float sw[FT_KC][FT_WP]; /* sw[k][r] */
    const int tid = threadIdx.x, lk = tid & 31, lh = tid >> 5; /* loads: column lk, tokens / rows lh, lh + 2, .. */
    const int b = tid & 7, a = tid >> 3;                        /* compute: rows 4 b .., tokens 8 a .. */
    const int64_t t0 = (int64_t)blockIdx.x * FT_TT, r0 = (int64_t)blockIdx.y * FT_RT, k0 = (int64_t)blockIdx.z * kslice;
    const int64_t k1 = k0 + kslice < cols ? k0 + kslice : cols;
    float acc[8][4];
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int64_t kc = k0; kc < k1; kc += FT_KC) {
        const int64_t k = kc + lk;
#pragma unroll
        for (int i = 0; i < FT_TT / 2; i++) {
            const int tt = lh + 2 * i;
            const int64_t t = t0 + tt;
            sx[lk][tt] = t < n_tok && k < k1 ? __ldg(x + t * x_ld + k) : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < FT_RT / 2; i++) {
            const int rr = lh + 2 * i;
            const int64_t r = r0 + rr;
            sw[lk][rr] = r < rows && k < k1 ? ds4_ft_w<T>(w, r * cols + k) : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < FT_KC; kk++) {
            const float4 x0 = *(const float4 *)&sx[kk][8 * a], x1 = *(const float4 *)&sx[kk][8 * a + 4];
            const float4 wv = *(const float4 *)&sw[kk][4 * b];
            const float xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
            const float ws[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(xs[i], ws[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int64_t t = t0 + 8 * a + i;
        if (t >= n_tok) break;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int64_t r = r0 + 4 * b + j;
            if (r < rows) part[((int64_t)blockIdx.z * n_tok + t) * rows + r] = acc[i][j];
        }
    }
}

/* y[t, r] = the slices' sums in slice order. */
__global__ void ds4_fmv_tall_reduce_kernel(const float *part, int n_slices, int64_t n_tok, int64_t rows, float *y,
                                           int64_t y_ld)
{
    ds4_pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_tok * rows) return;
    float s = 0.0f;
    for (int z = 0; z < n_slices; z++) s += part[(int64_t)z * n_tok * rows + i];
    y[(i / rows) * y_ld + i % rows] = s;
}

extern "C" bool ds4_cuda_fmv_tall_covers(ds4_type type, int64_t rows, int64_t cols, int64_t n_tok)
{
    static int on = -1;
    if (!ds4_env_switch_on("DS4_CUDA_FMV_TALL", &on)) return false;
    return (type == DS4_TYPE_F32 || type == DS4_TYPE_F16 || type == DS4_TYPE_BF16) && n_tok >= FT_TT && rows >= 1 &&
           rows <= 1024 && cols >= 1;
}

extern "C" ds4_status ds4_cuda_fmv_tall(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows, int64_t cols,
                                       const float *d_x, int64_t x_ld, int64_t n_tok, float *d_y, int64_t y_ld)
{
    if (!ds4_cuda_fmv_tall_covers(type, rows, cols, n_tok) || x_ld < cols || y_ld < rows)
        return ds4_fail(DS4_ERR_INVALID, "cuda fmv tall: %lld x %lld, %lld tokens", (long long)rows, (long long)cols,
                        (long long)n_tok);
    const int64_t tb = (n_tok + FT_TT - 1) / FT_TT, rb = (rows + FT_RT - 1) / FT_RT;
    if (tb >= INT32_MAX) return ds4_fail(DS4_ERR_INVALID, "cuda fmv tall: %lld tokens", (long long)n_tok);
    /* slices of whole tiles, enough for about eight blocks (16 warps) an SM */
    const int64_t want = (8 * (int64_t)cu->n_sm + tb * rb - 1) / (tb * rb);
    int64_t kslice = (cols + want - 1) / want;
    kslice = (kslice + FT_KC - 1) / FT_KC * FT_KC;
    if (kslice < 4 * FT_KC) kslice = 4 * FT_KC;
    const int64_t n_slices = (cols + kslice - 1) / kslice;
    if (n_slices > 65535) return ds4_fail(DS4_ERR_INVALID, "cuda fmv tall: %lld columns", (long long)cols);
    ds4_status st = ds4_cuda_split_reserve(cu, (size_t)n_slices * (size_t)n_tok * (size_t)rows * sizeof(float));
    if (st != DS4_OK) return st;
    float *part = (float *)cu->split;
    const dim3 grid((unsigned)tb, (unsigned)rb, (unsigned)n_slices);
    const uint8_t *w = (const uint8_t *)d_w;
    switch (type) {
    case DS4_TYPE_F16:
        ds4_launch(ds4_fmv_tall_kernel<DS4_TYPE_F16>, grid, FT_THREADS, 0, cu->stream, w, rows, cols, d_x, x_ld, n_tok,
                   kslice, part);
        break;
    case DS4_TYPE_BF16:
        ds4_launch(ds4_fmv_tall_kernel<DS4_TYPE_BF16>, grid, FT_THREADS, 0, cu->stream, w, rows, cols, d_x, x_ld, n_tok,
                   kslice, part);
        break;
    default:
        ds4_launch(ds4_fmv_tall_kernel<DS4_TYPE_F32>, grid, FT_THREADS, 0, cu->stream, w, rows, cols, d_x, x_ld, n_tok,
                   kslice, part);
        break;
    }
    DS4_CUDA_CHECK(cudaGetLastError());
    const int64_t n = n_tok * rows;
    ds4_launch(ds4_fmv_tall_reduce_kernel, (unsigned)((n + 255) / 256), 256, 0, cu->stream, (const float *)part,
               (int)n_slices, n_tok, rows, d_y, y_ld);
    DS4_CUDA_CHECK(cudaGetLastError());
    return DS4_OK;
}

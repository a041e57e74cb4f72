/*
 * cuda_gemm.cu - the prefill path: many tokens times a quantized matrix.
 *
 * With n_tok tokens each weight is used n_tok times, so the work becomes
 * compute bound and belongs on the tensor cores. First step (kept simple
 * and exact in its parts): dequantize a tile of rows into scratch (bf16, or
 * f32 for the reference numerics mode), round x to bf16 once, and let
 * cuBLAS multiply with f32 accumulation. The weights of a tile are read
 * once per call, whatever n_tok is. A fused kernel that decodes tiles in
 * shared memory straight into wgmma operands would save the scratch round
 * trip (docs/CUDA.md lists it as the next step).
 *
 * Also here: ds4_cuda_dequantize (f32 out), used by tests and the GEMM,
 * and ds4_cuda_matmul, the dispatcher between matvec and GEMM.
 */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_tables.cuh"

#include <cuda_bf16.h>

#define DQ_THREADS 256
#define GEMM_TILE_BYTES ((size_t)256 << 20) /* dequantized weights per tile */

__device__ __forceinline__ void ds4_store(float *o, float v) { *o = v; }
__device__ __forceinline__ void ds4_store(__nv_bfloat16 *o, float v) { *o = __float2bfloat16_rn(v); }

/* One thread per 8-value octet. The value is computed as ggml does,
 * sc * raw - mn with separate roundings (no FMA), so an f32 output is
 * bit-identical to ggml's dequantization. */
template <int T, typename O>
__global__ void __launch_bounds__(DQ_THREADS)
ds4_dequant_kernel(const uint8_t *w, int64_t rows, int64_t cols, int64_t row_bytes, O *out)
{
    ds4_pdl_enter();
    __shared__ ds4_block_luts<T> s_luts;
    const ds4_luts L = s_luts.fill(cols);
    __syncthreads();
    const int64_t no = cols / 8, total = rows * no;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / no, o = i - r * no;
        float v[8], sc, mn;
        ds4_decode_octet<T>(w + r * row_bytes, o, v, sc, mn, L);
        O *dst = out + r * cols + o * 8;
#pragma unroll
        for (int k = 0; k < 8; k++) ds4_store(dst + k, __fsub_rn(__fmul_rn(sc, v[k]), mn));
    }
}

/* x [n_tok rows of cols, row stride x_ld] -> contiguous bf16. Eight
 * values a thread with 16-byte loads and one 16-byte store where the rows
 * allow it (a value a thread, with a 64-bit division each, moved ~2.1 TB/s:
 * 23.7 us for a 2048 x 4096 input, 132 calls of the 8-layer model's
 * 2048-token step, docs/BENCHMARKS.md); the same rounding either way. */
__global__ void ds4_f32_to_bf16_kernel(const float *x, int64_t cols, int64_t x_ld, int64_t n,
                                       __nv_bfloat16 *out)
{
    ds4_pdl_enter();
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    if ((cols & 7) == 0 && (x_ld & 3) == 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)out & 15) == 0) {
        const int64_t c8 = cols >> 3;
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n >> 3); i += step) {
            const int64_t r = i / c8;
            const float4 *src = (const float4 *)(x + r * x_ld + 8 * (i - r * c8));
            const float4 a = src[0], b = src[1];
            const __nv_bfloat162 p0 = __floats2bfloat162_rn(a.x, a.y), p1 = __floats2bfloat162_rn(a.z, a.w),
                                 p2 = __floats2bfloat162_rn(b.x, b.y), p3 = __floats2bfloat162_rn(b.z, b.w);
            uint4 o;
            o.x = *(const uint32_t *)&p0, o.y = *(const uint32_t *)&p1, o.z = *(const uint32_t *)&p2,
            o.w = *(const uint32_t *)&p3;
            ((uint4 *)out)[i] = o;
        }
        return;
    }
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
        out[i] = __float2bfloat16_rn(x[(i / cols) * x_ld + i % cols]);
}

static unsigned ds4_grid_for(const ds4_cuda *cu, int64_t work)
{
    int64_t b = (work + DQ_THREADS - 1) / DQ_THREADS, cap = (int64_t)cu->n_sm * 16;
    return (unsigned)(b < 1 ? 1 : b > cap ? cap : b);
}

struct ds4_dq_launch {
    template <int T, typename O>
    static ds4_status run(ds4_cuda *cu, const void *d_w, int64_t rows, int64_t cols, O *out)
    {
        int64_t rb = (int64_t)ds4_cuda_row_bytes((ds4_type)T, cols);
        ds4_launch(ds4_dequant_kernel<T, O>, ds4_grid_for(cu, rows * cols / 8), DQ_THREADS, 0, cu->stream,
            (const uint8_t *)d_w, rows, cols, rb, out);
        DS4_CUDA_CHECK(cudaGetLastError());
        return DS4_OK;
    }
    template <int T>
    static ds4_status run(ds4_cuda *cu, const void *d_w, int64_t rows, int64_t cols, float *out)
    {
        return run<T, float>(cu, d_w, rows, cols, out);
    }
    template <int T>
    static ds4_status run(ds4_cuda *cu, const void *d_w, int64_t rows, int64_t cols,
                          __nv_bfloat16 *out)
    {
        return run<T, __nv_bfloat16>(cu, d_w, rows, cols, out);
    }
};

template <typename O>
static ds4_status ds4_dequant_any(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows,
                                  int64_t cols, O *out)
{
    DS4_CUDA_FOR_TYPE(type, ds4_dq_launch, cu, d_w, rows, cols, out);
    return ds4_fail(DS4_ERR_UNSUPPORTED, "cuda dequantize: weight type %d", (int)type);
}

ds4_status ds4_cuda_dequantize_bf16(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows, int64_t cols,
                                    __nv_bfloat16 *d_out)
{
    return ds4_dequant_any(cu, type, d_w, rows, cols, d_out);
}

extern "C" ds4_status ds4_cuda_dequantize(ds4_cuda *cu, ds4_type type, const void *d_w,
                                          int64_t rows, int64_t cols, float *d_out)
{
    ds4_status st = ds4_cuda_check_weights("dequantize", type, d_w, rows, cols);
    if (st != DS4_OK) return st;
    return ds4_dequant_any(cu, type, d_w, rows, cols, d_out);
}

static ds4_status ds4_scratch(ds4_cuda *cu, size_t bytes)
{
    return ds4_cuda_grow(cu, &cu->scratch, &cu->scratch_bytes, bytes, "gemm: scratch");
}

ds4_status ds4_cuda_gemm_ld(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows,
                            int64_t cols, const float *d_x, int64_t x_ld, int64_t n_tok, float *d_y,
                            int64_t y_ld, ds4_cuda_gemm_precision prec)
{
    ds4_status st = ds4_cuda_check_weights("gemm", type, d_w, rows, cols);
    if (st != DS4_OK) return st;
    if (n_tok <= 0 || n_tok > INT32_MAX || rows > INT32_MAX || cols > INT32_MAX || x_ld < cols ||
        y_ld < rows || x_ld > INT32_MAX || y_ld > INT32_MAX)
        return ds4_fail(DS4_ERR_INVALID, "cuda gemm: n_tok %lld, rows %lld, cols %lld out of range",
                        (long long)n_tok, (long long)rows, (long long)cols);
    const bool bf = prec == DS4_CUDA_GEMM_BF16;
    const size_t es = bf ? 2 : 4;
    const size_t xbytes = bf ? (((size_t)n_tok * (size_t)cols * 2 + 255) & ~(size_t)255) : 0;
    int64_t rc = (int64_t)(GEMM_TILE_BYTES / ((size_t)cols * es));
    if (rc < 1) rc = 1;
    if (rc > rows) rc = rows;
    st = ds4_scratch(cu, xbytes + (size_t)rc * (size_t)cols * es);
    if (st != DS4_OK) return st;
    void *xb = (void *)d_x, *wt = (char *)cu->scratch + xbytes;
    if (bf) {
        xb = cu->scratch;
        ds4_launch(ds4_f32_to_bf16_kernel, ds4_grid_for(cu, n_tok * cols / 8 + 1), DQ_THREADS, 0, cu->stream,
            d_x, cols, x_ld, n_tok * cols, (__nv_bfloat16 *)xb);
        DS4_CUDA_CHECK(cudaGetLastError());
    }
    const size_t rb = ds4_cuda_row_bytes(type, cols);
    const cudaDataType_t dt = bf ? CUDA_R_16BF : CUDA_R_32F;
    const float alpha = 1.0f, beta = 0.0f;
    /* a resident bf16 copy (cuda_gemm_bf16copy.cu) holds what the tiles'
     * dequantization would write: the same tiles are multiplied from it */
    if (bf && (st = ds4_cuda_bf16copy_make_pending(cu)) != DS4_OK) return st;
    const __nv_bfloat16 *copy = bf ? ds4_bf16copy_find(cu->device, d_w, rows, cols) : NULL;
    for (int64_t r0 = 0; r0 < rows; r0 += rc) {
        const int64_t n = rows - r0 < rc ? rows - r0 : rc;
        const uint8_t *wr = (const uint8_t *)d_w + (size_t)r0 * rb;
        if (copy) {
            wt = (void *)(copy + (size_t)r0 * (size_t)cols);
        } else {
            st = bf ? ds4_dequant_any(cu, type, wr, n, cols, (__nv_bfloat16 *)wt)
                    : ds4_dequant_any(cu, type, wr, n, cols, (float *)wt);
            if (st != DS4_OK) return st;
        }
        /* Column-major view: C[rows x n_tok] = Wt^T [rows x cols] * X [cols x n_tok]. */
        cublasStatus_t bs = cublasGemmEx(cu->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)n_tok,
                                         (int)cols, &alpha, wt, dt, (int)cols, xb, dt,
                                         (int)(bf ? cols : x_ld), &beta, d_y + r0, CUDA_R_32F, (int)y_ld,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (bs != CUBLAS_STATUS_SUCCESS)
            return ds4_fail(DS4_ERR_BACKEND, "cuda gemm: cublasGemmEx failed (status %d) at rows %lld",
                            (int)bs, (long long)r0);
    }
    return DS4_OK;
}

extern "C" ds4_status ds4_cuda_gemm(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows,
                                    int64_t cols, const float *d_x, int64_t n_tok, float *d_y)
{
    return ds4_cuda_gemm_ld(cu, type, d_w, rows, cols, d_x, cols, n_tok, d_y, rows, cu->gemm_precision);
}

extern "C" ds4_status ds4_cuda_matmul(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows,
                                      int64_t cols, const float *d_x, int64_t n_tok, float *d_y)
{
    if (n_tok <= DS4_CUDA_MATVEC_MAX_TOK)
        return ds4_cuda_matvec(cu, type, d_w, rows, cols, d_x, n_tok, d_y);
    return ds4_cuda_gemm(cu, type, d_w, rows, cols, d_x, n_tok, d_y);
}

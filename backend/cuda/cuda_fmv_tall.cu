/*
 * cuda_fmv_tall.cu - float-weight products with few rows over many tokens
 * (a prefill chunk's mHC mixing, 24 x 16384 F32, routers, 256 x 4096, and
 * compressors, 512 / 1024 x 4096 F16): out[t, r] = sum_k x[t, k] W[r, k],
 * f32 accumulation.
 *
 * Why: the decode matvec (cuda_fmv.cu) runs such a product a row per block
 * for 4 tokens at a time, so every row re-reads every token's activation:
 * a 512-token chunk's 33.5 MB of mixing input is read 24 times, most of a
 * 24-row product's time. cuBLAS's SGEMM puts the skinny product on a few
 * blocks. Here a block takes a tile of tokens x rows over one slice of the
 * columns (tiles of 32 columns staged in shared memory), so the input is
 * read once a row tile and the weights once a token tile; the slices'
 * partial sums are added in slice order by a second kernel, so the result
 * does not depend on scheduling.
 *
 * Two kernels make the partial sums: ds4_fmv_tall_kernel, fp32 fmas on the
 * CUDA cores in 64-token x 32-row tiles (F32 weights, and F16 / BF16 where
 * the tensor-core one does not serve), and ds4_fmv_tall_tc_kernel, tf32
 * mma in 128-token x 128-row tiles for F16 / BF16 weights (exact in tf32;
 * the input as two tf32 terms: fp32-grade, see there). The sums run in
 * another order than the decode matvec's (and the tensor cores' own order
 * within 8 columns), so a prefilled token's product differs from its
 * decode in the last bits (as the bf16 GEMM of the quantized matrices
 * does).
 */
#include "backend/cuda/cuda_blocks.cuh"
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_mq_device.cuh"
#include "backend/cuda/cuda_tf32.cuh"

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

/* The tensor-core kernel for F16 / BF16 weights.
 *
 * Why: the fma kernel above runs at ~48 TFLOPS, near the fp32 fma peak,
 * and still took 13% of a 2048-token prefill step: 1024 x 4096 F16
 * compressor weights over 2048 tokens, 17.2 GFLOP, took 357 us; here 120
 * us (docs/BENCHMARKS.md, fourteenth session). Every F16 and BF16 weight
 * is a tf32 value and goes in as it is, the fp32 input as two tf32 terms
 * (cuda_tf32.cuh says why that is fp32-grade); two mma a product still
 * leave ~3.7x the fp32 fma peak (H200: ~495 dense tf32 TFLOPS against ~67
 * fp32).
 *
 * Layout: M = tokens (A = x, row-major as stored), N = weight rows (B = W,
 * "col" = each row's columns contiguous, as stored). A block is 128 tokens
 * x 32 RW rows in 2 x RW warps, warp (wm, wn) = warp (warp & 1, warp >> 1)
 * holding 64 tokens x 32 rows: 4 x 4 mma tiles, 64 accumulators a thread.
 * RW = 4 for the compressors and routers (x read once per 128 rows, W
 * once per 128 tokens); RW = 1 or 2 for 32 or 64 rows or fewer, so a
 * small product does not pay for empty rows. Tiles of 32 columns are
 * staged by cp.async three deep (one __syncthreads a tile), x as floats 40
 * apart and W as its 16-bit values 40 apart: the padding puts a warp's
 * fragment loads on distinct banks.
 *
 * Within each 8-column mma step the mma's column k stands for staged column
 * 2k (k < 4) or 2 (k - 4) + 1: thread (g, t)'s A values of columns t and
 * t + 4 are then one 8-byte load (staged columns 2t, 2t + 1) and its two B
 * values one 4-byte load of two 16-bit weights. The sum over the 8 columns
 * does not care which is called which, as long as A and B agree.
 *
 * The x values are split when loaded into fragments (a warp's split A
 * fragment feeds 8 mma): per 8 columns a warp then reads 20 shared
 * wavefronts and issues 48 split operations (cvt, sub, cvt of 16 values)
 * beside its 32 mma. Split when staged, the x fragment loads would double
 * (36 wavefronts per 32 mma), enough for shared memory to bound mma.sync
 * below its peak. */
#define FTC_TT 128 /* tokens a block */
#define FTC_KC 32  /* columns a staged tile */
#define FTC_ST 3   /* tiles in flight */
#define FTC_XS 40  /* floats from one staged token to the next */
#define FTC_WS 40  /* 16-bit weights from one staged row to the next */
#define FTC_SMEM(RW) ((size_t)FTC_ST * (FTC_TT * FTC_XS * 4 + 32 * (RW) * FTC_WS * 2))

/* Two adjacent 16-bit weights (the lower address in the low half) as the
 * tf32 bits of b0 (low) and b1 (high): exact. */
template <int T> __device__ __forceinline__ void ftc_w2(uint32_t u, uint32_t &b0, uint32_t &b1);
template <> __device__ __forceinline__ void ftc_w2<DS4_TYPE_F16>(uint32_t u, uint32_t &b0, uint32_t &b1)
{
    b0 = __float_as_uint(ds4_f16(u & 0xffffu));
    b1 = __float_as_uint(ds4_f16(u >> 16));
}
template <> __device__ __forceinline__ void ftc_w2<DS4_TYPE_BF16>(uint32_t u, uint32_t &b0, uint32_t &b1)
{
    b0 = u << 16;
    b1 = u & 0xffff0000u;
}

/* Tile kt of the block's slice into stage st: x rows t0 .. t0 + 127 and W
 * rows r0 .. r0 + 32 RW - 1, columns k0 + 32 kt .. + 31; tokens, rows and
 * columns past the ends (n_tok, rows, the slice's end k1) as zeros. Whole
 * 16-byte pieces are in or out: k1 and the callers' cols are multiples of
 * 8, x rows and W rows 16-byte aligned. */
template <int RW>
__device__ __forceinline__ void ftc_load(float *sx, uint16_t *sw, const uint16_t *w, int64_t rows, int64_t cols,
                                         const float *x, int64_t x_ld, int64_t n_tok, int64_t t0, int64_t r0,
                                         int64_t kc, int64_t k1, int tid)
{
    constexpr int NT = 64 * RW;
#pragma unroll
    for (int i = 0; i < FTC_TT * 8 / NT; i++) { /* a token's 32 columns: 8 pieces */
        const int c = tid + i * NT, tt = c >> 3, ch = c & 7;
        const int64_t t = t0 + tt, k = kc + 4 * ch;
        const bool ok = t < n_tok && k < k1;
        ds4_mq_cp16z(sx + tt * FTC_XS + 4 * ch, ok ? x + t * x_ld + k : x, ok);
    }
#pragma unroll
    for (int i = 0; i < 32 * RW * 4 / NT; i++) { /* a row's 32 columns: 4 pieces */
        const int c = tid + i * NT, rr = c >> 2, ch = c & 3;
        const int64_t r = r0 + rr, k = kc + 8 * ch;
        const bool ok = r < rows && k < k1;
        ds4_mq_cp16z(sw + rr * FTC_WS + 8 * ch, ok ? w + r * cols + k : w, ok);
    }
}

/* part[z, t, r] = the sum over columns [z kslice, (z + 1) kslice), as the
 * fma kernel. Two blocks an SM: at RW = 4 (8 warps) the registers allow
 * that (at most 128 a thread) and so does shared memory (90 KB a block);
 * smaller RW are held to 2 or 3 by the x stages' shared memory anyway, and
 * asking for more blocks spilled their load addresses. */
template <int T, int RW>
__global__ void __launch_bounds__(64 * RW, 2)
    ds4_fmv_tall_tc_kernel(const uint16_t *w, int64_t rows, int64_t cols, const float *x, int64_t x_ld,
                           int64_t n_tok, int64_t kslice, float *part)
{
    ds4_pdl_enter();
    extern __shared__ __align__(16) unsigned char ftc_smem[];
    constexpr int RT = 32 * RW;
    float *sx = (float *)ftc_smem;                                    /* [FTC_ST][FTC_TT][FTC_XS] */
    uint16_t *sw = (uint16_t *)(sx + FTC_ST * FTC_TT * FTC_XS);       /* [FTC_ST][RT][FTC_WS] */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, q = lane & 3, wm = warp & 1, wn = warp >> 1;
    const int64_t t0 = (int64_t)blockIdx.x * FTC_TT, r0 = (int64_t)blockIdx.y * RT, k0 = (int64_t)blockIdx.z * kslice;
    const int64_t k1 = k0 + kslice < cols ? k0 + kslice : cols;
    const int nk = (int)((k1 - k0 + FTC_KC - 1) / FTC_KC);
    float acc[4][4][4]; /* [token tile i][row tile j][c0..c3] */
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = 0.0f;
#pragma unroll
    for (int s = 0; s < FTC_ST - 1; s++) {
        if (s < nk)
            ftc_load<RW>(sx + s * FTC_TT * FTC_XS, sw + s * RT * FTC_WS, w, rows, cols, x, x_ld, n_tok, t0, r0,
                         k0 + (int64_t)s * FTC_KC, k1, tid);
        ds4_mq_cp_commit(); /* a group per tile, empty or not, so the wait below counts tiles */
    }
    for (int kt = 0; kt < nk; kt++) {
        ds4_mq_cp_wait<FTC_ST - 2>(); /* tile kt has landed (this thread's pieces) */
        __syncthreads();              /* everyone's pieces; and stage (kt - 1) % 3 is no longer read */
        if (kt + FTC_ST - 1 < nk) {
            const int st = (kt + FTC_ST - 1) % FTC_ST;
            ftc_load<RW>(sx + st * FTC_TT * FTC_XS, sw + st * RT * FTC_WS, w, rows, cols, x, x_ld, n_tok, t0, r0,
                         k0 + (int64_t)(kt + FTC_ST - 1) * FTC_KC, k1, tid);
        }
        ds4_mq_cp_commit();
        const int st = kt % FTC_ST;
        /* this thread's A values: tokens 64 wm + 16 i + g (+ 8), staged columns 8 s + 2 q, + 1;
         * its B values: rows 32 wn + 8 j + g, the same columns */
        const float *ax = sx + st * FTC_TT * FTC_XS + (64 * wm + g) * FTC_XS + 2 * q;
        const uint32_t *bw = (const uint32_t *)(sw + st * RT * FTC_WS + (32 * wn + g) * FTC_WS) + q;
#pragma unroll
        for (int s = 0; s < FTC_KC / 8; s++) {
            uint32_t b[4][2];
#pragma unroll
            for (int j = 0; j < 4; j++) ftc_w2<T>(bw[j * 8 * FTC_WS / 2 + 4 * s], b[j][0], b[j][1]);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float2 p0 = *(const float2 *)(ax + (16 * i) * FTC_XS + 8 * s);     /* token g */
                const float2 p1 = *(const float2 *)(ax + (16 * i + 8) * FTC_XS + 8 * s); /* token g + 8 */
                uint32_t hi[4], lo[4]; /* a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4) */
                ds4_tf32_split(p0.x, hi[0], lo[0]);
                ds4_tf32_split(p1.x, hi[1], lo[1]);
                ds4_tf32_split(p0.y, hi[2], lo[2]);
                ds4_tf32_split(p1.y, hi[3], lo[3]);
#pragma unroll
                for (int j = 0; j < 4; j++) ds4_mma_tf32(acc[i][j], lo, b[j][0], b[j][1]); /* the small terms first */
#pragma unroll
                for (int j = 0; j < 4; j++) ds4_mma_tf32(acc[i][j], hi, b[j][0], b[j][1]);
            }
        }
    }
    /* c0 (token g, row 2t), c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1) of each tile */
    float *pz = part + (int64_t)blockIdx.z * n_tok * rows;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t t = t0 + 64 * wm + 16 * i + 8 * h + g;
            if (t >= n_tok) continue;
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int64_t r = r0 + 32 * wn + 8 * j + 2 * q + e;
                    if (r < rows) pz[t * rows + r] = acc[i][j][2 * h + e];
                }
        }
}

extern "C" bool ds4_cuda_fmv_tall_covers(ds4_type type, int64_t rows, int64_t cols, int64_t n_tok)
{
    static int on = -1;
    if (!ds4_env_switch_on("DS4_CUDA_FMV_TALL", &on)) return false;
    /* F32: few rows only (wider products keep cuBLAS's SGEMM); F16 / BF16
     * of any height (cb_matmul_raw sends the wide ones here too: the
     * indexer's 8192 x 1024 query product took 704 us a 2048-token call as
     * a dequantization to f32 and an SGEMM, docs/BENCHMARKS.md) */
    const int64_t max_rows = type == DS4_TYPE_F32 ? 1024 : (int64_t)65535 * FT_RT;
    return (type == DS4_TYPE_F32 || type == DS4_TYPE_F16 || type == DS4_TYPE_BF16) && n_tok >= FT_TT && rows >= 1 &&
           rows <= max_rows && cols >= 1;
}

/* The fma kernel's launch (as before the tensor-core kernel; *n_slices for the reduce). */
static ds4_status ds4_fmv_tall_fma(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows, int64_t cols,
                                   const float *d_x, int64_t x_ld, int64_t n_tok, int *n_slices_out)
{
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
    *n_slices_out = (int)n_slices;
    return DS4_OK;
}

/* Blocks of the tensor-core kernel an SM (its shared memory granted on
 * this device), 0 where the grant or the query failed (the fma kernel then
 * takes the call). */
template <int T, int RW> static int ftc_per_sm(ds4_cuda *cu)
{
    static int per_sm[32]; /* by device: 0 not asked yet, -1 refused */
    if (cu->device < 0 || cu->device >= 32) return 0;
    int &n = per_sm[cu->device];
    if (n == 0) {
        int v = 0;
        if (cudaFuncSetAttribute(ds4_fmv_tall_tc_kernel<T, RW>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)FTC_SMEM(RW)) != cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, ds4_fmv_tall_tc_kernel<T, RW>, 64 * RW, FTC_SMEM(RW)) !=
                cudaSuccess ||
            v < 1) {
            (void)cudaGetLastError(); /* not left for the launch check */
            v = -1;
        }
        n = v;
    }
    return n > 0 ? n : 0;
}

template <int T, int RW>
static void ftc_launch(ds4_cuda *cu, dim3 grid, const void *d_w, int64_t rows, int64_t cols, const float *d_x,
                       int64_t x_ld, int64_t n_tok, int64_t kslice, float *part)
{
    ds4_launch(ds4_fmv_tall_tc_kernel<T, RW>, grid, 64 * RW, FTC_SMEM(RW), cu->stream, (const uint16_t *)d_w, rows,
               cols, d_x, x_ld, n_tok, kslice, part);
}

/* The tensor-core kernel's launch, or false (nothing launched) where it
 * does not serve: F32 weights, a device below sm_80, DS4_CUDA_FMV_TALL_TC=0,
 * or x or W rows not 16-byte aligned (x, x_ld, W or cols: cp.async copies
 * 16 bytes; such calls take the fma kernel, which has no such need). */
static bool ftc_run(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows, int64_t cols, const float *d_x,
                    int64_t x_ld, int64_t n_tok, int *n_slices_out, ds4_status *st)
{
    static int on = -1;
    if ((type != DS4_TYPE_F16 && type != DS4_TYPE_BF16) || cu->cc_major < 8 ||
        !ds4_env_switch_on("DS4_CUDA_FMV_TALL_TC", &on) || ((uintptr_t)d_x & 15u) != 0 || x_ld % 4 != 0 ||
        ((uintptr_t)d_w & 15u) != 0 || cols % 8 != 0)
        return false;
    const int rw = rows <= 32 ? 1 : rows <= 64 ? 2 : 4;
    const bool f16 = type == DS4_TYPE_F16;
    const int per_sm = rw == 1   ? (f16 ? ftc_per_sm<DS4_TYPE_F16, 1>(cu) : ftc_per_sm<DS4_TYPE_BF16, 1>(cu))
                       : rw == 2 ? (f16 ? ftc_per_sm<DS4_TYPE_F16, 2>(cu) : ftc_per_sm<DS4_TYPE_BF16, 2>(cu))
                                 : (f16 ? ftc_per_sm<DS4_TYPE_F16, 4>(cu) : ftc_per_sm<DS4_TYPE_BF16, 4>(cu));
    if (per_sm == 0) return false;
    const int64_t tb = (n_tok + FTC_TT - 1) / FTC_TT, rb = (rows + 32 * rw - 1) / (32 * rw);
    if (tb >= INT32_MAX) return false;
    /* Slices: the count whose blocks fill the SMs' slots in the fewest
     * waves per unit of work (ceil(blocks / slots) / slices, the fewer
     * slices on a tie: each adds a partial sum to write and add), at least
     * 8 tiles (256 columns) a slice so the 3-deep fill is paid off. 1024 x
     * 4096 over 2048 tokens: 128 tiles x 2 slices on 132 SMs x 2. */
    const int64_t base = tb * rb, slots = (int64_t)per_sm * cu->n_sm;
    int64_t smax = cols / (8 * FTC_KC);
    if (smax < 1) smax = 1;
    if (smax > 1024) smax = 1024;
    int64_t best = 1, best_waves = (base + slots - 1) / slots;
    for (int64_t s = 2; s <= smax; s++) {
        const int64_t waves = (base * s + slots - 1) / slots;
        if (waves * best < best_waves * s) best = s, best_waves = waves;
    }
    int64_t kslice = (cols + best - 1) / best;
    kslice = (kslice + FTC_KC - 1) / FTC_KC * FTC_KC;
    const int64_t n_slices = (cols + kslice - 1) / kslice;
    *st = ds4_cuda_split_reserve(cu, (size_t)n_slices * (size_t)n_tok * (size_t)rows * sizeof(float));
    if (*st != DS4_OK) return true;
    float *part = (float *)cu->split;
    const dim3 grid((unsigned)tb, (unsigned)rb, (unsigned)n_slices);
    switch (rw * 2 + f16) {
    case 2: ftc_launch<DS4_TYPE_BF16, 1>(cu, grid, d_w, rows, cols, d_x, x_ld, n_tok, kslice, part); break;
    case 3: ftc_launch<DS4_TYPE_F16, 1>(cu, grid, d_w, rows, cols, d_x, x_ld, n_tok, kslice, part); break;
    case 4: ftc_launch<DS4_TYPE_BF16, 2>(cu, grid, d_w, rows, cols, d_x, x_ld, n_tok, kslice, part); break;
    case 5: ftc_launch<DS4_TYPE_F16, 2>(cu, grid, d_w, rows, cols, d_x, x_ld, n_tok, kslice, part); break;
    case 8: ftc_launch<DS4_TYPE_BF16, 4>(cu, grid, d_w, rows, cols, d_x, x_ld, n_tok, kslice, part); break;
    default: ftc_launch<DS4_TYPE_F16, 4>(cu, grid, d_w, rows, cols, d_x, x_ld, n_tok, kslice, part); break;
    }
    *n_slices_out = (int)n_slices;
    return true;
}

extern "C" ds4_status ds4_cuda_fmv_tall(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows, int64_t cols,
                                       const float *d_x, int64_t x_ld, int64_t n_tok, float *d_y, int64_t y_ld)
{
    if (!ds4_cuda_fmv_tall_covers(type, rows, cols, n_tok) || x_ld < cols || y_ld < rows)
        return ds4_fail(DS4_ERR_INVALID, "cuda fmv tall: %lld x %lld, %lld tokens", (long long)rows, (long long)cols,
                        (long long)n_tok);
    int n_slices = 0;
    ds4_status st = DS4_OK;
    if (ftc_run(cu, type, d_w, rows, cols, d_x, x_ld, n_tok, &n_slices, &st)) {
        if (st != DS4_OK) return st;
    } else {
        st = ds4_fmv_tall_fma(cu, type, d_w, rows, cols, d_x, x_ld, n_tok, &n_slices);
        if (st != DS4_OK) return st;
    }
    DS4_CUDA_CHECK(cudaGetLastError());
    const float *part = (const float *)cu->split;
    const int64_t n = n_tok * rows;
    ds4_launch(ds4_fmv_tall_reduce_kernel, (unsigned)((n + 255) / 256), 256, 0, cu->stream, part, n_slices, n_tok,
               rows, d_y, y_ld);
    DS4_CUDA_CHECK(cudaGetLastError());
    return DS4_OK;
}

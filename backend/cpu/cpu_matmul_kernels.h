/*
 * cpu_matmul_kernels.h - private interface between ds4_cpu_matmul() and its
 * per-instruction-set kernels (backend/cpu only, and tests, bench): the
 * per-row dot-product kernels (scalar level, Q4_K, and everything with
 * DS4_CPU_GEMM=0) and the GEMM (below) used for the other types at the
 * AVX2 and AVX-512 levels.
 *
 * A per-row kernel computes the dot product of ONE weight row (ggml blocks)
 * with up to DS4_TILE_TOK activation rows at once, walking the weight row a
 * single time: each block is decoded once and used for every token. The
 * activations come already converted to the type's dot format:
 *
 *   DS4_ACT_F32    float x[n]                  (F32, F16, BF16 weights)
 *   DS4_ACT_Q8_0   int8 qs[n]; float d[n/32]   (Q8_0, MXFP4 weights)
 *   DS4_ACT_Q8_K   int8 qs[n]; float d[n/256]; int16 bsums[n/16]
 *                                              (Q2_K, Q4_K, IQ2_XXS weights)
 *
 * The quantized formats hold the same numbers as ggml's block_q8_0 /
 * block_q8_K (the Q8_0 scale is the f16-rounded one) but split into arrays
 * so SIMD loads of qs are contiguous. One activation row takes
 * ds4_act_row_bytes() bytes (a multiple of 64); rows follow each other.
 */
#ifndef DS4_BACKEND_CPU_MATMUL_KERNELS_H
#define DS4_BACKEND_CPU_MATMUL_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/cpu_matmul.h"
#include "quant/blocks.h"

#define DS4_TILE_TOK 4

typedef enum {
    DS4_SIMD_SCALAR = 0,
    DS4_SIMD_AVX2 = 1,
    DS4_SIMD_AVX512 = 2,
} ds4_simd_level;

typedef enum {
    DS4_ACT_F32,
    DS4_ACT_Q8_0,
    DS4_ACT_Q8_K,
} ds4_act_kind;

/* out[t] = dot(w, x + t * x_stride) for t < ntok (1 <= ntok <= DS4_TILE_TOK);
 * n is the row length in values (a multiple of the type's block size). */
typedef void (*ds4_dot_fn)(int64_t n, const void *w, const void *x,
                           size_t x_stride, int ntok, float *out);

/* Per-level kernel tables; NULL when the level lacks a kernel for `type`. */
ds4_dot_fn ds4_cpu_dot_scalar(ds4_type type);
ds4_dot_fn ds4_cpu_dot_avx2(ds4_type type);
ds4_dot_fn ds4_cpu_dot_avx512(ds4_type type);

/* The best level this CPU runs, and whether it runs `level`. */
ds4_simd_level ds4_cpu_simd_best(void);
int ds4_cpu_simd_supported(ds4_simd_level level);
const char *ds4_cpu_simd_name(ds4_simd_level level);

/* Kernel for type at level, falling back to lower levels; NULL when the
 * type has no matmul. */
ds4_dot_fn ds4_cpu_dot_kernel(ds4_type type, ds4_simd_level level);

/* Activation format of a weight type; block size in values and bytes
 * (0 when the type is not a matmul weight type). */
ds4_act_kind ds4_cpu_act_kind(ds4_type type);
int64_t ds4_cpu_block_values(ds4_type type);
size_t ds4_cpu_block_bytes(ds4_type type);
size_t ds4_act_row_bytes(ds4_act_kind kind, int64_t n);

/* Convert one row of n f32 values to `kind` (the same numbers ggml's
 * quantize_row_q8_0 / quantize_row_q8_K produce). */
void ds4_act_quantize(ds4_act_kind kind, const float *x, int64_t n, void *out);
/* The same for values [v0, v1) of the row only (multiples of the block
 * size), so that one row can be converted by several threads. */
void ds4_act_quantize_part(ds4_act_kind kind, const float *x, int64_t n, int64_t v0, int64_t v1,
                           void *out);

/* The same conversion with the SIMD code of `level` (act_avx2.c,
 * act_avx512.c): the same bytes, faster. */
void ds4_act_quantize_level(ds4_simd_level level, ds4_act_kind kind, const float *x, int64_t n,
                            int64_t v0, int64_t v1, void *out);
void ds4_act_quantize_avx2(ds4_act_kind kind, const float *x, int64_t n, int64_t v0, int64_t v1,
                           void *out);
void ds4_act_quantize_avx512(ds4_act_kind kind, const float *x, int64_t n, int64_t v0, int64_t v1,
                             void *out);

/* ds4_cpu_matmul with the kernels of one level forced (tests, bench).
 * Returns 0, or -1 (y untouched) when type/cols are not supported. */
int ds4_cpu_matmul_level(ds4_simd_level level, ds4_threadpool *pool,
                         ds4_type type, const void *w, int64_t rows,
                         int64_t cols, const float *x, int64_t n_tok, float *y);

/* ---- the GEMM: cpu_gemm.c, gemm_avx2.c, gemm_avx512.c ------------------
 *
 * With many tokens (prefill) the per-row kernels above re-decode every
 * weight block for each tile of 4 tokens and spend most of their time on
 * loads and per-block scale handling. The GEMM repacks, once per call:
 *  - the activations of each token (already in the type's Q8_0 / Q8_K dot
 *    format) and, per chunk of rows, the weight rows, into a "lane per
 *    sub-block" layout: in a vector of L int32 lanes, lane j accumulates
 *    the whole integer dot product of 32 values under one scale over 8
 *    steps of 4 bytes, so the float scale work is once per L sub-blocks
 *    instead of once per block; weights are decoded to int8 once, whatever
 *    the type (IQ2_XXS grid and signs, Q2_K scales folded in);
 *  - then a register-blocked microkernel computes mr rows x nt tokens per
 *    pass, so each weight vector load feeds nt products and each
 *    activation load mr.
 * Float weights (F32, F16, BF16) are not repacked: the microkernel reads
 * the rows and the f32 activations as they are.
 *
 * Where a type and level have a GEMM its arithmetic is the one used for
 * every n_tok: with few tokens (decode) a fused kernel decodes each weight
 * row in registers (no panel) and does the microkernel's operations on the
 * same numbers. So a (row, token) result has the same bits in a call of 1
 * token or of 100, and a prefill does not depend on how it is cut into
 * chunks, nor on how many tokens the router gives each expert
 * (tests/test_matmul_gemm.c, tests/test_bench_model.c). These numbers
 * differ from the per-row kernels' in float summation order only (the
 * integer sums are exact). */

typedef struct {
    int mr, nt; /* register block: rows x tokens of one kernel call */
    /* Bytes of one packed weight row / token of `cols` values (multiples of
     * 32); pack_w NULL: weights are used as stored, pack_x NULL: the
     * activation rows as they are (f32). pack_x reads a row in the type's
     * activation format (ds4_cpu_act_kind). */
    size_t (*w_bytes)(int64_t cols);
    void (*pack_w)(int64_t cols, const void *w_row, void *out);
    size_t (*x_bytes)(int64_t cols);
    void (*pack_x)(int64_t cols, const void *act_row, void *out);
    /* y[t * ldy + r] = dot(weight row r, token t) for r < nr <= mr and
     * t < nt <= this->nt; rows and tokens are packed (or raw) rows at the
     * given strides. */
    void (*kernel)(int64_t cols, const void *w, size_t w_stride, int nr, const void *x,
                   size_t x_stride, int nt, float *y, size_t ldy);
    /* For calls of few tokens (decode): `kernel`'s numbers, bit for bit,
     * from the weight rows as stored (w_stride = their row bytes; nr <=
     * fused_mr rows, nt <= fused_nt tokens packed by pack_x), so that no
     * result depends on n_tok. Few rows at a time: the matvec streams from
     * DRAM, where more concurrent rows measured slower. */
    void (*fused)(int64_t cols, const void *w, size_t w_stride, int nr, const void *x,
                  size_t x_stride, int nt, float *y, size_t ldy);
    int fused_mr, fused_nt;
    /* Optional (NULL: none): a second fused kernel that gets the same
     * numbers another way, from its own token format (gemv_avx512.c). */
    void (*fused_own)(int64_t cols, const void *w, size_t w_stride, int nr, const void *x, size_t x_stride,
                      int nt, float *y, size_t ldy);
    size_t (*fused_x_bytes)(int64_t cols);
    void (*fused_pack_x)(int64_t cols, const void *act_row, void *out);
    /* fused_pack_x and its kernel serve calls of up to this many tokens
     * (more: pack_x and the fused kernel of the GEMM's format) */
    int fused_own_nt;
} ds4_gemm_ops;

/* Few-token kernels of gemv_avx512.c: a fused kernel with its token
 * format. Returns 1 and fills *out where the type has one and the CPU runs
 * it, else 0. */
typedef struct {
    /* NULL, NULL: the kernel reads the GEMM's packed tokens (the type's
     * ds4_gemm_ops x_bytes / pack_x) */
    size_t (*x_bytes)(int64_t cols);
    void (*pack_x)(int64_t cols, const void *act_row, void *out);
    void (*fused)(int64_t cols, const void *w, size_t w_stride, int nr, const void *x, size_t x_stride, int nt,
                  float *y, size_t ldy);
    int max_nt; /* calls of up to max_nt tokens (the fused kernels of the
                 * GEMM's format measured faster for more) */
} ds4_gemv_fns;
int ds4_gemv_avx512(ds4_type type, ds4_gemv_fns *out);

/* Per-level tables (NULL: no GEMM for the type at that level), and the one
 * to use at `level` (falling back to lower levels; NULL for scalar). */
const ds4_gemm_ops *ds4_cpu_gemm_avx2(ds4_type type);
const ds4_gemm_ops *ds4_cpu_gemm_avx512(ds4_type type);
const ds4_gemm_ops *ds4_cpu_gemm_ops(ds4_type type, ds4_simd_level level);

/* Which path ds4_cpu_matmul takes. AUTO: where the type and level have a
 * GEMM, the GEMM (weights packed for n_tok > DS4_TILE_TOK, the fused
 * kernel below); elsewhere, or with DS4_CPU_GEMM=0 in the environment, the
 * per-row kernels (ds4_cpu_dot_kernel). TILES: those per-row kernels
 * always. GEMM: the GEMM with packed weights for any n_tok (where there is
 * one, else as AUTO). */
typedef enum {
    DS4_MM_AUTO,
    DS4_MM_TILES,
    DS4_MM_GEMM,
} ds4_mm_path;

/* 0 when DS4_CPU_GEMM=0 in the environment (the per-row kernels always). */
int ds4_cpu_gemm_enabled(void);

int ds4_cpu_matmul_path(ds4_simd_level level, ds4_mm_path path, ds4_threadpool *pool,
                        ds4_type type, const void *w, int64_t rows, int64_t cols,
                        const float *x, int64_t n_tok, float *y);

/* The GEMM path itself (cpu_gemm.c); xa: the activations already in the
 * type's activation format, one row every xstride bytes (or f32 rows);
 * fused: the fused kernel instead of packed weights (where there is one).
 * Returns 0, or -1 when out of memory (y untouched). */
int ds4_cpu_gemm_run(const ds4_gemm_ops *ops, int fused, ds4_threadpool *pool, const void *w,
                     size_t wrow, int64_t rows, int64_t cols, const void *xa, size_t xstride,
                     int64_t n_tok, float *y);

/* ---- one-token products sharing a parallel region (cpu_gemm.c) --------
 *
 * The decode MoE runs the gate/up products of all its experts in one pool
 * run, instead of one run per product. These give, row by row, the bits of
 * ds4_cpu_matmul with n_tok = 1 (the same activation bytes and the same
 * fused kernel); where that call would take another path (no GEMM for the
 * type or level, DS4_CPU_GEMM=0) ds4_cpu_mv_bytes returns 0 and the caller
 * keeps ds4_cpu_matmul. */
typedef struct {
    void (*kern)(int64_t cols, const void *w, size_t w_stride, int nr, const void *x, size_t x_stride, int nt,
                 float *y, size_t ldy);
    int64_t cols;
    size_t wrow;       /* bytes of a weight row */
    const uint8_t *xp; /* the token in the kernel's format */
} ds4_mv_token;

/* Scratch bytes ds4_cpu_mv_pack needs for a token of `cols` values against
 * weights of `type`, or 0 when there is no such path. */
size_t ds4_cpu_mv_bytes(ds4_type type, int64_t cols);
/* Converts x (cols values) into buf (ds4_cpu_mv_bytes bytes) and fills tok. */
void ds4_cpu_mv_pack(ds4_type type, int64_t cols, const float *x, void *buf, ds4_mv_token *tok);
/* y[r - r0] = row r of w (rows of tok->wrow bytes) . the token, r0 <= r < r1. */
void ds4_cpu_mv_rows(const ds4_mv_token *tok, const void *w, int64_t r0, int64_t r1, float *y);

/* Scratch buffers of a matmul call (64-byte aligned; cpu_buffers.c): kept
 * for reuse by later calls instead of going back to the system. get
 * returns NULL when out of memory; put(NULL) does nothing. */
void *ds4_cpu_buf_get(size_t bytes);
void ds4_cpu_buf_put(void *p);

/* Format tables (IQ2_XXS grid and signs, MXFP4 values): quant/quant_tables.c. */
#include "quant/quant_tables.h"

/* Accessors of the quantized activation row layout. */
static inline const int8_t *ds4_act_qs(const void *row) { return (const int8_t *)row; }
static inline const float *ds4_act_d(const void *row, int64_t n)
{
    return (const float *)((const int8_t *)row + n);
}
static inline const int16_t *ds4_act_bsums(const void *row, int64_t n)
{
    return (const int16_t *)((const int8_t *)row + n + 4 * (n / QK_K));
}

/* IEEE half / bfloat16 / E8M0 to float (private copies: kernels need them
 * inline). E8M0 gives 2^(e-128): MXFP4 values are stored doubled. */
static inline float ds4_k_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: renormalise */
            int e = -1;
            do {
                man <<= 1;
                e++;
            } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    union { uint32_t u; float f; } v = {bits};
    return v.f;
}

static inline float ds4_k_bf16_to_f32(uint16_t h)
{
    union { uint32_t u; float f; } v = {(uint32_t)h << 16};
    return v.f;
}

static inline float ds4_k_e8m0_half(uint8_t e)
{
    uint32_t bits = e < 2 ? (0x00200000u << e) : ((uint32_t)(e - 1) << 23);
    union { uint32_t u; float f; } v = {bits};
    return v.f;
}

/* The fused kernels' entry: NAME##_body is written for a compile-time
 * token count NT (its accumulators stay in registers), and the entry
 * picks the instance for 1-4 tokens. ATTR is the entry's target
 * attribute (empty for the file's default). */
#define DS4_NT_DISPATCH(NAME, ATTR)                                                                 \
    ATTR static void NAME(int64_t cols, const void *w, size_t wst, int nr, const void *x, size_t xst, \
                          int nt, float *y, size_t ldy)                                            \
    {                                                                                              \
        (void)wst, (void)nr;                                                                       \
        switch (nt) {                                                                              \
        case 1: NAME##_body(cols, w, x, xst, 1, y, ldy); break;                                    \
        case 2: NAME##_body(cols, w, x, xst, 2, y, ldy); break;                                    \
        case 3: NAME##_body(cols, w, x, xst, 3, y, ldy); break;                                    \
        default: NAME##_body(cols, w, x, xst, 4, y, ldy); break;                                   \
        }                                                                                          \
    }

#endif

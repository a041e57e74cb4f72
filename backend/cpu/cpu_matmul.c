/*
 * cpu_matmul.c - ds4_cpu_matmul(): kernel dispatch, activation conversion
 * and the split of the work over the thread pool.
 *
 * Shape of the work: the activations are converted once to the dot format
 * of the weight type (cpu_matmul_act.c; in parallel over tokens), then the
 * rows are cut into chunks that the pool hands out. Within a chunk the
 * tokens are taken DS4_TILE_TOK at a time and each weight row is walked once
 * per tile, so with n_tok tokens every weight byte comes from memory once
 * and from the L2 cache ceil(n_tok / DS4_TILE_TOK) - 1 more times (chunks
 * are sized to stay in L2). For the decode matvec (n_tok == 1) the chunks
 * are small enough to balance the threads; the matvec is bound by memory
 * bandwidth, which is what the kernels are built for.
 *
 * Where the type and level have a GEMM (cpu_gemm.c; AVX2 and AVX-512 for
 * the float types, Q8_0, MXFP4, Q2_K and IQ2_XXS), its arithmetic is the
 * one used for every n_tok: with more than DS4_TILE_TOK tokens (prefill)
 * the weights are packed, with fewer (decode) a fused kernel decodes them
 * in registers and computes the same bits, so no result depends on how
 * many tokens a call had.
 * DS4_CPU_GEMM=0 in the environment selects instead the per-row kernels of
 * kernels_*.c for all calls (the arithmetic before the GEMM, kept to
 * compare against).
 *
 * The kernel level is picked once from the CPU (__builtin_cpu_supports);
 * DS4_SIMD=scalar|avx2|avx512 in the environment caps it (debugging,
 * benchmarks).
 */
#include "backend/cpu/cpu_matmul_kernels.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static const char *const simd_names[] = {"scalar", "avx2", "avx512"};

const char *ds4_cpu_simd_name(ds4_simd_level level)
{
    return (unsigned)level <= DS4_SIMD_AVX512 ? simd_names[level] : "?";
}

int ds4_cpu_simd_supported(ds4_simd_level level)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    switch (level) {
    case DS4_SIMD_SCALAR: return 1;
    case DS4_SIMD_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case DS4_SIMD_AVX512:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512vnni");
    }
    return 0;
#else
    return level == DS4_SIMD_SCALAR;
#endif
}

static atomic_int best_level = -1;

ds4_simd_level ds4_cpu_simd_best(void)
{
    int l = atomic_load(&best_level);
    if (l >= 0) return (ds4_simd_level)l;
    l = DS4_SIMD_SCALAR;
    if (ds4_cpu_simd_supported(DS4_SIMD_AVX512)) l = DS4_SIMD_AVX512;
    else if (ds4_cpu_simd_supported(DS4_SIMD_AVX2)) l = DS4_SIMD_AVX2;
    const char *cap = getenv("DS4_SIMD");
    if (cap) {
        for (int i = 0; i <= DS4_SIMD_AVX512; i++)
            if (!strcmp(cap, simd_names[i]) && i < l) l = i;
    }
    atomic_store(&best_level, l);
    return (ds4_simd_level)l;
}

ds4_dot_fn ds4_cpu_dot_kernel(ds4_type type, ds4_simd_level level)
{
    ds4_dot_fn f = NULL;
    if (level >= DS4_SIMD_AVX512) f = ds4_cpu_dot_avx512(type);
    if (!f && level >= DS4_SIMD_AVX2) f = ds4_cpu_dot_avx2(type);
    if (!f) f = ds4_cpu_dot_scalar(type);
    return f;
}

/* Activation conversion tasks: QUANT_SPAN values of one token each. */
#define QUANT_SPAN 1024
/* Conversions (and token packing, cpu_gemm.c) of at most this many values
 * run on the calling thread. */
#define INLINE_VALUES 16384

struct quant_job {
    ds4_simd_level level;
    ds4_act_kind kind;
    const float *x;
    int64_t cols, parts;
    uint8_t *xa;
    size_t xstride;
};

static void quant_task(void *arg, int64_t i, int thread_index)
{
    (void)thread_index;
    struct quant_job *j = arg;
    int64_t t = i / j->parts, v0 = (i % j->parts) * QUANT_SPAN;
    int64_t v1 = v0 + QUANT_SPAN < j->cols ? v0 + QUANT_SPAN : j->cols;
    ds4_act_quantize_level(j->level, j->kind, j->x + t * j->cols, j->cols, v0, v1, j->xa + (size_t)t * j->xstride);
}

struct mm_job {
    ds4_dot_fn dot;
    const uint8_t *w;
    size_t wrow;
    int64_t rows, cols;
    const uint8_t *xa;
    size_t xstride;
    int64_t n_tok;
    float *y;
    int64_t chunk;
};

static void mm_task(void *arg, int64_t i, int thread_index)
{
    (void)thread_index;
    const struct mm_job *j = arg;
    int64_t r0 = i * j->chunk, r1 = r0 + j->chunk;
    if (r1 > j->rows) r1 = j->rows;
    float tmp[DS4_TILE_TOK];
    for (int64_t t0 = 0; t0 < j->n_tok; t0 += DS4_TILE_TOK) {
        int nt = j->n_tok - t0 < DS4_TILE_TOK ? (int)(j->n_tok - t0) : DS4_TILE_TOK;
        const uint8_t *xt = j->xa + (size_t)t0 * j->xstride;
        for (int64_t r = r0; r < r1; r++) {
            j->dot(j->cols, j->w + (size_t)r * j->wrow, xt, j->xstride, nt, tmp);
            for (int t = 0; t < nt; t++) j->y[(t0 + t) * j->rows + r] = tmp[t];
        }
    }
}

/* Rows per task: enough tasks to balance the threads, few enough that the
 * per-task cost is noise, and for prefill a weight tile that stays in L2. */
static int64_t chunk_rows(int64_t rows, size_t wrow, int64_t n_tok, int n_threads)
{
    int64_t c = rows / ((int64_t)n_threads * 8);
    if (n_tok > DS4_TILE_TOK) {
        int64_t l2 = (int64_t)((256 * 1024) / (wrow ? wrow : 1));
        if (c > l2) c = l2;
    }
    if (c > 256) c = 256;
    return c < 1 ? 1 : c;
}

static atomic_int gemm_on = -1;

int ds4_cpu_gemm_enabled(void)
{
    int on = atomic_load(&gemm_on);
    if (on < 0) {
        const char *e = getenv("DS4_CPU_GEMM");
        on = !(e && !strcmp(e, "0"));
        atomic_store(&gemm_on, on);
    }
    return on;
}

int ds4_cpu_matmul_level(ds4_simd_level level, ds4_threadpool *pool, ds4_type type,
                         const void *w, int64_t rows, int64_t cols, const float *x,
                         int64_t n_tok, float *y)
{
    return ds4_cpu_matmul_path(level, DS4_MM_AUTO, pool, type, w, rows, cols, x, n_tok, y);
}

int ds4_cpu_matmul_path(ds4_simd_level level, ds4_mm_path path, ds4_threadpool *pool,
                        ds4_type type, const void *w, int64_t rows, int64_t cols,
                        const float *x, int64_t n_tok, float *y)
{
    int64_t bv = ds4_cpu_block_values(type);
    ds4_dot_fn dot = ds4_cpu_dot_kernel(type, level);
    if (!ds4_cpu_simd_supported(level)) return -1;
    if (!bv || !dot || rows < 0 || cols <= 0 || n_tok < 0 || cols % bv) return -1;
    if (rows == 0 || n_tok == 0) return 0;

    ds4_act_kind kind = ds4_cpu_act_kind(type);
    size_t xstride = ds4_act_row_bytes(kind, cols);
    uint8_t *xa = NULL;
    if (kind == DS4_ACT_F32) {
        xstride = (size_t)cols * sizeof(float);
    } else {
        xa = ds4_cpu_buf_get(xstride * (size_t)n_tok);
        if (!xa) return -1;
        /* QUANT_SPAN is a multiple of every activation block size, so
         * every part starts on a block and the last one ends the row. */
        int64_t parts = (cols + QUANT_SPAN - 1) / QUANT_SPAN;
        struct quant_job q = {level, kind, x, cols, parts, xa, xstride};
        /* a decode-sized conversion (a few microseconds) on the calling
         * thread: waking the pool for it and waiting costs more */
        ds4_pool_run(n_tok * cols <= INLINE_VALUES ? NULL : pool, n_tok * parts, quant_task, &q);
    }

    size_t wrow = (size_t)(cols / bv) * ds4_cpu_block_bytes(type);
    int legacy = path == DS4_MM_TILES || (path == DS4_MM_AUTO && !ds4_cpu_gemm_enabled());
    const ds4_gemm_ops *g = legacy ? NULL : ds4_cpu_gemm_ops(type, level);
    if (g) {
        int fused = path != DS4_MM_GEMM && n_tok <= DS4_TILE_TOK;
        const void *xin = xa ? xa : (const uint8_t *)x;
        int rc = ds4_cpu_gemm_run(g, fused, pool, w, wrow, rows, cols, xin, xstride, n_tok, y);
        /* no memory for the weight panels: the fused kernel needs none */
        if (rc && !fused) rc = ds4_cpu_gemm_run(g, 1, pool, w, wrow, rows, cols, xin, xstride, n_tok, y);
        ds4_cpu_buf_put(xa);
        return rc;
    }

    struct mm_job j = {
        .dot = dot,
        .w = w,
        .wrow = wrow,
        .rows = rows,
        .cols = cols,
        .xa = xa ? xa : (const uint8_t *)x,
        .xstride = xstride,
        .n_tok = n_tok,
        .y = y,
    };
    j.chunk = chunk_rows(rows, j.wrow, n_tok, ds4_pool_size(pool));
    ds4_pool_run(pool, (rows + j.chunk - 1) / j.chunk, mm_task, &j);
    ds4_cpu_buf_put(xa);
    return 0;
}

void ds4_cpu_matmul(ds4_threadpool *pool, ds4_type type, const void *w, int64_t rows,
                    int64_t cols, const float *x, int64_t n_tok, float *y)
{
    if (ds4_cpu_matmul_level(ds4_cpu_simd_best(), pool, type, w, rows, cols, x, n_tok, y) != 0) {
        /* Unsupported type or shape (the loader checks shapes first): make
         * it loud rather than silently wrong. */
        for (int64_t i = 0; rows > 0 && i < rows * n_tok; i++) y[i] = NAN;
    }
}

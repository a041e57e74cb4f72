/*
 * cpu_gemm.c - the multi-token (prefill) path of ds4_cpu_matmul: packing of
 * the activations, the split of the rows over the thread pool, and the
 * walk of each chunk of rows in register blocks (the kernels and the
 * packed layouts are in gemm_avx2.c / gemm_avx512.c; cpu_matmul_kernels.h
 * says why this path exists).
 *
 * Order of the work: every token is packed once (in parallel over tokens);
 * then each task takes a chunk of rows, packs them into its thread's panel
 * (sized to stay in L2) and sweeps the tokens nt at a time, each block of
 * nt packed tokens (a few KiB) staying in L1 while the chunk's rows stream
 * past it mr at a time. Every weight byte is read from memory once per
 * call and decoded once per call. With few tokens (decode) the rows are
 * not packed: the fused kernel decodes each row in registers for them.
 */
#include "backend/cpu/cpu_matmul_kernels.h"

#include <stdlib.h>

const ds4_gemm_ops *ds4_cpu_gemm_ops(ds4_type type, ds4_simd_level level)
{
    const ds4_gemm_ops *g = NULL;
    if (level >= DS4_SIMD_AVX512) g = ds4_cpu_gemm_avx512(type);
    if (!g && level >= DS4_SIMD_AVX2) g = ds4_cpu_gemm_avx2(type);
    return g;
}

/* Panel budget per thread: a quarter of a 1 MiB L2, so the panel, the
 * packed tokens in use and the outputs share it. */
#define PANEL_BYTES (256 * 1024)

struct gemm_job {
    const ds4_gemm_ops *ops;
    int fused;
    const uint8_t *w;
    size_t wrow;
    int64_t rows, cols;
    const uint8_t *xa; /* activations in the type's dot format */
    size_t xstride;
    void (*pack_x)(int64_t cols, const void *act_row, void *out); /* NULL: none */
    void (*kern)(int64_t cols, const void *w, size_t w_stride, int nr, const void *x, size_t x_stride, int nt,
                 float *y, size_t ldy); /* the fused kernel in use */
    uint8_t *xp; /* packed tokens (or xa itself) */
    size_t xps;
    int64_t n_tok;
    float *y;
    int64_t chunk;
    uint8_t *panels; /* n_slots panels of chunk packed rows */
    size_t wps;
    int n_slots;
};

static void pack_x_task(void *arg, int64_t t, int thread_index)
{
    (void)thread_index;
    const struct gemm_job *j = arg;
    j->pack_x(j->cols, j->xa + (size_t)t * j->xstride, j->xp + (size_t)t * j->xps);
}

static void gemm_task(void *arg, int64_t i, int thread_index)
{
    const struct gemm_job *j = arg;
    const ds4_gemm_ops *o = j->ops;
    int64_t r0 = i * j->chunk, r1 = r0 + j->chunk < j->rows ? r0 + j->chunk : j->rows;
    const uint8_t *wp = j->w + (size_t)r0 * j->wrow;
    size_t ws = j->wrow;
    if (j->fused) {
        for (int64_t t0 = 0; t0 < j->n_tok; t0 += o->fused_nt) {
            int nt = j->n_tok - t0 < o->fused_nt ? (int)(j->n_tok - t0) : o->fused_nt;
            for (int64_t r = r0; r < r1; r += o->fused_mr) {
                int nr = r1 - r < o->fused_mr ? (int)(r1 - r) : o->fused_mr;
                j->kern(j->cols, j->w + (size_t)r * j->wrow, j->wrow, nr, j->xp + (size_t)t0 * j->xps, j->xps, nt,
                         j->y + t0 * j->rows + r, (size_t)j->rows);
            }
        }
        return;
    }
    if (o->pack_w) {
        /* A call's tasks run either on the pool's threads (index < n_slots)
         * or all inline on one thread (any index, but one at a time). */
        uint8_t *panel = j->panels + (size_t)(thread_index % j->n_slots) * (size_t)j->chunk * j->wps;
        for (int64_t r = r0; r < r1; r++) o->pack_w(j->cols, j->w + (size_t)r * j->wrow, panel + (size_t)(r - r0) * j->wps);
        wp = panel;
        ws = j->wps;
    }
    for (int64_t t0 = 0; t0 < j->n_tok; t0 += o->nt) {
        int nt = j->n_tok - t0 < o->nt ? (int)(j->n_tok - t0) : o->nt;
        const uint8_t *xt = j->xp + (size_t)t0 * j->xps;
        for (int64_t r = r0; r < r1; r += o->mr) {
            int nr = r1 - r < o->mr ? (int)(r1 - r) : o->mr;
            o->kernel(j->cols, wp + (size_t)(r - r0) * ws, ws, nr, xt, j->xps, nt, j->y + t0 * j->rows + r,
                      (size_t)j->rows);
        }
    }
}

/* Rows per task: a multiple of mr, small enough that every thread gets
 * several tasks; with packed weights at most a panel's worth. Decode
 * (few tokens, memory-bound) takes chunks of up to 256 rows, as the
 * per-row kernels do: with panel-sized ones (tens of rows) the matvec
 * streamed ~8% slower from DRAM. */
static int64_t gemm_chunk(const ds4_gemm_ops *o, int64_t rows, size_t row_bytes, int n_threads, int64_t n_tok)
{
    int64_t c;
    if (n_tok <= DS4_TILE_TOK) {
        c = rows / ((int64_t)n_threads * 8);
        if (c > 256) c = 256;
    } else {
        int64_t cap = (int64_t)(PANEL_BYTES / (row_bytes ? row_bytes : 1));
        int64_t bal = (rows + 4 * (int64_t)n_threads - 1) / (4 * (int64_t)n_threads);
        c = bal < cap ? bal : cap;
    }
    c = (c + o->mr - 1) / o->mr * o->mr;
    return c < o->mr ? o->mr : c;
}

int ds4_cpu_gemm_run(const ds4_gemm_ops *ops, int fused, ds4_threadpool *pool, const void *w,
                     size_t wrow, int64_t rows, int64_t cols, const void *xa, size_t xstride,
                     int64_t n_tok, float *y)
{
    struct gemm_job j = {
        .ops = ops,
        .fused = fused && ops->fused,
        .w = w,
        .wrow = wrow,
        .rows = rows,
        .cols = cols,
        .xa = xa,
        .xstride = xstride,
        .xp = (uint8_t *)xa,
        .xps = xstride,
        .n_tok = n_tok,
        .y = y,
        .n_slots = ds4_pool_size(pool),
    };
    int own = j.fused && ops->fused_own && n_tok <= ops->fused_own_nt;
    j.kern = own ? ops->fused_own : ops->fused;
    j.pack_x = own ? ops->fused_pack_x : ops->pack_x;
    if (j.pack_x) {
        j.xps = own ? ops->fused_x_bytes(cols) : ops->x_bytes(cols);
        j.xp = ds4_cpu_buf_get(j.xps * (size_t)n_tok);
        if (!j.xp) return -1;
        /* decode-sized: on the calling thread (see cpu_matmul.c) */
        ds4_pool_run(n_tok * cols <= 16384 ? NULL : pool, n_tok, pack_x_task, &j);
    }
    int packed = ops->pack_w && !j.fused;
    j.wps = packed ? ops->w_bytes(cols) : wrow;
    j.chunk = gemm_chunk(ops, rows, j.wps, j.n_slots, n_tok);
    if (packed) {
        j.panels = ds4_cpu_buf_get((size_t)j.n_slots * (size_t)j.chunk * j.wps);
        if (!j.panels) {
            if (j.pack_x) ds4_cpu_buf_put(j.xp);
            return -1;
        }
    }
    ds4_pool_run(pool, (rows + j.chunk - 1) / j.chunk, gemm_task, &j);
    ds4_cpu_buf_put(j.panels);
    if (j.pack_x) ds4_cpu_buf_put(j.xp);
    return 0;
}

/* ---- one-token products for a shared region (cpu_matmul_kernels.h) ---- */

static const ds4_gemm_ops *mv_ops(ds4_type type)
{
    if (!ds4_cpu_gemm_enabled()) return NULL;
    const ds4_gemm_ops *o = ds4_cpu_gemm_ops(type, ds4_cpu_simd_best());
    return o && o->fused ? o : NULL;
}

static int mv_own(const ds4_gemm_ops *o) { return o->fused_own && o->fused_own_nt >= 1; }

size_t ds4_cpu_mv_bytes(ds4_type type, int64_t cols)
{
    const ds4_gemm_ops *o = mv_ops(type);
    int64_t bv = ds4_cpu_block_values(type);
    if (!o || !bv || cols <= 0 || cols % bv) return 0;
    size_t act = ds4_act_row_bytes(ds4_cpu_act_kind(type), cols);
    size_t packed = mv_own(o) ? o->fused_x_bytes(cols) : o->pack_x ? o->x_bytes(cols) : 0;
    return act + ((packed + 63) & ~(size_t)63);
}

void ds4_cpu_mv_pack(ds4_type type, int64_t cols, const float *x, void *buf, ds4_mv_token *tok)
{
    const ds4_gemm_ops *o = mv_ops(type);
    ds4_act_kind kind = ds4_cpu_act_kind(type);
    size_t act = ds4_act_row_bytes(kind, cols);
    uint8_t *xa = buf, *xp = xa + act;
    /* the bytes ds4_cpu_matmul makes for one token */
    const uint8_t *row = (const uint8_t *)x;
    if (kind != DS4_ACT_F32) {
        ds4_act_quantize_level(ds4_cpu_simd_best(), kind, x, cols, 0, cols, xa);
        row = xa;
    }
    void (*pack)(int64_t, const void *, void *) = mv_own(o) ? o->fused_pack_x : o->pack_x;
    if (pack) pack(cols, row, xp);
    tok->kern = mv_own(o) ? o->fused_own : o->fused;
    tok->cols = cols;
    tok->wrow = (size_t)(cols / ds4_cpu_block_values(type)) * ds4_cpu_block_bytes(type);
    tok->xp = pack ? xp : row;
}

void ds4_cpu_mv_rows(const ds4_mv_token *tok, const void *w, int64_t r0, int64_t r1, float *y)
{
    const uint8_t *wb = w;
    for (int64_t r = r0; r < r1; r++) tok->kern(tok->cols, wb + (size_t)r * tok->wrow, tok->wrow, 1, tok->xp, 0, 1, y + (r - r0), 1);
}

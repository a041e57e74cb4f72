/*
 * test_matmul_gemm.c - the prefill GEMM path of the CPU matmul
 * (backend/cpu/cpu_gemm.c, gemm_avx2.c, gemm_avx512.c) and the SIMD
 * activation quantizers (act_avx2.c, act_avx512.c).
 *
 * The GEMM is forced (DS4_MM_GEMM) at every SIMD level that has one for the
 * type, on rows made with quant/'s quantizer, and each output is compared
 * with the double dot product of quant/'s dequantized row and the f32
 * activations. The bound follows from the activation formats: Q8_0 / Q8_K
 * round each activation to a step d = amax / 127 of its block (32 / 256
 * values; Q8_0 then stores d as f16, 2^-11 relative), so an output moves by
 * at most sum |deq_i| * 0.5 d_i (1.07x for the f16 scale; 0.6 is used),
 * plus float summation, 2e-6 of S = sum |deq_i * x_i| (the float types'
 * whole bound). Shapes are odd on purpose: row
 * counts that are not multiples of the row block, token counts from 5 to 70
 * that are not multiples of the token block, row lengths that end inside a
 * packed group. The GEMM must also give the per-row (tile) kernels' numbers
 * up to float summation order, the same bytes with any thread count, 0 for
 * zero activations, and keep a NaN token to itself. The few-token kernels
 * of gemv_avx512.c (Q8_0, IQ2_XXS, Q2_K) must give the packed GEMM's bits,
 * called directly and through decode's paths, at the model's shapes.
 *
 * The SIMD quantizers must give exactly the bytes of the scalar ones
 * (which tests/test_matmul.c checks against ggml's), on random rows and on
 * ties, zeros, subnormals, infinities and NaNs.
 */
#include "backend/cpu/cpu_matmul_kernels.h"
#include "quant/quant.h"
#include "tests/test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint32_t rng = 12345u;
static float rnd_unit(void) /* in [-1, 1], 1e-3 steps */
{
    rng = rng * 1664525u + 1013904223u;
    return (float)((int)(rng >> 9) % 2001 - 1000) * 1e-3f;
}

static double dot_double(const float *a, const float *b, int64_t n, double *abs_sum)
{
    double s = 0, as = 0;
    for (int64_t i = 0; i < n; i++) {
        s += (double)a[i] * b[i];
        as += fabs((double)a[i] * b[i]);
    }
    *abs_sum = as;
    return s;
}

static const struct {
    ds4_type type;
    const char *name;
    int64_t cols[3]; /* row lengths: several end inside a packed group */
} types[] = {
    {DS4_TYPE_F32, "f32", {1, 17, 4099}},
    {DS4_TYPE_F16, "f16", {7, 16, 2053}},
    {DS4_TYPE_BF16, "bf16", {9, 31, 1030}},
    {DS4_TYPE_Q8_0, "q8_0", {32, 544, 4128}},
    {DS4_TYPE_MXFP4, "mxfp4", {96, 512, 2080}},
    {DS4_TYPE_Q2_K, "q2_K", {256, 768, 2048}},
    {DS4_TYPE_IQ2_XXS, "iq2_xxs", {256, 1280, 4096}},
    {DS4_TYPE_Q4_K, "q4_K", {256, 768, 1024}}, /* no GEMM: falls back to tiles */
};

/* (rows, tokens) pairs: every residue of the row blocks (2, 4) and token
 * blocks (2, 4), and the token counts a 128-token prefill chunk gives
 * the routed experts. */
static const int shapes[][2] = {{1, 5}, {2, 6}, {3, 7}, {4, 8}, {5, 9}, {7, 13}, {13, 17},
                                {37, 31}, {6, 64}, {9, 70}, {37, 70}, {11, 47}};
#define MAX_ROWS 37
#define MAX_TOK 70

typedef struct {
    int64_t n, rb;
    uint8_t *w;    /* MAX_ROWS quantized rows */
    float *deq;    /* their dequantization */
    float *x;      /* MAX_TOK tokens */
    double *ref;   /* [t * MAX_ROWS + r] double dot */
    double *S;     /* and its scale */
    double *bound; /* and the error bound */
} problem;

static int make_problem(ds4_type type, int64_t n, problem *p)
{
    memset(p, 0, sizeof(*p));
    p->n = n;
    p->rb = ds4_row_bytes(type, n);
    float *src = malloc(sizeof(float) * (size_t)(n * MAX_ROWS)), *im = malloc(sizeof(float) * (size_t)n);
    p->w = malloc((size_t)(p->rb * MAX_ROWS));
    p->deq = malloc(sizeof(float) * (size_t)(n * MAX_ROWS));
    p->x = malloc(sizeof(float) * (size_t)(n * MAX_TOK));
    p->ref = malloc(sizeof(double) * MAX_ROWS * MAX_TOK);
    p->S = malloc(sizeof(double) * MAX_ROWS * MAX_TOK);
    p->bound = malloc(sizeof(double) * MAX_ROWS * MAX_TOK);
    double *step = malloc(sizeof(double) * (size_t)n);
    int ok = src && im && p->w && p->deq && p->x && p->ref && p->S && p->bound && step && p->rb > 0;
    ds4_act_kind kind = ds4_cpu_act_kind(type);
    int64_t blk = kind == DS4_ACT_Q8_0 ? 32 : kind == DS4_ACT_Q8_K ? 256 : 0;
    if (ok) {
        for (int64_t i = 0; i < n * MAX_ROWS; i++) src[i] = rnd_unit();
        /* tokens of different magnitudes (the Q8 scales differ per block
         * and per token) */
        for (int t = 0; t < MAX_TOK; t++)
            for (int64_t i = 0; i < n; i++) p->x[t * n + i] = rnd_unit() * (1.0f + 0.5f * (float)(t % 5));
        for (int64_t i = 0; i < n; i++) im[i] = 1.0f;
        ok = ds4_quantize_rows(type, src, p->w, MAX_ROWS, n, im) == DS4_OK;
        for (int r = 0; ok && r < MAX_ROWS; r++)
            ok = ds4_dequantize_row(type, p->w + r * p->rb, p->deq + r * n, n) == DS4_OK;
        for (int t = 0; ok && t < MAX_TOK; t++) {
            const float *xt = p->x + t * n;
            for (int64_t i = 0; i < n; i++) step[i] = 0;
            for (int64_t b0 = 0; blk && b0 < n; b0 += blk) {
                double amax = 0;
                for (int64_t i = b0; i < b0 + blk; i++) amax = fabs(xt[i]) > amax ? fabs(xt[i]) : amax;
                for (int64_t i = b0; i < b0 + blk; i++) step[i] = amax / 127;
            }
            for (int r = 0; r < MAX_ROWS; r++) {
                double *S = &p->S[t * MAX_ROWS + r], q = 0;
                p->ref[t * MAX_ROWS + r] = dot_double(p->deq + r * n, xt, n, S);
                for (int64_t i = 0; i < n; i++) q += fabs((double)p->deq[r * n + i]) * step[i];
                p->bound[t * MAX_ROWS + r] = 0.6 * q + 2e-6 * *S;
            }
        }
    }
    free(src), free(im), free(step);
    return ok ? 0 : -1;
}

static void free_problem(problem *p)
{
    free(p->w), free(p->deq), free(p->x), free(p->ref), free(p->S), free(p->bound);
}

static int has_level(ds4_simd_level l)
{
    return ds4_cpu_simd_supported(l);
}

/* Worst errors per type (printed, so the bounds can be judged): vs the
 * double product as a fraction of the bound, vs the tiles relative to S. */
static double worst_ref[64], worst_tiles[64];

static void check_type(size_t k)
{
    ds4_type type = types[k].type;
    for (int c = 0; c < 3; c++) {
        problem p;
        if (make_problem(type, types[k].cols[c], &p)) {
            test_fail_at(__FILE__, __LINE__, "%s cols %lld: cannot make the problem", types[k].name,
                         (long long)types[k].cols[c]);
            free_problem(&p);
            continue;
        }
        float *y = malloc(sizeof(float) * MAX_ROWS * MAX_TOK), *yt = malloc(sizeof(float) * MAX_ROWS * MAX_TOK);
        REQUIRE(y && yt);
        for (int l = DS4_SIMD_AVX2; l <= DS4_SIMD_AVX512; l++) {
            if (!has_level((ds4_simd_level)l)) continue;
            int bad = 0;
            for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
                int rows = shapes[s][0], nt = shapes[s][1];
                EXPECT(ds4_cpu_matmul_path((ds4_simd_level)l, DS4_MM_GEMM, NULL, type, p.w, rows, p.n, p.x, nt, y) == 0);
                EXPECT(ds4_cpu_matmul_path((ds4_simd_level)l, DS4_MM_TILES, NULL, type, p.w, rows, p.n, p.x, nt, yt) == 0);
                for (int t = 0; t < nt; t++)
                    for (int r = 0; r < rows; r++) {
                        double S = p.S[t * MAX_ROWS + r];
                        double e = fabs(y[t * rows + r] - p.ref[t * MAX_ROWS + r]) / p.bound[t * MAX_ROWS + r];
                        double et = fabs((double)y[t * rows + r] - yt[t * rows + r]) / S;
                        if (e > worst_ref[type]) worst_ref[type] = e;
                        if (et > worst_tiles[type]) worst_tiles[type] = et;
                        if ((e > 1.0 || et > 1e-5) && bad++ < 3)
                            test_fail_at(__FILE__, __LINE__,
                                         "%s cols %lld %s rows %d n_tok %d: t %d r %d: %.9g vs double %.9g "
                                         "(%.3g of the bound), tiles %.9g (rel %.3g)",
                                         types[k].name, (long long)p.n, ds4_cpu_simd_name((ds4_simd_level)l), rows,
                                         nt, t, r, y[t * rows + r], p.ref[t * MAX_ROWS + r], e, yt[t * rows + r], et);
                    }
            }
        }
        free(y), free(yt);
        free_problem(&p);
    }
}

static void test_gemm_vs_double_every_type_and_level(void)
{
    if (!has_level(DS4_SIMD_AVX2)) {
        test_skip("no AVX2 on this CPU: no GEMM path");
        return;
    }
    for (size_t k = 0; k < sizeof(types) / sizeof(types[0]); k++) check_type(k);
    for (size_t k = 0; k < sizeof(types) / sizeof(types[0]); k++)
        printf("  %-7s worst error vs double %.3g of the bound, vs tiles %.3g of S\n", types[k].name, worst_ref[types[k].type],
               worst_tiles[types[k].type]);
}

/* The GEMM has a kernel for every type the model prefill runs through it,
 * at both levels (a missing table entry would silently fall back). */
static void test_gemm_tables(void)
{
    const ds4_type with[] = {DS4_TYPE_F32, DS4_TYPE_F16, DS4_TYPE_BF16, DS4_TYPE_Q8_0,
                             DS4_TYPE_MXFP4, DS4_TYPE_Q2_K, DS4_TYPE_IQ2_XXS};
    for (size_t i = 0; i < sizeof(with) / sizeof(with[0]); i++) {
        EXPECT_MSG(ds4_cpu_gemm_avx2(with[i]) != NULL, "type %d: no AVX2 GEMM", with[i]);
        EXPECT_MSG(ds4_cpu_gemm_avx512(with[i]) != NULL, "type %d: no AVX-512 GEMM", with[i]);
    }
    EXPECT(ds4_cpu_gemm_ops(DS4_TYPE_Q8_0, DS4_SIMD_SCALAR) == NULL);
    EXPECT(ds4_cpu_gemm_ops(DS4_TYPE_Q4_K, DS4_SIMD_AVX512) == NULL);
}

/* Same bytes whatever the pool (rows are cut into chunks per thread). */
static void test_gemm_thread_count_independent(void)
{
    const ds4_type tys[] = {DS4_TYPE_Q8_0, DS4_TYPE_IQ2_XXS, DS4_TYPE_Q2_K, DS4_TYPE_F16};
    const int64_t n = 1024, rows = 203, nt = 19;
    ds4_threadpool *p3 = ds4_pool_create(3), *p4 = ds4_pool_create(4);
    float *src = malloc(sizeof(float) * n * rows), *x = malloc(sizeof(float) * n * nt), im[1024];
    float *y0 = malloc(sizeof(float) * rows * nt), *y3 = malloc(sizeof(float) * rows * nt),
          *y4 = malloc(sizeof(float) * rows * nt);
    uint8_t *w = malloc(4 * n * rows);
    REQUIRE(p3 && p4 && src && x && y0 && y3 && y4 && w);
    for (int64_t i = 0; i < n * rows; i++) src[i] = rnd_unit();
    for (int64_t i = 0; i < n * nt; i++) x[i] = rnd_unit();
    for (int64_t i = 0; i < n; i++) im[i] = 1.0f;
    for (size_t k = 0; k < sizeof(tys) / sizeof(tys[0]); k++) {
        REQUIRE(ds4_quantize_rows(tys[k], src, w, rows, n, im) == DS4_OK);
        for (int l = DS4_SIMD_AVX2; l <= DS4_SIMD_AVX512; l++) {
            if (!has_level((ds4_simd_level)l)) continue;
            EXPECT(ds4_cpu_matmul_path((ds4_simd_level)l, DS4_MM_GEMM, NULL, tys[k], w, rows, n, x, nt, y0) == 0);
            EXPECT(ds4_cpu_matmul_path((ds4_simd_level)l, DS4_MM_GEMM, p3, tys[k], w, rows, n, x, nt, y3) == 0);
            EXPECT(ds4_cpu_matmul_path((ds4_simd_level)l, DS4_MM_GEMM, p4, tys[k], w, rows, n, x, nt, y4) == 0);
            EXPECT_MSG(!memcmp(y0, y3, sizeof(float) * rows * nt) && !memcmp(y0, y4, sizeof(float) * rows * nt),
                       "type %d %s: GEMM result depends on the thread count", tys[k],
                       ds4_cpu_simd_name((ds4_simd_level)l));
        }
    }
    ds4_pool_destroy(p3);
    ds4_pool_destroy(p4);
    free(src), free(x), free(y0), free(y3), free(y4), free(w);
}

/* The row kernels used for few tokens (and decode) give the GEMM's bits:
 * the same token in a call of 1, 2, 3 or 4 tokens and in one of many. */
static void test_gemm_same_bits_any_n_tok(void)
{
    for (size_t k = 0; k < sizeof(types) / sizeof(types[0]); k++) {
        ds4_type type = types[k].type;
        for (int c = 0; c < 3; c++) {
            problem p;
            if (make_problem(type, types[k].cols[c], &p)) {
                test_fail_at(__FILE__, __LINE__, "%s: cannot make the problem", types[k].name);
                free_problem(&p);
                continue;
            }
            const int rows = 13, nt = 23;
            float yg[13 * 23], ya[13 * 23], y1[13 * 4];
            for (int l = DS4_SIMD_AVX2; l <= DS4_SIMD_AVX512; l++) {
                if (!has_level((ds4_simd_level)l)) continue;
                EXPECT(ds4_cpu_matmul_path((ds4_simd_level)l, DS4_MM_GEMM, NULL, type, p.w, rows, p.n, p.x, nt, yg) == 0);
                /* AUTO in calls of 1, 2, 3, 4, 1, 2, ... tokens */
                for (int t0 = 0, step = 1; t0 < nt; t0 += step, step = step % 4 + 1) {
                    int m = nt - t0 < step ? nt - t0 : step;
                    EXPECT(ds4_cpu_matmul_path((ds4_simd_level)l, DS4_MM_AUTO, NULL, type, p.w, rows, p.n,
                                               p.x + t0 * p.n, m, y1) == 0);
                    memcpy(ya + t0 * rows, y1, sizeof(float) * (size_t)(m * rows));
                }
                int diff = 0;
                while (diff < rows * nt && !memcmp(&yg[diff], &ya[diff], sizeof(float))) diff++;
                EXPECT_MSG(diff == rows * nt, "%s cols %lld %s: t %d r %d: GEMM %.9g, row kernel %.9g", types[k].name,
                           (long long)p.n, ds4_cpu_simd_name((ds4_simd_level)l), diff / rows, diff % rows,
                           diff < rows * nt ? yg[diff] : 0.0f, diff < rows * nt ? ya[diff] : 0.0f);
            }
            free_problem(&p);
        }
    }
}

/* Zero activations give exactly 0; a NaN or an inf in one token stays in
 * that token's outputs (the other tokens share packed groups with it). */
static void test_gemm_degenerate_tokens(void)
{
    const ds4_type tys[] = {DS4_TYPE_F32, DS4_TYPE_F16, DS4_TYPE_BF16, DS4_TYPE_Q8_0,
                            DS4_TYPE_MXFP4, DS4_TYPE_Q2_K, DS4_TYPE_IQ2_XXS};
    const int64_t n = 512, rows = 5, nt = 7;
    float src[512 * 5], x[512 * 7], im[512], y[5 * 7];
    uint8_t w[4 * 512 * 5];
    for (int64_t i = 0; i < n * rows; i++) src[i] = (float)((i * 37) % 19) - 9.0f;
    for (int64_t i = 0; i < n; i++) im[i] = 1.0f;
    for (int64_t i = 0; i < n * nt; i++) x[i] = 0.0f;
    x[1 * n + 5] = NAN;
    x[2 * n + 300] = INFINITY;
    for (size_t k = 0; k < sizeof(tys) / sizeof(tys[0]); k++) {
        REQUIRE(ds4_quantize_rows(tys[k], src, w, rows, n, im) == DS4_OK);
        for (int l = DS4_SIMD_AVX2; l <= DS4_SIMD_AVX512; l++) {
            if (!has_level((ds4_simd_level)l)) continue;
            EXPECT(ds4_cpu_matmul_path((ds4_simd_level)l, DS4_MM_GEMM, NULL, tys[k], w, rows, n, x, nt, y) == 0);
            for (int t = 0; t < nt; t++)
                for (int r = 0; r < rows; r++)
                    if (t != 1 && t != 2)
                        EXPECT_MSG(y[t * rows + r] == 0.0f, "type %d %s t %d r %d: zero token gave %g", tys[k],
                                   ds4_cpu_simd_name((ds4_simd_level)l), t, r, y[t * rows + r]);
        }
    }
}

/* ---- the few-token kernels of gemv_avx512.c ----------------------------
 *
 * Where the AVX-512 GEMM of a type has a kernel of gemv_avx512.c (fused_own:
 * Q8_0, IQ2_XXS, Q2_K), each of its results must have the bits of the
 * GEMM's packed path (DS4_MM_GEMM: weights packed, microkernel), for every
 * token count the kernel takes (1-4, odd ones included), on rows made by
 * the quantizer and, for Q2_K, on blocks of random bytes (every scale, min
 * and 2-bit value; finite d, dmin, zero and subnormal ones included), at
 * the model's shapes (Q2_K: the routed experts' down projection, 4096 rows
 * of 2048) and at row lengths that end in a lone super-block. The kernel is
 * called directly (one row per call) and through the paths decode uses:
 * ds4_cpu_matmul (AUTO) and the shared-region ds4_cpu_mv_rows. */

/* n bytes of the test's LCG stream */
static void fill_random_bytes(uint8_t *w, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        rng = rng * 1664525u + 1013904223u;
        w[i] = (uint8_t)(rng >> 24);
    }
}

static void fill_random_q2_K(uint8_t *w, int64_t nblocks)
{
    fill_random_bytes(w, nblocks * (int64_t)sizeof(block_q2_K));
    for (int64_t i = 0; i < nblocks; i++) {
        block_q2_K *b = (block_q2_K *)w + i;
        b->d &= 0xbfff; /* exponent < 31: finite */
        b->dmin &= 0xbfff;
        if (i % 29 == 3) b->d = 0;
        if (i % 31 == 5) b->dmin = 0x0003; /* subnormal */
        if (i % 37 == 7) b->d = 0x8001;
    }
}

/* Random IQ2_XXS blocks: every grid index, sign field and scale nibble
 * occurs (quantized weights use only some), with finite scales. */
static void fill_random_iq2_xxs(uint8_t *w, int64_t nblocks)
{
    fill_random_bytes(w, nblocks * (int64_t)sizeof(block_iq2_xxs));
    for (int64_t i = 0; i < nblocks; i++) {
        block_iq2_xxs *b = (block_iq2_xxs *)w + i;
        b->d &= 0xbfff; /* exponent < 31: finite */
        if (i % 29 == 3) b->d = 0;
        if (i % 37 == 7) b->d = 0x8001; /* subnormal, negative */
    }
}

static int gemv_case(ds4_type type, const ds4_gemm_ops *o, const uint8_t *w, int64_t rows, int64_t cols,
                     const float *x, int nt, const char *what)
{
    const int64_t rb = ds4_row_bytes(type, cols);
    const ds4_act_kind kind = ds4_cpu_act_kind(type);
    const size_t ab = ds4_act_row_bytes(kind, cols), xps = o->fused_x_bytes(cols);
    float *yg = malloc(sizeof(float) * (size_t)(rows * nt)), *yk = malloc(sizeof(float) * (size_t)(rows * nt));
    float *ya = malloc(sizeof(float) * (size_t)(rows * nt));
    uint8_t *xa = malloc(ab * (size_t)nt), *xp = malloc(xps * (size_t)nt + 64);
    int bad = 0;
    if (!yg || !yk || !ya || !xa || !xp) {
        test_fail_at(__FILE__, __LINE__, "out of memory");
        bad = 1;
        goto out;
    }
    EXPECT(ds4_cpu_matmul_path(DS4_SIMD_AVX512, DS4_MM_GEMM, NULL, type, w, rows, cols, x, nt, yg) == 0);
    /* the kernel itself, one row per call */
    for (int t = 0; t < nt; t++) {
        ds4_act_quantize(kind, x + (size_t)t * (size_t)cols, cols, xa + (size_t)t * ab);
        o->fused_pack_x(cols, xa + (size_t)t * ab, xp + (size_t)t * xps);
    }
    memset(yk, 0xff, sizeof(float) * (size_t)(rows * nt));
    for (int64_t r = 0; r < rows; r++) o->fused_own(cols, w + r * rb, (size_t)rb, 1, xp, xps, nt, yk + r, (size_t)rows);
    /* decode's paths */
    EXPECT(ds4_cpu_matmul_path(DS4_SIMD_AVX512, DS4_MM_AUTO, NULL, type, w, rows, cols, x, nt, ya) == 0);
    for (int64_t i = 0; i < rows * nt && bad < 3; i++) {
        if (!memcmp(&yg[i], &yk[i], sizeof(float)) && !memcmp(&yg[i], &ya[i], sizeof(float))) continue;
        test_fail_at(__FILE__, __LINE__, "%s %s %lld x %lld, %d tokens: t %lld r %lld: GEMM %.9g, gemv kernel %.9g, AUTO %.9g",
                     ds4_cpu_simd_name(DS4_SIMD_AVX512), what, (long long)rows, (long long)cols, nt,
                     (long long)(i / rows), (long long)(i % rows), yg[i], yk[i], ya[i]);
        bad++;
    }
    if (nt == 1 && ds4_cpu_simd_best() == DS4_SIMD_AVX512) {
        size_t mb = ds4_cpu_mv_bytes(type, cols);
        uint8_t *buf = mb ? malloc(mb + 64) : NULL;
        EXPECT_MSG(buf != NULL, "%s: no one-token path (ds4_cpu_mv_bytes %zu)", what, mb);
        if (buf) {
            ds4_mv_token tok;
            ds4_cpu_mv_pack(type, cols, x, buf, &tok);
            EXPECT_MSG(tok.kern == o->fused_own, "%s: the shared-region path does not take the gemv kernel", what);
            int64_t r0 = rows / 3;
            ds4_cpu_mv_rows(&tok, w, r0, rows, ya);
            for (int64_t r = r0; r < rows && bad < 3; r++)
                if (memcmp(&ya[r - r0], &yg[r], sizeof(float))) {
                    test_fail_at(__FILE__, __LINE__, "%s %lld x %lld: ds4_cpu_mv_rows row %lld: %.9g, GEMM %.9g", what,
                                 (long long)rows, (long long)cols, (long long)r, ya[r - r0], yg[r]);
                    bad++;
                }
            free(buf);
        }
    }
out:
    free(yg), free(yk), free(ya), free(xa), free(xp);
    return bad;
}

static void test_gemv_kernels_same_bits_as_gemm(void)
{
    if (!has_level(DS4_SIMD_AVX512)) {
        test_skip("no AVX-512 (VNNI) on this CPU: no gemv kernels");
        return;
    }
    const char *env = getenv("DS4_CPU_GEMV");
    if (env && !strcmp(env, "0")) {
        test_skip("DS4_CPU_GEMV=0: the gemv kernels are off");
        return;
    }
    static const struct {
        ds4_type type;
        const char *name;
        int64_t rows, cols;
        int random_blocks;
    } cases[] = {
        {DS4_TYPE_Q2_K, "q2_K", 4096, 2048, 0}, /* Flash's routed down projection */
        {DS4_TYPE_Q2_K, "q2_K random blocks", 4096, 2048, 1},
        {DS4_TYPE_Q2_K, "q2_K", 37, 256, 0},   /* one group, a lone super-block */
        {DS4_TYPE_Q2_K, "q2_K random blocks", 5, 768, 1}, /* the last group's lone */
        {DS4_TYPE_Q2_K, "q2_K random blocks", 13, 4096, 1},
        {DS4_TYPE_Q2_K, "q2_K", 3, 6400, 0},
        {DS4_TYPE_IQ2_XXS, "iq2_xxs", 41, 4096, 0},
        {DS4_TYPE_IQ2_XXS, "iq2_xxs", 7, 768, 0},
        {DS4_TYPE_IQ2_XXS, "iq2_xxs random blocks", 2048, 4096, 1}, /* Flash's routed gate / up */
        {DS4_TYPE_IQ2_XXS, "iq2_xxs random blocks", 5, 1280, 1},   /* the last group's lone */
        {DS4_TYPE_Q8_0, "q8_0", 39, 4096, 0},
        {DS4_TYPE_Q8_0, "q8_0", 9, 544, 0},
    };
    /* which types must have one: the CPU features gemv_avx512.c checks */
    const int vbmi = __builtin_cpu_supports("avx512vbmi"), gfni = __builtin_cpu_supports("gfni");
    int ran_q2 = 0;
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        ds4_type type = cases[k].type;
        const ds4_gemm_ops *o = ds4_cpu_gemm_avx512(type);
        REQUIRE(o);
        int want = type == DS4_TYPE_Q8_0 || (type == DS4_TYPE_IQ2_XXS && vbmi) || (type == DS4_TYPE_Q2_K && vbmi && gfni);
        EXPECT_MSG(!want || (o->fused_own && o->fused_pack_x && o->fused_x_bytes && o->fused_own_nt >= 1),
                   "%s: this CPU runs its gemv kernel but the GEMM table has none", cases[k].name);
        if (!o->fused_own) continue;
        const int64_t rows = cases[k].rows, cols = cases[k].cols, rb = ds4_row_bytes(type, cols);
        uint8_t *w = malloc((size_t)(rb * rows));
        float *src = malloc(sizeof(float) * (size_t)(rows * cols)), *im = malloc(sizeof(float) * (size_t)cols);
        float *x = malloc(sizeof(float) * (size_t)(4 * cols));
        REQUIRE(w && src && im && x);
        if (cases[k].random_blocks) {
            if (type == DS4_TYPE_Q2_K) fill_random_q2_K(w, rows * cols / QK_K);
            else fill_random_iq2_xxs(w, rows * cols / QK_K);
        } else {
            for (int64_t i = 0; i < rows * cols; i++) src[i] = rnd_unit() * (1.0f + (float)(i / cols % 7));
            for (int64_t i = 0; i < cols; i++) im[i] = 1.0f;
            REQUIRE(ds4_quantize_rows(type, src, w, rows, cols, im) == DS4_OK);
        }
        for (int t = 0; t < 4; t++)
            for (int64_t i = 0; i < cols; i++) x[t * cols + i] = rnd_unit() * (0.25f + (float)t);
        for (int nt = 1; nt <= o->fused_own_nt && nt <= 4; nt++) gemv_case(type, o, w, rows, cols, x, nt, cases[k].name);
        ran_q2 |= type == DS4_TYPE_Q2_K;
        free(w), free(src), free(im), free(x);
    }
    if (!ran_q2) printf("  (no Q2_K gemv kernel on this CPU: needs AVX-512 VBMI and GFNI)\n");
}

/* ---- SIMD activation quantizers ---------------------------------------- */

static void fill_edge_row(float *x, int64_t n, int kind)
{
    for (int64_t i = 0; i < n; i++) {
        float v = rnd_unit();
        switch (kind) {
        case 0: x[i] = v; break;                                   /* plain */
        case 1: x[i] = v * 1e-38f; break;                          /* subnormal range */
        case 2: x[i] = v * 3e38f; break;                           /* f16 scale overflows */
        case 3: x[i] = (float)((int)(v * 1000) % 255 - 127) * 0.5f; break; /* ties of x / d */
        case 4: x[i] = (i % 41 == 3) ? (float)(i % 3) - 1.0f : 0.0f; break; /* sparse, zero blocks */
        case 5: x[i] = (i % 64 == 7) ? -4.0f : (i % 64 == 20 ? 4.0f : v); break; /* +-amax ties */
        default: { /* NaNs with payloads, infinities, -0 */
            uint32_t bits = 0x7f800001u + (uint32_t)(i * 2654435761u % 0x7fffffu);
            float nan;
            memcpy(&nan, &bits, 4);
            x[i] = i % 53 == 0 ? nan : i % 71 == 0 ? -INFINITY : i % 89 == 0 ? -0.0f : v;
        }
        }
    }
}

static void test_simd_quantizers_match_scalar(void)
{
    const int64_t n = 4096;
    float *x = malloc(sizeof(float) * n);
    uint8_t *a = malloc(ds4_act_row_bytes(DS4_ACT_Q8_K, n) + ds4_act_row_bytes(DS4_ACT_Q8_0, n));
    uint8_t *b = malloc(ds4_act_row_bytes(DS4_ACT_Q8_K, n) + ds4_act_row_bytes(DS4_ACT_Q8_0, n));
    REQUIRE(x && a && b);
    const ds4_act_kind kinds[] = {DS4_ACT_Q8_0, DS4_ACT_Q8_K};
    for (int e = 0; e < 7; e++)
        for (int rep = 0; rep < 4; rep++) {
            fill_edge_row(x, n, e);
            for (int k = 0; k < 2; k++) {
                size_t bytes = ds4_act_row_bytes(kinds[k], n);
                memset(a, 0x55, bytes);
                memset(b, 0x55, bytes);
                ds4_act_quantize_part(kinds[k], x, n, 0, n, a);
                for (int l = DS4_SIMD_AVX2; l <= DS4_SIMD_AVX512; l++) {
                    if (!has_level((ds4_simd_level)l)) continue;
                    ds4_act_quantize_level((ds4_simd_level)l, kinds[k], x, n, 0, n, b);
                    size_t first = 0;
                    while (first < bytes && a[first] == b[first]) first++;
                    EXPECT_MSG(first == bytes, "%s %s rows of kind %d: byte %zu differs from scalar (%d vs %d)",
                               k ? "q8_K" : "q8_0", ds4_cpu_simd_name((ds4_simd_level)l), e, first,
                               first < bytes ? b[first] : 0, first < bytes ? a[first] : 0);
                }
            }
        }
    free(x), free(a), free(b);
}

int main(void)
{
    printf("  simd levels: best %s\n", ds4_cpu_simd_name(ds4_cpu_simd_best()));
    RUN(test_gemm_tables);
    RUN(test_simd_quantizers_match_scalar);
    RUN(test_gemm_vs_double_every_type_and_level);
    RUN(test_gemm_same_bits_any_n_tok);
    RUN(test_gemm_thread_count_independent);
    RUN(test_gemm_degenerate_tokens);
    RUN(test_gemv_kernels_same_bits_as_gemm);
    return test_finish();
}

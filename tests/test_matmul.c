/*
 * test_matmul.c - the CPU matmul kernels against dequantize-then-dot in
 * double, on ggml's fixture rows (tests/data/quants/ *.bin).
 *
 * For every fixture file and every SIMD level this CPU runs (each forced in
 * turn) the matvec of the 8 quantized rows with the fixture's activation y
 * is compared with dot_exact (sum of ggml's own dequantization times y, in
 * double) and with dot_ggml (ggml's vec_dot, which quantizes y the same way
 * we do for the quantized types). Errors are measured relative to
 * S = sum |deq_i * y_i| (the scale of the float rounding and of the
 * activation quantization error); the bound per type is in `bounds` below.
 * Multi-token (n_tok 1, 3, 17), odd row counts (rows replicated to 37) and
 * pools of 1 and 4 threads are checked against a double product we compute
 * here from `deq`; results must not depend on the thread count. Rows whose
 * length is an odd number of blocks (and float rows of any length) reach
 * the kernels' tail paths; those rows are made with quant/'s quantizer and
 * checked against its dequantization.
 */
#include "backend/cpu/cpu_matmul_kernels.h"
#include "quant/quant.h"
#include "tests/test.h"

#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char name[128];
    uint32_t type, n, rows, row_bytes, has_im, vdt;
    const float *x, *deq, *y, *dot_ggml;
    const uint8_t *q;
    double dot_exact[8];
    void *buf;
} fixture;

static int load_fixture(const char *file, fixture *f)
{
    size_t len;
    memset(f, 0, sizeof(*f));
    snprintf(f->name, sizeof(f->name), "%s", file);
    char rel[256];
    snprintf(rel, sizeof(rel), "quants/%s", file);
    uint8_t *b = test_read_file(test_data(rel), &len);
    if (!b || len < 28 || memcmp(b, "QFX1", 4)) {
        free(b);
        return -1;
    }
    uint32_t h[6];
    memcpy(h, b + 4, sizeof(h));
    f->type = h[0], f->n = h[1], f->rows = h[2], f->row_bytes = h[3], f->has_im = h[4];
    f->vdt = h[5];
    if (f->rows != 8) {
        free(b);
        return -1;
    }
    size_t off = 28, nn = (size_t)f->n * f->rows;
    f->x = (const float *)(b + off), off += 4 * nn;
    if (f->has_im) off += 4 * (size_t)f->n;
    f->q = b + off, off += (size_t)f->row_bytes * f->rows;
    f->deq = (const float *)(b + off), off += 4 * nn;
    f->y = (const float *)(b + off), off += 4 * (size_t)f->n;
    f->dot_ggml = (const float *)(b + off), off += 4 * f->rows;
    if (off + 8 * f->rows + 8 > len || f->n % 256) {
        free(b);
        return -1;
    }
    memcpy(f->dot_exact, b + off, 8 * f->rows);
    f->buf = b;
    return 0;
}

/* Error bounds relative to S = sum |deq_i * y_i|. `exact`: vs the double
 * product (f32 accumulation, plus for the Q8 activation types the rounding
 * of y to 8 bits: |dy| <= d/2 with d = amax/127 per block, which on these
 * rows is ~1e-3 of S); `ggml`: vs ggml's vec_dot (same quantized y; only
 * float summation order and ties differ). */
static const struct {
    uint32_t type;
    double exact, ggml;
} bounds[] = {
    {DS4_TYPE_F32, 1e-6, 1e-4},  /* ggml's f16/bf16 vec_dot round y too */
    {DS4_TYPE_F16, 1e-6, 1e-4},
    {DS4_TYPE_BF16, 1e-6, 1e-3},
    {DS4_TYPE_Q8_0, 3e-3, 1e-6},
    {DS4_TYPE_MXFP4, 3e-3, 1e-6},
    {DS4_TYPE_Q2_K, 3e-3, 1e-6},
    {DS4_TYPE_Q4_K, 3e-3, 1e-6},
    {DS4_TYPE_IQ2_XXS, 3e-3, 1e-6},
};

static int bound_of(uint32_t type, double *exact, double *ggml)
{
    for (size_t i = 0; i < sizeof(bounds) / sizeof(bounds[0]); i++)
        if (bounds[i].type == type) {
            *exact = bounds[i].exact, *ggml = bounds[i].ggml;
            return 1;
        }
    return 0;
}

static double dot_double(const float *a, const float *b, uint32_t n, double *abs_sum)
{
    double s = 0, as = 0;
    for (uint32_t i = 0; i < n; i++) {
        s += (double)a[i] * b[i];
        as += fabs((double)a[i] * b[i]);
    }
    if (abs_sum) *abs_sum = as;
    return s;
}

/* Worst relative errors seen per type (printed, so bounds can be judged). */
static double worst_exact[64], worst_ggml[64];

static int n_fixtures;
static char fixture_files[64][128];

static void list_fixtures(void)
{
    DIR *d = opendir(test_data("quants"));
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) && n_fixtures < 64) {
        size_t l = strlen(e->d_name);
        if (l > 4 && l < 100 && !strcmp(e->d_name + l - 4, ".bin") && strncmp(e->d_name, "q8_K", 4))
            memcpy(fixture_files[n_fixtures++], e->d_name, l + 1);
    }
    closedir(d);
}

static void check_matvec(const fixture *f, ds4_simd_level level)
{
    double tol_exact, tol_ggml;
    if (!bound_of(f->type, &tol_exact, &tol_ggml)) {
        test_fail_at(__FILE__, __LINE__, "%s: no bound for type %u", f->name, f->type);
        return;
    }
    float y[8];
    int rc = ds4_cpu_matmul_level(level, NULL, (ds4_type)f->type, f->q, 8, f->n, f->y, 1, y);
    EXPECT_MSG(rc == 0, "%s: matmul refused at %s", f->name, ds4_cpu_simd_name(level));
    if (rc) return;
    for (int r = 0; r < 8; r++) {
        double S;
        double mine = dot_double(f->deq + (size_t)r * f->n, f->y, f->n, &S);
        /* The fixture's dot_exact must be what we compute from deq. */
        EXPECT_MSG(fabs(mine - f->dot_exact[r]) <= 1e-9 * S, "%s row %d: dot_exact %.9g vs %.9g",
                   f->name, r, f->dot_exact[r], mine);
        double ee = fabs(y[r] - f->dot_exact[r]) / S;
        double eg = fabs((double)y[r] - f->dot_ggml[r]) / S;
        if (ee > worst_exact[f->type]) worst_exact[f->type] = ee;
        if (eg > worst_ggml[f->type]) worst_ggml[f->type] = eg;
        EXPECT_MSG(ee <= tol_exact, "%s %s row %d: %.9g vs exact %.9g (rel %.3g > %.3g)", f->name,
                   ds4_cpu_simd_name(level), r, y[r], f->dot_exact[r], ee, tol_exact);
        EXPECT_MSG(eg <= tol_ggml, "%s %s row %d: %.9g vs ggml %.9g (rel %.3g > %.3g)", f->name,
                   ds4_cpu_simd_name(level), r, y[r], f->dot_ggml[r], eg, tol_ggml);
    }
}

static void for_each_fixture_level(void (*fn)(const fixture *, ds4_simd_level))
{
    if (!n_fixtures) list_fixtures();
    REQUIRE(n_fixtures >= 18);
    for (int i = 0; i < n_fixtures; i++) {
        fixture f;
        if (load_fixture(fixture_files[i], &f)) {
            test_fail_at(__FILE__, __LINE__, "cannot load %s", fixture_files[i]);
            continue;
        }
        for (int l = DS4_SIMD_SCALAR; l <= DS4_SIMD_AVX512; l++)
            if (ds4_cpu_simd_supported((ds4_simd_level)l)) fn(&f, (ds4_simd_level)l);
        free(f.buf);
    }
}

static void test_matvec_vs_fixture_dots(void)
{
    for_each_fixture_level(check_matvec);
    for (int t = 0; t < 64; t++)
        if (worst_exact[t] > 0)
            printf("  type %2d: worst rel error vs exact %.3g, vs ggml %.3g\n", t, worst_exact[t],
                   worst_ggml[t]);
}

/* Tokens: permutations and scalings of the fixture's y (deterministic). */
static float *make_tokens(const fixture *f, int n_tok)
{
    float *x = malloc(sizeof(float) * f->n * (size_t)n_tok);
    if (!x) return NULL;
    for (int t = 0; t < n_tok; t++)
        for (uint32_t i = 0; i < f->n; i++)
            x[(size_t)t * f->n + i] = f->y[(i * 7u + 131u * (uint32_t)t) % f->n] * (1.0f + 0.25f * (float)t);
    return x;
}

#define ODD_ROWS 37

static void check_tiles(const fixture *f, ds4_simd_level level)
{
    double tol_exact, tol_ggml;
    if (!bound_of(f->type, &tol_exact, &tol_ggml)) return;
    /* 37 rows: row r is fixture row (3r) % 8. */
    uint8_t *w = malloc((size_t)f->row_bytes * ODD_ROWS);
    REQUIRE(w);
    for (int r = 0; r < ODD_ROWS; r++)
        memcpy(w + (size_t)r * f->row_bytes, f->q + (size_t)((3 * r) % 8) * f->row_bytes, f->row_bytes);
    ds4_threadpool *p1 = ds4_pool_create(1), *p4 = ds4_pool_create(4);
    const int toks[] = {1, 3, 17};
    for (int k = 0; k < 3; k++) {
        int nt = toks[k];
        float *x = make_tokens(f, nt);
        float *y1 = malloc(sizeof(float) * ODD_ROWS * (size_t)nt);
        float *y4 = malloc(sizeof(float) * ODD_ROWS * (size_t)nt);
        float *y0 = malloc(sizeof(float) * ODD_ROWS * (size_t)nt);
        if (!x || !y1 || !y4 || !y0 || !p1 || !p4) {
            test_fail_at(__FILE__, __LINE__, "out of memory");
        } else {
            EXPECT(ds4_cpu_matmul_level(level, p1, (ds4_type)f->type, w, ODD_ROWS, f->n, x, nt, y1) == 0);
            EXPECT(ds4_cpu_matmul_level(level, p4, (ds4_type)f->type, w, ODD_ROWS, f->n, x, nt, y4) == 0);
            EXPECT(ds4_cpu_matmul_level(level, NULL, (ds4_type)f->type, w, ODD_ROWS, f->n, x, nt, y0) == 0);
            EXPECT_MSG(!memcmp(y1, y4, sizeof(float) * ODD_ROWS * (size_t)nt) &&
                           !memcmp(y1, y0, sizeof(float) * ODD_ROWS * (size_t)nt),
                       "%s %s n_tok %d: result depends on the thread count", f->name,
                       ds4_cpu_simd_name(level), nt);
            int bad = 0;
            for (int t = 0; t < nt && bad < 3; t++)
                for (int r = 0; r < ODD_ROWS && bad < 3; r++) {
                    double S;
                    double ref = dot_double(f->deq + (size_t)((3 * r) % 8) * f->n,
                                            x + (size_t)t * f->n, f->n, &S);
                    double e = fabs(y4[(size_t)t * ODD_ROWS + r] - ref) / S;
                    if (e > tol_exact) {
                        bad++;
                        test_fail_at(__FILE__, __LINE__, "%s %s n_tok %d t %d r %d: %.9g vs %.9g (rel %.3g)",
                                     f->name, ds4_cpu_simd_name(level), nt, t, r,
                                     y4[(size_t)t * ODD_ROWS + r], ref, e);
                    }
                }
        }
        free(x), free(y1), free(y4), free(y0);
    }
    ds4_pool_destroy(p1);
    ds4_pool_destroy(p4);
    free(w);
}

static void test_tokens_rows_threads(void)
{
    for_each_fixture_level(check_tiles);
}

/* Every level must give the scalar kernel's numbers up to float summation
 * order (the integer parts are exact). */
static void check_levels_agree(const fixture *f, ds4_simd_level level)
{
    if (level == DS4_SIMD_SCALAR) return;
    float *x = make_tokens(f, 5);
    float a[8 * 5], b[8 * 5];
    REQUIRE(x);
    EXPECT(ds4_cpu_matmul_level(DS4_SIMD_SCALAR, NULL, (ds4_type)f->type, f->q, 8, f->n, x, 5, a) == 0);
    EXPECT(ds4_cpu_matmul_level(level, NULL, (ds4_type)f->type, f->q, 8, f->n, x, 5, b) == 0);
    for (int i = 0; i < 40; i++) {
        double S;
        dot_double(f->deq + (size_t)(i % 8) * f->n, x + (size_t)(i / 8) * f->n, f->n, &S);
        EXPECT_MSG(fabs((double)a[i] - b[i]) <= 1e-5 * S, "%s %s out %d: %.9g vs scalar %.9g", f->name,
                   ds4_cpu_simd_name(level), i, b[i], a[i]);
    }
    free(x);
}

static void test_simd_levels_match_scalar(void)
{
    for_each_fixture_level(check_levels_agree);
}

/* Our Q8_K activation quantizer must produce ggml's bytes (q8_K fixtures:
 * q holds ggml's quantize_row_q8_K of x). */
static void test_q8_K_activation_matches_ggml(void)
{
    const char *files[] = {"q8_K-n4096-plain.bin", "q8_K-n2048-plain.bin"};
    for (int k = 0; k < 2; k++) {
        fixture f;
        REQUIRE(load_fixture(files[k], &f) == 0);
        size_t rb = ds4_act_row_bytes(DS4_ACT_Q8_K, f.n);
        void *a = malloc(rb);
        REQUIRE(a);
        int mism = 0;
        for (uint32_t r = 0; r < f.rows; r++) {
            ds4_act_quantize(DS4_ACT_Q8_K, f.x + (size_t)r * f.n, f.n, a);
            const block_q8_K *g = (const block_q8_K *)(f.q + (size_t)r * f.row_bytes);
            for (uint32_t b = 0; b < f.n / QK_K; b++) {
                if (memcmp(&g[b].d, ds4_act_d(a, f.n) + b, 4) ||
                    memcmp(g[b].qs, ds4_act_qs(a) + b * QK_K, QK_K) ||
                    memcmp(g[b].bsums, ds4_act_bsums(a, f.n) + b * 16, 32))
                    mism++;
            }
        }
        EXPECT_MSG(mism == 0, "%s: %d Q8_K blocks differ from ggml's", files[k], mism);
        free(a);
        free(f.buf);
    }
}

/* Rows of odd block counts (and odd lengths for the float types): every
 * level against dequantize-then-dot in double. */
static void test_odd_lengths_all_levels(void)
{
    static const struct {
        ds4_type type;
        int64_t cols[4];
    } cases[] = {
        {DS4_TYPE_F32, {1, 13, 40, 4099}},   {DS4_TYPE_F16, {1, 7, 24, 4101}},
        {DS4_TYPE_BF16, {3, 9, 31, 2050}},   {DS4_TYPE_Q8_0, {32, 96, 160, 4128}},
        {DS4_TYPE_MXFP4, {32, 96, 224, 4128}}, {DS4_TYPE_Q2_K, {256, 768, 1280, 256}},
        {DS4_TYPE_Q4_K, {256, 768, 1280, 256}}, {DS4_TYPE_IQ2_XXS, {256, 768, 1280, 256}},
    };
    const int rows = 5, n_tok = 6;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        double tol, tol_ggml;
        REQUIRE(bound_of(cases[c].type, &tol, &tol_ggml));
        for (int k = 0; k < 4; k++) {
            int64_t n = cases[c].cols[k];
            int64_t rb = ds4_row_bytes(cases[c].type, n);
            float *src = malloc(sizeof(float) * (size_t)(n * rows)), *deq = malloc(sizeof(float) * (size_t)(n * rows));
            float *x = malloc(sizeof(float) * (size_t)(n * n_tok)), *im = malloc(sizeof(float) * (size_t)n);
            float *y = malloc(sizeof(float) * (size_t)(rows * n_tok));
            uint8_t *w = malloc((size_t)(rb * rows));
            REQUIRE(src && deq && x && im && y && w && rb > 0);
            uint32_t r = 12345u + (uint32_t)(c * 7 + (size_t)k);
            for (int64_t i = 0; i < n * rows; i++) {
                r = r * 1664525u + 1013904223u;
                src[i] = (float)((int)(r >> 9) % 2001 - 1000) * 1e-3f;
            }
            for (int64_t i = 0; i < n * n_tok; i++) {
                r = r * 1664525u + 1013904223u;
                x[i] = (float)((int)(r >> 9) % 2001 - 1000) * 1e-3f;
            }
            for (int64_t i = 0; i < n; i++) im[i] = 1.0f;
            REQUIRE(ds4_quantize_rows(cases[c].type, src, w, rows, n, im) == DS4_OK);
            for (int i = 0; i < rows; i++)
                REQUIRE(ds4_dequantize_row(cases[c].type, w + i * rb, deq + i * n, n) == DS4_OK);
            for (int l = DS4_SIMD_SCALAR; l <= DS4_SIMD_AVX512; l++) {
                if (!ds4_cpu_simd_supported((ds4_simd_level)l)) continue;
                EXPECT(ds4_cpu_matmul_level((ds4_simd_level)l, NULL, cases[c].type, w, rows, n, x, n_tok, y) == 0);
                for (int t = 0; t < n_tok; t++)
                    for (int i = 0; i < rows; i++) {
                        double S;
                        double ref = dot_double(deq + i * n, x + t * n, (uint32_t)n, &S);
                        double e = S > 0 ? fabs(y[t * rows + i] - ref) / S : fabs(y[t * rows + i]);
                        EXPECT_MSG(e <= tol, "type %d cols %lld %s t %d row %d: %.9g vs %.9g (rel %.3g)",
                                   cases[c].type, (long long)n, ds4_cpu_simd_name((ds4_simd_level)l), t, i,
                                   y[t * rows + i], ref, e);
                    }
            }
            free(src), free(deq), free(x), free(im), free(y), free(w);
        }
    }
}

/* All-zero activations give exactly 0 for every type and level (the
 * zero-block path of the quantizers); non-finite activations must not
 * crash or hit undefined behaviour (ASan/UBSan builds), and must not leak
 * into the results of other tokens. */
static void test_degenerate_activations(void)
{
    const ds4_type types[] = {DS4_TYPE_F32, DS4_TYPE_F16, DS4_TYPE_BF16, DS4_TYPE_Q8_0,
                              DS4_TYPE_MXFP4, DS4_TYPE_Q2_K, DS4_TYPE_Q4_K, DS4_TYPE_IQ2_XXS};
    const int64_t n = 512, rows = 3;
    float *src = malloc(sizeof(float) * n * rows), *x = malloc(sizeof(float) * n * 3), im[512];
    uint8_t *w = malloc(4 * n * rows);
    REQUIRE(src && x && w);
    for (int64_t i = 0; i < n * rows; i++) src[i] = (float)((i * 37) % 19) - 9.0f;
    for (int64_t i = 0; i < n; i++) im[i] = 1.0f;
    for (size_t k = 0; k < sizeof(types) / sizeof(types[0]); k++) {
        REQUIRE(ds4_quantize_rows(types[k], src, w, rows, n, im) == DS4_OK);
        for (int64_t i = 0; i < n * 3; i++) x[i] = 0.0f;
        x[n + 5] = NAN;                  /* token 1: a NaN */
        x[2 * n + 7] = INFINITY;         /* token 2: an inf */
        for (int l = DS4_SIMD_SCALAR; l <= DS4_SIMD_AVX512; l++) {
            if (!ds4_cpu_simd_supported((ds4_simd_level)l)) continue;
            float y[9];
            EXPECT(ds4_cpu_matmul_level((ds4_simd_level)l, NULL, types[k], w, rows, n, x, 3, y) == 0);
            for (int r = 0; r < rows; r++)
                EXPECT_MSG(y[r] == 0.0f, "type %d %s row %d: zero activations gave %g", types[k],
                           ds4_cpu_simd_name((ds4_simd_level)l), r, y[r]);
        }
    }
    free(src), free(x), free(w);
}

/* Bad shapes are refused, not computed. */
static void test_refuses_bad_shapes(void)
{
    uint8_t w[34 * 2] = {0};
    float x[64] = {0}, y[2] = {1, 1};
    EXPECT(ds4_cpu_matmul_level(DS4_SIMD_SCALAR, NULL, DS4_TYPE_Q8_0, w, 1, 48, x, 1, y) == -1);
    EXPECT(ds4_cpu_matmul_level(DS4_SIMD_SCALAR, NULL, DS4_TYPE_Q8_K, w, 1, 256, x, 1, y) == -1);
    EXPECT(ds4_cpu_matmul_level(DS4_SIMD_SCALAR, NULL, DS4_TYPE_Q8_0, w, 2, 32, x, 1, y) == 0);
    EXPECT(y[0] == 0.0f && y[1] == 0.0f);
    ds4_cpu_matmul(NULL, DS4_TYPE_I32, w, 2, 32, x, 1, y);
    EXPECT(isnan(y[0]) && isnan(y[1]));
}

int main(void)
{
    printf("  simd levels: best %s\n", ds4_cpu_simd_name(ds4_cpu_simd_best()));
    RUN(test_q8_K_activation_matches_ggml);
    RUN(test_matvec_vs_fixture_dots);
    RUN(test_tokens_rows_threads);
    RUN(test_simd_levels_match_scalar);
    RUN(test_odd_lengths_all_levels);
    RUN(test_degenerate_activations);
    RUN(test_refuses_bad_shapes);
    return test_finish();
}

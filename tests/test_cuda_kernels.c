/*
 * test_cuda_kernels.c - the CUDA weight kernels on a GPU, against values
 * computed here in double precision from ggml's own dequantization
 * (tests/data/quants). Skips (with the reason) when built without nvcc or
 * when no CUDA device is present.
 *
 * Matrices of realistic width are built from the 8 fixture rows (rows are
 * independent, so any row order and any concatenation of rows' bytes is a
 * valid matrix); every output is checked, with tolerances stated where they
 * are used:
 *   - dequantize kernel:  bit-identical to ggml
 *   - matvec / MoE:       |y - ref| <= 2e-5 * sum|w x|   (f32 accumulation);
 *                         for Q8_0 / Q2_K / IQ2_XXS the reference is the CPU
 *                         kernel on the CPU's quantized activations (the GPU
 *                         quantizes them the same way: cuda_mmvq.cu), and the
 *                         quantized bytes themselves must equal the CPU's
 *                         for F16 / BF16 / F32 on the float matvec
 *                         (cuda_fmv.cu) also bit for bit its host run
 *   - GEMM f32:           ||y - ref|| <= 1e-5 ||ref||
 *   - GEMM bf16:          ||y - ref|| <= 1e-2 ||ref||   (bf16 rounding of w, x)
 *   - greedy pick:        every pick ds4_argmax_excluding's (crafted rows)
 */
#include "tests/test.h"
#include "tests/test_cuda_fixture.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if DS4_HAVE_CUDA
#include "backend/cpu/cpu_matmul_kernels.h"
#include "backend/cuda/cuda_api.h"
#include "backend/cuda/cuda_backend.h"
#include "include/ds4_sampler.h"
#include "tests/argmax_cases.h"

static ds4_cuda *g_cu;

static int need_gpu(void)
{
    if (g_cu) return 1;
    test_skip("no CUDA device (cudaGetDeviceCount found none)");
    return 0;
}

/* A host matrix of `rows` x (k * f.n) made of fixture rows: row r, part j
 * is fixture row (r * 3 + j * 5 + seed) % 8. deq gets the matching floats. */
typedef struct {
    int64_t rows, cols, row_bytes;
    uint8_t *q;
    float *deq;
} test_matrix;

static void make_matrix(const cuda_fixture *f, int64_t rows, int k, int seed, test_matrix *m)
{
    m->rows = rows;
    m->cols = f->n * k;
    m->row_bytes = f->row_bytes * k;
    m->q = malloc((size_t)(rows * m->row_bytes));
    m->deq = malloc(sizeof(float) * (size_t)(rows * m->cols));
    for (int64_t r = 0; r < rows; r++)
        for (int j = 0; j < k; j++) {
            int64_t src = (r * 3 + j * 5 + seed) % 8;
            memcpy(m->q + r * m->row_bytes + j * f->row_bytes, f->q + src * f->row_bytes,
                   (size_t)f->row_bytes);
            memcpy(m->deq + r * m->cols + j * f->n, f->deq + src * f->n, sizeof(float) * (size_t)f->n);
        }
}

static void free_matrix(test_matrix *m)
{
    free(m->q);
    free(m->deq);
}

/* F32 has no ggml fixture: random rows, deq = the values themselves. */
static void make_f32_matrix(int64_t rows, int64_t cols, test_matrix *m)
{
    uint64_t s = 99;
    m->rows = rows;
    m->cols = cols;
    m->row_bytes = cols * 4;
    m->deq = malloc(sizeof(float) * (size_t)(rows * cols));
    for (int64_t i = 0; i < rows * cols; i++) m->deq[i] = cuda_test_rand(&s);
    m->q = malloc((size_t)(rows * cols * 4));
    memcpy(m->q, m->deq, (size_t)(rows * cols * 4));
}

static float *rand_vec(int64_t n, uint64_t seed)
{
    float *v = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] = cuda_test_rand(&seed);
    return v;
}

static void *to_device(const void *h, size_t bytes, size_t offset)
{
    void *d = NULL;
    if (ds4_cuda_malloc(g_cu, bytes + offset, &d) != DS4_OK) return NULL;
    if (ds4_cuda_upload(g_cu, (char *)d + offset, h, bytes) != DS4_OK) return NULL;
    return d;
}

/* Weights of rows of cols values as the kernels read them (IQ2_XXS rows of
 * a multiple of 2048 values in runs, backend/cuda/cuda_weight_runs.cuh): by
 * ds4_cuda_upload_weight (the device rearranges them), or at an offset
 * that is not a multiple of 4, which the device's rearranging refuses,
 * rearranged on the host first. */
static void *weights_to_device(const void *h, size_t bytes, size_t offset, ds4_type type, int64_t cols)
{
    if (offset % 4 == 0 || !ds4_cuda_in_runs(type, cols)) {
        void *d = NULL;
        if (ds4_cuda_malloc(g_cu, bytes + offset, &d) != DS4_OK) return NULL;
        if (ds4_cuda_upload_weight(g_cu, (char *)d + offset, h, bytes, type, cols) != DS4_OK) return NULL;
        return d;
    }
    uint8_t *g = malloc(bytes);
    if (!g) return NULL;
    ds4_runs_host(type, g, h, bytes);
    void *d = to_device(g, bytes, offset);
    free(g);
    return d;
}

/* Check y (n_tok x rows) against double sums of deq * x, or, when
 * `quant_type` (DS4_TYPE_F32: none) is a type the GPU runs on quantized activations (see
 * ds4_cuda_mmvq_active), against the CPU scalar kernel on the CPU's
 * quantized activations. Returns failures. */
static int check_matvec_as(const char *what, const test_matrix *m, const float *x, int64_t n_tok,
                           const float *y, ds4_type quant_type)
{
    int bad = 0;
    const ds4_act_kind kind = ds4_cpu_act_kind(quant_type);
    const size_t ab = ds4_act_row_bytes(kind, m->cols);
    uint8_t *act = kind != DS4_ACT_F32 ? malloc(ab) : NULL;
    for (int64_t t = 0; t < n_tok; t++) {
        if (act) ds4_act_quantize(kind, x + t * m->cols, m->cols, act);
        for (int64_t r = 0; r < m->rows; r++) {
            double ref = 0.0, mag = 0.0;
            const float *w = m->deq + r * m->cols, *xt = x + t * m->cols;
            for (int64_t c = 0; c < m->cols; c++) {
                ref += (double)w[c] * xt[c];
                mag += fabs((double)w[c] * xt[c]);
            }
            if (act) {
                float q = 0.0f;
                ds4_cpu_dot_scalar(quant_type)(m->cols, m->q + r * m->row_bytes, act, ab, 1, &q);
                ref = q;
            }
            double got = y[t * m->rows + r];
            if (!(fabs(got - ref) <= 2e-5 * mag + 1e-30) && bad++ < 3)
                test_fail_at(__FILE__, __LINE__, "%s: token %lld row %lld: %.9g vs %.9g (sum|wx| %.3g%s)",
                             what, (long long)t, (long long)r, got, ref, mag, act ? ", quantized x" : "");
        }
    }
    free(act);
    return bad;
}


static void run_matvec_case(const char *name, ds4_type type, const test_matrix *m, int64_t n_tok,
                            size_t w_offset)
{
    char what[160];
    snprintf(what, sizeof what, "%s rows %lld cols %lld n_tok %lld offset %zu", name,
             (long long)m->rows, (long long)m->cols, (long long)n_tok, w_offset);
    float *x = rand_vec(n_tok * m->cols, 7 + (uint64_t)n_tok);
    float *y = calloc((size_t)(n_tok * m->rows), sizeof(float));
    void *dw = weights_to_device(m->q, (size_t)(m->rows * m->row_bytes), w_offset, type, m->cols);
    float *dx = to_device(x, sizeof(float) * (size_t)(n_tok * m->cols), 0);
    float *dy = NULL;
    EXPECT(dw && dx && ds4_cuda_malloc(g_cu, sizeof(float) * (size_t)(n_tok * m->rows), (void **)&dy) == DS4_OK);
    ds4_status st = ds4_cuda_matvec(g_cu, type, (char *)dw + w_offset, m->rows, m->cols, dx, n_tok, dy);
    EXPECT_MSG(st == DS4_OK, "%s: %s", what, ds4_last_error());
    EXPECT_MSG(ds4_cuda_sync(g_cu) == DS4_OK, "%s: %s", what, ds4_last_error());
    EXPECT(ds4_cuda_download(g_cu, y, dy, sizeof(float) * (size_t)(n_tok * m->rows)) == DS4_OK);
    const int q = ds4_cuda_mmvq_active(type, (char *)dw + w_offset, m->cols, 16);
    EXPECT_MSG(q == ((type == DS4_TYPE_Q8_0 || type == DS4_TYPE_Q2_K || type == DS4_TYPE_IQ2_XXS) && w_offset == 0 &&
                     !getenv("DS4_CUDA_MMVQ")),
               "%s: int8 path %s", what, q ? "taken" : "not taken");
    check_matvec_as(what, m, x, n_tok, y, q ? type : DS4_TYPE_F32);
    if (q && type == DS4_TYPE_Q8_0 && !getenv("DS4_CUDA_Q8SPLIT")) {
        /* the same product on the split-layout copy (cuda_q8split.cu): the
         * CPU kernel's result within the same tolerance */
        char what2[200];
        snprintf(what2, sizeof what2, "%s, split-layout copy", what);
        memset(y, 0, sizeof(float) * (size_t)(n_tok * m->rows));
        EXPECT_MSG(ds4_cuda_q8split_register(g_cu, dw, m->rows, m->cols) == DS4_OK, "%s: %s", what2,
                   ds4_last_error());
        EXPECT(ds4_cuda_upload(g_cu, dy, y, sizeof(float) * (size_t)(n_tok * m->rows)) == DS4_OK);
        st = ds4_cuda_matvec(g_cu, type, dw, m->rows, m->cols, dx, n_tok, dy);
        EXPECT_MSG(st == DS4_OK && ds4_cuda_sync(g_cu) == DS4_OK, "%s: %s", what2, ds4_last_error());
        EXPECT(ds4_cuda_download(g_cu, y, dy, sizeof(float) * (size_t)(n_tok * m->rows)) == DS4_OK);
        check_matvec_as(what2, m, x, n_tok, y, type);
        ds4_cuda_q8split_release(g_cu, dw);
    }
    ds4_cuda_free(g_cu, dw);
    ds4_cuda_free(g_cu, dx);
    ds4_cuda_free(g_cu, dy);
    free(x);
    free(y);
}

/* A rows x cols matrix of a one-value-per-block type (F16, BF16) whose
 * row r is the first cols values of fixture row r % 8 (cols <= f->n). */
static void make_matrix_cols(const cuda_fixture *f, int64_t rows, int64_t cols, test_matrix *m)
{
    const int64_t es = f->row_bytes / f->n;
    m->rows = rows;
    m->cols = cols;
    m->row_bytes = cols * es;
    m->q = malloc((size_t)(rows * m->row_bytes));
    m->deq = malloc(sizeof(float) * (size_t)(rows * cols));
    for (int64_t r = 0; r < rows; r++) {
        memcpy(m->q + r * m->row_bytes, f->q + (r % 8) * f->row_bytes, (size_t)m->row_bytes);
        memcpy(m->deq + r * cols, f->deq + (r % 8) * f->n, sizeof(float) * (size_t)cols);
    }
}

/* The float-weight matvec (cuda_fmv.cu) at one shape: taken when aligned;
 * every output within 2e-5 sum|wx| of the double sum, and, on its path,
 * bit for bit the host run of its arithmetic in its order
 * (ds4_cuda_host_fmv_dot), token by token: so a token's result cannot
 * depend on the tokens that shared its weight pass. */
static void run_fmv_case(const char *name, ds4_type type, const test_matrix *m, int64_t n_tok)
{
    char what[160];
    snprintf(what, sizeof what, "fmv %s rows %lld cols %lld n_tok %lld", name, (long long)m->rows,
             (long long)m->cols, (long long)n_tok);
    float *x = rand_vec(n_tok * m->cols, 3 + (uint64_t)n_tok);
    float *y = calloc((size_t)(n_tok * m->rows), sizeof(float));
    void *dw = to_device(m->q, (size_t)(m->rows * m->row_bytes), 0);
    float *dx = to_device(x, sizeof(float) * (size_t)(n_tok * m->cols), 0);
    float *dy = NULL;
    REQUIRE(dw && dx && ds4_cuda_malloc(g_cu, sizeof(float) * (size_t)(n_tok * m->rows), (void **)&dy) == DS4_OK);
    const int on = ds4_cuda_fmv_active(type, dw, m->cols);
    const char *env = getenv("DS4_CUDA_FMV");
    EXPECT_MSG(on == !(env && env[0] == '0'), "%s: float matvec %s", what, on ? "taken" : "not taken");
    ds4_status st = ds4_cuda_matvec(g_cu, type, dw, m->rows, m->cols, dx, n_tok, dy);
    EXPECT_MSG(st == DS4_OK, "%s: %s", what, ds4_last_error());
    EXPECT_MSG(ds4_cuda_sync(g_cu) == DS4_OK, "%s: %s", what, ds4_last_error());
    EXPECT(ds4_cuda_download(g_cu, y, dy, sizeof(float) * (size_t)(n_tok * m->rows)) == DS4_OK);
    check_matvec_as(what, m, x, n_tok, y, DS4_TYPE_F32);
    if (on) {
        const int wpr = ds4_cuda_fmv_warps_per_row(g_cu, m->rows);
        int bad = 0;
        for (int64_t t = 0; t < n_tok; t++)
            for (int64_t r = 0; r < m->rows; r++) {
                float want = 0.0f;
                EXPECT(ds4_cuda_host_fmv_dot(type, m->q + r * m->row_bytes, m->cols, x + t * m->cols, wpr, &want) ==
                       DS4_OK);
                if (memcmp(&want, &y[t * m->rows + r], 4) != 0 && bad++ < 3)
                    test_fail_at(__FILE__, __LINE__, "%s (%d warps per row): token %lld row %lld: %.9g, host run %.9g",
                                 what, wpr, (long long)t, (long long)r, (double)y[t * m->rows + r], (double)want);
            }
    }
    ds4_cuda_free(g_cu, dw);
    ds4_cuda_free(g_cu, dx);
    ds4_cuda_free(g_cu, dy);
    free(x);
    free(y);
}

/* The indexer's queries of one token in one launch (cuda_fmv_iq.cu; its
 * numbers are held to the ops' in test_cuda_ops.c) cover Flash's shape
 * (8192 rows of 1024, heads of 128, 64 values rotated) where the float
 * matvec takes a warp a row, and not a head of 64, a rotation wider than a
 * head, other widths, x off its 16-byte alignment or Q8_0 weights. */
static void check_index_query_cover(ds4_type type, const test_matrix *proj)
{
    void *dw = to_device(proj->q, (size_t)(proj->rows * proj->row_bytes), 0), *d = NULL;
    REQUIRE(dw && ds4_cuda_malloc(g_cu, 3 * 4096 + 8192 * sizeof(float), &d) == DS4_OK);
    const float *x = d, *nw = (const float *)d + 1024, *om = (const float *)d + 2048;
    float *y = (float *)d + 3072;
    const int want = ds4_cuda_fmv_warps_per_row(g_cu, 8192) == 1;
    EXPECT(ds4_cuda_fmv_index_query(g_cu, type, dw, 8192, 1024, x, nw, 1e-6f, y, 128, 64, om, NULL, 0, 1, 0) == want);
    EXPECT(ds4_cuda_fmv_index_query(g_cu, type, dw, 8192, 1024, x, nw, 1e-6f, y, 128, 64, om, NULL, 0, 0, 0) == want);
    EXPECT(!ds4_cuda_fmv_index_query(g_cu, type, dw, 8192, 1024, x, nw, 1e-6f, y, 64, 64, om, NULL, 0, 1, 0));
    EXPECT(!ds4_cuda_fmv_index_query(g_cu, type, dw, 8192, 1024, x, nw, 1e-6f, y, 128, 130, om, NULL, 0, 1, 0));
    EXPECT(!ds4_cuda_fmv_index_query(g_cu, type, dw, 16384, 512, x, nw, 1e-6f, y, 128, 64, om, NULL, 0, 1, 0));
    EXPECT(!ds4_cuda_fmv_index_query(g_cu, type, dw, 8192, 1024, x + 1, nw, 1e-6f, y, 128, 64, om, NULL, 0, 1, 0));
    EXPECT(!ds4_cuda_fmv_index_query(g_cu, DS4_TYPE_Q8_0, dw, 8192, 1024, x, nw, 1e-6f, y, 128, 64, om, NULL, 0, 1,
                                     0));
    ds4_cuda_free(g_cu, d);
    ds4_cuda_free(g_cu, dw);
}

/* The decode shapes of the float weights: HC mixing (24 x 16384), router
 * (256 x 4096), compressor (1024 x 4096), indexer projection (8192 x 1024:
 * a warp per row on a large GPU), each at 1..16 tokens (groups of 4 and
 * the remainders); the aligned F32 path; and the shapes that must fall back
 * to the f32-dequantizing kernel (weights not 16-byte aligned: checked by
 * value; cols % 8 != 0: only the routing, as that kernel takes octets). */
static void test_fmv_float_weights(void)
{
    if (!need_gpu()) return;
    static const ds4_type types[] = {DS4_TYPE_F16, DS4_TYPE_BF16};
    /* 5 to 63 tokens on the router's and compressor's shapes take
     * cuda_fmv_xr.cu (8 a block; the compressor's 1024 rows are two stages
     * of 8 rows a block on an H200), so 13 and 40 leave a partial group */
    static const int64_t toks[] = {1, 2, 3, 5, 8, 13, 16};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        int fi = 0;
        while (CUDA_FIXTURES[fi].type != types[ti]) fi++;
        cuda_fixture f;
        REQUIRE(cuda_fixture_load(CUDA_FIXTURES[fi].file, &f) == 0);
        const char *name = CUDA_FIXTURES[fi].file;
        test_matrix hc, router, comp, proj;
        make_matrix(&f, 24, 4, 1, &hc);
        make_matrix(&f, 256, 1, 2, &router);
        make_matrix(&f, 1024, 1, 3, &comp);
        make_matrix_cols(&f, 8192, 1024, &proj);
        for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++) {
            run_fmv_case(name, f.type, &hc, toks[k]);
            run_fmv_case(name, f.type, &router, toks[k]);
            run_fmv_case(name, f.type, &comp, toks[k]);
        }
        run_fmv_case(name, f.type, &comp, 40);
        run_fmv_case(name, f.type, &proj, 1);
        run_fmv_case(name, f.type, &proj, 5);
        check_index_query_cover(f.type, &proj);
        run_matvec_case(name, f.type, &hc, 3, 2); /* 2-byte aligned weights: the old kernel, by value */
        void *d = NULL;
        REQUIRE(ds4_cuda_malloc(g_cu, 4096, &d) == DS4_OK);
        EXPECT(!ds4_cuda_fmv_active(f.type, (char *)d + 2, 4096));
        EXPECT(!ds4_cuda_fmv_active(f.type, d, 4092));
        EXPECT(!ds4_cuda_fmv_active(DS4_TYPE_Q8_0, d, 4096));
        ds4_cuda_free(g_cu, d);
        free_matrix(&hc);
        free_matrix(&router);
        free_matrix(&comp);
        free_matrix(&proj);
        cuda_fixture_free(&f);
    }
    test_matrix f32;
    make_f32_matrix(24, 4096, &f32);
    run_fmv_case("f32-random", DS4_TYPE_F32, &f32, 5);
    free_matrix(&f32);
    make_f32_matrix(1024, 4096, &f32); /* 16 KB rows: 4 a stage, 4 stages a block */
    run_fmv_case("f32-random", DS4_TYPE_F32, &f32, 16);
    free_matrix(&f32);
}

/* IQ2_XXS rows of a multiple of 2048 values and Q2_K rows of a multiple
 * of 1024 rearranged into runs on the device (ds4_cuda_upload_weight) give
 * the host's bytes (ds4_runs_host, checked against the layouts and ggml's
 * floats in test_cuda_decode), over more runs than one grid pass takes;
 * rows of other widths stay as uploaded; a misaligned or partial run is
 * refused, naming the cause. */
static void test_weight_runs_on_device(void)
{
    if (!need_gpu()) return;
    static const struct {
        ds4_type type;
        int64_t flat_cols; /* a width whose rows are not in runs */
        size_t run;
    } types[] = {{DS4_TYPE_IQ2_XXS, 1024, 528}, {DS4_TYPE_Q2_K, 768, 336}};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        int fi = 0;
        while (CUDA_FIXTURES[fi].type != types[ti].type) fi++;
        cuda_fixture f;
        REQUIRE(cuda_fixture_load(CUDA_FIXTURES[fi].file, &f) == 0);
        const size_t rb = (size_t)f.row_bytes, n_rows = 40000; /* 80,000 / 160,000 runs: more than one grid pass */
        uint8_t *h = malloc(rb * n_rows), *want = malloc(rb * n_rows), *got = malloc(rb * n_rows);
        REQUIRE(h && want && got);
        for (size_t r = 0; r < n_rows; r++) memcpy(h + r * rb, f.q + (r * 7 % (size_t)f.rows) * rb, rb);
        ds4_runs_host(f.type, want, h, rb * n_rows);
        EXPECT(memcmp(want, h, rb * n_rows) != 0);
        void *d = NULL;
        REQUIRE(ds4_cuda_malloc(g_cu, rb * n_rows + 16, &d) == DS4_OK);
        EXPECT(ds4_cuda_upload_weight(g_cu, d, h, rb * n_rows, f.type, f.n) == DS4_OK);
        EXPECT(ds4_cuda_download(g_cu, got, d, rb * n_rows) == DS4_OK);
        EXPECT_MSG(memcmp(got, want, rb * n_rows) == 0, "type %d: runs made on the device differ from the host's",
                   (int)f.type);
        /* the same bytes as rows not in runs: unchanged */
        EXPECT(ds4_cuda_upload_weight(g_cu, d, h, rb * 8, f.type, types[ti].flat_cols) == DS4_OK);
        EXPECT(ds4_cuda_download(g_cu, got, d, rb * 8) == DS4_OK);
        EXPECT(memcmp(got, h, rb * 8) == 0);
        /* refused: a start off a 4-byte boundary, bytes not whole runs */
        EXPECT(ds4_cuda_upload_weight(g_cu, (char *)d + 2, h, rb, f.type, f.n) == DS4_ERR_INVALID);
        EXPECT(strstr(ds4_last_error(), "runs") != NULL);
        EXPECT(ds4_cuda_upload_weight(g_cu, d, h, types[ti].run + 4, f.type, f.n) == DS4_ERR_INVALID);
        ds4_cuda_free(g_cu, d);
        free(h);
        free(want);
        free(got);
        cuda_fixture_free(&f);
    }
}

static void test_dequantize_kernel_matches_ggml(void)
{
    if (!need_gpu()) return;
    for (int i = 0; i < N_CUDA_FIXTURES; i++) {
        cuda_fixture f;
        REQUIRE(cuda_fixture_load(CUDA_FIXTURES[i].file, &f) == 0);
        void *dw = weights_to_device(f.q, (size_t)(f.rows * f.row_bytes), 0, f.type, f.n);
        float *dout = NULL, *out = malloc(sizeof(float) * (size_t)(f.rows * f.n));
        REQUIRE(dw && ds4_cuda_malloc(g_cu, sizeof(float) * (size_t)(f.rows * f.n), (void **)&dout) == DS4_OK);
        EXPECT(ds4_cuda_dequantize(g_cu, f.type, dw, f.rows, f.n, dout) == DS4_OK);
        EXPECT(ds4_cuda_download(g_cu, out, dout, sizeof(float) * (size_t)(f.rows * f.n)) == DS4_OK);
        int bad = 0;
        for (int64_t k = 0; k < f.rows * f.n; k++)
            if (memcmp(&out[k], &f.deq[k], 4) != 0 && bad++ < 3)
                test_fail_at(__FILE__, __LINE__, "%s value %lld: %.9g != ggml %.9g", CUDA_FIXTURES[i].file,
                             (long long)k, (double)out[k], (double)f.deq[k]);
        ds4_cuda_free(g_cu, dw);
        ds4_cuda_free(g_cu, dout);
        free(out);
        cuda_fixture_free(&f);
    }
}

/* Every type: single and batched tokens (1..17, so every token group size
 * and a remainder), a row count that is not a multiple of the 8 rows of a
 * thread block, rows of 3 x 4096 values (several column chunks for the wide
 * types), and weights at an unaligned offset (the in-place path). */
static void test_matvec_all_types(void)
{
    if (!need_gpu()) return;
    static const int64_t toks[] = {1, 2, 3, 5, 8, 13, 16, 17};
    for (int i = 0; i <= N_CUDA_FIXTURES; i++) {
        test_matrix m, wide;
        ds4_type type;
        const char *name;
        cuda_fixture f;
        if (i < N_CUDA_FIXTURES) {
            REQUIRE(cuda_fixture_load(CUDA_FIXTURES[i].file, &f) == 0);
            type = f.type;
            name = CUDA_FIXTURES[i].file;
            make_matrix(&f, 203, 1, i, &m);
            make_matrix(&f, 37, 3, i + 1, &wide);
            cuda_fixture_free(&f);
        } else {
            type = DS4_TYPE_F32;
            name = "f32-random";
            make_f32_matrix(203, 4096, &m);
            make_f32_matrix(37, 12288, &wide);
        }
        for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++)
            run_matvec_case(name, type, &m, toks[k], 0);
        run_matvec_case(name, type, &wide, 1, 0);
        run_matvec_case(name, type, &wide, 5, 0);
        size_t off = type == DS4_TYPE_MXFP4 ? 1 : type == DS4_TYPE_Q2_K || type == DS4_TYPE_Q4_K ||
                                                          type == DS4_TYPE_F32 ? 4 : 2;
        run_matvec_case(name, type, &m, 1, off);
        run_matvec_case(name, type, &wide, 3, off);
        free_matrix(&m);
        free_matrix(&wide);
    }
}

/* The Q8_0 fixture for the split-layout tests; false (skipped, said why)
 * without a GPU or with the switches that turn that layout off. */
static bool q8_split_fixture(cuda_fixture *f)
{
    if (!need_gpu()) return false;
    if (getenv("DS4_CUDA_Q8SPLIT") || getenv("DS4_CUDA_MMVQ")) {
        test_skip("DS4_CUDA_Q8SPLIT / DS4_CUDA_MMVQ set: no split-layout path to check");
        return false;
    }
    if (cuda_fixture_load(CUDA_FIXTURES[0].file, f) != 0 || f->type != DS4_TYPE_Q8_0) {
        EXPECT_MSG(0, "the Q8_0 fixture %s did not load", CUDA_FIXTURES[0].file);
        return false;
    }
    return true;
}

/* A Q8_0 matrix of rows x cols from the fixture's rows (make_matrix);
 * narrower than a fixture row: each row's first cols values (whole blocks,
 * still a valid matrix). */
static void make_q8_matrix_width(const cuda_fixture *f, int64_t rows, int64_t cols, int seed, test_matrix *m)
{
    make_matrix(f, rows, cols > f->n ? (int)(cols / f->n) : 1, seed, m);
    if (cols >= f->n) return;
    const int64_t rb = cols / 32 * 34;
    for (int64_t r = 0; r < rows; r++) {
        memmove(m->q + r * rb, m->q + r * m->row_bytes, (size_t)rb);
        memmove(m->deq + r * cols, m->deq + r * m->cols, sizeof(float) * (size_t)cols);
    }
    m->cols = cols;
    m->row_bytes = rb;
}

/* One token on a split-layout Q8_0 copy takes the kernel that quantizes
 * its activation itself (cuda_q8split_fused.cu) at every row width of the
 * model (1024 .. 8192): within tolerance of the CPU kernel, and bit for bit
 * the two-launch path (quantizer + split-layout kernel), which a launch of
 * two copies of the same token takes, and the passes of 8 tokens of 13 and
 * 16 copies. The two 32 MB matrices give each warp several items, as q_b
 * and o_b do (96 rows give a warp one at most). */
static void test_q8_fused_matvec(void)
{
    cuda_fixture f;
    if (!q8_split_fixture(&f)) return;
    static const int64_t shapes[][2] = {{96, 1024}, {96, 2048}, {96, 4096}, {96, 8192}, {32768, 1024}, {4096, 8192}};
    for (size_t wi = 0; wi < sizeof shapes / sizeof shapes[0]; wi++) {
        const int64_t rows = shapes[wi][0], cols = shapes[wi][1];
        test_matrix m;
        make_q8_matrix_width(&f, rows, cols, (int)wi, &m);
        char what[96];
        snprintf(what, sizeof what, "q8_0 fused rows %lld cols %lld", (long long)rows, (long long)cols);
        float *x = rand_vec(cols, 31 + (uint64_t)wi), *x2 = malloc(sizeof(float) * 2 * (size_t)cols);
        memcpy(x2, x, sizeof(float) * (size_t)cols);
        memcpy(x2 + cols, x, sizeof(float) * (size_t)cols);
        float *y1 = malloc(sizeof(float) * (size_t)rows), *y2 = malloc(sizeof(float) * 2 * (size_t)rows);
        void *dw = to_device(m.q, (size_t)(rows * m.row_bytes), 0);
        float *dx = to_device(x2, sizeof(float) * 2 * (size_t)cols, 0), *dy = NULL;
        REQUIRE(dw && dx && ds4_cuda_malloc(g_cu, sizeof(float) * 2 * (size_t)rows, (void **)&dy) == DS4_OK);
        EXPECT_MSG(ds4_cuda_q8split_register(g_cu, dw, rows, cols) == DS4_OK, "%s: %s", what, ds4_last_error());
        EXPECT_MSG(ds4_cuda_matvec(g_cu, DS4_TYPE_Q8_0, dw, rows, cols, dx, 1, dy) == DS4_OK &&
                       ds4_cuda_sync(g_cu) == DS4_OK,
                   "%s: %s", what, ds4_last_error());
        EXPECT(ds4_cuda_download(g_cu, y1, dy, sizeof(float) * (size_t)rows) == DS4_OK);
        check_matvec_as(what, &m, x, 1, y1, DS4_TYPE_Q8_0);
        EXPECT_MSG(ds4_cuda_matvec(g_cu, DS4_TYPE_Q8_0, dw, rows, cols, dx, 2, dy) == DS4_OK &&
                       ds4_cuda_sync(g_cu) == DS4_OK,
                   "%s: %s", what, ds4_last_error());
        EXPECT(ds4_cuda_download(g_cu, y2, dy, sizeof(float) * 2 * (size_t)rows) == DS4_OK);
        int diff = 0;
        for (int64_t r = 0; r < rows; r++) diff += memcmp(&y1[r], &y2[r], sizeof(float)) != 0;
        EXPECT_MSG(diff == 0, "%s: %d rows differ from the two-launch path (first: %.9g vs %.9g)", what, diff,
                   y1[0], y2[0]);
        /* 13 copies (a pass of 8 tokens, one of 4, one of 1) and 16 (two of
         * 8, as 16 batched sessions): every token's row is the one token's */
        for (int nt = 13; nt <= 16; nt += 3) {
            float *xn = malloc(sizeof(float) * (size_t)(nt * cols)), *yn = malloc(sizeof(float) * (size_t)(nt * rows));
            for (int t = 0; t < nt; t++) memcpy(xn + t * cols, x, sizeof(float) * (size_t)cols);
            float *dxn = to_device(xn, sizeof(float) * (size_t)(nt * cols), 0), *dyn = NULL;
            REQUIRE(dxn && ds4_cuda_malloc(g_cu, sizeof(float) * (size_t)(nt * rows), (void **)&dyn) == DS4_OK);
            EXPECT_MSG(ds4_cuda_matvec(g_cu, DS4_TYPE_Q8_0, dw, rows, cols, dxn, nt, dyn) == DS4_OK &&
                           ds4_cuda_sync(g_cu) == DS4_OK,
                       "%s, %d tokens: %s", what, nt, ds4_last_error());
            EXPECT(ds4_cuda_download(g_cu, yn, dyn, sizeof(float) * (size_t)(nt * rows)) == DS4_OK);
            int dn = 0;
            for (int t = 0; t < nt; t++)
                for (int64_t r = 0; r < rows; r++) dn += memcmp(&yn[t * rows + r], &y1[r], sizeof(float)) != 0;
            EXPECT_MSG(dn == 0, "%s, %d tokens: %d values differ from the one-token product", what, nt, dn);
            ds4_cuda_free(g_cu, dxn);
            ds4_cuda_free(g_cu, dyn);
            free(xn);
            free(yn);
        }
        ds4_cuda_q8split_release(g_cu, dw);
        ds4_cuda_free(g_cu, dw);
        ds4_cuda_free(g_cu, dx);
        ds4_cuda_free(g_cu, dy);
        free(x);
        free(x2);
        free(y1);
        free(y2);
        free_matrix(&m);
    }
    cuda_fixture_free(&f);
}

/* Routed MoE: 5 experts of 40 rows; 3 tokens x 2 used experts; token 2's
 * second expert id is invalid and must give NaN, the rest exact. */
static void test_moe_matvec(void)
{
    if (!need_gpu()) return;
    static const ds4_type types[] = {DS4_TYPE_IQ2_XXS, DS4_TYPE_Q2_K, DS4_TYPE_Q8_0, DS4_TYPE_MXFP4};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        int fi = 0;
        while (CUDA_FIXTURES[fi].type != types[ti]) fi++;
        cuda_fixture f;
        REQUIRE(cuda_fixture_load(CUDA_FIXTURES[fi].file, &f) == 0);
        enum { NE = 5, ROWS = 40, NTOK = 3, NUSED = 2 };
        test_matrix ex[NE];
        uint8_t *all = malloc((size_t)(NE * ROWS * f.row_bytes));
        for (int e = 0; e < NE; e++) {
            make_matrix(&f, ROWS, 1, e * 2 + 1, &ex[e]);
            memcpy(all + (size_t)e * ROWS * f.row_bytes, ex[e].q, (size_t)(ROWS * f.row_bytes));
        }
        const int32_t ids[NTOK * NUSED] = {3, 0, 4, 3, 1, 7};
        for (int share = 0; share < 2; share++) {
            int64_t x_share = share ? NUSED : 1, nx = share ? NTOK : NTOK * NUSED;
            float *x = rand_vec(nx * f.n, 11 + (uint64_t)share);
            float *y = malloc(sizeof(float) * NTOK * NUSED * ROWS);
            void *dw = weights_to_device(all, (size_t)(NE * ROWS * f.row_bytes), 0, f.type, f.n);
            void *dids = to_device(ids, sizeof ids, 0);
            float *dx = to_device(x, sizeof(float) * (size_t)(nx * f.n), 0), *dy = NULL;
            REQUIRE(dw && dids && dx &&
                    ds4_cuda_malloc(g_cu, sizeof(float) * NTOK * NUSED * ROWS, (void **)&dy) == DS4_OK);
            ds4_status st = ds4_cuda_moe_matvec(g_cu, f.type, dw, NE, ROWS, f.n, dids, NTOK * NUSED,
                                                x_share, dx, dy);
            EXPECT_MSG(st == DS4_OK, "%s", ds4_last_error());
            EXPECT(ds4_cuda_sync(g_cu) == DS4_OK);
            EXPECT(ds4_cuda_download(g_cu, y, dy, sizeof(float) * NTOK * NUSED * ROWS) == DS4_OK);
            for (int s = 0; s < NTOK * NUSED; s++) {
                char what[128];
                snprintf(what, sizeof what, "moe %s slot %d expert %d x_share %lld",
                         CUDA_FIXTURES[fi].file, s, ids[s], (long long)x_share);
                if (ids[s] >= NE) {
                    for (int r = 0; r < ROWS; r++)
                        EXPECT_MSG(isnan(y[s * ROWS + r]), "%s: row %d not NaN", what, r);
                    continue;
                }
                const int q = ds4_cuda_mmvq_active(f.type, dw, f.n, ROWS * f.row_bytes);
                check_matvec_as(what, &ex[ids[s]], x + (s / x_share) * f.n, 1, y + s * ROWS,
                                q ? f.type : DS4_TYPE_F32);
            }
            ds4_cuda_free(g_cu, dw);
            ds4_cuda_free(g_cu, dids);
            ds4_cuda_free(g_cu, dx);
            ds4_cuda_free(g_cu, dy);
            free(x);
            free(y);
        }
        for (int e = 0; e < NE; e++) free_matrix(&ex[e]);
        free(all);
        cuda_fixture_free(&f);
    }
}

/* Token counts the tensor-core pass of 9-16 tokens (cuda_q8split_mma.cu,
 * on unless DS4_CUDA_Q8S_MMA=0; main sets it to 1) is checked at. */
static const int MMA_NT[] = {9, 13, 16};

/* Values of yn (nt tokens, ld apart, n each) that differ in bits from y1
 * (token t's one-token result, ld apart too); the first 3 printed. */
static int mma_diff(const char *what, const float *yn, const float *y1, int t, int64_t n, int64_t ld)
{
    int bad = 0;
    for (int64_t r = 0; r < n; r++)
        if (memcmp(&yn[t * ld + r], &y1[r], sizeof(float)) != 0 && bad++ < 3)
            fprintf(stderr, "    %s: token %d value %lld: %.9g, alone %.9g\n", what, t, (long long)r, yn[t * ld + r],
                    y1[r]);
    return bad;
}

/* A Q8_0 matrix on the device with its split-layout copy. */
static void *mma_matrix(const cuda_fixture *f, int64_t rows, int64_t cols, int seed, test_matrix *m)
{
    make_q8_matrix_width(f, rows, cols, seed, m);
    void *dw = to_device(m->q, (size_t)(rows * m->row_bytes), 0);
    if (dw) EXPECT_MSG(ds4_cuda_q8split_register(g_cu, dw, rows, cols) == DS4_OK, "q8 mma: %s", ds4_last_error());
    return dw;
}

static void mma_matrix_free(void *dw, test_matrix *m)
{
    ds4_cuda_q8split_release(g_cu, dw);
    ds4_cuda_free(g_cu, dw);
    free_matrix(m);
}

/* 9, 13 and 16 different tokens on a split-layout Q8_0 copy in one weight
 * pass on the tensor cores: every token's row bit for bit its own
 * one-token product. Flash's shapes: q_b-like rows of 1024, o_b's of
 * 8192, q_a (1024 x 4096) and kv (512 x 4096), and 1280 x 4096: on an H200
 * all of these have few 16-row tiles (16 warps a tile, the round-by-round
 * kernel); 9600 x 1024 and 4352 x 2048 take 8 warps a tile, the streaming
 * kernel, with more tiles than an H200 holds blocks at once, so its blocks
 * take several tiles each, their copies running across tile boundaries
 * (in tiles of 32 rows: 300 and 136 of them, at least one an SM);
 * 4368 x 1024 streams an odd number of 16-row tiles (273: no 32-row
 * ones). */
static void test_q8_mma_matvec(void)
{
    cuda_fixture f;
    if (!q8_split_fixture(&f)) return;
    static const int64_t shapes[][2] = {{1280, 1024}, {1280, 4096}, {1024, 4096}, {512, 4096}, {256, 8192},
                                               {9600, 1024}, {4352, 2048}, {4368, 1024}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t rows = shapes[si][0], cols = shapes[si][1];
        test_matrix m;
        void *dw = mma_matrix(&f, rows, cols, (int)si, &m);
        REQUIRE(dw);
        for (size_t ni = 0; ni < sizeof MMA_NT / sizeof MMA_NT[0]; ni++) {
            const int nt = MMA_NT[ni];
            char what[96];
            snprintf(what, sizeof what, "q8 mma %lld x %lld, %d tokens", (long long)rows, (long long)cols, nt);
            float *x = rand_vec(nt * cols, 77 + (uint64_t)(nt * 10 + si));
            float *yn = malloc(sizeof(float) * (size_t)(nt * rows)), *y1 = malloc(sizeof(float) * (size_t)rows);
            float *dx = to_device(x, sizeof(float) * (size_t)(nt * cols), 0), *dy = NULL;
            REQUIRE(dx && yn && y1 && ds4_cuda_malloc(g_cu, sizeof(float) * (size_t)(nt * rows), (void **)&dy) == DS4_OK);
            EXPECT_MSG(ds4_cuda_matvec(g_cu, DS4_TYPE_Q8_0, dw, rows, cols, dx, nt, dy) == DS4_OK &&
                           ds4_cuda_sync(g_cu) == DS4_OK,
                       "%s: %s", what, ds4_last_error());
            EXPECT(ds4_cuda_download(g_cu, yn, dy, sizeof(float) * (size_t)(nt * rows)) == DS4_OK);
            int bad = 0;
            for (int t = 0; t < nt; t++) {
                EXPECT(ds4_cuda_matvec(g_cu, DS4_TYPE_Q8_0, dw, rows, cols, dx + t * cols, 1, dy) == DS4_OK &&
                       ds4_cuda_sync(g_cu) == DS4_OK);
                EXPECT(ds4_cuda_download(g_cu, y1, dy, sizeof(float) * (size_t)rows) == DS4_OK);
                bad += mma_diff(what, yn, y1, t, rows, rows);
            }
            EXPECT_MSG(bad == 0, "%s: %d values differ from the one-token product", what, bad);
            ds4_cuda_free(g_cu, dx);
            ds4_cuda_free(g_cu, dy);
            free(x), free(yn), free(y1);
        }
        mma_matrix_free(dw, &m);
    }
    cuda_fixture_free(&f);
}

/* The shared expert's decode forms at Flash's shape (D 4096, F 2048) on
 * the tensor-core pass: h = SwiGLU(gate . x, up . x) (clamped at 0.75)
 * and out (+)= down . h, accumulating into values
 * already there and storing; each token's values bit for bit its own
 * one-token product's. */
static void test_q8_mma_ffn(void)
{
    cuda_fixture f;
    if (!q8_split_fixture(&f)) return;
    const int64_t D = 4096, F = 2048;
    const float clamp = 0.75f;
    test_matrix mg, mu, md;
    void *dg = mma_matrix(&f, F, D, 1, &mg), *du = mma_matrix(&f, F, D, 2, &mu), *dd = mma_matrix(&f, D, F, 3, &md);
    REQUIRE(dg && du && dd);
    for (size_t ni = 0; ni < sizeof MMA_NT / sizeof MMA_NT[0]; ni++) {
        const int nt = MMA_NT[ni];
        float *x = rand_vec(nt * D, 91 + (uint64_t)nt), *h = rand_vec(nt * F, 93 + (uint64_t)nt);
        float *o0 = rand_vec(nt * D, 95 + (uint64_t)nt);
        float *yn = malloc(sizeof(float) * (size_t)(nt * D)), *y1 = malloc(sizeof(float) * (size_t)D);
        float *dx = to_device(x, sizeof(float) * (size_t)(nt * D), 0), *dh = to_device(h, sizeof(float) * (size_t)(nt * F), 0);
        float *dy = NULL;
        REQUIRE(dx && dh && yn && y1 && ds4_cuda_malloc(g_cu, sizeof(float) * (size_t)(nt * D), (void **)&dy) == DS4_OK);
        char what[96];
        /* the gate/up pair: h of nt tokens at once, then of each alone */
        snprintf(what, sizeof what, "q8 mma swiglu %lld x %lld, %d tokens", (long long)F, (long long)D, nt);
        EXPECT_MSG(ds4_cuda_mmvq_swiglu(g_cu, DS4_TYPE_Q8_0, dg, du, F, D, NULL, 1, nt, 1, dx, clamp, dy) == DS4_OK &&
                       ds4_cuda_sync(g_cu) == DS4_OK,
                   "%s: %s", what, ds4_last_error());
        EXPECT(ds4_cuda_download(g_cu, yn, dy, sizeof(float) * (size_t)(nt * F)) == DS4_OK);
        int bad = 0;
        for (int t = 0; t < nt; t++) {
            EXPECT(ds4_cuda_mmvq_swiglu(g_cu, DS4_TYPE_Q8_0, dg, du, F, D, NULL, 1, 1, 1, dx + t * D, clamp, dy) ==
                       DS4_OK &&
                   ds4_cuda_sync(g_cu) == DS4_OK);
            EXPECT(ds4_cuda_download(g_cu, y1, dy, sizeof(float) * (size_t)F) == DS4_OK);
            bad += mma_diff(what, yn, y1, t, F, F);
        }
        EXPECT_MSG(bad == 0, "%s: %d values differ from the one-token product", what, bad);
        /* the down product, accumulating (out starts at o0) and storing */
        for (int acc = 1; acc >= 0; acc--) {
            snprintf(what, sizeof what, "q8 mma down %lld x %lld, %d tokens, %s", (long long)D, (long long)F, nt,
                     acc ? "accumulating" : "storing");
            EXPECT(ds4_cuda_upload(g_cu, dy, o0, sizeof(float) * (size_t)(nt * D)) == DS4_OK);
            EXPECT_MSG(ds4_cuda_mmvq_down(g_cu, DS4_TYPE_Q8_0, dd, D, F, NULL, 1, NULL, 1, nt, dh, dy, acc) == DS4_OK &&
                           ds4_cuda_sync(g_cu) == DS4_OK,
                       "%s: %s", what, ds4_last_error());
            EXPECT(ds4_cuda_download(g_cu, yn, dy, sizeof(float) * (size_t)(nt * D)) == DS4_OK);
            bad = 0;
            for (int t = 0; t < nt; t++) {
                EXPECT(ds4_cuda_upload(g_cu, dy, o0 + t * D, sizeof(float) * (size_t)D) == DS4_OK);
                EXPECT(ds4_cuda_mmvq_down(g_cu, DS4_TYPE_Q8_0, dd, D, F, NULL, 1, NULL, 1, 1, dh + t * F, dy, acc) ==
                           DS4_OK &&
                       ds4_cuda_sync(g_cu) == DS4_OK);
                EXPECT(ds4_cuda_download(g_cu, y1, dy, sizeof(float) * (size_t)D) == DS4_OK);
                bad += mma_diff(what, yn, y1, t, D, D);
            }
            EXPECT_MSG(bad == 0, "%s: %d values differ from the one-token product", what, bad);
        }
        ds4_cuda_free(g_cu, dx);
        ds4_cuda_free(g_cu, dh);
        ds4_cuda_free(g_cu, dy);
        free(x), free(h), free(o0), free(yn), free(y1);
    }
    mma_matrix_free(dg, &mg);
    mma_matrix_free(du, &mu);
    mma_matrix_free(dd, &md);
    cuda_fixture_free(&f);
}

/* o_a's block-diagonal form (8 groups of 512 x 4096; Flash's are 1024
 * rows) for 9, 13 and 16 tokens: token t, group g reads x row t * 8 + g
 * and writes y row t * 8 + g; each token's 8 x 512 values bit for bit
 * those of the one-token call on its 8 rows. */
static void test_q8_mma_grouped(void)
{
    cuda_fixture f;
    if (!q8_split_fixture(&f)) return;
    const int64_t G = 8, rows_g = 512, cols = 4096, n = G * rows_g;
    test_matrix m;
    void *dw = mma_matrix(&f, n, cols, 5, &m);
    REQUIRE(dw);
    for (size_t ni = 0; ni < sizeof MMA_NT / sizeof MMA_NT[0]; ni++) {
        const int nt = MMA_NT[ni];
        char what[96];
        snprintf(what, sizeof what, "q8 mma grouped %lld x %lld x %lld, %d tokens", (long long)G, (long long)rows_g,
                 (long long)cols, nt);
        float *x = rand_vec(nt * G * cols, 97 + (uint64_t)nt);
        float *yn = malloc(sizeof(float) * (size_t)(nt * n)), *y1 = malloc(sizeof(float) * (size_t)n);
        float *dx = to_device(x, sizeof(float) * (size_t)(nt * G * cols), 0), *dy = NULL;
        REQUIRE(dx && yn && y1 && ds4_cuda_malloc(g_cu, sizeof(float) * (size_t)(nt * n), (void **)&dy) == DS4_OK);
        EXPECT_MSG(ds4_cuda_matvec_grouped(g_cu, DS4_TYPE_Q8_0, dw, G, rows_g, cols, dx, nt, dy) == DS4_OK &&
                       ds4_cuda_sync(g_cu) == DS4_OK,
                   "%s: %s", what, ds4_last_error());
        EXPECT(ds4_cuda_download(g_cu, yn, dy, sizeof(float) * (size_t)(nt * n)) == DS4_OK);
        int bad = 0;
        for (int t = 0; t < nt; t++) {
            EXPECT(ds4_cuda_matvec_grouped(g_cu, DS4_TYPE_Q8_0, dw, G, rows_g, cols, dx + t * G * cols, 1, dy) ==
                       DS4_OK &&
                   ds4_cuda_sync(g_cu) == DS4_OK);
            EXPECT(ds4_cuda_download(g_cu, y1, dy, sizeof(float) * (size_t)n) == DS4_OK);
            bad += mma_diff(what, yn, y1, t, n, n);
        }
        EXPECT_MSG(bad == 0, "%s: %d values differ from the one-token product", what, bad);
        ds4_cuda_free(g_cu, dx);
        ds4_cuda_free(g_cu, dy);
        free(x), free(yn), free(y1);
    }
    mma_matrix_free(dw, &m);
    cuda_fixture_free(&f);
}

/* The prefill experts' tensor-core kernels (cuda_moe_mma.cu) against the
 * CPU scalar kernel on the same activation rows, bit for bit: IQ2_XXS gate
 * and up (1024 x 4096 an expert) and Q2_K down (2048 x 2048), 3 experts,
 * groups of 64 tokens (8 full tiles), 37, 1, 5, 43 and 8, one expert in
 * several groups. Blocks of all-equal activations give the extreme 16-value
 * sums (-2032 and 2032: every value -127 or 127) that the Q2_K mins' f16
 * product must hold exactly. Rows checked: the first 256 (every warp and lane of two row
 * blocks) and every 29th. */
static void test_moe_mma_matches_cpu(void)
{
    if (!need_gpu()) return;
    enum { NE = 3, NG = 6, NACT = 158 + 7 };
    static const int32_t groups[NG * 4] = {0, 0, 64, 0, 1, 64, 37, 0, 2, 101, 1, 0,
                                           0, 102, 5, 0, 2, 107, 43, 0, 1, 150, 8, 0};
    static const struct {
        ds4_type type;
        const char *file;
        int64_t rows, nmat;
    } cases[] = {{DS4_TYPE_IQ2_XXS, "quants/iq2_xxs-n4096-imatrix.bin", 1024, 2},
                 {DS4_TYPE_Q2_K, "quants/q2_K-n2048-plain.bin", 2048, 1}};
    for (size_t ci = 0; ci < 2; ci++) {
        cuda_fixture f;
        REQUIRE(cuda_fixture_load(cases[ci].file, &f) == 0);
        const ds4_type type = cases[ci].type;
        const int64_t rows = cases[ci].rows, cols = f.n, nmat = cases[ci].nmat;
        test_matrix m[2];
        void *dw[2] = {NULL, NULL};
        for (int k = 0; k < nmat; k++) {
            make_matrix(&f, NE * rows, 1, 1 + 3 * k, &m[k]);
            dw[k] = weights_to_device(m[k].q, (size_t)(NE * rows * m[k].row_bytes), 0, type, cols);
            REQUIRE(dw[k]);
        }
        float *x = rand_vec(NACT * cols, 401 + ci);
        for (int64_t i = 0; i < 256; i++) x[5 * cols + i] = -3.0f, x[6 * cols + 512 + i] = 2.0f;
        for (int64_t i = 7 * cols; i < 8 * cols; i += 97) x[i] *= 40.0f;
        const int64_t ab = ds4_cuda_mmvq_act_bytes(type, cols), y_ld = nmat * rows;
        float *dx = to_device(x, sizeof(float) * (size_t)(NACT * cols), 0), *dy = NULL;
        void *dact = NULL;
        REQUIRE(dx && ds4_cuda_malloc(g_cu, (size_t)(NACT * ab), &dact) == DS4_OK &&
                ds4_cuda_malloc(g_cu, sizeof(float) * (size_t)(NACT * y_ld), (void **)&dy) == DS4_OK);
        EXPECT(ds4_cuda_mmvq_quantize(g_cu, type, dx, cols, NACT, cols, dact) == DS4_OK);
        const ds4_status st = ds4_cuda_moe_mma_products(g_cu, type, dw[0], dw[nmat - 1], rows, cols, groups, NG, dact,
                                                        ab, dy, y_ld);
        EXPECT_MSG(st == DS4_OK, "moe mma products, type %d: %s", (int)type, ds4_last_error());
        uint8_t *act = malloc((size_t)(NACT * ab));
        float *y = malloc(sizeof(float) * (size_t)(NACT * y_ld));
        EXPECT(ds4_cuda_download(g_cu, act, dact, (size_t)(NACT * ab)) == DS4_OK &&
               ds4_cuda_download(g_cu, y, dy, sizeof(float) * (size_t)(NACT * y_ld)) == DS4_OK);
        const int16_t *bs5 = (const int16_t *)(act + 5 * ab + cols + 4 * (cols / 256));
        EXPECT_MSG(bs5[0] == -2032, "the all -3 block's first sum is %d, not -2032", bs5[0]);
        int bad = 0, checked = 0;
        for (int gi = 0; gi < NG; gi++)
            for (int t = groups[4 * gi + 1]; t < groups[4 * gi + 1] + groups[4 * gi + 2]; t++)
                for (int k = 0; k < nmat; k++)
                    for (int64_t r = 0; r < rows; r++) {
                        if (r >= 256 && r % 29) continue;
                        float want = 0.0f;
                        const int64_t wr = (int64_t)groups[4 * gi] * rows + r;
                        ds4_cpu_dot_scalar(type)(cols, m[k].q + wr * m[k].row_bytes, act + t * ab, (size_t)ab, 1, &want);
                        const float got = y[t * y_ld + k * rows + r];
                        checked++;
                        if (memcmp(&got, &want, sizeof got) != 0 && bad++ < 3)
                            fprintf(stderr, "    type %d group %d token %d matrix %d row %lld: %.9g, CPU %.9g\n",
                                    (int)type, gi, t, k, (long long)r, got, want);
                    }
        EXPECT_MSG(bad == 0, "moe mma, type %d: %d of %d values differ from the CPU scalar kernel's", (int)type, bad,
                   checked);
        printf("    moe mma type %d: %d values, %d differ from the CPU's\n", (int)type, checked, bad);
        for (int k = 0; k < nmat; k++) ds4_cuda_free(g_cu, dw[k]), free_matrix(&m[k]);
        ds4_cuda_free(g_cu, dx), ds4_cuda_free(g_cu, dy), ds4_cuda_free(g_cu, dact);
        free(x), free(act), free(y);
        cuda_fixture_free(&f);
    }
}

/* Prefill GEMM in both precisions, through ds4_cuda_matmul (n_tok > 16). */
static void test_gemm_both_precisions(void)
{
    if (!need_gpu()) return;
    static const ds4_type types[] = {DS4_TYPE_Q8_0, DS4_TYPE_IQ2_XXS, DS4_TYPE_Q4_K, DS4_TYPE_BF16};
    const int64_t n_tok = 40, rows = 300;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        int fi = 0;
        while (CUDA_FIXTURES[fi].type != types[ti]) fi++;
        cuda_fixture f;
        REQUIRE(cuda_fixture_load(CUDA_FIXTURES[fi].file, &f) == 0);
        test_matrix m;
        make_matrix(&f, rows, 1, 3, &m);
        float *x = rand_vec(n_tok * m.cols, 5);
        float *y = malloc(sizeof(float) * (size_t)(n_tok * rows));
        void *dw = weights_to_device(m.q, (size_t)(rows * m.row_bytes), 0, types[ti], m.cols);
        float *dx = to_device(x, sizeof(float) * (size_t)(n_tok * m.cols), 0), *dy = NULL;
        REQUIRE(dw && dx && ds4_cuda_malloc(g_cu, sizeof(float) * (size_t)(n_tok * rows), (void **)&dy) == DS4_OK);
        for (int prec = 0; prec < 2; prec++) {
            ds4_cuda_set_gemm_precision(g_cu, prec ? DS4_CUDA_GEMM_F32 : DS4_CUDA_GEMM_BF16);
            ds4_status st = ds4_cuda_matmul(g_cu, f.type, dw, rows, m.cols, dx, n_tok, dy);
            EXPECT_MSG(st == DS4_OK, "%s", ds4_last_error());
            EXPECT(ds4_cuda_sync(g_cu) == DS4_OK);
            EXPECT(ds4_cuda_download(g_cu, y, dy, sizeof(float) * (size_t)(n_tok * rows)) == DS4_OK);
            double e2 = 0.0, r2 = 0.0;
            for (int64_t t = 0; t < n_tok; t++)
                for (int64_t r = 0; r < rows; r++) {
                    double ref = 0.0;
                    for (int64_t c = 0; c < m.cols; c++)
                        ref += (double)m.deq[r * m.cols + c] * x[t * m.cols + c];
                    double d = y[t * rows + r] - ref;
                    e2 += d * d;
                    r2 += ref * ref;
                }
            double rel = sqrt(e2 / r2), tol = prec ? 1e-5 : 1e-2;
            EXPECT_MSG(rel <= tol, "gemm %s %s: relative error %.3g > %.3g", CUDA_FIXTURES[fi].file,
                       prec ? "f32" : "bf16", rel, tol);
        }
        ds4_cuda_set_gemm_precision(g_cu, DS4_CUDA_GEMM_BF16);
        ds4_cuda_free(g_cu, dw);
        ds4_cuda_free(g_cu, dx);
        ds4_cuda_free(g_cu, dy);
        free(x);
        free(y);
        free_matrix(&m);
        cuda_fixture_free(&f);
    }
}

/* The prefill GEMM on a Q8_0 matrix with its resident bf16 copy
 * (cuda_gemm_bf16copy.cu) gives the bits of the GEMM that dequantizes
 * (the copy holds the same bf16 values), for the whole matrix and for a
 * block of its rows (one group of a block-diagonal product); after the
 * release, the dequantizing path again. The copy is made only with room to
 * spare: on a GPU without it the test says so and checks the rest. */
static void test_gemm_bf16_copy_same_bits(void)
{
    if (!need_gpu()) return;
    int fi = 0;
    while (CUDA_FIXTURES[fi].type != DS4_TYPE_Q8_0) fi++;
    cuda_fixture f;
    REQUIRE(cuda_fixture_load(CUDA_FIXTURES[fi].file, &f) == 0);
    const int64_t n_tok = 40, rows = 384, blk0 = 128, blk = 128;
    test_matrix m;
    make_matrix(&f, rows, 1, 7, &m);
    const size_t ny = (size_t)(n_tok * rows), wbytes = (size_t)(rows * m.row_bytes);
    float *x = rand_vec(n_tok * m.cols, 9), *y[4];
    for (int i = 0; i < 4; i++) y[i] = malloc(sizeof(float) * ny);
    uint8_t *zero = calloc(1, wbytes);
    void *dw = to_device(m.q, wbytes, 0);
    float *dx = to_device(x, sizeof(float) * (size_t)(n_tok * m.cols), 0), *dy = NULL;
    REQUIRE(zero && dw && dx && ds4_cuda_malloc(g_cu, sizeof(float) * ny, (void **)&dy) == DS4_OK);
    ds4_cuda_set_gemm_precision(g_cu, DS4_CUDA_GEMM_BF16);
    /* y[0], y[2]: whole and row block, dequantizing; y[1], y[3]: with the
     * copy made and the original's bytes then zeroed, so only the copy
     * can give them */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            EXPECT_MSG(ds4_cuda_bf16copy_register(g_cu, dw, rows, m.cols) == DS4_OK, "%s", ds4_last_error());
            EXPECT_MSG(ds4_cuda_bf16copy_make_pending(g_cu) == DS4_OK, "%s", ds4_last_error());
            EXPECT(ds4_cuda_upload(g_cu, dw, zero, wbytes) == DS4_OK);
        }
        EXPECT(ds4_cuda_gemm(g_cu, DS4_TYPE_Q8_0, dw, rows, m.cols, dx, n_tok, dy) == DS4_OK);
        EXPECT(ds4_cuda_sync(g_cu) == DS4_OK);
        EXPECT(ds4_cuda_download(g_cu, y[pass], dy, sizeof(float) * ny) == DS4_OK);
        EXPECT(ds4_cuda_gemm(g_cu, DS4_TYPE_Q8_0, (const uint8_t *)dw + blk0 * m.row_bytes, blk, m.cols, dx, n_tok,
                             dy) == DS4_OK);
        EXPECT(ds4_cuda_sync(g_cu) == DS4_OK);
        EXPECT(ds4_cuda_download(g_cu, y[2 + pass], dy, sizeof(float) * (size_t)(n_tok * blk)) == DS4_OK);
    }
    int zeros = 1;
    for (size_t i = 0; i < ny; i++) zeros &= y[1][i] == 0.0f;
    if (zeros) {
        printf("    (no copy: the device lacked the room; the dequantizing GEMM read the zeroed bytes)\n");
    } else {
        EXPECT_MSG(memcmp(y[0], y[1], sizeof(float) * ny) == 0, "whole matrix: the copy's GEMM differs");
        EXPECT_MSG(memcmp(y[2], y[3], sizeof(float) * (size_t)(n_tok * blk)) == 0,
                   "row block: the copy's GEMM differs");
    }
    ds4_cuda_bf16copy_release(g_cu, dw);
    ds4_cuda_bf16copy_release(g_cu, dw); /* a second release finds nothing */
    EXPECT(ds4_cuda_gemm(g_cu, DS4_TYPE_Q8_0, dw, rows, m.cols, dx, n_tok, dy) == DS4_OK); /* dequantizes zeros */
    EXPECT(ds4_cuda_sync(g_cu) == DS4_OK);
    EXPECT(ds4_cuda_download(g_cu, y[1], dy, sizeof(float) * ny) == DS4_OK);
    int nz = 0;
    for (size_t i = 0; i < ny; i++) nz += y[1][i] != 0.0f;
    EXPECT_MSG(nz == 0, "after the release: %d outputs not from the (zeroed) original", nz);
    /* Registration only notes the weight; the copy is made at the first
     * GEMM after it (sessions created in between get the memory first).
     * Noted while holding the matrix, then zeroed, then the GEMM: the copy
     * holds zeros, so the product is 0 (an eager copy gives y[0]); after
     * the release and the matrix restored, y[0] again. */
    EXPECT_MSG(ds4_cuda_bf16copy_register(g_cu, dw, rows, m.cols) == DS4_OK, "%s", ds4_last_error());
    EXPECT(ds4_cuda_upload(g_cu, dw, m.q, wbytes) == DS4_OK);
    EXPECT_MSG(ds4_cuda_bf16copy_register(g_cu, dw, rows, m.cols) == DS4_OK, "%s", ds4_last_error()); /* noted once */
    EXPECT(ds4_cuda_upload(g_cu, dw, zero, wbytes) == DS4_OK);
    EXPECT(ds4_cuda_gemm(g_cu, DS4_TYPE_Q8_0, dw, rows, m.cols, dx, n_tok, dy) == DS4_OK);
    EXPECT(ds4_cuda_download(g_cu, y[1], dy, sizeof(float) * ny) == DS4_OK);
    nz = 0;
    for (size_t i = 0; i < ny; i++) nz += y[1][i] != 0.0f;
    EXPECT_MSG(nz == 0, "a noted weight's copy was made before the GEMM: %d outputs from the earlier bytes", nz);
    ds4_cuda_bf16copy_release(g_cu, dw);
    EXPECT(ds4_cuda_upload(g_cu, dw, m.q, wbytes) == DS4_OK);
    EXPECT(ds4_cuda_gemm(g_cu, DS4_TYPE_Q8_0, dw, rows, m.cols, dx, n_tok, dy) == DS4_OK);
    EXPECT(ds4_cuda_download(g_cu, y[1], dy, sizeof(float) * ny) == DS4_OK);
    EXPECT_MSG(memcmp(y[0], y[1], sizeof(float) * ny) == 0, "after the release: not the dequantizing GEMM's bits");
    ds4_cuda_free(g_cu, dw);
    ds4_cuda_free(g_cu, dx);
    ds4_cuda_free(g_cu, dy);
    free(x);
    free(zero);
    for (int i = 0; i < 4; i++) free(y[i]);
    free_matrix(&m);
    cuda_fixture_free(&f);
}

/* The device quantizer writes the CPU's bytes (Q8_0 and Q8_K formats),
 * for several rows at once, with ties of magnitude, zero blocks and
 * non-finite values among the inputs. */
static void test_mmvq_quantizer_matches_cpu(void)
{
    if (!need_gpu()) return;
    static const ds4_type types[] = {DS4_TYPE_Q8_0, DS4_TYPE_IQ2_XXS};
    enum { ROWS = 5, COLS = 4096 };
    for (size_t ti = 0; ti < 2; ti++) {
        const ds4_type type = types[ti];
        const ds4_act_kind kind = ds4_cpu_act_kind(type);
        const size_t ab = ds4_act_row_bytes(kind, COLS);
        REQUIRE((int64_t)ab == ds4_cuda_mmvq_act_bytes(type, COLS));
        float *x = rand_vec(ROWS * COLS, 31 + ti);
        for (int i = 0; i < ROWS * COLS; i += 301) x[i] *= 40.0f;
        x[7] = -2.5f, x[8] = 2.5f;
        for (int i = 512; i < 768; i++) x[i] = 0.0f;
        x[COLS + 3] = NAN;
        x[2 * COLS + 1000] = INFINITY;
        uint8_t *want = calloc(ROWS, ab), *got = calloc(ROWS, ab);
        for (int r = 0; r < ROWS; r++) ds4_act_quantize(kind, x + r * COLS, COLS, want + r * ab);
        float *dx = to_device(x, sizeof(float) * ROWS * COLS, 0);
        void *dq = NULL;
        REQUIRE(dx && ds4_cuda_malloc(g_cu, ROWS * ab, &dq) == DS4_OK);
        EXPECT(ds4_cuda_mmvq_quantize(g_cu, type, dx, COLS, ROWS, COLS, dq) == DS4_OK);
        EXPECT(ds4_cuda_sync(g_cu) == DS4_OK);
        EXPECT(ds4_cuda_download(g_cu, got, dq, ROWS * ab) == DS4_OK);
        for (int r = 0; r < ROWS; r++) {
            /* the rows with a NaN / an inf: only the blocks without them are compared */
            const int64_t skip = r == 1 ? 0 : r == 2 ? 1000 : -1;
            const int64_t be = kind == DS4_ACT_Q8_0 ? 32 : 256;
            int bad = 0;
            for (int64_t b = 0; b < COLS / be; b++) {
                if (skip >= 0 && skip / be == b) continue;
                const uint8_t *w = want + r * ab, *g = got + r * ab;
                int same = memcmp(w + b * be, g + b * be, (size_t)be) == 0 &&
                           memcmp(w + COLS + 4 * b, g + COLS + 4 * b, 4) == 0;
                if (kind == DS4_ACT_Q8_K) {
                    const size_t bo = (size_t)COLS + 4 * (COLS / 256) + 2 * 16 * (size_t)b;
                    same = same && memcmp(w + bo, g + bo, 32) == 0;
                }
                if (!same && bad++ < 3)
                    test_fail_at(__FILE__, __LINE__, "type %d row %d block %lld: quantized bytes differ from the CPU's",
                                 (int)type, r, (long long)b);
            }
        }
        ds4_cuda_free(g_cu, dx);
        ds4_cuda_free(g_cu, dq);
        free(x);
        free(want);
        free(got);
    }
}

static void test_rejects_bad_arguments(void)
{
    if (!need_gpu()) return;
    float *d = NULL;
    REQUIRE(ds4_cuda_malloc(g_cu, 1 << 20, (void **)&d) == DS4_OK);
    EXPECT(ds4_cuda_matvec(g_cu, DS4_TYPE_Q2_K, d, 4, 100, d, 1, d) == DS4_ERR_INVALID);
    EXPECT(ds4_cuda_matvec(g_cu, DS4_TYPE_Q8_K, d, 4, 256, d, 1, d) == DS4_ERR_UNSUPPORTED);
    EXPECT(ds4_cuda_matvec(g_cu, DS4_TYPE_Q8_0, d, 4, 256, (float *)((char *)d + 4), 1, d) == DS4_ERR_INVALID);
    EXPECT(ds4_cuda_matvec(g_cu, DS4_TYPE_Q8_0, d, 4, 256, d, 0, d) == DS4_ERR_INVALID);
    EXPECT(ds4_cuda_moe_matvec(g_cu, DS4_TYPE_Q8_0, d, 0, 4, 256, (int32_t *)d, 1, 1, d, d) == DS4_ERR_INVALID);
    ds4_cuda_free(g_cu, d);
}

/* The greedy pick (cuda_argmax.cu; ops.h argmax_rows of the backend,
 * cuda_ops_pick.cu) against ds4_argmax_excluding on the crafted rows of
 * tests/argmax_cases.h: ties at several indices, the maximum at the
 * excluded id, NaN everywhere but one value, all -inf (-> -1), -0 against
 * +0, +inf, Flash's 129,280-value rows of random values (thousands of ties
 * at the maximum), widths that are no multiple of a block, a warp or a
 * 16-byte load (later rows then start off a 16-byte boundary). Each
 * case's rows in one launch, every pick equal; then the backend op (the
 * picks through page-locked memory) and its copy op. */
/* The picks of case c's rows: from the kernel (op NULL) or the backend's op. */
static ds4_status picks_of(const am_case *c, ds4_backend *op, int32_t *got)
{
    const size_t bytes = ((size_t)c->n * (size_t)c->rows + 1) * sizeof(float);
    if (op) {
        float *d = op->alloc(op, bytes);
        if (!d) return DS4_ERR_NOMEM;
        op->upload(op, d, c->x, bytes - sizeof(float));
        ds4_status st = op->argmax_rows(op, d, c->rows, c->n, c->excluded, got);
        op->free(op, d);
        return st;
    }
    void *d = NULL, *d_out = NULL;
    ds4_status st = ds4_cuda_malloc(g_cu, bytes, &d);
    if (st == DS4_OK) st = ds4_cuda_malloc(g_cu, (size_t)c->rows * sizeof(int32_t), &d_out);
    if (st == DS4_OK) st = ds4_cuda_upload(g_cu, d, c->x, bytes - sizeof(float));
    if (st == DS4_OK) st = ds4_cuda_argmax_rows(g_cu, d, c->rows, c->n, c->excluded, d_out);
    if (st == DS4_OK) st = ds4_cuda_download(g_cu, got, d_out, (size_t)c->rows * sizeof(int32_t));
    ds4_cuda_free(g_cu, d);
    ds4_cuda_free(g_cu, d_out);
    return st;
}

static void check_cases(ds4_backend *op)
{
    int n_cases = 0;
    am_case *c = am_cases(&n_cases);
    REQUIRE(c);
    int rows = 0, wrong = 0;
    for (int k = 0; k < n_cases; k++) {
        int32_t got[8];
        REQUIRE(c[k].rows <= 8);
        for (int r = 0; r < c[k].rows; r++) got[r] = -7;
        ds4_status st = picks_of(&c[k], op, got);
        EXPECT_MSG(st == DS4_OK, "%s: %s", c[k].what, ds4_last_error());
        if (st != DS4_OK) continue;
        for (int r = 0; r < c[k].rows; r++, rows++) {
            const int32_t want = ds4_argmax_excluding(c[k].x + (size_t)r * c[k].n, c[k].n, c[k].excluded);
            wrong += got[r] != want;
            EXPECT_MSG(got[r] == want, "%s, row %d: the GPU picked %d, ds4_argmax_excluding %d", c[k].what, r, got[r],
                       want);
        }
    }
    printf("    %s: %d cases, %d rows, %d picks differ\n", op ? "backend op" : "kernel", n_cases, rows, wrong);
    am_cases_free(c, n_cases);
}

static void test_argmax_kernel_matches_host(void)
{
    if (!need_gpu()) return;
    check_cases(NULL);
    /* refused before a launch */
    EXPECT(ds4_cuda_argmax_rows(g_cu, NULL, 1, 4, -1, NULL) == DS4_ERR_INVALID);
    float *x = NULL;
    REQUIRE(ds4_cuda_malloc(g_cu, 64, (void **)&x) == DS4_OK);
    EXPECT(ds4_cuda_argmax_rows(g_cu, x, 0, 4, -1, (int32_t *)x) == DS4_ERR_INVALID);
    EXPECT(ds4_cuda_argmax_rows(g_cu, x, 1, (int64_t)1 << 32, -1, (int32_t *)x) == DS4_ERR_INVALID);
    ds4_cuda_free(g_cu, x);
}

static void test_argmax_op_matches_host(void)
{
    if (!need_gpu()) return;
    ds4_backend *be = ds4_backend_cuda_create(0);
    REQUIRE(be);
    REQUIRE(be->argmax_rows && be->copy);
    check_cases(be);
    /* the copy op, in order with the ops: a row moved, then picked */
    float h[100], back[100];
    for (int i = 0; i < 100; i++) h[i] = (float)((i * 37) % 100);
    float *a = be->alloc(be, sizeof h), *b = be->alloc(be, sizeof h);
    REQUIRE(a && b);
    be->upload(be, a, h, sizeof h);
    be->copy(be, b, a, sizeof h);
    int32_t got = -7;
    EXPECT(be->argmax_rows(be, b, 1, 100, -1, &got) == DS4_OK && got == ds4_argmax_excluding(h, 100, -1));
    be->download(be, back, b, sizeof h);
    EXPECT(memcmp(back, h, sizeof h) == 0);
    EXPECT(be->argmax_rows(be, b, 0, 100, -1, &got) == DS4_ERR_INVALID);
    be->free(be, a);
    be->free(be, b);
    be->destroy(be);
}
/* The L2 probe (ds4-gpubench --l2probe) on a buffer of a quarter of the
 * L2 (16 MB at most): every case timed, and the read after a warm read
 * faster than the one after the flush (the L2 serves it; medians of five
 * runs), so a flush that did not evict, or a case that read nothing,
 * shows; sizes not multiples of 16 refused. */
static int l2_cmp(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static void test_l2_probe(void)
{
    if (!need_gpu()) return;
    ds4_cuda_l2probe r;
    size_t w = (size_t)16 << 20;
    REQUIRE(ds4_cuda_l2_probe(g_cu, w, (size_t)8 << 20, (size_t)16 << 20, &r) == DS4_OK);
    if (r.l2_bytes / 4 < w) w = r.l2_bytes / 4 / 16 * 16; /* a small L2 (6 MB on some sm_86 cards) */
    double cold[5], warm[5];
    for (int i = 0; i < 5; i++) {
        REQUIRE(w >= 16 && ds4_cuda_l2_probe(g_cu, w, (size_t)8 << 20, (size_t)16 << 20, &r) == DS4_OK);
        cold[i] = r.plain.cold_us, warm[i] = r.plain.warm_us;
    }
    qsort(cold, 5, sizeof cold[0], l2_cmp);
    qsort(warm, 5, sizeof warm[0], l2_cmp);
    const ds4_cuda_l2probe_times *t = &r.plain;
    EXPECT(t->cold_us > 0 && t->warm_us > 0 && t->warm_last_us > 0 && t->warm_then_other_us > 0 &&
           t->warm_last_then_other_first_us > 0 && t->cold_after_last_us > 0);
    EXPECT_MSG(cold[2] > 1.1 * warm[2], "cold read %.2f us, warm %.2f us (medians of 5)", cold[2], warm[2]);
    EXPECT(!r.bulk || (t->bulk_us > 0 && t->bulk_last_us > 0 && t->bulk_last_then_other_first_us > 0));
    EXPECT(r.persist_bytes <= ((size_t)16 << 20));
    printf("  l2 probe, %zu KB: cold %.2f us, warm %.2f (medians), bulk %.2f, warm_last+8MB %.2f; %zu MB set "
           "aside: cold %.2f, warm_last+8MB %.2f\n",
           w >> 10, cold[2], warm[2], t->bulk_us, t->warm_last_then_other_first_us, r.persist_bytes >> 20,
           r.persist.cold_us, r.persist.warm_last_then_other_first_us);
    EXPECT(ds4_cuda_l2_probe(g_cu, 100, 64, 0, &r) == DS4_ERR_INVALID);
}
#else
static int g_cu;
static void skip_all(void) { test_skip(TEST_SKIP_NO_CUDA); }
#define test_dequantize_kernel_matches_ggml skip_all
#define test_weight_runs_on_device skip_all
#define test_matvec_all_types skip_all
#define test_moe_matvec skip_all
#define test_q8_fused_matvec skip_all
#define test_q8_mma_matvec skip_all
#define test_q8_mma_ffn skip_all
#define test_q8_mma_grouped skip_all
#define test_moe_mma_matches_cpu skip_all
#define test_gemm_both_precisions skip_all
#define test_gemm_bf16_copy_same_bits skip_all
#define test_rejects_bad_arguments skip_all
#define test_mmvq_quantizer_matches_cpu skip_all
#define test_fmv_float_weights skip_all
#define test_l2_probe skip_all
#define test_argmax_kernel_matches_host skip_all
#define test_argmax_op_matches_host skip_all
#endif

int main(void)
{
    setenv("DS4_CUDA_Q8S_MMA", "1", 1); /* the tensor-core pass of 9-16 tokens (the default), read once:
                                           the test_q8_mma_* tests need it whatever the caller's environment */
#if DS4_HAVE_CUDA
    if (ds4_cuda_device_count() > 0) {
        if (ds4_cuda_open(0, &g_cu) != DS4_OK) printf("cuda open failed: %s\n", ds4_last_error());
        else printf("device: %s\n", ds4_cuda_device_desc(g_cu));
    }
#else
    (void)g_cu;
#endif
    RUN(test_weight_runs_on_device);
    RUN(test_dequantize_kernel_matches_ggml);
    RUN(test_matvec_all_types);
    RUN(test_moe_matvec);
    RUN(test_q8_fused_matvec);
    RUN(test_q8_mma_matvec);
    RUN(test_q8_mma_ffn);
    RUN(test_q8_mma_grouped);
    RUN(test_moe_mma_matches_cpu);
    RUN(test_gemm_both_precisions);
    RUN(test_gemm_bf16_copy_same_bits);
    RUN(test_rejects_bad_arguments);
    RUN(test_mmvq_quantizer_matches_cpu);
    RUN(test_fmv_float_weights);
    RUN(test_l2_probe);
    RUN(test_argmax_kernel_matches_host);
    RUN(test_argmax_op_matches_host);
#if DS4_HAVE_CUDA
    ds4_cuda_close(g_cu);
#endif
    return test_finish();
}

/*
 * test_cuda_decode.c - the CUDA kernels' block decoders, run on the host.
 *
 * backend/cuda/cuda_blocks.cuh decodes every weight type for all kernels;
 * its functions also compile for the host, so this test checks them on any
 * machine with nvcc, GPU or not, against ggml's own output in
 * tests/data/quants: the dequantized floats must match bit for bit, and a
 * dot product must match the double-precision dot of ggml's dequantized
 * row (dot_exact) to within float rounding of a 4096-term sum.
 */
#include "tests/test.h"
#include "tests/test_cuda_fixture.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>

#if DS4_HAVE_CUDA
#include "backend/cpu/cpu_matmul_kernels.h"
#include "backend/cuda/cuda_api.h"

static void test_host_dequantize_matches_ggml(void)
{
    for (int i = 0; i < N_CUDA_FIXTURES; i++) {
        cuda_fixture f;
        REQUIRE(cuda_fixture_load(CUDA_FIXTURES[i].file, &f) == 0);
        EXPECT(f.type == CUDA_FIXTURES[i].type);
        EXPECT((int64_t)ds4_cuda_row_bytes(f.type, f.n) == f.row_bytes);
        float *out = malloc(sizeof(float) * (size_t)f.n);
        int bad = 0;
        for (int64_t r = 0; r < f.rows; r++) {
            EXPECT(ds4_cuda_host_dequantize_row(f.type, f.q + r * f.row_bytes, f.n, out) == DS4_OK);
            for (int64_t c = 0; c < f.n; c++) {
                if (memcmp(&out[c], &f.deq[r * f.n + c], 4) != 0) {
                    if (bad++ < 3)
                        test_fail_at(__FILE__, __LINE__, "%s row %lld col %lld: %.9g != ggml %.9g",
                                     CUDA_FIXTURES[i].file, (long long)r, (long long)c,
                                     (double)out[c], (double)f.deq[r * f.n + c]);
                }
            }
        }
        free(out);
        cuda_fixture_free(&f);
    }
}

static void test_host_dot_matches_exact(void)
{
    for (int i = 0; i < N_CUDA_FIXTURES; i++) {
        cuda_fixture f;
        REQUIRE(cuda_fixture_load(CUDA_FIXTURES[i].file, &f) == 0);
        for (int64_t r = 0; r < f.rows; r++) {
            float got = 0.0f;
            EXPECT(ds4_cuda_host_dot_row(f.type, f.q + r * f.row_bytes, f.n, f.y, &got) == DS4_OK);
            double mag = 0.0;
            for (int64_t c = 0; c < f.n; c++) mag += fabs((double)f.deq[r * f.n + c] * f.y[c]);
            /* float sums of 4096 products: error well under 1e-5 of sum|w x| */
            double tol = 1e-5 * mag + 1e-30;
            EXPECT_MSG(fabs(got - f.dot_exact[r]) <= tol, "%s row %lld: dot %.9g vs exact %.9g (tol %.3g)",
                       CUDA_FIXTURES[i].file, (long long)r, (double)got, f.dot_exact[r], tol);
        }
        cuda_fixture_free(&f);
    }
}

/* Activations with the shapes a quantizer must get right: random values,
 * ties of magnitude with opposite signs (the first one sets the Q8_K
 * scale), an all-zero block, a value exactly at a rounding tie. */
static void fill_activations(float *x, int64_t n, uint64_t seed)
{
    for (int64_t i = 0; i < n; i++) x[i] = cuda_test_rand(&seed) * (i % 97 == 0 ? 7.0f : 1.0f);
    x[5] = -3.25f;
    x[9] = 3.25f; /* equal magnitude after the first: the first wins */
    for (int64_t i = 256; i < 512 && i < n; i++) x[i] = 0.0f;
    if (n > 600) x[600] = 0.5f;
}

/* The int8-activation matvec's quantizer (cuda_mmvq.cuh, run on the host)
 * writes the CPU quantizer's bytes exactly (backend/cpu/cpu_matmul_act.c,
 * ggml's Q8_0 / Q8_K numbers), and its integer block dot products give the
 * CPU scalar kernel's result: the block terms are the same floats, added in
 * the same order here, so equal up to the last bit of a 4096-term sum. */
static void test_host_mmvq_matches_cpu(void)
{
    static const ds4_type types[] = {DS4_TYPE_Q8_0, DS4_TYPE_Q2_K, DS4_TYPE_IQ2_XXS};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        int fi = 0;
        while (CUDA_FIXTURES[fi].type != types[ti]) fi++;
        cuda_fixture f;
        REQUIRE(cuda_fixture_load(CUDA_FIXTURES[fi].file, &f) == 0);
        const ds4_act_kind kind = ds4_cpu_act_kind(f.type);
        const size_t ab = ds4_act_row_bytes(kind, f.n);
        EXPECT((int64_t)ab == ds4_cuda_mmvq_act_bytes(f.type, f.n));
        float *x = malloc(sizeof(float) * (size_t)f.n);
        uint8_t *a_cpu = calloc(1, ab), *a_gpu = calloc(1, ab);
        fill_activations(x, f.n, 1234 + ti);
        ds4_act_quantize(kind, x, f.n, a_cpu);
        EXPECT(ds4_cuda_host_mmvq_quantize(f.type, x, f.n, a_gpu) == DS4_OK);
        EXPECT_MSG(memcmp(a_cpu, a_gpu, ab) == 0, "%s: quantized activations differ from the CPU's",
                   CUDA_FIXTURES[fi].file);
        ds4_dot_fn dot = ds4_cpu_dot_scalar(f.type);
        REQUIRE(dot != NULL);
        for (int64_t r = 0; r < f.rows; r++) {
            float want = 0.0f, got = 1.0f;
            dot(f.n, f.q + r * f.row_bytes, a_cpu, ab, 1, &want);
            EXPECT(ds4_cuda_host_mmvq_dot(f.type, f.q + r * f.row_bytes, f.n, a_cpu, &got) == DS4_OK);
            EXPECT_MSG(fabsf(got - want) <= 1e-6f * fabsf(want) + 1e-30f, "%s row %lld: %.9g vs CPU %.9g",
                       CUDA_FIXTURES[fi].file, (long long)r, (double)got, (double)want);
        }
        EXPECT(ds4_cuda_host_mmvq_quantize(DS4_TYPE_Q8_0, x, 100, a_gpu) == DS4_ERR_INVALID);
        EXPECT(ds4_cuda_host_mmvq_dot(DS4_TYPE_Q4_K, f.q, f.n, a_cpu, &(float){0}) == DS4_ERR_INVALID);
        free(x);
        free(a_cpu);
        free(a_gpu);
        cuda_fixture_free(&f);
    }
}

/* The float-weight matvec's arithmetic (cuda_fmv.cuh, run on the host in
 * the kernel's order, for a warp per row and a block per row) against the
 * double dot of ggml's dequantized F16 / BF16 rows, and of random F32 rows. */
static void test_host_fmv_matches_exact(void)
{
    static const ds4_type types[] = {DS4_TYPE_F16, DS4_TYPE_BF16};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        int fi = 0;
        while (CUDA_FIXTURES[fi].type != types[ti]) fi++;
        cuda_fixture f;
        REQUIRE(cuda_fixture_load(CUDA_FIXTURES[fi].file, &f) == 0);
        for (int64_t r = 0; r < f.rows; r++) {
            double mag = 0.0;
            for (int64_t c = 0; c < f.n; c++) mag += fabs((double)f.deq[r * f.n + c] * f.y[c]);
            for (int wpr = 1; wpr <= 8; wpr += 7) {
                float got = 0.0f;
                EXPECT(ds4_cuda_host_fmv_dot(f.type, f.q + r * f.row_bytes, f.n, f.y, wpr, &got) == DS4_OK);
                EXPECT_MSG(fabs(got - f.dot_exact[r]) <= 1e-5 * mag + 1e-30,
                           "%s row %lld, %d warps per row: %.9g vs exact %.9g", CUDA_FIXTURES[fi].file,
                           (long long)r, wpr, (double)got, f.dot_exact[r]);
            }
        }
        EXPECT(ds4_cuda_host_fmv_dot(f.type, f.q, 4092, f.y, 1, &(float){0}) == DS4_ERR_INVALID);
        EXPECT(ds4_cuda_host_fmv_dot(f.type, f.q, f.n, f.y, 2, &(float){0}) == DS4_ERR_INVALID);
        EXPECT(ds4_cuda_host_fmv_dot(DS4_TYPE_Q8_0, f.q, f.n, f.y, 1, &(float){0}) == DS4_ERR_INVALID);
        cuda_fixture_free(&f);
    }
    enum { N = 1000 };
    float w[N], x[N];
    uint64_t s = 5;
    double ref = 0.0, mag = 0.0;
    for (int i = 0; i < N; i++) {
        w[i] = cuda_test_rand(&s);
        x[i] = cuda_test_rand(&s);
        ref += (double)w[i] * x[i];
        mag += fabs((double)w[i] * x[i]);
    }
    for (int wpr = 1; wpr <= 8; wpr += 7) {
        float got = 0.0f;
        EXPECT(ds4_cuda_host_fmv_dot(DS4_TYPE_F32, w, N, x, wpr, &got) == DS4_OK);
        EXPECT_MSG(fabs(got - ref) <= 1e-5 * mag, "f32 %d warps per row: %.9g vs %.9g", wpr, (double)got, ref);
    }
}

/* Whether the run at gr holds the GGUF blocks at qr where the layout puts
 * them. IQ2_XXS (backend/cuda/cuda_weight_runs.cuh): 8 blocks of 66 bytes,
 * the scales of blocks j, j + 4 adjacent, then the blocks' groups in
 * order. Q2_K (cuda_weight_runs.cuh): 4 blocks of 84 bytes, their (d, dmin)
 * words, then their 16 scale bytes each, then their 64 quant bytes each. */
static bool run_in_place(ds4_type type, const uint8_t *gr, const uint8_t *qr)
{
    bool ok = true;
    if (type == DS4_TYPE_IQ2_XXS) {
        static const int dblock[8] = {0, 4, 1, 5, 2, 6, 3, 7}; /* the block of each scale slot */
        for (int s = 0; s < 8; s++) ok &= memcmp(gr + 2 * s, qr + 66 * dblock[s], 2) == 0;
        for (int j = 0; j < 8; j++) ok &= memcmp(gr + 16 + 64 * j, qr + 66 * j + 2, 64) == 0;
    } else {
        for (int j = 0; j < 4; j++) {
            ok &= memcmp(gr + 4 * j, qr + 84 * j + 80, 4) == 0;
            ok &= memcmp(gr + 16 + 16 * j, qr + 84 * j, 16) == 0;
            ok &= memcmp(gr + 80 + 64 * j, qr + 84 * j + 16, 64) == 0;
        }
    }
    return ok;
}

/* The GPU keeps IQ2_XXS rows of a multiple of 2048 values in runs of 8
 * blocks and Q2_K rows of a multiple of 1024 in runs of 4: the runs' bytes
 * sit where the layouts put them, and a row read from them dequantizes to
 * ggml's floats bit for bit (n = 2048 and 4096: one to four runs a row;
 * the int8 path's dot of a row read from runs: test_host_mmvq_matches_cpu). */
static void test_host_runs_match_ggml(void)
{
    static const struct {
        const char *file;
        ds4_type type;
        int run_values, run_bytes;
    } cases[] = {{"quants/iq2_xxs-n2048-imatrix.bin", DS4_TYPE_IQ2_XXS, 2048, 528},
                 {"quants/iq2_xxs-n4096-imatrix.bin", DS4_TYPE_IQ2_XXS, 2048, 528},
                 {"quants/q2_K-n2048-plain.bin", DS4_TYPE_Q2_K, 1024, 336},
                 {"quants/q2_K-n4096-plain.bin", DS4_TYPE_Q2_K, 1024, 336}};
    EXPECT(ds4_cuda_in_runs(DS4_TYPE_IQ2_XXS, 2048) && ds4_cuda_in_runs(DS4_TYPE_IQ2_XXS, 4096));
    EXPECT(!ds4_cuda_in_runs(DS4_TYPE_IQ2_XXS, 1024) && !ds4_cuda_in_runs(DS4_TYPE_IQ2_XXS, 2304));
    EXPECT(ds4_cuda_in_runs(DS4_TYPE_Q2_K, 1024) && ds4_cuda_in_runs(DS4_TYPE_Q2_K, 4096));
    EXPECT(!ds4_cuda_in_runs(DS4_TYPE_Q2_K, 768) && !ds4_cuda_in_runs(DS4_TYPE_Q8_0, 4096));
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        cuda_fixture f;
        REQUIRE(cuda_fixture_load(cases[ci].file, &f) == 0);
        REQUIRE(f.type == cases[ci].type && f.n % cases[ci].run_values == 0);
        uint8_t *g = malloc((size_t)f.row_bytes);
        float *out = malloc(sizeof(float) * (size_t)f.n);
        int bad = 0;
        for (int64_t r = 0; r < f.rows; r++) {
            const uint8_t *q = f.q + r * f.row_bytes;
            ds4_runs_host(f.type, g, q, (size_t)f.row_bytes);
            for (int64_t run = 0; run < f.n / cases[ci].run_values; run++)
                EXPECT_MSG(run_in_place(f.type, g + cases[ci].run_bytes * run, q + cases[ci].run_bytes * run),
                           "%s row %lld run %lld: bytes out of place", cases[ci].file, (long long)r, (long long)run);
            EXPECT(ds4_cuda_host_dequantize_gpu_row(f.type, g, f.n, out) == DS4_OK);
            for (int64_t c = 0; c < f.n; c++)
                if (memcmp(&out[c], &f.deq[r * f.n + c], 4) != 0 && bad++ < 3)
                    test_fail_at(__FILE__, __LINE__, "%s row %lld col %lld from runs: %.9g != ggml %.9g",
                                 cases[ci].file, (long long)r, (long long)c, (double)out[c],
                                 (double)f.deq[r * f.n + c]);
        }
        free(g);
        free(out);
        cuda_fixture_free(&f);
    }
}

static void test_host_rejects_bad_shapes(void)
{
    float out[64] = {0};
    uint8_t row[256] = {0};
    EXPECT(ds4_cuda_host_dequantize_row(DS4_TYPE_Q2_K, row, 64, out) == DS4_ERR_INVALID);
    EXPECT(ds4_cuda_host_dequantize_row(DS4_TYPE_Q8_K, row, 256, out) == DS4_ERR_INVALID);
    EXPECT(ds4_cuda_row_bytes(DS4_TYPE_Q8_0, 48) == 0);
    EXPECT(ds4_cuda_row_bytes(DS4_TYPE_IQ2_XXS, 2048) == 528);
    EXPECT(ds4_cuda_row_bytes(DS4_TYPE_MXFP4, 4096) == 2176);
}
#else
static void test_host_dequantize_matches_ggml(void) { test_skip(TEST_SKIP_NO_CUDA); }
static void test_host_dot_matches_exact(void) { test_skip(TEST_SKIP_NO_CUDA); }
static void test_host_rejects_bad_shapes(void) { test_skip(TEST_SKIP_NO_CUDA); }
static void test_host_runs_match_ggml(void) { test_skip(TEST_SKIP_NO_CUDA); }
static void test_host_mmvq_matches_cpu(void) { test_skip(TEST_SKIP_NO_CUDA); }
static void test_host_fmv_matches_exact(void) { test_skip(TEST_SKIP_NO_CUDA); }
#endif

int main(void)
{
    RUN(test_host_dequantize_matches_ggml);
    RUN(test_host_dot_matches_exact);
    RUN(test_host_rejects_bad_shapes);
    RUN(test_host_mmvq_matches_cpu);
    RUN(test_host_runs_match_ggml);
    RUN(test_host_fmv_matches_exact);
    return test_finish();
}

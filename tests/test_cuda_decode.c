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
#include <stdio.h>

#if DS4_HAVE_CUDA
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
static void test_host_dequantize_matches_ggml(void) { test_skip("built without CUDA (no nvcc)"); }
static void test_host_dot_matches_exact(void) { test_skip("built without CUDA (no nvcc)"); }
static void test_host_rejects_bad_shapes(void) { test_skip("built without CUDA (no nvcc)"); }
#endif

int main(void)
{
    RUN(test_host_dequantize_matches_ggml);
    RUN(test_host_dot_matches_exact);
    RUN(test_host_rejects_bad_shapes);
    return test_finish();
}

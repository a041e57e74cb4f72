/*
 * test_moe_shared.c - the CPU backend's moe_shared op (routed experts and
 * the shared expert of a one-token MoE sublayer in one pool run,
 * backend/cpu/ops_cpu_moe.c) against the two ops it replaces, moe_experts
 * then ffn_swiglu with accumulate: the same bits, on the quantized types
 * of the real model (IQ2_XXS gate/up, Q2_K down, Q8_0 shared expert), with
 * experts unsorted and repeated, on pools of 1 and 2 threads, and row
 * lengths that end inside a kernel's group of 512 values. The reference
 * numbers come from the op pair the model called before (itself checked
 * against double-precision sums in test_ops and the golden test).
 */
#include "backend/cpu/cpu_matmul_kernels.h"
#include "backend/cpu/ops_cpu.h"
#include "quant/quant.h"
#include "tests/test.h"

#include <stdlib.h>
#include <string.h>

static uint32_t rng = 777u;
static float rnd(void)
{
    rng = rng * 1664525u + 1013904223u;
    return (float)((int)(rng >> 9) % 2001 - 1000) * 1e-3f;
}

static void *quant(ds4_type t, int64_t rows, int64_t cols, float scale)
{
    float *src = malloc(sizeof(float) * (size_t)(rows * cols)), *im = malloc(sizeof(float) * (size_t)cols);
    void *dst = malloc((size_t)(ds4_row_bytes(t, cols) * rows));
    if (!src || !im || !dst) abort();
    for (int64_t i = 0; i < rows * cols; i++) src[i] = rnd() * scale;
    for (int64_t i = 0; i < cols; i++) im[i] = 1.0f;
    if (ds4_quantize_rows(t, src, dst, rows, cols, im) != DS4_OK) abort();
    free(src), free(im);
    return dst;
}

static ds4_weight wt(const char *name, ds4_type t, int nd, int64_t ne0, int64_t ne1, int64_t ne2, const void *data)
{
    ds4_weight w = {name, t, nd, {ne0, ne1, ne2, 1}, data, 0};
    w.nbytes = (uint64_t)(ds4_row_bytes(t, ne0) * ne1 * ne2);
    return w;
}

static void check_shape(int64_t D, int64_t F, int64_t Fs)
{
    const int E = 8, K = 6;
    void *g = quant(DS4_TYPE_IQ2_XXS, E * F, D, 0.05f), *u = quant(DS4_TYPE_IQ2_XXS, E * F, D, 0.05f);
    void *d = quant(DS4_TYPE_Q2_K, E * D, F, 0.05f);
    void *sg = quant(DS4_TYPE_Q8_0, Fs, D, 0.05f), *su = quant(DS4_TYPE_Q8_0, Fs, D, 0.05f);
    void *sd = quant(DS4_TYPE_Q8_0, D, Fs, 0.05f);
    ds4_weight wg = wt("g", DS4_TYPE_IQ2_XXS, 3, D, F, E, g), wu = wt("u", DS4_TYPE_IQ2_XXS, 3, D, F, E, u);
    ds4_weight wd = wt("d", DS4_TYPE_Q2_K, 3, F, D, E, d);
    ds4_weight wsg = wt("sg", DS4_TYPE_Q8_0, 2, D, Fs, 1, sg), wsu = wt("su", DS4_TYPE_Q8_0, 2, D, Fs, 1, su);
    ds4_weight wsd = wt("sd", DS4_TYPE_Q8_0, 2, Fs, D, 1, sd);
    float *x = malloc(sizeof(float) * (size_t)D), *ref = malloc(sizeof(float) * (size_t)D);
    float *got = malloc(sizeof(float) * (size_t)D);
    if (!x || !ref || !got) abort();
    for (int64_t i = 0; i < D; i++) x[i] = rnd() * 3.0f;
    /* ascending; unsorted; an expert twice (a hash layer's row may repeat one) */
    const int32_t sels[3][6] = {{0, 1, 2, 3, 5, 7}, {6, 2, 7, 0, 4, 1}, {3, 5, 3, 0, 7, 5}};
    const float ws[6] = {0.31f, 0.07f, 0.22f, 0.12f, 0.18f, 0.1f};
    for (int threads = 1; threads <= 2; threads++) {
        ds4_backend *be = ds4_backend_cpu_create(threads);
        REQUIRE(be != NULL && be->moe_shared != NULL);
        for (int s = 0; s < 3; s++) {
            /* clamp 6 fires on some gate/up values, not all */
            be->moe_experts(be, &wg, &wu, &wd, x, 1, sels[s], ws, K, 6.0f, ref, false);
            be->ffn_swiglu(be, &wsg, &wsu, &wsd, x, 1, 6.0f, ref, true);
            uint64_t calls = cpu_of(be)->moe_fused_calls;
            memset(got, 0xff, sizeof(float) * (size_t)D);
            be->moe_shared(be, &wg, &wu, &wd, &wsg, &wsu, &wsd, x, 1, sels[s], ws, K, 6.0f, got);
            /* the one-region path ran where the CPU has the kernels it uses */
            if (ds4_cpu_mv_bytes(DS4_TYPE_IQ2_XXS, D))
                EXPECT_MSG(cpu_of(be)->moe_fused_calls == calls + 1, "D %lld: the one-region path did not run",
                           (long long)D);
            else
                printf("  (no fused kernels at this SIMD level: the op pair ran; compared all the same)\n");
            int64_t i = 0;
            while (i < D && !memcmp(&ref[i], &got[i], sizeof(float))) i++;
            EXPECT_MSG(i == D, "D %lld F %lld threads %d sel %d: out[%lld] %.9g, op pair %.9g", (long long)D,
                       (long long)F, threads, s, (long long)i, i < D ? got[i] : 0.0f, i < D ? ref[i] : 0.0f);
            int nonzero = 0;
            for (int64_t j = 0; j < D; j++) nonzero += ref[j] != 0.0f;
            EXPECT_MSG(nonzero > D / 2, "the reference output is mostly zero (%d of %lld)", nonzero, (long long)D);
        }
        be->destroy(be);
    }
    free(g), free(u), free(d), free(sg), free(su), free(sd), free(x), free(ref), free(got);
}

/* Flash-like proportions, smaller; D = 768 ends inside a 512-value group */
static void test_moe_shared_same_bits(void)
{
    check_shape(1024, 512, 512);
    check_shape(768, 256, 512);
}

int main(void)
{
    RUN(test_moe_shared_same_bits);
    return test_finish();
}

/*
 * test_quant_fp8.c - FP8-E4M3, FP4-E2M1, UE8M0, the KV / indexer round
 * trips, Hadamard-128 and the checkpoint dequantizers.
 *
 * Expected values are computed here from the format definitions in double
 * (sign, biased exponent, mantissa), by brute-force nearest search with
 * ties to the even code, and by a direct matrix product with the +-1
 * Sylvester-Hadamard matrix; never by the functions under test.
 */
#include "tests/test.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant/fp8.h"
#include "quant/quant.h"
#include "util/error.h"

/* E4M3FN by definition; NaN for S.1111.111. */
static double e4m3_def(int c)
{
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return s ? -v : v;
}

static double e2m1_def(int c)
{
    int s = (c >> 3) & 1, e = (c >> 1) & 3, m = c & 1;
    double v = e ? ldexp(1.0 + m / 2.0, e - 1) : m / 2.0;
    return s ? -v : v;
}

/* nearest code among magnitudes 0..maxcode of def(), ties to even code */
static int nearest_code(double a, double (*def)(int), int maxcode)
{
    int best = 0;
    double bd = fabs(a - def(0));
    for (int c = 1; c <= maxcode; c++) {
        double d = fabs(a - def(c));
        if (d < bd || (d == bd && (c & 1) == 0)) {
            bd = d;
            best = c;
        }
    }
    return best;
}

static void test_e4m3_all_codes(void)
{
    for (int c = 0; c < 256; c++) {
        float f = ds4_e4m3_to_f32((uint8_t)c);
        double want = e4m3_def(c);
        if (isnan(want)) {
            EXPECT_MSG(isnan(f), "code 0x%02x should be NaN", c);
            continue;
        }
        EXPECT_MSG((double)f == want && (signbit(f) != 0) == (c >= 128),
                   "code 0x%02x -> %g, want %g", c, f, want);
        EXPECT_MSG(ds4_f32_to_e4m3(f) == c, "round trip of 0x%02x gives 0x%02x", c,
                   ds4_f32_to_e4m3(f));
    }
    EXPECT(e4m3_def(0x7E) == 448.0);
    EXPECT(e4m3_def(0x01) == ldexp(1, -9));
}

static void test_e4m3_rounding(void)
{
    for (int c = 0; c < 0x7E; c++) {
        double lo = e4m3_def(c), hi = e4m3_def(c + 1), mid = (lo + hi) / 2;
        float m = (float)mid;
        REQUIRE((double)m == mid);
        int even = (c & 1) ? c + 1 : c;
        EXPECT_MSG(ds4_f32_to_e4m3(m) == even, "midpoint %g -> 0x%02x", m, ds4_f32_to_e4m3(m));
        EXPECT(ds4_f32_to_e4m3(-m) == (0x80 | even));
        EXPECT(ds4_f32_to_e4m3(nextafterf(m, 0.f)) == c);
        EXPECT(ds4_f32_to_e4m3(nextafterf(m, INFINITY)) == c + 1);
    }
    /* saturation and specials */
    EXPECT(ds4_f32_to_e4m3(448.f) == 0x7E);
    EXPECT(ds4_f32_to_e4m3(464.f) == 0x7E);
    EXPECT(ds4_f32_to_e4m3(1e9f) == 0x7E);
    EXPECT(ds4_f32_to_e4m3(-INFINITY) == 0xFE);
    EXPECT((ds4_f32_to_e4m3(NAN) & 0x7F) == 0x7F);
    EXPECT(ds4_f32_to_e4m3(-0.f) == 0x80);
    EXPECT(ds4_f32_to_e4m3(ldexpf(1, -10)) == 0x00); /* tie between 0 and 2^-9 */
    EXPECT(ds4_f32_to_e4m3(nextafterf(ldexpf(1, -10), 1.f)) == 0x01);
}

static void test_e2m1_all_codes(void)
{
    for (int c = 0; c < 16; c++) {
        float f = ds4_e2m1_to_f32((uint8_t)c);
        EXPECT_MSG((double)f == e2m1_def(c), "code %d -> %g, want %g", c, f, e2m1_def(c));
        EXPECT_MSG(ds4_f32_to_e2m1(f) == c, "round trip of %d gives %d", c, ds4_f32_to_e2m1(f));
    }
    for (int c = 0; c < 7; c++) {
        double mid = (e2m1_def(c) + e2m1_def(c + 1)) / 2;
        int even = (c & 1) ? c + 1 : c;
        EXPECT_MSG(ds4_f32_to_e2m1((float)mid) == even, "midpoint %g", mid);
        EXPECT(ds4_f32_to_e2m1((float)-mid) == (8 | even));
        EXPECT(ds4_f32_to_e2m1(nextafterf((float)mid, 0.f)) == c);
        EXPECT(ds4_f32_to_e2m1(nextafterf((float)mid, INFINITY)) == c + 1);
    }
    EXPECT(ds4_f32_to_e2m1(6.f) == 7 && ds4_f32_to_e2m1(100.f) == 7);
    EXPECT(ds4_f32_to_e2m1(-7.f) == 15);
    EXPECT(ds4_f32_to_e2m1(5.f) == 6); /* tie 4 | 6: even code 6 = 4.0 */
}

static void test_ue8m0_all_codes(void)
{
    for (int e = 0; e < 255; e++)
        EXPECT_MSG((double)ds4_ue8m0_to_f32((uint8_t)e) == ldexp(1.0, e - 127), "e=%d", e);
    EXPECT(isnan(ds4_ue8m0_to_f32(255)));
}

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static double urand(void) /* [0, 1) */
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / 9007199254740992.0;
}

/* Independent block round trip: scale = smallest 2^k >= (float)(amax/max). */
static void ref_roundtrip(const float *x, double *out, int n, float vmax, float floor_,
                          double (*def)(int), int maxcode)
{
    float amax = 0.f;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    if (amax < floor_) amax = floor_;
    double q = (double)(amax / vmax);
    int k = -200;
    while (ldexp(1.0, k) < q) k++;
    double scale = ldexp(1.0, k);
    for (int i = 0; i < n; i++) {
        double v = x[i] / scale;
        if (v > vmax) v = vmax;
        if (v < -vmax) v = -vmax;
        double r = def(nearest_code(fabs(v), def, maxcode)) * scale;
        out[i] = v < 0 ? -r : r;
    }
}

static void make_block(float *x, int n, int kind)
{
    double mag = ldexp(1.0, (int)(urand() * 40) - 20);
    for (int i = 0; i < n; i++) x[i] = (float)((urand() * 2 - 1) * mag);
    if (kind == 1) x[(int)(urand() * n)] = (float)(mag * 448.0 / 256.0); /* amax/448 a power of 2 */
    if (kind == 2)
        for (int i = 0; i < n; i++) x[i] *= 1e-9f; /* below the amax floor */
    if (kind == 3) x[0] = (float)(mag * 6.0 / 4.0); /* amax/6 a power of 2 */
}

static void test_fp8_kv_roundtrip(void)
{
    float x[64 * 4];
    double want[64];
    for (int trial = 0; trial < 400; trial++) {
        for (int b = 0; b < 4; b++) make_block(x + 64 * b, 64, trial % 3);
        float y[64 * 4];
        memcpy(y, x, sizeof x);
        REQUIRE(ds4_fp8_kv_roundtrip(y, 256) == DS4_OK);
        for (int b = 0; b < 4; b++) {
            ref_roundtrip(x + 64 * b, want, 64, 448.f, 1e-4f, e4m3_def, 0x7E);
            for (int i = 0; i < 64; i++)
                EXPECT_MSG((double)y[64 * b + i] == want[i], "trial %d: %.9g -> %.9g, want %.9g",
                           trial, x[64 * b + i], y[64 * b + i], want[i]);
        }
    }
    EXPECT(ds4_fp8_kv_roundtrip(x, 100) == DS4_ERR_INVALID);
}

static void test_fp4_roundtrip(void)
{
    float x[32 * 4];
    double want[32];
    for (int trial = 0; trial < 400; trial++) {
        for (int b = 0; b < 4; b++) make_block(x + 32 * b, 32, trial % 4 == 1 ? 3 : trial % 4);
        float y[32 * 4];
        memcpy(y, x, sizeof x);
        REQUIRE(ds4_fp4_roundtrip(y, 128) == DS4_OK);
        for (int b = 0; b < 4; b++) {
            ref_roundtrip(x + 32 * b, want, 32, 6.f, 6.f * 0x1p-126f, e2m1_def, 7);
            for (int i = 0; i < 32; i++)
                EXPECT_MSG((double)y[32 * b + i] == want[i], "trial %d: %.9g -> %.9g, want %.9g",
                           trial, x[32 * b + i], y[32 * b + i], want[i]);
        }
    }
    EXPECT(ds4_fp4_roundtrip(x, 33) == DS4_ERR_INVALID);
}

static void test_hadamard(void)
{
    for (int trial = 0; trial < 20; trial++) {
        float x[128], y[128];
        double norm = 0;
        for (int i = 0; i < 128; i++) {
            x[i] = (float)(urand() * 2 - 1) * (trial + 1);
            norm += (double)x[i] * x[i];
        }
        norm = sqrt(norm);
        memcpy(y, x, sizeof x);
        ds4_hadamard128(y);
        for (int i = 0; i < 128; i++) {
            double s = 0;
            for (int j = 0; j < 128; j++) s += (__builtin_popcount(i & j) & 1 ? -1.0 : 1.0) * x[j];
            s /= sqrt(128.0);
            EXPECT_MSG(fabs(y[i] - s) <= 1e-6 * norm, "y[%d] = %.9g, matrix product %.9g", i,
                       y[i], s);
        }
        ds4_hadamard128(y); /* self-inverse */
        for (int i = 0; i < 128; i++)
            EXPECT_MSG(fabs(y[i] - x[i]) <= 1e-6 * norm, "H(H(x))[%d] = %.9g, x = %.9g", i, y[i],
                       x[i]);
    }
    /* a unit vector becomes the normalized first column: all 1/sqrt(128) */
    float e0[128] = {1.f};
    ds4_hadamard128(e0);
    for (int i = 0; i < 128; i++) EXPECT(e0[i] == 0.08838834764831845f);
}

static void test_indexer_qat(void)
{
    float x[128], y[128];
    double want[32];
    for (int i = 0; i < 128; i++) x[i] = (float)(urand() * 2 - 1);
    memcpy(y, x, sizeof x);
    ds4_indexer_qat_row(y);
    ds4_hadamard128(x);
    for (int b = 0; b < 4; b++) {
        ref_roundtrip(x + 32 * b, want, 32, 6.f, 6.f * 0x1p-126f, e2m1_def, 7);
        for (int i = 0; i < 32; i++) EXPECT((double)y[32 * b + i] == want[i]);
    }
}

static void test_fp8_weight_tiles(void)
{
    enum { R = 130, C = 260, TR = 2, TC = 3 };
    uint8_t *w = malloc(R * C);
    float *out = malloc(sizeof(float) * R * C);
    REQUIRE(w && out);
    float sf32[TR * TC];
    uint16_t sbf[TR * TC];
    uint8_t se[TR * TC];
    for (int i = 0; i < TR * TC; i++) {
        se[i] = (uint8_t)(120 + i);
        sf32[i] = (float)ldexp(1.0, 120 + i - 127) * 1.5f; /* 1.5 * 2^k (also exact in bf16) */
        uint32_t u;
        memcpy(&u, &sf32[i], 4);
        sbf[i] = (uint16_t)(u >> 16);
    }
    for (int i = 0; i < R * C; i++) {
        w[i] = (uint8_t)(urand() * 256);
        if ((w[i] & 0x7F) == 0x7F) w[i] = 0x11;
    }
    const void *sc[3] = {sf32, sbf, se};
    const ds4_scale_format fmt[3] = {DS4_SCALE_F32, DS4_SCALE_BF16, DS4_SCALE_E8M0};
    for (int f = 0; f < 3; f++) {
        REQUIRE(ds4_dequant_fp8_tiles(w, sc[f], fmt[f], R, C, 0, R, out) == DS4_OK);
        int bad = 0;
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) {
                int t = (r / 128) * TC + c / 128;
                double s = f == 2 ? ldexp(1.0, se[t] - 127) : (double)sf32[t];
                bad += (double)out[r * C + c] != e4m3_def(w[r * C + c]) * s;
            }
        EXPECT_MSG(bad == 0, "format %d: %d values differ", f, bad);
    }
    /* a row slice lands at the start of out */
    REQUIRE(ds4_dequant_fp8_tiles(w, sf32, DS4_SCALE_F32, R, C, 129, 1, out) == DS4_OK);
    EXPECT((double)out[259] == e4m3_def(w[129 * C + 259]) * sf32[5]);
    /* errors */
    EXPECT(ds4_dequant_fp8_tiles(w, sf32, DS4_SCALE_F32, R, C, 100, 31, out) == DS4_ERR_INVALID);
    w[5 * C + 7] = 0xFF;
    EXPECT(ds4_dequant_fp8_tiles(w, sf32, DS4_SCALE_F32, R, C, 0, R, out) == DS4_ERR_FORMAT);
    EXPECT(strstr(ds4_last_error(), "row 5 column 7") != NULL);
    w[5 * C + 7] = 0;
    se[4] = 0xFF;
    EXPECT(ds4_dequant_fp8_tiles(w, se, DS4_SCALE_E8M0, R, C, 0, R, out) == DS4_ERR_FORMAT);
    sf32[0] = -1.f;
    EXPECT(ds4_dequant_fp8_tiles(w, sf32, DS4_SCALE_F32, R, C, 0, R, out) == DS4_ERR_FORMAT);
    free(w);
    free(out);
}

static void test_fp4_weight_blocks(void)
{
    /* hand-made: row 0 = codes 1 (0.5) and 7 (6.0) in the first byte */
    uint8_t w[2 * 32] = {0x71, 0x9A};
    uint8_t se[4] = {127, 128, 126, 0};
    float out[2 * 64];
    REQUIRE(ds4_dequant_fp4_blocks(w, se, DS4_SCALE_E8M0, 2, 64, 0, 2, out) == DS4_OK);
    EXPECT(out[0] == 0.5f && out[1] == 6.0f);   /* low nibble first, scale 1 */
    EXPECT(out[2] == -1.0f && out[3] == -0.5f); /* 0x9A: low 0xA = -1, high 0x9 = -0.5 */
    EXPECT(out[4] == 0.f && out[32] == 0.f);
    for (int i = 0; i < 64; i++) w[i] = (uint8_t)(urand() * 256);
    REQUIRE(ds4_dequant_fp4_blocks(w, se, DS4_SCALE_E8M0, 2, 64, 0, 2, out) == DS4_OK);
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 64; c++) {
            int code = (w[r * 32 + c / 2] >> (4 * (c & 1))) & 15;
            double want = e2m1_def(code) * ldexp(1.0, se[r * 2 + c / 32] - 127);
            EXPECT_MSG((double)out[r * 64 + c] == want, "r%d c%d", r, c);
        }
    /* the MXFP4 repack holds exactly the same values */
    for (int r = 0; r < 2; r++) {
        block_mxfp4 mx[2];
        float y[64];
        REQUIRE(ds4_fp4_row_to_mxfp4(w + r * 32, se + r * 2, 64, mx) == DS4_OK);
        REQUIRE(ds4_dequantize_row(DS4_TYPE_MXFP4, mx, y, 64) == DS4_OK);
        for (int c = 0; c < 64; c++) /* == : ggml decodes code 8 (-0) as +0 */
            EXPECT_MSG(y[c] == out[r * 64 + c], "mxfp4 r%d c%d: %g vs %g", r, c, y[c], out[r * 64 + c]);
    }
    EXPECT(ds4_dequant_fp4_blocks(w, se, DS4_SCALE_E8M0, 2, 48, 0, 2, out) == DS4_ERR_INVALID);
    se[1] = 0xFF;
    EXPECT(ds4_dequant_fp4_blocks(w, se, DS4_SCALE_E8M0, 2, 64, 0, 2, out) == DS4_ERR_FORMAT);
    block_mxfp4 mx[2];
    EXPECT(ds4_fp4_row_to_mxfp4(w, se, 64, mx) == DS4_ERR_FORMAT);
}

int main(void)
{
    RUN(test_e4m3_all_codes);
    RUN(test_e4m3_rounding);
    RUN(test_e2m1_all_codes);
    RUN(test_ue8m0_all_codes);
    RUN(test_fp8_kv_roundtrip);
    RUN(test_fp4_roundtrip);
    RUN(test_hadamard);
    RUN(test_indexer_qat);
    RUN(test_fp8_weight_tiles);
    RUN(test_fp4_weight_blocks);
    return test_finish();
}

/*
 * fp8.c - E4M3 / E2M1 / UE8M0 codecs and the FP8 (KV) and FP4 (indexer)
 * round-trip simulations of the official DeepSeek V4 numerics, and the
 * Hadamard-128 rotation the indexer simulation applies first.
 *
 * The encoders split |v| into exponent and mantissa with frexpf and round
 * the mantissa with rintf (round to nearest even under the default FPU
 * mode); every step before the rounding is exact, so the result is the
 * correctly rounded code. Simulations work block by block in place.
 */
#include "quant/fp8.h"

#include <math.h>

#include "quant/half.h"
#include "util/error.h"

float ds4_e4m3_to_f32(uint8_t code)
{
    const int exp = (code >> 3) & 15, man = code & 7;
    float v;
    if ((code & 0x7F) == 0x7F) return NAN;
    if (exp == 0) v = ldexpf((float)man, -9);
    else v = ldexpf(1.f + (float)man / 8.f, exp - 7);
    return code & 0x80 ? -v : v;
}

uint8_t ds4_f32_to_e4m3(float v)
{
    const uint8_t sign = signbit(v) ? 0x80 : 0;
    if (isnan(v)) return sign | 0x7F;
    const float a = fabsf(v);
    if (a >= DS4_E4M3_MAX) return sign | 0x7E; /* saturate (no Inf) */
    if (a < 0x1p-6f) /* subnormal step 2^-9; 8 steps is the smallest normal */
        return (uint8_t)(sign | (int)rintf(a * 0x1p9f));
    int e;
    frexpf(a, &e); /* a = f * 2^e, f in [0.5, 1) */
    int E = e - 1;
    int m = (int)rintf((ldexpf(a, -E) - 1.f) * 8.f);
    if (m == 8) { /* rounded up into the next binade */
        m = 0;
        E++;
    }
    int code = ((E + 7) << 3) | m;
    return (uint8_t)(sign | (code > 0x7E ? 0x7E : code));
}

float ds4_e2m1_to_f32(uint8_t code)
{
    static const float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
    const float v = mag[code & 7];
    return code & 8 ? -v : v;
}

uint8_t ds4_f32_to_e2m1(float v)
{
    if (isnan(v)) return 0;
    const uint8_t sign = signbit(v) ? 8 : 0;
    const float a = fabsf(v);
    if (a >= DS4_E2M1_MAX) return sign | 7;
    if (a < 1.f) /* subnormal step 0.5; 2 steps is 1.0 = code 2 */
        return (uint8_t)(sign | (int)rintf(a * 2.f));
    int e;
    frexpf(a, &e);
    int E = e - 1; /* 0, 1 or 2 */
    int m = (int)rintf((ldexpf(a, -E) - 1.f) * 2.f);
    if (m == 2) {
        m = 0;
        E++;
    }
    return (uint8_t)(sign | ((E + 1) << 1) | m);
}

float ds4_ue8m0_to_f32(uint8_t e)
{
    if (e == 0xFF) return NAN;
    if (e == 0) return 0x1p-127f;
    return ds4_bits_f32((uint32_t)e << 23);
}

/* 2^ceil(log2(q)) for finite q > 0, exactly. */
static float pow2_ceil(float q)
{
    int e;
    float f = frexpf(q, &e); /* q = f * 2^e, f in [0.5, 1) */
    return ldexpf(1.f, f == 0.5f ? e - 1 : e);
}

/* One block: scale from the floored amax, clamp, round, rescale. */
static void roundtrip_block(float *x, int n, float vmax, float amax_floor, int fp8)
{
    float amax = 0.f;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    if (!isfinite(amax)) { /* no meaningful scale: poison the block */
        for (int i = 0; i < n; i++) x[i] = NAN;
        return;
    }
    if (amax < amax_floor) amax = amax_floor;
    const float scale = pow2_ceil(amax / vmax);
    for (int i = 0; i < n; i++) {
        float v = x[i] / scale;
        v = v > vmax ? vmax : v < -vmax ? -vmax : v;
        float r = fp8 ? ds4_e4m3_to_f32(ds4_f32_to_e4m3(v)) : ds4_e2m1_to_f32(ds4_f32_to_e2m1(v));
        x[i] = r * scale;
    }
}

ds4_status ds4_fp8_kv_roundtrip(float *x, int64_t n)
{
    if (n < 0 || n % DS4_FP8_KV_BLOCK)
        return ds4_fail(DS4_ERR_INVALID, "fp8: KV round trip of %lld values: not a multiple of %d",
                        (long long)n, DS4_FP8_KV_BLOCK);
    for (int64_t off = 0; off < n; off += DS4_FP8_KV_BLOCK)
        roundtrip_block(x + off, DS4_FP8_KV_BLOCK, DS4_E4M3_MAX, 1e-4f, 1);
    return DS4_OK;
}

ds4_status ds4_fp4_roundtrip(float *x, int64_t n)
{
    if (n < 0 || n % DS4_FP4_BLOCK)
        return ds4_fail(DS4_ERR_INVALID, "fp4: round trip of %lld values: not a multiple of %d",
                        (long long)n, DS4_FP4_BLOCK);
    for (int64_t off = 0; off < n; off += DS4_FP4_BLOCK)
        roundtrip_block(x + off, DS4_FP4_BLOCK, DS4_E2M1_MAX, 6.f * 0x1p-126f, 0);
    return DS4_OK;
}

void ds4_hadamard128(float *x)
{
    for (int stride = 1; stride < DS4_HADAMARD_N; stride <<= 1)
        for (int base = 0; base < DS4_HADAMARD_N; base += 2 * stride)
            for (int i = base; i < base + stride; i++) {
                const float a = x[i], b = x[i + stride];
                x[i] = a + b;
                x[i + stride] = a - b;
            }
    const float norm = 0.08838834764831845f; /* 1/sqrt(128) */
    for (int i = 0; i < DS4_HADAMARD_N; i++) x[i] *= norm;
}

void ds4_indexer_qat_row(float *x)
{
    ds4_hadamard128(x);
    for (int off = 0; off < DS4_HADAMARD_N; off += DS4_FP4_BLOCK)
        roundtrip_block(x + off, DS4_FP4_BLOCK, DS4_E2M1_MAX, 6.f * 0x1p-126f, 0);
}

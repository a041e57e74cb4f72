/*
 * cpu_matmul_act.c - activation formats of the CPU matmul: sizes, and the
 * conversion of f32 activation rows to the Q8_0 / Q8_K dot formats.
 *
 * The quantized numbers are ggml's (quantize_row_q8_0 / quantize_row_q8_K:
 * Q8_0 scale amax/127 rounded to f16, values roundf(x/d); Q8_K scale
 * -max/127 of the largest-magnitude value, values rounded to nearest even,
 * at most 127, and sums of each 16) so dot products match ggml's vec_dot.
 * They are laid out as arrays (see cpu_matmul_kernels.h), not as blocks.
 */
#include "backend/cpu/cpu_matmul_kernels.h"

#include <math.h>
#include <string.h>

int64_t ds4_cpu_block_values(ds4_type type)
{
    switch (type) {
    case DS4_TYPE_F32:
    case DS4_TYPE_F16:
    case DS4_TYPE_BF16: return 1;
    case DS4_TYPE_Q8_0: return QK8_0;
    case DS4_TYPE_MXFP4: return QK_MXFP4;
    case DS4_TYPE_Q2_K:
    case DS4_TYPE_Q4_K:
    case DS4_TYPE_IQ2_XXS: return QK_K;
    default: return 0;
    }
}

size_t ds4_cpu_block_bytes(ds4_type type)
{
    switch (type) {
    case DS4_TYPE_F32: return 4;
    case DS4_TYPE_F16:
    case DS4_TYPE_BF16: return 2;
    case DS4_TYPE_Q8_0: return sizeof(block_q8_0);
    case DS4_TYPE_MXFP4: return sizeof(block_mxfp4);
    case DS4_TYPE_Q2_K: return sizeof(block_q2_K);
    case DS4_TYPE_Q4_K: return sizeof(block_q4_K);
    case DS4_TYPE_IQ2_XXS: return sizeof(block_iq2_xxs);
    default: return 0;
    }
}

ds4_act_kind ds4_cpu_act_kind(ds4_type type)
{
    switch (type) {
    case DS4_TYPE_Q8_0:
    case DS4_TYPE_MXFP4: return DS4_ACT_Q8_0;
    case DS4_TYPE_Q2_K:
    case DS4_TYPE_Q4_K:
    case DS4_TYPE_IQ2_XXS: return DS4_ACT_Q8_K;
    default: return DS4_ACT_F32;
    }
}

size_t ds4_act_row_bytes(ds4_act_kind kind, int64_t n)
{
    size_t b;
    switch (kind) {
    case DS4_ACT_Q8_0: b = (size_t)n + 4 * (size_t)(n / QK8_0); break;
    case DS4_ACT_Q8_K: b = (size_t)n + 4 * (size_t)(n / QK_K) + 2 * (size_t)(n / 16); break;
    default: b = 4 * (size_t)n; break;
    }
    return (b + 63) & ~(size_t)63;
}

/* f32 -> f16 -> f32, round to nearest even (the stored Q8_0 scale). */
static float round_to_f16(float f)
{
    union { float f; uint32_t u; } v = {f};
    uint32_t sign = v.u & 0x80000000u, a = v.u & 0x7fffffffu;
    uint16_t h;
    if (a >= 0x7f800000u) {
        h = (uint16_t)(a > 0x7f800000u ? 0x7e00 : 0x7c00);
    } else if (a >= 0x477ff000u) { /* rounds to >= 65520: infinity */
        h = 0x7c00;
    } else if (a < 0x38800000u) { /* below 2^-14: f16 subnormal or zero */
        union { uint32_t u; float f; } m = {a};
        float scaled = m.f * 16777216.0f; /* units of 2^-24 */
        h = (uint16_t)nearbyintf(scaled);
    } else {
        uint32_t mant = a & 0x7fffffu, exp = (a >> 23) - 112;
        uint32_t r = (exp << 10) | (mant >> 13);
        uint32_t rem = mant & 0x1fff;
        if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
        h = (uint16_t)r;
    }
    return ds4_k_f16_to_f32((uint16_t)(h | (sign >> 16)));
}

/* roundf() (half away from zero) without a libm call: x - trunc(x) is
 * exact for |x| < 2^23, and quantized values are at most 127 (anything
 * else, NaN included, is clamped rather than converted: no UB). */
static int round_away(float x)
{
    if (!(x > -128.0f && x < 128.0f)) /* NaN, or inf * 0 from an inf input */
        return x > 0 ? 127 : x < 0 ? -127 : 0;
    int i = (int)x;
    float r = x - (float)i;
    return i + (r >= 0.5f) - (r <= -0.5f);
}

static void quantize_q8_0(const float *x, int64_t n, int64_t v0, int64_t v1, void *out)
{
    int8_t *qs = (int8_t *)out;
    float *ds = (float *)(qs + n);
    for (int64_t b = v0 / QK8_0; b < v1 / QK8_0; b++) {
        const float *xb = x + b * QK8_0;
        float amax = 0;
        for (int j = 0; j < QK8_0; j++) {
            float a = fabsf(xb[j]);
            amax = a > amax ? a : amax;
        }
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < QK8_0; j++) qs[b * QK8_0 + j] = (int8_t)round_away(xb[j] * id);
        ds[b] = round_to_f16(d);
    }
}

/* Round to nearest, ties to even, for |f| < 2^22: adding 1.5 * 2^23 leaves
 * the integer in the low mantissa bits (the FPU rounds the sum). */
static int nearest_even(float f)
{
    union { float f; int32_t i; } v = {f + 12582912.0f};
    return (v.i & 0x007fffff) - 0x00400000;
}

static void quantize_q8_K(const float *x, int64_t n, int64_t v0, int64_t v1, void *out)
{
    int8_t *qs = (int8_t *)out;
    float *ds = (float *)(qs + n);
    int16_t *bsums = (int16_t *)(ds + n / QK_K);
    for (int64_t b = v0 / QK_K; b < v1 / QK_K; b++) {
        const float *xb = x + b * QK_K;
        int8_t *q = qs + b * QK_K;
        float amax = 0, max = 0;
        for (int j = 0; j < QK_K; j++) {
            float ax = fabsf(xb[j]);
            if (ax > amax) {
                amax = ax;
                max = xb[j];
            }
        }
        if (amax == 0.0f) {
            ds[b] = 0;
            memset(q, 0, QK_K);
            memset(bsums + b * (QK_K / 16), 0, 2 * (QK_K / 16));
            continue;
        }
        float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j++) {
            int v = nearest_even(iscale * xb[j]);
            q[j] = (int8_t)(v > 127 ? 127 : v);
        }
        for (int g = 0; g < QK_K / 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += q[g * 16 + j];
            bsums[b * (QK_K / 16) + g] = (int16_t)s;
        }
        ds[b] = 1.0f / iscale;
    }
}

void ds4_act_quantize_part(ds4_act_kind kind, const float *x, int64_t n, int64_t v0, int64_t v1,
                           void *out)
{
    switch (kind) {
    case DS4_ACT_Q8_0: quantize_q8_0(x, n, v0, v1, out); break;
    case DS4_ACT_Q8_K: quantize_q8_K(x, n, v0, v1, out); break;
    default: memcpy((float *)out + v0, x + v0, 4 * (size_t)(v1 - v0)); break;
    }
}

void ds4_act_quantize(ds4_act_kind kind, const float *x, int64_t n, void *out)
{
    ds4_act_quantize_part(kind, x, n, 0, n, out);
}

void ds4_act_quantize_level(ds4_simd_level level, ds4_act_kind kind, const float *x, int64_t n,
                            int64_t v0, int64_t v1, void *out)
{
    if (level >= DS4_SIMD_AVX512) ds4_act_quantize_avx512(kind, x, n, v0, v1, out);
    else if (level >= DS4_SIMD_AVX2) ds4_act_quantize_avx2(kind, x, n, v0, v1, out);
    else ds4_act_quantize_part(kind, x, n, v0, v1, out);
}

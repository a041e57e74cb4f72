/*
 * half.h - scalar IEEE binary16 (f16) and bfloat16 (bf16) <-> f32.
 *
 * Every module converts through these, so they are exact by construction:
 * f32 -> f16/bf16 rounds to nearest, ties to even; overflow becomes +-Inf;
 * f16 subnormals are produced and read correctly; NaN stays NaN (quiet,
 * sign and top payload bits kept). Widening (f16/bf16 -> f32) is exact.
 * Header-only and branch-light so that hot loops can inline them; vector
 * code may use F16C instead, which rounds the same way.
 */
#ifndef DS4_QUANT_HALF_H
#define DS4_QUANT_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t ds4_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float ds4_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float ds4_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) /* Inf / NaN: keep the payload */
        return ds4_bits_f32(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) { /* zero or subnormal: mant * 2^-24, exact in f32 */
        float v = (float)mant * 0x1p-24f;
        return ds4_bits_f32(sign | ds4_f32_bits(v));
    }
    return ds4_bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

static inline uint16_t ds4_f32_to_f16(float f)
{
    uint32_t x = ds4_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN: force quiet, keep top payload bits */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) /* >= 65520 (the tie above 65504) and Inf */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) {
        /* Below 2^-14: an f16 subnormal step is 2^-24. Scaling by 2^24 is
         * exact, and adding 2^23 makes the FPU round to an integer with
         * ties to even (the default rounding mode). 1024 encodes 2^-14. */
        float a = ds4_bits_f32(ax) * 0x1p24f + 0x1p23f;
        return (uint16_t)(sign | (ds4_f32_bits(a) - 0x4b000000u));
    }
    /* Normal: rebias the exponent (127 -> 15) and round the 13 dropped
     * mantissa bits to nearest even; a carry rolls into the exponent. */
    uint32_t odd = (ax >> 13) & 1u;
    ax = ax - (112u << 23) + 0xfffu + odd;
    return (uint16_t)(sign | (ax >> 13));
}

static inline float ds4_bf16_to_f32(uint16_t h)
{
    return ds4_bits_f32((uint32_t)h << 16);
}

static inline uint16_t ds4_f32_to_bf16(float f)
{
    uint32_t x = ds4_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: truncate, force quiet */
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u); /* ties to even; overflow gives Inf */
    return (uint16_t)(x >> 16);
}

#endif

/*
 * quantize_simple.c - quantizers of the one-scale-per-block types: Q8_0,
 * Q8_K and MXFP4.
 *
 * Q8_0 and Q8_K use the absolute maximum of the block as the scale (the
 * format is fine enough that an error search gains nothing measurable);
 * Q8_K is also the activation format of the K-quant dot products, so its
 * bsums (sums of 16 quants) are filled in. MXFP4's power-of-two scale is
 * coarse, so both candidate exponents around the block maximum are tried
 * and the one with the smaller (importance-weighted) error is kept.
 */
#include <math.h>
#include <string.h>

#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/quant_tables.h"
#include "quant/quantize_impl.h"

void ds4_quantize_row_q8_0(const float *x, void *dst, int64_t n, const float *imatrix)
{
    (void)imatrix;
    block_q8_0 *y = dst;
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        float amax = 0.f;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.f;
        const float id = d != 0.f ? 1.f / d : 0.f;
        y[i].d = ds4_f32_to_f16(d);
        for (int j = 0; j < QK8_0; j++) y[i].qs[j] = (int8_t)ds4_nearest_int(x[j] * id);
    }
}

void ds4_quantize_row_q8_K(const float *x, void *dst, int64_t n, const float *imatrix)
{
    (void)imatrix;
    block_q8_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float amax = 0.f, max = 0.f;
        for (int j = 0; j < QK_K; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        memset(&y[i], 0, sizeof y[i]);
        if (amax == 0.f) continue;
        /* The signed extreme maps to -127 so every quant fits int8. */
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; j++) {
            int v = ds4_nearest_int(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
        }
        for (int b = 0; b < QK_K / 16; b++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += y[i].qs[16 * b + j];
            y[i].bsums[b] = (int16_t)s;
        }
        y[i].d = 1.f / iscale;
    }
}

/* Nearest E2M1 code of v (in doubled units: v = value / 2^(e-128)). */
static uint8_t nearest_e2m1(float v)
{
    const float a = fabsf(v);
    uint8_t best = 0;
    float berr = a;
    for (uint8_t c = 1; c < 8; c++) {
        float err = fabsf(a - (float)ds4_kvalues_mxfp4[c]);
        if (err < berr) {
            berr = err;
            best = c;
        }
    }
    return (uint8_t)(best | (v < 0.f && best ? 8 : 0));
}

static float mxfp4_block_error(const float *x, const float *w, uint8_t e, uint8_t *codes)
{
    const float d = e < 2 ? ldexpf(1.f, (int)e - 128) : ds4_bits_f32((uint32_t)(e - 1) << 23);
    float err = 0.f;
    for (int j = 0; j < QK_MXFP4; j++) {
        codes[j] = nearest_e2m1(x[j] / d); /* 1/d overflows for e = 0 */
        float diff = x[j] - (float)ds4_kvalues_mxfp4[codes[j]] * d;
        err += (w ? w[j] : 1.f) * diff * diff;
    }
    return err;
}

void ds4_quantize_row_mxfp4(const float *x, void *dst, int64_t n, const float *imatrix)
{
    block_mxfp4 *y = dst;
    for (int64_t i = 0; i < n / QK_MXFP4; i++, x += QK_MXFP4) {
        const float *w = imatrix ? imatrix + i * QK_MXFP4 : NULL;
        float amax = 0.f;
        for (int j = 0; j < QK_MXFP4; j++) amax = fmaxf(amax, fabsf(x[j]));
        /* Scale 2^(e-127) puts amax in [4, 8) (clips at 6) for e = e0 and
         * in [2, 4) for e0 + 1; either can win. */
        int e0 = amax > 0.f ? (int)floorf(log2f(amax)) - 2 + 127 : 0;
        if (e0 < 0) e0 = 0;
        if (e0 > 253) e0 = 253;
        uint8_t codes[QK_MXFP4], best_codes[QK_MXFP4];
        uint8_t best_e = (uint8_t)e0;
        float best = mxfp4_block_error(x, w, best_e, best_codes);
        if (amax > 0.f) {
            float err = mxfp4_block_error(x, w, (uint8_t)(e0 + 1), codes);
            if (err < best) {
                best = err;
                best_e = (uint8_t)(e0 + 1);
                memcpy(best_codes, codes, sizeof codes);
            }
        }
        y[i].e = best_e;
        for (int j = 0; j < QK_MXFP4 / 2; j++)
            y[i].qs[j] = (uint8_t)(best_codes[j] | (best_codes[j + QK_MXFP4 / 2] << 4));
    }
}

/*
 * dequantize.c - GGML blocks to f32, bit for bit as ggml's reference code.
 *
 * Bit-exactness needs ggml's float operation order, so each formula below
 * is written out step by step: a sub-block scale is rounded to f32
 * (d * sc) before it multiplies the quant, and the min is subtracted last.
 * The file is compiled with -std=c11, where GCC does not contract a*b-c
 * into an FMA, so the two roundings stay two roundings. These are the
 * reference paths (tests, converter); kernels have their own fused code.
 */
#include "quant/quant.h"

#include <string.h>

#include "quant/half.h"
#include "quant/quant_tables.h"
#include "util/error.h"

static void deq_f16(const uint16_t *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = ds4_f16_to_f32(x[i]);
}

static void deq_bf16(const uint16_t *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = ds4_bf16_to_f32(x[i]);
}

static void deq_q8_0(const block_q8_0 *x, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        const float d = ds4_f16_to_f32(x[i].d);
        for (int j = 0; j < QK8_0; j++) y[i * QK8_0 + j] = (float)x[i].qs[j] * d;
    }
}

static void deq_q8_K(const block_q8_K *x, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++)
        for (int j = 0; j < QK_K; j++) y[i * QK_K + j] = x[i].d * (float)x[i].qs[j];
}

/* Q4_K packs 8 6-bit scales and 8 6-bit mins into 12 bytes: sub-blocks
 * 0..3 in the low 6 bits of bytes 0..3 (scales) and 4..7 (mins);
 * sub-blocks 4..7 take their low 4 bits from bytes 8..11 and their top 2
 * bits from the spare top bits of bytes 0..7. */
static void q4k_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *mn)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
        *mn = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

static void deq_q4_K(const block_q4_K *x, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        const float d = ds4_f16_to_f32(x[i].d);
        const float dmin = ds4_f16_to_f32(x[i].dmin);
        const uint8_t *q = x[i].qs;
        for (int j = 0; j < 4; j++) { /* 64 values: low nibbles, then high */
            uint8_t sc, mn;
            q4k_scale_min(2 * j, x[i].scales, &sc, &mn);
            const float d1 = d * (float)sc, m1 = dmin * (float)mn;
            q4k_scale_min(2 * j + 1, x[i].scales, &sc, &mn);
            const float d2 = d * (float)sc, m2 = dmin * (float)mn;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
            q += 32;
        }
    }
}

/* Q2_K: each 128 values share 32 bytes of quants; value 32*k + l (k=0..3)
 * is bits 2k..2k+1 of byte l (l < 32). Scales go one per 16 values. */
static void deq_q2_K(const block_q2_K *x, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        const float d = ds4_f16_to_f32(x[i].d);
        const float dmin = ds4_f16_to_f32(x[i].dmin);
        const uint8_t *q = x[i].qs;
        int is = 0;
        for (int half = 0; half < 2; half++) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int part = 0; part < 2; part++) {
                    const uint8_t sc = x[i].scales[is++];
                    const float dl = d * (float)(sc & 0xF);
                    const float ml = dmin * (float)(sc >> 4);
                    for (int l = 0; l < 16; l++)
                        *y++ = dl * (float)((q[16 * part + l] >> shift) & 3) - ml;
                }
            }
            q += 32;
        }
    }
}

/* IQ2_XXS: per 32 values two uint32: four 8-bit grid indices, then four
 * 7-bit sign indices and a 4-bit scale s in the top bits; the sub-block
 * scale is d * (0.5 + s) * 0.25, rounded to f32 in that order. */
static void deq_iq2_xxs(const block_iq2_xxs *x, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        const float d = ds4_f16_to_f32(x[i].d);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            uint32_t aux[2];
            memcpy(aux, x[i].qs + 4 * ib, sizeof aux);
            const float db = d * (0.5f + (float)(aux[1] >> 28)) * 0.25f;
            for (int l = 0; l < 4; l++) {
                const uint64_t grid = ds4_iq2xxs_grid[(aux[0] >> (8 * l)) & 0xFF];
                const uint8_t signs = ds4_ksigns_iq2xs[(aux[1] >> (7 * l)) & 127];
                for (int j = 0; j < 8; j++) {
                    const float g = (float)((grid >> (8 * j)) & 0xFF);
                    *y++ = db * g * ((signs >> j) & 1 ? -1.f : 1.f);
                }
            }
        }
    }
}

/* E8M0 exponent e -> 2^(e-128): half the MXFP4 scale, because the value
 * table is doubled. e = 0 and 1 give f32 subnormals. */
static float e8m0_half(uint8_t e)
{
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    return ds4_bits_f32(bits);
}

static void deq_mxfp4(const block_mxfp4 *x, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        const float d = e8m0_half(x[i].e);
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            y[i * QK_MXFP4 + j] = (float)ds4_kvalues_mxfp4[x[i].qs[j] & 0xF] * d;
            y[i * QK_MXFP4 + j + QK_MXFP4 / 2] = (float)ds4_kvalues_mxfp4[x[i].qs[j] >> 4] * d;
        }
    }
}

ds4_status ds4_dequantize_row(ds4_type type, const void *src, float *dst, int64_t n)
{
    int64_t bytes;
    ds4_status st = ds4_row_bytes_checked(type, n, &bytes);
    if (st != DS4_OK) return st;
    const ds4_type_info *t = ds4_type_get(type);
    const int64_t nb = n / t->block_elems;
    switch (type) {
    case DS4_TYPE_F32: memmove(dst, src, (size_t)bytes); break;
    case DS4_TYPE_F16: deq_f16(src, dst, n); break;
    case DS4_TYPE_BF16: deq_bf16(src, dst, n); break;
    case DS4_TYPE_Q8_0: deq_q8_0(src, dst, nb); break;
    case DS4_TYPE_Q8_K: deq_q8_K(src, dst, nb); break;
    case DS4_TYPE_Q4_K: deq_q4_K(src, dst, nb); break;
    case DS4_TYPE_Q2_K: deq_q2_K(src, dst, nb); break;
    case DS4_TYPE_IQ2_XXS: deq_iq2_xxs(src, dst, nb); break;
    case DS4_TYPE_MXFP4: deq_mxfp4(src, dst, nb); break;
    default:
        return ds4_fail(DS4_ERR_UNSUPPORTED,
                        "quant: cannot dequantize %s to f32 (integer type)", t->name);
    }
    return DS4_OK;
}

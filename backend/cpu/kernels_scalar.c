/*
 * kernels_scalar.c - portable reference dot-product kernels, one per weight
 * type (the numbers every SIMD kernel is tested against).
 *
 * Each decodes a block exactly as the format defines it and accumulates in
 * the same order ggml's vec_dot does: integer sums inside a block (or
 * sub-block), one float multiply-add per block with the product of the
 * weight and activation scales. The float types use f32 activations.
 * The `ntok` loop sits inside the block loop, so a block is decoded once
 * for all the tokens of a tile.
 */
#include "backend/cpu/cpu_matmul_kernels.h"

#include <string.h>

#define XROW(x, t, stride) ((const void *)((const char *)(x) + (size_t)(t) * (stride)))

static void dot_f32(int64_t n, const void *w, const void *x, size_t xs, int ntok, float *out)
{
    const float *a = w;
    for (int t = 0; t < ntok; t++) {
        const float *b = XROW(x, t, xs);
        float s = 0;
        for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
        out[t] = s;
    }
}

static void dot_f16(int64_t n, const void *w, const void *x, size_t xs, int ntok, float *out)
{
    const uint16_t *a = w;
    float acc[DS4_TILE_TOK] = {0};
    for (int64_t i = 0; i < n; i++) {
        float v = ds4_k_f16_to_f32(a[i]);
        for (int t = 0; t < ntok; t++) acc[t] += v * ((const float *)XROW(x, t, xs))[i];
    }
    memcpy(out, acc, sizeof(float) * (size_t)ntok);
}

static void dot_bf16(int64_t n, const void *w, const void *x, size_t xs, int ntok, float *out)
{
    const uint16_t *a = w;
    float acc[DS4_TILE_TOK] = {0};
    for (int64_t i = 0; i < n; i++) {
        float v = ds4_k_bf16_to_f32(a[i]);
        for (int t = 0; t < ntok; t++) acc[t] += v * ((const float *)XROW(x, t, xs))[i];
    }
    memcpy(out, acc, sizeof(float) * (size_t)ntok);
}

static void dot_q8_0(int64_t n, const void *w, const void *x, size_t xs, int ntok, float *out)
{
    const block_q8_0 *b = w;
    float acc[DS4_TILE_TOK] = {0};
    for (int64_t i = 0; i < n / QK8_0; i++) {
        float dw = ds4_k_f16_to_f32(b[i].d);
        for (int t = 0; t < ntok; t++) {
            const void *row = XROW(x, t, xs);
            const int8_t *q = ds4_act_qs(row) + i * QK8_0;
            int s = 0;
            for (int j = 0; j < QK8_0; j++) s += b[i].qs[j] * q[j];
            acc[t] += dw * ds4_act_d(row, n)[i] * (float)s;
        }
    }
    memcpy(out, acc, sizeof(float) * (size_t)ntok);
}

static void dot_mxfp4(int64_t n, const void *w, const void *x, size_t xs, int ntok, float *out)
{
    const block_mxfp4 *b = w;
    float acc[DS4_TILE_TOK] = {0};
    for (int64_t i = 0; i < n / QK_MXFP4; i++) {
        int8_t v[QK_MXFP4];
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            v[j] = ds4_kvalues_mxfp4[b[i].qs[j] & 15];
            v[j + QK_MXFP4 / 2] = ds4_kvalues_mxfp4[b[i].qs[j] >> 4];
        }
        float dw = ds4_k_e8m0_half(b[i].e);
        for (int t = 0; t < ntok; t++) {
            const void *row = XROW(x, t, xs);
            const int8_t *q = ds4_act_qs(row) + i * QK_MXFP4;
            int s = 0;
            for (int j = 0; j < QK_MXFP4; j++) s += v[j] * q[j];
            acc[t] += dw * ds4_act_d(row, n)[i] * (float)s;
        }
    }
    memcpy(out, acc, sizeof(float) * (size_t)ntok);
}

/* Q2_K value k of a block: 2 bits at shift 2*((k%128)/32) of byte
 * 32*(k/128) + k%32; scale/min nibbles of sub-block k/16. */
static void dot_q2_K(int64_t n, const void *w, const void *x, size_t xs, int ntok, float *out)
{
    const block_q2_K *b = w;
    float acc[DS4_TILE_TOK] = {0};
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t q[QK_K];
        for (int k = 0; k < QK_K; k++)
            q[k] = (b[i].qs[32 * (k / 128) + k % 32] >> (2 * ((k % 128) / 32))) & 3;
        float d = ds4_k_f16_to_f32(b[i].d), dmin = ds4_k_f16_to_f32(b[i].dmin);
        for (int t = 0; t < ntok; t++) {
            const void *row = XROW(x, t, xs);
            const int8_t *y = ds4_act_qs(row) + i * QK_K;
            const int16_t *bs = ds4_act_bsums(row, n) + i * (QK_K / 16);
            float yd = ds4_act_d(row, n)[i];
            int isum = 0, summs = 0;
            for (int s = 0; s < QK_K / 16; s++) {
                int si = 0;
                for (int j = 0; j < 16; j++) si += q[16 * s + j] * y[16 * s + j];
                isum += (b[i].scales[s] & 15) * si;
                summs += (b[i].scales[s] >> 4) * bs[s];
            }
            acc[t] += yd * d * (float)isum - yd * dmin * (float)summs;
        }
    }
    memcpy(out, acc, sizeof(float) * (size_t)ntok);
}

/* Q4_K 6-bit scale and min of sub-block j (of 8) from the 12 packed bytes. */
static void q4_K_scale_min(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Q4_K value k: nibble (k%64)/32 (low first) of byte 32*(k/64) + k%32. */
static void dot_q4_K(int64_t n, const void *w, const void *x, size_t xs, int ntok, float *out)
{
    const block_q4_K *b = w;
    float acc[DS4_TILE_TOK] = {0};
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t q[QK_K];
        for (int k = 0; k < QK_K; k++) {
            uint8_t byte = b[i].qs[32 * (k / 64) + k % 32];
            q[k] = (k % 64) < 32 ? (byte & 15) : (byte >> 4);
        }
        int sc[8], m[8];
        for (int j = 0; j < 8; j++) q4_K_scale_min(b[i].scales, j, &sc[j], &m[j]);
        float d = ds4_k_f16_to_f32(b[i].d), dmin = ds4_k_f16_to_f32(b[i].dmin);
        for (int t = 0; t < ntok; t++) {
            const void *row = XROW(x, t, xs);
            const int8_t *y = ds4_act_qs(row) + i * QK_K;
            const int16_t *bs = ds4_act_bsums(row, n) + i * (QK_K / 16);
            float yd = ds4_act_d(row, n)[i];
            int isum = 0, summs = 0;
            for (int j = 0; j < 8; j++) {
                int si = 0;
                for (int l = 0; l < 32; l++) si += q[32 * j + l] * y[32 * j + l];
                isum += sc[j] * si;
                summs += m[j] * (bs[2 * j] + bs[2 * j + 1]);
            }
            acc[t] += yd * d * (float)isum - yd * dmin * (float)summs;
        }
    }
    memcpy(out, acc, sizeof(float) * (size_t)ntok);
}

/* IQ2_XXS, per 32 values: 4 grid indices (bytes), then a uint32 holding 4x7
 * sign bits and a 4-bit scale ls; value = d * (2*ls+1)/8 * grid * sign. */
static void dot_iq2_xxs(int64_t n, const void *w, const void *x, size_t xs, int ntok, float *out)
{
    const block_iq2_xxs *b = w;
    float acc[DS4_TILE_TOK] = {0};
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t v[QK_K];
        int ls[8];
        for (int g = 0; g < 8; g++) {
            uint32_t aux[2];
            memcpy(aux, b[i].qs + 4 * g, 8);
            const uint8_t *idx = (const uint8_t *)&aux[0];
            ls[g] = 2 * (int)(aux[1] >> 28) + 1;
            for (int l = 0; l < 4; l++) {
                uint64_t grid = ds4_iq2xxs_grid[idx[l]];
                uint8_t signs = ds4_ksigns_iq2xs[(aux[1] >> (7 * l)) & 127];
                for (int j = 0; j < 8; j++) {
                    int mag = (int)((grid >> (8 * j)) & 0xff);
                    v[32 * g + 8 * l + j] = (int8_t)((signs >> j) & 1 ? -mag : mag);
                }
            }
        }
        float d = ds4_k_f16_to_f32(b[i].d);
        for (int t = 0; t < ntok; t++) {
            const void *row = XROW(x, t, xs);
            const int8_t *y = ds4_act_qs(row) + i * QK_K;
            int bsum = 0;
            for (int g = 0; g < 8; g++) {
                int si = 0;
                for (int j = 0; j < 32; j++) si += v[32 * g + j] * y[32 * g + j];
                bsum += si * ls[g];
            }
            acc[t] += d * ds4_act_d(row, n)[i] * (float)bsum;
        }
    }
    for (int t = 0; t < ntok; t++) out[t] = 0.125f * acc[t];
}

ds4_dot_fn ds4_cpu_dot_scalar(ds4_type type)
{
    switch (type) {
    case DS4_TYPE_F32: return dot_f32;
    case DS4_TYPE_F16: return dot_f16;
    case DS4_TYPE_BF16: return dot_bf16;
    case DS4_TYPE_Q8_0: return dot_q8_0;
    case DS4_TYPE_MXFP4: return dot_mxfp4;
    case DS4_TYPE_Q2_K: return dot_q2_K;
    case DS4_TYPE_Q4_K: return dot_q4_K;
    case DS4_TYPE_IQ2_XXS: return dot_iq2_xxs;
    default: return NULL;
    }
}

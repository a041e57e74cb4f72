/*
 * quantize_k.c - quantizers of the affine K-quants Q4_K and Q2_K.
 *
 * Both store, per super-block of 256, f16 scales d and dmin and per
 * sub-block (32 values for Q4_K, 16 for Q2_K) integer scales sc and mins
 * mn, with x ~= (d*sc) * q - (dmin*mn), q in [0, nmax]. The error to
 * minimise is sum w * (x - deq)^2 with w = the importance matrix (or 1):
 * that is the quantity that matters downstream (and what tests measure).
 *
 * Three steps per super-block:
 *  1. per sub-block, the best real (scale, min) pair: a sweep of candidate
 *     grid spacings, each followed by a weighted least-squares refit;
 *  2. d and dmin from the largest scale / min, tried at a few spacings,
 *     each sub-block's integer (sc, mn) then picked among the neighbours of
 *     the rounded values by the actual error with the f16 super-scales;
 *  3. the quants of the winning candidate, computed with exactly the f32
 *     products the dequantizer uses.
 * Everything is on the stack; no allocation, no shared state.
 */
#include <math.h>
#include <string.h>

#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/quantize_impl.h"

#define MAX_SUB 32 /* largest sub-block */
#define MAX_NSUB 16 /* most sub-blocks per super-block */

typedef struct {
    int sub;  /* values per sub-block */
    int nsub; /* sub-blocks per super-block */
    int nmax; /* largest quant */
    int smax; /* largest integer scale / min */
} kshape;

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* f16 of a non-negative scale, saturating at the largest finite half. */
static uint16_t f16_scale(float v) { return ds4_f32_to_f16(fminf(v, 65504.f)); }

/* Error of x ~ a*q - b with the best q, and the q's (if q != NULL). a and
 * b are the exact f32 values the dequantizer will use. */
static float affine_error(const float *x, const float *w, int n, int nmax, float a,
                          float b, uint8_t *q)
{
    float err = 0.f;
    const float ia = a > 0.f ? 1.f / a : 0.f;
    for (int i = 0; i < n; i++) {
        int l = a > 0.f ? clampi(ds4_nearest_int((x[i] + b) * ia), 0, nmax) : 0;
        float diff = a * (float)l - b - x[i];
        err += w[i] * diff * diff;
        if (q) q[i] = (uint8_t)l;
    }
    return err;
}

/* Step 1: best real scale s >= 0 and min m >= 0 (x ~ s*q - m) for one
 * sub-block. */
static void fit_sub_block(const float *x, const float *w, int n, int nmax, float *s_out,
                          float *m_out)
{
    float xmin = x[0], xmax = x[0];
    for (int i = 1; i < n; i++) {
        xmin = fminf(xmin, x[i]);
        xmax = fmaxf(xmax, x[i]);
    }
    if (xmin > 0.f) xmin = 0.f;
    if (xmax <= xmin) {
        *s_out = 0.f;
        *m_out = -xmin;
        return;
    }
    float best_s = (xmax - xmin) / (float)nmax, best_m = -xmin;
    float best = affine_error(x, w, n, nmax, best_s, best_m, NULL);
    uint8_t q[MAX_SUB];
    for (int k = -5; k <= 5; k++) {
        const float iscale = ((float)nmax + 0.2f * (float)k) / (xmax - xmin);
        double sw = 0, swq = 0, swqq = 0, swx = 0, swqx = 0;
        for (int i = 0; i < n; i++) {
            q[i] = (uint8_t)clampi(ds4_nearest_int(iscale * (x[i] - xmin)), 0, nmax);
            sw += w[i];
            swq += w[i] * q[i];
            swqq += (double)w[i] * q[i] * q[i];
            swx += w[i] * x[i];
            swqx += (double)w[i] * q[i] * x[i];
        }
        /* least squares x ~ s*q + o with o <= 0 (o = -m) */
        double det = sw * swqq - swq * swq, s, o;
        if (det <= 0) continue;
        s = (sw * swqx - swq * swx) / det;
        o = (swqq * swx - swq * swqx) / det;
        if (o > 0) {
            o = 0;
            s = swqx / swqq;
        }
        if (!(s > 0)) continue;
        float err = affine_error(x, w, n, nmax, (float)s, (float)-o, NULL);
        if (err < best) {
            best = err;
            best_s = (float)s;
            best_m = (float)-o;
        }
    }
    *s_out = best_s;
    *m_out = best_m;
}

/* Step 2 for one candidate (d, dmin): per sub-block integer (sc, mn) by
 * local search around the rounded values. Returns the total error. */
static float pick_int_scales(const kshape *sh, const float *x, const float *w,
                             const float *s, const float *m, float d, float dmin,
                             uint8_t *sc, uint8_t *mn)
{
    float total = 0.f;
    const float id = d > 0.f ? 1.f / d : 0.f, idm = dmin > 0.f ? 1.f / dmin : 0.f;
    for (int j = 0; j < sh->nsub; j++) {
        const float *xj = x + j * sh->sub, *wj = w + j * sh->sub;
        int sc0 = clampi(ds4_nearest_int(s[j] * id), 0, sh->smax);
        int mn0 = clampi(ds4_nearest_int(m[j] * idm), 0, sh->smax);
        /* all-zero sub-block first: never worse than dropping it */
        float best = affine_error(xj, wj, sh->sub, sh->nmax, 0.f, 0.f, NULL);
        sc[j] = mn[j] = 0;
        for (int a = sc0 - 1; a <= sc0 + 1; a++) {
            if (a < 0 || a > sh->smax) continue;
            for (int b = mn0 - 1; b <= mn0 + 1; b++) {
                if (b < 0 || b > sh->smax) continue;
                float e = affine_error(xj, wj, sh->sub, sh->nmax, d * (float)a,
                                       dmin * (float)b, NULL);
                if (e < best) {
                    best = e;
                    sc[j] = (uint8_t)a;
                    mn[j] = (uint8_t)b;
                }
            }
        }
        total += best;
    }
    return total;
}

/* Steps 1-3 for one super-block: fills d, dmin (f16 bits), sc, mn, q. */
static void quantize_super_block(const kshape *sh, const float *x, const float *imw,
                                 uint16_t *d_out, uint16_t *dmin_out, uint8_t *sc,
                                 uint8_t *mn, uint8_t *q)
{
    float w[QK_K], s[MAX_NSUB], m[MAX_NSUB];
    ds4_importance_weights(imw, w, QK_K);
    float smax = 0.f, mmax = 0.f;
    for (int j = 0; j < sh->nsub; j++) {
        fit_sub_block(x + j * sh->sub, w + j * sh->sub, sh->sub, sh->nmax, &s[j], &m[j]);
        smax = fmaxf(smax, s[j]);
        mmax = fmaxf(mmax, m[j]);
    }
    uint8_t bsc[MAX_NSUB], bmn[MAX_NSUB], tsc[MAX_NSUB], tmn[MAX_NSUB];
    float best = INFINITY;
    uint16_t bd = 0, bdm = 0;
    static const float kd[] = {1.0f, 0.94f};
    static const float km[] = {1.0f};
    for (size_t a = 0; a < sizeof kd / sizeof kd[0]; a++) {
        for (size_t b = 0; b < sizeof km / sizeof km[0]; b++) {
            uint16_t d16 = f16_scale(smax / (float)sh->smax * kd[a]);
            uint16_t dm16 = f16_scale(mmax / (float)sh->smax * km[b]);
            float e = pick_int_scales(sh, x, w, s, m, ds4_f16_to_f32(d16),
                                      ds4_f16_to_f32(dm16), tsc, tmn);
            if (e < best) {
                best = e;
                bd = d16;
                bdm = dm16;
                memcpy(bsc, tsc, sizeof tsc);
                memcpy(bmn, tmn, sizeof tmn);
            }
            if (mmax == 0.f) break;
        }
        if (smax == 0.f) break;
    }
    const float d = ds4_f16_to_f32(bd), dmin = ds4_f16_to_f32(bdm);
    for (int j = 0; j < sh->nsub; j++) {
        sc[j] = bsc[j];
        mn[j] = bmn[j];
        affine_error(x + j * sh->sub, w + j * sh->sub, sh->sub, sh->nmax,
                     d * (float)bsc[j], dmin * (float)bmn[j], q + j * sh->sub);
    }
    *d_out = bd;
    *dmin_out = bdm;
}

void ds4_quantize_row_q4_K(const float *x, void *dst, int64_t n, const float *imatrix)
{
    static const kshape sh = {32, 8, 15, 63};
    block_q4_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], mn[8], q[QK_K];
        quantize_super_block(&sh, x + i * QK_K, imatrix ? imatrix + i * QK_K : NULL,
                             &y[i].d, &y[i].dmin, sc, mn, q);
        /* 6-bit scale/min packing: see q4k_scale_min in dequantize.c */
        memset(y[i].scales, 0, sizeof y[i].scales);
        for (int j = 0; j < 4; j++) {
            y[i].scales[j] = sc[j];
            y[i].scales[j + 4] = mn[j];
        }
        for (int j = 4; j < 8; j++) {
            y[i].scales[j + 4] = (uint8_t)((sc[j] & 0xF) | ((mn[j] & 0xF) << 4));
            y[i].scales[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            y[i].scales[j] |= (uint8_t)((mn[j] >> 4) << 6);
        }
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                y[i].qs[32 * c + l] = (uint8_t)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
    }
}

void ds4_quantize_row_q2_K(const float *x, void *dst, int64_t n, const float *imatrix)
{
    static const kshape sh = {16, 16, 3, 15};
    block_q2_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sc[16], mn[16], q[QK_K];
        quantize_super_block(&sh, x + i * QK_K, imatrix ? imatrix + i * QK_K : NULL,
                             &y[i].d, &y[i].dmin, sc, mn, q);
        for (int j = 0; j < 16; j++) y[i].scales[j] = (uint8_t)(sc[j] | (mn[j] << 4));
        /* value 128h + 32k + l sits in bits 2k of byte 32h + l */
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                uint8_t b = 0;
                for (int k = 0; k < 4; k++) b |= (uint8_t)(q[128 * h + 32 * k + l] << (2 * k));
                y[i].qs[32 * h + l] = b;
            }
    }
}

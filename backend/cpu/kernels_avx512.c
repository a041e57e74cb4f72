/*
 * kernels_avx512.c - AVX-512 (F/BW/VL/DQ + VNNI) dot-product kernels
 * for the quantized types; the float types use the AVX2 kernels, which
 * already run at memory speed.
 *
 * Same structure as kernels_avx2.c (one always-inline body per type,
 * instantiated for 1..DS4_TILE_TOK tokens), with what AVX-512 adds:
 *  - 64 values per register: two Q8_0/MXFP4 blocks, two IQ2_XXS groups
 *    (Q2_K and Q4_K stay at 256 bits, where their activations are
 *    contiguous: the cross-lane inserts of a 512-bit form cost more than
 *    they save on Zen 4, which splits 512-bit ops in two);
 *  - mask registers: a sign is a bit, so signs are applied to the
 *    activations with one masked subtract (the IQ2_XXS sign bits of a whole
 *    block are unpacked at once in vector registers, the 8th bit of each
 *    byte being the parity of the 7 stored);
 *  - VNNI: vpdpbusd (u8 x s8 -> int32 sums of 4) and vpdpwssd (int16
 *    products with the sub-block scales, accumulated in one instruction);
 *  - IQ2_XXS grid rows are fetched with scalar loads and inserted: on Zen 4
 *    that measured faster than vpgatherqq, than 2-bit codes looked up in
 *    registers with vpermt2w, and than the same with VBMI vpermi2b +
 *    vpmultishiftqb.
 */
#include "backend/cpu/simd_avx512.h"

#include <string.h>

#define XQ(x, t, xs) ((const int8_t *)(x) + (size_t)(t) * (xs))

INLINE __m512 set2x8(float a, float b)
{
    return _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1);
}

#define INSTANTIATE(NAME)                                                              \
    static void NAME(int64_t n, const void *w, const void *x, size_t xs, int ntok,     \
                     float *out)                                                       \
    {                                                                                  \
        switch (ntok) {                                                                \
        case 1: NAME##_body(n, w, x, xs, 1, out); break;                               \
        case 2: NAME##_body(n, w, x, xs, 2, out); break;                               \
        case 3: NAME##_body(n, w, x, xs, 3, out); break;                               \
        default: NAME##_body(n, w, x, xs, 4, out); break;                              \
        }                                                                              \
    }

/* ---- Q8_0 and MXFP4 (Q8_0 activations) -------------------------------- */

/* Signed weights enter vpdpbusd as |w|; their signs negate the activations. */
INLINE __m512i dot64_signed(__m512i wabs, __mmask64 wneg, __m512i y)
{
    __m512i ys = _mm512_mask_sub_epi8(y, wneg, _mm512_setzero_si512(), y);
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), wabs, ys);
}

INLINE __m256i dot32_signed(__m256i wabs, __mmask32 wneg, __m256i y)
{
    __m256i ys = _mm256_mask_sub_epi8(y, wneg, _mm256_setzero_si256(), y);
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), wabs, ys);
}

/* Two 32-value blocks per step; weights wv (signed, 64 values) with scales
 * dw0/dw1, activation blocks i, i+1. */
#define Q8_PAIR_STEP(wv, dw0, dw1)                                                     \
    do {                                                                               \
        __m512i wa_ = _mm512_abs_epi8(wv);                                             \
        __mmask64 neg_ = _mm512_movepi8_mask(wv);                                      \
        _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)                           \
        {                                                                              \
            const int8_t *xr = XQ(x, t, xs);                                           \
            const float *xd = ds4_act_d(xr, n);                                        \
            __m512i s_ = dot64_signed(wa_, neg_, _mm512_loadu_si512(xr + i * 32));     \
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s_),                           \
                                     set2x8((dw0) * xd[i], (dw1) * xd[i + 1]), acc[t]); \
        }                                                                              \
    } while (0)

#define Q8_TAIL_STEP(wv, dw)                                                           \
    do {                                                                               \
        __m256i wa_ = _mm256_abs_epi8(wv);                                             \
        __mmask32 neg_ = _mm256_movepi8_mask(wv);                                      \
        for (int t = 0; t < NT; t++) {                                                 \
            const int8_t *xr = XQ(x, t, xs);                                           \
            __m256i s_ = dot32_signed(wa_, neg_, _mm256_loadu_si256((const __m256i *)(xr + i * 32))); \
            __m512 f_ = _mm512_castps256_ps512(_mm256_cvtepi32_ps(s_));                \
            f_ = _mm512_maskz_mov_ps(0xff, f_);                                        \
            acc[t] = _mm512_fmadd_ps(f_, _mm512_set1_ps((dw) * ds4_act_d(xr, n)[i]), acc[t]); \
        }                                                                              \
    } while (0)

INLINE void dot_q8_0_body(int64_t n, const void *w, const void *x, size_t xs, const int NT, float *out)
{
    const block_q8_0 *b = w;
    const int64_t nb = n / QK8_0;
    __m512 acc[DS4_TILE_TOK];
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        __m512i wv = load2x256(b[i].qs, b[i + 1].qs);
        Q8_PAIR_STEP(wv, f16(b[i].d), f16(b[i + 1].d));
    }
    if (i < nb) {
        __m256i wv = _mm256_loadu_si256((const __m256i *)b[i].qs);
        Q8_TAIL_STEP(wv, f16(b[i].d));
    }
    for (int t = 0; t < NT; t++) out[t] = hsum16(acc[t]);
}
INSTANTIATE(dot_q8_0)

/* 32 MXFP4 codes of a block in value order (low nibbles, then high). */
INLINE __m256i mxfp4_codes(const uint8_t *qs)
{
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(15));
}

INLINE void dot_mxfp4_body(int64_t n, const void *w, const void *x, size_t xs, const int NT, float *out)
{
    const block_mxfp4 *b = w;
    const int64_t nb = n / QK_MXFP4;
    const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)ds4_kvalues_mxfp4));
    __m512 acc[DS4_TILE_TOK];
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        __m512i codes = _mm512_inserti64x4(_mm512_castsi256_si512(mxfp4_codes(b[i].qs)), mxfp4_codes(b[i + 1].qs), 1);
        __m512i wv = _mm512_shuffle_epi8(table, codes);
        Q8_PAIR_STEP(wv, ds4_k_e8m0_half(b[i].e), ds4_k_e8m0_half(b[i + 1].e));
    }
    if (i < nb) {
        __m256i wv = _mm256_shuffle_epi8(_mm512_castsi512_si256(table), mxfp4_codes(b[i].qs));
        Q8_TAIL_STEP(wv, ds4_k_e8m0_half(b[i].e));
    }
    for (int t = 0; t < NT; t++) out[t] = hsum16(acc[t]);
}
INSTANTIATE(dot_mxfp4)

/* ---- Q2_K ---------------------------------------------------------------
 *
 * 256-bit registers (AVX512-VL VNNI: vpdpwssd does the scale multiply and
 * the accumulation): the 512-bit form needs a cross-lane insert per
 * activation load, and on Zen 4 (512-bit ops split in two, shuffles on two
 * ports) that made it slower. Each 32 qs bytes at shift s hold sub-blocks
 * (2p, 2p+1), p = 4h + s, one per 128-bit lane. */
static const int8_t q2k_pair_ctrl[8][32] = {
#define Z -128
#define PAIR(a, b) {a, Z, a, Z, a, Z, a, Z, a, Z, a, Z, a, Z, a, Z, b, Z, b, Z, b, Z, b, Z, b, Z, b, Z, b, Z, b, Z}
    PAIR(0, 1), PAIR(2, 3), PAIR(4, 5), PAIR(6, 7), PAIR(8, 9), PAIR(10, 11), PAIR(12, 13), PAIR(14, 15),
#undef PAIR
#undef Z
};

INLINE void dot_q2_K_body(int64_t n, const void *w, const void *x, size_t xs, const int NT, float *out)
{
    const block_q2_K *b = w;
    const __m256i m3 = _mm256_set1_epi8(3), m15 = _mm256_set1_epi8(15);
    __m256 acc[DS4_TILE_TOK], accm[DS4_TILE_TOK];
    for (int t = 0; t < NT; t++) acc[t] = accm[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        _mm_prefetch((const char *)(b + i) + 2048, _MM_HINT_T0);
        _mm_prefetch((const char *)(b + i) + 2048 + 64, _MM_HINT_T0);
        __m256i scb = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)b[i].scales));
        __m256i sc4 = _mm256_and_si256(scb, m15);
        __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(_mm256_castsi256_si128(scb), 4),
                                                          _mm_set1_epi8(15)));
        __m256i isum[2][DS4_TILE_TOK]; /* two dependency chains */
        for (int t = 0; t < NT; t++) isum[0][t] = isum[1][t] = _mm256_setzero_si256();
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
        {
            __m256i q = _mm256_loadu_si256((const __m256i *)(b[i].qs + 32 * h));
            _Pragma("GCC unroll 4") for (int s = 0; s < 4; s++)
            {
                __m256i v = _mm256_and_si256(_mm256_srli_epi16(q, 2 * s), m3);
                __m256i scv = _mm256_shuffle_epi8(sc4, _mm256_loadu_si256((const __m256i *)q2k_pair_ctrl[4 * h + s]));
                _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
                {
                    const int8_t *y = XQ(x, t, xs) + i * QK_K + 128 * h + 32 * s;
                    __m256i p = _mm256_maddubs_epi16(v, _mm256_loadu_si256((const __m256i *)y));
                    isum[s & 1][t] = _mm256_dpwssd_epi32(isum[s & 1][t], p, scv);
                }
            }
        }
        float d = f16(b[i].d), dmin = f16(b[i].dmin);
        _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
        {
            const int8_t *xr = XQ(x, t, xs);
            float yd = ds4_act_d(xr, n)[i];
            __m256i bs = _mm256_loadu_si256((const __m256i *)(ds4_act_bsums(xr, n) + i * 16));
            __m256i ms = _mm256_madd_epi16(bs, mins);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * yd), _mm256_cvtepi32_ps(_mm256_add_epi32(isum[0][t], isum[1][t])), acc[t]);
            accm[t] = _mm256_fmadd_ps(_mm256_set1_ps(dmin * yd), _mm256_cvtepi32_ps(ms), accm[t]);
        }
    }
    for (int t = 0; t < NT; t++) {
        __m512 v = _mm512_maskz_mov_ps(0xff, _mm512_castps256_ps512(_mm256_sub_ps(acc[t], accm[t])));
        out[t] = hsum16(v);
    }
}
INSTANTIATE(dot_q2_K)

/* ---- Q4_K -------------------------------------------------------------- */

INLINE void q4_K_scales(const uint8_t *s, uint8_t sc[8], uint8_t m[8])
{
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        m[j] = s[j + 4] & 63;
        sc[j + 4] = (uint8_t)((s[j + 8] & 15) | ((s[j] >> 6) << 4));
        m[j + 4] = (uint8_t)((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
    }
}

/* 256-bit as for Q2_K: 32 qs bytes j give sub-blocks 2j (low nibbles) and
 * 2j+1 (high), each against 32 contiguous activations. */
INLINE void dot_q4_K_vnni_body(int64_t n, const void *w, const void *x, size_t xs, const int NT, float *out)
{
    const block_q4_K *b = w;
    const __m256i m15 = _mm256_set1_epi8(15);
    __m256 acc[DS4_TILE_TOK], accm[DS4_TILE_TOK];
    for (int t = 0; t < NT; t++) acc[t] = accm[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], m[8];
        q4_K_scales(b[i].scales, sc, m);
        __m128i m8 = _mm_loadl_epi64((const __m128i *)m);
        __m256i mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
        __m256i isum[DS4_TILE_TOK];
        for (int t = 0; t < NT; t++) isum[t] = _mm256_setzero_si256();
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)
        {
            __m256i q = _mm256_loadu_si256((const __m256i *)(b[i].qs + 32 * j));
            __m256i lo = _mm256_and_si256(q, m15);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m15);
            __m256i slo = _mm256_set1_epi16(sc[2 * j]), shi = _mm256_set1_epi16(sc[2 * j + 1]);
            _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
            {
                const int8_t *y = XQ(x, t, xs) + i * QK_K + 64 * j;
                __m256i pl = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)y));
                __m256i ph = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(y + 32)));
                isum[t] = _mm256_dpwssd_epi32(isum[t], pl, slo);
                isum[t] = _mm256_dpwssd_epi32(isum[t], ph, shi);
            }
        }
        float d = f16(b[i].d), dmin = f16(b[i].dmin);
        _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
        {
            const int8_t *xr = XQ(x, t, xs);
            float yd = ds4_act_d(xr, n)[i];
            __m256i bs = _mm256_loadu_si256((const __m256i *)(ds4_act_bsums(xr, n) + i * 16));
            __m256i ms = _mm256_madd_epi16(bs, mins);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * yd), _mm256_cvtepi32_ps(isum[t]), acc[t]);
            accm[t] = _mm256_fmadd_ps(_mm256_set1_ps(dmin * yd), _mm256_cvtepi32_ps(ms), accm[t]);
        }
    }
    for (int t = 0; t < NT; t++) {
        __m512 v = _mm512_maskz_mov_ps(0xff, _mm512_castps256_ps512(_mm256_sub_ps(acc[t], accm[t])));
        out[t] = hsum16(v);
    }
}
INSTANTIATE(dot_q4_K_vnni)

/* One token: the AVX2 kernel (vpmaddwd + vpaddd) measured faster on Zen 4
 * than chains of vpdpwssd; from two tokens on, VNNI wins. */
static void dot_q4_K(int64_t n, const void *w, const void *x, size_t xs, int ntok, float *out)
{
    if (ntok == 1) ds4_cpu_dot_avx2(DS4_TYPE_Q4_K)(n, w, x, xs, 1, out);
    else dot_q4_K_vnni(n, w, x, xs, ntok, out);
}

/* ---- IQ2_XXS ----------------------------------------------------------- */


/* vpermw indices picking, from the 32 words of a block's qs, the scale word
 * of group 2h (word 8h+3: top half of sign word 4h+1) for words 0-15 and
 * of group 2h+1 (word 8h+7) for words 16-31. */
static const uint16_t iq2_ls_idx[4][32] = {
#define R(a) a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a
    {R(3), R(7)}, {R(11), R(15)}, {R(19), R(23)}, {R(27), R(31)},
#undef R
};

INLINE void dot_iq2_xxs_body(int64_t n, const void *w, const void *x, size_t xs, const int NT, float *out)
{
    const block_iq2_xxs *b = w;
    const long long *grid = (const long long *)ds4_iq2xxs_grid;
    __m512 acc[DS4_TILE_TOK];
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint32_t aux[16];
        memcpy(aux, b[i].qs, 64);
        /* 2 * ls + 1 in the high word of every sign word (the other words
         * are never picked) */
        __m512i q = _mm512_loadu_si512(b[i].qs);
        __m512i lsw = _mm512_or_si512(_mm512_srli_epi16(q, 11), _mm512_set1_epi16(1));
        uint64_t signs[4];
        _mm256_storeu_si256((__m256i *)signs, iq2_signs_block(q));
        __m512i isum[2][DS4_TILE_TOK]; /* two dependency chains */
        for (int t = 0; t < NT; t++) isum[0][t] = isum[1][t] = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int h = 0; h < 4; h++)
        {
            /* groups 2h, 2h+1: index words aux[4h], aux[4h+2]; sign words
             * aux[4h+1], aux[4h+3] (top 4 bits: the scale) */
            const uint8_t *ix = (const uint8_t *)(aux + 4 * h);
            __m512i gv = _mm512_set_epi64(grid[ix[11]], grid[ix[10]], grid[ix[9]], grid[ix[8]],
                                          grid[ix[3]], grid[ix[2]], grid[ix[1]], grid[ix[0]]);
            __mmask64 neg = _cvtu64_mask64(signs[h]);
            __m512i ls = _mm512_permutexvar_epi16(_mm512_loadu_si512(iq2_ls_idx[h]), lsw);
            _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
            {
                __m512i y = _mm512_loadu_si512(XQ(x, t, xs) + i * QK_K + 64 * h);
                __m512i ys = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
                isum[h & 1][t] = _mm512_dpwssd_epi32(isum[h & 1][t], _mm512_maddubs_epi16(gv, ys), ls);
            }
        }
        float d = f16(b[i].d);
        _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
        {
            float yd = ds4_act_d(XQ(x, t, xs), n)[i];
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(isum[0][t], isum[1][t])), _mm512_set1_ps(d * yd), acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) out[t] = 0.125f * hsum16(acc[t]);
}
INSTANTIATE(dot_iq2_xxs)

ds4_dot_fn ds4_cpu_dot_avx512(ds4_type type)
{
    switch (type) {
    case DS4_TYPE_Q8_0: return dot_q8_0;
    case DS4_TYPE_MXFP4: return dot_mxfp4;
    case DS4_TYPE_Q2_K: return dot_q2_K;
    case DS4_TYPE_Q4_K: return dot_q4_K;
    case DS4_TYPE_IQ2_XXS: return dot_iq2_xxs;
    default: return NULL;
    }
}

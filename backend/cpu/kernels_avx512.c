/*
 * kernels_avx512.c - AVX-512 (F/BW/VL/DQ + VNNI, BMI2) dot-product kernels
 * for the quantized types; the float types use the AVX2 kernels, which
 * already run at memory speed.
 *
 * Same structure as kernels_avx2.c (one always-inline body per type,
 * instantiated for 1..DS4_TILE_TOK tokens), with what AVX-512 adds:
 *  - 64 values per register: two Q8_0/MXFP4 blocks, a whole Q2_K qs array,
 *    two IQ2_XXS groups;
 *  - mask registers: a sign is a bit, so signs are applied to the
 *    activations with one masked subtract (IQ2_XXS sign bits are spread to
 *    a 64-bit mask with pdep, the 8th bit being the parity of the 7 stored);
 *  - VNNI: vpdpbusd (u8 x s8 -> int32 sums of 4) and vpdpwssd (int16
 *    products with the sub-block scales, accumulated in one instruction);
 *  - IQ2_XXS grid rows are fetched with scalar loads and inserted (on Zen 4
 *    that beats vpgatherqq).
 */
#include "backend/cpu/cpu_matmul_kernels.h"

#include <immintrin.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
#define XQ(x, t, xs) ((const int8_t *)(x) + (size_t)(t) * (xs))

INLINE float hsum16(__m512 v)
{
    return _mm512_reduce_add_ps(v);
}

INLINE float f16(uint16_t h)
{
    return _cvtsh_ss(h);
}

INLINE __m512i load2x256(const void *a, const void *b)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}

INLINE __m512 set2x8(float a, float b)
{
    return _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1);
}

INLINE __m512i set2x16_epi16(int a, int b)
{
    return _mm512_inserti64x4(_mm512_set1_epi16((short)a), _mm256_set1_epi16((short)b), 1);
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

/* ---- Q2_K -------------------------------------------------------------- */

/* The whole 64-byte qs array is one register; shift s (0..3) gives values
 * 32s..32s+31 (bytes 0-31) and 128+32s.. (bytes 32-63), i.e. the sub-blocks
 * 2s, 2s+1, 8+2s, 9+2s, one per 128-bit lane. These vpshufb controls turn
 * the scale nibbles (broadcast to every lane) into the int16 scale of each
 * lane. */
static const int8_t q2k_lane_ctrl[4][64] = {
#define Z -128
#define L(a) a, Z, a, Z, a, Z, a, Z, a, Z, a, Z, a, Z, a, Z
    {L(0), L(1), L(8), L(9)},
    {L(2), L(3), L(10), L(11)},
    {L(4), L(5), L(12), L(13)},
    {L(6), L(7), L(14), L(15)},
#undef L
#undef Z
};

INLINE void dot_q2_K_body(int64_t n, const void *w, const void *x, size_t xs, const int NT, float *out)
{
    const block_q2_K *b = w;
    const __m512i m3 = _mm512_set1_epi8(3);
    __m512 acc[DS4_TILE_TOK];
    __m256 accm[DS4_TILE_TOK];
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps(), accm[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        __m128i sc = _mm_loadu_si128((const __m128i *)b[i].scales);
        __m512i sc4 = _mm512_and_si512(_mm512_broadcast_i32x4(sc), _mm512_set1_epi8(15));
        __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(15)));
        __m512i q = _mm512_loadu_si512(b[i].qs);
        __m512i isum[DS4_TILE_TOK];
        for (int t = 0; t < NT; t++) isum[t] = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int s = 0; s < 4; s++)
        {
            __m512i v = _mm512_and_si512(_mm512_srli_epi16(q, 2 * s), m3);
            __m512i scv = _mm512_shuffle_epi8(sc4, _mm512_loadu_si512(q2k_lane_ctrl[s]));
            _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
            {
                const int8_t *y = XQ(x, t, xs) + i * QK_K + 32 * s;
                __m512i p = _mm512_maddubs_epi16(v, load2x256(y, y + 128));
                isum[t] = _mm512_dpwssd_epi32(isum[t], p, scv);
            }
        }
        float d = f16(b[i].d), dmin = f16(b[i].dmin);
        _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
        {
            const int8_t *xr = XQ(x, t, xs);
            float yd = ds4_act_d(xr, n)[i];
            __m256i bs = _mm256_loadu_si256((const __m256i *)(ds4_act_bsums(xr, n) + i * 16));
            __m256i ms = _mm256_madd_epi16(bs, mins);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_set1_ps(d * yd), acc[t]);
            accm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ms), _mm256_set1_ps(dmin * yd), accm[t]);
        }
    }
    for (int t = 0; t < NT; t++) {
        __m512 m = _mm512_castps256_ps512(accm[t]);
        m = _mm512_maskz_mov_ps(0xff, m);
        out[t] = hsum16(_mm512_sub_ps(acc[t], m));
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

/* qs bytes 64h..64h+63: low nibbles are sub-blocks 4h (bytes 0-31) and
 * 4h+2 (bytes 32-63), high nibbles sub-blocks 4h+1 and 4h+3. */
INLINE void dot_q4_K_body(int64_t n, const void *w, const void *x, size_t xs, const int NT, float *out)
{
    const block_q4_K *b = w;
    const __m512i m15 = _mm512_set1_epi8(15);
    __m512 acc[DS4_TILE_TOK];
    __m256 accm[DS4_TILE_TOK];
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps(), accm[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint8_t sc[8], m[8];
        q4_K_scales(b[i].scales, sc, m);
        __m128i m8 = _mm_loadl_epi64((const __m128i *)m);
        __m256i mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
        __m512i isum[DS4_TILE_TOK];
        for (int t = 0; t < NT; t++) isum[t] = _mm512_setzero_si512();
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
        {
            __m512i q = _mm512_loadu_si512(b[i].qs + 64 * h);
            __m512i lo = _mm512_and_si512(q, m15);
            __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m15);
            __m512i slo = set2x16_epi16(sc[4 * h], sc[4 * h + 2]);
            __m512i shi = set2x16_epi16(sc[4 * h + 1], sc[4 * h + 3]);
            _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
            {
                const int8_t *y = XQ(x, t, xs) + i * QK_K + 128 * h;
                __m512i pl = _mm512_maddubs_epi16(lo, load2x256(y, y + 64));
                __m512i ph = _mm512_maddubs_epi16(hi, load2x256(y + 32, y + 96));
                isum[t] = _mm512_dpwssd_epi32(isum[t], pl, slo);
                isum[t] = _mm512_dpwssd_epi32(isum[t], ph, shi);
            }
        }
        float d = f16(b[i].d), dmin = f16(b[i].dmin);
        _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
        {
            const int8_t *xr = XQ(x, t, xs);
            float yd = ds4_act_d(xr, n)[i];
            __m256i bs = _mm256_loadu_si256((const __m256i *)(ds4_act_bsums(xr, n) + i * 16));
            __m256i ms = _mm256_madd_epi16(bs, mins);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_set1_ps(d * yd), acc[t]);
            accm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ms), _mm256_set1_ps(dmin * yd), accm[t]);
        }
    }
    for (int t = 0; t < NT; t++) {
        __m512 m = _mm512_maskz_mov_ps(0xff, _mm512_castps256_ps512(accm[t]));
        out[t] = hsum16(_mm512_sub_ps(acc[t], m));
    }
}
INSTANTIATE(dot_q4_K)

/* ---- IQ2_XXS ----------------------------------------------------------- */

/* 64 sign bits for two groups from their two sign words: 4 x 7 stored bits
 * each, spread to 8 bytes per group with the parity as bit 7 of each byte. */
INLINE uint64_t iq2_signs64(uint32_t s0, uint32_t s1)
{
    uint64_t packed = (s0 & 0x0fffffffu) | (uint64_t)(s1 & 0x0fffffffu) << 28;
    uint64_t m = _pdep_u64(packed, 0x7f7f7f7f7f7f7f7full);
    uint64_t p = m ^ (m >> 4);
    p ^= p >> 2;
    p ^= p >> 1;
    return m | (p & 0x0101010101010101ull) << 7;
}

INLINE void dot_iq2_xxs_body(int64_t n, const void *w, const void *x, size_t xs, const int NT, float *out)
{
    const block_iq2_xxs *b = w;
    const long long *grid = (const long long *)ds4_iq2xxs_grid;
    __m512 acc[DS4_TILE_TOK];
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint32_t aux[16];
        memcpy(aux, b[i].qs, 64);
        __m512i isum[DS4_TILE_TOK];
        for (int t = 0; t < NT; t++) isum[t] = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int h = 0; h < 4; h++)
        {
            /* groups 2h, 2h+1: index words aux[4h], aux[4h+2]; sign words
             * aux[4h+1], aux[4h+3] (top 4 bits: the scale) */
            const uint8_t *ix = (const uint8_t *)(aux + 4 * h);
            __m512i gv = _mm512_set_epi64(grid[ix[11]], grid[ix[10]], grid[ix[9]], grid[ix[8]],
                                          grid[ix[3]], grid[ix[2]], grid[ix[1]], grid[ix[0]]);
            __mmask64 neg = _cvtu64_mask64(iq2_signs64(aux[4 * h + 1], aux[4 * h + 3]));
            __m512i ls = set2x16_epi16(2 * (int)(aux[4 * h + 1] >> 28) + 1, 2 * (int)(aux[4 * h + 3] >> 28) + 1);
            _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
            {
                __m512i y = _mm512_loadu_si512(XQ(x, t, xs) + i * QK_K + 64 * h);
                __m512i ys = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
                isum[t] = _mm512_dpwssd_epi32(isum[t], _mm512_maddubs_epi16(gv, ys), ls);
            }
        }
        float d = f16(b[i].d);
        _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
        {
            float yd = ds4_act_d(XQ(x, t, xs), n)[i];
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_set1_ps(d * yd), acc[t]);
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

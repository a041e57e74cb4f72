/*
 * kernels_avx2.c - AVX2/FMA/F16C dot-product kernels (built with -mavx2
 * -mfma -mf16c; only called when the CPU has them).
 *
 * Integer types use the byte-product instructions: vpmaddubsw wants one
 * unsigned operand, so signed weights (Q8_0, MXFP4) enter as |w| with the
 * sign moved onto the activation (vpsignb), while Q2_K/Q4_K/IQ2_XXS
 * magnitudes are unsigned already (IQ2_XXS signs go onto the activation
 * too). vpmaddwd with the sub-block scales then widens to int32, and each
 * block ends with one f32 FMA by the product of the block scales.
 *
 * Every kernel is written once as an always-inline body with the token
 * count a parameter, and instantiated for 1..DS4_TILE_TOK tokens so the
 * per-token accumulators stay in registers: a weight block is decoded
 * once and used for all the tokens of the tile.
 */
#include "backend/cpu/simd_avx2.h"

#include <string.h>

#define XQ(x, t, xs) ((const int8_t *)(x) + (size_t)(t) * (xs))
#define XF(x, t, xs) ((const float *)((const char *)(x) + (size_t)(t) * (xs)))

/* Instantiate body NAME##_body(n, w, x, xs, NT, out) for NT = 1..4. */
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

/* ---- float weights (f32 activations) ---------------------------------- */

INLINE __m256 load8_f32(const void *p, int64_t i) { return _mm256_loadu_ps((const float *)p + i); }
INLINE __m256 load8_f16(const void *p, int64_t i)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
}
INLINE __m256 load8_bf16(const void *p, int64_t i)
{
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/* n is a multiple of 1 only: 16-wide main loop, 8-wide, then scalar. */
#define FLOAT_DOT(NAME, LOAD8, SCALAR)                                                 \
    INLINE void NAME##_body(int64_t n, const void *w, const void *x, size_t xs,        \
                            const int NT, float *out)                                  \
    {                                                                                  \
        __m256 a0[DS4_TILE_TOK], a1[DS4_TILE_TOK];                                     \
        for (int t = 0; t < NT; t++) a0[t] = a1[t] = _mm256_setzero_ps();              \
        int64_t i = 0;                                                                 \
        for (; i + 16 <= n; i += 16) {                                                 \
            __m256 w0 = LOAD8(w, i), w1 = LOAD8(w, i + 8);                             \
            _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)                       \
            {                                                                          \
                a0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(XF(x, t, xs) + i), a0[t]); \
                a1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(XF(x, t, xs) + i + 8), a1[t]); \
            }                                                                          \
        }                                                                              \
        for (; i + 8 <= n; i += 8) {                                                   \
            __m256 w0 = LOAD8(w, i);                                                   \
            for (int t = 0; t < NT; t++)                                               \
                a0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(XF(x, t, xs) + i), a0[t]); \
        }                                                                              \
        for (int t = 0; t < NT; t++) {                                                 \
            float s = hsum8(_mm256_add_ps(a0[t], a1[t]));                              \
            for (int64_t k = i; k < n; k++) s += SCALAR(w, k) * XF(x, t, xs)[k];       \
            out[t] = s;                                                                \
        }                                                                              \
    }

#define SC_F32(w, k) (((const float *)(w))[k])
#define SC_F16(w, k) (f16(((const uint16_t *)(w))[k]))
#define SC_BF16(w, k) (ds4_k_bf16_to_f32(((const uint16_t *)(w))[k]))
FLOAT_DOT(dot_f32, load8_f32, SC_F32)
FLOAT_DOT(dot_f16, load8_f16, SC_F16)
FLOAT_DOT(dot_bf16, load8_bf16, SC_BF16)
INSTANTIATE(dot_f32)
INSTANTIATE(dot_f16)
INSTANTIATE(dot_bf16)

/* ---- Q8_0 and MXFP4 (Q8_0 activations) -------------------------------- */

/* Signed 32 weights in wv times 32 activations -> 8 int32 partial sums. */
INLINE __m256i dot32_signed(__m256i wabs, __m256i wsign, __m256i xq)
{
    __m256i p = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(xq, wsign));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

INLINE void dot_q8_0_body(int64_t n, const void *w, const void *x, size_t xs, const int NT, float *out)
{
    const block_q8_0 *b = w;
    __m256 acc[DS4_TILE_TOK];
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK8_0; i++) {
        __m256i wv = _mm256_loadu_si256((const __m256i *)b[i].qs);
        __m256i wa = _mm256_abs_epi8(wv);
        float dw = f16(b[i].d);
        _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
        {
            const int8_t *xr = XQ(x, t, xs);
            __m256i s = dot32_signed(wa, wv, _mm256_loadu_si256((const __m256i *)(xr + i * QK8_0)));
            float d = dw * ds4_act_d(xr, n)[i];
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s), acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) out[t] = hsum8(acc[t]);
}
INSTANTIATE(dot_q8_0)

INLINE void dot_mxfp4_body(int64_t n, const void *w, const void *x, size_t xs, const int NT, float *out)
{
    const block_mxfp4 *b = w;
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)ds4_kvalues_mxfp4));
    const __m256i lo4 = _mm256_set1_epi8(15);
    __m256 acc[DS4_TILE_TOK];
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_MXFP4; i++) {
        __m128i q = _mm_loadu_si128((const __m128i *)b[i].qs);
        __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), lo4);
        __m256i wv = _mm256_shuffle_epi8(table, nib);
        __m256i wa = _mm256_abs_epi8(wv);
        float dw = ds4_k_e8m0_half(b[i].e);
        _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
        {
            const int8_t *xr = XQ(x, t, xs);
            __m256i s = dot32_signed(wa, wv, _mm256_loadu_si256((const __m256i *)(xr + i * QK_MXFP4)));
            float d = dw * ds4_act_d(xr, n)[i];
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s), acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) out[t] = hsum8(acc[t]);
}
INSTANTIATE(dot_mxfp4)

/* ---- Q2_K (Q8_K activations) ------------------------------------------ */

/* vpshufb controls turning the 16 scale nibbles (bytes, both lanes) into
 * int16 scale vectors for the value pair (2p, 2p+1) of sub-blocks: the low
 * lane repeats scale 2p, the high lane scale 2p+1 ... for p = 0..7. */
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
        __m256i isum[DS4_TILE_TOK];
        for (int t = 0; t < NT; t++) isum[t] = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(b[i].qs + 32 * h));
            for (int s = 0; s < 4; s++) {
                __m256i v = _mm256_and_si256(_mm256_srli_epi16(q, 2 * s), m3);
                __m256i scv = _mm256_shuffle_epi8(sc4, _mm256_loadu_si256((const __m256i *)q2k_pair_ctrl[4 * h + s]));
                _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
                {
                    const int8_t *y = XQ(x, t, xs) + i * QK_K + 128 * h + 32 * s;
                    __m256i p = _mm256_maddubs_epi16(v, _mm256_loadu_si256((const __m256i *)y));
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p, scv));
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
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * yd), _mm256_cvtepi32_ps(isum[t]), acc[t]);
            accm[t] = _mm256_fmadd_ps(_mm256_set1_ps(dmin * yd), _mm256_cvtepi32_ps(ms), accm[t]);
        }
    }
    for (int t = 0; t < NT; t++) out[t] = hsum8(_mm256_sub_ps(acc[t], accm[t]));
}
INSTANTIATE(dot_q2_K)

/* ---- Q4_K (Q8_K activations) ------------------------------------------ */

/* The 8 six-bit scales and mins of a Q4_K block, as bytes. */
INLINE void q4_K_scales(const uint8_t *s, uint8_t sc[8], uint8_t m[8])
{
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        m[j] = s[j + 4] & 63;
        sc[j + 4] = (uint8_t)((s[j + 8] & 15) | ((s[j] >> 6) << 4));
        m[j + 4] = (uint8_t)((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
    }
}

INLINE void dot_q4_K_body(int64_t n, const void *w, const void *x, size_t xs, const int NT, float *out)
{
    const block_q4_K *b = w;
    const __m256i m15 = _mm256_set1_epi8(15);
    __m256 acc[DS4_TILE_TOK], accm[DS4_TILE_TOK];
    for (int t = 0; t < NT; t++) acc[t] = accm[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        _mm_prefetch((const char *)(b + i) + 2048, _MM_HINT_T0);
        _mm_prefetch((const char *)(b + i) + 2048 + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)(b + i) + 2048 + 128, _MM_HINT_T0);
        uint8_t sc[8], m[8];
        q4_K_scales(b[i].scales, sc, m);
        /* mins per 16-value bsum: m0 m0 m1 m1 ... */
        __m128i m8 = _mm_loadl_epi64((const __m128i *)m);
        __m256i mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
        __m256i isum[DS4_TILE_TOK];
        for (int t = 0; t < NT; t++) isum[t] = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(b[i].qs + 32 * j));
            __m256i lo = _mm256_and_si256(q, m15);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m15);
            __m256i slo = _mm256_set1_epi16(sc[2 * j]), shi = _mm256_set1_epi16(sc[2 * j + 1]);
            _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
            {
                const int8_t *y = XQ(x, t, xs) + i * QK_K + 64 * j;
                __m256i pl = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)y));
                __m256i ph = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(y + 32)));
                __m256i s = _mm256_add_epi32(_mm256_madd_epi16(pl, slo), _mm256_madd_epi16(ph, shi));
                isum[t] = _mm256_add_epi32(isum[t], s);
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
    for (int t = 0; t < NT; t++) out[t] = hsum8(_mm256_sub_ps(acc[t], accm[t]));
}
INSTANTIATE(dot_q4_K)

/* ---- IQ2_XXS (Q8_K activations) --------------------------------------- */

INLINE void dot_iq2_xxs_body(int64_t n, const void *w, const void *x, size_t xs, const int NT, float *out)
{
    const block_iq2_xxs *b = w;
    __m256 acc[DS4_TILE_TOK];
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; i++) {
        uint32_t signs[8];
        _mm256_storeu_si256((__m256i *)signs, iq2_sign_words((const uint8_t *)b[i].qs));
        __m256i isum[DS4_TILE_TOK];
        for (int t = 0; t < NT; t++) isum[t] = _mm256_setzero_si256();
        for (int g = 0; g < 8; g++) {
            uint32_t aux[2];
            memcpy(aux, b[i].qs + 4 * g, 8);
            const uint8_t *idx = (const uint8_t *)&aux[0];
            __m256i grid = _mm256_set_epi64x((long long)ds4_iq2xxs_grid[idx[3]], (long long)ds4_iq2xxs_grid[idx[2]],
                                             (long long)ds4_iq2xxs_grid[idx[1]], (long long)ds4_iq2xxs_grid[idx[0]]);
            __m256i sv = iq2_sign_vector(signs[g]);
            __m256i ls = _mm256_set1_epi16((short)(2 * (aux[1] >> 28) + 1));
            _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
            {
                const int8_t *y = XQ(x, t, xs) + i * QK_K + 32 * g;
                __m256i ys = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)y), sv);
                __m256i p = _mm256_maddubs_epi16(grid, ys);
                isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p, ls));
            }
        }
        float d = f16(b[i].d);
        _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
        {
            float yd = ds4_act_d(XQ(x, t, xs), n)[i];
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * yd), _mm256_cvtepi32_ps(isum[t]), acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) out[t] = 0.125f * hsum8(acc[t]);
}
INSTANTIATE(dot_iq2_xxs)

ds4_dot_fn ds4_cpu_dot_avx2(ds4_type type)
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

/*
 * act_avx512.c - the activation quantizers of cpu_matmul_act.c (Q8_0 and
 * Q8_K, ggml's numbers) with AVX-512: the same operations on 16 values at a
 * time, so the bytes are identical to the scalar ones for every input
 * (tests/test_matmul.c compares them, NaN, inf, ties and subnormals
 * included). With the prefill GEMM the scalar conversion had become as
 * slow as the products themselves.
 */
#include "backend/cpu/simd_avx512.h"

/* roundf() of v for |v| < 128 (trunc, then +-1 when the remainder is at
 * least one half), else 127 / -127 / 0 (NaN): round_away() in
 * cpu_matmul_act.c. */
INLINE __m512i round_away(__m512 v)
{
    __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_sub_ps(v, t);
    __m512i q = _mm512_cvttps_epi32(t);
    const __m512i one = _mm512_set1_epi32(1);
    q = _mm512_mask_add_epi32(q, _mm512_cmp_ps_mask(r, _mm512_set1_ps(0.5f), _CMP_GE_OQ), q, one);
    q = _mm512_mask_sub_epi32(q, _mm512_cmp_ps_mask(r, _mm512_set1_ps(-0.5f), _CMP_LE_OQ), q, one);
    __mmask16 in = _mm512_cmp_ps_mask(v, _mm512_set1_ps(-128.0f), _CMP_GT_OQ) &
                   _mm512_cmp_ps_mask(v, _mm512_set1_ps(128.0f), _CMP_LT_OQ);
    __m512i out = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ), _mm512_set1_epi32(127));
    out = _mm512_mask_mov_epi32(out, _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ), _mm512_set1_epi32(-127));
    return _mm512_mask_mov_epi32(out, in, q);
}

/* max(|v|, m) lane by lane, a NaN v leaving m (as `a > amax ? a : amax`). */
INLINE __m512 max_abs(__m512 v, __m512 m)
{
    return _mm512_max_ps(_mm512_abs_ps(v), m);
}

static void quantize_q8_0(const float *x, int64_t n, int64_t v0, int64_t v1, void *out)
{
    int8_t *qs = (int8_t *)out;
    float *ds = (float *)(qs + n);
    for (int64_t b = v0 / QK8_0; b < v1 / QK8_0; b++) {
        __m512 x0 = _mm512_loadu_ps(x + 32 * b), x1 = _mm512_loadu_ps(x + 32 * b + 16);
        float amax = _mm512_reduce_max_ps(max_abs(x1, max_abs(x0, _mm512_setzero_ps())));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        __m512 vid = _mm512_set1_ps(id);
        _mm_storeu_si128((__m128i *)(qs + 32 * b), _mm512_cvtepi32_epi8(round_away(_mm512_mul_ps(x0, vid))));
        _mm_storeu_si128((__m128i *)(qs + 32 * b + 16), _mm512_cvtepi32_epi8(round_away(_mm512_mul_ps(x1, vid))));
        /* the f16-rounded scale (round to nearest even, as round_to_f16) */
        ds[b] = _cvtsh_ss(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
    }
}

static void quantize_q8_K(const float *x, int64_t n, int64_t v0, int64_t v1, void *out)
{
    int8_t *qs = (int8_t *)out;
    float *ds = (float *)(qs + n);
    int16_t *bsums = (int16_t *)(ds + n / QK_K);
    for (int64_t b = v0 / QK_K; b < v1 / QK_K; b++) {
        const float *xb = x + b * QK_K;
        __m512 m = _mm512_setzero_ps();
        for (int k = 0; k < 16; k++) m = max_abs(_mm512_loadu_ps(xb + 16 * k), m);
        float amax = _mm512_reduce_max_ps(m);
        if (amax == 0.0f) {
            ds[b] = 0;
            _mm512_storeu_si512(qs + b * QK_K, _mm512_setzero_si512());
            _mm512_storeu_si512(qs + b * QK_K + 64, _mm512_setzero_si512());
            _mm512_storeu_si512(qs + b * QK_K + 128, _mm512_setzero_si512());
            _mm512_storeu_si512(qs + b * QK_K + 192, _mm512_setzero_si512());
            _mm256_storeu_si256((__m256i *)(bsums + b * 16), _mm256_setzero_si256());
            continue;
        }
        /* the first value of the largest magnitude, as the scalar loop's
         * strict `>` keeps it */
        float max = 0;
        for (int k = 0; k < 16; k++) {
            __mmask16 eq = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(xb + 16 * k)), _mm512_set1_ps(amax), _CMP_EQ_OQ);
            if (eq) {
                max = xb[16 * k + __builtin_ctz(eq)];
                break;
            }
        }
        float iscale = -127.0f / max;
        __m512 vs = _mm512_set1_ps(iscale);
        for (int k = 0; k < 16; k++) {
            /* nearest_even(): the integer in the low mantissa bits of
             * v + 1.5 * 2^23, then at most 127 */
            __m512 v = _mm512_add_ps(_mm512_mul_ps(vs, _mm512_loadu_ps(xb + 16 * k)), _mm512_set1_ps(12582912.0f));
            __m512i q = _mm512_sub_epi32(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x007fffff)),
                                         _mm512_set1_epi32(0x00400000));
            __m128i q8 = _mm512_cvtepi32_epi8(_mm512_min_epi32(q, _mm512_set1_epi32(127)));
            _mm_storeu_si128((__m128i *)(qs + b * QK_K + 16 * k), q8);
            bsums[b * 16 + k] = (int16_t)_mm512_reduce_add_epi32(_mm512_cvtepi8_epi32(q8));
        }
        ds[b] = 1.0f / iscale;
    }
}

void ds4_act_quantize_avx512(ds4_act_kind kind, const float *x, int64_t n, int64_t v0, int64_t v1, void *out)
{
    switch (kind) {
    case DS4_ACT_Q8_0: quantize_q8_0(x, n, v0, v1, out); break;
    case DS4_ACT_Q8_K: quantize_q8_K(x, n, v0, v1, out); break;
    default: ds4_act_quantize_part(kind, x, n, v0, v1, out); break;
    }
}

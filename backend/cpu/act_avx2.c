/*
 * act_avx2.c - the activation quantizers of cpu_matmul_act.c (Q8_0 and
 * Q8_K, ggml's numbers) with AVX2: the operations of the scalar code on 8
 * values at a time, bytes identical for every input (tests/test_matmul.c).
 */
#include "backend/cpu/simd_avx2.h"

INLINE __m256 abs8(__m256 v)
{
    return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
}

/* max(|v|, m) lane by lane, a NaN v leaving m (vmaxps returns its second
 * operand when either is NaN). */
INLINE __m256 max_abs(__m256 v, __m256 m)
{
    return _mm256_max_ps(abs8(v), m);
}

INLINE float hmax8(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* The low byte of each int32 lane (a C cast to int8_t), as 8 bytes. */
INLINE void store8_low_bytes(int8_t *dst, __m256i q)
{
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    __m256i b = _mm256_shuffle_epi8(q, pick);
    __m128i lo = _mm256_castsi256_si128(b), hi = _mm256_extracti128_si256(b, 1);
    _mm_storel_epi64((__m128i *)dst, _mm_unpacklo_epi32(lo, hi));
}

/* roundf() of v for |v| < 128, else 127 / -127 / 0 (NaN): round_away() in
 * cpu_matmul_act.c. */
INLINE __m256i round_away(__m256 v)
{
    __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_sub_ps(v, t);
    __m256i q = _mm256_cvttps_epi32(t);
    /* comparison masks are -1 where true: subtract to add one */
    q = _mm256_sub_epi32(q, _mm256_castps_si256(_mm256_cmp_ps(r, _mm256_set1_ps(0.5f), _CMP_GE_OQ)));
    q = _mm256_add_epi32(q, _mm256_castps_si256(_mm256_cmp_ps(r, _mm256_set1_ps(-0.5f), _CMP_LE_OQ)));
    __m256 in = _mm256_and_ps(_mm256_cmp_ps(v, _mm256_set1_ps(-128.0f), _CMP_GT_OQ),
                              _mm256_cmp_ps(v, _mm256_set1_ps(128.0f), _CMP_LT_OQ));
    __m256i out = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GT_OQ)),
                                   _mm256_set1_epi32(127));
    out = _mm256_blendv_epi8(out, _mm256_set1_epi32(-127),
                             _mm256_castps_si256(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ)));
    return _mm256_blendv_epi8(out, q, _mm256_castps_si256(in));
}

static void quantize_q8_0(const float *x, int64_t n, int64_t v0, int64_t v1, void *out)
{
    int8_t *qs = (int8_t *)out;
    float *ds = (float *)(qs + n);
    for (int64_t b = v0 / QK8_0; b < v1 / QK8_0; b++) {
        const float *xb = x + 32 * b;
        __m256 m = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) m = max_abs(_mm256_loadu_ps(xb + 8 * k), m);
        float amax = hmax8(m);
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int k = 0; k < 4; k++)
            store8_low_bytes(qs + 32 * b + 8 * k, round_away(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * k), _mm256_set1_ps(id))));
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
        __m256 m = _mm256_setzero_ps();
        for (int k = 0; k < 32; k++) m = max_abs(_mm256_loadu_ps(xb + 8 * k), m);
        float amax = hmax8(m);
        if (amax == 0.0f) {
            ds[b] = 0;
            for (int k = 0; k < 8; k++) _mm256_storeu_si256((__m256i *)(qs + b * QK_K + 32 * k), _mm256_setzero_si256());
            _mm256_storeu_si256((__m256i *)(bsums + b * 16), _mm256_setzero_si256());
            continue;
        }
        /* the first value of the largest magnitude (the scalar `>`) */
        float max = 0;
        for (int k = 0; k < 32; k++) {
            int eq = _mm256_movemask_ps(_mm256_cmp_ps(abs8(_mm256_loadu_ps(xb + 8 * k)), _mm256_set1_ps(amax), _CMP_EQ_OQ));
            if (eq) {
                max = xb[8 * k + __builtin_ctz((unsigned)eq)];
                break;
            }
        }
        float iscale = -127.0f / max;
        __m256 vs = _mm256_set1_ps(iscale);
        for (int g = 0; g < 16; g++) {
            __m256i sum = _mm256_setzero_si256();
            for (int h = 0; h < 2; h++) {
                int k = 2 * g + h;
                /* nearest_even(): the integer in the low mantissa bits of
                 * v + 1.5 * 2^23, then at most 127 */
                __m256 v = _mm256_add_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(xb + 8 * k)), _mm256_set1_ps(12582912.0f));
                __m256i q = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x007fffff)),
                                             _mm256_set1_epi32(0x00400000));
                q = _mm256_min_epi32(q, _mm256_set1_epi32(127));
                store8_low_bytes(qs + b * QK_K + 8 * k, q);
                /* the sum is of the stored int8 values */
                sum = _mm256_add_epi32(sum, _mm256_srai_epi32(_mm256_slli_epi32(q, 24), 24));
            }
            __m128i s = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
            s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
            s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
            bsums[b * 16 + g] = (int16_t)_mm_cvtsi128_si32(s);
        }
        ds[b] = 1.0f / iscale;
    }
}

void ds4_act_quantize_avx2(ds4_act_kind kind, const float *x, int64_t n, int64_t v0, int64_t v1, void *out)
{
    switch (kind) {
    case DS4_ACT_Q8_0: quantize_q8_0(x, n, v0, v1, out); break;
    case DS4_ACT_Q8_K: quantize_q8_K(x, n, v0, v1, out); break;
    default: ds4_act_quantize_part(kind, x, n, v0, v1, out); break;
    }
}

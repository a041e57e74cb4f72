/*
 * simd_avx2.h - inline helpers shared by the AVX2 kernel files
 * (kernels_avx2.c: per-row dot products, gemm_avx2.c: prefill GEMM).
 * Include only from files compiled with the AVX2 flags (*_avx2.c).
 */
#ifndef DS4_BACKEND_CPU_SIMD_AVX2_H
#define DS4_BACKEND_CPU_SIMD_AVX2_H

#include <immintrin.h>

#include "backend/cpu/cpu_matmul_kernels.h"

#define INLINE static inline __attribute__((always_inline))
/* Full unrolling of the small loops over rows, tokens and steps, so that
 * arrays of vectors indexed by them stay in registers (gcc -O2 does not
 * unroll them by itself). */
#define DS4_PRAGMA(x) _Pragma(#x)
#define UNROLL DS4_PRAGMA(GCC unroll 16)

INLINE float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INLINE float f16(uint16_t h)
{
    return _cvtsh_ss(h);
}

/* 32 sign bytes (one per value) from the 4 sign-byte codes in `s`
 * (byte l covers values 8l..8l+7): 0xFF where negative, else 0x01. */
INLINE __m256i iq2_sign_vector(uint32_t s)
{
    const __m256i spread = _mm256_set_epi64x(0x0303030303030303ll, 0x0202020202020202ll,
                                             0x0101010101010101ll, 0x0000000000000000ll);
    const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)s), spread);
    __m256i neg = _mm256_cmpeq_epi8(_mm256_and_si256(v, bits), bits);
    return _mm256_or_si256(neg, _mm256_set1_epi8(1));
}

/* The sign bytes of the 8 groups of an IQ2_XXS block (4 per group, as one
 * uint32 each), from the 7-bit fields of the sign words (odd dwords of
 * qs): each field goes to its own byte and bit 7 gets the field's parity. */
INLINE __m256i iq2_sign_words(const uint8_t *qs)
{
    const __m256i odd = _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7);
    __m256i a = _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)qs), odd);
    __m256i b = _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)(qs + 32)), odd);
    __m256i s = _mm256_blend_epi32(a, b, 0xf0);
    __m256i m = _mm256_and_si256(s, _mm256_set1_epi32(0x7f));
    m = _mm256_or_si256(m, _mm256_and_si256(_mm256_slli_epi32(s, 1), _mm256_set1_epi32(0x7f00)));
    m = _mm256_or_si256(m, _mm256_and_si256(_mm256_slli_epi32(s, 2), _mm256_set1_epi32(0x7f0000)));
    m = _mm256_or_si256(m, _mm256_and_si256(_mm256_slli_epi32(s, 3), _mm256_set1_epi32(0x7f000000)));
    __m256i p = _mm256_xor_si256(m, _mm256_srli_epi32(m, 4));
    p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 2));
    p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 1));
    return _mm256_or_si256(m, _mm256_and_si256(_mm256_slli_epi32(p, 7), _mm256_set1_epi32((int)0x80808080)));
}

#endif

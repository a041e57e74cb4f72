/*
 * simd_avx512.h - inline helpers shared by the AVX-512 kernel files
 * (kernels_avx512.c: per-row dot products, gemm_avx512.c: prefill GEMM).
 * Include only from files compiled with the AVX-512 flags (*_avx512.c).
 */
#ifndef DS4_BACKEND_CPU_SIMD_AVX512_H
#define DS4_BACKEND_CPU_SIMD_AVX512_H

#include <immintrin.h>

#include "backend/cpu/cpu_matmul_kernels.h"

#define INLINE static inline __attribute__((always_inline))
/* Full unrolling of the small loops over rows, tokens and steps, so that
 * arrays of vectors indexed by them stay in registers (gcc -O2 does not
 * unroll them by itself). */
#define DS4_PRAGMA(x) _Pragma(#x)
#define UNROLL DS4_PRAGMA(GCC unroll 16)

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

/* The 256 sign bits of an IQ2_XXS block, as four 64-bit masks (qword h:
 * groups 2h and 2h+1), from its eight sign words (the odd dwords of qs, in
 * q), all at once: each 7-bit field goes to its own byte, bit 7 gets the
 * field's parity. */
INLINE __m256i iq2_signs_block(__m512i q)
{
    const __m512i odd = _mm512_set_epi32(15, 13, 11, 9, 7, 5, 3, 1, 15, 13, 11, 9, 7, 5, 3, 1);
    __m256i s = _mm512_castsi512_si256(_mm512_permutexvar_epi32(odd, q));
    __m256i b = _mm256_and_si256(s, _mm256_set1_epi32(0x7f));
    b = _mm256_ternarylogic_epi32(b, _mm256_slli_epi32(s, 1), _mm256_set1_epi32(0x7f00), 0xf8);
    b = _mm256_ternarylogic_epi32(b, _mm256_slli_epi32(s, 2), _mm256_set1_epi32(0x7f0000), 0xf8);
    b = _mm256_ternarylogic_epi32(b, _mm256_slli_epi32(s, 3), _mm256_set1_epi32(0x7f000000), 0xf8);
    __m256i p = _mm256_xor_si256(b, _mm256_srli_epi32(b, 4));
    p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 2));
    p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 1));
    return _mm256_ternarylogic_epi32(b, _mm256_slli_epi32(p, 7), _mm256_set1_epi32((int)0x80808080), 0xf8);
}

#endif

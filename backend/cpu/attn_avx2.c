/*
 * attn_avx2.c - attn_simd.h's loops with AVX2: the 16 partial sums are
 * two registers, lanes 0-7 and 8-15.
 */
#include "backend/cpu/attn_simd.h"

#include <immintrin.h>

float ds4_attn_dot_avx2(const float *a, const float *b, int n)
{
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        lo = _mm256_add_ps(lo, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
        hi = _mm256_add_ps(hi, _mm256_mul_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8)));
    }
    float l[16], s = 0;
    _mm256_storeu_ps(l, lo);
    _mm256_storeu_ps(l + 8, hi);
    for (int k = 0; k < 16; k++) s += l[k];
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

void ds4_attn_axpy_avx2(float *o, float w, const float *x, int n)
{
    __m256 vw = _mm256_set1_ps(w);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(o + i, _mm256_add_ps(_mm256_loadu_ps(o + i), _mm256_mul_ps(vw, _mm256_loadu_ps(x + i))));
    for (; i < n; i++) o[i] += w * x[i];
}

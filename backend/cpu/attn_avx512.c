/*
 * attn_avx512.c - attn_simd.h's loops with AVX-512: the 16 partial sums
 * are the 16 lanes of one register.
 */
#include "backend/cpu/attn_simd.h"

#include <immintrin.h>

float ds4_attn_dot_avx512(const float *a, const float *b, int n)
{
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
    float l[16], s = 0;
    _mm512_storeu_ps(l, acc);
    for (int k = 0; k < 16; k++) s += l[k];
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

void ds4_attn_axpy_avx512(float *o, float w, const float *x, int n)
{
    __m512 vw = _mm512_set1_ps(w);
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(o + i, _mm512_add_ps(_mm512_loadu_ps(o + i), _mm512_mul_ps(vw, _mm512_loadu_ps(x + i))));
    for (; i < n; i++) o[i] += w * x[i];
}

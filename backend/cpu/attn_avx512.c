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

/* Lane h = head h. acc[l] holds partial sum l (elements i = l mod 16 of
 * the whole 16-blocks) of all 16 heads; adding acc[0..15] in order into a
 * zero register is the definition's lane-order sum, for every head at
 * once. Multiply then add, as the single dot does. */
void ds4_attn_dots_avx512(const float *qt, int nh, const float *k, int n, float *out)
{
    __m512 acc[16];
    for (int l = 0; l < 16; l++) acc[l] = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++)
            acc[l] = _mm512_add_ps(acc[l], _mm512_mul_ps(_mm512_loadu_ps(qt + (size_t)(i + l) * 16), _mm512_set1_ps(k[i + l])));
    __m512 s = _mm512_setzero_ps();
    for (int l = 0; l < 16; l++) s = _mm512_add_ps(s, acc[l]);
    for (; i < n; i++) s = _mm512_add_ps(s, _mm512_mul_ps(_mm512_loadu_ps(qt + (size_t)i * 16), _mm512_set1_ps(k[i])));
    float tmp[16];
    _mm512_storeu_ps(tmp, s);
    for (int h = 0; h < nh; h++) out[h] = tmp[h];
}

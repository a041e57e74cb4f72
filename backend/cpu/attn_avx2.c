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

/* attn_avx512.c's scheme with 8 heads a register: heads 0-7 then 8-15.
 * Sixteen partial sums of 8 heads would take every ymm register, so the
 * partials go in two passes of 8 (l = 0-7, then 8-15) into a small array,
 * then are added in lane order. */
void ds4_attn_dots_avx2(const float *qt, int nh, const float *k, int n, float *out)
{
    const int full = n / 16 * 16;
    for (int g = 0; g < nh; g += 8) {
        __m256 part[16];
        for (int half = 0; half < 16; half += 8) {
            __m256 acc[8];
            for (int l = 0; l < 8; l++) acc[l] = _mm256_setzero_ps();
            for (int i = 0; i < full; i += 16)
                for (int l = 0; l < 8; l++)
                    acc[l] = _mm256_add_ps(acc[l], _mm256_mul_ps(_mm256_loadu_ps(qt + (size_t)(i + half + l) * 16 + g),
                                                                 _mm256_set1_ps(k[i + half + l])));
            for (int l = 0; l < 8; l++) part[half + l] = acc[l];
        }
        __m256 s = _mm256_setzero_ps();
        for (int l = 0; l < 16; l++) s = _mm256_add_ps(s, part[l]);
        for (int i = full; i < n; i++)
            s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_loadu_ps(qt + (size_t)i * 16 + g), _mm256_set1_ps(k[i])));
        float tmp[8];
        _mm256_storeu_ps(tmp, s);
        for (int h = g; h < nh && h < g + 8; h++) out[h] = tmp[h - g];
    }
}

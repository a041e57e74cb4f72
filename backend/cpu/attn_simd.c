/*
 * attn_simd.c - the portable forms of attn_simd.h's loops (the reference
 * the SIMD ones reproduce bit for bit) and the pick for this CPU.
 */
#include "backend/cpu/attn_simd.h"

#include "backend/cpu/cpu_matmul_kernels.h"

/* 16 independent partial sums: a single running sum could not be
 * vectorized without changing the result. */
float ds4_attn_dot_scalar(const float *a, const float *b, int n)
{
    float acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++) acc[k] += a[i + k] * b[i + k];
    float s = 0;
    for (int k = 0; k < 16; k++) s += acc[k];
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

void ds4_attn_axpy_scalar(float *o, float w, const float *x, int n)
{
    for (int i = 0; i < n; i++) o[i] += w * x[i];
}

void ds4_attn_transpose(const float *q, size_t q_stride, int nh, int n, float *qt)
{
    for (int i = 0; i < n; i++)
        for (int h = 0; h < DS4_ATTN_HEADS; h++) qt[(size_t)i * DS4_ATTN_HEADS + h] = h < nh ? q[(size_t)h * q_stride + i] : 0;
}

/* The definition per head, read from the transposed layout. */
void ds4_attn_dots_scalar(const float *qt, int nh, const float *k, int n, float *out)
{
    for (int h = 0; h < nh; h++) {
        float acc[16] = {0};
        int i = 0;
        for (; i + 16 <= n; i += 16)
            for (int l = 0; l < 16; l++) acc[l] += qt[(size_t)(i + l) * DS4_ATTN_HEADS + h] * k[i + l];
        float s = 0;
        for (int l = 0; l < 16; l++) s += acc[l];
        for (; i < n; i++) s += qt[(size_t)i * DS4_ATTN_HEADS + h] * k[i];
        out[h] = s;
    }
}

ds4_attn_dot_fn ds4_attn_dot_best(void)
{
    ds4_simd_level l = ds4_cpu_simd_best();
    return l >= DS4_SIMD_AVX512 ? ds4_attn_dot_avx512 : l >= DS4_SIMD_AVX2 ? ds4_attn_dot_avx2 : ds4_attn_dot_scalar;
}

ds4_attn_axpy_fn ds4_attn_axpy_best(void)
{
    ds4_simd_level l = ds4_cpu_simd_best();
    return l >= DS4_SIMD_AVX512 ? ds4_attn_axpy_avx512 : l >= DS4_SIMD_AVX2 ? ds4_attn_axpy_avx2 : ds4_attn_axpy_scalar;
}

ds4_attn_dots_fn ds4_attn_dots_best(void)
{
    ds4_simd_level l = ds4_cpu_simd_best();
    return l >= DS4_SIMD_AVX512 ? ds4_attn_dots_avx512 : l >= DS4_SIMD_AVX2 ? ds4_attn_dots_avx2 : ds4_attn_dots_scalar;
}

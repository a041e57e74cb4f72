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

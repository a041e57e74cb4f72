/*
 * attn_simd.h - the two inner loops of the CPU attention and indexer
 * (ops_cpu_attention.c) in AVX2 / AVX-512: the score dot product and the
 * weighted sum of value rows. Bit-identical to the portable loops there:
 * the dot keeps the same 16 partial sums (lane k sums the products of the
 * elements i = k mod 16, a multiply then an add, never an FMA) and adds
 * them in the same order; the weighted sum is elementwise. So results do
 * not depend on the CPU the code runs on (tests/test_attn_simd.c).
 */
#ifndef DS4_BACKEND_CPU_ATTN_SIMD_H
#define DS4_BACKEND_CPU_ATTN_SIMD_H

typedef float (*ds4_attn_dot_fn)(const float *a, const float *b, int n);
typedef void (*ds4_attn_axpy_fn)(float *o, float w, const float *x, int n);

float ds4_attn_dot_scalar(const float *a, const float *b, int n);
void ds4_attn_axpy_scalar(float *o, float w, const float *x, int n);
float ds4_attn_dot_avx2(const float *a, const float *b, int n);
void ds4_attn_axpy_avx2(float *o, float w, const float *x, int n);
float ds4_attn_dot_avx512(const float *a, const float *b, int n);
void ds4_attn_axpy_avx512(float *o, float w, const float *x, int n);

/* The best for this CPU (ds4_cpu_simd_best, so DS4_SIMD caps it too). */
ds4_attn_dot_fn ds4_attn_dot_best(void);
ds4_attn_axpy_fn ds4_attn_axpy_best(void);

#endif

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

#include <stddef.h>

typedef float (*ds4_attn_dot_fn)(const float *a, const float *b, int n);
typedef void (*ds4_attn_axpy_fn)(float *o, float w, const float *x, int n);

/* Several heads against one key row (attention and the indexer share one
 * key row across all heads): out[h] = dot(head h, k, n) for h < nh <=
 * DS4_ATTN_HEADS, with the bits of ds4_attn_dot_*. The heads come
 * transposed: qt[i * DS4_ATTN_HEADS + h] is element i of head h (see
 * ds4_attn_transpose), so one load gives element i of every head and
 * partial sum k of all heads is one register: the 16 partial sums are
 * added in lane order across heads at once, with no horizontal reduction
 * per dot. Columns h >= nh of qt are read but not used. */
#define DS4_ATTN_HEADS 16
typedef void (*ds4_attn_dots_fn)(const float *qt, int nh, const float *k, int n, float *out);

/* qt[i * DS4_ATTN_HEADS + h] = q[h * q_stride + i] for h < nh, i < n; 0
 * for h >= nh. */
void ds4_attn_transpose(const float *q, size_t q_stride, int nh, int n, float *qt);

float ds4_attn_dot_scalar(const float *a, const float *b, int n);
void ds4_attn_axpy_scalar(float *o, float w, const float *x, int n);
float ds4_attn_dot_avx2(const float *a, const float *b, int n);
void ds4_attn_axpy_avx2(float *o, float w, const float *x, int n);
float ds4_attn_dot_avx512(const float *a, const float *b, int n);
void ds4_attn_axpy_avx512(float *o, float w, const float *x, int n);
void ds4_attn_dots_scalar(const float *qt, int nh, const float *k, int n, float *out);
void ds4_attn_dots_avx2(const float *qt, int nh, const float *k, int n, float *out);
void ds4_attn_dots_avx512(const float *qt, int nh, const float *k, int n, float *out);

/* The best for this CPU (ds4_cpu_simd_best, so DS4_SIMD caps it too). */
ds4_attn_dot_fn ds4_attn_dot_best(void);
ds4_attn_axpy_fn ds4_attn_axpy_best(void);
ds4_attn_dots_fn ds4_attn_dots_best(void);

#endif

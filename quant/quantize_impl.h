/*
 * quantize_impl.h - per-type row quantizers behind ds4_quantize_rows().
 *
 * Each takes one row of n values (n a multiple of the block size, already
 * checked, all finite) and the optional importance weights of its columns
 * (n values or NULL), and writes n / block_elems blocks. No allocation,
 * no shared mutable state: safe to call from many threads at once.
 */
#ifndef DS4_QUANT_QUANTIZE_IMPL_H
#define DS4_QUANT_QUANTIZE_IMPL_H

#include <stdint.h>

void ds4_quantize_row_q8_0(const float *x, void *dst, int64_t n, const float *imatrix);
void ds4_quantize_row_q8_K(const float *x, void *dst, int64_t n, const float *imatrix);
void ds4_quantize_row_mxfp4(const float *x, void *dst, int64_t n, const float *imatrix);
void ds4_quantize_row_q4_K(const float *x, void *dst, int64_t n, const float *imatrix);
void ds4_quantize_row_q2_K(const float *x, void *dst, int64_t n, const float *imatrix);
void ds4_quantize_row_iq2_xxs(const float *x, void *dst, int64_t n, const float *imatrix);

/* Round to nearest integer, ties to even (the FPU default), for |v| < 2^22. */
static inline int ds4_nearest_int(float v)
{
    union { float f; int32_t i; } u;
    u.f = v + 12582912.f; /* 1.5 * 2^23 */
    return (u.i & 0x007fffff) - 0x00400000;
}

/* Weights of one block for the error sum w * (x - deq)^2: the importance
 * values scaled to mean 1 (the argmin does not depend on the scale, and
 * the sums stay in a safe float range) plus a 1e-6 floor so that columns
 * of zero importance still get a sensible fit. All ones without an
 * imatrix or when the block's importance is all zero. */
static inline void ds4_importance_weights(const float *imw, float *w, int n)
{
    double sum = 0;
    if (imw)
        for (int i = 0; i < n; i++) sum += imw[i];
    if (!(sum > 0) || !(sum < 1e300)) {
        for (int i = 0; i < n; i++) w[i] = 1.f;
        return;
    }
    const double inv_mean = n / sum;
    for (int i = 0; i < n; i++) w[i] = (float)(imw[i] * inv_mean) + 1e-6f;
}

#endif

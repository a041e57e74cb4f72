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

#endif

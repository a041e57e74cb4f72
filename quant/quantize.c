/*
 * quantize.c - ds4_quantize_rows(): argument checks and dispatch to the
 * per-type row quantizers (quantize_*.c).
 *
 * Inputs are checked once here (type, sizes, imatrix presence, finite
 * values for the block types) so that the row quantizers can stay simple
 * loops. f32/f16/bf16 keep NaN and Inf as they are (exact conversions).
 */
#include "quant/quant.h"

#include <math.h>
#include <string.h>

#include "quant/half.h"
#include "quant/quantize_impl.h"
#include "util/error.h"

typedef void (*row_fn)(const float *, void *, int64_t, const float *);

static row_fn block_quantizer(ds4_type type)
{
    switch (type) {
    case DS4_TYPE_Q8_0: return ds4_quantize_row_q8_0;
    case DS4_TYPE_Q8_K: return ds4_quantize_row_q8_K;
    case DS4_TYPE_MXFP4: return ds4_quantize_row_mxfp4;
    case DS4_TYPE_Q4_K: return ds4_quantize_row_q4_K;
    case DS4_TYPE_Q2_K: return ds4_quantize_row_q2_K;
    case DS4_TYPE_IQ2_XXS: return ds4_quantize_row_iq2_xxs;
    default: return NULL;
    }
}

/* Largest |x| a block type can hold: its f16 super-scale at 65504 times
 * the largest integer factors of the format. Beyond it the scale would
 * overflow to Inf (and dequantize to NaN), so such input is refused. */
static double max_magnitude(ds4_type type)
{
    switch (type) {
    case DS4_TYPE_Q8_0: return 65504.0 * 127;
    case DS4_TYPE_Q2_K: return 65504.0 * 15 * 3;
    case DS4_TYPE_Q4_K: return 65504.0 * 63 * 15;
    case DS4_TYPE_IQ2_XXS: return 65504.0 * 15.5 * 0.25 * 43;
    case DS4_TYPE_MXFP4: return 0x1p126 * 6; /* largest exponent the quantizer picks */
    default: return 3.4e38;
    }
}

ds4_status ds4_quantize_rows(ds4_type type, const float *src, void *dst,
                             int64_t nrows, int64_t n_per_row,
                             const float *imatrix)
{
    int64_t rb;
    ds4_status st = ds4_row_bytes_checked(type, n_per_row, &rb);
    if (st != DS4_OK) return st;
    const ds4_type_info *t = ds4_type_get(type);
    if (nrows < 0)
        return ds4_fail(DS4_ERR_INVALID, "quant: %s: negative row count %lld",
                        t->name, (long long)nrows);
    if (t->needs_imatrix && !imatrix)
        return ds4_fail(DS4_ERR_INVALID,
                        "quant: %s needs an importance matrix (imatrix is NULL)",
                        t->name);
    if (!t->can_quantize)
        return ds4_fail(DS4_ERR_UNSUPPORTED, "quant: cannot quantize to %s", t->name);
    if (imatrix)
        for (int64_t j = 0; j < n_per_row; j++)
            if (!(imatrix[j] >= 0.f) || isinf(imatrix[j]))
                return ds4_fail(DS4_ERR_INVALID,
                                "quant: %s: imatrix[%lld] = %g is not a finite "
                                "non-negative weight",
                                t->name, (long long)j, (double)imatrix[j]);
    uint8_t *out = dst;
    const int64_t n = n_per_row;
    switch (type) {
    case DS4_TYPE_F32:
        memmove(dst, src, (size_t)(nrows * rb));
        return DS4_OK;
    case DS4_TYPE_F16:
        for (int64_t i = 0; i < nrows * n; i++) {
            uint16_t h = ds4_f32_to_f16(src[i]);
            memcpy(out + 2 * i, &h, 2);
        }
        return DS4_OK;
    case DS4_TYPE_BF16:
        for (int64_t i = 0; i < nrows * n; i++) {
            uint16_t h = ds4_f32_to_bf16(src[i]);
            memcpy(out + 2 * i, &h, 2);
        }
        return DS4_OK;
    default:
        break;
    }
    row_fn fn = block_quantizer(type);
    if (!fn) return ds4_fail(DS4_ERR_UNSUPPORTED, "quant: no quantizer for %s", t->name);
    const double limit = max_magnitude(type);
    for (int64_t r = 0; r < nrows; r++) {
        const float *x = src + r * n;
        for (int64_t j = 0; j < n; j++)
            if (!isfinite(x[j]) || fabs(x[j]) > limit)
                return ds4_fail(DS4_ERR_INVALID,
                                "quant: %s: input row %lld column %lld is %g "
                                "(the format holds finite values up to %g)",
                                t->name, (long long)r, (long long)j, (double)x[j], limit);
        fn(x, out + r * rb, n, imatrix);
    }
    return DS4_OK;
}

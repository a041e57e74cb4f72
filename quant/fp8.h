/*
 * fp8.h - the official DeepSeek V4 low-precision numerics: FP8-E4M3,
 * FP4-E2M1 and UE8M0 (E8M0) codecs, the KV / indexer round-trip
 * simulations, the Hadamard-128 rotation, and dequantization of the
 * official checkpoint's FP8 and FP4 weights.
 *
 * Spec: docs dsv4-model.md section 4.1 (D1, D2) and 2.3.
 *  - E4M3 is the "FN" variant: bias 7, no infinities, S.1111.111 is NaN,
 *    largest finite 448, subnormals m * 2^-9.
 *  - E2M1: bias 1, values 0, 0.5, 1, 1.5, 2, 3, 4, 6 (and negatives).
 *  - UE8M0: an unsigned biased exponent, 2^(e - 127); 0xFF is NaN.
 * Encoders round to nearest, ties to even (even mantissa), and saturate
 * finite values to the largest magnitude (the simulations clamp first).
 *
 * The block scale of both simulations is 2^ceil(log2(amax / max)),
 * computed exactly (frexp) on the f32 quotient amax / max rather than with
 * log2f, whose rounding can undershoot by one octave just above a power of
 * two (then values would be clamped instead of scaled).
 */
#ifndef DS4_QUANT_FP8_H
#define DS4_QUANT_FP8_H

#include <stdint.h>

#include "include/ds4.h"
#include "quant/blocks.h"

#define DS4_E4M3_MAX 448.0f
#define DS4_E2M1_MAX 6.0f
#define DS4_FP8_KV_BLOCK 64   /* values per scale in the KV simulation */
#define DS4_FP4_BLOCK 32      /* values per scale in FP4 (indexer, experts) */
#define DS4_FP8_WEIGHT_TILE 128 /* checkpoint FP8 weights: 128x128 tiles */
#define DS4_HADAMARD_N 128

/* ---- scalar codecs ---- */
float ds4_e4m3_to_f32(uint8_t code);  /* NaN for 0x7F / 0xFF */
uint8_t ds4_f32_to_e4m3(float v);     /* RNE, saturating; NaN -> 0x7F|sign */
float ds4_e2m1_to_f32(uint8_t code);  /* low 4 bits: sign, 2 exp, 1 mantissa */
uint8_t ds4_f32_to_e2m1(float v);     /* RNE, saturating; NaN -> 0 */
float ds4_ue8m0_to_f32(uint8_t e);    /* 2^(e-127), exact (subnormal for e 0);
                                       * NaN for 0xFF */

/* ---- activation simulations (in place) ---- */

/* D1: FP8 round trip of n values (n % 64 == 0): per 64 values, amax
 * floored at 1e-4, scale 2^ceil(log2(amax/448)), x/scale clamped to +-448,
 * rounded to E4M3, times scale. The caller passes only the non-RoPE dims. */
ds4_status ds4_fp8_kv_roundtrip(float *x, int64_t n);

/* FP4 round trip of n values (n % 32 == 0): per 32 values, amax floored
 * at 6 * 2^-126, scale 2^ceil(log2(amax/6)), clamp +-6, round to E2M1. */
ds4_status ds4_fp4_roundtrip(float *x, int64_t n);

/* Normalized Walsh-Hadamard transform of 128 values in Sylvester order:
 * y[i] = (1/sqrt(128)) * sum_j (-1)^popcount(i & j) x[j]. Butterflies
 * (a+b, a-b) at strides 1, 2, ..., 64, then one multiply by the f32 of
 * 1/sqrt(128); its own inverse up to rounding. */
void ds4_hadamard128(float *x);

/* D2: the indexer QAT of one 128-wide row: Hadamard-128 then FP4 round trip. */
void ds4_indexer_qat_row(float *x);

/* ---- official checkpoint weights -> f32 ---- */

typedef enum {
    DS4_SCALE_F32,  /* float32 scale values */
    DS4_SCALE_BF16, /* bfloat16 scale values */
    DS4_SCALE_E8M0, /* one UE8M0 byte per scale */
} ds4_scale_format;

/* FP8-E4M3 weight [rows, cols] (one byte per value, row-major) with one
 * scale ("scale_inv": multiply to dequantize) per 128x128 tile, scales
 * [ceil(rows/128), ceil(cols/128)] row-major. Writes rows
 * [row0, row0 + nrows) to out (nrows * cols floats):
 *   out = e4m3(w[r][c]) * scale[r/128][c/128]   (one f32 multiply).
 * w and scales point at the start of the whole tensors. A NaN weight code
 * or a scale that is not finite and non-negative is a format error naming
 * the position. */
ds4_status ds4_dequant_fp8_tiles(const uint8_t *w, const void *scales, ds4_scale_format sf,
                                 int64_t rows, int64_t cols, int64_t row0, int64_t nrows,
                                 float *out);

/* FP4-E2M1 weight [rows, cols] packed two per byte (row-major, [rows,
 * cols/2] bytes; column 2i in the low nibble, 2i+1 in the high nibble)
 * with one scale per 32 values of a row, scales [rows, cols/32] row-major.
 * Writes rows [row0, row0 + nrows): out = e2m1 * scale. cols % 32 == 0. */
ds4_status ds4_dequant_fp4_blocks(const uint8_t *w, const void *scales, ds4_scale_format sf,
                                  int64_t rows, int64_t cols, int64_t row0, int64_t nrows,
                                  float *out);

/* Lossless repack of one FP4 row (cols values, packed as above) with its
 * E8M0 scales (cols/32 bytes) into cols/32 GGML MXFP4 blocks, which hold
 * exactly the same values (the MXFP4 exponent byte is the E8M0 byte; ggml
 * keeps value j in the low nibble of byte j and value j+16 in its high
 * nibble; its table decodes the code -0 as +0). An E8M0 of 0xFF (NaN) is
 * a format error. */
ds4_status ds4_fp4_row_to_mxfp4(const uint8_t *w_row, const uint8_t *e8m0_row, int64_t cols,
                                block_mxfp4 *out);

#endif

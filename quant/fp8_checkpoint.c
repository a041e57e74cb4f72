/*
 * fp8_checkpoint.c - the official DeepSeek V4 checkpoint's FP8 and FP4
 * weights to f32 (for the converter), and the lossless FP4 -> MXFP4 repack.
 *
 * FP8-E4M3 weights carry one scale per 128x128 tile, FP4-E2M1 expert
 * weights (two per byte) one UE8M0 scale per 32 values of a row. Scales
 * may come as f32, bf16 or E8M0 bytes. Each value is decoded exactly and
 * multiplied once by its scale in f32. Every scale and code is validated:
 * a corrupt checkpoint gives a format error naming the position, not NaNs.
 */
#include "quant/fp8.h"

#include <math.h>
#include <string.h>

#include "quant/half.h"
#include "util/error.h"

static float read_scale(const void *scales, ds4_scale_format sf, int64_t i)
{
    switch (sf) {
    case DS4_SCALE_F32: {
        float f;
        memcpy(&f, (const uint8_t *)scales + 4 * i, 4);
        return f;
    }
    case DS4_SCALE_BF16: {
        uint16_t h;
        memcpy(&h, (const uint8_t *)scales + 2 * i, 2);
        return ds4_bf16_to_f32(h);
    }
    case DS4_SCALE_E8M0: return ds4_ue8m0_to_f32(((const uint8_t *)scales)[i]);
    }
    return NAN;
}

static ds4_status check_args(const char *what, const void *w, const void *scales,
                             ds4_scale_format sf, int64_t rows, int64_t cols, int64_t row0,
                             int64_t nrows, const float *out)
{
    if (!w || !scales || !out)
        return ds4_fail(DS4_ERR_INVALID, "%s: NULL buffer", what);
    if ((unsigned)sf > DS4_SCALE_E8M0)
        return ds4_fail(DS4_ERR_INVALID, "%s: unknown scale format %d", what, (int)sf);
    if (rows < 0 || cols < 0 || row0 < 0 || nrows < 0 || row0 > rows || nrows > rows - row0)
        return ds4_fail(DS4_ERR_INVALID,
                        "%s: rows [%lld, +%lld) outside a tensor of %lld x %lld", what,
                        (long long)row0, (long long)nrows, (long long)rows, (long long)cols);
    return DS4_OK;
}

static ds4_status bad_scale(const char *what, int64_t r, int64_t c, float s)
{
    return ds4_fail(DS4_ERR_FORMAT, "%s: scale for row %lld column %lld is %g "
                    "(not finite and non-negative)", what, (long long)r, (long long)c,
                    (double)s);
}

ds4_status ds4_dequant_fp8_tiles(const uint8_t *w, const void *scales, ds4_scale_format sf,
                                 int64_t rows, int64_t cols, int64_t row0, int64_t nrows,
                                 float *out)
{
    const char *what = "fp8 weight";
    ds4_status st = check_args(what, w, scales, sf, rows, cols, row0, nrows, out);
    if (st != DS4_OK) return st;
    const int64_t tcols = (cols + DS4_FP8_WEIGHT_TILE - 1) / DS4_FP8_WEIGHT_TILE;
    for (int64_t r = row0; r < row0 + nrows; r++) {
        const uint8_t *wr = w + r * cols;
        float *o = out + (r - row0) * cols;
        for (int64_t t = 0; t < tcols; t++) {
            const float s = read_scale(scales, sf, (r / DS4_FP8_WEIGHT_TILE) * tcols + t);
            if (!(s >= 0.f) || isinf(s)) return bad_scale(what, r, t * DS4_FP8_WEIGHT_TILE, s);
            const int64_t c1 = (t + 1) * DS4_FP8_WEIGHT_TILE < cols ? (t + 1) * DS4_FP8_WEIGHT_TILE : cols;
            for (int64_t c = t * DS4_FP8_WEIGHT_TILE; c < c1; c++) {
                if ((wr[c] & 0x7F) == 0x7F)
                    return ds4_fail(DS4_ERR_FORMAT, "%s: NaN code 0x%02x at row %lld column %lld",
                                    what, wr[c], (long long)r, (long long)c);
                o[c] = ds4_e4m3_to_f32(wr[c]) * s;
            }
        }
    }
    return DS4_OK;
}

ds4_status ds4_dequant_fp4_blocks(const uint8_t *w, const void *scales, ds4_scale_format sf,
                                  int64_t rows, int64_t cols, int64_t row0, int64_t nrows,
                                  float *out)
{
    const char *what = "fp4 weight";
    ds4_status st = check_args(what, w, scales, sf, rows, cols, row0, nrows, out);
    if (st != DS4_OK) return st;
    if (cols % DS4_FP4_BLOCK)
        return ds4_fail(DS4_ERR_INVALID, "%s: %lld columns, not a multiple of %d", what,
                        (long long)cols, DS4_FP4_BLOCK);
    const int64_t nblk = cols / DS4_FP4_BLOCK;
    for (int64_t r = row0; r < row0 + nrows; r++) {
        const uint8_t *wr = w + r * (cols / 2);
        float *o = out + (r - row0) * cols;
        for (int64_t b = 0; b < nblk; b++) {
            const float s = read_scale(scales, sf, r * nblk + b);
            if (!(s >= 0.f) || isinf(s)) return bad_scale(what, r, b * DS4_FP4_BLOCK, s);
            for (int64_t c = b * DS4_FP4_BLOCK; c < (b + 1) * DS4_FP4_BLOCK; c += 2) {
                const uint8_t byte = wr[c / 2];
                o[c] = ds4_e2m1_to_f32(byte & 0xF) * s;
                o[c + 1] = ds4_e2m1_to_f32(byte >> 4) * s;
            }
        }
    }
    return DS4_OK;
}

ds4_status ds4_fp4_row_to_mxfp4(const uint8_t *w_row, const uint8_t *e8m0_row, int64_t cols,
                                block_mxfp4 *out)
{
    if (cols < 0 || cols % QK_MXFP4)
        return ds4_fail(DS4_ERR_INVALID, "fp4 -> mxfp4: %lld columns, not a multiple of %d",
                        (long long)cols, QK_MXFP4);
    for (int64_t b = 0; b < cols / QK_MXFP4; b++) {
        if (e8m0_row[b] == 0xFF)
            return ds4_fail(DS4_ERR_FORMAT, "fp4 -> mxfp4: NaN scale (0xff) for columns %lld..%lld",
                            (long long)(b * QK_MXFP4), (long long)(b * QK_MXFP4 + QK_MXFP4 - 1));
        const uint8_t *src = w_row + b * (QK_MXFP4 / 2);
        uint8_t code[QK_MXFP4];
        for (int i = 0; i < QK_MXFP4 / 2; i++) {
            code[2 * i] = src[i] & 0xF;
            code[2 * i + 1] = src[i] >> 4;
        }
        out[b].e = e8m0_row[b];
        for (int j = 0; j < QK_MXFP4 / 2; j++)
            out[b].qs[j] = (uint8_t)(code[j] | (code[j + QK_MXFP4 / 2] << 4));
    }
    return DS4_OK;
}

/*
 * quant.h - GGML tensor types: the type table, row sizes, dequantization
 * and quantization of rows.
 *
 * The block layouts are in quant/blocks.h and are bit-compatible with GGML
 * (the published GGUFs use them): ds4_dequantize_row() reproduces ggml's
 * reference dequantization bit for bit (same float operation order), and
 * ds4_quantize_rows() produces blocks whose error is on par with ggml's
 * quantizers (the bytes may differ). Only the types this project meets are
 * known; any other ggml type id is rejected with a message naming it.
 *
 * All functions are reentrant and allocate nothing per call (IQ2_XXS uses a
 * read-only search table built once, thread-safely, on first use). Threads
 * are the caller's business: split rows across workers.
 */
#ifndef DS4_QUANT_QUANT_H
#define DS4_QUANT_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "include/ds4.h"
#include "quant/blocks.h"

typedef struct {
    ds4_type type;        /* ggml type id */
    const char *name;     /* ggml's name: "f32", "q8_0", "q2_K", "iq2_xxs" */
    int64_t block_elems;  /* values per block (1 for f32/f16/bf16/i32) */
    int64_t block_bytes;  /* bytes per block */
    bool is_float;        /* dequantizes to floats (false only for i32) */
    bool can_quantize;    /* ds4_quantize_rows() supports it */
    bool needs_imatrix;   /* quantizing requires an importance matrix */
} ds4_type_info;

/* Table entry of a type id, or NULL (with a message) for an unknown id. */
const ds4_type_info *ds4_type_get(ds4_type type);

/* Name of a type id; "unknown" for ids not in the table. */
const char *ds4_type_name(ds4_type type);

/* Look a type up by name, case-insensitively ("Q8_0", "q2_k", "IQ2_XXS"),
 * for command-line flags. DS4_ERR_NOT_FOUND with the list of names. */
ds4_status ds4_type_from_name(const char *name, ds4_type *out);

/* Bytes of a row of n values: n / block_elems * block_bytes. Returns -1
 * (message set) for an unknown type, n < 0, n not a multiple of the block
 * size, or a size that overflows int64. */
int64_t ds4_row_bytes(ds4_type type, int64_t n);

/* Same as ds4_row_bytes, as a status. */
ds4_status ds4_row_bytes_checked(ds4_type type, int64_t n, int64_t *out);

/* Dequantize one row of n values (n a multiple of the block size) to f32.
 * Bit-exact with ggml's reference dequantizers. i32 is rejected. */
ds4_status ds4_dequantize_row(ds4_type type, const void *src, float *dst, int64_t n);

/* Quantize nrows rows of n_per_row values each (rows contiguous in src,
 * contiguous in dst with stride ds4_row_bytes(type, n_per_row)).
 * imatrix: n_per_row non-negative importance weights (mean squared
 * activation per column) shared by all rows, or NULL. Required for
 * IQ2_XXS; used by Q2_K, Q4_K and MXFP4 to weight the error; ignored by
 * the 8/16/32-bit types. */
ds4_status ds4_quantize_rows(ds4_type type, const float *src, void *dst,
                             int64_t nrows, int64_t n_per_row,
                             const float *imatrix);

#endif

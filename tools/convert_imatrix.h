/*
 * convert_imatrix.h - importance matrices for the quantizers (--imatrix).
 *
 * File format: the legacy llama.cpp binary "imatrix.dat" layout, which is
 * what ds4's collector and llama-imatrix (--output-format dat) write, so
 * existing files work (all little-endian):
 *   i32 n_entries
 *   n_entries x { i32 name_len, name bytes, i32 ncall, i32 nval, f32 values[nval] }
 *   optional: i32 chunks, i32 dataset_len, dataset bytes
 * Each entry is named by the GGUF tensor it weights ("blk.3.ffn_down_exps.weight")
 * and holds the sum over ncall calls of the squared activations of every
 * input column; we use values / ncall (the mean). For a routed-expert
 * tensor, nval is either ne0 (one vector shared by all experts) or
 * ne0 * n_experts (expert e's vector at e * ne0).
 */
#ifndef DS4_TOOLS_CONVERT_IMATRIX_H
#define DS4_TOOLS_CONVERT_IMATRIX_H

#include "include/ds4.h"

#include <stdint.h>

typedef struct convert_imatrix convert_imatrix;

convert_imatrix *convert_imatrix_load(const char *path);
void convert_imatrix_free(convert_imatrix *im);
int64_t convert_imatrix_count(const convert_imatrix *im);

/* Importance of the ne0 columns of `tensor` for expert slab `slab` of
 * n_slabs; NULL when the file has no entry of that name (no error). A
 * present entry of the wrong length is an error (*st set, message names it). */
const float *convert_imatrix_find(const convert_imatrix *im, const char *tensor, uint64_t ne0,
                                  uint64_t slab, uint64_t n_slabs, ds4_status *st);

/* Write a file of this format (for tests and tools). values[i] has nval[i]
 * floats, written with ncall = 1. */
ds4_status convert_imatrix_write(const char *path, int n, const char *const *names,
                                 const float *const *values, const int32_t *nval);

#endif

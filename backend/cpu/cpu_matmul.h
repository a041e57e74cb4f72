/*
 * cpu_matmul.h - quantized-weight matrix products on the CPU.
 *
 * W is a GGUF weight tensor of ne = [cols, rows]: `rows` rows of `cols`
 * values each, stored as blocks of `type` (row stride =
 * ds4_row_bytes(type, cols)). Activations are f32.
 *
 *   y[t * rows + r] = sum_c W[r, c] * x[t * cols + c]     for t < n_tok
 *
 * n_tok == 1 is the decode matvec; larger n_tok (prefill) reuses each
 * weight block for all tokens (a GEMM). A result does not depend on n_tok
 * nor on the pool's size. Where faster, x is quantized internally to the
 * type's dot-product format (Q8_0 / Q8_K, as ggml does). Kernels are
 * picked at run time (scalar, AVX2, AVX-512) and split over the pool.
 */
#ifndef DS4_BACKEND_CPU_MATMUL_H
#define DS4_BACKEND_CPU_MATMUL_H

#include <stdint.h>

#include "quant/blocks.h"
#include "util/threadpool.h"

void ds4_cpu_matmul(ds4_threadpool *pool, ds4_type type, const void *w,
                    int64_t rows, int64_t cols, const float *x, int64_t n_tok,
                    float *y);

#endif

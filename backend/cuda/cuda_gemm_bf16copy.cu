/*
 * cuda_gemm_bf16copy.cu - resident bf16 copies of the dense Q8_0 matrices
 * for the prefill GEMM (cuda_gemm.cu).
 *
 * Why: the GEMM dequantizes each matrix's tiles to bf16 in scratch before
 * every cuBLAS call, once per prefill chunk: 132 dequantizations per
 * 2048-token step of the 8-layer model, 4.4% of the step's GPU time at an
 * 8K frontier (docs/BENCHMARKS.md, run y). A copy made once when the
 * weight is prepared holds the same bf16 values (the same kernel writes
 * it), so the GEMM multiplies the same tiles from it and its results keep
 * their bits; only the dequantization is gone.
 *
 * Cost: two bytes per value, ~11.5 GB for the full Flash q2's attention
 * and shared-expert matrices. A copy is made only while the device keeps
 * an eighth of its memory free beyond it, so a card with little room
 * (the VRAM expert cache's users) gets fewer or none and the GEMM
 * dequantizes as before. Not for the embedding table (only looked up).
 * DS4_CUDA_BF16COPY=0 makes none (A/B runs; read once).
 */
#include "backend/cuda/cuda_internal.cuh"

#include "backend/cuda/cuda_copy_registry.h"

#include <stdlib.h>

static ds4_copy_registry bfc_reg = DS4_COPY_REGISTRY_INIT;

static bool bfc_enabled(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_BF16COPY", &on);
}

extern "C" ds4_status ds4_cuda_bf16copy_register(ds4_cuda *cu, const void *d_w, int64_t rows, int64_t cols)
{
    if (!bfc_enabled() || rows < 1 || cols < 32 || cols % 32 != 0) return DS4_OK;
    if (ds4_copy_registry_has(&bfc_reg, cu->device, d_w)) return DS4_OK;
    const size_t bytes = (size_t)rows * (size_t)cols * sizeof(__nv_bfloat16);
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess || free_b < bytes + total_b / 8) return DS4_OK;
    void *copy = NULL;
    ds4_status st = ds4_cuda_malloc(cu, bytes, &copy);
    if (st != DS4_OK) return DS4_OK; /* no room after all: the GEMM dequantizes */
    st = ds4_cuda_dequantize_bf16(cu, DS4_TYPE_Q8_0, d_w, rows, cols, (__nv_bfloat16 *)copy);
    if (st != DS4_OK) {
        ds4_cuda_free(cu, copy);
        return st;
    }
    bool added = false;
    st = ds4_copy_registry_add(&bfc_reg, cu->device, d_w, copy, rows, cols, &added);
    if (!added) {
        cudaStreamSynchronize(cu->stream); /* the dequantization may still write it */
        ds4_cuda_free(cu, copy);
    }
    return st;
}

extern "C" void ds4_cuda_bf16copy_release(ds4_cuda *cu, const void *d_w)
{
    void *copy = ds4_copy_registry_take(&bfc_reg, cu->device, d_w);
    if (!copy) return;
    cudaStreamSynchronize(cu->stream); /* no queued GEMM may still read it */
    ds4_cuda_free(cu, copy);
}

const __nv_bfloat16 *ds4_bf16copy_find(int device, const void *d_w, int64_t rows, int64_t cols)
{
    if (!bfc_enabled() || !d_w || cols % 32 != 0) return NULL;
    /* d_w may be a row block of a registered matrix (a group of the
     * block-diagonal o_a takes the GEMM one group at a time) */
    ds4_copy_entry e;
    int64_t r0;
    if (!ds4_copy_registry_find(&bfc_reg, device, d_w, cols, cols / 32 * 34, &e, &r0) || r0 + rows > e.rows)
        return NULL;
    return (const __nv_bfloat16 *)e.copy + (size_t)r0 * (size_t)cols;
}

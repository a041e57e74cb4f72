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

#include <pthread.h>
#include <stdlib.h>

typedef struct {
    int device;
    const void *orig;
    __nv_bfloat16 *copy;
    int64_t rows, cols;
} bfc_entry;

static pthread_mutex_t bfc_mu = PTHREAD_MUTEX_INITIALIZER;
static bfc_entry *bfc_tab;
static size_t bfc_n, bfc_cap;

static bool bfc_enabled(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_BF16COPY", &on);
}

static long bfc_find_locked(int device, const void *orig)
{
    for (size_t i = 0; i < bfc_n; i++)
        if (bfc_tab[i].orig == orig && bfc_tab[i].device == device) return (long)i;
    return -1;
}

extern "C" ds4_status ds4_cuda_bf16copy_register(ds4_cuda *cu, const void *d_w, int64_t rows, int64_t cols)
{
    if (!bfc_enabled() || rows < 1 || cols < 32 || cols % 32 != 0) return DS4_OK;
    pthread_mutex_lock(&bfc_mu);
    const bool have = bfc_find_locked(cu->device, d_w) >= 0;
    pthread_mutex_unlock(&bfc_mu);
    if (have) return DS4_OK;
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
    pthread_mutex_lock(&bfc_mu);
    if (bfc_n == bfc_cap) {
        const size_t cap = bfc_cap ? 2 * bfc_cap : 256;
        bfc_entry *nt = (bfc_entry *)realloc(bfc_tab, cap * sizeof *nt);
        if (!nt) {
            pthread_mutex_unlock(&bfc_mu);
            cudaStreamSynchronize(cu->stream);
            ds4_cuda_free(cu, copy);
            return ds4_fail(DS4_ERR_NOMEM, "cuda bf16 copy: registry");
        }
        bfc_tab = nt;
        bfc_cap = cap;
    }
    bfc_tab[bfc_n++] = (bfc_entry){cu->device, d_w, (__nv_bfloat16 *)copy, rows, cols};
    pthread_mutex_unlock(&bfc_mu);
    return DS4_OK;
}

extern "C" void ds4_cuda_bf16copy_release(ds4_cuda *cu, const void *d_w)
{
    pthread_mutex_lock(&bfc_mu);
    const long i = bfc_find_locked(cu->device, d_w);
    __nv_bfloat16 *copy = NULL;
    if (i >= 0) {
        copy = bfc_tab[i].copy;
        bfc_tab[i] = bfc_tab[--bfc_n];
    }
    pthread_mutex_unlock(&bfc_mu);
    if (!copy) return;
    cudaStreamSynchronize(cu->stream); /* no queued GEMM may still read it */
    ds4_cuda_free(cu, copy);
}

const __nv_bfloat16 *ds4_bf16copy_find(int device, const void *d_w, int64_t rows, int64_t cols)
{
    if (!bfc_enabled() || !d_w || cols % 32 != 0) return NULL;
    /* d_w may be a row block of a registered matrix (a group of the
     * block-diagonal o_a takes the GEMM one group at a time) */
    const uintptr_t p = (uintptr_t)d_w, rb = (uintptr_t)(cols / 32 * 34);
    const __nv_bfloat16 *r = NULL;
    pthread_mutex_lock(&bfc_mu);
    for (size_t i = 0; i < bfc_n && !r; i++) {
        const bfc_entry *e = &bfc_tab[i];
        const uintptr_t o = (uintptr_t)e->orig;
        if (e->device != device || e->cols != cols || p < o || p >= o + (uintptr_t)e->rows * rb || (p - o) % rb)
            continue;
        const int64_t r0 = (int64_t)((p - o) / rb);
        if (r0 + rows <= e->rows) r = e->copy + (size_t)r0 * (size_t)cols;
    }
    pthread_mutex_unlock(&bfc_mu);
    return r;
}

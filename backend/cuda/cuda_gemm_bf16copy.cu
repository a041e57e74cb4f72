/*
 * cuda_gemm_bf16copy.cu - resident bf16 copies of the dense Q8_0 matrices
 * for the prefill GEMM (cuda_gemm.cu).
 *
 * Why: the GEMM dequantizes each matrix's tiles to bf16 in scratch before
 * every cuBLAS call, once per prefill chunk: 132 dequantizations per
 * 2048-token step of the 8-layer model, 4.4% of the step's GPU time at an
 * 8K frontier (docs/BENCHMARKS.md, run y). A copy holds the same bf16
 * values (the same kernel writes it), so the GEMM multiplies the same
 * tiles from it and its results keep their bits; only the dequantization
 * is gone.
 *
 * Cost: two bytes per value, ~11.5 GB for the full Flash q2's attention
 * and shared-expert matrices. A copy is made only while the device keeps
 * an eighth of its memory free beyond it, so a card with little room
 * (the VRAM expert cache's users) gets fewer or none and the GEMM
 * dequantizes as before. Not for the embedding table (only looked up).
 * DS4_CUDA_BF16COPY=0 makes none (A/B runs; read once).
 *
 * When: a weight prepared at a session's creation is only noted; the
 * copies are made at the first prefill GEMM of the process (any context),
 * all of them at once. Sessions are memory a user asked for, the copies
 * a speed-up: made at preparation they took all but an eighth of the
 * card before the first session's buffers, so on an 80 GB card holding a
 * 57 GB model a server could open 8 of 16 slots and ds4-bench no batch
 * (H100, 2026-12-05, docs/BENCHMARKS.md). Made later they take what the
 * sessions created by then have left. They are published only once
 * written (the stream synchronized), so another context's GEMM never
 * reads a copy still being written.
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

/* Weights noted by register, waiting for the first GEMM (ds4_cuda_bf16copy_make_pending). */
typedef struct {
    int device;
    const void *d_w;
    int64_t rows, cols;
} bfc_note;

static pthread_mutex_t bfc_mu = PTHREAD_MUTEX_INITIALIZER;
static bfc_note *bfc_notes;
static size_t bfc_n, bfc_cap;
/* what make_pending did (under bfc_mu): copies made and their bytes, weights left without */
static int bfc_made, bfc_skipped;
static size_t bfc_bytes;

/* Make the copy of one noted weight now, on cu's stream; its pointer in
 * *out (NULL: no room, or the allocation failed: the GEMM dequantizes). */
static ds4_status bfc_make(ds4_cuda *cu, const bfc_note *w, void **out)
{
    *out = NULL;
    const size_t bytes = (size_t)w->rows * (size_t)w->cols * sizeof(__nv_bfloat16);
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess || free_b < bytes + total_b / 8) return DS4_OK;
    void *copy = NULL;
    if (ds4_cuda_malloc(cu, bytes, &copy) != DS4_OK) {
        ds4_clear_error();
        return DS4_OK; /* no room after all */
    }
    ds4_status st = ds4_cuda_dequantize_bf16(cu, DS4_TYPE_Q8_0, w->d_w, w->rows, w->cols, (__nv_bfloat16 *)copy);
    if (st != DS4_OK) {
        ds4_cuda_free(cu, copy);
        return st;
    }
    *out = copy;
    return DS4_OK;
}

extern "C" ds4_status ds4_cuda_bf16copy_register(ds4_cuda *cu, const void *d_w, int64_t rows, int64_t cols)
{
    if (!bfc_enabled() || rows < 1 || cols < 32 || cols % 32 != 0) return DS4_OK;
    if (ds4_copy_registry_has(&bfc_reg, cu->device, d_w)) return DS4_OK;
    ds4_status st = DS4_OK;
    pthread_mutex_lock(&bfc_mu);
    bool noted = false;
    for (size_t i = 0; i < bfc_n && !noted; i++) noted = bfc_notes[i].device == cu->device && bfc_notes[i].d_w == d_w;
    if (!noted && bfc_n == bfc_cap) {
        size_t cap = bfc_cap ? bfc_cap * 2 : 256;
        bfc_note *nn = (bfc_note *)realloc(bfc_notes, cap * sizeof *nn);
        if (!nn) st = ds4_fail(DS4_ERR_NOMEM, "cuda: bf16 copy notes");
        else {
            bfc_notes = nn;
            bfc_cap = cap;
        }
    }
    if (!noted && st == DS4_OK) {
        bfc_notes[bfc_n] = (bfc_note){cu->device, d_w, rows, cols};
        __atomic_store_n(&bfc_n, bfc_n + 1, __ATOMIC_RELEASE); /* read unlocked by make_pending */
    }
    pthread_mutex_unlock(&bfc_mu);
    return st;
}

/* Before a GEMM on cu: the copies of the weights noted on cu's device,
 * made in the order noted (the model's), then published. Not while cu's
 * stream is being captured into a graph (a synchronization would end the
 * capture): that GEMM dequantizes, a later one makes them. */
extern "C" ds4_status ds4_cuda_bf16copy_make_pending(ds4_cuda *cu)
{
    if (!bfc_enabled() || !__atomic_load_n(&bfc_n, __ATOMIC_ACQUIRE)) return DS4_OK;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(cu->stream, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone) {
        cudaGetLastError();
        return DS4_OK;
    }
    pthread_mutex_lock(&bfc_mu); /* held while making: another GEMM waits, then finds the copies */
    size_t n_mine = 0;
    for (size_t i = 0; i < bfc_n; i++) n_mine += bfc_notes[i].device == cu->device;
    if (!n_mine) { /* another device's notes: its own first GEMM makes them */
        pthread_mutex_unlock(&bfc_mu);
        return DS4_OK;
    }
    void **copies = (void **)calloc(n_mine, sizeof *copies);
    bfc_note *mine = (bfc_note *)malloc(n_mine * sizeof *mine);
    if (!copies || !mine) {
        pthread_mutex_unlock(&bfc_mu);
        free(copies);
        free(mine);
        return ds4_fail(DS4_ERR_NOMEM, "cuda: bf16 copies");
    }
    /* this device's notes leave the list whatever happens below: a copy
     * not made now is not tried again (its GEMM dequantizes) */
    size_t keep = 0, k = 0;
    for (size_t i = 0; i < bfc_n; i++) {
        if (bfc_notes[i].device == cu->device) mine[k++] = bfc_notes[i];
        else bfc_notes[keep++] = bfc_notes[i];
    }
    __atomic_store_n(&bfc_n, keep, __ATOMIC_RELEASE);
    ds4_status st = DS4_OK;
    size_t tried = 0;
    for (; tried < n_mine && st == DS4_OK; tried++) st = bfc_make(cu, &mine[tried], &copies[tried]);
    if (st == DS4_OK) st = ds4_cuda_sync(cu); /* written before anyone finds them */
    for (size_t i = 0; i < tried; i++) {
        if (!copies[i]) {
            bfc_skipped++;
            continue;
        }
        bool added = false;
        if (st == DS4_OK)
            st = ds4_copy_registry_add(&bfc_reg, cu->device, mine[i].d_w, copies[i], mine[i].rows, mine[i].cols,
                                       &added);
        if (!added) {
            ds4_cuda_free(cu, copies[i]);
            continue;
        }
        bfc_made++;
        bfc_bytes += (size_t)mine[i].rows * (size_t)mine[i].cols * sizeof(__nv_bfloat16);
    }
    bfc_skipped += (int)(n_mine - tried);
    pthread_mutex_unlock(&bfc_mu);
    free(copies);
    free(mine);
    return st;
}

extern "C" void ds4_cuda_bf16copy_release(ds4_cuda *cu, const void *d_w)
{
    pthread_mutex_lock(&bfc_mu);
    size_t keep = 0;
    for (size_t i = 0; i < bfc_n; i++)
        if (bfc_notes[i].device != cu->device || bfc_notes[i].d_w != d_w) bfc_notes[keep++] = bfc_notes[i];
    __atomic_store_n(&bfc_n, keep, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&bfc_mu);
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

extern "C" void ds4_cuda_bf16copy_stats(int *made, size_t *bytes, int *skipped)
{
    pthread_mutex_lock(&bfc_mu);
    *made = bfc_made;
    *bytes = bfc_bytes;
    *skipped = bfc_skipped;
    pthread_mutex_unlock(&bfc_mu);
}

/*
 * cuda_copy_registry.h - device copies derived from a weight when it is
 * prepared (the Q8_0 split layout, cuda_q8split.cu; the prefill GEMM's bf16
 * copies, cuda_gemm_bf16copy.cu), found again by the original's device
 * pointer. One table a kind of copy, under its own lock; host code only,
 * so the table is tested without a GPU (tests/test_cuda_copy_registry.c).
 * Plain C.
 */
#ifndef DS4_CUDA_COPY_REGISTRY_H
#define DS4_CUDA_COPY_REGISTRY_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "include/ds4.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int device;       /* the CUDA device both live on */
    const void *orig; /* the weight's device pointer */
    void *copy;       /* the derived copy's */
    int64_t rows, cols;
} ds4_copy_entry;

typedef struct {
    pthread_mutex_t mu;
    ds4_copy_entry *tab;
    size_t n, cap;
} ds4_copy_registry;

#define DS4_COPY_REGISTRY_INIT {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0}

/* Whether orig on device has a copy. */
bool ds4_copy_registry_has(ds4_copy_registry *r, int device, const void *orig);
/* Records a copy (*added true), or leaves the one orig has (two threads
 * may prepare a shared weight at once: *added false, the caller frees its
 * copy); DS4_ERR_NOMEM when the table could not grow (nothing recorded). */
ds4_status ds4_copy_registry_add(ds4_copy_registry *r, int device, const void *orig, void *copy, int64_t rows,
                                 int64_t cols, bool *added);
/* Removes orig's entry and returns its copy (the caller frees it), or NULL. */
void *ds4_copy_registry_take(ds4_copy_registry *r, int device, const void *orig);
/* The entry of cols columns on device whose original holds p: p == orig
 * (row_bytes 0), or p at the start of a row of it, rows row_bytes apart (a
 * row block of the matrix). *out is a copy of the entry, *row0 p's row.
 * False when there is none. */
bool ds4_copy_registry_find(ds4_copy_registry *r, int device, const void *p, int64_t cols, int64_t row_bytes,
                            ds4_copy_entry *out, int64_t *row0);

#ifdef __cplusplus
}
#endif

#endif

/*
 * cuda_copy_registry.cu - the derived copies' tables (cuda_copy_registry.h):
 * a linear scan, since a model registers a few hundred matrices and a
 * lookup happens once a product.
 */
#include "backend/cuda/cuda_copy_registry.h"

#include <stdlib.h>

extern "C" {
#include "util/error.h"
}

/* Index of orig's entry, or -1 (caller holds r->mu). */
static long copy_index_locked(const ds4_copy_registry *r, int device, const void *orig)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->tab[i].orig == orig && r->tab[i].device == device) return (long)i;
    return -1;
}

extern "C" bool ds4_copy_registry_has(ds4_copy_registry *r, int device, const void *orig)
{
    pthread_mutex_lock(&r->mu);
    const bool have = copy_index_locked(r, device, orig) >= 0;
    pthread_mutex_unlock(&r->mu);
    return have;
}

extern "C" ds4_status ds4_copy_registry_add(ds4_copy_registry *r, int device, const void *orig, void *copy,
                                            int64_t rows, int64_t cols, bool *added)
{
    *added = false;
    pthread_mutex_lock(&r->mu);
    if (copy_index_locked(r, device, orig) >= 0) {
        pthread_mutex_unlock(&r->mu);
        return DS4_OK;
    }
    if (r->n == r->cap) {
        const size_t cap = r->cap ? 2 * r->cap : 256;
        ds4_copy_entry *nt = (ds4_copy_entry *)realloc(r->tab, cap * sizeof *nt);
        if (!nt) {
            pthread_mutex_unlock(&r->mu);
            return ds4_fail(DS4_ERR_NOMEM, "cuda copy registry: %zu entries", cap);
        }
        r->tab = nt;
        r->cap = cap;
    }
    r->tab[r->n++] = (ds4_copy_entry){device, orig, copy, rows, cols};
    *added = true;
    pthread_mutex_unlock(&r->mu);
    return DS4_OK;
}

extern "C" void *ds4_copy_registry_take(ds4_copy_registry *r, int device, const void *orig)
{
    pthread_mutex_lock(&r->mu);
    const long i = copy_index_locked(r, device, orig);
    void *copy = NULL;
    if (i >= 0) {
        copy = r->tab[i].copy;
        r->tab[i] = r->tab[--r->n];
    }
    pthread_mutex_unlock(&r->mu);
    return copy;
}

extern "C" bool ds4_copy_registry_find(ds4_copy_registry *r, int device, const void *p, int64_t cols,
                                       int64_t row_bytes, ds4_copy_entry *out, int64_t *row0)
{
    const uintptr_t q = (uintptr_t)p;
    bool found = false;
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < r->n && !found; i++) {
        const ds4_copy_entry *e = &r->tab[i];
        const uintptr_t o = (uintptr_t)e->orig;
        if (e->device != device || e->cols != cols || q < o) continue;
        int64_t r0 = 0;
        if (row_bytes <= 0) {
            if (q != o) continue;
        } else {
            const uintptr_t rb = (uintptr_t)row_bytes;
            if ((q - o) % rb || (q - o) / rb >= (uintptr_t)e->rows) continue;
            r0 = (int64_t)((q - o) / rb);
        }
        *out = *e;
        *row0 = r0;
        found = true;
    }
    pthread_mutex_unlock(&r->mu);
    return found;
}

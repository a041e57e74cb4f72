/*
 * cpu_buffers.c - scratch buffers of the matmul calls, kept for reuse.
 *
 * A prefill matmul needs a few hundred KiB to a few MiB of scratch
 * (converted and packed activations, weight panels). Allocations that size
 * are mmap'ed and unmapped by malloc on every call, and every page of them
 * then faults in again, zeroed by the kernel: measured at 10-20 % of a
 * 64-token GEMM on the development VM. So freed buffers go to a few slots
 * and the next call takes one that is large enough.
 */
#include "backend/cpu/cpu_matmul_kernels.h"

#include <stdatomic.h>
#include <stdlib.h>

#define SLOTS 6
#define HEADER 64 /* the capacity, padded so the payload stays 64-aligned */

static _Atomic(void *) slots[SLOTS];

static size_t capacity(void *block)
{
    return *(size_t *)block;
}

void *ds4_cpu_buf_get(size_t bytes)
{
    /* A buffer is only looked at once it is taken out of its slot (another
     * thread may take and free it at any time before). One too small for
     * this call is freed: the slots end up holding buffers of the largest
     * sizes in use, which serve every call. */
    for (int i = 0; i < SLOTS; i++) {
        void *b = atomic_exchange(&slots[i], NULL);
        if (!b) continue;
        if (capacity(b) >= bytes) return (char *)b + HEADER;
        free(b);
    }
    size_t cap = (bytes + 4095) & ~(size_t)4095;
    void *b = aligned_alloc(64, HEADER + cap);
    if (!b) return NULL;
    *(size_t *)b = cap;
    return (char *)b + HEADER;
}

void ds4_cpu_buf_put(void *p)
{
    if (!p) return;
    void *b = (char *)p - HEADER;
    for (int i = 0; i < SLOTS; i++) {
        void *expect = NULL;
        if (atomic_compare_exchange_strong(&slots[i], &expect, b)) return;
    }
    free(b);
}

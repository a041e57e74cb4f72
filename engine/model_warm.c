/*
 * model_warm.c - ds4_model_warm (model_warm.h). Each thread takes a
 * contiguous share of the mapping (the kernel's read-ahead works per
 * region) and reads one byte per page; the sum is kept so the compiler
 * cannot drop the loads.
 */
#include "engine/model_warm.h"

#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#define WARM_MAX_THREADS 256

typedef struct {
    const volatile uint8_t *p;
    size_t n, page;
    uint64_t sum;
} warm_part;

static void *warm_run(void *arg)
{
    warm_part *w = arg;
    uint64_t s = 0;
    for (size_t off = 0; off < w->n; off += w->page) s += w->p[off];
    w->sum = s;
    return NULL;
}

size_t ds4_model_warm(const void *base, size_t size, int n_threads)
{
    if (!base || !size) return 0;
    long ps = sysconf(_SC_PAGESIZE);
    size_t page = ps > 0 ? (size_t)ps : 4096;
    /* madvise wants a page-aligned start */
    uintptr_t a = (uintptr_t)base & ~(uintptr_t)(page - 1);
    madvise((void *)a, size + ((uintptr_t)base - a), MADV_WILLNEED);
    if (n_threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)c : 1;
    }
    if (n_threads > WARM_MAX_THREADS) n_threads = WARM_MAX_THREADS;
    size_t pages = (size + page - 1) / page;
    if ((size_t)n_threads > pages) n_threads = (int)pages;
    warm_part part[WARM_MAX_THREADS];
    pthread_t th[WARM_MAX_THREADS];
    int started[WARM_MAX_THREADS] = {0};
    size_t per = (pages + (size_t)n_threads - 1) / (size_t)n_threads * page;
    for (int i = 0; i < n_threads; i++) {
        size_t off = (size_t)i * per;
        part[i] = (warm_part){(const volatile uint8_t *)base + off, off >= size ? 0 : (size - off < per ? size - off : per),
                              page, 0};
        /* the last share runs here; a thread that cannot start is run here too */
        if (i + 1 < n_threads) started[i] = pthread_create(&th[i], NULL, warm_run, &part[i]) == 0;
        if (!started[i]) warm_run(&part[i]);
    }
    for (int i = 0; i < n_threads; i++)
        if (started[i]) pthread_join(th[i], NULL);
    return pages;
}

/*
 * model_warm.c - ds4_model_warm (model_warm.h). Each thread takes a
 * contiguous share of the mapping (the kernel's read-ahead works per
 * region) and reads one byte per page; the sum is kept so the compiler
 * cannot drop the loads.
 */
#include "engine/model_warm.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
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

long long ds4_mapped_huge_bytes(const void *base, size_t size)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    const uintptr_t lo = (uintptr_t)base, hi = lo + size;
    static const char *const keys[] = {"FilePmdMapped:", "AnonHugePages:", "ShmemPmdMapped:", "Private_Hugetlb:",
                                       "Shared_Hugetlb:"};
    char line[4096];
    long long total = 0;
    int in = 0;
    while (fgets(line, sizeof line, f)) {
        uintptr_t a, b;
        /* a mapping's header: "start-end perms offset dev inode [path]";
           the fields' lines start with a capitalized name and a colon */
        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " ", &a, &b) == 2) {
            in = a < hi && b > lo; /* the file's mapping ends on a page boundary past base + size */
            continue;
        }
        if (!in) continue;
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            size_t n = strlen(keys[k]);
            long long kb;
            if (!strncmp(line, keys[k], n) && sscanf(line + n, "%lld", &kb) == 1) total += kb * 1024;
        }
    }
    fclose(f);
    return total;
}

/*
 * bench_model_bandwidth.c - the memory bandwidth behind ds4-bench's
 * roofline_tps column, measured in the same run as the rows.
 *
 * Decode reads every weight byte once per token, so the best a backend can
 * do is bandwidth / bytes-per-token. The bandwidth that counts is that of
 * the memory the backend keeps the weights in, so the source depends on
 * the backend:
 *   cpu   a multi-threaded memcpy of 512 MiB in host RAM (the same threads
 *         as the session);
 *   cuda  a device-to-device copy of 1 GiB (backend/cuda's C API; only in
 *         builds with nvcc, DS4_HAVE_CUDA).
 * Both count bytes read + bytes written (the STREAM "copy" convention, as
 * ds4-bench --kernels does), i.e. the memory traffic, which is what a
 * weight-streaming matvec can at best approach. The median of several
 * timed passes after a warm-up is reported.
 */
#include "bench/bench_model.h"

#include "util/threadpool.h"

#if DS4_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#endif

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BW_PASSES 7

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- host RAM ---------------------------------------------------------- */

#define HOST_BYTES ((size_t)512 << 20)
#define HOST_CHUNKS 128

typedef struct {
    unsigned char *dst;
    const unsigned char *src;
} host_copy;

static void host_copy_task(void *arg, int64_t i, int ti)
{
    (void)ti;
    host_copy *c = arg;
    size_t n = HOST_BYTES / HOST_CHUNKS;
    memcpy(c->dst + (size_t)i * n, c->src + (size_t)i * n, n);
}

static int host_bandwidth(int threads, double *bps)
{
    ds4_threadpool *pool = ds4_pool_create(threads);
    unsigned char *a = malloc(HOST_BYTES), *b = malloc(HOST_BYTES);
    int rc = 1;
    if (!pool || !a || !b) {
        fprintf(stderr, "ds4-bench: no memory or threads for the bandwidth measurement\n");
        goto done;
    }
    memset(a, 1, HOST_BYTES);
    memset(b, 2, HOST_BYTES);
    host_copy c = {b, a};
    ds4_pool_run(pool, HOST_CHUNKS, host_copy_task, &c); /* warm-up */
    double gbs[BW_PASSES];
    for (int r = 0; r < BW_PASSES; r++) {
        double t0 = now_s();
        ds4_pool_run(pool, HOST_CHUNKS, host_copy_task, &c);
        gbs[r] = 2.0 * (double)HOST_BYTES / (now_s() - t0);
    }
    *bps = median(gbs, BW_PASSES);
    rc = 0;
done:
    free(a);
    free(b);
    ds4_pool_destroy(pool);
    return rc;
}

/* ---- CUDA device memory ------------------------------------------------ */

#if DS4_HAVE_CUDA
#define DEV_BYTES ((size_t)1 << 30)

static int device_bandwidth(double *bps)
{
    ds4_cuda *cu = NULL;
    void *a = NULL, *b = NULL;
    int rc = 1;
    if (ds4_cuda_open(0, &cu) != DS4_OK || ds4_cuda_malloc(cu, DEV_BYTES, &a) != DS4_OK ||
        ds4_cuda_malloc(cu, DEV_BYTES, &b) != DS4_OK || ds4_cuda_copy_d2d(cu, b, a, DEV_BYTES) != DS4_OK ||
        ds4_cuda_sync(cu) != DS4_OK) {
        fprintf(stderr, "ds4-bench: CUDA bandwidth measurement: %s\n", ds4_last_error());
        goto done;
    }
    double gbs[BW_PASSES];
    for (int r = 0; r < BW_PASSES; r++) {
        double ms = 0;
        if (ds4_cuda_timer_start(cu) != DS4_OK || ds4_cuda_copy_d2d(cu, b, a, DEV_BYTES) != DS4_OK ||
            ds4_cuda_timer_stop(cu, &ms) != DS4_OK || ms <= 0) {
            fprintf(stderr, "ds4-bench: CUDA bandwidth measurement: %s\n", ds4_last_error());
            goto done;
        }
        gbs[r] = 2.0 * (double)DEV_BYTES / (ms * 1e-3);
    }
    *bps = median(gbs, BW_PASSES);
    rc = 0;
done:
    if (cu) {
        if (a) ds4_cuda_free(cu, a);
        if (b) ds4_cuda_free(cu, b);
        ds4_cuda_close(cu);
    }
    return rc;
}
#endif

int bench_model_bandwidth(ds4_backend_kind backend, int threads, double *bytes_per_s, const char **what)
{
    switch (backend) {
    case DS4_BACKEND_CUDA:
#if DS4_HAVE_CUDA
        *what = "CUDA device-to-device copy of 1 GiB, read + write";
        return device_bandwidth(bytes_per_s);
#else
        fprintf(stderr, "ds4-bench: this build has no CUDA backend (no nvcc at build time)\n");
        return 1;
#endif
    case DS4_BACKEND_AUTO:
    case DS4_BACKEND_CPU:
    default:
        *what = "host memcpy of 512 MiB, read + write";
        return host_bandwidth(threads, bytes_per_s);
    }
}

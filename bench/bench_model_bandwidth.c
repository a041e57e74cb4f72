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
 * weight-streaming matvec can at best approach. A measurement is the
 * median of 5 timed passes. The meter keeps its buffers so that the walk
 * can measure at every frontier, right after the decode it is compared
 * with: on a shared machine the bandwidth drifts with the other load, and
 * a roofline from another minute would not describe that decode.
 */
#include "bench/bench_model.h"

#include "util/threadpool.h"

#if DS4_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#endif

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BW_PASSES 5

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

struct bench_bw {
    ds4_backend_kind backend;
    ds4_threadpool *pool;
    unsigned char *dst, *src;
#if DS4_HAVE_CUDA
    ds4_cuda *cu;
    void *d_dst, *d_src;
#endif
};

static void host_copy_task(void *arg, int64_t i, int ti)
{
    (void)ti;
    bench_bw *b = arg;
    size_t n = HOST_BYTES / HOST_CHUNKS;
    memcpy(b->dst + (size_t)i * n, b->src + (size_t)i * n, n);
}

static int host_open(bench_bw *b, int threads)
{
    b->pool = ds4_pool_create(threads);
    b->dst = malloc(HOST_BYTES);
    b->src = malloc(HOST_BYTES);
    if (!b->pool || !b->dst || !b->src) {
        fprintf(stderr, "ds4-bench: no memory or threads for the bandwidth measurement\n");
        return 1;
    }
    memset(b->src, 1, HOST_BYTES);
    memset(b->dst, 2, HOST_BYTES);
    ds4_pool_run(b->pool, HOST_CHUNKS, host_copy_task, b); /* warm-up */
    return 0;
}

static double host_pass(bench_bw *b)
{
    double t0 = now_s();
    ds4_pool_run(b->pool, HOST_CHUNKS, host_copy_task, b);
    return 2.0 * (double)HOST_BYTES / (now_s() - t0);
}

/* ---- CUDA device memory ------------------------------------------------ */

#if DS4_HAVE_CUDA
#define DEV_BYTES ((size_t)1 << 30)

static int cuda_failed(void)
{
    fprintf(stderr, "ds4-bench: CUDA bandwidth measurement: %s\n", ds4_last_error());
    return 1;
}

static int device_open(bench_bw *b, int device)
{
    if (ds4_cuda_open(device, &b->cu) != DS4_OK || ds4_cuda_malloc(b->cu, DEV_BYTES, &b->d_src) != DS4_OK ||
        ds4_cuda_malloc(b->cu, DEV_BYTES, &b->d_dst) != DS4_OK ||
        ds4_cuda_copy_d2d(b->cu, b->d_dst, b->d_src, DEV_BYTES) != DS4_OK || ds4_cuda_sync(b->cu) != DS4_OK)
        return cuda_failed();
    return 0;
}

static double device_pass(bench_bw *b)
{
    double ms = 0;
    if (ds4_cuda_timer_start(b->cu) != DS4_OK || ds4_cuda_copy_d2d(b->cu, b->d_dst, b->d_src, DEV_BYTES) != DS4_OK ||
        ds4_cuda_timer_stop(b->cu, &ms) != DS4_OK || !(ms > 0))
        return 0;
    return 2.0 * (double)DEV_BYTES / (ms * 1e-3);
}
#endif

/* ---- the meter --------------------------------------------------------- */

bench_bw *bench_bw_open(ds4_backend_kind backend, int gpu_device, int threads, const char **what)
{
    (void)gpu_device; /* only in CUDA builds */
    bench_bw *b = calloc(1, sizeof *b);
    if (!b) {
        fprintf(stderr, "ds4-bench: out of memory\n");
        return NULL;
    }
    b->backend = backend == DS4_BACKEND_CUDA ? DS4_BACKEND_CUDA : DS4_BACKEND_CPU;
    int rc;
    if (b->backend == DS4_BACKEND_CUDA) {
#if DS4_HAVE_CUDA
        *what = "CUDA device-to-device copy of 1 GiB, read + write";
        rc = device_open(b, gpu_device);
#else
        fprintf(stderr, "ds4-bench: this build has no CUDA backend (no nvcc at build time)\n");
        rc = 1;
#endif
    } else {
        *what = "host memcpy of 512 MiB, read + write";
        rc = host_open(b, threads);
    }
    if (rc) {
        bench_bw_close(b);
        return NULL;
    }
    return b;
}

int bench_bw_measure(bench_bw *b, double *bytes_per_s)
{
    double v[BW_PASSES];
    for (int r = 0; r < BW_PASSES; r++) {
#if DS4_HAVE_CUDA
        if (b->backend == DS4_BACKEND_CUDA) {
            if (!((v[r] = device_pass(b)) > 0)) return cuda_failed();
            continue;
        }
#endif
        v[r] = host_pass(b);
    }
    *bytes_per_s = median(v, BW_PASSES);
    return 0;
}

void bench_bw_close(bench_bw *b)
{
    if (!b) return;
#if DS4_HAVE_CUDA
    if (b->cu) {
        if (b->d_src) ds4_cuda_free(b->cu, b->d_src);
        if (b->d_dst) ds4_cuda_free(b->cu, b->d_dst);
        ds4_cuda_close(b->cu);
    }
#endif
    ds4_pool_destroy(b->pool);
    free(b->dst);
    free(b->src);
    free(b);
}

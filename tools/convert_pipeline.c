/*
 * convert_pipeline.c - batched, threaded production of tensor bytes (see
 * convert_pipeline.h). Workers take units with an atomic counter. Error
 * messages are thread-local (util/error.h), so a failing worker copies its
 * message into the batch and the caller re-raises it on its own thread.
 */
#include "tools/convert_pipeline.h"

#include "quant/quant.h"
#include "util/error.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BATCH_BYTES (256u << 20)
#define MAX_THREADS 256

typedef struct {
    uint64_t slab, row0, n, offset;
} unit;

typedef struct {
    convert_unit_fn fn;
    void *ctx;
    int ti;
    unit *units;
    int n_units;
    uint8_t *buf;
    float **scratch;
    atomic_int next;
    atomic_int failed;
    ds4_status st;
    char msg[1024];
    pthread_mutex_t lock;
} batch;

typedef struct {
    batch *b;
    int k;
} worker_arg;

static void *worker(void *p)
{
    worker_arg *wa = p;
    batch *b = wa->b;
    for (;;) {
        int i = atomic_fetch_add(&b->next, 1);
        if (i >= b->n_units || atomic_load(&b->failed)) break;
        const unit *u = &b->units[i];
        ds4_status st = b->fn(b->ctx, b->ti, u->slab, u->row0, u->n, b->buf + u->offset, b->scratch[wa->k]);
        if (st) {
            pthread_mutex_lock(&b->lock);
            if (!atomic_load(&b->failed)) {
                b->st = st;
                snprintf(b->msg, sizeof b->msg, "%s", ds4_last_error());
                atomic_store(&b->failed, 1);
            }
            pthread_mutex_unlock(&b->lock);
            break;
        }
    }
    return NULL;
}

int convert_default_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : (int)n;
}

static ds4_status run_batch(batch *b, int n_threads)
{
    atomic_store(&b->next, 0);
    pthread_t th[MAX_THREADS];
    worker_arg args[MAX_THREADS];
    int started = 0;
    int nt = n_threads < b->n_units ? n_threads : b->n_units;
    for (int k = 1; k < nt; k++) {
        args[k] = (worker_arg){b, k};
        if (pthread_create(&th[k], NULL, worker, &args[k]) != 0) break;
        started = k;
    }
    args[0] = (worker_arg){b, 0};
    worker(&args[0]);
    for (int k = 1; k <= started; k++) pthread_join(th[k], NULL);
    if (atomic_load(&b->failed)) return ds4_fail(b->st, "%s", b->msg);
    return DS4_OK;
}

ds4_status convert_pipeline_run(ds4_gguf_writer *w, const convert_plan *plan, int n_threads,
                                convert_unit_fn fn, void *ctx, bool progress)
{
    if (n_threads < 1) n_threads = 1;
    if (n_threads > MAX_THREADS) n_threads = MAX_THREADS;
    ds4_status st = DS4_OK;
    batch b = {.fn = fn, .ctx = ctx};
    pthread_mutex_init(&b.lock, NULL);
    b.scratch = calloc((size_t)n_threads, sizeof *b.scratch);
    size_t max_units = 65536;
    b.units = malloc(max_units * sizeof *b.units);
    b.buf = malloc(BATCH_BYTES + (64u << 20));
    if (!b.scratch || !b.units || !b.buf) st = ds4_fail(DS4_ERR_NOMEM, "convert: out of memory");
    for (int k = 0; !st && k < n_threads; k++)
        if (!(b.scratch[k] = malloc(CONVERT_UNIT_ELEMS * sizeof(float))))
            st = ds4_fail(DS4_ERR_NOMEM, "convert: out of memory");
    time_t t0 = time(NULL);
    uint64_t done_bytes = 0;
    for (int ti = 0; !st && ti < plan->n; ti++) {
        const plan_tensor *t = &plan->t[ti];
        int64_t row_bytes = ds4_row_bytes(t->type, (int64_t)t->ne[0]);
        if (row_bytes <= 0) {
            st = ds4_fail(DS4_ERR_INVALID, "convert: tensor %s: bad type/row length", t->name);
            break;
        }
        const uint64_t rows = plan_rows(t), slabs = plan_slabs(t);
        uint64_t per_unit = t->type == DS4_TYPE_I32 ? rows : CONVERT_UNIT_ELEMS / t->ne[0];
        if (per_unit < 1) per_unit = 1;
        /* keep a unit's bytes inside one batch buffer */
        while (per_unit > 1 && per_unit * (uint64_t)row_bytes > (64u << 20)) per_unit /= 2;
        b.ti = ti;
        uint64_t slab = 0, row = 0;
        while (!st && slab < slabs) {
            b.n_units = 0;
            uint64_t bytes = 0;
            while (slab < slabs && bytes < BATCH_BYTES && (size_t)b.n_units < max_units) {
                uint64_t n = rows - row < per_unit ? rows - row : per_unit;
                b.units[b.n_units++] = (unit){slab, row, n, bytes};
                bytes += n * (uint64_t)row_bytes;
                row += n;
                if (row == rows) {
                    row = 0;
                    slab++;
                }
            }
            st = run_batch(&b, n_threads);
            if (!st) st = ds4_gguf_writer_append(w, b.buf, bytes);
            done_bytes += bytes;
        }
        if (progress && !st)
            fprintf(stderr, "[%4d/%4d] %-36s %-8s [%llu, %llu, %llu]  %.1f GiB, %lds\n", ti + 1, plan->n,
                    t->name, ds4_type_name(t->type), (unsigned long long)t->ne[0],
                    (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                    (double)done_bytes / (1u << 30), (long)(time(NULL) - t0));
    }
    if (b.scratch)
        for (int k = 0; k < n_threads; k++) free(b.scratch[k]);
    free(b.scratch);
    free(b.units);
    free(b.buf);
    pthread_mutex_destroy(&b.lock);
    return st;
}

/*
 * ops_cpu.c - the CPU backend object: memory (device memory is host
 * memory), the thread pool, scratch areas, weight row access, and the table
 * of function pointers that the ops_cpu_*.c files fill in.
 */
#include "backend/cpu/ops_cpu.h"

#include "backend/cpu/cpu_matmul.h"
#include "quant/quant.h"
#include "util/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

size_t cpu_row_bytes(ds4_type type, int64_t n)
{
    switch (type) {
    case DS4_TYPE_F32: return (size_t)n * 4;
    case DS4_TYPE_I32: return (size_t)n * 4;
    case DS4_TYPE_F16:
    case DS4_TYPE_BF16: return (size_t)n * 2;
    case DS4_TYPE_Q8_0: return (size_t)(n / QK8_0) * sizeof(block_q8_0);
    case DS4_TYPE_Q2_K: return (size_t)(n / QK_K) * sizeof(block_q2_K);
    case DS4_TYPE_Q4_K: return (size_t)(n / QK_K) * sizeof(block_q4_K);
    case DS4_TYPE_IQ2_XXS: return (size_t)(n / QK_K) * sizeof(block_iq2_xxs);
    case DS4_TYPE_MXFP4: return (size_t)(n / QK_MXFP4) * sizeof(block_mxfp4);
    default: return 0;
    }
}

int cpu_type_supported(ds4_type type)
{
    return type != DS4_TYPE_I32 && cpu_row_bytes(type, 256) != 0;
}

static void dequant_row(ds4_type type, const void *src, float *dst, int64_t n)
{
    /* types were validated at bind time, so this cannot fail */
    (void)ds4_dequantize_row(type, src, dst, n);
}

const float *cpu_weight_row(const ds4_weight *w, int64_t r, float *tmp)
{
    int64_t n = w->ne[0];
    const char *row = (const char *)w->data + (size_t)r * cpu_row_bytes(w->type, n);
    if (w->type == DS4_TYPE_F32) return (const float *)row;
    dequant_row(w->type, row, tmp, n);
    return tmp;
}

const float *cpu_weight_f32(const ds4_weight *w, float *tmp)
{
    int64_t n = 1;
    for (int d = 0; d < w->n_dims; d++) n *= w->ne[d];
    if (w->type == DS4_TYPE_F32) return w->data;
    dequant_row(w->type, w->data, tmp, n);
    return tmp;
}

/* ---- matmul: the kernels of backend/cpu/cpu_matmul.h ------------------ */

void cpu_matmul_raw(ds4_backend *be, ds4_type type, const void *data,
                    int64_t rows, int64_t cols, const float *x, int64_t T,
                    float *y)
{
    be->stats.matmul_rows += (uint64_t)rows * (uint64_t)T;
    ds4_cpu_matmul(cpu_of(be)->pool, type, data, rows, cols, x, T, y);
}

/* ---- memory, pool, scratch ------------------------------------------- */

void *cpu_scratch(ds4_backend *be, int which, size_t bytes)
{
    cpu_backend *c = cpu_of(be);
    if (c->scratch_size[which] >= bytes) return c->scratch[which];
    size_t n = bytes + bytes / 4 + 4096;
    void *p = realloc(c->scratch[which], n);
    if (!p) return NULL;
    c->scratch[which] = p;
    c->scratch_size[which] = n;
    return p;
}

typedef struct {
    void (*fn)(void *, int64_t, int);
    void *arg;
} par_shim;

static void par_tramp(void *arg, int64_t i, int thread)
{
    par_shim *s = arg;
    s->fn(s->arg, i, thread);
}

void cpu_parallel(ds4_backend *be, int64_t n, void (*fn)(void *, int64_t, int), void *arg)
{
    par_shim s = {fn, arg};
    ds4_pool_run(cpu_of(be)->pool, n, par_tramp, &s);
}

int cpu_thread_slots(ds4_backend *be)
{
    cpu_backend *c = cpu_of(be);
    return c->pool ? ds4_pool_size(c->pool) + 1 : 1;
}

static void *cpu_alloc(ds4_backend *be, size_t bytes)
{
    (void)be;
    void *p = NULL;
    size_t n = (bytes + 63) & ~(size_t)63;
    if (n == 0) n = 64;
    if (posix_memalign(&p, 64, n) != 0) {
        ds4_fail(DS4_ERR_NOMEM, "cpu backend: cannot allocate %zu bytes", bytes);
        return NULL;
    }
    memset(p, 0, n);
    return p;
}

static void cpu_free(ds4_backend *be, void *p)
{
    (void)be;
    free(p);
}

static void cpu_copy(ds4_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    if (bytes) memmove(dst, src, bytes);
}

static void cpu_fill(ds4_backend *be, float *dst, float v, size_t n)
{
    (void)be;
    for (size_t i = 0; i < n; i++) dst[i] = v;
}

static ds4_status cpu_weight_prepare(ds4_backend *be, const ds4_weight *w)
{
    (void)be;
    if (w->type == DS4_TYPE_I32 || cpu_type_supported(w->type)) return DS4_OK;
    return ds4_fail(DS4_ERR_UNSUPPORTED,
                    "cpu backend: tensor %s: type id %d is not supported for compute",
                    w->name ? w->name : "?", (int)w->type);
}

/* Every CPU backend allocates plain host memory (cpu_alloc). */
static bool cpu_shares_memory(const ds4_backend *be, const ds4_backend *other)
{
    (void)be;
    return other->alloc == cpu_alloc;
}

static void cpu_destroy(ds4_backend *be)
{
    if (!be) return;
    cpu_backend *c = cpu_of(be);
    if (c->pool) ds4_pool_destroy(c->pool);
    free(c->scratch[0]);
    free(c->scratch[1]);
    free(c);
}

ds4_backend *ds4_backend_cpu_create(int n_threads)
{
    cpu_backend *c = calloc(1, sizeof *c);
    if (!c) {
        ds4_fail(DS4_ERR_NOMEM, "cpu backend: out of memory");
        return NULL;
    }
    if (n_threads != 1) {
        c->pool = ds4_pool_create(n_threads);
        if (!c->pool) {
            free(c);
            return NULL;
        }
    }
    c->n_threads = c->pool ? ds4_pool_size(c->pool) : 1;
    ds4_backend *be = &c->base;
    be->name = "cpu";
    be->destroy = cpu_destroy;
    be->alloc = cpu_alloc;
    be->free = cpu_free;
    be->upload = cpu_copy;
    be->download = cpu_copy;
    be->fill = cpu_fill;
    be->weight_prepare = cpu_weight_prepare;
    be->shares_memory = cpu_shares_memory;
    cpu_install_dense(be);
    cpu_install_hc(be);
    cpu_install_attention(be);
    cpu_install_moe(be);
    cpu_install_pick(be);
    return be;
}

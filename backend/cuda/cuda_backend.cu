/*
 * cuda_backend.cu - the CUDA backend object of backend/ops.h: device
 * memory, the device copies of the weights, scratch, the shared matmul
 * dispatch, and the table the cuda_ops_*.cu files fill in.
 *
 * Every op is queued on the context's one stream, so ops run in order and
 * the host only waits in download() (the logits) and argmax_rows() (their
 * greedy picks, cuda_ops_pick.cu). upload() is synchronous
 * with respect to the host buffer (the caller may reuse it at once).
 */
#include "backend/cuda/cuda_backend.cuh"
#include "backend/cuda/cuda_blocks.cuh"
#include "backend/cuda/cuda_expert_cache.cuh" /* issue 14 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cb_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

cb_prof_scope::cb_prof_scope(ds4_backend *be, const char *name) : c(cb_of(be)), slot(-1), t0(0)
{
    if (!c->profile) return;
    for (int i = 0; i < 32; i++)
        if (!c->prof[i].name || strcmp(c->prof[i].name, name) == 0) {
            c->prof[i].name = name;
            slot = i;
            break;
        }
    cudaStreamSynchronize(c->cu->stream);
    t0 = cb_now();
}

cb_prof_scope::~cb_prof_scope()
{
    if (slot < 0) return;
    cudaStreamSynchronize(c->cu->stream);
    const double dt = cb_now() - t0;
    c->prof[slot].seconds += dt;
    c->prof[slot].calls++;
    /* DS4_CUDA_PROFILE=2: every call on its own line, in order with the
     * caller's own stderr lines (which prefill paid a one-time cost) */
    if (c->profile > 1) fprintf(stderr, "cuda op %s %.1f us\n", c->prof[slot].name, dt * 1e6);
}

void cb_fail_status(ds4_backend *be, ds4_status st, const char *op)
{
    if (st == DS4_OK) return;
    cuda_backend *c = cb_of(be);
    if (!c->failed) {
        fprintf(stderr, "cuda backend: %s: %s\n", op, ds4_last_error());
        c->fail_st = st;
        snprintf(c->fail_msg, sizeof c->fail_msg, "cuda backend: %s: %s", op, ds4_last_error());
    }
    c->failed = 1;
}

/* ops.h status: the first failure, sticky (what ran after it is suspect) */
static ds4_status cb_status(ds4_backend *be)
{
    const cuda_backend *c = cb_of(be);
    return c->failed ? ds4_fail(c->fail_st, "%s", c->fail_msg) : DS4_OK;
}

void cb_check_launch(ds4_backend *be, const char *op)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        cb_fail_status(be, ds4_fail(DS4_ERR_BACKEND, "cuda: %s: kernel launch: %s", op, cudaGetErrorString(e)),
                       op);
}

size_t cb_weight_bytes(const ds4_weight *w)
{
    int64_t rest = 1;
    for (int d = 1; d < w->n_dims && d < 4; d++) rest *= w->ne[d];
    size_t row = w->type == DS4_TYPE_I32 ? (size_t)w->ne[0] * 4 : ds4_cuda_row_bytes(w->type, w->ne[0]);
    if (row == 0 && (w->type == DS4_TYPE_F32 || w->type == DS4_TYPE_F16 || w->type == DS4_TYPE_BF16))
        row = (size_t)w->ne[0] * (w->type == DS4_TYPE_F32 ? 4 : 2); /* odd widths of float types */
    return row * (size_t)rest;
}

static size_t hash_ptr(const void *p, size_t cap)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x & (cap - 1);
}

static cb_weight_entry *find_entry(cuda_backend *c, const void *host)
{
    if (!c->w_cap) return NULL;
    for (size_t i = hash_ptr(host, c->w_cap);; i = (i + 1) & (c->w_cap - 1)) {
        if (c->w[i].key.host == host) return &c->w[i];
        if (!c->w[i].key.host) return NULL;
    }
}

static void key_of(const ds4_weight *w, size_t bytes, ds4_wshare_key *k)
{
    ds4_wshare_key_of(k, w->data, bytes, (int)w->type, w->n_dims, w->ne);
}

/* Drop this backend's reference to a weight copy; the last one frees it. */
static void release_copy(cuda_backend *c, void *dev)
{
    if (!ds4_wshare_release(c->cu->device, dev)) return;
    ds4_cuda_q8split_release(c->cu, dev);
    ds4_cuda_bf16copy_release(c->cu, dev);
    ds4_cuda_free(c->cu, dev);
}

/* A Q8_0 matrix (2 dims; not the embedding table, which is only looked
 * up) also gets the split-layout copy the decode matvec reads
 * (cuda_q8split.cu) and, where memory allows, the bf16 copy the prefill
 * GEMM reads (cuda_gemm_bf16copy.cu). */
static ds4_status split_copy(cuda_backend *c, const ds4_weight *w, void *dev)
{
    if (w->type != DS4_TYPE_Q8_0 || w->n_dims != 2) return DS4_OK;
    if (w->name && strstr(w->name, "token_embd")) return DS4_OK;
    ds4_status st = ds4_cuda_q8split_register(c->cu, dev, w->ne[1], w->ne[0]);
    if (st == DS4_OK) st = ds4_cuda_bf16copy_register(c->cu, dev, w->ne[1], w->ne[0]);
    return st;
}

static cb_weight_entry *insert_entry(cuda_backend *c, const void *host)
{
    if ((c->w_n + 1) * 2 > c->w_cap) {
        size_t cap = c->w_cap ? c->w_cap * 2 : 1024;
        cb_weight_entry *nw = (cb_weight_entry *)calloc(cap, sizeof *nw);
        if (!nw) {
            ds4_fail(DS4_ERR_NOMEM, "cuda backend: weight table");
            return NULL;
        }
        for (size_t i = 0; i < c->w_cap; i++) {
            if (!c->w[i].key.host) continue;
            size_t j = hash_ptr(c->w[i].key.host, cap);
            while (nw[j].key.host) j = (j + 1) & (cap - 1);
            nw[j] = c->w[i];
        }
        free(c->w);
        c->w = nw;
        c->w_cap = cap;
    }
    size_t j = hash_ptr(host, c->w_cap);
    while (c->w[j].key.host) j = (j + 1) & (c->w_cap - 1);
    c->w[j].key.host = host;
    c->w_n++;
    return &c->w[j];
}

static int type_usable(ds4_type t)
{
    return t == DS4_TYPE_I32 || ds4_cuda_block_elems(t) != 0;
}

static ds4_status cb_weight_prepare(ds4_backend *be, const ds4_weight *w)
{
    cuda_backend *c = cb_of(be);
    if (!type_usable(w->type))
        return ds4_fail(DS4_ERR_UNSUPPORTED, "cuda backend: tensor %s: type id %d is not supported",
                        w->name ? w->name : "?", (int)w->type);
    const size_t bytes = cb_weight_bytes(w);
    if (bytes == 0) return DS4_OK;
    if (cb_xcache_owns(c->xc, w->data)) return DS4_OK; /* issue 14: copied to VRAM slots on demand */
    ds4_wshare_key k;
    key_of(w, bytes, &k);
    cb_weight_entry *e = find_entry(c, w->data);
    if (e && ds4_wshare_key_equal(&e->key, &k)) return DS4_OK;
    /* another backend on this device may hold the copy already */
    void *d = ds4_wshare_acquire(c->cu->device, &k);
    if (!d) {
        ds4_status st = ds4_cuda_malloc(c->cu, bytes, &d);
        if (st != DS4_OK) {
            ds4_error_prefix("tensor %s: ", w->name ? w->name : "?");
            return st;
        }
        st = ds4_cuda_upload_weight(c->cu, d, w->data, bytes, w->type, w->ne[0]);
        if (st == DS4_OK) st = split_copy(c, w, d);
        if (st == DS4_OK && !ds4_wshare_add(c->cu->device, &k, d))
            st = ds4_fail(DS4_ERR_NOMEM, "cuda backend: shared weight table");
        if (st != DS4_OK) {
            ds4_cuda_q8split_release(c->cu, d);
            ds4_cuda_bf16copy_release(c->cu, d);
            ds4_cuda_free(c->cu, d);
            return st;
        }
    }
    if (e) { /* the host buffer now holds another tensor: replace the copy */
        cudaStreamSynchronize(c->cu->stream);
        cb_mem_changed(be);
        release_copy(c, e->dev);
    } else if (!(e = insert_entry(c, w->data))) {
        release_copy(c, d);
        return DS4_ERR_NOMEM;
    }
    e->key = k;
    e->dev = d;
    return DS4_OK;
}

/* Whether entry e is w by type, shape and size (no fingerprint). */
static bool entry_shape_is(const cb_weight_entry *e, const ds4_weight *w, size_t bytes)
{
    if (e->key.bytes != bytes || e->key.type != (int)w->type) return false;
    for (int d = 0; d < 4; d++)
        if (e->key.ne[d] != (d < w->n_dims ? w->ne[d] : 1)) return false;
    return true;
}

const void *cb_weight(ds4_backend *be, const ds4_weight *w)
{
    cuda_backend *c = cb_of(be);
    const size_t bytes = cb_weight_bytes(w);
    cb_weight_entry *e = find_entry(c, w->data);
    /* A replayed decode step's walk (DRY) only checks that it asks for what
     * the recording used: the fingerprint reads the first and last bytes of
     * the host tensor, two cache and TLB misses into the mapped model for
     * each of ~35 weights a layer, which made most of the 0.2-0.6 ms walk
     * the GPU waited for at every full-size step. Skipping it is safe there:
     * a recording exists only for the decode steps of one session, whose
     * model's tensors (a read-only mapping, or the test's buffers) stay put
     * and unchanged while it lives; a reused host buffer (op tests) is only
     * ever met outside steps, where the fingerprint is still checked.
     * DS4_CUDA_GRAPH_FP=1 checks it here too (A/B runs). */
    if (e && cb_graph_dry(be) && !c->g.dry_fp && entry_shape_is(e, w, bytes)) return e->dev;
    ds4_wshare_key k;
    key_of(w, bytes, &k);
    if (e && ds4_wshare_key_equal(&e->key, &k)) return e->dev;
    /* not prepared (or stale): a copy for this call (freed at the next download) */
    void *d = NULL;
    ds4_status st = ds4_cuda_malloc(c->cu, bytes, &d);
    if (st == DS4_OK) st = ds4_cuda_upload_weight(c->cu, d, w->data, bytes, w->type, w->ne[0]);
    if (st != DS4_OK) {
        cb_fail_status(be, st, w->name ? w->name : "weight upload");
        return NULL;
    }
    if (c->n_transient == c->cap_transient) {
        size_t cap = c->cap_transient ? 2 * c->cap_transient : 64;
        void **nt = (void **)realloc(c->transient, cap * sizeof *nt);
        if (!nt) {
            cb_fail_status(be, ds4_fail(DS4_ERR_NOMEM, "cuda backend: transient list"), "weight");
            return d;
        }
        c->transient = nt;
        c->cap_transient = cap;
    }
    c->transient[c->n_transient++] = d;
    return d;
}

void cb_free_transient(cuda_backend *c)
{
    if (!c->n_transient) return;
    cudaStreamSynchronize(c->cu->stream);
    for (size_t i = 0; i < c->n_transient; i++) ds4_cuda_free(c->cu, c->transient[i]);
    c->n_transient = 0;
}

void *cb_scratch(ds4_backend *be, int which, size_t bytes)
{
    cuda_backend *c = cb_of(be);
    if (c->scratch_bytes[which] >= bytes) return c->scratch[which];
    cb_mem_changed(be);
    if (c->scratch[which]) {
        cudaStreamSynchronize(c->cu->stream);
        ds4_cuda_free(c->cu, c->scratch[which]);
        c->scratch[which] = NULL;
        c->scratch_bytes[which] = 0;
    }
    size_t n = bytes + bytes / 4 + 4096;
    ds4_status st = ds4_cuda_malloc(c->cu, n, &c->scratch[which]);
    if (st != DS4_OK) {
        cb_fail_status(be, st, "scratch");
        return NULL;
    }
    c->scratch_bytes[which] = n;
    return c->scratch[which];
}

/* ---- matmul dispatch ---------------------------------------------------- */

/* Float weights of any width (the fast kernels need cols % 32 == 0). */
__global__ void cb_matmul_generic_kernel(int type, const void *w, int64_t rows, int64_t cols,
                                         const float *x, int64_t x_ld, int T, float *y, int64_t y_ld)
{
    ds4_pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * T) return;
    const int64_t t = i / rows, r = i % rows;
    const float *xt = x + t * x_ld;
    float s = 0.0f;
    for (int64_t c = 0; c < cols; c++) {
        float v;
        if (type == DS4_TYPE_F32) v = ((const float *)w)[r * cols + c];
        else if (type == DS4_TYPE_F16) v = ds4_f16(((const uint16_t *)w)[r * cols + c]);
        else v = ds4_bf16(((const uint16_t *)w)[r * cols + c]);
        s += v * xt[c];
    }
    y[t * y_ld + r] = s;
}

/* Float-weight products with at most this many rows take the matvec for
 * every token count (cb_matmul_raw); DS4_CUDA_SMALL_FMV=0 keeps the GEMM. */
#define CB_FLOAT_MATVEC_MAX_ROWS 1024
static bool cb_small_float_matvec_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_SMALL_FMV", &on);
}

void cb_matmul_raw(ds4_backend *be, ds4_type type, const void *d_w, int64_t rows, int64_t cols,
                   const float *x, int64_t x_ld, int T, float *y, int64_t y_ld)
{
    cuda_backend *c = cb_of(be);
    be->stats.matmul_rows += (uint64_t)rows * (uint64_t)T;
    if (!d_w || T <= 0) return;
    CB_GRAPH_SKIP(be, 1, type, d_w, rows, cols, x, x_ld, T, y, y_ld);
    const bool fast = cols % 32 == 0 && x_ld % 4 == 0 && (uintptr_t)x % 16 == 0;
    const bool is_float = type == DS4_TYPE_F32 || type == DS4_TYPE_F16 || type == DS4_TYPE_BF16;
    if (!fast && is_float) {
        ds4_launch(cb_matmul_generic_kernel, cb_blocks(rows * T, 128), 128, 0, c->cu->stream,
            (int)type, d_w, rows, cols, x, x_ld, T, y, y_ld);
        cb_check_launch(be, "matmul");
        return;
    }
    ds4_status st = DS4_OK;
    if (T <= DS4_CUDA_MATVEC_MAX_TOK) {
        st = ds4_cuda_matvec_ld(c->cu, type, d_w, rows, cols, x, x_ld, T, y, y_ld);
    } else if (is_float && rows <= CB_FLOAT_MATVEC_MAX_ROWS && cb_small_float_matvec_on()) {
        /* Few output rows of float weights (the mHC mixing matrix is 24 x
         * 16384, the router 256 x 4096): cuBLAS's SGEMM runs such a product
         * on a handful of blocks, each walking the whole long row (the
         * per-op profile of a 128-token prefill chunk had hc_pre at 860 us
         * a call). The decode matvec, 4 tokens per pass over the weights
         * (a few MB, L2-resident), gives each token the numbers of its
         * one-token product. */
        if (ds4_cuda_fmv_tall_covers(type, rows, cols, T)) { /* a prefill chunk: the input read once */
            st = ds4_cuda_fmv_tall(c->cu, type, d_w, rows, cols, x, x_ld, T, y, y_ld);
        } else if (ds4_cuda_fmv_active(type, d_w, cols)) { /* every token in one launch */
            st = ds4_cuda_fmv_dense(c->cu, type, d_w, rows, cols, x, x_ld, T, y, y_ld);
        } else {
            for (int t0 = 0; t0 < T && st == DS4_OK; t0 += DS4_CUDA_MATVEC_MAX_TOK) {
                const int nt = T - t0 < DS4_CUDA_MATVEC_MAX_TOK ? T - t0 : DS4_CUDA_MATVEC_MAX_TOK;
                st = ds4_cuda_matvec_ld(c->cu, type, d_w, rows, cols, x + (int64_t)t0 * x_ld, x_ld, nt,
                                        y + (int64_t)t0 * y_ld, y_ld);
            }
        }
    } else if (is_float && type != DS4_TYPE_F32 && cb_small_float_matvec_on() &&
               ds4_cuda_fmv_tall_covers(type, rows, cols, T)) {
        /* F16 / BF16 weights with many rows (the indexer's query product):
         * the tall kernel's tf32 tiles, fp32-grade, where the GEMM below
         * would dequantize them to f32 for an SGEMM */
        st = ds4_cuda_fmv_tall(c->cu, type, d_w, rows, cols, x, x_ld, T, y, y_ld);
    } else {
        /* float weights keep f32 (exact); quantized ones use bf16 tensor cores
         * unless DS4_CUDA_GEMM=f32 */
        ds4_cuda_gemm_precision p = is_float ? DS4_CUDA_GEMM_F32 : c->cu->gemm_precision;
        st = ds4_cuda_gemm_ld(c->cu, type, d_w, rows, cols, x, x_ld, T, y, y_ld, p);
    }
    cb_fail_status(be, st, "matmul");
}

/* ---- memory ------------------------------------------------------------- */

__global__ void cb_fill_kernel(float *d, float v, size_t n)
{
    ds4_pdl_enter();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        d[i] = v;
}

static void *cb_alloc(ds4_backend *be, size_t bytes)
{
    cuda_backend *c = cb_of(be);
    void *d = NULL;
    if (ds4_cuda_malloc(c->cu, bytes, &d) != DS4_OK) return NULL;
    if (cudaMemsetAsync(d, 0, bytes ? bytes : 1, c->cu->stream) != cudaSuccess) {
        ds4_cuda_free(c->cu, d);
        ds4_fail(DS4_ERR_BACKEND, "cuda backend: memset of %zu bytes failed", bytes);
        return NULL;
    }
    return d;
}

static void cb_free(ds4_backend *be, void *p)
{
    cuda_backend *c = cb_of(be);
    if (!p) return;
    cb_sink_flush(be, NULL); /* its memory may be this, and the address reused */
    cudaStreamSynchronize(c->cu->stream);
    ds4_cuda_free(c->cu, p);
    cb_mem_changed(be); /* a later allocation may reuse the address */
}

/* A pending Sinkhorn (cuda_ops_hc.cu) whose matrices lie in [p, p + bytes)
 * runs before memory there is read or written by the host: an op's
 * outputs are what the op says when anyone looks. */
static void cb_sink_before_host(ds4_backend *be, const void *p, size_t bytes)
{
    const cuda_backend *c = cb_of(be);
    const char *a = (const char *)p, *s = (const char *)c->sink.comb;
    if (s && bytes && s < a + bytes && a < s + (size_t)c->sink.T * 16 * sizeof(float)) cb_sink_flush(be, NULL);
}

static void cb_upload(ds4_backend *be, void *dst, const void *src, size_t bytes)
{
    cb_sink_before_host(be, dst, bytes);
    if (bytes) cb_fail_status(be, ds4_cuda_upload(cb_of(be)->cu, dst, src, bytes), "upload");
}

static void cb_download(ds4_backend *be, void *dst, const void *src, size_t bytes)
{
    cuda_backend *c = cb_of(be);
    cb_sink_before_host(be, src, bytes);
    if (bytes) cb_fail_status(be, ds4_cuda_download(c->cu, dst, src, bytes), "download");
    cb_free_transient(c);
}

static void cb_fill(ds4_backend *be, float *dst, float v, size_t n)
{
    if (!n) return;
    ds4_launch(cb_fill_kernel, cb_blocks((int64_t)n, 256) > 4096 ? 4096 : cb_blocks((int64_t)n, 256), 256, 0, cb_stream(be), dst, v, n);
    cb_check_launch(be, "fill");
}

/* One process has one address space per device (the runtime's primary
 * context), so memory of another CUDA backend on the same device is
 * usable as it is; its stream must be drained first (cb_sync). */
static bool cb_shares_memory(const ds4_backend *be, const ds4_backend *other)
{
    return other->alloc == cb_alloc &&
           ((const cuda_backend *)other)->cu->device == ((const cuda_backend *)be)->cu->device;
}

static void cb_sync(ds4_backend *be) { cudaStreamSynchronize(cb_of(be)->cu->stream); }

/* A failure (memory limits, a range already locked) leaves the memory
 * pageable: downloads into it still work, through the driver's staging. */
static void cb_host_pin(ds4_backend *be, void *p, size_t bytes, bool pin)
{
    (void)be;
    if (!p || !bytes) return;
    if ((pin ? cudaHostRegister(p, bytes, cudaHostRegisterPortable) : cudaHostUnregister(p)) != cudaSuccess)
        cudaGetLastError();
}

static void cb_destroy(ds4_backend *be)
{
    if (!be) return;
    cuda_backend *c = cb_of(be);
    cb_free_transient(c);
    cb_graph_destroy(be);
    if (c->profile) {
        double tot = 0;
        for (int i = 0; i < 32 && c->prof[i].name; i++) tot += c->prof[i].seconds;
        fprintf(stderr, "cuda backend profile (op, calls, total ms, us/call, share):\n");
        for (int i = 0; i < 32 && c->prof[i].name; i++)
            fprintf(stderr, "  %-16s %8llu %10.2f %9.1f %5.1f%%\n", c->prof[i].name,
                    (unsigned long long)c->prof[i].calls, c->prof[i].seconds * 1e3,
                    c->prof[i].seconds * 1e6 / (double)(c->prof[i].calls ? c->prof[i].calls : 1),
                    tot > 0 ? 100.0 * c->prof[i].seconds / tot : 0.0);
    }
    cb_ahead_free(c);
    cb_side_free(c);
    cb_pick_free(c);
    cudaStreamSynchronize(c->cu->stream);
    cb_xcache_free(be); /* issue 14 */
    for (size_t i = 0; i < c->w_cap; i++)
        if (c->w[i].key.host) release_copy(c, c->w[i].dev);
    for (int i = 0; i < 4; i++) ds4_cuda_free(c->cu, c->scratch[i]);
    if (c->ticket) ds4_cuda_free(c->cu, c->ticket);
    free(c->w);
    free(c->transient);
    ds4_cuda_close(c->cu);
    free(c);
}

extern "C" ds4_backend *ds4_backend_cuda_create(int device)
{
    ds4_cuda *cu = NULL;
    if (ds4_cuda_open(device, &cu) != DS4_OK) return NULL;
    cuda_backend *c = (cuda_backend *)calloc(1, sizeof *c);
    if (!c) {
        ds4_cuda_close(cu);
        ds4_fail(DS4_ERR_NOMEM, "cuda backend: out of memory");
        return NULL;
    }
    c->cu = cu;
    /* no counters: the router takes its two launches (op_moe_router), q_b
     * and the heads' norm theirs (op_query_rope) */
    const size_t cnt_bytes = 64 + sizeof(unsigned) * CB_HEAD_CNT;
    if (ds4_cuda_malloc(cu, cnt_bytes, (void **)&c->ticket) != DS4_OK ||
        cudaMemsetAsync(c->ticket, 0, cnt_bytes, cu->stream) != cudaSuccess) {
        if (c->ticket) ds4_cuda_free(cu, c->ticket);
        c->ticket = NULL;
        cudaGetLastError();
    }
    c->head_cnt = c->ticket ? c->ticket + 64 / sizeof(unsigned) : NULL;
    const char *pr = getenv("DS4_CUDA_PROFILE");
    c->profile = pr ? atoi(pr) : 0;
    if (c->profile < 0) c->profile = 0;
    const char *at = getenv("DS4_CUDA_ATTN"), *ix = getenv("DS4_CUDA_INDEXER");
    c->attn_split = !(at && strcmp(at, "0") == 0);
    c->indexer_split = !(ix && strcmp(ix, "0") == 0);
    const char *ap = getenv("DS4_CUDA_ATTN_PREFILL");
    c->attn_prefill_min = ap && ap[0] ? atoi(ap) : 256;
    if (c->attn_prefill_min < 0) c->attn_prefill_min = 0;
    const char *mg = getenv("DS4_CUDA_MOE_GROUP_MIN");
    c->moe_group_min = mg && mg[0] ? atoi(mg) : DS4_CUDA_MATVEC_MAX_TOK + 1;
    const char *g = getenv("DS4_CUDA_GEMM");
    if (g && strcmp(g, "f32") == 0) ds4_cuda_set_gemm_precision(cu, DS4_CUDA_GEMM_F32);
    ds4_backend *be = &c->base;
    be->name = "cuda";
    /* 2048-token prefill steps: each expert's weights are read and decoded
     * once per group of up to 64 of its tokens, and 2048 tokens give Flash's
     * 256 experts ~48 each against ~12 at 512 (full Flash q2 on the H200,
     * with 16-token groups then: 1886 against 1439 tokens/s at 2K,
     * docs/BENCHMARKS.md run h), for ~1.5 GB more activation memory (the
     * chunk's logits rows most of it) */
    be->prefill_chunk = 2048;
    be->destroy = cb_destroy;
    be->alloc = cb_alloc;
    be->free = cb_free;
    be->upload = cb_upload;
    be->download = cb_download;
    be->fill = cb_fill;
    be->weight_prepare = cb_weight_prepare;
    be->shares_memory = cb_shares_memory;
    be->sync = cb_sync;
    be->status = cb_status;
    /* DS4_CUDA_HOST_PIN=0: sessions' logits rows stay pageable (A/B) */
    const char *hp = getenv("DS4_CUDA_HOST_PIN");
    if (!(hp && hp[0] == '0')) be->host_pin = cb_host_pin;
    be->set_vram_expert_cache = cb_xcache_set; /* issue 14 */
    cb_install_dense(be);
    cb_install_hc(be);
    cb_install_attention(be);
    cb_install_moe(be);
    cb_install_moe_ahead(be);
    cb_install_side(be);
    cb_install_pick(be);
    cb_graph_init(be);
    return be;
}

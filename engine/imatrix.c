/*
 * imatrix.c - importance-matrix collection (see imatrix.h, docs/QUALITY.md).
 *
 * What is recorded, per weight tensor W (named by its GGUF name) and input
 * column c: the sum over every row vector x that W multiplies of x[c]^2,
 * and how many vectors that was. For the routed experts (3-D tensors) the
 * sums are kept per expert: expert e's gate/up see the tokens routed to e,
 * its down projection sees the SwiGLU output of those tokens. That SwiGLU
 * output lives inside the backend's fused op, so the recorder computes it
 * again on the host with a private CPU backend from the mmapped weights
 * (one slab of the expert tensor is a plain 2-D matrix); the session's own
 * results still come from the real backend, unchanged.
 *
 * Activations are device memory for a GPU backend: they are downloaded
 * (inner->download) before being read, so the same wrapper serves the CPU
 * and CUDA backends. It hides step_begin/step_end, so a CUDA backend runs
 * every op eagerly instead of replaying a recorded graph (a replay would
 * skip the recorder).
 *
 * The file written is llama.cpp's legacy imatrix.dat layout, read by
 * `ds4-quantize --imatrix` (tools/convert_imatrix.h): per entry
 * ncall = the number of prompts and values = mean * ncall, so a reader
 * dividing by ncall gets the per-column mean of x^2; experts get
 * ne0 * n_expert values, expert e at e * ne0.
 */
#include "engine/imatrix.h"

#include "util/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *name;
    int64_t ne0, n_slab;
    double *sum;    /* [n_slab * ne0] */
    int64_t *count; /* [n_slab] vectors seen */
} im_entry;

struct ds4_imatrix {
    im_entry *e;
    int n, cap;
    int64_t n_chunks;
    ds4_status error; /* first failure inside an op (ops return void) */
};

ds4_imatrix *ds4_imatrix_create(void)
{
    ds4_imatrix *im = calloc(1, sizeof *im);
    if (!im) ds4_fail(DS4_ERR_NOMEM, "imatrix: out of memory");
    return im;
}

void ds4_imatrix_free(ds4_imatrix *im)
{
    if (!im) return;
    for (int i = 0; i < im->n; i++) {
        free(im->e[i].name);
        free(im->e[i].sum);
        free(im->e[i].count);
    }
    free(im->e);
    free(im);
}

int ds4_imatrix_n_entries(const ds4_imatrix *im) { return im ? im->n : 0; }

void ds4_imatrix_add_chunk(ds4_imatrix *im)
{
    if (im) im->n_chunks++;
}

static im_entry *entry_for(ds4_imatrix *im, const ds4_weight *w, int64_t ne0, int64_t n_slab)
{
    const char *name = w->name ? w->name : "?";
    for (int i = 0; i < im->n; i++)
        if (strcmp(im->e[i].name, name) == 0) return im->e[i].ne0 == ne0 && im->e[i].n_slab == n_slab ? &im->e[i] : NULL;
    if (im->n == im->cap) {
        int cap = im->cap ? 2 * im->cap : 64;
        im_entry *p = realloc(im->e, (size_t)cap * sizeof *p);
        if (!p) return NULL;
        im->e = p;
        im->cap = cap;
    }
    im_entry *e = &im->e[im->n];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    e->ne0 = ne0;
    e->n_slab = n_slab;
    e->sum = calloc((size_t)(ne0 * n_slab), sizeof *e->sum);
    e->count = calloc((size_t)n_slab, sizeof *e->count);
    if (!e->name || !e->sum || !e->count) {
        free(e->name);
        free(e->sum);
        free(e->count);
        return NULL;
    }
    im->n++;
    return e;
}

/* Add n_vec vectors of ne0 (stride `stride` floats apart) to slab `slab`. */
static void accumulate(im_entry *e, int64_t slab, const float *x, int64_t n_vec, int64_t stride)
{
    double *s = e->sum + slab * e->ne0;
    for (int64_t v = 0; v < n_vec; v++) {
        const float *r = x + v * stride;
        for (int64_t c = 0; c < e->ne0; c++) s[c] += (double)r[c] * (double)r[c];
    }
    e->count[slab] += n_vec;
}

/* ---- the recording backend -------------------------------------------- */

typedef struct {
    ds4_backend base;
    ds4_backend *inner;
    ds4_backend *host; /* CPU backend for the expert SwiGLU recomputation */
    ds4_imatrix *im;
    float *buf;        /* host scratch */
    size_t buf_cap;
} rec_backend;

static rec_backend *rec_of(ds4_backend *be) { return (rec_backend *)be; }

/* The op's counters live in the inner backend; the model reads and writes
 * be->stats of the wrapper, so they are copied across around every call. */
#define IN(r) ((r)->inner->stats = (r)->base.stats, (r)->inner)
#define OUT(r) ((r)->base.stats = (r)->inner->stats)

static float *scratch(rec_backend *r, size_t n)
{
    if (n > r->buf_cap) {
        float *p = realloc(r->buf, n * sizeof *p);
        if (!p) return NULL;
        r->buf = p;
        r->buf_cap = n;
    }
    return r->buf;
}

static void fail_once(rec_backend *r, ds4_status st, const char *what)
{
    if (r->im->error == DS4_OK) r->im->error = ds4_fail(st, "imatrix: %s", what);
}

/* Host copy of n floats of device memory, in r->buf at offset `at`. */
static float *fetch(rec_backend *r, const void *src, size_t at, size_t n)
{
    float *b = scratch(r, at + n);
    if (!b) {
        fail_once(r, DS4_ERR_NOMEM, "out of memory");
        return NULL;
    }
    r->inner->download(r->inner, b + at, src, n * sizeof(float));
    return b + at;
}

static void rec_destroy(ds4_backend *be)
{
    rec_backend *r = rec_of(be);
    if (r->inner) r->inner->destroy(r->inner);
    if (r->host) r->host->destroy(r->host);
    free(r->buf);
    free(r);
}

static void *rec_alloc(ds4_backend *be, size_t bytes) { return rec_of(be)->inner->alloc(rec_of(be)->inner, bytes); }
static void rec_free(ds4_backend *be, void *p) { rec_of(be)->inner->free(rec_of(be)->inner, p); }
static void rec_upload(ds4_backend *be, void *dst, const void *src, size_t n)
{
    rec_of(be)->inner->upload(rec_of(be)->inner, dst, src, n);
}
static void rec_download(ds4_backend *be, void *dst, const void *src, size_t n)
{
    rec_of(be)->inner->download(rec_of(be)->inner, dst, src, n);
}
static void rec_fill(ds4_backend *be, float *dst, float v, size_t n) { rec_of(be)->inner->fill(rec_of(be)->inner, dst, v, n); }
static ds4_status rec_weight_prepare(ds4_backend *be, const ds4_weight *w)
{
    return rec_of(be)->inner->weight_prepare(rec_of(be)->inner, w);
}

static void rec_matmul(ds4_backend *be, const ds4_weight *w, const float *x, int T, float *y)
{
    rec_backend *r = rec_of(be);
    const float *h = fetch(r, x, 0, (size_t)T * (size_t)w->ne[0]);
    im_entry *e = h ? entry_for(r->im, w, w->ne[0], 1) : NULL;
    if (e) accumulate(e, 0, h, T, w->ne[0]);
    else if (h) fail_once(r, DS4_ERR_NOMEM, "out of memory (or a tensor seen with two shapes)");
    ds4_backend *in = IN(r);
    in->matmul(in, w, x, T, y);
    OUT(r);
}

static void rec_matmul_grouped(ds4_backend *be, const ds4_weight *w, int groups, const float *x, int T, float *y)
{
    rec_backend *r = rec_of(be);
    const int64_t cols = w->ne[0];
    const float *h = fetch(r, x, 0, (size_t)T * (size_t)groups * (size_t)cols);
    /* Column c of every group's rows multiplies x[g*cols + c]: each token
     * gives `groups` vectors of ne0. */
    im_entry *e = h ? entry_for(r->im, w, cols, 1) : NULL;
    if (e) accumulate(e, 0, h, (int64_t)T * groups, cols);
    else if (h) fail_once(r, DS4_ERR_NOMEM, "out of memory");
    ds4_backend *in = IN(r);
    in->matmul_grouped(in, w, groups, x, T, y);
    OUT(r);
}

/* A 2-D view of slab e of a 3-D tensor (its rows are contiguous). */
static ds4_weight slab_view(const ds4_weight *w, int64_t e)
{
    ds4_weight v = *w;
    v.n_dims = 2;
    v.ne[2] = 1;
    v.nbytes = w->nbytes / (uint64_t)w->ne[2];
    v.data = (const char *)w->data + (size_t)e * v.nbytes;
    return v;
}

static void swiglu(float *g, const float *u, int64_t n, float clamp)
{
    for (int64_t i = 0; i < n; i++) {
        float gv = g[i] > clamp ? clamp : g[i];
        float uv = u[i] > clamp ? clamp : (u[i] < -clamp ? -clamp : u[i]);
        g[i] = gv / (1.0f + expf(-gv)) * uv;
    }
}

/* Record gate/up (input xs, n rows of D) and down (the SwiGLU of them) for
 * slab `slab` of the three tensors; scratch after xs. */
static void record_ffn(rec_backend *r, const ds4_weight *gate, const ds4_weight *up, const ds4_weight *down,
                       int64_t slab, int64_t n_slab, const float *xs, int64_t n, size_t at, float clamp)
{
    const int64_t D = gate->ne[0], F = gate->ne[1];
    im_entry *eg = entry_for(r->im, gate, D, n_slab), *eu = entry_for(r->im, up, D, n_slab),
             *ed = entry_for(r->im, down, F, n_slab);
    const size_t xoff = (size_t)(xs - r->buf); /* xs lies in r->buf, which scratch() may move */
    float *b = scratch(r, at + (size_t)(2 * n * F));
    if (!eg || !eu || !ed || !b) {
        fail_once(r, DS4_ERR_NOMEM, "out of memory");
        return;
    }
    xs = b + xoff;
    float *g = b + at, *u = g + n * F;
    accumulate(eg, slab, xs, n, D);
    accumulate(eu, slab, xs, n, D);
    ds4_weight gv = n_slab > 1 ? slab_view(gate, slab) : *gate, uv = n_slab > 1 ? slab_view(up, slab) : *up;
    r->host->matmul(r->host, &gv, xs, (int)n, g);
    r->host->matmul(r->host, &uv, xs, (int)n, u);
    swiglu(g, u, n * F, clamp);
    accumulate(ed, slab, g, n, F);
}

static void rec_moe_experts(ds4_backend *be, const ds4_weight *gate, const ds4_weight *up, const ds4_weight *down,
                            const float *x, int T, const int32_t *sel, const float *w, int k, float clamp, float *out,
                            bool accumulate_out)
{
    rec_backend *r = rec_of(be);
    const int64_t D = gate->ne[0], E = gate->ne[2];
    const size_t nx = (size_t)T * (size_t)D, ns = (size_t)T * (size_t)k;
    /* layout of r->buf: x [T*D] | sel [T*k] (int32 bits) | xs [T*k*D] | g, u */
    float *h = fetch(r, x, 0, nx);
    float *sf = h ? fetch(r, sel, nx, ns) : NULL;
    if (sf && scratch(r, nx + ns + ns * (size_t)D)) {
        for (int64_t e = 0; e < E && r->im->error == DS4_OK; e++) {
            const float *xb = r->buf;
            const int32_t *sb = (const int32_t *)(r->buf + nx);
            float *xs = r->buf + nx + ns;
            int64_t n = 0;
            for (size_t i = 0; i < ns; i++)
                if (sb[i] == e) memcpy(xs + (size_t)n++ * (size_t)D, xb + (i / (size_t)k) * (size_t)D, (size_t)D * sizeof(float));
            if (n) record_ffn(r, gate, up, down, e, E, xs, n, nx + ns + (size_t)n * (size_t)D, clamp);
        }
    } else if (sf) {
        fail_once(r, DS4_ERR_NOMEM, "out of memory");
    }
    ds4_backend *in = IN(r);
    in->moe_experts(in, gate, up, down, x, T, sel, w, k, clamp, out, accumulate_out);
    OUT(r);
}

static void rec_ffn_swiglu(ds4_backend *be, const ds4_weight *gate, const ds4_weight *up, const ds4_weight *down,
                           const float *x, int T, float clamp, float *out, bool accumulate_out)
{
    rec_backend *r = rec_of(be);
    const size_t nx = (size_t)T * (size_t)gate->ne[0];
    float *h = fetch(r, x, 0, nx);
    if (h) record_ffn(r, gate, up, down, 0, 1, h, T, nx, clamp);
    ds4_backend *in = IN(r);
    in->ffn_swiglu(in, gate, up, down, x, T, clamp, out, accumulate_out);
    OUT(r);
}

/* ---- plain forwarding of the other ops -------------------------------- */

static void rec_rmsnorm(ds4_backend *be, const float *x, const ds4_weight *w, int64_t n_rows, int n, float eps, float *out)
{
    rec_backend *r = rec_of(be);
    ds4_backend *in = IN(r);
    in->rmsnorm(in, x, w, n_rows, n, eps, out);
    OUT(r);
}
static void rec_rope(ds4_backend *be, float *x, int T, int n_heads, int head_dim, int n_rot, const ds4_weight *omega,
                     int64_t pos0, bool inverse)
{
    rec_backend *r = rec_of(be);
    ds4_backend *in = IN(r);
    in->rope(in, x, T, n_heads, head_dim, n_rot, omega, pos0, inverse);
    OUT(r);
}
static void rec_embed(ds4_backend *be, const ds4_weight *te, const int32_t *tokens, int T, int n_hc, float *X)
{
    rec_backend *r = rec_of(be);
    ds4_backend *in = IN(r);
    in->embed(in, te, tokens, T, n_hc, X);
    OUT(r);
}
static void rec_hc_pre(ds4_backend *be, const float *X, int T, int n_hc, int D, const ds4_weight *fn,
                       const ds4_weight *scale, const ds4_weight *base, int iters, float rms_eps, float hc_eps, float *y,
                       float *post, float *comb)
{
    rec_backend *r = rec_of(be);
    ds4_backend *in = IN(r);
    in->hc_pre(in, X, T, n_hc, D, fn, scale, base, iters, rms_eps, hc_eps, y, post, comb);
    OUT(r);
}
static void rec_hc_post(ds4_backend *be, float *X, int T, int n_hc, int D, const float *F, const float *post,
                        const float *comb)
{
    rec_backend *r = rec_of(be);
    ds4_backend *in = IN(r);
    in->hc_post(in, X, T, n_hc, D, F, post, comb);
    OUT(r);
}
static void rec_hc_head(ds4_backend *be, const float *X, int T, int n_hc, int D, const ds4_weight *fn,
                        const ds4_weight *scale, const ds4_weight *base, float rms_eps, float hc_eps, float *y)
{
    rec_backend *r = rec_of(be);
    ds4_backend *in = IN(r);
    in->hc_head(in, X, T, n_hc, D, fn, scale, base, rms_eps, hc_eps, y);
    OUT(r);
}
static void rec_kv_round(ds4_backend *be, float *x, int64_t n_rows, int row_len, const ds4_kv_numerics *nm)
{
    rec_backend *r = rec_of(be);
    ds4_backend *in = IN(r);
    in->kv_round(in, x, n_rows, row_len, nm);
    OUT(r);
}
static void rec_indexer_qat(ds4_backend *be, float *x, int64_t n_rows, int row_len)
{
    rec_backend *r = rec_of(be);
    ds4_backend *in = IN(r);
    in->indexer_qat(in, x, n_rows, row_len);
    OUT(r);
}
static void rec_compressor_push(ds4_backend *be, ds4_comp_state *st, const float *c, const float *z, int T,
                                int64_t pos0, const ds4_weight *ape, const ds4_weight *norm, float eps,
                                const ds4_weight *omega, int n_rot, const ds4_kv_numerics *nm, bool is_indexer)
{
    rec_backend *r = rec_of(be);
    ds4_backend *in = IN(r);
    in->compressor_push(in, st, c, z, T, pos0, ape, norm, eps, omega, n_rot, nm, is_indexer);
    OUT(r);
}
static void rec_indexer_topk(ds4_backend *be, const float *qi, const float *w, int T, int n_heads, int dim,
                             const float *keys, int64_t pos0, int ratio, int topk, int32_t *sel)
{
    rec_backend *r = rec_of(be);
    ds4_backend *in = IN(r);
    in->indexer_topk(in, qi, w, T, n_heads, dim, keys, pos0, ratio, topk, sel);
    OUT(r);
}
static void rec_attention(ds4_backend *be, const float *q, int T, int n_heads, int hd, const float *kv,
                          const float *ring, int window, int64_t pos0, const float *comp, int ratio,
                          const int32_t *sel, int topk, const ds4_weight *sinks, float *out)
{
    rec_backend *r = rec_of(be);
    ds4_backend *in = IN(r);
    in->attention(in, q, T, n_heads, hd, kv, ring, window, pos0, comp, ratio, sel, topk, sinks, out);
    OUT(r);
}
static void rec_ring_push(ds4_backend *be, float *ring, int window, int hd, const float *kv, int T, int64_t pos0)
{
    rec_backend *r = rec_of(be);
    ds4_backend *in = IN(r);
    in->ring_push(in, ring, window, hd, kv, T, pos0);
    OUT(r);
}
static void rec_moe_route(ds4_backend *be, const float *logits, int T, int n_expert, int k, const ds4_weight *bias,
                          const ds4_weight *tid2eid, const int32_t *tokens, float scale, int32_t *sel, float *w)
{
    rec_backend *r = rec_of(be);
    ds4_backend *in = IN(r);
    in->moe_route(in, logits, T, n_expert, k, bias, tid2eid, tokens, scale, sel, w);
    OUT(r);
}
static bool rec_shares_memory(const ds4_backend *be, const ds4_backend *other)
{
    /* Only with itself: a batched step would bypass the recorder. */
    return be == other;
}

static void rec_sync(ds4_backend *be) { rec_of(be)->inner->sync(rec_of(be)->inner); }
static ds4_status rec_status(ds4_backend *be) { return rec_of(be)->inner->status(rec_of(be)->inner); }

/* Expert streaming: the wrapped backend reads the routed experts from the
 * cache; the recorder's own host recomputation reads the mapped weights. */
static void rec_set_expert_cache(ds4_backend *be, struct ds4_expert_cache *c)
{
    rec_of(be)->inner->set_expert_cache(rec_of(be)->inner, c);
}

ds4_backend *ds4_imatrix_wrap(ds4_imatrix *im, ds4_backend *inner)
{
    rec_backend *r = calloc(1, sizeof *r);
    ds4_backend *host = r ? ds4_backend_cpu_create(0) : NULL;
    if (!r || !host) {
        if (!host && r) ds4_fail(DS4_ERR_NOMEM, "imatrix: cannot create the host backend");
        else ds4_fail(DS4_ERR_NOMEM, "imatrix: out of memory");
        free(r);
        inner->destroy(inner);
        return NULL;
    }
    r->inner = inner;
    r->host = host;
    r->im = im;
    ds4_backend *b = &r->base;
    b->name = inner->name;
    b->stats = inner->stats;
    b->destroy = rec_destroy;
    b->alloc = rec_alloc;
    b->free = rec_free;
    b->upload = rec_upload;
    b->download = rec_download;
    b->fill = rec_fill;
    b->weight_prepare = rec_weight_prepare;
    b->matmul = rec_matmul;
    b->matmul_grouped = rec_matmul_grouped;
    b->rmsnorm = rec_rmsnorm;
    b->rope = rec_rope;
    b->embed = rec_embed;
    b->hc_pre = rec_hc_pre;
    b->hc_post = rec_hc_post;
    b->hc_head = rec_hc_head;
    b->kv_round = rec_kv_round;
    b->indexer_qat = rec_indexer_qat;
    b->compressor_push = rec_compressor_push;
    b->indexer_topk = rec_indexer_topk;
    b->attention = rec_attention;
    b->ring_push = rec_ring_push;
    b->moe_route = rec_moe_route;
    b->moe_experts = rec_moe_experts;
    b->ffn_swiglu = rec_ffn_swiglu;
    b->step_begin = NULL; /* eager ops: a replayed graph would skip the recorder */
    b->step_end = NULL;
    b->step_ahead = NULL;
    b->shares_memory = rec_shares_memory;
    b->sync = inner->sync ? rec_sync : NULL;
    b->status = inner->status ? rec_status : NULL;
    b->set_expert_cache = inner->set_expert_cache ? rec_set_expert_cache : NULL;
    return b;
}

/* ---- writing ----------------------------------------------------------- */

static int put_i32(FILE *f, int32_t v) { return fwrite(&v, 4, 1, f) == 1; }

ds4_status ds4_imatrix_save(const ds4_imatrix *im, const char *path, const char *dataset)
{
    if (!im || im->error != DS4_OK)
        return ds4_fail(im ? im->error : DS4_ERR_INVALID, "imatrix: collection failed earlier, nothing written to %s", path);
    if (im->n == 0 || im->n_chunks == 0)
        return ds4_fail(DS4_ERR_INVALID, "imatrix: nothing collected (no prompt was evaluated), %s not written", path);
    char *tmp = malloc(strlen(path) + 5);
    if (!tmp) return ds4_fail(DS4_ERR_NOMEM, "imatrix: out of memory");
    sprintf(tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        ds4_status st = ds4_fail(DS4_ERR_IO, "imatrix: cannot create %s", tmp);
        free(tmp);
        return st;
    }
    const int32_t ncall = im->n_chunks > INT32_MAX ? INT32_MAX : (int32_t)im->n_chunks;
    int ok = put_i32(f, im->n);
    float *vals = NULL;
    for (int i = 0; ok && i < im->n; i++) {
        const im_entry *e = &im->e[i];
        const int64_t nval = e->ne0 * e->n_slab;
        float *p = realloc(vals, (size_t)nval * sizeof *p);
        if (!p) {
            ok = 0;
            break;
        }
        vals = p;
        /* An expert no prompt routed to gets the mean of the others: the
         * quantizer then weighs its columns like a typical expert's rather
         * than uniformly. */
        int64_t seen = 0;
        for (int64_t s = 0; s < e->n_slab; s++) seen += e->count[s] > 0;
        for (int64_t c = 0; c < e->ne0; c++) {
            double avg = 0;
            for (int64_t s = 0; s < e->n_slab; s++)
                if (e->count[s]) avg += e->sum[s * e->ne0 + c] / (double)e->count[s];
            avg = seen ? avg / (double)seen : 0.0;
            for (int64_t s = 0; s < e->n_slab; s++) {
                double m = e->count[s] ? e->sum[s * e->ne0 + c] / (double)e->count[s] : avg;
                vals[s * e->ne0 + c] = (float)(m * ncall);
            }
        }
        const int32_t len = (int32_t)strlen(e->name);
        ok = put_i32(f, len) && fwrite(e->name, 1, (size_t)len, f) == (size_t)len && put_i32(f, ncall) &&
             put_i32(f, (int32_t)nval) && fwrite(vals, sizeof *vals, (size_t)nval, f) == (size_t)nval;
    }
    free(vals);
    /* llama.cpp's trailer: chunks, then the dataset name. */
    const char *ds = dataset ? dataset : "";
    const int32_t dlen = (int32_t)strlen(ds);
    ok = ok && put_i32(f, ncall) && put_i32(f, dlen) && fwrite(ds, 1, (size_t)dlen, f) == (size_t)dlen;
    if (fclose(f) != 0) ok = 0;
    ds4_status st = DS4_OK;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        st = ds4_fail(DS4_ERR_IO, "imatrix: writing %s failed", path);
    }
    free(tmp);
    return st;
}

int64_t ds4_imatrix_unseen_experts(const ds4_imatrix *im)
{
    int64_t n = 0;
    for (int i = 0; im && i < im->n; i++)
        if (im->e[i].n_slab > 1)
            for (int64_t s = 0; s < im->e[i].n_slab; s++) n += im->e[i].count[s] == 0;
    return n;
}

/*
 * ops_cpu_attention.c - CPU ops for the attention state and math: the
 * compressor frontier (CSA overlap / HCA pooling), the lightning indexer's
 * top-k, the mixed sparse attention with sinks over the raw window ring
 * and the compressed rows, the ring update, and the official-numerics KV
 * rounding. Math: dsv4-model.md §3.4 (attention), §3.5 (compressor),
 * §3.6 (indexer), §4.1 D1-D3 (rounding), §5.1 (state).
 */
#include "backend/cpu/ops_cpu.h"
#include "backend/cpu/attn_simd.h"
#include "quant/fp8.h"
#include "quant/half.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- official rounding (§4.1) ----------------------------------------- */

/* D3: f16 storage of a KV row */
static void f16_round(float *x, int n)
{
    for (int i = 0; i < n; i++) x[i] = ds4_f16_to_f32(ds4_f32_to_f16(x[i]));
}

/* D1 then D3 on one KV row; the model guarantees fp8_nope % 64 == 0 */
static void kv_round_row(float *row, int row_len, const ds4_kv_numerics *nm)
{
    if (nm->fp8_nope > 0) (void)ds4_fp8_kv_roundtrip(row, nm->fp8_nope);
    if (nm->f16_store) f16_round(row, row_len);
}

static void op_kv_round(ds4_backend *be, float *x, int64_t n_rows, int row_len,
                        const ds4_kv_numerics *nm)
{
    (void)be;
    for (int64_t r = 0; r < n_rows; r++) {
        kv_round_row(x + (size_t)r * row_len, row_len, nm);
    }
}

/* D2 (rows of DS4_HADAMARD_N = 128; the model guarantees it) */
static void op_indexer_qat(ds4_backend *be, float *x, int64_t n_rows, int row_len)
{
    (void)be;
    for (int64_t r = 0; r < n_rows; r++) ds4_indexer_qat_row(x + (size_t)r * row_len);
}

/* ---- compressor (§3.5) ------------------------------------------------- */

static void rope_row(float *v, int dim, int n_rot, const float *omega, int64_t pos)
{
    float p = (float)pos;
    for (int i = 0; i < n_rot / 2; i++) {
        float theta = p * omega[i];
        float c = (float)cos((double)theta), s = (float)sin((double)theta);
        float *e = v + dim - n_rot + 2 * i, x0 = e[0], x1 = e[1];
        e[0] = x0 * c - x1 * s;
        e[1] = x0 * s + x1 * c;
    }
}

static void op_compressor_push(ds4_backend *be, ds4_comp_state *st, const float *c,
                               const float *z, int T, int64_t pos0,
                               const ds4_weight *ape, const ds4_weight *norm, float eps,
                               const ds4_weight *omega, int n_rot,
                               const ds4_kv_numerics *nm, bool is_indexer)
{
    int r = st->ratio, od = st->out_dim, win = st->overlap ? 2 * od : od;
    int n_slot = st->overlap ? 2 * r : r;
    float *tmp = cpu_scratch(be, 0, (size_t)(win * r + 2 * od) * sizeof(float));
    const float *ap = cpu_weight_f32(ape, tmp);
    float *zs = tmp + (size_t)win * r, *row = zs + od;
    const float *nw = norm->data;
    (void)n_slot;
    for (int t = 0; t < T; t++) {
        int64_t p = pos0 + t;
        int s = (int)(p % r);
        memcpy(st->buf_c + (size_t)s * win, c + (size_t)t * win, (size_t)win * sizeof(float));
        for (int j = 0; j < win; j++) st->buf_z[(size_t)s * win + j] = z[(size_t)t * win + j] + ap[(size_t)s * win + j];
        be->stats.compressor_pushes++;
        if (s != r - 1) continue;
        /* window w = p / r complete: pool per dimension over its slots */
        int64_t w = p / r;
        for (int d = 0; d < od; d++) {
            float m = -INFINITY;
            for (int k = 0; k < r; k++) {
                float zb = st->buf_z[(size_t)k * win + (st->overlap ? od : 0) + d];
                if (zb > m) m = zb;
                if (st->overlap && st->prev_z[(size_t)k * od + d] > m) m = st->prev_z[(size_t)k * od + d];
            }
            float den = 0, num = 0;
            for (int k = 0; k < r; k++) {
                if (st->overlap) {
                    float e = expf(st->prev_z[(size_t)k * od + d] - m);
                    den += e;
                    num += e * st->prev_c[(size_t)k * od + d];
                }
                size_t at = (size_t)k * win + (st->overlap ? od : 0) + d;
                float e = expf(st->buf_z[at] - m);
                den += e;
                num += e * st->buf_c[at];
            }
            zs[d] = num / den;
        }
        double ss = 0;
        for (int d = 0; d < od; d++) ss += (double)zs[d] * zs[d];
        float rs = (float)(1.0 / sqrt(ss / od + eps));
        for (int d = 0; d < od; d++) row[d] = (zs[d] * rs) * nw[d];
        rope_row(row, od, n_rot, omega->data, p + 1 - r);
        if (is_indexer) {
            if (nm->indexer_qat) ds4_indexer_qat_row(row);
        } else {
            kv_round_row(row, od, nm);
        }
        if (w < st->cap_rows) memcpy(st->rows + (size_t)w * od, row, (size_t)od * sizeof(float));
        be->stats.rows_emitted++;
        if (st->overlap) {
            for (int k = 0; k < r; k++) {
                memcpy(st->prev_c + (size_t)k * od, st->buf_c + (size_t)k * win, (size_t)od * sizeof(float));
                memcpy(st->prev_z + (size_t)k * od, st->buf_z + (size_t)k * win, (size_t)od * sizeof(float));
            }
        }
    }
}

/* ---- indexer top-k (§3.6) ---------------------------------------------- */

typedef struct {
    const float *qi, *w, *keys;
    int n_heads, dim, topk, ratio;
    int64_t pos0;
    int32_t *sel;
    float *score;  /* per thread: max_n floats */
    int32_t *heap; /* per thread: topk ids */
    int64_t max_n;
    ds4_attn_dot_fn dot; /* attn_simd.h: the same bits on every CPU */
} topk_task;

/* "a beats b": higher score, equal scores by lower index */
static int beats(const float *sc, int32_t a, int32_t b)
{
    return sc[a] > sc[b] || (sc[a] == sc[b] && a < b);
}

/* min-heap on "beats": the root is the worst of the kept ids */
static void heap_down(int32_t *h, int n, int i, const float *sc)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && beats(sc, h[m], h[l])) m = l;
        if (r < n && beats(sc, h[m], h[r])) m = r;
        if (m == i) return;
        int32_t x = h[i];
        h[i] = h[m];
        h[m] = x;
        i = m;
    }
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void topk_run(void *arg, int64_t t, int thread)
{
    topk_task *k = arg;
    int64_t n = (k->pos0 + t + 1) / k->ratio;
    int32_t *sel = k->sel + (size_t)t * k->topk;
    if (n <= k->topk) {
        for (int i = 0; i < k->topk; i++) sel[i] = i < n ? i : -1;
        return;
    }
    float *sc = k->score + (size_t)thread * k->max_n;
    int32_t *h = k->heap + (size_t)thread * k->topk;
    const float *q = k->qi + (size_t)t * k->n_heads * k->dim, *wt = k->w + (size_t)t * k->n_heads;
    for (int64_t s = 0; s < n; s++) {
        const float *key = k->keys + (size_t)s * k->dim;
        float acc = 0;
        for (int hh = 0; hh < k->n_heads; hh++) {
            float dot = k->dot(q + (size_t)hh * k->dim, key, k->dim);
            if (dot > 0) acc += wt[hh] * dot;
        }
        sc[s] = acc;
    }
    int m = 0;
    for (int64_t s = 0; s < n; s++) {
        if (m < k->topk) {
            h[m++] = (int32_t)s;
            if (m == k->topk)
                for (int i = m / 2 - 1; i >= 0; i--) heap_down(h, m, i, sc);
        } else if (beats(sc, (int32_t)s, h[0])) {
            h[0] = (int32_t)s;
            heap_down(h, m, 0, sc);
        }
    }
    qsort(h, (size_t)m, sizeof *h, cmp_i32);
    memcpy(sel, h, (size_t)m * sizeof *h);
}

static void op_indexer_topk(ds4_backend *be, const float *qi, const float *w, int T,
                            int n_heads, int dim, const float *keys, int64_t pos0,
                            int ratio, int topk, int32_t *sel)
{
    topk_task k = {qi, w, keys, n_heads, dim, topk, ratio, pos0, sel, NULL, NULL, 0, ds4_attn_dot_best()};
    k.max_n = (pos0 + T) / ratio + 1;
    int slots = cpu_thread_slots(be);
    k.score = cpu_scratch(be, 0, (size_t)slots * ((size_t)k.max_n * sizeof(float) + (size_t)topk * sizeof(int32_t)));
    k.heap = (int32_t *)(k.score + (size_t)slots * k.max_n);
    for (int t = 0; t < T; t++) {
        int64_t n = (pos0 + t + 1) / ratio;
        if (n > topk) be->stats.indexer_keys_scored += (uint64_t)n;
    }
    cpu_parallel(be, T, topk_run, &k);
}

/* ---- mixed attention with sinks (§3.4) -------------------------------- */

typedef struct {
    const float *q, *kv, *ring, *comp, *sinks;
    const int32_t *sel;
    int T, n_heads, hd, window, ratio, topk;
    int64_t pos0;
    float *out;
    float *scores; /* per thread: max_rows */
    const float **rows; /* per thread: max_rows pointers */
    int64_t max_rows;
    ds4_attn_dot_fn dot; /* attn_simd.h: the same bits on every CPU */
    ds4_attn_axpy_fn axpy;
} attn_task;

static void attn_run(void *arg, int64_t task, int thread)
{
    attn_task *a = arg;
    int t = (int)(task / a->n_heads), h = (int)(task % a->n_heads);
    int64_t p = a->pos0 + t;
    const float *q = a->q + ((size_t)t * a->n_heads + h) * a->hd;
    float *sc = a->scores + (size_t)thread * a->max_rows;
    const float **rows = a->rows + (size_t)thread * a->max_rows;
    int64_t n = 0;
    int64_t lo = p - a->window + 1 < 0 ? 0 : p - a->window + 1;
    for (int64_t pp = lo; pp <= p; pp++)
        rows[n++] = pp >= a->pos0 ? a->kv + (size_t)(pp - a->pos0) * a->hd
                                  : a->ring + (size_t)(pp % a->window) * a->hd;
    if (a->ratio) {
        if (a->sel) {
            const int32_t *s = a->sel + (size_t)t * a->topk;
            for (int i = 0; i < a->topk && s[i] >= 0; i++) rows[n++] = a->comp + (size_t)s[i] * a->hd;
        } else {
            int64_t nv = (p + 1) / a->ratio;
            for (int64_t w = 0; w < nv; w++) rows[n++] = a->comp + (size_t)w * a->hd;
        }
    }
    float scale = 1.0f / sqrtf((float)a->hd), sink = a->sinks[h], m = sink;
    for (int64_t i = 0; i < n; i++) {
        sc[i] = a->dot(q, rows[i], a->hd) * scale;
        if (sc[i] > m) m = sc[i];
    }
    float den = expf(sink - m);
    for (int64_t i = 0; i < n; i++) den += (sc[i] = expf(sc[i] - m));
    float *o = a->out + ((size_t)t * a->n_heads + h) * a->hd;
    memset(o, 0, (size_t)a->hd * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        a->axpy(o, sc[i] / den, rows[i], a->hd);
    }
}

static void op_attention(ds4_backend *be, const float *q, int T, int n_heads, int hd,
                         const float *kv, const float *ring, int window, int64_t pos0,
                         const float *comp, int ratio, const int32_t *sel, int topk,
                         const ds4_weight *sinks, float *out)
{
    attn_task a = {q, kv, ring, comp, sinks->data, sel, T, n_heads, hd, window, ratio, topk,
                   pos0, out, NULL, NULL, 0, ds4_attn_dot_best(), ds4_attn_axpy_best()};
    int64_t max_comp = ratio ? (sel ? topk : (pos0 + T) / ratio) : 0;
    a.max_rows = window + max_comp;
    int slots = cpu_thread_slots(be);
    /* pointers first: they need 8-byte alignment, the floats after them 4 */
    a.rows = cpu_scratch(be, 0, (size_t)slots * (size_t)a.max_rows * (sizeof(float) + sizeof(float *)));
    a.scores = (float *)(a.rows + (size_t)slots * a.max_rows);
    for (int t = 0; t < T; t++) {
        int64_t p = pos0 + t, raw = p + 1 < window ? p + 1 : window, nc = 0;
        if (ratio && sel) {
            for (int i = 0; i < topk && sel[(size_t)t * topk + i] >= 0; i++) nc++;
        } else if (ratio) {
            nc = (p + 1) / ratio;
        }
        be->stats.rows_attended += (uint64_t)(raw + nc);
    }
    cpu_parallel(be, (int64_t)T * n_heads, attn_run, &a);
}

static void op_ring_push(ds4_backend *be, float *ring, int window, int hd,
                         const float *kv, int T, int64_t pos0)
{
    (void)be;
    int first = T > window ? T - window : 0;
    for (int t = first; t < T; t++)
        memcpy(ring + (size_t)((pos0 + t) % window) * hd, kv + (size_t)t * hd, (size_t)hd * sizeof(float));
}

void cpu_install_attention(ds4_backend *be)
{
    be->kv_round = op_kv_round;
    be->indexer_qat = op_indexer_qat;
    be->compressor_push = op_compressor_push;
    be->indexer_topk = op_indexer_topk;
    be->attention = op_attention;
    be->ring_push = op_ring_push;
}

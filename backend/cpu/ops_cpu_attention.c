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

/* All heads of a token against one key at a time (attn_simd.h dots: the
 * key row is read once for 16 heads, and the 16 partial sums of 16 heads
 * are added together), the score summed over heads in head order as the
 * definition does, so the scores and the selection keep their bits. */
typedef struct {
    const float *qi, *w, *keys;
    int n_heads, dim, topk, ratio, split;
    int64_t pos0;
    int32_t *sel;
    float *score;  /* per thread (split 1) or per token (split > 1): max_n floats */
    int32_t *heap; /* per thread: topk ids */
    float *qt;     /* per thread: the token's heads transposed, ng x dim x 16 */
    int64_t max_n;
    ds4_attn_dots_fn dots;
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

static int64_t topk_keys(const topk_task *k, int64_t t) { return (k->pos0 + t + 1) / k->ratio; }

/* Heads in group g of DS4_ATTN_HEADS (the last group may be partial). */
static int group_heads(int n_heads, int g)
{
    return n_heads - g * DS4_ATTN_HEADS < DS4_ATTN_HEADS ? n_heads - g * DS4_ATTN_HEADS : DS4_ATTN_HEADS;
}

/* Scores of keys [s0, s1) of token t into sc. The token's heads are
 * transposed here, once per call (a split decode does it once per part:
 * 64 x 128 floats against thousands of keys). */
static void topk_score(const topk_task *k, int64_t t, int64_t s0, int64_t s1, float *sc, float *qt)
{
    const int G = DS4_ATTN_HEADS, ng = (k->n_heads + G - 1) / G;
    const float *q = k->qi + (size_t)t * k->n_heads * k->dim, *wt = k->w + (size_t)t * k->n_heads;
    for (int g = 0; g < ng; g++) {
        int nh = group_heads(k->n_heads, g);
        ds4_attn_transpose(q + (size_t)g * G * k->dim, (size_t)k->dim, nh, k->dim, qt + (size_t)g * k->dim * G);
    }
    float dots[DS4_ATTN_HEADS];
    for (int64_t s = s0; s < s1; s++) {
        const float *key = k->keys + (size_t)s * k->dim;
        float acc = 0; /* summed over heads in head order: groups in order, heads in order in a group */
        for (int g = 0; g < ng; g++) {
            int nh = group_heads(k->n_heads, g);
            k->dots(qt + (size_t)g * k->dim * G, nh, key, k->dim, dots);
            for (int h = 0; h < nh; h++)
                if (dots[h] > 0) acc += wt[g * G + h] * dots[h];
        }
        sc[s] = acc;
    }
}

/* The topk best of n scores (score descending, index ascending), in
 * index order, into sel. */
static void topk_select(const topk_task *k, int64_t n, const float *sc, int32_t *h, int32_t *sel)
{
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

static size_t topk_qt_floats(const topk_task *k)
{
    return (size_t)((k->n_heads + DS4_ATTN_HEADS - 1) / DS4_ATTN_HEADS) * (size_t)k->dim * DS4_ATTN_HEADS;
}

/* A token that sees at most topk keys selects them all (-1 padded): 1. */
static int topk_all(const topk_task *k, int64_t t, int64_t n)
{
    if (n > k->topk) return 0;
    int32_t *sel = k->sel + (size_t)t * k->topk;
    for (int i = 0; i < k->topk; i++) sel[i] = i < n ? i : -1;
    return 1;
}

/* One token: score every key, then select (split 1). */
static void topk_run(void *arg, int64_t t, int thread)
{
    topk_task *k = arg;
    int64_t n = topk_keys(k, t);
    if (topk_all(k, t, n)) return;
    float *sc = k->score + (size_t)thread * k->max_n;
    topk_score(k, t, 0, n, sc, k->qt + (size_t)thread * topk_qt_floats(k));
    topk_select(k, n, sc, k->heap + (size_t)thread * k->topk, k->sel + (size_t)t * k->topk);
}

/* Fewer tokens than threads (decode): each token's keys in `split` parts
 * over the threads, into the token's own score row; then topk_pick. */
static void topk_score_part(void *arg, int64_t task, int thread)
{
    topk_task *k = arg;
    int64_t t = task / k->split, c = task % k->split, n = topk_keys(k, t);
    if (n <= k->topk) return;
    int64_t s0 = n * c / k->split, s1 = n * (c + 1) / k->split;
    topk_score(k, t, s0, s1, k->score + (size_t)t * k->max_n, k->qt + (size_t)thread * topk_qt_floats(k));
}

static void topk_pick(void *arg, int64_t t, int thread)
{
    topk_task *k = arg;
    int64_t n = topk_keys(k, t);
    if (topk_all(k, t, n)) return;
    topk_select(k, n, k->score + (size_t)t * k->max_n, k->heap + (size_t)thread * k->topk, k->sel + (size_t)t * k->topk);
}

static void op_indexer_topk(ds4_backend *be, const float *qi, const float *w, int T,
                            int n_heads, int dim, const float *keys, int64_t pos0,
                            int ratio, int topk, int32_t *sel)
{
    topk_task k = {qi, w, keys, n_heads, dim, topk, ratio, 1, pos0, sel, NULL, NULL, NULL, 0, ds4_attn_dots_best()};
    k.max_n = (pos0 + T) / ratio + 1;
    int slots = cpu_thread_slots(be);
    /* a token's scores stay in one row per thread unless there are fewer
       tokens than threads: then a row per token, its keys split 4 ways a
       thread (T < slots bounds the rows to the thread count) */
    if (T < slots && slots > 1) k.split = (slots * 4 + T - 1) / T;
    size_t score_rows = k.split > 1 ? (size_t)T : (size_t)slots;
    size_t bytes = score_rows * (size_t)k.max_n * sizeof(float) + (size_t)slots * topk_qt_floats(&k) * sizeof(float) +
                   (size_t)slots * (size_t)topk * sizeof(int32_t);
    k.score = cpu_scratch(be, 0, bytes);
    k.qt = k.score + score_rows * (size_t)k.max_n;
    k.heap = (int32_t *)(k.qt + (size_t)slots * topk_qt_floats(&k));
    for (int t = 0; t < T; t++) {
        int64_t n = topk_keys(&k, t);
        if (n > topk) be->stats.indexer_keys_scored += (uint64_t)n;
    }
    if (k.split > 1) {
        cpu_parallel(be, (int64_t)T * k.split, topk_score_part, &k);
        cpu_parallel(be, T, topk_pick, &k);
    } else {
        cpu_parallel(be, T, topk_run, &k);
    }
}

/* ---- mixed attention with sinks (§3.4) -------------------------------- */

/* A task is one token and a group of up to 16 heads (DS4_ATTN_HEADS): the
 * heads share the rows they attend (one compressed KV row per position),
 * so each row is read once for the group, its 16 scores found together
 * (attn_simd.h dots), and its weighted value added to the group's 16
 * outputs while it is in cache. Per head, the scores, the softmax and the
 * order in which rows are added are the definition's, so the bits are. */
typedef struct {
    const float *q, *kv, *ring, *comp, *sinks;
    const int32_t *sel;
    int T, n_heads, hd, window, ratio, topk;
    int64_t pos0;
    float *out;
    float *scores; /* per thread: 16 x max_rows */
    float *qt;     /* per thread: hd x 16 */
    const float **rows; /* per thread: max_rows pointers */
    int64_t max_rows;
    ds4_attn_dots_fn dots;
    ds4_attn_axpy_fn axpy;
} attn_task;

static void attn_run(void *arg, int64_t task, int thread)
{
    attn_task *a = arg;
    const int G = DS4_ATTN_HEADS, ng = (a->n_heads + G - 1) / G;
    int t = (int)(task / ng), h0 = (int)(task % ng) * G;
    int nh = group_heads(a->n_heads, h0 / G);
    int64_t p = a->pos0 + t;
    float *sc = a->scores + (size_t)thread * G * a->max_rows;
    float *qt = a->qt + (size_t)thread * a->hd * G;
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
    ds4_attn_transpose(a->q + ((size_t)t * a->n_heads + h0) * a->hd, (size_t)a->hd, nh, a->hd, qt);
    float scale = 1.0f / sqrtf((float)a->hd), d[DS4_ATTN_HEADS], den[DS4_ATTN_HEADS];
    for (int64_t i = 0; i < n; i++) {
        a->dots(qt, nh, rows[i], a->hd, d);
        for (int h = 0; h < nh; h++) sc[(size_t)h * a->max_rows + i] = d[h] * scale;
    }
    for (int h = 0; h < nh; h++) {
        float *s = sc + (size_t)h * a->max_rows, sink = a->sinks[h0 + h], m = sink;
        for (int64_t i = 0; i < n; i++)
            if (s[i] > m) m = s[i];
        den[h] = expf(sink - m);
        for (int64_t i = 0; i < n; i++) den[h] += (s[i] = expf(s[i] - m));
    }
    float *o = a->out + ((size_t)t * a->n_heads + h0) * a->hd;
    memset(o, 0, (size_t)nh * a->hd * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        for (int h = 0; h < nh; h++) a->axpy(o + (size_t)h * a->hd, sc[(size_t)h * a->max_rows + i] / den[h], rows[i], a->hd);
}

static void op_attention(ds4_backend *be, const float *q, int T, int n_heads, int hd,
                         const float *kv, const float *ring, int window, int64_t pos0,
                         const float *comp, int ratio, const int32_t *sel, int topk,
                         const ds4_weight *sinks, float *out)
{
    attn_task a = {q, kv, ring, comp, sinks->data, sel, T, n_heads, hd, window, ratio, topk,
                   pos0, out, NULL, NULL, NULL, 0, ds4_attn_dots_best(), ds4_attn_axpy_best()};
    int64_t max_comp = ratio ? (sel ? topk : (pos0 + T) / ratio) : 0;
    a.max_rows = window + max_comp;
    int slots = cpu_thread_slots(be);
    const size_t G = DS4_ATTN_HEADS;
    /* pointers first: they need 8-byte alignment, the floats after them 4 */
    a.rows = cpu_scratch(be, 0, (size_t)slots * ((size_t)a.max_rows * (sizeof(float *) + G * sizeof(float)) +
                                                 (size_t)hd * G * sizeof(float)));
    a.scores = (float *)(a.rows + (size_t)slots * a.max_rows);
    a.qt = a.scores + (size_t)slots * G * a.max_rows;
    for (int t = 0; t < T; t++) {
        int64_t p = pos0 + t, raw = p + 1 < window ? p + 1 : window, nc = 0;
        if (ratio && sel) {
            for (int i = 0; i < topk && sel[(size_t)t * topk + i] >= 0; i++) nc++;
        } else if (ratio) {
            nc = (p + 1) / ratio;
        }
        be->stats.rows_attended += (uint64_t)(raw + nc);
    }
    cpu_parallel(be, (int64_t)T * ((n_heads + DS4_ATTN_HEADS - 1) / DS4_ATTN_HEADS), attn_run, &a);
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

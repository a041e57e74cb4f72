/*
 * test_cpu_attention.c - the CPU backend's attention and indexer top-k
 * (backend/cpu/ops_cpu_attention.c, which scores a group of heads against
 * each key row at once) against the ops.h contract written out here head
 * by head: the dot product as the project defines it (16 partial sums,
 * lane i mod 16, added in lane order, then the tail; attn_simd.h), the
 * softmax with the sink logit, the rows added in the order they are
 * attended (the window's raw rows by position, then the compressed rows
 * in selection order), and the indexer's score sum_h w relu(q.k) in head
 * order with the top-k by score descending, index ascending (§3.6). Bit
 * for bit, with head counts that are and are not multiples of 16, on 1
 * and 2 threads, for one token (decode: the keys are split over threads)
 * and for several.
 */
#include "backend/cpu/ops_cpu.h"
#include "tests/test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint32_t rng = 977u;
static float rnd(void)
{
    rng = rng * 1664525u + 1013904223u;
    return (float)((int)(rng >> 9) % 2001 - 1000) * 1e-3f;
}

static float def_dot(const float *a, const float *b, int n)
{
    float lane[16] = {0};
    int full = n / 16 * 16;
    for (int i = 0; i < full; i++) lane[i % 16] = lane[i % 16] + a[i] * b[i];
    float s = 0;
    for (int k = 0; k < 16; k++) s = s + lane[k];
    for (int i = full; i < n; i++) s = s + a[i] * b[i];
    return s;
}

static float *rnd_array(size_t n, float scale)
{
    float *x = malloc(n * sizeof(float));
    if (!x) abort();
    for (size_t i = 0; i < n; i++) x[i] = rnd() * scale;
    return x;
}

/* The contract, one query head at a time. */
static void ref_attention(const float *q, int T, int nh, int hd, const float *kv, const float *ring, int window,
                          int64_t pos0, const float *comp, int ratio, const int32_t *sel, int topk,
                          const float *sinks, float *out)
{
    const float **rows = malloc(sizeof(float *) * (size_t)(window + (pos0 + T) / (ratio ? ratio : 1) + topk + 1));
    float *sc = malloc(sizeof(float) * (size_t)(window + (pos0 + T) + topk + 1));
    if (!rows || !sc) abort();
    for (int t = 0; t < T; t++) {
        int64_t p = pos0 + t, n = 0, lo = p - window + 1 < 0 ? 0 : p - window + 1;
        for (int64_t pp = lo; pp <= p; pp++)
            rows[n++] = pp >= pos0 ? kv + (size_t)(pp - pos0) * hd : ring + (size_t)(pp % window) * hd;
        if (ratio && sel)
            for (int i = 0; i < topk && sel[(size_t)t * topk + i] >= 0; i++) rows[n++] = comp + (size_t)sel[(size_t)t * topk + i] * hd;
        else if (ratio)
            for (int64_t w = 0; w < (p + 1) / ratio; w++) rows[n++] = comp + (size_t)w * hd;
        for (int h = 0; h < nh; h++) {
            const float *qh = q + ((size_t)t * nh + h) * hd;
            float scale = 1.0f / sqrtf((float)hd), m = sinks[h];
            for (int64_t i = 0; i < n; i++) {
                sc[i] = def_dot(qh, rows[i], hd) * scale;
                if (sc[i] > m) m = sc[i];
            }
            float den = expf(sinks[h] - m);
            for (int64_t i = 0; i < n; i++) {
                sc[i] = expf(sc[i] - m);
                den = den + sc[i];
            }
            float *o = out + ((size_t)t * nh + h) * hd;
            for (int d = 0; d < hd; d++) o[d] = 0;
            for (int64_t i = 0; i < n; i++) {
                float w = sc[i] / den;
                for (int d = 0; d < hd; d++) o[d] = o[d] + w * rows[i][d];
            }
        }
    }
    free(rows);
    free(sc);
}

static void check_attention(int T, int nh, int hd, int64_t pos0, int use_sel)
{
    const int window = 128, ratio = 4, topk = 8;
    int64_t ncomp = (pos0 + T) / ratio;
    float *q = rnd_array((size_t)T * nh * hd, 1.0f), *kv = rnd_array((size_t)T * hd, 1.0f);
    float *ring = rnd_array((size_t)window * hd, 1.0f), *comp = rnd_array((size_t)(ncomp + 1) * hd, 1.0f);
    float *sinks = rnd_array((size_t)nh, 2.0f), *want = malloc(sizeof(float) * (size_t)T * nh * hd);
    float *got = malloc(sizeof(float) * (size_t)T * nh * hd);
    int32_t *sel = malloc(sizeof(int32_t) * (size_t)T * topk);
    if (!want || !got || !sel) abort();
    for (int t = 0; t < T; t++) { /* ascending ids below the token's count, the last query -1 padded */
        int64_t n = (pos0 + t + 1) / ratio;
        int k = 0;
        for (int64_t w = t % 3; w < n && k < topk - (t == T - 1); w += 1 + (w % 5)) sel[(size_t)t * topk + k++] = (int32_t)w;
        while (k < topk) sel[(size_t)t * topk + k++] = -1;
    }
    ref_attention(q, T, nh, hd, kv, ring, window, pos0, comp, ratio, use_sel ? sel : NULL, topk, sinks, want);
    ds4_weight ws = {"sinks", DS4_TYPE_F32, 1, {nh, 1, 1, 1}, sinks, (uint64_t)nh * 4};
    for (int threads = 1; threads <= 2; threads++) {
        ds4_backend *be = ds4_backend_cpu_create(threads);
        REQUIRE(be);
        memset(got, 0xff, sizeof(float) * (size_t)T * nh * hd);
        be->attention(be, q, T, nh, hd, kv, ring, window, pos0, comp, ratio, use_sel ? sel : NULL, topk, &ws, got);
        EXPECT_MSG(!memcmp(want, got, sizeof(float) * (size_t)T * nh * hd),
                   "attention T=%d heads=%d hd=%d pos0=%lld sel=%d threads=%d: other bits", T, nh, hd,
                   (long long)pos0, use_sel, threads);
        be->destroy(be);
    }
    free(q), free(kv), free(ring), free(comp), free(sinks), free(want), free(got), free(sel);
}

static void test_attention_matches_contract(void)
{
    check_attention(1, 64, 512, 300, 1);  /* decode at Flash's shapes */
    check_attention(3, 64, 512, 300, 1);
    check_attention(2, 20, 64, 9, 0);     /* a partial head group; dense compressed rows */
    check_attention(5, 16, 72, 130, 1);   /* head size with a tail past the 16-blocks */
    check_attention(1, 3, 512, 0, 0);
}

/* The indexer's contract: score, then the topk best (score descending,
 * index ascending), listed in ascending order, -1 padded. */
static void ref_topk(const float *qi, const float *w, int T, int nh, int dim, const float *keys, int64_t pos0,
                     int ratio, int topk, int32_t *sel)
{
    for (int t = 0; t < T; t++) {
        int64_t n = (pos0 + t + 1) / ratio;
        int32_t *out = sel + (size_t)t * topk;
        if (n <= topk) {
            for (int i = 0; i < topk; i++) out[i] = i < n ? i : -1;
            continue;
        }
        float *sc = malloc(sizeof(float) * (size_t)n);
        char *taken = calloc((size_t)n, 1);
        if (!sc || !taken) abort();
        for (int64_t s = 0; s < n; s++) {
            float acc = 0;
            for (int h = 0; h < nh; h++) {
                float d = def_dot(qi + ((size_t)t * nh + h) * dim, keys + (size_t)s * dim, dim);
                if (d > 0) acc = acc + w[(size_t)t * nh + h] * d;
            }
            sc[s] = acc;
        }
        for (int k = 0; k < topk; k++) { /* the best not taken: higher score, then lower index */
            int64_t b = -1;
            for (int64_t s = 0; s < n; s++)
                if (!taken[s] && (b < 0 || sc[s] > sc[b])) b = s;
            taken[b] = 1;
        }
        int k = 0;
        for (int64_t s = 0; s < n; s++)
            if (taken[s]) out[k++] = (int32_t)s;
        free(sc);
        free(taken);
    }
}

static void check_topk(int T, int nh, int dim, int64_t pos0, int topk)
{
    const int ratio = 4;
    int64_t n = (pos0 + T) / ratio;
    float *qi = rnd_array((size_t)T * nh * dim, 1.0f), *w = rnd_array((size_t)T * nh, 1.0f);
    float *keys = rnd_array((size_t)(n + 1) * dim, 1.0f);
    /* ties: some keys repeat an earlier one, and some score 0 for every head */
    for (int64_t s = 7; s < n; s += 11) memcpy(keys + (size_t)s * dim, keys + (size_t)(s - 5) * dim, sizeof(float) * (size_t)dim);
    for (int64_t s = 3; s < n; s += 13) memset(keys + (size_t)s * dim, 0, sizeof(float) * (size_t)dim);
    int32_t *want = malloc(sizeof(int32_t) * (size_t)T * topk), *got = malloc(sizeof(int32_t) * (size_t)T * topk);
    if (!want || !got) abort();
    ref_topk(qi, w, T, nh, dim, keys, pos0, ratio, topk, want);
    for (int threads = 1; threads <= 2; threads++) {
        ds4_backend *be = ds4_backend_cpu_create(threads);
        REQUIRE(be);
        memset(got, 0x7f, sizeof(int32_t) * (size_t)T * topk);
        be->indexer_topk(be, qi, w, T, nh, dim, keys, pos0, ratio, topk, got);
        EXPECT_MSG(!memcmp(want, got, sizeof(int32_t) * (size_t)T * topk),
                   "indexer top-k T=%d heads=%d dim=%d pos0=%lld topk=%d threads=%d: other rows", T, nh, dim,
                   (long long)pos0, topk, threads);
        be->destroy(be);
    }
    free(qi), free(w), free(keys), free(want), free(got);
}

static void test_indexer_matches_contract(void)
{
    check_topk(1, 64, 128, 4000, 64); /* decode at Flash's head shapes: keys split over threads */
    check_topk(4, 64, 128, 2000, 32);
    check_topk(3, 20, 40, 600, 16);   /* a partial head group, a dim with a tail */
    check_topk(2, 64, 128, 10, 8);    /* fewer keys than topk: all, -1 padded */
}

int main(void)
{
    RUN(test_attention_matches_contract);
    RUN(test_indexer_matches_contract);
    return test_finish();
}

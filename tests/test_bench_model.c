/*
 * test_bench_model.c - the frontier walk of ds4-bench's model mode
 * (bench/bench_model.c) on a tiny synthetic model with the real tokenizer.
 *
 *   - The frontier sequence for linear and multiplicative steps (the
 *     documented H200 sweep 2048..65536 step 2048 has 32 rows).
 *   - The greedy probe never picks EOS.
 *   - After every gen probe + restore (and the --batch-sessions probe on
 *     sessions of their own) the session is the one that never
 *     decoded: its snapshot bytes and logits equal those of a reference
 *     session fed the same token intervals and no probe, and its logits
 *     match a fresh session prefilled from 0 to the frontier in one call.
 *   - Rows: ctx are the frontiers, prefill_tokens the intervals,
 *     kvcache_bytes the snapshot size (growing with ctx), weight bytes
 *     per token ds4_model_weight_bytes_per_token(ctx + 1), roofline =
 *     bandwidth / that.
 */
#include "bench/bench_model.h"
#include "include/ds4.h"
#include "include/ds4_tokenizer.h"
#include "tests/test.h"
#include "tools/convert_run.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void test_frontiers(void)
{
    bench_model_opts o = {.ctx_start = 2048, .ctx_max = 65536, .step_incr = 2048, .step_mul = 1.0};
    int n = 0;
    int64_t f = o.ctx_start, last = 0;
    for (;; f = bench_model_next_frontier(&o, f)) {
        EXPECT(f == 2048 * (int64_t)(n + 1));
        n++, last = f;
        if (f >= o.ctx_max || n > 100) break;
    }
    EXPECT(n == 32 && last == 65536);
    bench_model_opts m = {.ctx_start = 256, .ctx_max = 2000, .step_incr = 1, .step_mul = 2.0};
    int64_t want[] = {256, 512, 1024, 2000};
    f = m.ctx_start;
    for (int i = 0; i < 4; i++, f = bench_model_next_frontier(&m, f)) EXPECT(f == want[i]);
    EXPECT(bench_model_next_frontier(&m, 2000) == 2000);
    bench_model_opts s = {.ctx_start = 3, .ctx_max = 10, .step_mul = 1.1};
    EXPECT(bench_model_next_frontier(&s, 3) == 4); /* ceil(3.3), and never stuck */
    EXPECT(bench_model_next_frontier(&s, 9) == 10);
}

static void test_argmax_excluding(void)
{
    float l[5] = {0.5f, 9.0f, -1.0f, 3.0f, 3.0f};
    EXPECT(bench_model_argmax_excluding(l, 5, 1) == 3);
    EXPECT(bench_model_argmax_excluding(l, 5, 0) == 1);
    EXPECT(bench_model_argmax_excluding(l, 1, 0) == -1);
}

typedef struct {
    ds4_model *m;
    ds4_session *ref;
    const int32_t *tokens;
    int64_t prev;
    int rows, bad_snap, bad_logits;
    double max_fresh_diff;
} hook_ctx;

static int hook(void *vctx, ds4_session *s, const bench_model_row *row)
{
    hook_ctx *h = vctx;
    int V = ds4_model_n_vocab(h->m);
    h->rows++;
    /* reference: the same intervals, never a probe */
    if (ds4_session_prefill(h->ref, h->tokens + h->prev, row->ctx - h->prev, NULL) != DS4_OK) return 7;
    h->prev = row->ctx;
    void *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    if (ds4_session_snapshot(s, &a, &na) != DS4_OK || ds4_session_snapshot(h->ref, &b, &nb) != DS4_OK) return 8;
    if (na != nb || memcmp(a, b, na) != 0 || na != row->kvcache_bytes) h->bad_snap++;
    free(a);
    free(b);
    const float *ls = ds4_session_logits(s), *lr = ds4_session_logits(h->ref);
    if (!ls || !lr || memcmp(ls, lr, (size_t)V * sizeof(float)) != 0) h->bad_logits++;
    /* a fresh session, prefilled 0..ctx in one call */
    ds4_session_params p;
    ds4_session_params_default(&p);
    p.n_ctx = row->ctx + 8;
    p.n_threads = 1;
    p.backend = DS4_BACKEND_CPU; /* the walk runs on the CPU (o.backend); on a GPU machine AUTO would not */
    ds4_session *fresh = ds4_session_create(h->m, &p);
    if (!fresh || ds4_session_prefill(fresh, h->tokens, row->ctx, NULL) != DS4_OK) {
        ds4_session_free(fresh);
        return 9;
    }
    const float *lf = ds4_session_logits(fresh);
    double scale = 0;
    for (int i = 0; i < V; i++) {
        double d = fabs((double)lf[i] - ls[i]);
        if (!(d <= h->max_fresh_diff)) h->max_fresh_diff = d; /* NaN propagates as a failure */
        if (fabs(lf[i]) > scale) scale = fabs(lf[i]);
    }
    if (!(scale > 0)) h->max_fresh_diff = INFINITY;
    ds4_session_free(fresh);
    return 0;
}

static void test_walk_restores(void)
{
    char dir[] = "/tmp/ds4-test-bench-XXXXXX", path[96];
    REQUIRE(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tiny.gguf", dir);
    char vocab[512]; /* test_data's buffer is reused by the next call */
    snprintf(vocab, sizeof vocab, "%s", test_data("tokenizer/dsv4-vocab.gguf"));
    convert_options co = {.out = path, .dense = DS4_TYPE_Q8_0, .exp_gate_up = DS4_TYPE_IQ2_XXS,
                          .exp_down = DS4_TYPE_Q2_K, .seed = 5, .quiet = true, .tokenizer = vocab};
    REQUIRE(convert_synthetic(test_data("bench/synthetic-tiny.json"), &co) == DS4_OK);
    ds4_model *m = ds4_model_open(path, NULL);
    if (!m) fprintf(stderr, "model: %s\n", ds4_last_error());
    REQUIRE(m);
    ds4_tokenizer *tok = ds4_tokenizer_load(path);
    REQUIRE(tok);
    size_t len = 0;
    char *text = test_read_file(test_data("bench/promessi_sposi.txt"), &len);
    REQUIRE(text);
    ds4_tokens t = {0};
    REQUIRE(ds4_tokenize(tok, text, len > 4000 ? 4000 : len, 0, &t) == DS4_OK && t.n >= 200);
    int32_t eos = ds4_tokenizer_special(tok, DS4_TOK_EOS);

    /* 40 > 4 x top_k(8): the last frontiers run the indexer; 200 > the
     * HCA ratio 16 and the window 16 */
    bench_model_opts o = {.ctx_start = 24, .ctx_max = 200, .step_incr = 1, .step_mul = 2.0, .gen_tokens = 5,
                          .ctx_alloc = 206, .threads = 1, .backend = DS4_BACKEND_CPU, .batch_sessions = 2,
                          .batch_loop = 1};
    ds4_session_params p;
    ds4_session_params_default(&p);
    p.n_ctx = o.ctx_max + o.gen_tokens + 1;
    p.n_threads = 1;
    p.max_chunk = 32; /* intervals of 24..100 tokens span several chunks */
    p.backend = DS4_BACKEND_CPU;
    ds4_session *s = ds4_session_create(m, &p), *ref = ds4_session_create(m, &p);
    REQUIRE(s && ref);
    hook_ctx h = {.m = m, .ref = ref, .tokens = t.ids};
    bench_model_row *rows = NULL;
    int n_rows = 0;
    double bw = 1e10;
    int rc = bench_model_walk(m, s, &o, t.ids, eos, NULL, bw, NULL, hook, &h, &rows, &n_rows);
    EXPECT_MSG(rc == 0, "walk rc %d", rc);
    int64_t want[] = {24, 48, 96, 192, 200};
    EXPECT_MSG(n_rows == 5 && h.rows == 5, "%d rows, hook saw %d", n_rows, h.rows);
    for (int i = 0; i < n_rows && i < 5; i++) {
        const bench_model_row *r = &rows[i];
        EXPECT_MSG(r->ctx == want[i] && r->prefill_tokens == want[i] - (i ? want[i - 1] : 0), "row %d ctx %lld", i,
                   (long long)r->ctx);
        EXPECT(r->gen_tokens == 5 && r->prefill_tps > 0 && r->gen_tps > 0);
        EXPECT(r->batch_sessions == 2 && r->batch_gen_tps > 0 && r->batch_loop && r->loop_gen_tps > 0);
        EXPECT(r->weight_bytes_per_token == ds4_model_weight_bytes_per_token(m, r->ctx + 1));
        EXPECT(fabs(r->roofline_tps - bw / (double)r->weight_bytes_per_token) < 1e-9 * r->roofline_tps);
        if (i) EXPECT(r->kvcache_bytes > rows[i - 1].kvcache_bytes);
    }
    /* the indexer's projections join between 24 (6 rows <= 8) and 48 tokens */
    if (n_rows == 5) EXPECT(rows[1].weight_bytes_per_token > rows[0].weight_bytes_per_token);
    EXPECT_MSG(h.bad_snap == 0, "%d frontiers where the restored snapshot differs from the reference", h.bad_snap);
    EXPECT_MSG(h.bad_logits == 0, "%d frontiers where the restored logits differ from the reference", h.bad_logits);
    EXPECT_MSG(h.max_fresh_diff <= 1e-3, "restored vs fresh one-call prefill: max |d logit| %g", h.max_fresh_diff);
    printf("   restored vs fresh prefill: max |d logit| %.3g\n", h.max_fresh_diff);
    /* the probe moved the session: without the restore it would differ */
    EXPECT(ds4_session_n_past(s) == o.ctx_max);
    free(rows);
    ds4_session_free(s);
    ds4_session_free(ref);
    ds4_tokens_free(&t);
    free(text);
    ds4_tokenizer_free(tok);
    ds4_model_close(m);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    RUN(test_frontiers);
    RUN(test_argmax_excluding);
    RUN(test_walk_restores);
    return test_finish();
}

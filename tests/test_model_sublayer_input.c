/*
 * test_model_sublayer_input.c - the model's use of the optional
 * sublayer_input op (backend/ops.h: x, a sublayer's input, is written by
 * the next op that writes it, the hyper-connection site, and then only read
 * until sublayer_input(NULL); the CUDA backend keeps the site's Q8_0 blocks
 * of x for the sublayer's products meanwhile, so a write it did not expect
 * would hand them stale blocks). On the CPU backend with a stand-in op that
 * records the promise and wrappers around the ops that write or read
 * activations:
 *  - every forward (prefill chunks and decode steps) announces an input
 *    twice a layer (attention, FFN) and releases it after each sublayer;
 *  - each announced x is written once, by the site's rmsnorm (the CPU
 *    backend has no fused site), before any op reads it, and no op writes
 *    it again until it is released;
 *  - each sublayer's products do read it (so the promise covers them);
 *  - the logits are those of the plain CPU backend bit for bit.
 * The CUDA form is held to the plain CUDA ops by the full-size `same` runs
 * (bench/h200_run.sh) and test_cuda_decode's steps.
 */
#include "include/ds4.h"
#include "model/dsv4_model.h"
#include "model/dsv4_state.h"
#include "tests/model_fixture.h"
#include "tests/test.h"
#include "util/error.h"

#include <stdlib.h>
#include <string.h>

#define TINY_A "tests/data/dsv4-tiny-a"
#define GGUF_A "build/tests/tiny-a-f32-subin.gguf"

static struct {
    const float *held; /* the announced x, NULL when none */
    bool written;      /* the site wrote it since the announcement */
    bool read;         /* a product read it since */
    int holds, releases, site_writes, unread, bad_order;
    int late_writes;  /* writes to a held x after the site's */
    int early_reads;  /* reads of a held x before the site wrote it */
} seen;
static ds4_backend plain; /* the CPU backend's own ops */

static void note_write(const float *out)
{
    if (seen.held && out == seen.held) seen.late_writes++;
}

static void note_read(const float *x)
{
    if (!seen.held || x != seen.held) return;
    if (!seen.written) seen.early_reads++;
    seen.read = true;
}

static void sublayer_input(ds4_backend *be, const float *x, int T)
{
    (void)be;
    if (x) {
        if (seen.held || T < 1) seen.bad_order++;
        seen.holds++;
        seen.held = x, seen.written = false, seen.read = false;
        return;
    }
    if (!seen.held) seen.bad_order++;
    seen.releases++;
    if (!seen.written) seen.bad_order++;
    if (!seen.read) seen.unread++;
    seen.held = NULL;
}

static void w_rmsnorm(ds4_backend *be, const float *x, const ds4_weight *w, int64_t n_rows, int n, float eps,
                      float *out)
{
    note_read(x);
    if (seen.held && out == seen.held && !seen.written) { /* the site's write */
        seen.written = true;
        seen.site_writes++;
    } else {
        note_write(out);
    }
    plain.rmsnorm(be, x, w, n_rows, n, eps, out);
}

static void w_matmul(ds4_backend *be, const ds4_weight *w, const float *x, int T, float *y)
{
    note_read(x), note_write(y);
    plain.matmul(be, w, x, T, y);
}

static void w_matmul_pair(ds4_backend *be, const ds4_weight *w1, const ds4_weight *w2, const float *x, int T, float *y1,
                          float *y2)
{
    note_read(x), note_write(y1), note_write(y2);
    plain.matmul_pair(be, w1, w2, x, T, y1, y2);
}

static void w_matmul_grouped(ds4_backend *be, const ds4_weight *w, int groups, const float *x, int T, float *y)
{
    note_read(x), note_write(y);
    plain.matmul_grouped(be, w, groups, x, T, y);
}

static void w_rope(ds4_backend *be, float *x, int T, int n_heads, int head_dim, int n_rot, const ds4_weight *omega,
                   int64_t pos0, bool inverse)
{
    note_write(x);
    plain.rope(be, x, T, n_heads, head_dim, n_rot, omega, pos0, inverse);
}

static void w_attention(ds4_backend *be, const float *q, int T, int n_heads, int hd, const float *kv, const float *ring,
                        int window, int64_t pos0, const float *comp, int ratio, const int32_t *sel, int topk,
                        const ds4_weight *sinks, float *out)
{
    note_write(out);
    plain.attention(be, q, T, n_heads, hd, kv, ring, window, pos0, comp, ratio, sel, topk, sinks, out);
}

static void w_hc_post(ds4_backend *be, float *X, int T, int n_hc, int D, const float *F, const float *post,
                      const float *comb)
{
    note_write(X);
    plain.hc_post(be, X, T, n_hc, D, F, post, comb);
}

static void w_hc_pre(ds4_backend *be, const float *X, int T, int n_hc, int D, const ds4_weight *fn,
                     const ds4_weight *scale, const ds4_weight *base, int iters, float rms_eps, float hc_eps, float *y,
                     float *post, float *comb)
{
    note_write(y), note_write(post), note_write(comb);
    plain.hc_pre(be, X, T, n_hc, D, fn, scale, base, iters, rms_eps, hc_eps, y, post, comb);
}

static void w_moe_experts(ds4_backend *be, const ds4_weight *gate, const ds4_weight *up, const ds4_weight *down,
                          const float *x, int T, const int32_t *sel, const float *w, int k, float clamp, float *out,
                          bool accumulate)
{
    note_read(x), note_write(out);
    plain.moe_experts(be, gate, up, down, x, T, sel, w, k, clamp, out, accumulate);
}

static void w_ffn_swiglu(ds4_backend *be, const ds4_weight *gate, const ds4_weight *up, const ds4_weight *down,
                         const float *x, int T, float clamp, float *out, bool accumulate)
{
    note_read(x), note_write(out);
    plain.ffn_swiglu(be, gate, up, down, x, T, clamp, out, accumulate);
}

static void w_kv_round(ds4_backend *be, float *x, int64_t n_rows, int row_len, const ds4_kv_numerics *nm)
{
    note_write(x);
    plain.kv_round(be, x, n_rows, row_len, nm);
}

static void w_indexer_qat(ds4_backend *be, float *x, int64_t n_rows, int row_len)
{
    note_write(x);
    plain.indexer_qat(be, x, n_rows, row_len);
}

static dsv4_model *m;
static int32_t *tok;
static int64_t n_tok;

static ds4_backend *watching_backend(void)
{
    ds4_backend *be = ds4_backend_cpu_create(2);
    if (!be) return NULL;
    plain = *be;
    be->sublayer_input = sublayer_input;
    be->rmsnorm = w_rmsnorm;
    be->matmul = w_matmul;
    if (be->matmul_pair) be->matmul_pair = w_matmul_pair;
    be->matmul_grouped = w_matmul_grouped;
    be->rope = w_rope;
    be->attention = w_attention;
    be->hc_post = w_hc_post;
    be->hc_pre = w_hc_pre;
    be->moe_experts = w_moe_experts;
    be->ffn_swiglu = w_ffn_swiglu;
    be->kv_round = w_kv_round;
    be->indexer_qat = w_indexer_qat;
    return be;
}

/* The plain CPU backend against the watching one (fixture_same_logits). */
static bool run_both(int pre, int dec, int *forwards)
{
    ds4_backend *cpu = ds4_backend_cpu_create(2), *be = watching_backend();
    return fixture_same_logits_free(m, tok, cpu, be, pre, dec, forwards);
}

static void test_sublayer_input_promise_kept(void)
{
    if (!fixture_ready(m, n_tok)) return;
    memset(&seen, 0, sizeof seen);
    int forwards = 0;
    EXPECT_MSG(run_both(100, 8, &forwards), "the watched backend changed the logits against the plain CPU backend");
    const int L = m->cfg.n_layer;
    EXPECT_MSG(forwards == 10, "%d forwards", forwards);
    EXPECT_MSG(seen.holds == 2 * L * forwards && seen.releases == seen.holds,
               "%d announcements and %d releases for %d layers x %d forwards (two sublayers a layer)", seen.holds,
               seen.releases, L, forwards);
    EXPECT_MSG(seen.site_writes == seen.holds, "%d of %d announced inputs written by their site", seen.site_writes,
               seen.holds);
    EXPECT_MSG(seen.late_writes == 0, "%d writes to a sublayer's input after its site", seen.late_writes);
    EXPECT_MSG(seen.early_reads == 0, "%d reads of an announced input before its site", seen.early_reads);
    EXPECT_MSG(seen.unread == 0, "%d sublayers read none of their input through the watched products", seen.unread);
    EXPECT(seen.bad_order == 0);
}

int main(void)
{
    m = fixture_model_tokens(TINY_A, GGUF_A, &tok, &n_tok);
    RUN(test_sublayer_input_promise_kept);
    if (m) dsv4_model_free(m);
    free(tok);
    return test_finish();
}

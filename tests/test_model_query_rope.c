/*
 * test_model_query_rope.c - the model's use of the optional query_rope op
 * (backend/ops.h: rmsnorm_matmul of q_b, then rmsnorm_rope_qkv of the
 * query heads and the kv row, as one op, so that a backend may normalize
 * and rotate each head as the product finishes it; the CUDA backend's
 * DS4_CUDA_QB_ROPE). On the CPU backend, which has neither rmsnorm_matmul
 * nor the op, with stand-ins built from its rmsnorm, matmul, rope and
 * kv_round as ops.h defines them:
 *  - a decode step calls query_rope once a layer, and q_b's rmsnorm_matmul
 *    only inside it (prefill chunks of 50 rows keep the separate ops:
 *    rmsnorm_matmul is for one row);
 *  - the arguments are the layer's (q_b, the q_a norm, the kv norm, one
 *    row, the heads of the model);
 *  - the logits are those of the plain CPU backend bit for bit, with the
 *    op and with only rmsnorm_matmul.
 * The CUDA op is held to the plain CUDA ops by test_cuda_ops.
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
#define GGUF_A "build/tests/tiny-a-f32-qrope.gguf"

static struct {
    int ropes, qb_inside, qb_outside, wrong_args;
    bool inside;
} seen;
static dsv4_model *m;
static int32_t *tok;
static int64_t n_tok;

static bool is_q_b(const ds4_weight *w)
{
    for (int il = 0; il < m->cfg.n_layer; il++)
        if (w == &m->layers[il].q_b) return true;
    return false;
}

/* rmsnorm_matmul as ops.h defines it: the rows normalized into a copy
 * (x left as it is), then the product. Counts the q_b products (the
 * indexer's query product takes it too, once its keys outnumber top_k). */
static void norm_matmul(ds4_backend *be, const float *x, const ds4_weight *norm, int T, int n, float eps,
                        const ds4_weight *w, float *y)
{
    if (is_q_b(w)) {
        if (seen.inside) seen.qb_inside++;
        else seen.qb_outside++;
    } else if (seen.inside) {
        seen.wrong_args++;
    }
    float *xn = malloc(sizeof(float) * (size_t)T * (size_t)n);
    if (!xn) {
        seen.wrong_args++;
        return;
    }
    be->rmsnorm(be, x, norm, T, n, eps, xn);
    be->matmul(be, w, xn, T, y);
    free(xn);
}

/* query_rope as ops.h defines it: norm_matmul, then rmsnorm_rope of the
 * query heads (no weight, no rounding) and of the kv row (its weight,
 * rounding per nm), each rmsnorm_rope an rmsnorm, the forward RoPE and
 * kv_round */
static void query_rope(ds4_backend *be, const float *qr, const ds4_weight *q_norm, int T, int n, float eps,
                       const ds4_weight *wq, float *q, int n_heads, float *kv, const ds4_weight *kv_w, int head_dim,
                       int n_rot, const ds4_weight *omega, int64_t pos0, const ds4_kv_numerics *nm)
{
    seen.ropes++;
    const dsv4_layer *L0 = &m->layers[0];
    if (T != 1 || n != m->cfg.q_lora || !q_norm || !wq || !kv_w || q_norm->ne[0] != n || wq->ne[0] != n ||
        wq->ne[1] != (int64_t)n_heads * head_dim || n_heads != dsv4_model_heads(m) || head_dim != m->cfg.head_dim ||
        n_rot != m->cfg.n_rot || kv_w->ne[0] != head_dim || wq->type != L0->q_b.type || !omega || pos0 < 0)
        seen.wrong_args++;
    seen.inside = true;
    norm_matmul(be, qr, q_norm, T, n, eps, wq, q);
    seen.inside = false;
    be->rmsnorm(be, q, NULL, (int64_t)T * n_heads, head_dim, eps, q);
    be->rope(be, q, T, n_heads, head_dim, n_rot, omega, pos0, false);
    be->rmsnorm(be, kv, kv_w, T, head_dim, eps, kv);
    be->rope(be, kv, T, 1, head_dim, n_rot, omega, pos0, false);
    if (nm) be->kv_round(be, kv, T, head_dim, nm);
}

static bool run_both(bool with_op, int pre, int dec, int *forwards)
{
    ds4_backend *cpu = ds4_backend_cpu_create(2), *be = ds4_backend_cpu_create(2);
    if (be) {
        be->rmsnorm_matmul = norm_matmul;
        be->query_rope = with_op ? query_rope : NULL;
    }
    return fixture_same_logits_free(m, tok, cpu, be, pre, dec, forwards);
}

static void test_op_used_same_logits(void)
{
    if (!fixture_ready(m, n_tok)) return;
    memset(&seen, 0, sizeof seen);
    int forwards = 0;
    const int pre = 100, dec = 8;
    EXPECT_MSG(run_both(true, pre, dec, &forwards), "query_rope changed the logits against the plain CPU backend");
    EXPECT_MSG(forwards == pre / 50 + dec, "%d forwards", forwards);
    const int L = m->cfg.n_layer;
    EXPECT_MSG(seen.ropes == L * dec, "%d query_rope calls for %d layers x %d decode steps", seen.ropes, L, dec);
    EXPECT_MSG(seen.qb_inside == seen.ropes && seen.qb_outside == 0,
               "q_b's rmsnorm_matmul %d times inside query_rope (%d calls), %d outside", seen.qb_inside, seen.ropes,
               seen.qb_outside);
    EXPECT(seen.wrong_args == 0);
}

static void test_without_op(void)
{
    if (!fixture_ready(m, n_tok)) return;
    memset(&seen, 0, sizeof seen);
    int forwards = 0;
    const int dec = 4;
    EXPECT(run_both(false, 100, dec, &forwards));
    EXPECT(seen.ropes == 0);
    EXPECT_MSG(seen.qb_outside == m->cfg.n_layer * dec, "%d q_b rmsnorm_matmul calls for %d layers x %d decode steps",
               seen.qb_outside, m->cfg.n_layer, dec);
}

int main(void)
{
    m = fixture_model_tokens(TINY_A, GGUF_A, &tok, &n_tok);
    RUN(test_op_used_same_logits);
    RUN(test_without_op);
    if (m) dsv4_model_free(m);
    free(tok);
    return test_finish();
}

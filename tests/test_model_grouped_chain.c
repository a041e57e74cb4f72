/*
 * test_model_grouped_chain.c - the model's use of the optional
 * matmul_grouped_chain op (backend/ops.h: the attention's o_a then o_b in
 * one op, so that a backend may hand o_a's output to o_b in a form of its
 * own; the CUDA backend hands over its Q8_0 blocks). On the CPU backend
 * with a stand-in chain op that runs the CPU's matmul_grouped and matmul:
 *  - every forward (prefill chunks and decode steps) calls the chain op
 *    once a layer, and the model calls matmul_grouped only through it;
 *  - the logits are those of the plain CPU backend (no chain op) bit for
 *    bit, and the stand-in got the weights and buffers the two ops would;
 *  - without the op the model calls matmul_grouped itself, once a layer.
 * The same for attention_out_project (attention_out, then the chain as one
 * op, so that a backend may hand the attention's output to o_a in its own
 * form: the CUDA backend's Q8_0 blocks, DS4_CUDA_Q8_HANDOFF_A): with
 * stand-ins for it and for attention_out (the CPU backend has neither),
 * every forward of one sequence calls it once a layer, attention_out only
 * inside it, and the logits are the plain CPU backend's bit for bit.
 * The CUDA ops are held to the plain CUDA ops by test_cuda_ops.
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
#define GGUF_A "build/tests/tiny-a-f32-chain.gguf"

static struct {
    int chains, grouped, grouped_outside, wrong_args;
    bool inside;
    int projects, attn_outs, attn_outside;
    bool in_project;
} seen;
static void (*cpu_matmul)(ds4_backend *, const ds4_weight *, const float *, int, float *);
static void (*cpu_grouped)(ds4_backend *, const ds4_weight *, int, const float *, int, float *);

static void count_grouped(ds4_backend *be, const ds4_weight *w, int groups, const float *x, int T, float *y)
{
    seen.grouped++;
    if (!seen.inside) seen.grouped_outside++;
    cpu_grouped(be, w, groups, x, T, y);
}

/* The stand-in: the two CPU ops, in order, on the op's arguments. */
static void chain(ds4_backend *be, const ds4_weight *wa, int groups, const float *x, int T, float *u,
                  const ds4_weight *wb, float *y)
{
    seen.chains++;
    if (!wa || !wb || wa == wb || !x || !u || !y || u == y || groups < 1) seen.wrong_args++;
    seen.inside = true;
    be->matmul_grouped(be, wa, groups, x, T, u);
    seen.inside = false;
    cpu_matmul(be, wb, u, T, y);
}

/* attention_out as ops.h defines it, from the CPU's three ops */
static void attn_out(ds4_backend *be, const float *q, int T, int n_heads, int hd, const float *kv, float *ring,
                     int window, int64_t pos0, const float *comp, int ratio, const int32_t *sel, int topk,
                     const ds4_weight *sinks, int n_rot, const ds4_weight *omega, float *out)
{
    seen.attn_outs++;
    if (!seen.in_project) seen.attn_outside++;
    be->attention(be, q, T, n_heads, hd, kv, ring, window, pos0, comp, ratio, sel, topk, sinks, out);
    be->ring_push(be, ring, window, hd, kv, T, pos0);
    be->rope(be, out, T, n_heads, hd, n_rot, omega, pos0, true);
}

/* attention_out_project as ops.h defines it: attn_out, then the chain */
static void project(ds4_backend *be, const float *q, int T, int n_heads, int hd, const float *kv, float *ring,
                    int window, int64_t pos0, const float *comp, int ratio, const int32_t *sel, int topk,
                    const ds4_weight *sinks, int n_rot, const ds4_weight *omega, float *out, const ds4_weight *wa,
                    int groups, float *u, const ds4_weight *wb, float *y)
{
    seen.projects++;
    if (!out || out == u || out == y || !wa || !wb) seen.wrong_args++;
    seen.in_project = true;
    attn_out(be, q, T, n_heads, hd, kv, ring, window, pos0, comp, ratio, sel, topk, sinks, n_rot, omega, out);
    seen.in_project = false;
    chain(be, wa, groups, out, T, u, wb, y);
}

static dsv4_model *m;
static int32_t *tok;
static int64_t n_tok;

static ds4_backend *counting_backend(bool with_chain, bool with_project)
{
    ds4_backend *be = ds4_backend_cpu_create(2);
    if (!be) return NULL;
    cpu_matmul = be->matmul;
    cpu_grouped = be->matmul_grouped;
    be->matmul_grouped = count_grouped;
    be->matmul_grouped_chain = with_chain ? chain : NULL;
    if (with_project) {
        be->attention_out = attn_out;
        be->attention_out_project = project;
    }
    return be;
}

/* The plain CPU backend against the counting one (fixture_same_logits). */
static bool run_both(bool with_chain, bool with_project, int pre, int dec, int *forwards)
{
    ds4_backend *cpu = ds4_backend_cpu_create(2), *be = counting_backend(with_chain, with_project);
    return fixture_same_logits_free(m, tok, cpu, be, pre, dec, forwards);
}

static void test_chain_op_used_same_logits(void)
{
    if (!fixture_ready(m, n_tok)) return;
    memset(&seen, 0, sizeof seen);
    int forwards = 0;
    EXPECT_MSG(run_both(true, false, 100, 8, &forwards), "the chain op changed the logits against the plain CPU backend");
    const int L = m->cfg.n_layer;
    EXPECT_MSG(forwards == 10, "%d forwards", forwards);
    EXPECT_MSG(seen.chains == L * forwards, "%d chain calls for %d layers x %d forwards", seen.chains, L, forwards);
    EXPECT_MSG(seen.grouped == seen.chains && seen.grouped_outside == 0,
               "matmul_grouped called %d times, %d of them outside the chain", seen.grouped, seen.grouped_outside);
    EXPECT(seen.wrong_args == 0);
}

static void test_without_chain_op(void)
{
    if (!fixture_ready(m, n_tok)) return;
    memset(&seen, 0, sizeof seen);
    int forwards = 0;
    EXPECT(run_both(false, false, 100, 4, &forwards));
    EXPECT(seen.chains == 0);
    EXPECT_MSG(seen.grouped_outside == m->cfg.n_layer * forwards, "%d matmul_grouped calls for %d layers x %d forwards",
               seen.grouped_outside, m->cfg.n_layer, forwards);
}

static void test_project_op_used_same_logits(void)
{
    if (!fixture_ready(m, n_tok)) return;
    memset(&seen, 0, sizeof seen);
    int forwards = 0;
    EXPECT_MSG(run_both(true, true, 100, 8, &forwards),
               "the attention_out_project op changed the logits against the plain CPU backend");
    const int L = m->cfg.n_layer;
    EXPECT_MSG(forwards == 10, "%d forwards", forwards);
    EXPECT_MSG(seen.projects == L * forwards, "%d project calls for %d layers x %d forwards", seen.projects, L,
               forwards);
    EXPECT_MSG(seen.attn_outs == seen.projects && seen.attn_outside == 0,
               "attention_out called %d times, %d of them outside the project op", seen.attn_outs, seen.attn_outside);
    EXPECT_MSG(seen.chains == seen.projects && seen.grouped == seen.chains && seen.grouped_outside == 0,
               "%d chains, %d matmul_grouped (%d outside the chain) for %d project calls", seen.chains, seen.grouped,
               seen.grouped_outside, seen.projects);
    EXPECT(seen.wrong_args == 0);
}

int main(void)
{
    m = fixture_model_tokens(TINY_A, GGUF_A, &tok, &n_tok);
    RUN(test_chain_op_used_same_logits);
    RUN(test_without_chain_op);
    RUN(test_project_op_used_same_logits);
    if (m) dsv4_model_free(m);
    free(tok);
    return test_finish();
}

/*
 * test_model_side_order.c - where the model puts a decode step's ops
 * around the backend's side ops (backend/ops.h side_begin, side_end,
 * side_join and side_indexer_query_first), on the CPU backend with side
 * ops that are stubs here: they run nothing beside anything (the ops stay
 * in call order) and note which ops fall between side_begin and side_end.
 *   - The logits of 20 prefilled and 20 decoded positions of a small
 *     model with two CSA layers (tests/model_synth.h, top-4 indexer, so
 *     the decoded steps score keys) are bit for bit those of the backend
 *     without side ops, with the indexer's query products placed either
 *     way: the placement keeps every dependence (index_query after the q_a
 *     norm, the selection after the compressors' pushes).
 *   - Decoding, the indexer's RoPE (its query products) is inside the side
 *     region by default and before it with side_indexer_query_first; its
 *     head weights are before it only with side_indexer_query_first alone
 *     (side_indexer_weights_beside puts them beside, after the
 *     compressors); its selection is inside either way; every region is
 *     joined.
 *   - With an rmsnorm_matmul that keeps to its contract (here: the two ops
 *     on a copy), the q_a output stays as q_a gave it and q_b and the
 *     indexer's q_b normalize it themselves: the same bits, without side
 *     ops and with them (the indexer's q_b takes the op only where it runs
 *     on the backend's stream, never beside).
 *   - With the side run last (the ops between side_begin and side_end
 *     queued and run only at side_join, as a side stream that has not
 *     started before the join would), the same bits again, the query
 *     products placed either way: every op after the join may read what
 *     the side writes, and nothing between the fork and the join
 *     overwrites what the side reads. In call order a join placed too late
 *     goes unseen; run last it does not (a join moved after o_b fails).
 *   - With ops.h indexer_query_rope (a stand-in made of the ops it stands
 *     for), a decoded step's indexer takes it in each CSA layer that
 *     scores, with that layer's arguments and on the backend's stream, and
 *     no other RoPE of the indexer's rows: the same bits, without side ops
 *     and with the query products first (a position off by one fails).
 *   - With ops.h compress_two (again a stand-in), every step takes it
 *     once in each CSA layer with that layer's weights and states, inside
 *     the side region while decoding: the same bits.
 */
#include "backend/ops.h"
#include "include/ds4.h"
#include "model/dsv4_model.h"
#include "model/dsv4_state.h"
#include "tests/model_synth.h"
#include "tests/test.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define SIDE_PATH "build/tests/synth-side-order.gguf"

static dsv4_model *synth;
static ds4_backend *be;
static void (*cpu_rope)(ds4_backend *, float *, int, int, int, int, const ds4_weight *, int64_t, bool);
static void (*cpu_topk)(ds4_backend *, const float *, const float *, int, int, int, const float *, int64_t, int,
                        int, int32_t *);

/* what the stubs saw while decoding */
static struct {
    int decoding, in_side, begins, ends, joins;
    int idx_rope_in, idx_rope_out, topk_in, topk_out, idx_w_in, idx_w_out;
} g;

static void stub_side_begin(ds4_backend *b)
{
    (void)b;
    g.in_side = 1;
    g.begins += g.decoding;
}
static void stub_side_end(ds4_backend *b)
{
    (void)b;
    g.in_side = 0;
    g.ends += g.decoding;
}
static void stub_side_join(ds4_backend *b)
{
    (void)b;
    g.joins += g.decoding;
}

static void log_rope(ds4_backend *b, float *x, int T, int n_heads, int head_dim, int n_rot, const ds4_weight *omega,
                     int64_t pos0, bool inverse)
{
    if (g.decoding && n_heads == synth->cfg.idx_heads && head_dim == synth->cfg.idx_dim) {
        g.idx_rope_in += g.in_side;
        g.idx_rope_out += !g.in_side;
    }
    cpu_rope(b, x, T, n_heads, head_dim, n_rot, omega, pos0, inverse);
}

/* the indexer's head weights: the product of the sublayer input into one value a head */
static void (*cpu_matmul)(ds4_backend *, const ds4_weight *, const float *, int, float *);
static void log_matmul(ds4_backend *b, const ds4_weight *w, const float *x, int T, float *y)
{
    if (g.decoding && w->ne[1] == synth->cfg.idx_heads && w->ne[0] == synth->cfg.n_embd) {
        g.idx_w_in += g.in_side;
        g.idx_w_out += !g.in_side;
    }
    cpu_matmul(b, w, x, T, y);
}

static void log_topk(ds4_backend *b, const float *qi, const float *w, int T, int n_heads, int dim, const float *keys,
                     int64_t pos0, int ratio, int topk, int32_t *sel)
{
    if (g.decoding) {
        g.topk_in += g.in_side;
        g.topk_out += !g.in_side;
    }
    cpu_topk(b, qi, w, T, n_heads, dim, keys, pos0, ratio, topk, sel);
}

/* rmsnorm_matmul as its contract says (ops.h): the product of the
 * normalized rows, x left as it is; the products it took, by matrix (the
 * indexer's q_b counted while decoding: a prefill step has no side) */
static int nm_q_b, nm_idx_q_b, nm_in_side;
static void stub_rmsnorm_matmul(ds4_backend *b, const float *x, const ds4_weight *norm, int T, int n, float eps,
                                const ds4_weight *w, float *y)
{
    float *xn = b->alloc(b, sizeof(float) * (size_t)T * (size_t)n);
    if (!xn) return;
    b->rmsnorm(b, x, norm, T, n, eps, xn);
    b->matmul(b, w, xn, T, y);
    b->free(b, xn);
    nm_q_b += w->ne[1] == (int64_t)synth->cfg.n_head * synth->cfg.head_dim;
    nm_idx_q_b += g.decoding && w->ne[1] == (int64_t)synth->cfg.idx_heads * synth->cfg.idx_dim;
    nm_in_side += g.in_side;
}

enum { N_PRE = 20, N_DEC = 20, N = N_PRE + N_DEC };

/* logits of N positions: N_PRE prefilled in one step, then one at a time */
static float *run(const int32_t *tok)
{
    const ds4_kv_numerics nm = dsv4_numerics(&synth->cfg, true);
    dsv4_state *s = NULL;
    if (dsv4_state_create(synth, be, N, N_PRE, &nm, &s) != DS4_OK) {
        fprintf(stderr, "state: %s\n", ds4_last_error());
        return NULL;
    }
    const int V = synth->cfg.n_vocab;
    float *out = malloc(sizeof(float) * (size_t)N * V);
    int ok = out && dsv4_forward(s, tok, N_PRE, true, out) == DS4_OK;
    g.decoding = 1;
    for (int i = N_PRE; ok && i < N; i++) ok = dsv4_forward(s, tok + i, 1, true, out + (size_t)i * V) == DS4_OK;
    g.decoding = 0;
    dsv4_state_free(s);
    if (!ok) {
        fprintf(stderr, "forward: %s\n", ds4_last_error());
        free(out);
        return NULL;
    }
    return out;
}

/* mode 0: no side ops; 1: side ops, the indexer beside; 2: side ops, its
 * query products first; the stubs' notes cleared */
static void side_mode(int mode)
{
    be->side_begin = mode ? stub_side_begin : NULL;
    be->side_end = mode ? stub_side_end : NULL;
    be->side_join = mode ? stub_side_join : NULL;
    be->side_indexer_query_first = mode == 2;
    memset(&g, 0, sizeof g);
}

static void test_side_placement_keeps_bits(void)
{
    REQUIRE(synth && be);
    REQUIRE(be->rope && be->indexer_topk && !be->side_begin && !be->rmsnorm_matmul);
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)((i * 37 + 11) % synth->cfg.n_vocab);
    const size_t n = (size_t)N * synth->cfg.n_vocab;
    cpu_rope = be->rope;
    cpu_topk = be->indexer_topk;
    cpu_matmul = be->matmul;
    be->rope = log_rope;
    be->indexer_topk = log_topk;
    be->matmul = log_matmul;
    float *ref = run(tok);
    REQUIRE(ref);
    EXPECT_MSG(g.idx_rope_out > 0 && g.topk_out > 0 && g.idx_w_out > 0,
               "no decoded step scored keys (RoPE %d, top-k %d, head weights %d)", g.idx_rope_out, g.topk_out,
               g.idx_w_out);
    be->side_begin = stub_side_begin;
    be->side_end = stub_side_end;
    be->side_join = stub_side_join;
    /* place 0: the indexer beside; 1: its query products first; 2: those
     * first but its head weights beside (side_indexer_weights_beside) */
    for (int place = 0; place < 3; place++) {
        memset(&g, 0, sizeof g);
        const int first = place > 0;
        be->side_indexer_query_first = first;
        be->side_indexer_weights_beside = place == 2;
        float *out = run(tok);
        REQUIRE(out);
        EXPECT_MSG(memcmp(ref, out, sizeof(float) * n) == 0, "placement %d: logits differ from in-order ops", place);
        EXPECT_MSG(g.topk_in > 0 && g.topk_out == 0, "placement %d: selection inside %d, outside %d", place,
                   g.topk_in, g.topk_out);
        if (first)
            EXPECT_MSG(g.idx_rope_out > 0 && g.idx_rope_in == 0, "query first: indexer RoPE inside %d, before %d",
                       g.idx_rope_in, g.idx_rope_out);
        else
            EXPECT_MSG(g.idx_rope_in > 0 && g.idx_rope_out == 0, "default: indexer RoPE inside %d, before %d",
                       g.idx_rope_in, g.idx_rope_out);
        if (place == 1)
            EXPECT_MSG(g.idx_w_out > 0 && g.idx_w_in == 0, "query first: head weights inside %d, before %d",
                       g.idx_w_in, g.idx_w_out);
        else
            EXPECT_MSG(g.idx_w_in > 0 && g.idx_w_out == 0, "placement %d: head weights inside %d, outside %d", place,
                       g.idx_w_in, g.idx_w_out);
        EXPECT_MSG(g.begins == g.ends && g.begins > 0 && g.joins > 0 && g.joins <= g.begins,
                   "placement %d: %d side_begin, %d side_end, %d side_join", place, g.begins, g.ends, g.joins);
        free(out);
    }
    be->side_indexer_weights_beside = 0;
    be->matmul = cpu_matmul;
    /* with rmsnorm_matmul (qr kept as q_a gave it): the same bits, the
     * indexer's q_b taking the op where it runs on the backend's stream
     * (no side, or its query products first) and never beside */
    be->rmsnorm_matmul = stub_rmsnorm_matmul;
    for (int mode = 0; mode < 3; mode++) { /* side_mode's three */
        side_mode(mode);
        nm_q_b = nm_idx_q_b = nm_in_side = 0;
        float *out = run(tok);
        REQUIRE(out);
        EXPECT_MSG(memcmp(ref, out, sizeof(float) * n) == 0, "rmsnorm_matmul, mode %d: logits differ", mode);
        EXPECT_MSG(nm_q_b > 0 && nm_in_side == 0, "rmsnorm_matmul, mode %d: q_b took it %d times, %d beside", mode,
                   nm_q_b, nm_in_side);
        EXPECT_MSG(mode == 1 ? nm_idx_q_b == 0 : nm_idx_q_b > 0,
                   "rmsnorm_matmul, mode %d: the indexer's q_b took it %d times decoding", mode, nm_idx_q_b);
        free(out);
    }
    be->rmsnorm_matmul = NULL;
    be->side_begin = NULL;
    be->side_end = NULL;
    be->side_join = NULL;
    be->side_indexer_query_first = 0;
    be->rope = cpu_rope;
    be->indexer_topk = cpu_topk;
    free(ref);
}

/* The side run last: a queued call, its kind and arguments. These are the
 * ops the model's side regions call today; one not listed would run at
 * once, ahead of the queued ones before it, and fail the test where the
 * model is right (add it here). */
enum { K_MM, K_PAIR, K_ROPE, K_QAT, K_TOPK, K_PUSH, QUEUE_CAP = 4096 };
typedef struct {
    int k;
    const ds4_weight *w1, *w2, *w3;
    const float *x, *x2;
    float *y, *y2;
    int T, a, b, c, d;
    int64_t p0, n;
    float eps;
    bool flag;
    void *st;
    const void *nm;
} side_call;
static struct {
    ds4_backend cpu; /* the ops the queued calls run */
    int on, n, overflow;
    side_call q[QUEUE_CAP];
} dq;

static void side_call_run(const side_call *r)
{
    ds4_backend *b = be;
    switch (r->k) {
    case K_MM: dq.cpu.matmul(b, r->w1, r->x, r->T, r->y); break;
    case K_PAIR: dq.cpu.matmul_pair(b, r->w1, r->w2, r->x, r->T, r->y, r->y2); break;
    case K_ROPE: dq.cpu.rope(b, r->y, r->T, r->a, r->b, r->c, r->w1, r->p0, r->flag); break;
    case K_QAT: dq.cpu.indexer_qat(b, r->y, r->n, r->a); break;
    case K_TOPK:
        dq.cpu.indexer_topk(b, r->x, r->x2, r->T, r->a, r->b, (const float *)r->st, r->p0, r->c, r->d,
                            (int32_t *)r->y);
        break;
    case K_PUSH:
        dq.cpu.compressor_push(b, (ds4_comp_state *)r->st, r->x, r->x2, r->T, r->p0, r->w1, r->w2, r->eps, r->w3, r->a,
                               (const ds4_kv_numerics *)r->nm, r->flag);
        break;
    }
}

/* inside a side region: queued; outside: run now */
static void side_call_put(side_call r)
{
    if (!dq.on) side_call_run(&r);
    else if (dq.n < QUEUE_CAP) dq.q[dq.n++] = r;
    else dq.overflow = 1;
}

static void q_matmul(ds4_backend *b, const ds4_weight *w, const float *x, int T, float *y)
{
    (void)b;
    side_call_put((side_call){.k = K_MM, .w1 = w, .x = x, .T = T, .y = y});
}
static void q_matmul_pair(ds4_backend *b, const ds4_weight *w1, const ds4_weight *w2, const float *x, int T,
                          float *y1, float *y2)
{
    (void)b;
    side_call_put((side_call){.k = K_PAIR, .w1 = w1, .w2 = w2, .x = x, .T = T, .y = y1, .y2 = y2});
}
static void q_rope(ds4_backend *b, float *x, int T, int h, int d, int nr, const ds4_weight *om, int64_t p0, bool inv)
{
    (void)b;
    side_call_put((side_call){.k = K_ROPE, .y = x, .T = T, .a = h, .b = d, .c = nr, .w1 = om, .p0 = p0, .flag = inv});
}
static void q_indexer_qat(ds4_backend *b, float *x, int64_t n, int len)
{
    (void)b;
    side_call_put((side_call){.k = K_QAT, .y = x, .n = n, .a = len});
}
static void q_indexer_topk(ds4_backend *b, const float *qi, const float *w, int T, int h, int d, const float *keys,
                           int64_t p0, int ratio, int topk, int32_t *sel)
{
    (void)b;
    side_call_put((side_call){.k = K_TOPK, .x = qi, .x2 = w, .T = T, .a = h, .b = d, .st = (void *)keys, .p0 = p0,
                              .c = ratio, .d = topk, .y = (float *)sel});
}
static void q_compressor_push(ds4_backend *b, ds4_comp_state *st, const float *c, const float *z, int T, int64_t p0,
                              const ds4_weight *ape, const ds4_weight *norm, float eps, const ds4_weight *om, int nr,
                              const ds4_kv_numerics *nm, bool idx)
{
    (void)b;
    side_call_put((side_call){.k = K_PUSH, .st = st, .x = c, .x2 = z, .T = T, .p0 = p0, .w1 = ape, .w2 = norm,
                              .eps = eps, .w3 = om, .a = nr, .nm = nm, .flag = idx});
}
static void q_side_begin(ds4_backend *b)
{
    (void)b;
    dq.on = 1;
}
static void q_side_end(ds4_backend *b)
{
    (void)b;
    dq.on = 0;
}
static void q_side_join(ds4_backend *b)
{
    (void)b;
    for (int i = 0; i < dq.n; i++) side_call_run(&dq.q[i]);
    dq.n = 0;
}

static void test_side_run_last_keeps_bits(void)
{
    REQUIRE(synth && be);
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)((i * 37 + 11) % synth->cfg.n_vocab);
    const size_t n = (size_t)N * synth->cfg.n_vocab;
    float *ref = run(tok);
    REQUIRE(ref);
    dq.cpu = *be;
    be->matmul = q_matmul;
    be->matmul_pair = dq.cpu.matmul_pair ? q_matmul_pair : NULL;
    be->rope = q_rope;
    be->indexer_qat = q_indexer_qat;
    be->indexer_topk = q_indexer_topk;
    be->compressor_push = q_compressor_push;
    be->compressor_push_seqs = NULL;
    be->indexer_topk_seqs = NULL;
    be->side_begin = q_side_begin;
    be->side_end = q_side_end;
    be->side_join = q_side_join;
    for (int place = 0; place < 3; place++) { /* as in test_side_placement_keeps_bits */
        be->side_indexer_query_first = place > 0;
        be->side_indexer_weights_beside = place == 2;
        float *out = run(tok);
        EXPECT_MSG(out != NULL, "placement %d: the forward failed", place);
        EXPECT_MSG(!dq.overflow, "more than %d ops in one side region", QUEUE_CAP);
        EXPECT_MSG(dq.n == 0, "%d side ops never joined", dq.n);
        if (out)
            EXPECT_MSG(memcmp(ref, out, sizeof(float) * n) == 0, "side run last, placement %d: logits differ",
                       place);
        free(out);
    }
    *be = dq.cpu;
    free(ref);
}

/* ops.h indexer_query_rope, a stand-in here (stub_rmsnorm_matmul, rope and
 * indexer_qat, as the contract says, on the CPU's ops): with rmsnorm_matmul,
 * each decoded step's indexer takes it in every CSA layer that scores, in
 * place of its q_b's rmsnorm_matmul, its RoPE and its QAT, with that
 * layer's arguments (its q_b and q_a norm, one row at a decoded position,
 * the indexer's heads, the official numerics' QAT) and on the backend's
 * stream; the logits bit for bit the in-order ops', without side ops and
 * with the query products first (side ops, placements 1 and 2). */
static struct {
    int calls, bad, in_side, inside, idx_rope_outside;
} iq;
static void stub_indexer_query_rope(ds4_backend *b, const float *qr, const ds4_weight *q_norm, int T, int n,
                                    float eps, const ds4_weight *w, float *qi, int n_heads, int head_dim, int n_rot,
                                    const ds4_weight *omega, int64_t pos0, bool qat)
{
    const dsv4_config *c = &synth->cfg;
    bool layer = false;
    for (int il = 0; il < c->n_layer; il++)
        layer |= w == &synth->layers[il].idx_q_b && q_norm == &synth->layers[il].q_a_norm;
    iq.calls++;
    iq.in_side += g.in_side;
    iq.bad += !layer || T != 1 || !g.decoding || n != c->q_lora || n_heads != c->idx_heads ||
              head_dim != c->idx_dim || n_rot != c->n_rot || pos0 < N_PRE || pos0 >= N || !qat;
    iq.inside = 1;
    stub_rmsnorm_matmul(b, qr, q_norm, T, n, eps, w, qi);
    b->rope(b, qi, T, n_heads, head_dim, n_rot, omega, pos0, false);
    if (qat) b->indexer_qat(b, qi, (int64_t)T * n_heads, head_dim);
    iq.inside = 0;
}
static void iq_log_rope(ds4_backend *b, float *x, int T, int n_heads, int head_dim, int n_rot, const ds4_weight *omega,
                        int64_t pos0, bool inverse)
{
    iq.idx_rope_outside +=
        g.decoding && !iq.inside && n_heads == synth->cfg.idx_heads && head_dim == synth->cfg.idx_dim;
    cpu_rope(b, x, T, n_heads, head_dim, n_rot, omega, pos0, inverse);
}

static void test_indexer_query_rope_keeps_bits(void)
{
    REQUIRE(synth && be && !be->indexer_query_rope && !be->rmsnorm_matmul);
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)((i * 37 + 11) % synth->cfg.n_vocab);
    const size_t n = (size_t)N * synth->cfg.n_vocab;
    float *ref = run(tok);
    REQUIRE(ref);
    be->rmsnorm_matmul = stub_rmsnorm_matmul;
    side_mode(0);
    nm_idx_q_b = 0;
    free(run(tok));
    const int scoring = nm_idx_q_b; /* the decoded steps' indexer q_b products, without the op */
    EXPECT_MSG(scoring > 0, "no decoded step scored keys");
    cpu_rope = be->rope;
    be->rope = iq_log_rope;
    be->indexer_query_rope = stub_indexer_query_rope;
    for (int mode = 0; mode < 3; mode += 2) { /* no side ops; the query products first */
        for (int place = 1; place <= (mode ? 2 : 1); place++) {
            side_mode(mode);
            be->side_indexer_weights_beside = place == 2;
            memset(&iq, 0, sizeof iq);
            float *out = run(tok);
            REQUIRE(out);
            EXPECT_MSG(memcmp(ref, out, sizeof(float) * n) == 0, "indexer_query_rope, mode %d, placement %d: logits "
                       "differ", mode, place);
            EXPECT_MSG(iq.calls == scoring && iq.bad == 0 && iq.in_side == 0,
                       "mode %d, placement %d: %d calls for %d scoring layer steps, %d with other arguments, %d beside",
                       mode, place, iq.calls, scoring, iq.bad, iq.in_side);
            EXPECT_MSG(iq.idx_rope_outside == 0, "mode %d: the indexer's RoPE %d times outside the op", mode,
                       iq.idx_rope_outside);
            free(out);
        }
    }
    side_mode(0);
    be->side_indexer_weights_beside = 0;
    be->indexer_query_rope = NULL;
    be->rmsnorm_matmul = NULL;
    be->rope = cpu_rope;
    free(ref);
}

/* ops.h compress_two, a stand-in here (matmul_pair and compressor_push on
 * the CPU's ops, as the contract says): every step of one sequence takes
 * it once in each CSA layer, with that layer's weights and states (the
 * attention's compressor, then the indexer's), and no CSA layer pushes
 * otherwise; decoding with side ops, inside the side region (each of the
 * three placements); the logits bit for bit the in-order ops'. */
static struct {
    int calls, bad, in_side, inside, csa_push_outside;
} ct;
static void (*cpu_push)(ds4_backend *, ds4_comp_state *, const float *, const float *, int, int64_t,
                        const ds4_weight *, const ds4_weight *, float, const ds4_weight *, int,
                        const ds4_kv_numerics *, bool);
static void ct_log_push(ds4_backend *b, ds4_comp_state *st, const float *c, const float *z, int T, int64_t pos0,
                        const ds4_weight *ape, const ds4_weight *norm, float eps, const ds4_weight *om, int nr,
                        const ds4_kv_numerics *nm, bool idx)
{
    ct.csa_push_outside += !ct.inside && st->ratio == 4;
    cpu_push(b, st, c, z, T, pos0, ape, norm, eps, om, nr, nm, idx);
}
static void stub_compress_two(ds4_backend *b, const ds4_weight *const kv[2], const ds4_weight *const gate[2],
                              const float *x, int T, float *const c[2], float *const z[2], ds4_comp_state *const st[2],
                              int64_t pos0, const ds4_weight *const ape[2], const ds4_weight *const norm[2], float eps,
                              const ds4_weight *omega, int n_rot, const ds4_kv_numerics *nm)
{
    int layer = -1;
    for (int il = 0; il < synth->cfg.n_layer; il++) {
        const dsv4_layer *L = &synth->layers[il];
        if (kv[0] == &L->comp_kv && gate[0] == &L->comp_gate && kv[1] == &L->idx_kv && gate[1] == &L->idx_gate &&
            ape[0] == &L->comp_ape && ape[1] == &L->idx_ape && norm[0] == &L->comp_norm && norm[1] == &L->idx_norm)
            layer = il;
    }
    ct.calls++;
    ct.in_side += g.in_side;
    ct.bad += layer < 0 || st[0]->ratio != 4 || st[1]->ratio != 4 || st[1]->out_dim != synth->cfg.idx_dim ||
              st[0]->out_dim != synth->cfg.head_dim || T != (g.decoding ? 1 : N_PRE) ||
              (g.decoding ? pos0 < N_PRE || pos0 >= N : pos0 != 0) || omega != &synth->omega_comp || n_rot != synth->cfg.n_rot ||
              !nm->indexer_qat;
    ct.inside = 1;
    for (int k = 0; k < 2; k++) {
        b->matmul_pair(b, kv[k], gate[k], x, T, c[k], z[k]);
        b->compressor_push(b, st[k], c[k], z[k], T, pos0, ape[k], norm[k], eps, omega, n_rot, nm, k == 1);
    }
    ct.inside = 0;
}

static void test_compress_two_keeps_bits(void)
{
    REQUIRE(synth && be && !be->compress_two && be->matmul_pair && !be->side_begin);
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)((i * 37 + 11) % synth->cfg.n_vocab);
    const size_t n = (size_t)N * synth->cfg.n_vocab;
    float *ref = run(tok);
    REQUIRE(ref);
    int n_csa = 0;
    for (int il = 0; il < synth->cfg.n_layer; il++) n_csa += synth->cfg.compress_ratio[il] == 4;
    cpu_push = be->compressor_push;
    be->compressor_push = ct_log_push;
    be->compress_two = stub_compress_two;
    for (int place = -1; place < 3; place++) { /* -1: no side ops; else test_side_placement_keeps_bits' */
        side_mode(place < 0 ? 0 : place ? 2 : 1);
        be->side_indexer_weights_beside = place == 2;
        memset(&ct, 0, sizeof ct);
        float *out = run(tok);
        REQUIRE(out);
        EXPECT_MSG(memcmp(ref, out, sizeof(float) * n) == 0, "compress_two, placement %d: logits differ", place);
        EXPECT_MSG(ct.calls == n_csa * (1 + N_DEC) && ct.bad == 0 && ct.csa_push_outside == 0,
                   "placement %d: %d calls for %d CSA layers x %d steps, %d with other arguments, %d CSA pushes "
                   "outside it",
                   place, ct.calls, n_csa, 1 + N_DEC, ct.bad, ct.csa_push_outside);
        EXPECT_MSG(ct.in_side == (place < 0 ? 0 : n_csa * N_DEC), "placement %d: %d calls beside", place, ct.in_side);
        free(out);
    }
    side_mode(0);
    be->side_indexer_weights_beside = 0;
    be->compress_two = NULL;
    be->compressor_push = cpu_push;
    free(ref);
}

int main(void)
{
    mkdir("build", 0755);
    mkdir("build/tests", 0755);
    be = ds4_backend_cpu_create(2);
    if (be && synth_write_gguf(&SYNTH_OFFICIAL, 4321, SIDE_PATH)) synth = dsv4_model_load(SIDE_PATH);
    if (!synth) fprintf(stderr, "synthetic model: %s\n", ds4_last_error());
    RUN(test_side_placement_keeps_bits);
    RUN(test_side_run_last_keeps_bits);
    RUN(test_indexer_query_rope_keeps_bits);
    RUN(test_compress_two_keeps_bits);
    if (synth) dsv4_model_free(synth);
    if (be) be->destroy(be);
    return test_finish();
}

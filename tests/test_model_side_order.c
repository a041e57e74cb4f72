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
 *     selection is inside either way; every region is joined.
 *   - With an rmsnorm_matmul that keeps to its contract (here: the two ops
 *     on a copy), the q_a output stays as q_a gave it and q_b and the
 *     indexer's q_b normalize it themselves: the same bits, without side
 *     ops and with them (the indexer's q_b takes the op only where it runs
 *     on the backend's stream, never beside).
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
    int idx_rope_in, idx_rope_out, topk_in, topk_out;
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

static void test_side_placement_keeps_bits(void)
{
    REQUIRE(synth && be);
    REQUIRE(be->rope && be->indexer_topk && !be->side_begin && !be->rmsnorm_matmul);
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)((i * 37 + 11) % synth->cfg.n_vocab);
    const size_t n = (size_t)N * synth->cfg.n_vocab;
    cpu_rope = be->rope;
    cpu_topk = be->indexer_topk;
    be->rope = log_rope;
    be->indexer_topk = log_topk;
    float *ref = run(tok);
    REQUIRE(ref);
    EXPECT_MSG(g.idx_rope_out > 0 && g.topk_out > 0, "no decoded step scored keys (RoPE %d, top-k %d)",
               g.idx_rope_out, g.topk_out);
    be->side_begin = stub_side_begin;
    be->side_end = stub_side_end;
    be->side_join = stub_side_join;
    for (int first = 0; first < 2; first++) {
        memset(&g, 0, sizeof g);
        be->side_indexer_query_first = first;
        float *out = run(tok);
        REQUIRE(out);
        EXPECT_MSG(memcmp(ref, out, sizeof(float) * n) == 0, "query first %d: logits differ from in-order ops", first);
        EXPECT_MSG(g.topk_in > 0 && g.topk_out == 0, "query first %d: selection inside %d, outside %d", first,
                   g.topk_in, g.topk_out);
        if (first)
            EXPECT_MSG(g.idx_rope_out > 0 && g.idx_rope_in == 0, "query first: indexer RoPE inside %d, before %d",
                       g.idx_rope_in, g.idx_rope_out);
        else
            EXPECT_MSG(g.idx_rope_in > 0 && g.idx_rope_out == 0, "default: indexer RoPE inside %d, before %d",
                       g.idx_rope_in, g.idx_rope_out);
        EXPECT_MSG(g.begins == g.ends && g.begins > 0 && g.joins > 0 && g.joins <= g.begins,
                   "query first %d: %d side_begin, %d side_end, %d side_join", first, g.begins, g.ends, g.joins);
        free(out);
    }
    /* with rmsnorm_matmul (qr kept as q_a gave it): the same bits, the
     * indexer's q_b taking the op where it runs on the backend's stream
     * (no side, or its query products first) and never beside */
    be->rmsnorm_matmul = stub_rmsnorm_matmul;
    for (int mode = 0; mode < 3; mode++) { /* no side ops; side, indexer beside; side, query products first */
        be->side_begin = mode ? stub_side_begin : NULL;
        be->side_end = mode ? stub_side_end : NULL;
        be->side_join = mode ? stub_side_join : NULL;
        be->side_indexer_query_first = mode == 2;
        memset(&g, 0, sizeof g);
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

int main(void)
{
    mkdir("build", 0755);
    mkdir("build/tests", 0755);
    be = ds4_backend_cpu_create(2);
    if (be && synth_write_gguf(&SYNTH_OFFICIAL, 4321, SIDE_PATH)) synth = dsv4_model_load(SIDE_PATH);
    if (!synth) fprintf(stderr, "synthetic model: %s\n", ds4_last_error());
    RUN(test_side_placement_keeps_bits);
    if (synth) dsv4_model_free(synth);
    if (be) be->destroy(be);
    return test_finish();
}

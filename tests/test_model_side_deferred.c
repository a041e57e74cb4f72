/*
 * test_model_side_deferred.c - the model's side regions (backend/ops.h
 * side_begin, side_end, side_join) with the side run last: the ops called
 * between side_begin and side_end (the compressors' products and pushes,
 * the indexer's products, RoPE, QAT and selection) are queued and run only
 * at side_join, as a side stream that has not started before the join
 * would. The logits of 20 prefilled and 20 decoded positions of a small
 * model with two CSA layers (tests/model_synth.h) must be bit for bit those
 * of the ops in call order, with the indexer's query products placed
 * either way (side_indexer_query_first). So every op after the join may
 * read what the side writes, and nothing between the fork and the join
 * overwrites what the side reads. test_model_side_order runs the side
 * first (the ops in call order); this one catches a join placed too late,
 * which that one cannot see.
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

#define DEFER_PATH "build/tests/synth-side-deferred.gguf"

static dsv4_model *synth;
static ds4_backend *be;
static ds4_backend cpu; /* the CPU ops */
static int in_side;     /* between side_begin and side_end: ops are queued */

/* A queued call: its kind and arguments. These are the ops the model's
 * side regions call today; one not listed would run at once, ahead of the
 * queued ones before it, and make this test fail where the model is right
 * (add it here). */
enum { K_MM, K_PAIR, K_ROPE, K_QAT, K_TOPK, K_PUSH };
typedef struct {
    int k;
    const ds4_weight *w1, *w2, *w3, *w4;
    const float *x, *x2;
    float *y, *y2;
    int T, a, b, c, d, e;
    int64_t p0, n;
    float eps;
    bool flag;
    void *st;
    const void *nm;
} rec;
enum { QUEUE_CAP = 4096 };
static rec q[QUEUE_CAP];
static int overflow;
static int nq;

static void run_rec(const rec *r)
{
    switch (r->k) {
    case K_MM:
        cpu.matmul(be, r->w1, r->x, r->T, r->y);
        break;
    case K_PAIR:
        cpu.matmul_pair(be, r->w1, r->w2, r->x, r->T, r->y, r->y2);
        break;
    case K_ROPE:
        cpu.rope(be, r->y, r->T, r->a, r->b, r->c, r->w1, r->p0, r->flag);
        break;
    case K_QAT:
        cpu.indexer_qat(be, r->y, r->n, r->a);
        break;
    case K_TOPK:
        cpu.indexer_topk(be, r->x, r->x2, r->T, r->a, r->b, (const float *)r->st, r->p0, r->c, r->d, (int32_t *)r->y);
        break;
    case K_PUSH:
        cpu.compressor_push(be, (ds4_comp_state *)r->st, r->x, r->x2, r->T, r->p0, r->w1, r->w2, r->eps, r->w3, r->a,
                            (const ds4_kv_numerics *)r->nm, r->flag);
        break;
    }
}
static void put(rec r)
{
    if (!in_side)
        run_rec(&r);
    else if (nq < QUEUE_CAP)
        q[nq++] = r;
    else
        overflow = 1;
}
static void w_mm(ds4_backend *b, const ds4_weight *w, const float *x, int T, float *y)
{
    (void)b;
    put((rec){.k = K_MM, .w1 = w, .x = x, .T = T, .y = y});
}
static void w_pair(ds4_backend *b, const ds4_weight *w1, const ds4_weight *w2, const float *x, int T, float *y1,
                   float *y2)
{
    (void)b;
    put((rec){.k = K_PAIR, .w1 = w1, .w2 = w2, .x = x, .T = T, .y = y1, .y2 = y2});
}
static void w_rope(ds4_backend *b, float *x, int T, int h, int d, int nr, const ds4_weight *om, int64_t p0, bool inv)
{
    (void)b;
    put((rec){.k = K_ROPE, .y = x, .T = T, .a = h, .b = d, .c = nr, .w1 = om, .p0 = p0, .flag = inv});
}
static void w_qat(ds4_backend *b, float *x, int64_t n, int len)
{
    (void)b;
    put((rec){.k = K_QAT, .y = x, .n = n, .a = len});
}
static void w_topk(ds4_backend *b, const float *qi, const float *w, int T, int h, int d, const float *keys, int64_t p0,
                   int ratio, int topk, int32_t *sel)
{
    (void)b;
    put((rec){.k = K_TOPK,
              .x = qi,
              .x2 = w,
              .T = T,
              .a = h,
              .b = d,
              .st = (void *)keys,
              .p0 = p0,
              .c = ratio,
              .d = topk,
              .y = (float *)sel});
}
static void w_push(ds4_backend *b, ds4_comp_state *st, const float *c, const float *z, int T, int64_t p0,
                   const ds4_weight *ape, const ds4_weight *norm, float eps, const ds4_weight *om, int nr,
                   const ds4_kv_numerics *nm, bool idx)
{
    (void)b;
    put((rec){.k = K_PUSH,
              .st = st,
              .x = c,
              .x2 = z,
              .T = T,
              .p0 = p0,
              .w1 = ape,
              .w2 = norm,
              .eps = eps,
              .w3 = om,
              .a = nr,
              .nm = nm,
              .flag = idx});
}
static void s_begin(ds4_backend *b)
{
    (void)b;
    in_side = 1;
}
static void s_end(ds4_backend *b)
{
    (void)b;
    in_side = 0;
}
static void s_join(ds4_backend *b)
{
    (void)b;
    for (int i = 0; i < nq; i++)
        run_rec(&q[i]);
    nq = 0;
}

enum { N_PRE = 20, N_DEC = 20, N = N_PRE + N_DEC };
static float *run(const int32_t *tok)
{
    const ds4_kv_numerics nm = dsv4_numerics(&synth->cfg, true);
    dsv4_state *s = NULL;
    if (dsv4_state_create(synth, be, N, N_PRE, &nm, &s) != DS4_OK)
        return NULL;
    const int V = synth->cfg.n_vocab;
    float *out = malloc(sizeof(float) * (size_t)N * V);
    int ok = out && dsv4_forward(s, tok, N_PRE, true, out) == DS4_OK;
    for (int i = N_PRE; ok && i < N; i++)
        ok = dsv4_forward(s, tok + i, 1, true, out + (size_t)i * V) == DS4_OK;
    dsv4_state_free(s);
    if (!ok) {
        free(out);
        return NULL;
    }
    return out;
}

static void test_side_deferred(void)
{
    REQUIRE(synth && be);
    int32_t tok[N];
    for (int i = 0; i < N; i++)
        tok[i] = (int32_t)((i * 37 + 11) % synth->cfg.n_vocab);
    const size_t n = (size_t)N * synth->cfg.n_vocab;
    cpu = *be;
    float *ref = run(tok);
    REQUIRE(ref);
    be->matmul = w_mm;
    be->matmul_pair = cpu.matmul_pair ? w_pair : NULL;
    be->rope = w_rope;
    be->indexer_qat = w_qat;
    be->indexer_topk = w_topk;
    be->compressor_push = w_push;
    be->compressor_push_seqs = NULL;
    be->indexer_topk_seqs = NULL;
    be->side_begin = s_begin;
    be->side_end = s_end;
    be->side_join = s_join;
    for (int first = 0; first < 2; first++) {
        be->side_indexer_query_first = first;
        float *out = run(tok);
        REQUIRE(out);
        EXPECT_MSG(!overflow, "more than %d ops in one side region", QUEUE_CAP);
        EXPECT_MSG(nq == 0, "%d side ops never joined", nq);
        EXPECT_MSG(memcmp(ref, out, sizeof(float) * n) == 0, "deferred side, query first %d: logits differ", first);
        free(out);
    }
    free(ref);
}

int main(void)
{
    mkdir("build", 0755);
    mkdir("build/tests", 0755);
    be = ds4_backend_cpu_create(2);
    if (be && synth_write_gguf(&SYNTH_OFFICIAL, 4321, DEFER_PATH))
        synth = dsv4_model_load(DEFER_PATH);
    RUN(test_side_deferred);
    return test_finish();
}

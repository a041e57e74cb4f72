/*
 * test_imatrix.c - importance-matrix collection (engine/imatrix.c) on the
 * demo model, read back with the quantizer's own reader
 * (tools/convert_imatrix.h, the consumer of the file).
 *
 * What is checked against facts outside the recorder: a collecting
 * session gives bit-identical logits to a plain one (the recorder must not
 * change results); tensors the model feeds the same activation (attn_q_a
 * and attn_kv read the attention input, ffn_gate_inp and the shared
 * expert read the FFN input, gate and up of every expert read the same
 * rows) get identical vectors; for one token, each routed expert's gate
 * vector equals the shared expert's (same single row x), in hash and
 * learned-routing layers alike; the count written is the prompt count.
 */
#include "gguf/gguf.h"
#include "include/ds4.h"
#include "tests/test.h"
#include "tools/convert_imatrix.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEMO "models/ds4-demo.gguf"
#define OUT "build/tests/test_imatrix.dat"

static ds4_model *open_demo(void)
{
    if (access(DEMO, R_OK) != 0) {
        test_skip("%s missing", DEMO);
        return NULL;
    }
    ds4_model *m = ds4_model_open(DEMO, NULL);
    EXPECT_MSG(m != NULL, "open: %s", ds4_last_error());
    return m;
}

static ds4_session *session(ds4_model *m, ds4_imatrix *im)
{
    ds4_session_params p;
    ds4_session_params_default(&p);
    p.n_ctx = 256;
    p.backend = DS4_BACKEND_CPU;
    p.max_chunk = 16; /* several chunks per prompt */
    p.imatrix = im;
    return ds4_session_create(m, &p);
}

static const int32_t toks[] = {0, 128803, 3085, 344, 270, 6102, 294, 8753, 33, 128804, 128822, 671, 6102, 294,
                               8753, 344, 6333, 16, 1, 128803, 19923, 33, 128804, 128822, 19923, 3, 1, 5, 77, 900};
#define NT ((int)(sizeof toks / sizeof toks[0]))

static bool same(const float *a, const float *b, int n)
{
    for (int i = 0; i < n; i++)
        if (fabsf(a[i] - b[i]) > 1e-6f * (fabsf(a[i]) + 1e-12f)) return false;
    return true;
}

static void test_results_unchanged_and_file_consistent(void)
{
    ds4_model *m = open_demo();
    if (!m) return;
    ds4_imatrix *im = ds4_imatrix_create();
    ds4_session *a = session(m, NULL), *b = session(m, im);
    REQUIRE(a && b && im);
    const int V = ds4_model_n_vocab(m);
    float *la = malloc((size_t)NT * V * sizeof *la), *lb = malloc((size_t)NT * V * sizeof *lb);
    REQUIRE(la && lb);
    EXPECT(ds4_session_prefill(a, toks, NT, la) == DS4_OK);
    EXPECT(ds4_session_prefill(b, toks, NT, lb) == DS4_OK);
    EXPECT_MSG(memcmp(la, lb, (size_t)NT * V * sizeof *la) == 0, "collecting changed the logits");
    ds4_imatrix_add_chunk(im);
    ds4_session_reset(b);
    EXPECT(ds4_session_prefill(b, toks, NT / 2, NULL) == DS4_OK);
    ds4_imatrix_add_chunk(im);
    EXPECT(ds4_imatrix_save(im, OUT, "unit test") == DS4_OK);

    convert_imatrix *f = convert_imatrix_load(OUT);
    REQUIRE(f != NULL);
    EXPECT(convert_imatrix_count(f) == ds4_imatrix_n_entries(im));
    ds4_status st = DS4_OK;
    char n1[96], n2[96];
    for (int l = 0; l < ds4_model_n_layer(m); l++) {
        snprintf(n1, sizeof n1, "blk.%d.attn_q_a.weight", l);
        snprintf(n2, sizeof n2, "blk.%d.attn_kv.weight", l);
        const float *q = convert_imatrix_find(f, n1, 64, 0, 1, &st), *kv = convert_imatrix_find(f, n2, 64, 0, 1, &st);
        EXPECT_MSG(q && kv && same(q, kv, 64), "layer %d: q_a and kv inputs differ", l);
        snprintf(n1, sizeof n1, "blk.%d.ffn_gate_inp.weight", l);
        snprintf(n2, sizeof n2, "blk.%d.ffn_up_shexp.weight", l);
        const float *gi = convert_imatrix_find(f, n1, 64, 0, 1, &st), *su = convert_imatrix_find(f, n2, 64, 0, 1, &st);
        EXPECT_MSG(gi && su && same(gi, su, 64), "layer %d: router and shared expert inputs differ", l);
        bool expert_seen = false;
        for (int e = 0; e < 8; e++) {
            snprintf(n1, sizeof n1, "blk.%d.ffn_gate_exps.weight", l);
            snprintf(n2, sizeof n2, "blk.%d.ffn_up_exps.weight", l);
            const float *g = convert_imatrix_find(f, n1, 64, (uint64_t)e, 8, &st);
            const float *u = convert_imatrix_find(f, n2, 64, (uint64_t)e, 8, &st);
            EXPECT_MSG(g && u && same(g, u, 64), "layer %d expert %d: gate and up differ", l, e);
            expert_seen |= g != NULL;
        }
        EXPECT(expert_seen);
        snprintf(n1, sizeof n1, "blk.%d.ffn_down_exps.weight", l);
        EXPECT_MSG(convert_imatrix_find(f, n1, 128, 0, 8, &st) != NULL, "layer %d: no down_exps entry (F = 128)", l);
    }
    EXPECT(st == DS4_OK);
    convert_imatrix_free(f);

    /* ncall = 2 prompts: the raw file stores mean * 2. */
    size_t len;
    unsigned char *raw = test_read_file(OUT, &len);
    REQUIRE(raw && len > 16);
    int32_t n, nl, ncall;
    memcpy(&n, raw, 4);
    memcpy(&nl, raw + 4, 4);
    memcpy(&ncall, raw + 8 + nl, 4);
    EXPECT(n == ds4_imatrix_n_entries(im));
    EXPECT_MSG(ncall == 2, "ncall %d", ncall);
    EXPECT(len > 9 && memcmp(raw + len - 9, "unit test", 9) == 0);
    free(raw);
    free(la);
    free(lb);
    ds4_session_free(a);
    ds4_session_free(b);
    ds4_imatrix_free(im);
    ds4_model_close(m);
    remove(OUT);
}

/* One token: every routed expert that saw it saw exactly the shared
 * expert's row, and the rest get the mean of the seen ones: all equal. */
static void test_single_token_experts_equal_shared(void)
{
    ds4_model *m = open_demo();
    if (!m) return;
    ds4_imatrix *im = ds4_imatrix_create();
    ds4_session *s = session(m, im);
    REQUIRE(s && im);
    int32_t t = 6102;
    EXPECT(ds4_session_prefill(s, &t, 1, NULL) == DS4_OK);
    ds4_imatrix_add_chunk(im);
    EXPECT(ds4_imatrix_unseen_experts(im) > 0); /* 2 of 8 experts per layer: 6 unseen per tensor */
    EXPECT(ds4_imatrix_save(im, OUT, NULL) == DS4_OK);
    convert_imatrix *f = convert_imatrix_load(OUT);
    REQUIRE(f != NULL);
    ds4_status st = DS4_OK;
    char n1[96], n2[96];
    for (int l = 0; l < ds4_model_n_layer(m); l++) {
        snprintf(n1, sizeof n1, "blk.%d.ffn_gate_shexp.weight", l);
        snprintf(n2, sizeof n2, "blk.%d.ffn_gate_exps.weight", l);
        const float *sh = convert_imatrix_find(f, n1, 64, 0, 1, &st);
        REQUIRE(sh != NULL);
        for (int e = 0; e < 8; e++) {
            const float *g = convert_imatrix_find(f, n2, 64, (uint64_t)e, 8, &st);
            EXPECT_MSG(g && same(g, sh, 64), "layer %d expert %d differs from the shared expert", l, e);
        }
    }
    convert_imatrix_free(f);
    ds4_session_free(s);
    ds4_imatrix_free(im);
    ds4_model_close(m);
    remove(OUT);
}

/* Collect over `n` tokens into a fresh imatrix and load the file. */
static convert_imatrix *collect(ds4_model *m, const int32_t *t, int n)
{
    ds4_imatrix *im = ds4_imatrix_create();
    ds4_session *s = im ? session(m, im) : NULL;
    bool ok = s && ds4_session_prefill(s, t, n, NULL) == DS4_OK;
    ds4_imatrix_add_chunk(im);
    ok = ok && ds4_imatrix_save(im, OUT, NULL) == DS4_OK;
    ds4_session_free(s);
    ds4_imatrix_free(im);
    convert_imatrix *f = ok ? convert_imatrix_load(OUT) : NULL;
    remove(OUT);
    return f;
}

/* Layer 0 routes by token id through the GGUF's tid2eid table: with the
 * prompt [t1, t2], an expert only t1 uses must hold x1^2, one only t2
 * uses x2^2, one both use their mean, the others the mean of the seen
 * slabs. x1^2 comes from the prompt [t1] alone (causal: same row), x2^2
 * from the shared expert's mean of the two rows. This pins each slab to
 * its expert index. */
static void test_expert_slabs_follow_hash_routing(void)
{
    ds4_model *m = open_demo();
    if (!m) return;
    ds4_gguf *g = ds4_gguf_open(DEMO);
    const ds4_gguf_tensor *tt = g ? ds4_gguf_get_tensor(g, "blk.0.ffn_gate_tid2eid.weight") : NULL;
    REQUIRE(tt && tt->ne[0] == 2);
    const int32_t *tid = tt->data;
    const int32_t t1 = 6102;
    int32_t t2 = -1;
    for (int32_t c = 100; c < 129000 && t2 < 0; c++) /* a token sharing exactly one expert with t1 */
        if ((tid[2 * c] == tid[2 * t1]) + (tid[2 * c] == tid[2 * t1 + 1]) + (tid[2 * c + 1] == tid[2 * t1]) +
                (tid[2 * c + 1] == tid[2 * t1 + 1]) == 1)
            t2 = c;
    REQUIRE(t2 >= 0);
    const int32_t two[2] = {t1, t2};
    convert_imatrix *a = collect(m, &t1, 1), *b = collect(m, two, 2);
    REQUIRE(a && b);
    ds4_status st = DS4_OK;
    const float *x1 = convert_imatrix_find(a, "blk.0.ffn_gate_shexp.weight", 64, 0, 1, &st);
    const float *sb = convert_imatrix_find(b, "blk.0.ffn_gate_shexp.weight", 64, 0, 1, &st);
    REQUIRE(x1 && sb);
    float want[8][64], seen_mean[64] = {0};
    int n_seen = 0;
    for (int e = 0; e < 8; e++) {
        bool u1 = tid[2 * t1] == e || tid[2 * t1 + 1] == e, u2 = tid[2 * t2] == e || tid[2 * t2 + 1] == e;
        for (int c = 0; c < 64; c++) {
            float x2 = 2 * sb[c] - x1[c];
            want[e][c] = u1 && u2 ? (x1[c] + x2) / 2 : u1 ? x1[c] : u2 ? x2 : -1;
        }
        if (u1 || u2) {
            n_seen++;
            for (int c = 0; c < 64; c++) seen_mean[c] += want[e][c];
        }
    }
    EXPECT(n_seen == 3);
    for (int e = 0; e < 8; e++) {
        const float *got = convert_imatrix_find(b, "blk.0.ffn_gate_exps.weight", 64, (uint64_t)e, 8, &st);
        REQUIRE(got);
        for (int c = 0; c < 64; c++) {
            float w = want[e][c] < 0 ? seen_mean[c] / (float)n_seen : want[e][c];
            EXPECT_MSG(fabsf(got[c] - w) <= 1e-4f * (fabsf(w) + 1e-3f), "expert %d column %d: %g, expected %g", e, c,
                       (double)got[c], (double)w);
            if (fabsf(got[c] - w) > 1e-4f * (fabsf(w) + 1e-3f)) break;
        }
    }
    convert_imatrix_free(a);
    convert_imatrix_free(b);
    ds4_gguf_close(g);
    ds4_model_close(m);
}

/* The recorder is backend-neutral: on a CUDA session (when this build has
 * CUDA and a GPU is there) it must collect what the CPU collects, up to
 * the GPU's rounding (its int8 activation matvec: 5% is far below the
 * spread between columns or experts, which a mix-up would show). Skipped,
 * saying why, elsewhere. */
static void test_cuda_matches_cpu(void)
{
    ds4_model *m = open_demo();
    if (!m) return;
    ds4_imatrix *ic = ds4_imatrix_create(), *ig = ds4_imatrix_create();
    ds4_session_params p;
    ds4_session_params_default(&p);
    p.n_ctx = 256;
    p.backend = DS4_BACKEND_CUDA;
    p.imatrix = ig;
    ds4_session *g = ds4_session_create(m, &p);
    if (!g) {
        test_skip("no CUDA session: %s", ds4_last_error());
        ds4_imatrix_free(ic);
        ds4_imatrix_free(ig);
        ds4_model_close(m);
        return;
    }
    ds4_session *c = session(m, ic);
    REQUIRE(c);
    EXPECT(ds4_session_prefill(c, toks, NT, NULL) == DS4_OK);
    EXPECT(ds4_session_prefill(g, toks, NT, NULL) == DS4_OK);
    ds4_imatrix_add_chunk(ic);
    ds4_imatrix_add_chunk(ig);
    EXPECT(ds4_imatrix_n_entries(ic) == ds4_imatrix_n_entries(ig));
    EXPECT(ds4_imatrix_save(ic, OUT, NULL) == DS4_OK);
    convert_imatrix *fc = convert_imatrix_load(OUT);
    EXPECT(ds4_imatrix_save(ig, OUT, NULL) == DS4_OK);
    convert_imatrix *fg = convert_imatrix_load(OUT);
    REQUIRE(fc && fg);
    static const struct {
        const char *suffix;
        int ne0, slabs;
    } t[] = {{"attn_q_a", 64, 1}, {"attn_q_b", 64, 1}, {"attn_output_a", 128, 1}, {"ffn_gate_exps", 64, 8},
             {"ffn_down_exps", 128, 8}, {"ffn_down_shexp", 128, 1}};
    ds4_status st = DS4_OK;
    char name[96];
    for (int l = 0; l < ds4_model_n_layer(m); l++)
        for (size_t k = 0; k < sizeof t / sizeof t[0]; k++)
            for (int e = 0; e < t[k].slabs; e++) {
                snprintf(name, sizeof name, "blk.%d.%s.weight", l, t[k].suffix);
                const float *a = convert_imatrix_find(fc, name, (uint64_t)t[k].ne0, (uint64_t)e, (uint64_t)t[k].slabs, &st);
                const float *b = convert_imatrix_find(fg, name, (uint64_t)t[k].ne0, (uint64_t)e, (uint64_t)t[k].slabs, &st);
                REQUIRE(a && b);
                for (int i = 0; i < t[k].ne0; i++)
                    EXPECT_MSG(fabsf(a[i] - b[i]) <= 5e-2f * (fabsf(a[i]) + 1e-3f), "%s expert %d column %d: cpu %g cuda %g",
                               name, e, i, (double)a[i], (double)b[i]);
            }
    convert_imatrix_free(fc);
    convert_imatrix_free(fg);
    ds4_session_free(c);
    ds4_session_free(g);
    ds4_imatrix_free(ic);
    ds4_imatrix_free(ig);
    ds4_model_close(m);
    remove(OUT);
}

static void test_nothing_collected_is_an_error(void)
{
    ds4_imatrix *im = ds4_imatrix_create();
    REQUIRE(im);
    EXPECT(ds4_imatrix_save(im, OUT, NULL) == DS4_ERR_INVALID);
    EXPECT(strstr(ds4_last_error(), "nothing collected") != NULL);
    EXPECT(access(OUT, F_OK) != 0);
    ds4_imatrix_free(im);
}

int main(void)
{
    RUN(test_results_unchanged_and_file_consistent);
    RUN(test_single_token_experts_equal_shared);
    RUN(test_expert_slabs_follow_hash_routing);
    RUN(test_cuda_matches_cpu);
    RUN(test_nothing_collected_is_an_error);
    return test_finish();
}

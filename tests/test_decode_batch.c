/*
 * test_decode_batch.c - the batched decode step (ds4_session_decode_batch
 * over model/dsv4_forward_batch.c: one forward over one row per session)
 * against ds4_session_decode on copies of the same sessions.
 *
 * Sessions are prefilled to different lengths from different offsets of a
 * fixture sequence, copied by snapshot/restore, then stepped: the batch
 * with decode_batch, the copies one by one. Lengths are picked so that the
 * steps cross the model's boundaries: a CSA window (ratio 4) completing,
 * the sliding ring wrapping and an HCA window completing (tiny-a: window
 * and ratio 128, so position 127; the synthetic model: 16), the indexer
 * starting to score (tiny-a: top-k 32, so from position 131; synthetic:
 * top-4, from 19), and a session far past top-k. Models: tiny-a with f32
 * weights and with Q8_0/F16 (quantized activations, 4-token kernel tiles),
 * and a random model of the shape the official numerics need (FP8/f16 KV
 * rounding, indexer Hadamard+FP4, a hash-routed layer).
 *
 * Expected: every step's logits within 1e-5 of the single decode's, the
 * states equal afterwards (snapshots compared; continuing both gives the
 * same logits), each session's own attention counters equal. On the CPU
 * they are bit-identical: the batched step does the same per-row work,
 * and the matmul kernels keep one accumulator per token in a tile, so a
 * row does not depend on the rows beside it. Other backends (CUDA, run by
 * the same binary on a GPU machine) are held to the 1e-5 bound.
 *
 * Errors: repeated sessions, another model, a full context, a token
 * outside the vocabulary are refused and named with nothing moved;
 * sessions of different numerics fall back to single decodes (same
 * results); more sessions than max_chunk go in groups. At the model
 * level: dsv4_forward_batch against dsv4_forward, its max_chunk limit, and
 * a state on a backend that cannot share memory.
 */
#include "backend/ops.h"
#include "include/ds4.h"
#include "model/dsv4_model.h"
#include "model/dsv4_state.h"
#include "tests/model_fixture.h"
#include "tests/model_synth.h"
#include "tests/test.h"
#if DS4_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TINY_A "tests/data/dsv4-tiny-a"
#define GGUF_A "build/tests/tiny-a-f32-batch.gguf"
#define GGUF_A_Q8 "build/tests/tiny-a-q8_0-batch.gguf"
#define GGUF_SYNTH "build/tests/synth-official-batch.gguf"

static ds4_model *model_a, *model_a_q8, *model_synth;
static int32_t *tok_a, tok_synth[400];
static int64_t n_tok_a;

/* The sessions of this binary run on the CPU unless it was built with CUDA,
 * a GPU is present and DS4_BACKEND does not ask for the CPU. */
static bool on_cpu(void)
{
    const char *e = getenv("DS4_BACKEND");
    if (e && !strcmp(e, "cpu")) return true;
#if DS4_HAVE_CUDA
    return ds4_cuda_device_count() == 0;
#else
    return true;
#endif
}

static ds4_session *mk(ds4_model *m, int64_t n_ctx, ds4_numerics nm, int max_chunk)
{
    ds4_session_params p;
    ds4_session_params_default(&p);
    p.n_ctx = n_ctx;
    p.numerics = nm;
    p.n_threads = 2;
    p.max_chunk = max_chunk;
    ds4_session *s = ds4_session_create(m, &p);
    if (!s) fprintf(stderr, "session: %s\n", ds4_last_error());
    return s;
}

/* A copy of s (snapshot + restore into a fresh session). */
static ds4_session *copy_of(ds4_model *m, ds4_session *s, int64_t n_ctx, ds4_numerics nm)
{
    void *snap = NULL;
    size_t len = 0;
    ds4_session *c = mk(m, n_ctx, nm, 128);
    if (!c || ds4_session_snapshot(s, &snap, &len) != DS4_OK || ds4_session_restore(c, snap, len) != DS4_OK) {
        ds4_session_free(c);
        c = NULL;
    }
    free(snap);
    return c;
}

/* Snapshots of a and b: the same length and header (logits flag, magic,
 * version, numerics, position, shape), the f32 state within 1e-5
 * (relative above 1); *identical: every byte equal. */
static bool states_equal(ds4_session *a, ds4_session *b, int n_layer, int V, bool *identical)
{
    void *sa = NULL, *sb = NULL;
    size_t la = 0, lb = 0;
    bool ok = ds4_session_snapshot(a, &sa, &la) == DS4_OK && ds4_session_snapshot(b, &sb, &lb) == DS4_OK && la == lb;
    size_t logits_at = 4, header_at = 4 + (size_t)V * 4, body_at = header_at + 8 + 4 * (10 + (size_t)n_layer);
    ok = ok && la >= body_at && memcmp(sa, sb, logits_at) == 0 &&
         memcmp((char *)sa + header_at, (char *)sb + header_at, body_at - header_at) == 0;
    *identical = ok && memcmp(sa, sb, la) == 0;
    for (size_t at = logits_at; ok && at + 4 <= la; at += 4) {
        if (at == header_at) at = body_at;
        if (at + 4 > la) break;
        float x, y;
        memcpy(&x, (char *)sa + at, 4);
        memcpy(&y, (char *)sb + at, 4);
        double tol = 1e-5 * (fabs(x) > 1 ? fabs(x) : 1);
        ok = fabs((double)x - y) <= tol || (isinf(x) && x == y);
    }
    free(sa);
    free(sb);
    return ok;
}

typedef struct {
    ds4_model *m;
    ds4_numerics nm;
    const int32_t *tok; /* the fixture sequence the prompts are cut from */
    int64_t n_ctx;
    int topk;   /* the model's indexer top-k (CSA ratio 4), to know which steps score */
    const char *what;
} batch_case;

/* Session k: the prompt tok[7k .. 7k+len[k]), then `steps` steps fed
 * tok[7k+len[k]+step]. */
static void check_batch(const batch_case *bc, const int *len, int n, int steps)
{
    enum { MAXN = 8 };
    int V = ds4_model_n_vocab(bc->m), L = ds4_model_n_layer(bc->m);
    ds4_session *b[MAXN] = {0}, *r[MAXN] = {0};
    ds4_session_stats b0[MAXN], r0[MAXN], b1[MAXN], r1[MAXN];
    bool cpu = on_cpu();
    for (int k = 0; k < n; k++) {
        b[k] = mk(bc->m, bc->n_ctx, bc->nm, 128);
        REQUIRE(b[k] && ds4_session_prefill(b[k], bc->tok + 7 * k, len[k], NULL) == DS4_OK);
        REQUIRE((r[k] = copy_of(bc->m, b[k], bc->n_ctx, bc->nm)) != NULL);
        ds4_session_get_stats(b[k], &b0[k]);
        ds4_session_get_stats(r[k], &r0[k]);
    }
    double worst = 0;
    bool index_split = false; /* some step has sessions that score and sessions that do not */
    for (int step = 0; step < steps; step++) {
        int32_t next[MAXN];
        int scoring = 0;
        for (int k = 0; k < n; k++) {
            next[k] = bc->tok[7 * k + len[k] + step];
            scoring += (len[k] + step + 1) / 4 > bc->topk;
        }
        index_split |= scoring > 0 && scoring < n;
        REQUIRE(ds4_session_decode_batch(b, next, n) == DS4_OK);
        for (int k = 0; k < n; k++) {
            REQUIRE(ds4_session_decode(r[k], next[k]) == DS4_OK);
            EXPECT(ds4_session_n_past(b[k]) == len[k] + step + 1);
            double d = test_max_abs_diff(ds4_session_logits(b[k]), ds4_session_logits(r[k]), (size_t)V);
            if (!(d <= worst)) worst = d;
        }
    }
    int same_state = 0, identical = 0;
    for (int k = 0; k < n; k++) {
        bool id = false;
        same_state += states_equal(b[k], r[k], L, V, &id);
        identical += id;
        ds4_session_get_stats(b[k], &b1[k]);
        ds4_session_get_stats(r[k], &r1[k]);
    }
    /* each session's own ops are counted for it; the shared weight rows
     * add up to the single decodes' unless the indexer's weights ran for
     * all rows because only some sessions scored */
    int counters_ok = 0;
    uint64_t mm_b = 0, mm_r = 0;
    for (int k = 0; k < n; k++) {
        counters_ok += b1[k].rows_attended - b0[k].rows_attended == r1[k].rows_attended - r0[k].rows_attended &&
                       b1[k].compressor_pushes - b0[k].compressor_pushes ==
                           r1[k].compressor_pushes - r0[k].compressor_pushes &&
                       b1[k].rows_emitted - b0[k].rows_emitted == r1[k].rows_emitted - r0[k].rows_emitted &&
                       b1[k].indexer_keys_scored - b0[k].indexer_keys_scored ==
                           r1[k].indexer_keys_scored - r0[k].indexer_keys_scored;
        mm_b += b1[k].matmul_rows - b0[k].matmul_rows;
        mm_r += r1[k].matmul_rows - r0[k].matmul_rows;
    }
    /* continuing both one by one gives the same logits */
    double after = 0;
    for (int k = 0; k < n; k++)
        for (int i = 0; i < 2; i++) {
            int32_t t = bc->tok[7 * k + len[k] + steps + i];
            REQUIRE(ds4_session_decode(b[k], t) == DS4_OK && ds4_session_decode(r[k], t) == DS4_OK);
            double d = test_max_abs_diff(ds4_session_logits(b[k]), ds4_session_logits(r[k]), (size_t)V);
            if (!(d <= after)) after = d;
        }
    printf("    %s, %d session%s, %d steps: max|dlogit| %.3g, then %.3g; states equal %d/%d (bit-identical %d); "
           "weight rows %llu vs %llu\n",
           bc->what, n, n > 1 ? "s" : "", steps, worst, after, same_state, n, identical, (unsigned long long)mm_b,
           (unsigned long long)mm_r);
    EXPECT_MSG(worst <= 1e-5, "%s, n %d: batched logits differ by %.3g", bc->what, n, worst);
    EXPECT_MSG(after <= 1e-5, "%s, n %d: continuations differ by %.3g", bc->what, n, after);
    EXPECT_MSG(same_state == n, "%s, n %d: %d of %d states differ", bc->what, n, n - same_state, n);
    EXPECT_MSG(!cpu || (worst == 0 && identical == n), "%s, n %d: not bit-identical on the CPU", bc->what, n);
    EXPECT_MSG(counters_ok == n, "%s, n %d: attention counters differ for %d sessions", bc->what, n, n - counters_ok);
    EXPECT_MSG(index_split ? mm_b > mm_r : mm_b == mm_r, "%s, n %d: weight rows %llu, single decodes %llu",
               bc->what, n, (unsigned long long)mm_b, (unsigned long long)mm_r);
    for (int k = 0; k < n; k++) {
        ds4_session_free(b[k]);
        ds4_session_free(r[k]);
    }
}

/* tiny-a: sliding, sliding, CSA, HCA(128), CSA, HCA(128); window 128,
 * top-k 32. Lengths 3 (a CSA window completes at 3, the next at 7), 127
 * (the ring wraps and the first HCA window completes), 131 (the indexer
 * scores from position 131 on), 400 (far past top-k), 64. */
static const int LEN_A1[] = {131}, LEN_A2[] = {3, 127}, LEN_A3[] = {127, 131, 400}, LEN_A5[] = {3, 64, 127, 131, 400};

static void test_tiny_a_f32(void)
{
    REQUIRE(model_a);
    batch_case bc = {model_a, DS4_NUMERICS_HF, tok_a, 448, 32, "tiny-a f32"};
    check_batch(&bc, LEN_A1, 1, 6);
    check_batch(&bc, LEN_A2, 2, 6);
    check_batch(&bc, LEN_A3, 3, 6);
    check_batch(&bc, LEN_A5, 5, 6);
}

static void test_tiny_a_q8_0(void)
{
    REQUIRE(model_a_q8);
    batch_case bc = {model_a_q8, DS4_NUMERICS_HF, tok_a, 448, 32, "tiny-a q8_0"};
    check_batch(&bc, LEN_A2, 2, 6);
    check_batch(&bc, LEN_A5, 5, 6);
}

/* the random model: sliding, CSA, HCA(16), CSA; window 16, top-4, layer 0
 * hash-routed. Lengths 2 (CSA windows complete at 3, 7), 15 (ring wrap and
 * HCA window at 15), 17 (scoring from 19), 60 (past top-k), 31. */
static void test_official_numerics(void)
{
    REQUIRE(model_synth);
    static const int len[] = {2, 15, 17, 60, 31};
    batch_case bc = {model_synth, DS4_NUMERICS_OFFICIAL, tok_synth, 128, 4, "synthetic official"};
    check_batch(&bc, len, 3, 6);
    check_batch(&bc, len, 5, 6);
}

/* Bad batches are refused, named, and nothing moves. */
static void test_errors(void)
{
    REQUIRE(model_a && model_a_q8);
    ds4_session *s[3], *full = mk(model_a, 5, DS4_NUMERICS_HF, 128), *other = mk(model_a_q8, 64, DS4_NUMERICS_HF, 128);
    REQUIRE(full && other && ds4_session_prefill(full, tok_a, 5, NULL) == DS4_OK);
    for (int k = 0; k < 3; k++) {
        s[k] = mk(model_a, 64, DS4_NUMERICS_HF, 128);
        REQUIRE(s[k] && ds4_session_prefill(s[k], tok_a, 4 + k, NULL) == DS4_OK);
    }
    int32_t t[3] = {5, 6, 7};
    ds4_session *dup[3] = {s[0], s[1], s[0]}, *mixed_model[3] = {s[0], other, s[2]},
                *with_full[3] = {s[0], s[1], full};
    EXPECT(ds4_session_decode_batch(dup, t, 3) == DS4_ERR_INVALID);
    EXPECT_MSG(strstr(ds4_last_error(), "session 2 of 3 is session 0 again"), "message: %s", ds4_last_error());
    EXPECT(ds4_session_decode_batch(mixed_model, t, 3) == DS4_ERR_INVALID);
    EXPECT_MSG(strstr(ds4_last_error(), "session 1 of 3 is of another model"), "message: %s", ds4_last_error());
    EXPECT(ds4_session_decode_batch(with_full, t, 3) == DS4_ERR_INVALID);
    EXPECT_MSG(strstr(ds4_last_error(), "session 2 of 3: context full (5 of 5"), "message: %s", ds4_last_error());
    int32_t bad[3] = {5, ds4_model_n_vocab(model_a), 7};
    EXPECT(ds4_session_decode_batch(s, bad, 3) == DS4_ERR_INVALID);
    EXPECT_MSG(strstr(ds4_last_error(), "session 1 of 3: token id") && strstr(ds4_last_error(), "outside vocabulary"),
               "message: %s", ds4_last_error());
    EXPECT(ds4_session_decode_batch(s, t, 0) == DS4_OK);
    EXPECT(ds4_session_decode_batch(NULL, t, 2) == DS4_ERR_INVALID);
    for (int k = 0; k < 3; k++) EXPECT(ds4_session_n_past(s[k]) == 4 + k);
    EXPECT(ds4_session_n_past(full) == 5 && ds4_session_n_past(other) == 0);
    for (int k = 0; k < 3; k++) ds4_session_free(s[k]);
    ds4_session_free(full);
    ds4_session_free(other);
}

/* Sessions that cannot share one pass (here: different numerics) still
 * decode together, each on its own; results as single decodes. And more
 * sessions than the first one's max_chunk go in groups. */
static void test_fallback_and_groups(void)
{
    REQUIRE(model_synth && model_a);
    int V = ds4_model_n_vocab(model_synth);
    ds4_numerics nms[3] = {DS4_NUMERICS_OFFICIAL, DS4_NUMERICS_HF, DS4_NUMERICS_OFFICIAL};
    ds4_session *b[5], *r[5];
    for (int k = 0; k < 3; k++) {
        b[k] = mk(model_synth, 64, nms[k], 128);
        REQUIRE(b[k] && ds4_session_prefill(b[k], tok_synth, 10 + 3 * k, NULL) == DS4_OK);
        REQUIRE((r[k] = copy_of(model_synth, b[k], 64, nms[k])) != NULL);
    }
    int32_t t[5] = {3, 4, 5, 6, 7};
    double worst = 0;
    for (int step = 0; step < 3; step++) {
        REQUIRE(ds4_session_decode_batch(b, t, 3) == DS4_OK);
        for (int k = 0; k < 3; k++) {
            REQUIRE(ds4_session_decode(r[k], t[k]) == DS4_OK);
            double d = test_max_abs_diff(ds4_session_logits(b[k]), ds4_session_logits(r[k]), (size_t)V);
            if (!(d <= worst)) worst = d;
        }
    }
    EXPECT_MSG(worst == 0, "mixed numerics: logits differ by %.3g from single decodes", worst);
    for (int k = 0; k < 3; k++) {
        ds4_session_free(b[k]);
        ds4_session_free(r[k]);
    }

    /* 5 sessions whose first has max_chunk 2: groups of 2, 2 (the third
     * session's max_chunk is 2 too) and 1 */
    V = ds4_model_n_vocab(model_a);
    worst = 0;
    for (int k = 0; k < 5; k++) {
        b[k] = mk(model_a, 200, DS4_NUMERICS_HF, k % 2 ? 128 : 2);
        REQUIRE(b[k] && ds4_session_prefill(b[k], tok_a + k, 30 + 20 * k, NULL) == DS4_OK);
        REQUIRE((r[k] = copy_of(model_a, b[k], 200, DS4_NUMERICS_HF)) != NULL);
    }
    for (int step = 0; step < 2; step++) {
        REQUIRE(ds4_session_decode_batch(b, t, 5) == DS4_OK);
        for (int k = 0; k < 5; k++) {
            REQUIRE(ds4_session_decode(r[k], t[k]) == DS4_OK);
            EXPECT(ds4_session_n_past(b[k]) == 30 + 20 * k + step + 1);
            double d = test_max_abs_diff(ds4_session_logits(b[k]), ds4_session_logits(r[k]), (size_t)V);
            if (!(d <= worst)) worst = d;
        }
    }
    EXPECT_MSG(worst <= 1e-5 && (!on_cpu() || worst == 0), "groups: logits differ by %.3g", worst);
    for (int k = 0; k < 5; k++) {
        ds4_session_free(b[k]);
        ds4_session_free(r[k]);
    }
}

/* ---- model level (CPU backend) --------------------------------------- */

/* A backend whose memory the CPU backend does not know: only what a state
 * needs to be created and freed. */
static void *fake_alloc(ds4_backend *be, size_t bytes)
{
    (void)be;
    return calloc(1, bytes ? bytes : 4);
}

static void fake_free(ds4_backend *be, void *p)
{
    (void)be;
    free(p);
}

static void test_model_forward_batch(void)
{
    dsv4_model *m = dsv4_model_load(GGUF_A);
    ds4_backend *be = ds4_backend_cpu_create(2), *be2 = ds4_backend_cpu_create(1);
    REQUIRE(m && be && be2);
    int V = m->cfg.n_vocab;
    dsv4_state *bs[3] = {0}, *rs[3] = {0};
    /* batch states on two CPU backend instances (as sessions have), refs on one */
    for (int k = 0; k < 3; k++) {
        REQUIRE(dsv4_state_create(m, k == 1 ? be2 : be, 300, 4, NULL, &bs[k]) == DS4_OK);
        REQUIRE(dsv4_state_create(m, be, 300, 4, NULL, &rs[k]) == DS4_OK);
        for (int64_t i = 0; i < 130 + 60 * k; i += 4) {
            int T = 130 + 60 * k - i < 4 ? (int)(130 + 60 * k - i) : 4;
            REQUIRE(dsv4_forward(bs[k], tok_a + k + i, T, false, NULL) == DS4_OK);
            REQUIRE(dsv4_forward(rs[k], tok_a + k + i, T, false, NULL) == DS4_OK);
        }
    }
    float *lb = malloc((size_t)3 * V * sizeof(float)), *lr = malloc((size_t)V * sizeof(float));
    float *out[3] = {lb, NULL, lb + 2 * (size_t)V}; /* session 1's logits not wanted */
    int32_t t[3] = {11, 22, 33};
    double worst = 0;
    for (int step = 0; step < 3; step++) {
        REQUIRE(dsv4_forward_batch(bs, t, 3, out) == DS4_OK);
        for (int k = 0; k < 3; k++) {
            REQUIRE(dsv4_forward(rs[k], &t[k], 1, false, lr) == DS4_OK);
            EXPECT(bs[k]->n_pos == rs[k]->n_pos);
            if (out[k]) {
                double d = test_max_abs_diff(out[k], lr, (size_t)V);
                if (!(d <= worst)) worst = d;
            }
        }
    }
    EXPECT_MSG(worst == 0, "dsv4_forward_batch vs dsv4_forward: %.3g", worst);
    for (int k = 0; k < 3; k++) {
        size_t n = dsv4_state_snapshot_size(bs[k]);
        void *x = malloc(n), *y = malloc(n);
        EXPECT(dsv4_state_snapshot(bs[k], x, n) == DS4_OK && dsv4_state_snapshot_size(rs[k]) == n &&
               dsv4_state_snapshot(rs[k], y, n) == DS4_OK && memcmp(x, y, n) == 0);
        free(x);
        free(y);
    }
    /* 3 rows > max_chunk 2 of the first state: refused, nothing moves */
    dsv4_state *small = NULL, *alien = NULL;
    REQUIRE(dsv4_state_create(m, be, 300, 2, NULL, &small) == DS4_OK);
    dsv4_state *over[3] = {small, bs[1], bs[2]};
    int64_t p1 = bs[1]->n_pos;
    EXPECT(dsv4_forward_batch(over, t, 3, NULL) == DS4_ERR_INVALID);
    EXPECT_MSG(strstr(ds4_last_error(), "forward_batch: 3 sessions, more than the 2 rows"), "message: %s",
               ds4_last_error());
    EXPECT(small->n_pos == 0 && bs[1]->n_pos == p1);
    /* a state whose memory the CPU backend cannot address */
    ds4_backend fake = *be;
    fake.name = "fake";
    fake.alloc = fake_alloc;
    fake.free = fake_free;
    REQUIRE(dsv4_state_create(m, &fake, 300, 2, NULL, &alien) == DS4_OK);
    dsv4_state *mixed[2] = {bs[0], alien};
    EXPECT(dsv4_forward_batch(mixed, t, 2, NULL) == DS4_ERR_UNSUPPORTED);
    EXPECT_MSG(strstr(ds4_last_error(), "session 1 of 2: its state is on a fake backend"), "message: %s",
               ds4_last_error());
    EXPECT(dsv4_batch_check(mixed, t, 2) == DS4_ERR_UNSUPPORTED);
    dsv4_state_free(alien);
    dsv4_state_free(small);
    for (int k = 0; k < 3; k++) {
        dsv4_state_free(bs[k]);
        dsv4_state_free(rs[k]);
    }
    free(lb);
    free(lr);
    be->destroy(be);
    be2->destroy(be2);
    dsv4_model_free(m);
}

int main(void)
{
    mkdir("build", 0755);
    mkdir("build/tests", 0755);
    float *gold = NULL;
    int V = 0;
    if (fixture_write_gguf(TINY_A, GGUF_A, 0)) model_a = ds4_model_open(GGUF_A, NULL);
    if (fixture_write_gguf(TINY_A, GGUF_A_Q8, 1)) model_a_q8 = ds4_model_open(GGUF_A_Q8, NULL);
    if (synth_write_gguf(&SYNTH_OFFICIAL, 77, GGUF_SYNTH)) model_synth = ds4_model_open(GGUF_SYNTH, NULL);
    if (!model_a || !model_a_q8 || !model_synth) fprintf(stderr, "model open: %s\n", ds4_last_error());
    if (!fixture_sequence(TINY_A, 0, &tok_a, &n_tok_a, &gold, &V) || n_tok_a < 448) {
        fprintf(stderr, "tiny-a sequence 0: missing or shorter than 448 tokens\n");
        ds4_model_close(model_a);
        model_a = NULL;
    }
    free(gold);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 400; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        tok_synth[i] = (int32_t)(x % (uint64_t)SYNTH_OFFICIAL.n_vocab);
    }
    RUN(test_tiny_a_f32);
    RUN(test_tiny_a_q8_0);
    RUN(test_official_numerics);
    RUN(test_errors);
    RUN(test_fallback_and_groups);
    RUN(test_model_forward_batch);
    ds4_model_close(model_a);
    ds4_model_close(model_a_q8);
    ds4_model_close(model_synth);
    free(tok_a);
    return test_finish();
}

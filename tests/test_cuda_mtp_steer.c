/*
 * test_cuda_mtp_steer.c - speculative decoding (--mtp) and directional
 * steering on the CUDA backend, on the demo model and its trained MTP
 * block (models/ds4-demo.gguf, models/ds4-demo-mtp.gguf):
 *   - greedy tokens with speculation (1..3 drafts) equal CUDA's plain
 *     greedy tokens, and how far CUDA's agree with the CPU's;
 *   - the two rollback schemes (undo record, full snapshot) leave the same
 *     state on CUDA, byte for byte, and how far a speculated state is from
 *     the state of the same tokens fed one by one on CUDA;
 *   - a step trimmed inside its drafts goes on with plain greedy's tokens;
 *   - steered logits on CUDA against the CPU's (the gap may not exceed
 *     twice the unsteered CPU/CUDA gap); scale 0 is bit-identical to no
 *     steering on CUDA.
 * Skips (saying why) without nvcc, a CUDA device or the demo files. Run by
 * bench/mtp_steer_gpu.sh on the GPU machine.
 */
#include "include/ds4.h"
#include "include/ds4_sampler.h"
#include "include/ds4_tokenizer.h"
#include "tests/test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Dry run of this test's own logic without a GPU: build it with
 * -DDS4_HAVE_CUDA=1 -DTEST_CPU_AS_CUDA against a CPU-only library and
 * "CUDA" is a second CPU session (every comparison then holds exactly). */
#ifdef TEST_CPU_AS_CUDA
#define DS4_BACKEND_CUDA DS4_BACKEND_CPU
static int ds4_cuda_device_count(void) { return 1; }
#elif DS4_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#endif

#if DS4_HAVE_CUDA

#define DEMO "models/ds4-demo.gguf"
#define DEMO_MTP "models/ds4-demo-mtp.gguf"
#define N_GEN 64

static ds4_model *model;
static int32_t prompts[4][64];
static int n_prompt[4];
static int V;
static int32_t eos;

static ds4_session *open_session(ds4_backend_kind kind)
{
    ds4_session_params p;
    ds4_session_params_default(&p);
    p.n_ctx = 1024;
    p.n_threads = 2;
    p.max_chunk = 16;
    p.backend = kind;
    ds4_session *s = ds4_session_create(model, &p);
    if (!s) fprintf(stderr, "session (backend %d): %s\n", (int)kind, ds4_last_error());
    return s;
}

/* greedy tokens after prompt q (stops after EOS); returns the count */
static int greedy_plain(ds4_session *s, int q, int32_t *out)
{
    if (ds4_session_prefill(s, prompts[q], n_prompt[q], NULL) != DS4_OK) return -1;
    int n = 0;
    while (n < N_GEN) {
        out[n] = ds4_argmax(ds4_session_logits(s), V);
        if (out[n++] == eos) break;
        if (ds4_session_decode(s, out[n - 1]) != DS4_OK) return -1;
    }
    return n;
}

static int greedy_spec(ds4_session *s, int q, int32_t *out)
{
    if (ds4_session_prefill(s, prompts[q], n_prompt[q], NULL) != DS4_OK) return -1;
    int n = 0;
    int32_t tok = ds4_argmax(ds4_session_logits(s), V), buf[17];
    out[n++] = tok;
    while (n < N_GEN && tok != eos) {
        int k = 0;
        if (ds4_session_decode_spec(s, tok, NULL, NULL, eos, N_GEN - n + 1, buf, &k) != DS4_OK) return -1;
        for (int i = 0; i < k && n < N_GEN; i++) out[n++] = buf[i];
        tok = buf[k - 1];
    }
    return n;
}

static int common(const int32_t *a, int na, const int32_t *b, int nb)
{
    int i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

static double snap_diff(ds4_session *a, ds4_session *b, int *bytes_equal)
{
    void *x = NULL, *y = NULL;
    size_t lx = 0, ly = 0;
    double worst = INFINITY;
    *bytes_equal = 0;
    if (ds4_session_snapshot(a, &x, &lx) == DS4_OK && ds4_session_snapshot(b, &y, &ly) == DS4_OK && lx == ly) {
        *bytes_equal = memcmp(x, y, lx) == 0;
        worst = 0;
        /* both are f32 arrays after the same header words */
        for (size_t i = 0; i + 4 <= lx; i += 4) {
            float u, v;
            memcpy(&u, (char *)x + i, 4);
            memcpy(&v, (char *)y + i, 4);
            double d = fabs((double)u - v);
            if (isfinite(d) && d > worst) worst = d;
        }
    }
    free(x), free(y);
    return worst;
}

static int need(void)
{
    if (ds4_cuda_device_count() <= 0) {
        test_skip("no CUDA device (cudaGetDeviceCount found none)");
        return 0;
    }
    if (!model) {
        test_skip("%s with %s could not be opened: %s", DEMO, DEMO_MTP, ds4_last_error());
        return 0;
    }
    return 1;
}

static void test_cuda_mtp_greedy_identical(void)
{
    if (!need()) return;
    for (int q = 0; q < 4; q++) {
        int32_t cpu[N_GEN], ref[N_GEN], got[N_GEN];
        ds4_session *c = open_session(DS4_BACKEND_CPU), *g = open_session(DS4_BACKEND_CUDA);
        REQUIRE(c && g);
        int nc = greedy_plain(c, q, cpu), ng = greedy_plain(g, q, ref);
        REQUIRE(nc > 0 && ng > 0);
        printf("  prompt %d: CUDA plain greedy agrees with the CPU's on %d of %d tokens\n", q,
               common(cpu, nc, ref, ng), ng);
        for (int nd = 1; nd <= 3; nd++) {
            ds4_session *s = open_session(DS4_BACKEND_CUDA);
            REQUIRE(s);
            REQUIRE(ds4_session_set_mtp(s, nd) == DS4_OK);
            int n = greedy_spec(s, q, got);
            REQUIRE(n > 0);
            ds4_spec_stats st;
            ds4_session_spec_stats(s, &st);
            int same = common(got, n, ref, ng);
            printf("    CUDA, %d drafts: %d/%d tokens equal to CUDA plain; %llu of %llu drafts accepted\n", nd, same,
                   ng, (unsigned long long)st.accepted, (unsigned long long)st.drafted);
            EXPECT_MSG(same == ng && n == ng, "prompt %d, %d drafts: CUDA speculation diverged at token %d", q, nd,
                       same);
            ds4_session_free(s);
        }
        ds4_session_free(c);
        ds4_session_free(g);
    }
}

static const int32_t *oracle_ref;
static int oracle_base;
/* plain greedy's token, wrong at every third position: rejections */
static int32_t oracle(void *ctx, int64_t pos, int32_t draft)
{
    (void)ctx;
    int64_t i = pos - oracle_base;
    if (i < 0 || i >= N_GEN) return draft;
    return i % 3 == 2 ? (oracle_ref[i] + 1) % V : oracle_ref[i];
}

static void test_cuda_rollback_schemes(void)
{
    if (!need()) return;
    static int32_t ref[N_GEN];
    int32_t a[N_GEN], b[N_GEN];
    ds4_session *p = open_session(DS4_BACKEND_CUDA);
    REQUIRE(p);
    int n = greedy_plain(p, 0, ref);
    REQUIRE(n > 8);
    oracle_ref = ref;
    oracle_base = n_prompt[0];
    ds4_session *s[2];
    int ns[2];
    for (int full = 0; full < 2; full++) {
        s[full] = open_session(DS4_BACKEND_CUDA);
        REQUIRE(s[full]);
        REQUIRE(ds4_session_set_mtp(s[full], 3) == DS4_OK);
        ds4_session_spec_full_snapshot(s[full], full);
        ds4_session_spec_draft_hook(s[full], oracle, NULL);
        ns[full] = greedy_spec(s[full], 0, full ? b : a);
        REQUIRE(ns[full] > 0);
    }
    ds4_spec_stats st;
    ds4_session_spec_stats(s[0], &st);
    printf("  3 drafts with rejections: %llu of %llu accepted\n", (unsigned long long)st.accepted,
           (unsigned long long)st.drafted);
    EXPECT(st.accepted > 0 && st.accepted < st.drafted);
    EXPECT_MSG(common(a, ns[0], ref, n) == n, "undo record: tokens differ from plain at %d", common(a, ns[0], ref, n));
    EXPECT_MSG(common(b, ns[1], ref, n) == n, "full snapshot: tokens differ from plain at %d", common(b, ns[1], ref, n));
    int eq = 0;
    double d = snap_diff(s[0], s[1], &eq);
    printf("  undo record vs full snapshot on CUDA: states byte-equal %d (max |d| %.3g)\n", eq, d);
    EXPECT_MSG(eq, "the two rollback schemes left different states on CUDA (max |d| %.3g)", d);
    /* the same tokens fed one by one on CUDA */
    ds4_session *q = open_session(DS4_BACKEND_CUDA);
    REQUIRE(q);
    REQUIRE(ds4_session_prefill(q, prompts[0], n_prompt[0], NULL) == DS4_OK);
    for (int64_t i = 0; i + n_prompt[0] < ds4_session_n_past(s[0]); i++) REQUIRE(ds4_session_decode(q, a[i]) == DS4_OK);
    d = snap_diff(s[0], q, &eq);
    printf("  speculated state vs the same tokens fed one by one on CUDA: byte-equal %d, max |d| %.3g\n", eq, d);
    EXPECT_MSG(d <= 1e-2, "speculated state is %.3g from one-by-one decoding on CUDA", d);
    ds4_session_free(q);
    ds4_session_free(s[0]);
    ds4_session_free(s[1]);
    ds4_session_free(p);
}

static int32_t oracle_all(void *ctx, int64_t pos, int32_t draft)
{
    (void)ctx;
    int64_t i = pos - oracle_base;
    return i < 0 || i >= N_GEN ? draft : oracle_ref[i];
}

static void test_cuda_trim(void)
{
    if (!need()) return;
    static int32_t ref[N_GEN];
    ds4_session *p = open_session(DS4_BACKEND_CUDA);
    REQUIRE(p);
    int n = greedy_plain(p, 2, ref);
    REQUIRE(n > 14);
    oracle_ref = ref;
    oracle_base = n_prompt[2];
    ds4_session *s = open_session(DS4_BACKEND_CUDA);
    REQUIRE(s);
    REQUIRE(ds4_session_set_mtp(s, 4) == DS4_OK);
    ds4_session_spec_draft_hook(s, oracle_all, NULL);
    REQUIRE(ds4_session_prefill(s, prompts[2], n_prompt[2], NULL) == DS4_OK);
    int32_t buf[17];
    int k = 0;
    REQUIRE(ds4_session_decode_spec(s, ref[0], NULL, NULL, eos, 64, buf, &k) == DS4_OK);
    int got = k;
    REQUIRE(ds4_session_decode_spec(s, ref[got], NULL, NULL, eos, 64, buf, &k) == DS4_OK);
    EXPECT_MSG(k == 5, "%d tokens from a step of 4 right drafts", k);
    REQUIRE(ds4_session_spec_trim(s, 1) == DS4_OK);
    EXPECT(ds4_argmax(ds4_session_logits(s), V) == ref[got + 1]);
    got += 1;
    int32_t tok = ref[got];
    int equal = 1;
    while (got + 6 < n) {
        REQUIRE(ds4_session_decode_spec(s, tok, NULL, NULL, eos, 64, buf, &k) == DS4_OK);
        for (int i = 0; i < k && got + 1 + i < n; i++) equal &= buf[i] == ref[got + 1 + i];
        got += k;
        tok = buf[k - 1];
    }
    EXPECT_MSG(equal, "after a trim on CUDA the tokens differ from plain greedy");
    ds4_session_free(s);
    ds4_session_free(p);
}

static double max_diff(const float *a, const float *b)
{
    double w = 0;
    for (int i = 0; i < V; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= w)) w = isnan(d) ? INFINITY : d;
    }
    return w;
}

static void test_cuda_steering_matches_cpu(void)
{
    if (!need()) return;
    int L = ds4_model_n_layer(model), E = ds4_model_n_embd(model);
    float *dirs = malloc((size_t)L * E * sizeof(float));
    float *lc0 = malloc((size_t)V * sizeof(float)), *lg0 = malloc((size_t)V * sizeof(float));
    REQUIRE(dirs && lc0 && lg0);
    uint64_t x = 88172645463325252ull;
    for (int l = 0; l < L; l++) {
        double n2 = 0;
        for (int e = 0; e < E; e++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            float v = (float)((double)(x >> 11) / 9007199254740992.0 - 0.5);
            dirs[(size_t)l * E + e] = v;
            n2 += (double)v * v;
        }
        for (int e = 0; e < E; e++) dirs[(size_t)l * E + e] /= (float)sqrt(n2);
    }
    ds4_session *c0 = open_session(DS4_BACKEND_CPU), *g0 = open_session(DS4_BACKEND_CUDA);
    ds4_session *c = open_session(DS4_BACKEND_CPU), *g = open_session(DS4_BACKEND_CUDA);
    ds4_session *gz = open_session(DS4_BACKEND_CUDA);
    REQUIRE(c0 && g0 && c && g && gz);
    REQUIRE(ds4_session_set_steering(c, dirs, 1.0f, 4.0f) == DS4_OK);
    REQUIRE(ds4_session_set_steering(g, dirs, 1.0f, 4.0f) == DS4_OK);
    REQUIRE(ds4_session_set_steering(gz, dirs, 0.0f, 0.0f) == DS4_OK);
    ds4_session *all[5] = {c0, g0, c, g, gz};
    double gap0 = 0, gap = 0, moved = 0;
    int zero_same = 1, argmax_same = 1;
    for (int step = 0; step < 24; step++) {
        for (int i = 0; i < 5; i++) {
            ds4_status st = step == 0 ? ds4_session_prefill(all[i], prompts[1], n_prompt[1], NULL)
                                      : ds4_session_decode(all[i], prompts[3][step % n_prompt[3]]);
            REQUIRE(st == DS4_OK);
        }
        const float *lc = ds4_session_logits(c), *lg = ds4_session_logits(g);
        memcpy(lc0, ds4_session_logits(c0), (size_t)V * sizeof(float));
        memcpy(lg0, ds4_session_logits(g0), (size_t)V * sizeof(float));
        double d0 = max_diff(lc0, lg0), d = max_diff(lc, lg), m = max_diff(lc, lc0);
        if (d0 > gap0) gap0 = d0;
        if (d > gap) gap = d;
        if (m > moved) moved = m;
        zero_same &= memcmp(ds4_session_logits(gz), lg0, (size_t)V * sizeof(float)) == 0;
        argmax_same &= ds4_argmax(lc, V) == ds4_argmax(lg, V);
    }
    printf("  steering (attn 1, ffn 4), 24 positions: CPU/CUDA max |dlogit| steered %.3g, unsteered %.3g; "
           "steering moves the CPU logits by up to %.3g; argmax equal %d; CUDA scale 0 bit-identical %d\n",
           gap, gap0, moved, argmax_same, zero_same);
    EXPECT_MSG(moved > 10 * gap, "steering's effect %.3g is not far above the CPU/CUDA gap %.3g", moved, gap);
    EXPECT_MSG(gap <= 2 * gap0 + 1e-3, "steered CPU/CUDA gap %.3g vs unsteered %.3g", gap, gap0);
    EXPECT_MSG(zero_same, "scale 0 on CUDA changed the logits");
    for (int i = 0; i < 5; i++) ds4_session_free(all[i]);
    free(dirs), free(lc0), free(lg0);
}

int main(void)
{
    if (ds4_cuda_device_count() > 0) {
        model = ds4_model_open(DEMO, NULL);
        if (model && ds4_model_load_mtp(model, DEMO_MTP) != DS4_OK) {
            ds4_model_close(model);
            model = NULL;
        }
        ds4_tokenizer *tk = model ? ds4_tokenizer_load(DEMO) : NULL;
        static const char *const qs[4] = {"What is the capital of Japan?", "What is the opposite of hot?",
                                           "Count from 1 to 5.", "What's the weather in Oslo?"};
        for (int q = 0; tk && q < 4; q++) {
            ds4_tokens t = {0};
            if (ds4_tokenize(tk, qs[q], strlen(qs[q]), 0, &t) != DS4_OK || t.n > 56) {
                ds4_tokens_free(&t);
                ds4_model_close(model);
                model = NULL;
                break;
            }
            int n = 0;
            prompts[q][n++] = ds4_tokenizer_special(tk, DS4_TOK_BOS);
            prompts[q][n++] = ds4_tokenizer_special(tk, DS4_TOK_USER);
            for (size_t i = 0; i < t.n; i++) prompts[q][n++] = t.ids[i];
            prompts[q][n++] = ds4_tokenizer_special(tk, DS4_TOK_ASSISTANT);
            prompts[q][n++] = ds4_tokenizer_special(tk, DS4_TOK_THINK);
            n_prompt[q] = n;
            ds4_tokens_free(&t);
        }
        if (tk) eos = ds4_tokenizer_special(tk, DS4_TOK_EOS);
        ds4_tokenizer_free(tk);
        if (model) V = ds4_model_n_vocab(model);
    }
    RUN(test_cuda_mtp_greedy_identical);
    RUN(test_cuda_rollback_schemes);
    RUN(test_cuda_trim);
    RUN(test_cuda_steering_matches_cpu);
    ds4_model_close(model);
    return test_finish();
}

#else

int main(void) { return test_skip_all_no_cuda(); }

#endif

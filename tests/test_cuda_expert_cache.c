/*
 * test_cuda_expert_cache.c - the CUDA VRAM expert cache (--gpu-expert-cache;
 * docs/STREAMING.md "CUDA"). On a GPU: logits byte-identical to the same
 * CUDA build without the cache at every budget (one token's experts of a
 * layer, one expert per layer, one token's set, half, all but one, all),
 * prefill in chunks and decode, both eviction policies, on the golden
 * tiny-a (f32 experts: the float kernels; Q8_0: the int8 decode kernels
 * with the down+combine in expert-id order) and on the synthetic model in
 * the official numerics; two sessions of one model, each with its cache.
 * Without a GPU these skip with the reason; the bad values (sizing happens
 * when the model opens) and "the CPU backend has no VRAM cache" run
 * everywhere. The Flash-shaped q2 model is checked from the command line
 * in tests/test_cuda_expert_cache.sh.
 */
#include "tests/test.h"

#include "include/ds4.h"
#include "tests/model_fixture.h"
#include "tests/model_synth.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#if DS4_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#endif

#define TINY_A "tests/data/dsv4-tiny-a"
#define GGUF_A "build/tests/gpucache-tiny-a-f32.gguf"
#define GGUF_A_Q8 "build/tests/gpucache-tiny-a-q8_0.gguf"
#define GGUF_SYNTH "build/tests/gpucache-synth-official.gguf"
#define N_TOK 40
#define PREFILL 24

static int32_t tok_a[N_TOK], tok_s[N_TOK];
static int have_models;

static int have_gpu(void)
{
#if DS4_HAVE_CUDA
    if (ds4_cuda_device_count() > 0) return 1;
    test_skip("no CUDA device (cudaGetDeviceCount found none)");
#else
    test_skip("built without CUDA (nvcc not found at build time)");
#endif
    return 0;
}

/* prefill PREFILL tokens in chunks of 8, decode the rest, on `kind` */
static float *run_model(const char *path, const ds4_model_options *opt, const int32_t *tok, ds4_backend_kind kind)
{
    ds4_model *m = ds4_model_open(path, opt);
    if (!m) {
        fprintf(stderr, "open %s: %s\n", path, ds4_last_error());
        return NULL;
    }
    ds4_session_params p;
    ds4_session_params_default(&p);
    p.n_ctx = N_TOK;
    p.max_chunk = 8;
    p.n_threads = 2;
    p.backend = kind;
    ds4_session *s = ds4_session_create(m, &p);
    int V = ds4_model_n_vocab(m), ok = s != NULL;
    float *lg = malloc((size_t)N_TOK * (size_t)V * sizeof(float));
    ok = ok && lg && ds4_session_prefill(s, tok, PREFILL, lg) == DS4_OK;
    for (int i = PREFILL; ok && i < N_TOK; i++) {
        ok = ds4_session_decode(s, tok[i]) == DS4_OK;
        if (ok) memcpy(lg + (size_t)i * V, ds4_session_logits(s), (size_t)V * sizeof(float));
    }
    if (!ok) {
        fprintf(stderr, "run %s: %s\n", path, ds4_last_error());
        free(lg);
        lg = NULL;
    }
    ds4_session_free(s);
    ds4_model_close(m);
    return lg;
}

static void check_budgets(const char *path, const int32_t *tok, int n_layer, int n_expert, int n_used)
{
    float *ref = run_model(path, NULL, tok, DS4_BACKEND_CUDA);
    REQUIRE(ref);
    ds4_model *m = ds4_model_open(path, NULL);
    REQUIRE(m);
    size_t n = (size_t)N_TOK * (size_t)ds4_model_n_vocab(m);
    ds4_model_close(m);
    const int64_t total = (int64_t)n_layer * n_expert;
    int64_t budgets[] = {n_used, n_layer, (int64_t)n_layer * n_used, total / 2, total - 1, total};
    for (int pol = 1; pol <= 2; pol++)
        for (size_t b = 0; b < sizeof budgets / sizeof *budgets; b++) {
            if (budgets[b] < n_used) continue;
            ds4_model_options o = {0};
            o.gpu_cache_experts = budgets[b];
            o.evict = (ds4_expert_evict)pol;
            float *lg = run_model(path, &o, tok, DS4_BACKEND_CUDA);
            EXPECT_MSG(lg != NULL, "%s: cache of %lld experts failed: %s", path, (long long)budgets[b],
                       ds4_last_error());
            if (!lg) continue;
            EXPECT_MSG(memcmp(lg, ref, n * sizeof(float)) == 0,
                       "%s: %s cache of %lld experts: logits differ (max |d| %g)", path, pol == 1 ? "lru" : "freq",
                       (long long)budgets[b], test_max_abs_diff(lg, ref, n));
            free(lg);
        }
    free(ref);
}

static void test_exact_tiny_a_f32(void)
{
    if (have_gpu()) check_budgets(GGUF_A, tok_a, 6, 8, 2);
}

static void test_exact_tiny_a_q8_0(void)
{
    if (have_gpu()) check_budgets(GGUF_A_Q8, tok_a, 6, 8, 2);
}

static void test_exact_synth_official(void)
{
    if (have_gpu())
        check_budgets(GGUF_SYNTH, tok_s, SYNTH_OFFICIAL.n_layer, SYNTH_OFFICIAL.n_expert, SYNTH_OFFICIAL.n_used);
}

#define HOT "build/tests/gpucache-tiny-a.hotlist"

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* A cache seeded from a hot list (copied in the background at session
 * start, the first MoE op waits for it) computes the same logits; with
 * more entries than the preload takes, and with an explicit count. */
static void test_exact_preloaded(void)
{
    if (!have_gpu()) return;
    write_text(HOT, "ds4-expert-hotlist 1 layers 6 experts 8\n0 3\n1 1\n2 7\n3 0\n4 4\n5 2\n0 5\n1 6\n2 2\n"
                    "3 3\n4 1\n5 5\n");
    float *ref = run_model(GGUF_A_Q8, NULL, tok_a, DS4_BACKEND_CUDA);
    REQUIRE(ref);
    ds4_model *m = ds4_model_open(GGUF_A_Q8, NULL);
    REQUIRE(m);
    const size_t n = (size_t)N_TOK * (size_t)ds4_model_n_vocab(m);
    ds4_model_close(m);
    const int64_t preload[] = {0, 4, 12};
    for (int i = 0; i < 3; i++) {
        ds4_model_options o = {0};
        o.gpu_cache_experts = 10;
        o.hotlist_path = HOT;
        o.preload_experts = preload[i];
        float *lg = run_model(GGUF_A_Q8, &o, tok_a, DS4_BACKEND_CUDA);
        EXPECT_MSG(lg && memcmp(lg, ref, n * sizeof(float)) == 0, "preload %lld: logits differ",
                   (long long)preload[i]);
        free(lg);
    }
    free(ref);
}

/* Decode-only schedule, token by token, into lg[N_TOK * V]. */
static int decode_all(ds4_session *s, float *lg, int V, int i)
{
    if (ds4_session_decode(s, tok_a[i]) != DS4_OK) return 0;
    memcpy(lg + (size_t)i * V, ds4_session_logits(s), (size_t)V * sizeof(float));
    return 1;
}

/* Two sessions of one model, each with its own small cache (one pool per
 * backend), decoding in turns: both equal a plain CUDA session on the
 * same schedule. */
static void test_two_sessions(void)
{
    if (!have_gpu()) return;
    ds4_session_params p;
    ds4_session_params_default(&p);
    p.n_ctx = N_TOK;
    p.backend = DS4_BACKEND_CUDA;
    ds4_model *plain = ds4_model_open(GGUF_A_Q8, NULL);
    ds4_model_options o = {0};
    o.gpu_cache_experts = 5;
    ds4_model *m = ds4_model_open(GGUF_A_Q8, &o);
    REQUIRE(plain && m);
    const int V = ds4_model_n_vocab(m);
    const size_t n = (size_t)N_TOK * (size_t)V;
    float *ref = malloc(n * sizeof(float)), *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    ds4_session *r = ds4_session_create(plain, &p), *s0 = ds4_session_create(m, &p), *s1 = ds4_session_create(m, &p);
    REQUIRE(ref && a && b && r && s0 && s1);
    for (int i = 0; i < N_TOK; i++) {
        REQUIRE(decode_all(r, ref, V, i));
        REQUIRE(decode_all(s0, a, V, i));
        REQUIRE(decode_all(s1, b, V, i));
    }
    EXPECT_MSG(memcmp(a, ref, n * sizeof(float)) == 0, "first cached session: max |d| %g",
               test_max_abs_diff(a, ref, n));
    EXPECT_MSG(memcmp(b, ref, n * sizeof(float)) == 0, "second cached session: max |d| %g",
               test_max_abs_diff(b, ref, n));
    ds4_session_free(r);
    ds4_session_free(s0);
    ds4_session_free(s1);
    ds4_model_close(plain);
    ds4_model_close(m);
    free(ref);
    free(a);
    free(b);
}

/* Bad values: refused when the model opens, with the cause named. */
static void test_bad_values(void)
{
    struct {
        int64_t experts;
        uint64_t bytes;
        int streaming;
        const char *want;
    } cases[] = {
        {49, 0, 0, "more than the model's 48 routed experts"},
        {-1, 0, 0, "give at least 2"},
        {1, 0, 0, "under one token's 2 experts of a layer"},
        {0, 100, 0, "hold no expert"},
        {0, 1ull << 40, 0, "more than the model"},
        {4, 0, 1, "not with ssd streaming"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ds4_model_options o = {0};
        o.gpu_cache_experts = cases[i].experts;
        o.gpu_cache_bytes = cases[i].bytes;
        o.ssd_streaming = cases[i].streaming;
        ds4_model *m = ds4_model_open(GGUF_A, &o);
        EXPECT_MSG(!m, "case %zu accepted", i);
        if (m) ds4_model_close(m);
        else EXPECT_MSG(strstr(ds4_last_error(), cases[i].want) != NULL, "case %zu: %s", i, ds4_last_error());
    }
    /* a malformed hot list for the cache's preload: refused at open, line named */
    write_text(HOT, "ds4-expert-hotlist 1 layers 6 experts 8\n0 3\n9 x\n");
    ds4_model_options h = {0};
    h.gpu_cache_experts = 10;
    h.hotlist_path = HOT;
    ds4_model *hm = ds4_model_open(GGUF_A, &h);
    EXPECT(!hm);
    if (hm) ds4_model_close(hm);
    else EXPECT_MSG(strstr(ds4_last_error(), "line 3") != NULL, "%s", ds4_last_error());
    /* a budget as large as the model is full residency: accepted */
    ds4_model_options o = {0};
    o.gpu_cache_experts = 48;
    ds4_model *m = ds4_model_open(GGUF_A, &o);
    EXPECT_MSG(m != NULL, "all 48 experts: %s", ds4_last_error());
    ds4_model_close(m);
    /* the CPU backend has no VRAM cache: the session says so */
    o.gpu_cache_experts = 10;
    m = ds4_model_open(GGUF_A, &o);
    REQUIRE(m);
    ds4_session_params p;
    ds4_session_params_default(&p);
    p.n_ctx = 8;
    p.backend = DS4_BACKEND_CPU;
    ds4_session *s = ds4_session_create(m, &p);
    EXPECT(!s);
    if (s) ds4_session_free(s);
    else EXPECT_MSG(strstr(ds4_last_error(), "needs CUDA") != NULL, "%s", ds4_last_error());
    ds4_model_close(m);
}

int main(void)
{
    mkdir("build", 0755);
    mkdir("build/tests", 0755);
    have_models = fixture_write_gguf(TINY_A, GGUF_A, 0) && fixture_write_gguf(TINY_A, GGUF_A_Q8, 1) &&
                  synth_write_gguf(&SYNTH_OFFICIAL, 91, GGUF_SYNTH);
    int32_t *seq = NULL;
    int64_t n_seq = 0;
    float *gold = NULL;
    int gv = 0;
    if (have_models && fixture_sequence(TINY_A, 0, &seq, &n_seq, &gold, &gv) && n_seq >= N_TOK)
        memcpy(tok_a, seq, sizeof tok_a);
    else
        have_models = 0;
    free(seq);
    free(gold);
    uint64_t x = 0x2545f4914f6cdd1dull;
    for (int i = 0; i < N_TOK; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        tok_s[i] = (int32_t)(x % (uint64_t)SYNTH_OFFICIAL.n_vocab);
    }
    if (!have_models) {
        fprintf(stderr, "tiny-a fixture missing\n");
        return 1;
    }
    RUN(test_bad_values);
    RUN(test_exact_tiny_a_f32);
    RUN(test_exact_tiny_a_q8_0);
    RUN(test_exact_synth_official);
    RUN(test_two_sessions);
    RUN(test_exact_preloaded);
    return test_finish();
}

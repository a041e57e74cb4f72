/*
 * test_expert_stream.c - expert streaming (docs/STREAMING.md).
 *
 * The cache itself on a file of known bytes: a slot holds exactly the
 * file's bytes, LRU and frequency eviction pick the victims their
 * definitions name, pinned slots are never evicted, a read past the end
 * of the file is an error naming layer and expert. Then the models: logits
 * bit-identical to the run without streaming at every budget from one
 * expert to every expert, prefill (in chunks) and decode, both policies,
 * on the golden tiny-a (f32 and Q8_0; the f32 run also matches the golden
 * logits computed by the reference implementation) and on a synthetic
 * model in the official numerics; the batched decode too. Profiles count
 * n_tokens x n_layer x n_used selections (the router picks n_used experts
 * per token and layer, dsv4-model.md §3.7) and merge; hot lists preload;
 * malformed files and bad values are refused with a message naming the
 * cause. The compiled-in hot lists equal their data files read by the
 * parser.
 */
#include "tests/test.h"

#include "backend/expert_cache.h"
#include "engine/expert_profile.h"
#include "include/ds4.h"
#include "tests/model_fixture.h"
#include "tests/model_synth.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TINY_A "tests/data/dsv4-tiny-a"
#define GGUF_A "build/tests/stream-tiny-a-f32.gguf"
#define GGUF_A_Q8 "build/tests/stream-tiny-a-q8_0.gguf"
#define GGUF_SYNTH "build/tests/stream-synth-official.gguf"
#define N_TOK 40
#define PREFILL 24

static int32_t tok_a[N_TOK], tok_s[N_TOK];
static float *gold_a;
static int gold_vocab;

/* ---- the cache on a file of known bytes ------------------------------ */

#define CF "build/tests/stream-cache.bin"
#define CF_BYTES 4096

static uint8_t file_byte(uint64_t i) { return (uint8_t)((i * 2654435761u) >> 13); }

/* 2 layers x 4 experts; strides 40/24/16 (gate/up/down), tensors placed at
 * different offsets, so a slot mixes three places of the file */
static void cache_layers(ds4_expert_layer *L, const void *key0, const void *key1)
{
    memset(L, 0, 2 * sizeof *L);
    L[0] = (ds4_expert_layer){key0, {100, 700, 1300}, {40, 24, 16}};
    L[1] = (ds4_expert_layer){key1, {2000, 2500, 3000}, {40, 24, 16}};
}

static int write_cache_file(void)
{
    FILE *f = fopen(CF, "wb");
    if (!f) return 0;
    for (uint64_t i = 0; i < CF_BYTES; i++) fputc(file_byte(i), f);
    return fclose(f) == 0;
}

static int slot_matches(ds4_expert_cache *c, int64_t s, const ds4_expert_layer *L, int e)
{
    const void *p[3];
    ds4_expert_cache_wait(c, s, &p[0], &p[1], &p[2]);
    for (int i = 0; i < 3; i++)
        for (uint64_t b = 0; b < L->stride[i]; b++)
            if (((const uint8_t *)p[i])[b] != file_byte(L->off[i] + (uint64_t)e * L->stride[i] + b)) return 0;
    return 1;
}

/* acquire, check the bytes, release; returns whether it was a hit */
static int use(ds4_expert_cache *c, const ds4_expert_layer *L, int layer, int e)
{
    ds4_expert_cache_stats a, b;
    ds4_expert_cache_get_stats(c, &a);
    int64_t s = ds4_expert_cache_acquire(c, layer, e, true);
    EXPECT(s >= 0);
    if (s < 0) return 0;
    EXPECT_MSG(slot_matches(c, s, &L[layer], e), "slot bytes of layer %d expert %d differ from the file", layer, e);
    ds4_expert_cache_release(c, s);
    ds4_expert_cache_get_stats(c, &b);
    return b.hits == a.hits + 1;
}

static void test_cache_bytes_and_lru(void)
{
    REQUIRE(write_cache_file());
    int k0, k1;
    ds4_expert_layer L[2];
    cache_layers(L, &k0, &k1);
    ds4_expert_cache *c = ds4_expert_cache_create(CF, 2, 4, L, 2, DS4_EXPERT_POLICY_LRU, 3);
    REQUIRE(c);
    EXPECT(ds4_expert_cache_layer(c, &k1) == 1 && ds4_expert_cache_layer(c, &k0) == 0);
    EXPECT(ds4_expert_cache_layer(c, &L) == -1);
    /* A B A C: C evicts B, the least recently used */
    EXPECT(!use(c, L, 0, 1));
    EXPECT(!use(c, L, 1, 3));
    EXPECT(use(c, L, 0, 1));
    EXPECT(!use(c, L, 1, 2));
    EXPECT(use(c, L, 0, 1));
    EXPECT(!use(c, L, 1, 3));
    ds4_expert_cache_stats st;
    ds4_expert_cache_get_stats(c, &st);
    EXPECT(st.hits == 2 && st.misses == 4 && st.resident == 2);
    EXPECT(st.bytes_read == 4 * (40 + 24 + 16));
    /* a pinned slot is never evicted: with both pinned there is no victim */
    int64_t a = ds4_expert_cache_acquire(c, 0, 0, true), b = ds4_expert_cache_acquire(c, 0, 2, true);
    EXPECT(a >= 0 && b >= 0 && a != b);
    EXPECT(ds4_expert_cache_acquire(c, 1, 0, false) == -1);
    ds4_expert_cache_release(c, a);
    ds4_expert_cache_release(c, b);
    EXPECT(ds4_expert_cache_error(c) == DS4_OK);
    ds4_expert_cache_free(c);
}

static void test_cache_freq_and_touch(void)
{
    REQUIRE(write_cache_file());
    int k0, k1;
    ds4_expert_layer L[2];
    cache_layers(L, &k0, &k1);
    ds4_expert_cache *c = ds4_expert_cache_create(CF, 2, 4, L, 2, DS4_EXPERT_POLICY_FREQ, 2);
    REQUIRE(c);
    /* A A A B C: C evicts B (used once), not A (used three times) */
    use(c, L, 0, 0);
    use(c, L, 0, 0);
    use(c, L, 0, 0);
    EXPECT(!use(c, L, 0, 1));
    EXPECT(!use(c, L, 0, 2));
    EXPECT(use(c, L, 0, 0));
    EXPECT(!use(c, L, 0, 1));
    ds4_expert_cache_free(c);

    /* touch: experts a call named are evicted last (LRU would pick A) */
    c = ds4_expert_cache_create(CF, 2, 4, L, 2, DS4_EXPERT_POLICY_LRU, 2);
    REQUIRE(c);
    use(c, L, 1, 0); /* A */
    use(c, L, 1, 1); /* B */
    int32_t need[1] = {0};
    ds4_expert_cache_touch(c, 1, need, 1);
    EXPECT(!use(c, L, 1, 2)); /* evicts B */
    EXPECT(use(c, L, 1, 0));
    ds4_expert_cache_free(c);
}

static void test_cache_read_error(void)
{
    REQUIRE(write_cache_file());
    int k0, k1;
    ds4_expert_layer L[2];
    cache_layers(L, &k0, &k1);
    L[1].off[2] = CF_BYTES - 40; /* expert 3's down matrix lies past the end */
    ds4_expert_cache *c = ds4_expert_cache_create(CF, 2, 4, L, 2, DS4_EXPERT_POLICY_LRU, 1);
    REQUIRE(c);
    use(c, L, 1, 0);
    EXPECT(ds4_expert_cache_error(c) == DS4_OK);
    int64_t s = ds4_expert_cache_acquire(c, 1, 3, true);
    const void *p[3];
    ds4_expert_cache_wait(c, s, &p[0], &p[1], &p[2]);
    ds4_expert_cache_release(c, s);
    EXPECT(ds4_expert_cache_error(c) == DS4_ERR_IO);
    EXPECT_MSG(strstr(ds4_last_error(), "layer 1 expert 3") && strstr(ds4_last_error(), CF), "message: %s",
               ds4_last_error());
    ds4_expert_cache_free(c);
    EXPECT(ds4_expert_cache_create("build/tests/no-such-file.bin", 2, 4, L, 2, DS4_EXPERT_POLICY_LRU, 1) == NULL);
    EXPECT(strstr(ds4_last_error(), "no-such-file.bin") != NULL);
}

/* ---- models: bit-identical logits at every budget --------------------- */

typedef struct {
    float *logits; /* [N_TOK, vocab] */
    ds4_expert_stream_stats st;
} run_out;

/* prefill PREFILL tokens in chunks of 8, decode the rest; NULL opt = plain */
static int run_model(const char *path, const ds4_model_options *opt, const int32_t *tok, run_out *r)
{
    memset(r, 0, sizeof *r);
    ds4_model *m = ds4_model_open(path, opt);
    if (!m) {
        fprintf(stderr, "open %s: %s\n", path, ds4_last_error());
        return 0;
    }
    ds4_session_params p;
    ds4_session_params_default(&p);
    p.n_ctx = N_TOK;
    p.max_chunk = 8;
    p.n_threads = 2;
    p.backend = DS4_BACKEND_CPU;
    ds4_session *s = ds4_session_create(m, &p);
    int V = ds4_model_n_vocab(m), ok = s != NULL;
    r->logits = malloc((size_t)N_TOK * (size_t)V * sizeof(float));
    ok = ok && r->logits && ds4_session_prefill(s, tok, PREFILL, r->logits) == DS4_OK;
    for (int i = PREFILL; ok && i < N_TOK; i++) {
        ok = ds4_session_decode(s, tok[i]) == DS4_OK;
        if (ok) memcpy(r->logits + (size_t)i * V, ds4_session_logits(s), (size_t)V * sizeof(float));
    }
    if (!ok) fprintf(stderr, "run %s: %s\n", path, ds4_last_error());
    ds4_model_expert_stream_stats(m, &r->st);
    ds4_session_free(s);
    ds4_model_close(m);
    return ok;
}

/* budgets: 1 expert, one per layer, one token's set, half, everything */
static void check_budgets(const char *path, const int32_t *tok, int n_layer, int n_expert, int n_used)
{
    run_out ref;
    REQUIRE(run_model(path, NULL, tok, &ref));
    ds4_model *m = ds4_model_open(path, NULL);
    REQUIRE(m);
    size_t n = (size_t)N_TOK * (size_t)ds4_model_n_vocab(m);
    ds4_model_close(m);
    int64_t total = (int64_t)n_layer * n_expert;
    int64_t budgets[] = {1, n_layer, (int64_t)n_layer * n_used, total / 2, total};
    for (int pol = 1; pol <= 2; pol++)
        for (size_t b = 0; b < sizeof budgets / sizeof *budgets; b++) {
            ds4_model_options o = {0};
            o.ssd_streaming = 1;
            o.cache_experts = budgets[b];
            o.evict = (ds4_expert_evict)pol;
            run_out r;
            EXPECT(run_model(path, &o, tok, &r));
            if (!r.logits) continue;
            EXPECT_MSG(memcmp(r.logits, ref.logits, n * sizeof(float)) == 0,
                       "%s: %s cache of %lld experts: logits differ (max |d| %g)", path, pol == 1 ? "lru" : "freq",
                       (long long)budgets[b], test_max_abs_diff(r.logits, ref.logits, n));
            EXPECT(r.st.cache_experts == (uint64_t)budgets[b]);
            EXPECT(r.st.misses > 0 && r.st.bytes_read > 0);
            /* everything fits: each expert is read at most once */
            if (budgets[b] == total) EXPECT(r.st.misses <= (uint64_t)total);
            if (budgets[b] == 1) EXPECT(r.st.hits < r.st.misses);
            free(r.logits);
        }
    free(ref.logits);
}

static void test_exact_tiny_a_f32(void)
{
    check_budgets(GGUF_A, tok_a, 6, 8, 2);
    /* and the streamed logits are the golden ones (reference implementation) */
    ds4_model_options o = {0};
    o.ssd_streaming = 1;
    o.cache_experts = 3;
    run_out r;
    REQUIRE(gold_a && run_model(GGUF_A, &o, tok_a, &r));
    double d = test_max_abs_diff(r.logits, gold_a, (size_t)N_TOK * (size_t)gold_vocab);
    EXPECT_MSG(d < 2e-5, "max |streamed - golden| = %g", d);
    free(r.logits);
}

static void test_exact_tiny_a_q8_0(void) { check_budgets(GGUF_A_Q8, tok_a, 6, 8, 2); }

static void test_exact_synth_official(void)
{
    check_budgets(GGUF_SYNTH, tok_s, SYNTH_OFFICIAL.n_layer, SYNTH_OFFICIAL.n_expert, SYNTH_OFFICIAL.n_used);
}

/* batched decode of two sessions through one small cache = plain */
static void test_exact_batch_decode(void)
{
    float *out[2][2] = {{NULL, NULL}, {NULL, NULL}};
    for (int streamed = 0; streamed < 2; streamed++) {
        ds4_model_options o = {0};
        o.ssd_streaming = streamed;
        o.cache_experts = streamed ? 5 : 0;
        ds4_model *m = ds4_model_open(GGUF_A, &o);
        REQUIRE(m);
        ds4_session_params p;
        ds4_session_params_default(&p);
        p.n_ctx = N_TOK;
        p.backend = DS4_BACKEND_CPU;
        p.n_threads = 2;
        ds4_session *s[2] = {ds4_session_create(m, &p), ds4_session_create(m, &p)};
        REQUIRE(s[0] && s[1]);
        int V = ds4_model_n_vocab(m);
        EXPECT(ds4_session_prefill(s[0], tok_a, 10, NULL) == DS4_OK);
        EXPECT(ds4_session_prefill(s[1], tok_a + 5, 7, NULL) == DS4_OK);
        int32_t next[2] = {tok_a[20], tok_a[21]};
        EXPECT(ds4_session_decode_batch(s, next, 2) == DS4_OK);
        for (int i = 0; i < 2; i++) {
            out[streamed][i] = malloc((size_t)V * sizeof(float));
            memcpy(out[streamed][i], ds4_session_logits(s[i]), (size_t)V * sizeof(float));
        }
        if (streamed)
            for (int i = 0; i < 2; i++)
                EXPECT(memcmp(out[0][i], out[1][i], (size_t)V * sizeof(float)) == 0);
        ds4_session_free(s[0]);
        ds4_session_free(s[1]);
        ds4_model_close(m);
    }
    for (int i = 0; i < 4; i++) free(out[i / 2][i % 2]);
}

/* ---- profiles and hot lists ------------------------------------------- */

#define PROF "build/tests/stream-profile.txt"
#define HOT "build/tests/stream-hotlist.txt"
#define BAD "build/tests/stream-bad.txt"

static uint64_t profile_total(const char *path, int *nl, int *ne, uint64_t **cnt)
{
    if (ds4_expert_profile_read(path, nl, ne, cnt) != DS4_OK) return 0;
    uint64_t t = 0;
    for (int i = 0; i < *nl * *ne; i++) t += (*cnt)[i];
    return t;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(text, 1, strlen(text), f);
        fclose(f);
    }
}

static void test_profile_counts_and_merges(void)
{
    unlink(PROF);
    ds4_model_options o = {0};
    o.expert_profile = PROF;
    run_out r;
    REQUIRE(run_model(GGUF_A, &o, tok_a, &r));
    free(r.logits);
    int L, E;
    uint64_t *c1 = NULL, *c2 = NULL;
    uint64_t t1 = profile_total(PROF, &L, &E, &c1);
    EXPECT(L == 6 && E == 8);
    EXPECT_MSG(t1 == (uint64_t)N_TOK * 6 * 2, "profile total %llu, expected %d tokens x 6 layers x 2 experts",
               (unsigned long long)t1, N_TOK);
    /* a second run (with streaming this time) adds the same counts */
    o.ssd_streaming = 1;
    o.cache_experts = 4;
    REQUIRE(run_model(GGUF_A, &o, tok_a, &r));
    free(r.logits);
    EXPECT(profile_total(PROF, &L, &E, &c2) == 2 * t1);
    for (int i = 0; c1 && c2 && i < L * E; i++) EXPECT(c2[i] == 2 * c1[i]);
    free(c1);
    free(c2);

    /* a malformed or mismatched profile stops the open, and is left alone */
    const char *bad[] = {
        "ds4-expert-profile 1 layers 6 experts 8\n0 1\n",
        "ds4-expert-profile 1 layers 6 experts 8\n6 1 5\n",
        "ds4-expert-profile 1 layers 6 experts 8\n0 1 5\n0 1 7\n",
        "ds4-expert-profile 2 layers 6 experts 8\n",
        "hello\n",
        "ds4-expert-profile 1 layers 6 experts 8\n0 1 99999999999999999999999\n",
        "ds4-expert-profile 1 layers 5 experts 8\n0 1 3\n",
    };
    const char *want[] = {"line 2", "outside", "twice", "version 2", "header", "line 2", "5 layers x 8 experts"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_text(BAD, bad[i]);
        ds4_model_options b = {0};
        b.expert_profile = BAD;
        ds4_model *m = ds4_model_open(GGUF_A, &b);
        EXPECT_MSG(!m, "malformed profile %zu accepted", i);
        if (m) ds4_model_close(m);
        else EXPECT_MSG(strstr(ds4_last_error(), want[i]) && strstr(ds4_last_error(), BAD), "profile %zu: message %s", i,
                        ds4_last_error());
        size_t len;
        char *after = test_read_file(BAD, &len);
        EXPECT(after && strcmp(after, bad[i]) == 0);
        free(after);
    }
}

static void test_hotlist_preload(void)
{
    int L, E;
    uint64_t *cnt = NULL;
    REQUIRE(profile_total(PROF, &L, &E, &cnt) > 0);
    ds4_expert_hotlist h;
    REQUIRE(ds4_expert_hotlist_from_counts(L, E, cnt, 10, &h) == DS4_OK);
    EXPECT(h.n == 10);
    /* hottest first: counts never increase along the list */
    for (int64_t i = 1; i < h.n; i++)
        EXPECT(cnt[h.pairs[2 * i - 2] * E + h.pairs[2 * i - 1]] >= cnt[h.pairs[2 * i] * E + h.pairs[2 * i + 1]]);
    REQUIRE(ds4_expert_hotlist_write(HOT, &h, "test") == DS4_OK);
    ds4_expert_hotlist back;
    REQUIRE(ds4_expert_hotlist_read(HOT, &back) == DS4_OK);
    EXPECT(back.n == h.n && memcmp(back.pairs, h.pairs, (size_t)h.n * 2 * sizeof(int32_t)) == 0);
    ds4_expert_hotlist_free(&back);
    ds4_expert_hotlist_free(&h);
    free(cnt);

    ds4_model_options o = {0};
    o.ssd_streaming = 1;
    o.cache_experts = 20;
    o.hotlist_path = HOT;
    o.preload_experts = 7;
    ds4_model *m = ds4_model_open(GGUF_A, &o);
    REQUIRE(m);
    ds4_expert_stream_stats st;
    ds4_model_expert_stream_stats(m, &st);
    EXPECT(st.preloaded == 7 && st.resident == 7 && st.misses == 0 && st.bytes_read > 0);
    ds4_model_close(m);
    o.preload_experts = 0; /* default cap: half the cache */
    m = ds4_model_open(GGUF_A, &o);
    REQUIRE(m);
    ds4_model_expert_stream_stats(m, &st);
    EXPECT(st.preloaded == 10);
    ds4_model_close(m);
    o.cold = 1;
    m = ds4_model_open(GGUF_A, &o);
    REQUIRE(m);
    ds4_model_expert_stream_stats(m, &st);
    EXPECT(st.preloaded == 0 && st.resident == 0);
    ds4_model_close(m);
    /* the preloaded run computes the same logits and starts with hits */
    o.cold = 0;
    o.preload_experts = 10;
    run_out r, ref;
    REQUIRE(run_model(GGUF_A, NULL, tok_a, &ref));
    REQUIRE(run_model(GGUF_A, &o, tok_a, &r));
    EXPECT(memcmp(r.logits, ref.logits, (size_t)N_TOK * (size_t)gold_vocab * sizeof(float)) == 0);
    EXPECT(r.st.hits > 0);
    free(r.logits);
    free(ref.logits);
}

static void test_hotlist_malformed(void)
{
    const char *bad[] = {
        "",
        "ds4-expert-hotlist 1 layers 6 experts 8\n3\n",
        "ds4-expert-hotlist 1 layers 6 experts 8\n3 8\n",
        "ds4-expert-hotlist 1 layers 6 experts 8\n3 1\n3 1\n",
        "ds4-expert-hotlist 1 layers 6 experts 8 colour red\n",
        "ds4-expert-hotlist 1 layers 6 experts 8\n-1 2\n",
        "ds4-expert-hotlist 1 layers 6 experts 8\n1 2 junk\n",
        "ds4-expert-hotlist 1 layers 6 experts 9\n1 2\n",
        "ds4-expert-hotlist 1 layers 9 experts 8\n7 2\n",
    };
    const char *want[] = {"empty", "line 2", "outside", "twice", "colour", "line 2", "line 2", "9 experts", "layer 7"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_text(BAD, bad[i]);
        ds4_model_options o = {0};
        o.ssd_streaming = 1;
        o.cache_experts = 8;
        o.hotlist_path = BAD;
        ds4_model *m = ds4_model_open(GGUF_A, &o);
        EXPECT_MSG(!m, "malformed hot list %zu accepted", i);
        if (m) ds4_model_close(m);
        else EXPECT_MSG(strstr(ds4_last_error(), want[i]) != NULL, "hot list %zu: message %s", i, ds4_last_error());
    }
    /* a long line and a NUL byte */
    char big[2048];
    memset(big, '1', sizeof big);
    memcpy(big, "ds4-expert-hotlist 1 layers 6 experts 8\n", 40);
    big[sizeof big - 1] = 0;
    ds4_expert_hotlist h;
    EXPECT(ds4_expert_hotlist_parse(big, strlen(big), "big", &h) == DS4_ERR_FORMAT);
    EXPECT(strstr(ds4_last_error(), "longer") != NULL);
    const char nul[] = "ds4-expert-hotlist 1 layers 6 experts 8\n1\0 2\n";
    EXPECT(ds4_expert_hotlist_parse(nul, sizeof nul - 1, "nul", &h) == DS4_ERR_FORMAT);
    EXPECT(strstr(ds4_last_error(), "NUL") != NULL);
    ds4_model_options o = {0};
    o.ssd_streaming = 1;
    o.hotlist_path = "build/tests/no-such-hotlist.txt";
    EXPECT(ds4_model_open(GGUF_A, &o) == NULL && strstr(ds4_last_error(), "no-such-hotlist"));
}

static void test_bad_options(void)
{
    struct {
        int streaming;
        int64_t experts;
        uint64_t bytes;
        int64_t preload;
        const char *want;
    } cases[] = {
        {1, 49, 0, 0, "more than the model's 48 routed experts"},
        {1, -1, 0, 0, "at least 1"},
        {1, 0, 100, 0, "holds no expert"},
        {1, 0, 1ull << 40, 0, "more than the model"},
        {0, 4, 0, 0, "needs ssd streaming"},
        {1, 4, 0, -2, "preload"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ds4_model_options o = {0};
        o.ssd_streaming = cases[i].streaming;
        o.cache_experts = cases[i].experts;
        o.cache_bytes = cases[i].bytes;
        o.preload_experts = cases[i].preload;
        ds4_model *m = ds4_model_open(GGUF_A, &o);
        EXPECT_MSG(!m, "case %zu accepted", i);
        if (m) ds4_model_close(m);
        else EXPECT_MSG(strstr(ds4_last_error(), cases[i].want) != NULL, "case %zu: %s", i, ds4_last_error());
    }
}

static void test_default_hotlists_are_the_data_files(void)
{
    int n = ds4_expert_hotlist_n_defaults();
    if (n == 0) {
        test_skip("no models/hotlists/*.hotlist in this checkout");
        return;
    }
    for (int i = 0; i < n; i++) {
        ds4_expert_hotlist d, f;
        const char *src;
        REQUIRE(ds4_expert_hotlist_default_at(i, &d, &src) == DS4_OK);
        EXPECT_MSG(ds4_expert_hotlist_read(src, &f) == DS4_OK, "%s: %s", src, ds4_last_error());
        EXPECT(f.n > 0 && f.n == d.n && f.n_layer == d.n_layer && f.n_expert == d.n_expert && f.n_embd == d.n_embd);
        EXPECT(strcmp(f.family, d.family) == 0 && f.family[0] && f.n_embd > 0);
        if (f.n == d.n) EXPECT(memcmp(f.pairs, d.pairs, (size_t)f.n * 2 * sizeof(int32_t)) == 0);
        /* the lookup by model dimensions finds it (a model with fewer
         * layers gets the entries of its layers only) */
        ds4_expert_hotlist g;
        const char *s2;
        EXPECT(ds4_expert_hotlist_default(f.n_layer, f.n_expert, f.n_embd, &g, &s2) == DS4_OK);
        ds4_expert_hotlist_free(&g);
        EXPECT(ds4_expert_hotlist_default(1, f.n_expert, f.n_embd, &g, &s2) == DS4_OK);
        for (int64_t k = 0; k < g.n; k++) EXPECT(g.pairs[2 * k] == 0);
        ds4_expert_hotlist_free(&g);
        ds4_expert_hotlist_free(&d);
        ds4_expert_hotlist_free(&f);
    }
}

int main(void)
{
    mkdir("build", 0755);
    mkdir("build/tests", 0755);
    int ok = fixture_write_gguf(TINY_A, GGUF_A, 0) && fixture_write_gguf(TINY_A, GGUF_A_Q8, 1) &&
             synth_write_gguf(&SYNTH_OFFICIAL, 91, GGUF_SYNTH);
    int32_t *seq = NULL;
    int64_t n_seq = 0;
    float *gold = NULL;
    if (ok && fixture_sequence(TINY_A, 0, &seq, &n_seq, &gold, &gold_vocab) && n_seq >= N_TOK) {
        memcpy(tok_a, seq, sizeof tok_a);
        gold_a = gold;
    } else {
        fprintf(stderr, "tiny-a fixture missing\n");
        ok = 0;
    }
    free(seq);
    uint64_t x = 0x2545f4914f6cdd1dull;
    for (int i = 0; i < N_TOK; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        tok_s[i] = (int32_t)(x % (uint64_t)SYNTH_OFFICIAL.n_vocab);
    }
    RUN(test_cache_bytes_and_lru);
    RUN(test_cache_freq_and_touch);
    RUN(test_cache_read_error);
    if (ok) {
        RUN(test_exact_tiny_a_f32);
        RUN(test_exact_tiny_a_q8_0);
        RUN(test_exact_synth_official);
        RUN(test_exact_batch_decode);
        RUN(test_profile_counts_and_merges);
        RUN(test_hotlist_preload);
        RUN(test_hotlist_malformed);
        RUN(test_bad_options);
    }
    RUN(test_default_hotlists_are_the_data_files);
    free(gold_a);
    return test_finish();
}

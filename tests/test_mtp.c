/*
 * test_mtp.c - the MTP block and speculative decoding (model/dsv4_mtp.c,
 * engine/spec.c) on a random Flash-shaped model with a random MTP block.
 *
 * Greedy speculation must emit exactly plain greedy decoding's tokens, and
 * after it the session must be the session that plain decoding leaves
 * (snapshot bytes equal: KV ring, compressor/indexer state, compressed
 * rows, logits), whatever was drafted and rejected on the way. The
 * speculative-sampling rule is checked statistically: the tokens it
 * returns follow the target distribution p, not the draft q.
 */
#include "include/ds4.h"
#include "include/ds4_sampler.h"
#include "tests/model_synth.h"
#include "tests/test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GGUF_MTP "build/tests/mtp_with.gguf"
#define GGUF_PLAIN "build/tests/mtp_without.gguf"
#define N_PROMPT 37
#define N_GEN 60

static ds4_model *model;   /* with mtp.0.* in the file */
static ds4_model *plain_m; /* without */

static ds4_session *session(ds4_model *m, int max_chunk)
{
    ds4_session_params p;
    ds4_session_params_default(&p);
    p.n_ctx = 512;
    p.numerics = DS4_NUMERICS_AUTO;
    p.n_threads = 2;
    p.max_chunk = max_chunk;
    p.backend = DS4_BACKEND_CPU;
    return ds4_session_create(m, &p);
}

static int32_t prompt[N_PROMPT];

/* plain greedy: n tokens after the prompt */
static int greedy_plain(ds4_session *s, int32_t *out, int n)
{
    int V = ds4_model_n_vocab(model);
    if (ds4_session_prefill(s, prompt, N_PROMPT, NULL) != DS4_OK) return 0;
    for (int i = 0; i < n; i++) {
        out[i] = ds4_argmax(ds4_session_logits(s), V);
        if (i + 1 < n && ds4_session_decode(s, out[i]) != DS4_OK) return 0;
    }
    return 1;
}

/* speculative greedy: the first n tokens (the run may feed a few more) */
static int greedy_spec(ds4_session *s, int32_t *out, int n)
{
    int V = ds4_model_n_vocab(model);
    if (ds4_session_prefill(s, prompt, N_PROMPT, NULL) != DS4_OK) return 0;
    int got = 0;
    int32_t tok = ds4_argmax(ds4_session_logits(s), V), buf[17];
    out[got++] = tok;
    while (got < n) {
        int k;
        if (ds4_session_decode_spec(s, tok, NULL, NULL, -1, 64, buf, &k) != DS4_OK) return 0;
        for (int i = 0; i < k && got < n; i++) out[got++] = buf[i];
        tok = buf[k - 1];
    }
    return 1;
}

/* An oracle for the drafts: plain greedy's own token, except at every
 * third position (a wrong one), so runs of 0..N accepted drafts occur. */
static const int32_t *oracle_ref;
static int32_t oracle(void *ctx, int64_t pos, int32_t draft)
{
    (void)ctx;
    int64_t i = pos - N_PROMPT;
    if (i < 0 || i >= N_GEN) return draft;
    return i % 3 == 2 ? (oracle_ref[i] + 1) % 256 : oracle_ref[i];
}

static int32_t oracle_all(void *ctx, int64_t pos, int32_t draft)
{
    (void)ctx;
    int64_t i = pos - N_PROMPT;
    return i < 0 || i >= N_GEN ? draft : oracle_ref[i];
}

/* Snapshot bytes of s equal those of a plain session fed the prompt and
 * toks[0..n)? */
static int same_as_plain(ds4_session *s, const int32_t *toks, int n)
{
    ds4_session *q = session(model, 16);
    if (!q || ds4_session_prefill(q, prompt, N_PROMPT, NULL) != DS4_OK) return 0;
    for (int i = 0; i < n; i++)
        if (ds4_session_decode(q, toks[i]) != DS4_OK) return 0;
    void *a, *b;
    size_t la, lb;
    int ok = ds4_session_snapshot(s, &a, &la) == DS4_OK && ds4_session_snapshot(q, &b, &lb) == DS4_OK && la == lb &&
             memcmp(a, b, la) == 0;
    ds4_session_free(q);
    return ok;
}

/* A caller that stops inside the confirmed drafts (the server's stop
 * strings) trims the step: the state is then byte for byte that of plain
 * decoding fed the kept tokens, and decoding goes on from there with the
 * plain output. Both rollback schemes (undo record, full snapshot). */
static void test_trim_exact(void)
{
    REQUIRE(model);
    int V = ds4_model_n_vocab(model);
    static int32_t ref[N_GEN];
    ds4_session *p = session(model, 16);
    REQUIRE(p);
    REQUIRE(greedy_plain(p, ref, N_GEN));
    ds4_session_free(p);
    oracle_ref = ref;
    for (int full = 0; full <= 1; full++) {
        ds4_session *s = session(model, 16);
        REQUIRE(s);
        REQUIRE(ds4_session_set_mtp(s, 4) == DS4_OK);
        ds4_session_spec_full_snapshot(s, full);
        ds4_session_spec_draft_hook(s, oracle_all, NULL);
        EXPECT(ds4_session_spec_trim(s, 1) != DS4_OK); /* no step yet */
        REQUIRE(ds4_session_prefill(s, prompt, N_PROMPT, NULL) == DS4_OK);
        int32_t buf[17];
        int k = 0, got = 0;
        /* step 1 (no pending state yet: a plain step), step 2 drafts 4 */
        REQUIRE(ds4_session_decode_spec(s, ref[0], NULL, NULL, -1, 64, buf, &k) == DS4_OK);
        got = 1 + (k - 1);
        REQUIRE(ds4_session_decode_spec(s, ref[got], NULL, NULL, -1, 64, buf, &k) == DS4_OK);
        EXPECT_MSG(k == 5, "%d tokens from a step whose 4 drafts are all right", k);
        EXPECT(ds4_session_spec_trim(s, 0) != DS4_OK && ds4_session_spec_trim(s, k + 1) != DS4_OK);
        int base = got; /* ref[0..base) fed before this step */
        for (int keep = k; keep >= 1; keep--) {
            REQUIRE(ds4_session_spec_trim(s, keep) == DS4_OK);
            EXPECT_MSG(ds4_session_n_past(s) == N_PROMPT + base + keep, "keep %d: %lld positions", keep,
                       (long long)ds4_session_n_past(s));
            EXPECT_MSG(same_as_plain(s, ref, base + keep), "%s: the state after trimming to %d is not plain's",
                       full ? "full snapshot" : "undo record", keep);
            EXPECT_MSG(ds4_argmax(ds4_session_logits(s), V) == ref[base + keep], "keep %d: logits", keep);
        }
        /* on from one kept token: the plain tokens, drafts accepted again */
        got = base + 1;
        int32_t tok = ref[got];
        int equal = 1;
        while (got + 1 < N_GEN - 8) {
            REQUIRE(ds4_session_decode_spec(s, tok, NULL, NULL, -1, 64, buf, &k) == DS4_OK);
            for (int i = 0; i < k; i++) equal &= buf[i] == ref[got + 1 + i];
            got += k;
            tok = buf[k - 1];
        }
        EXPECT_MSG(equal, "%s: tokens after the trims differ from plain greedy", full ? "full snapshot" : "undo record");
        ds4_spec_stats st;
        ds4_session_spec_stats(s, &st);
        EXPECT(st.accepted > 0);
        ds4_session_free(s);
    }
}

static void test_greedy_identical_and_exact_rollback(void)
{
    REQUIRE(model);
    int32_t ref[N_GEN], got[N_GEN];
    ds4_session *p = session(model, 16);
    REQUIRE(p);
    REQUIRE(greedy_plain(p, ref, N_GEN));
    for (int nd = 1; nd <= 4; nd++) {
        ds4_session *s = session(model, 16);
        REQUIRE(s);
        REQUIRE(ds4_session_set_mtp(s, nd) == DS4_OK);
        oracle_ref = ref;
        ds4_session_spec_draft_hook(s, oracle, NULL);
        int rc = greedy_spec(s, got, N_GEN);
        REQUIRE(rc);
        int same = 0;
        while (same < N_GEN && got[same] == ref[same]) same++;
        ds4_spec_stats st;
        ds4_session_spec_stats(s, &st);
        printf("  %d drafts: %d/%d tokens equal to plain greedy; %llu steps, %llu of %llu drafts accepted\n", nd, same,
               N_GEN, (unsigned long long)st.steps, (unsigned long long)st.accepted, (unsigned long long)st.drafted);
        EXPECT_MSG(same == N_GEN, "speculation (%d drafts) diverged from plain greedy at token %d", nd, same);
        /* both outcomes happened, so both code paths were compared (the
         * random block alone drafts wrong nearly always, hence the oracle) */
        EXPECT_MSG(st.accepted > 0 && st.accepted < st.drafted, "%llu of %llu accepted",
                   (unsigned long long)st.accepted, (unsigned long long)st.drafted);
        /* rollback exactness: a plain session fed the same tokens has the
         * same state, byte for byte */
        int64_t fed = ds4_session_n_past(s);
        ds4_session *q = session(model, 16);
        REQUIRE(q);
        REQUIRE(ds4_session_prefill(q, prompt, N_PROMPT, NULL) == DS4_OK);
        for (int64_t i = 0; i + N_PROMPT < fed; i++) REQUIRE(ds4_session_decode(q, got[i]) == DS4_OK);
        void *a, *b;
        size_t la, lb;
        REQUIRE(ds4_session_snapshot(s, &a, &la) == DS4_OK && ds4_session_snapshot(q, &b, &lb) == DS4_OK);
        EXPECT_MSG(la == lb && memcmp(a, b, la) == 0, "%d drafts: the state after speculation (%zu bytes) is not "
                   "the state of plain decoding (%zu bytes)", nd, la, lb);
        free(a), free(b);
        ds4_session_free(q);
        ds4_session_free(s);
    }
    ds4_session_free(p);
}

static void test_separate_file_and_errors(void)
{
    REQUIRE(plain_m);
    EXPECT(!ds4_model_has_mtp(plain_m));
    ds4_session *s = session(plain_m, 16);
    REQUIRE(s);
    EXPECT(ds4_session_set_mtp(s, 2) == DS4_ERR_NOT_FOUND);
    EXPECT_MSG(strstr(ds4_last_error(), "no MTP block"), "%s", ds4_last_error());
    /* the main file has no mtp.0.*: auto names the first missing tensor */
    EXPECT(ds4_model_load_mtp(plain_m, "auto") == DS4_ERR_NOT_FOUND);
    EXPECT_MSG(strstr(ds4_last_error(), "mtp.0.") && strstr(ds4_last_error(), "missing"), "%s", ds4_last_error());
    EXPECT(ds4_model_load_mtp(plain_m, "build/tests/no-such-mtp.gguf") != DS4_OK);
    EXPECT_MSG(strstr(ds4_last_error(), "no-such-mtp.gguf"), "%s", ds4_last_error());
    /* a separate file with the block (antirez/ds4 ships it so) */
    REQUIRE(ds4_model_load_mtp(plain_m, GGUF_MTP) == DS4_OK);
    EXPECT(ds4_model_has_mtp(plain_m));
    EXPECT(ds4_session_set_mtp(s, 0) == DS4_OK);
    EXPECT(ds4_session_set_mtp(s, 17) == DS4_ERR_INVALID);
    EXPECT(ds4_session_set_mtp(s, 16) == DS4_ERR_INVALID); /* 17 tokens > max_chunk 16 */
    EXPECT_MSG(strstr(ds4_last_error(), "max is 16"), "%s", ds4_last_error());
    /* the same random weights as the main file's block: same tokens */
    REQUIRE(ds4_session_set_mtp(s, 3) == DS4_OK);
    int32_t got[N_GEN], ref[N_GEN];
    REQUIRE(greedy_spec(s, got, N_GEN));
    ds4_session *p = session(model, 16);
    REQUIRE(p && greedy_plain(p, ref, N_GEN));
    EXPECT(memcmp(got, ref, sizeof got) == 0);
    ds4_session_free(p);
    ds4_session_free(s);
}

/* p and q on 6 tokens; the rule's outputs follow p. */
static void test_sampling_rule_statistics(void)
{
    const double p[6] = {0.40, 0.25, 0.15, 0.10, 0.07, 0.03};
    const double q[6] = {0.05, 0.40, 0.05, 0.30, 0.10, 0.10};
    ds4_rng r;
    ds4_rng_seed(&r, 12345);
    const int n = 400000;
    long cnt[6] = {0}, acc = 0;
    for (int i = 0; i < n; i++) {
        int32_t d = ds4_spec_draw(q, 6, &r);
        bool a;
        int32_t t = ds4_spec_accept(p, q, 6, d, &r, &a);
        cnt[t]++;
        acc += a;
    }
    /* expected acceptance: sum_i min(p_i, q_i) = 0.05+0.25+0.05+0.10+0.07+0.03 */
    double chi2 = 0;
    for (int i = 0; i < 6; i++) {
        double e = p[i] * n;
        chi2 += (cnt[i] - e) * (cnt[i] - e) / e;
    }
    printf("  400000 draws: chi2 = %.2f (5 dof; 20.5 is p = 0.001), acceptance %.4f (0.55 expected)\n", chi2,
           (double)acc / n);
    EXPECT(chi2 < 20.5);
    EXPECT(fabs((double)acc / n - 0.55) < 0.005);
    /* the draft distribution itself would fail the same test */
    double chi2q = 0;
    for (int i = 0; i < 6; i++) chi2q += (q[i] * n - p[i] * n) * (q[i] * n - p[i] * n) / (p[i] * n);
    EXPECT(chi2q > 1000);
}

/* Sampling through the session: valid tokens, counters, the state is
 * still the one plain decoding of the emitted tokens gives. */
static void test_sampling_session(void)
{
    REQUIRE(model);
    int V = ds4_model_n_vocab(model);
    ds4_session *s = session(model, 16);
    REQUIRE(s);
    REQUIRE(ds4_session_set_mtp(s, 2) == DS4_OK);
    REQUIRE(ds4_session_prefill(s, prompt, N_PROMPT, NULL) == DS4_OK);
    ds4_sampler_params sp;
    ds4_sampler_params_default(&sp);
    sp.temperature = 0.8f;
    sp.min_p = 0;
    ds4_rng r;
    ds4_rng_seed(&r, 7);
    ds4_sampler *smp = ds4_sampler_new(&sp, V);
    int32_t tok = ds4_sampler_sample(smp, ds4_session_logits(s), V, false), buf[17], all[200];
    int n = 0;
    all[n++] = tok;
    while (n < 40) {
        int k;
        REQUIRE(ds4_session_decode_spec(s, tok, &sp, &r, -1, 64, buf, &k) == DS4_OK);
        for (int i = 0; i < k; i++) {
            EXPECT(buf[i] >= 0 && buf[i] < V);
            all[n++] = buf[i];
        }
        tok = buf[k - 1];
    }
    ds4_spec_stats st;
    ds4_session_spec_stats(s, &st);
    printf("  sampling at T 0.8: %llu steps, %llu of %llu drafts accepted\n", (unsigned long long)st.steps,
           (unsigned long long)st.accepted, (unsigned long long)st.drafted);
    ds4_session *q = session(model, 16);
    REQUIRE(q && ds4_session_prefill(q, prompt, N_PROMPT, NULL) == DS4_OK);
    for (int64_t i = 0; i + N_PROMPT < ds4_session_n_past(s); i++) REQUIRE(ds4_session_decode(q, all[i]) == DS4_OK);
    void *a, *b;
    size_t la, lb;
    REQUIRE(ds4_session_snapshot(s, &a, &la) == DS4_OK && ds4_session_snapshot(q, &b, &lb) == DS4_OK);
    EXPECT(la == lb && memcmp(a, b, la) == 0);
    free(a), free(b);
    ds4_sampler_free(smp);
    ds4_session_free(q);
    ds4_session_free(s);
}

int main(void)
{
    const synth_shape *h = &SYNTH_OFFICIAL;
    for (int t = 0; t < N_PROMPT; t++) prompt[t] = (t * 53 + 7) % h->n_vocab;
    synth_mtp = 1;
    if (synth_write_gguf(h, 11, GGUF_MTP)) model = ds4_model_open(GGUF_MTP, NULL);
    synth_mtp = 0;
    if (synth_write_gguf(h, 11, GGUF_PLAIN)) plain_m = ds4_model_open(GGUF_PLAIN, NULL);
    if (model && ds4_model_load_mtp(model, "auto") != DS4_OK) {
        fprintf(stderr, "mtp: %s\n", ds4_last_error());
        ds4_model_close(model);
        model = NULL;
    }
    RUN(test_greedy_identical_and_exact_rollback);
    RUN(test_trim_exact);
    RUN(test_separate_file_and_errors);
    RUN(test_sampling_rule_statistics);
    RUN(test_sampling_session);
    ds4_model_close(model);
    ds4_model_close(plain_m);
    unlink(GGUF_MTP), unlink(GGUF_PLAIN);
    return test_finish();
}

/*
 * test_decode_pick.c - the greedy decode step (ds4_session_decode_pick,
 * ds4_session_decode_batch_pick) against ds4_session_decode /
 * ds4_session_decode_batch followed by ds4_argmax_excluding on copies of
 * the same sessions, on the CPU.
 *
 * Two paths are checked. The plain CPU backend offers no argmax_rows
 * (ops.h), so the calls are the two old ones in one. With DS4_CPU_PICK=1
 * at a session's creation its CPU backend offers it (backend/cpu/
 * ops_cpu_pick.c), and the engine takes the path a GPU takes: the logits
 * stay in the state's buffer, only the pick comes back, the row is copied
 * home at its first read (ds4_session_logits, a snapshot); a batched
 * step's rows are copied into each session's own state. That is how CI,
 * without a GPU, runs the bookkeeping of that path.
 *
 * Expected, on both paths: every step's pick equal to ds4_argmax_excluding
 * of the reference's logits (the id excluded honoured, the true maximum
 * excluded every other step), the logits bit-identical; a snapshot taken
 * right after a pick (logits never read) equal byte for byte to the
 * reference's and restoring to the same logits; a reset, a restore, a
 * plain decode or prefill after a pick see what they would without it;
 * errors leave the pick at -1. And the CPU's argmax_rows itself against
 * ds4_argmax_excluding on the crafted rows of tests/argmax_cases.h (ties,
 * the maximum excluded, NaN and -inf, -0 and +0, odd widths, Flash's
 * vocabulary).
 */
#include "backend/ops.h"
#include "engine/session_access.h"
#include "include/ds4.h"
#include "include/ds4_sampler.h"
#include "tests/argmax_cases.h"
#include "tests/model_fixture.h"
#include "tests/model_synth.h"
#include "tests/test.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TINY_A "tests/data/dsv4-tiny-a"
#define GGUF_A "build/tests/tiny-a-f32-pick.gguf"
#define GGUF_SYNTH "build/tests/synth-official-pick.gguf"

static ds4_model *model_a, *model_synth;
static int32_t *tok_a;
static int64_t n_tok_a;

/* A CPU session; on_backend: its backend offers the pick (DS4_CPU_PICK=1,
 * read when the backend is made). */
static ds4_session *mk(ds4_model *m, int64_t n_ctx, ds4_numerics nm, int max_chunk, bool on_backend)
{
    ds4_session_params p;
    ds4_session_params_default(&p);
    p.n_ctx = n_ctx;
    p.numerics = nm;
    p.n_threads = 2;
    p.max_chunk = max_chunk;
    p.backend = DS4_BACKEND_CPU;
    if (on_backend) setenv("DS4_CPU_PICK", "1", 1);
    else unsetenv("DS4_CPU_PICK");
    ds4_session *s = ds4_session_create(m, &p);
    unsetenv("DS4_CPU_PICK");
    if (!s) fprintf(stderr, "session: %s\n", ds4_last_error());
    return s;
}

/* A copy of s, made as `on_backend` says (snapshot + restore). */
static ds4_session *copy_of(ds4_model *m, ds4_session *s, int64_t n_ctx, ds4_numerics nm, int max_chunk,
                            bool on_backend)
{
    void *snap = NULL;
    size_t len = 0;
    ds4_session *c = mk(m, n_ctx, nm, max_chunk, on_backend);
    if (!c || ds4_session_snapshot(s, &snap, &len) != DS4_OK || ds4_session_restore(c, snap, len) != DS4_OK) {
        ds4_session_free(c);
        c = NULL;
    }
    free(snap);
    return c;
}

static bool same_logits(const ds4_session *a, const ds4_session *b, int V)
{
    const float *la = ds4_session_logits(a), *lb = ds4_session_logits(b);
    return la && lb && memcmp(la, lb, (size_t)V * sizeof(float)) == 0;
}

/* Byte-equal snapshots. */
static bool same_snapshot(const ds4_session *a, const ds4_session *b)
{
    void *x = NULL, *y = NULL;
    size_t lx = 0, ly = 0;
    bool ok = ds4_session_snapshot(a, &x, &lx) == DS4_OK && ds4_session_snapshot(b, &y, &ly) == DS4_OK && lx == ly &&
              memcmp(x, y, lx) == 0;
    free(x);
    free(y);
    return ok;
}

/* ---- the CPU's argmax_rows ---------------------------------------------- */

static void test_cpu_argmax_rows(void)
{
    unsetenv("DS4_CPU_PICK");
    ds4_backend *plain = ds4_backend_cpu_create(1);
    setenv("DS4_CPU_PICK", "1", 1);
    ds4_backend *be = ds4_backend_cpu_create(1);
    unsetenv("DS4_CPU_PICK");
    REQUIRE(plain && be);
    EXPECT_MSG(!plain->argmax_rows && !plain->copy, "the CPU backend offers the pick without DS4_CPU_PICK=1");
    REQUIRE(be->argmax_rows && be->copy);
    int n_cases = 0;
    am_case *c = am_cases(&n_cases);
    REQUIRE(c);
    int rows = 0, wrong = 0;
    for (int k = 0; k < n_cases; k++) {
        int32_t got[8];
        REQUIRE(c[k].rows <= 8);
        REQUIRE(be->argmax_rows(be, c[k].x, c[k].rows, c[k].n, c[k].excluded, got) == DS4_OK);
        for (int r = 0; r < c[k].rows; r++, rows++) {
            const int32_t want = ds4_argmax_excluding(c[k].x + (size_t)r * c[k].n, c[k].n, c[k].excluded);
            wrong += got[r] != want;
            EXPECT_MSG(got[r] == want, "%s, row %d: picked %d, ds4_argmax_excluding %d", c[k].what, r, got[r], want);
        }
    }
    printf("    %d cases, %d rows, %d picks differ\n", n_cases, rows, wrong);
    /* answers of the rule worked out by hand, so that the two agreeing
     * means both are right: (case, row, pick) */
    static const struct {
        const char *what;
        int row;
        int32_t pick;
    } hand[] = {{"ties at several indices (n 1000, 2 rows, excluded -1)", 0, 17},
                {"ties at several indices (n 1000, 2 rows, excluded -1)", 1, 0},
                {"ties at several indices (n 1000, 2 rows, excluded 17)", 0, 400},
                {"the maximum at the excluded id", 0, -3}, /* not 123 */
                {"NaN everywhere but one", 0, 4321},
                {"NaN everywhere but one", 1, 0},
                {"NaN everywhere but one", 2, 4999},
                {"NaN everywhere but the excluded id", 0, -1},
                {"all -inf, or -inf and NaN", 0, -1},
                {"all -inf, or -inf and NaN", 1, -1},
                {"all -inf, or -inf and NaN", 2, -1},
                {"-0 and +0 tie", 0, 10},
                {"-0 and +0 tie", 1, 20},
                {"-0 and +0 tie", 2, 90},
                {"+inf ties, NaN beside", 0, 200},
                {"the maximum first and last", 0, 0},
                {"the maximum first and last", 1, 4095},
                {"empty rows", 0, -1}};
    int checked = 0;
    for (size_t h = 0; h < sizeof hand / sizeof hand[0]; h++)
        for (int k = 0; k < n_cases; k++) {
            if (strncmp(c[k].what, hand[h].what, strlen(hand[h].what)) != 0) continue;
            const int32_t v = ds4_argmax_excluding(c[k].x + (size_t)hand[h].row * c[k].n, c[k].n, c[k].excluded);
            const bool ok = hand[h].pick == -3 ? v >= 0 && v != 123 : v == hand[h].pick;
            EXPECT_MSG(ok, "%s, row %d: ds4_argmax_excluding gives %d, the rule %d", c[k].what, hand[h].row, v,
                       hand[h].pick);
            checked++;
            break;
        }
    EXPECT_MSG(checked == (int)(sizeof hand / sizeof hand[0]), "%d hand-checked answers found no case",
               (int)(sizeof hand / sizeof hand[0]) - checked);
    int32_t one = 5;
    float buf[4] = {1, 2, 3, 4}, dst[4] = {0};
    EXPECT(be->argmax_rows(be, buf, 0, 4, -1, &one) == DS4_ERR_INVALID);
    be->copy(be, dst, buf, sizeof buf);
    EXPECT(memcmp(dst, buf, sizeof buf) == 0);
    am_cases_free(c, n_cases);
    plain->destroy(plain);
    be->destroy(be);
}

/* ---- one session ----------------------------------------------------------- */

/* steps greedy steps on a (decode_pick) and r (decode + ds4_argmax_excluding),
 * both at the same state; every other step excludes the token the
 * reference would pick, the others exclude nothing. */
static void greedy_steps(ds4_session *a, ds4_session *r, int32_t first, int steps, int V, int *picks_ok,
                         int *logits_ok)
{
    int32_t t = first;
    for (int i = 0; i < steps; i++) {
        REQUIRE(ds4_session_decode(r, t) == DS4_OK);
        const float *lr = ds4_session_logits(r);
        const int32_t top = ds4_argmax_excluding(lr, V, -1), ex = i % 2 ? top : -1;
        const int32_t want = ds4_argmax_excluding(lr, V, ex);
        int32_t got = -2;
        REQUIRE(ds4_session_decode_pick(a, t, ex, &got) == DS4_OK);
        *picks_ok += got == want && got >= 0 && (ex < 0 || got != ex);
        *logits_ok += same_logits(a, r, V);
        t = got >= 0 ? got : want;
    }
}

static void check_one(bool on_backend)
{
    REQUIRE(model_a);
    enum { PRE = 131, STEPS = 12 };
    const int V = ds4_model_n_vocab(model_a);
    ds4_session *a = mk(model_a, 448, DS4_NUMERICS_HF, 128, on_backend), *r = mk(model_a, 448, DS4_NUMERICS_HF, 128, false);
    REQUIRE(a && r);
    EXPECT_MSG(ds4_session_picks_on_backend(a) == on_backend, "picks on the backend: %d, asked %d",
               (int)ds4_session_picks_on_backend(a), (int)on_backend);
    REQUIRE(ds4_session_prefill(a, tok_a, PRE, NULL) == DS4_OK && ds4_session_prefill(r, tok_a, PRE, NULL) == DS4_OK);
    int picks_ok = 0, logits_ok = 0;
    greedy_steps(a, r, tok_a[PRE], STEPS, V, &picks_ok, &logits_ok);
    printf("    %s: %d steps, picks equal %d, logits bit-identical %d\n", on_backend ? "on the backend" : "host path",
           STEPS, picks_ok, logits_ok);
    EXPECT_MSG(picks_ok == STEPS, "%d of %d picks differ from ds4_argmax_excluding", STEPS - picks_ok, STEPS);
    EXPECT_MSG(logits_ok == STEPS, "%d of %d steps' logits differ", STEPS - logits_ok, STEPS);
    EXPECT(ds4_session_n_past(a) == PRE + STEPS && ds4_session_n_past(r) == PRE + STEPS);
    EXPECT_MSG(same_snapshot(a, r), "states differ after the greedy steps");
    ds4_session_free(a);
    ds4_session_free(r);
}

static void test_pick_host_path(void) { check_one(false); }
static void test_pick_on_backend(void) { check_one(true); }

/* A snapshot right after a pick, the logits never read: the bytes of the
 * reference's; restored (into a session of either kind) the same logits,
 * and both continue alike. */
static void test_snapshot_after_pick(void)
{
    REQUIRE(model_a);
    const int V = ds4_model_n_vocab(model_a);
    for (int kind = 0; kind < 2; kind++) {
        ds4_session *a = mk(model_a, 300, DS4_NUMERICS_HF, 128, true), *r = mk(model_a, 300, DS4_NUMERICS_HF, 128, false);
        ds4_session *c = mk(model_a, 300, DS4_NUMERICS_HF, 128, kind == 1);
        REQUIRE(a && r && c);
        REQUIRE(ds4_session_prefill(a, tok_a, 40, NULL) == DS4_OK && ds4_session_prefill(r, tok_a, 40, NULL) == DS4_OK);
        int32_t got = -2;
        REQUIRE(ds4_session_decode_pick(a, tok_a[40], -1, &got) == DS4_OK);
        REQUIRE(ds4_session_decode(r, tok_a[40]) == DS4_OK);
        EXPECT(ds4_session_snapshot_size(a) == ds4_session_snapshot_size(r));
        void *snap = NULL;
        size_t len = 0;
        REQUIRE(ds4_session_snapshot(a, &snap, &len) == DS4_OK);
        EXPECT_MSG(same_snapshot(a, r), "the snapshot after a pick differs from the reference's");
        REQUIRE(ds4_session_restore(c, snap, len) == DS4_OK);
        EXPECT_MSG(same_logits(c, r, V), "restored logits differ");
        int picks_ok = 0, logits_ok = 0;
        greedy_steps(c, r, got, 4, V, &picks_ok, &logits_ok);
        EXPECT_MSG(picks_ok == 4 && logits_ok == 4, "after the restore: picks %d/4, logits %d/4", picks_ok, logits_ok);
        free(snap);
        ds4_session_free(a);
        ds4_session_free(r);
        ds4_session_free(c);
    }
}

/* After a pick whose logits were never read: a plain decode, an empty
 * prefill, a prefill, a restore and a reset each leave what they leave
 * without the pick; the errors leave the pick at -1. */
static void test_calls_after_pick(void)
{
    REQUIRE(model_a);
    const int V = ds4_model_n_vocab(model_a);
    ds4_session *a = mk(model_a, 64, DS4_NUMERICS_HF, 128, true), *r = mk(model_a, 64, DS4_NUMERICS_HF, 128, false);
    REQUIRE(a && r);
    REQUIRE(ds4_session_prefill(a, tok_a, 20, NULL) == DS4_OK && ds4_session_prefill(r, tok_a, 20, NULL) == DS4_OK);
    void *snap = NULL;
    size_t len = 0;
    REQUIRE(ds4_session_snapshot(r, &snap, &len) == DS4_OK);
    int32_t got = -2;
    /* a pick, then a plain decode */
    REQUIRE(ds4_session_decode_pick(a, tok_a[20], -1, &got) == DS4_OK);
    REQUIRE(ds4_session_decode(a, tok_a[21]) == DS4_OK);
    REQUIRE(ds4_session_decode(r, tok_a[20]) == DS4_OK && ds4_session_decode(r, tok_a[21]) == DS4_OK);
    EXPECT_MSG(same_logits(a, r, V), "a decode after a pick: logits differ");
    /* a pick, then an empty prefill (nothing moves) and a prefill */
    REQUIRE(ds4_session_decode_pick(a, tok_a[22], -1, &got) == DS4_OK);
    REQUIRE(ds4_session_decode(r, tok_a[22]) == DS4_OK);
    REQUIRE(ds4_session_prefill(a, tok_a, 0, NULL) == DS4_OK);
    EXPECT_MSG(same_logits(a, r, V), "an empty prefill after a pick: logits differ");
    REQUIRE(ds4_session_decode_pick(a, tok_a[23], -1, &got) == DS4_OK);
    REQUIRE(ds4_session_prefill(a, tok_a + 24, 5, NULL) == DS4_OK);
    REQUIRE(ds4_session_decode(r, tok_a[23]) == DS4_OK && ds4_session_prefill(r, tok_a + 24, 5, NULL) == DS4_OK);
    EXPECT_MSG(same_logits(a, r, V), "a prefill after a pick: logits differ");
    /* a pick, then a restore of the state before it; then a reset */
    REQUIRE(ds4_session_decode_pick(a, tok_a[29], -1, &got) == DS4_OK);
    REQUIRE(ds4_session_restore(a, snap, len) == DS4_OK && ds4_session_restore(r, snap, len) == DS4_OK);
    EXPECT_MSG(same_logits(a, r, V) && ds4_session_n_past(a) == 20, "a restore after a pick: logits differ");
    REQUIRE(ds4_session_decode_pick(a, tok_a[20], -1, &got) == DS4_OK);
    ds4_session_reset(a);
    EXPECT(ds4_session_logits(a) == NULL && ds4_session_n_past(a) == 0);
    /* errors: no place for the pick; a full context */
    EXPECT(ds4_session_decode_pick(a, tok_a[0], -1, NULL) == DS4_ERR_INVALID);
    REQUIRE(ds4_session_prefill(a, tok_a, 64, NULL) == DS4_OK);
    got = 7;
    EXPECT(ds4_session_decode_pick(a, tok_a[0], -1, &got) == DS4_ERR_INVALID && got == -1);
    EXPECT_MSG(strstr(ds4_last_error(), "decode_pick: ") && strstr(ds4_last_error(), "context length"), "message: %s",
               ds4_last_error());
    got = 7;
    ds4_session_reset(a);
    EXPECT(ds4_session_decode_pick(a, V, -1, &got) != DS4_OK && got == -1);
    free(snap);
    ds4_session_free(a);
    ds4_session_free(r);
}

/* ---- batched steps ---------------------------------------------------------- */

enum { MAXN = 5 };

/* n sessions (prompt tok[7k .. 7k + len[k]) each) made as `on_backend`
 * says with max_chunk `chunk` (groups of that many), stepped `steps` times
 * with decode_batch_pick; references: copies stepped with decode_batch and
 * ds4_argmax_excluding. excluded: every step's excluded id (-2: the token
 * session 0's reference would pick, else that id). */
static void check_batch(ds4_model *m, const ds4_numerics *nm, const int32_t *tok, const int *len, int n, int chunk,
                        bool on_backend, int32_t excluded, int steps, const char *what)
{
    const int V = ds4_model_n_vocab(m);
    ds4_session *b[MAXN] = {0}, *r[MAXN] = {0};
    int32_t t[MAXN];
    for (int k = 0; k < n; k++) {
        b[k] = mk(m, 256, nm[k], chunk, on_backend);
        REQUIRE(b[k] && ds4_session_prefill(b[k], tok + 7 * k, len[k], NULL) == DS4_OK);
        REQUIRE((r[k] = copy_of(m, b[k], 256, nm[k], chunk, false)) != NULL);
        t[k] = tok[7 * k + len[k]];
    }
    int picks_ok = 0, logits_ok = 0, excluded_seen = 0;
    for (int step = 0; step < steps; step++) {
        REQUIRE(ds4_session_decode_batch(r, t, n) == DS4_OK);
        int32_t want[MAXN], got[MAXN];
        const int32_t ex = excluded == -2 ? ds4_argmax_excluding(ds4_session_logits(r[0]), V, -1) : excluded;
        for (int k = 0; k < n; k++) {
            want[k] = ds4_argmax_excluding(ds4_session_logits(r[k]), V, ex);
            excluded_seen += ds4_argmax_excluding(ds4_session_logits(r[k]), V, -1) == ex;
        }
        /* the logits of later sessions read first: each row is its own */
        REQUIRE(ds4_session_decode_batch_pick(b, t, n, ex, got) == DS4_OK);
        for (int k = n - 1; k >= 0; k--) {
            picks_ok += got[k] == want[k] && got[k] != ex;
            logits_ok += step % 3 == 2 || same_logits(b[k], r[k], V); /* some steps unread */
        }
        for (int k = 0; k < n; k++) t[k] = want[k];
    }
    int states = 0;
    for (int k = 0; k < n; k++) states += same_snapshot(b[k], r[k]);
    printf("    %s, %d sessions, %s: picks equal %d/%d, logits %d/%d, states %d/%d (%d picks had the maximum "
           "excluded)\n",
           what, n, on_backend ? "on the backend" : "host path", picks_ok, n * steps, logits_ok, n * steps, states, n,
           excluded_seen);
    EXPECT_MSG(picks_ok == n * steps, "%s: %d picks differ", what, n * steps - picks_ok);
    EXPECT_MSG(logits_ok == n * steps, "%s: %d steps' logits differ", what, n * steps - logits_ok);
    EXPECT_MSG(states == n, "%s: %d states differ", what, n - states);
    if (excluded == -2) EXPECT_MSG(excluded_seen >= steps, "%s: the maximum was never excluded", what);
    for (int k = 0; k < n; k++) {
        ds4_session_free(b[k]);
        ds4_session_free(r[k]);
    }
}

static void test_batch_pick(void)
{
    REQUIRE(model_a);
    static const int len[] = {3, 127, 131, 64, 40};
    const ds4_numerics hf[MAXN] = {DS4_NUMERICS_HF, DS4_NUMERICS_HF, DS4_NUMERICS_HF, DS4_NUMERICS_HF, DS4_NUMERICS_HF};
    for (int on = 0; on < 2; on++) {
        check_batch(model_a, hf, tok_a, len, 3, 128, on, -2, 6, "tiny-a, the maximum excluded");
        check_batch(model_a, hf, tok_a, len, 2, 128, on, -1, 4, "tiny-a");
        /* max_chunk 2: groups of 2, 2 and 1 */
        check_batch(model_a, hf, tok_a, len, 5, 2, on, 1, 4, "tiny-a in groups, id 1 excluded");
    }
}

/* Sessions that cannot share one pass (different numerics) decode one by
 * one: with their picks all the same. */
static void test_batch_pick_one_by_one(void)
{
    REQUIRE(model_synth);
    int32_t tok[64];
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 64; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        tok[i] = (int32_t)(x % (uint64_t)SYNTH_OFFICIAL.n_vocab);
    }
    static const int len[] = {10, 13, 16};
    const ds4_numerics nm[MAXN] = {DS4_NUMERICS_OFFICIAL, DS4_NUMERICS_HF, DS4_NUMERICS_OFFICIAL};
    for (int on = 0; on < 2; on++) check_batch(model_synth, nm, tok, len, 3, 128, on, -2, 4, "mixed numerics");
}

static void test_batch_pick_errors(void)
{
    REQUIRE(model_a);
    ds4_session *s[2] = {mk(model_a, 64, DS4_NUMERICS_HF, 128, true), mk(model_a, 64, DS4_NUMERICS_HF, 128, true)};
    REQUIRE(s[0] && s[1]);
    int32_t t[2] = {5, 6}, got[2] = {7, 7};
    EXPECT(ds4_session_decode_batch_pick(s, t, 2, -1, NULL) == DS4_ERR_INVALID);
    ds4_session *dup[2] = {s[0], s[0]};
    EXPECT(ds4_session_decode_batch_pick(dup, t, 2, -1, got) == DS4_ERR_INVALID && got[0] == -1 && got[1] == -1);
    EXPECT(ds4_session_decode_batch_pick(s, t, 0, -1, got) == DS4_OK);
    EXPECT(ds4_session_n_past(s[0]) == 0 && ds4_session_n_past(s[1]) == 0);
    ds4_session_free(s[0]);
    ds4_session_free(s[1]);
}

int main(void)
{
    mkdir("build", 0755);
    mkdir("build/tests", 0755);
    float *gold = NULL;
    int V = 0;
    if (fixture_write_gguf(TINY_A, GGUF_A, 0)) model_a = ds4_model_open(GGUF_A, NULL);
    if (synth_write_gguf(&SYNTH_OFFICIAL, 77, GGUF_SYNTH)) model_synth = ds4_model_open(GGUF_SYNTH, NULL);
    if (!model_a || !model_synth) fprintf(stderr, "model open: %s\n", ds4_last_error());
    if (!fixture_sequence(TINY_A, 0, &tok_a, &n_tok_a, &gold, &V) || n_tok_a < 448) {
        fprintf(stderr, "tiny-a sequence 0: missing or shorter than 448 tokens\n");
        ds4_model_close(model_a);
        model_a = NULL;
    }
    free(gold);
    RUN(test_cpu_argmax_rows);
    RUN(test_pick_host_path);
    RUN(test_pick_on_backend);
    RUN(test_snapshot_after_pick);
    RUN(test_calls_after_pick);
    RUN(test_batch_pick);
    RUN(test_batch_pick_one_by_one);
    RUN(test_batch_pick_errors);
    ds4_model_close(model_a);
    ds4_model_close(model_synth);
    free(tok_a);
    return test_finish();
}

/*
 * test_cuda_session.c - session state across backends: a snapshot taken on
 * the CPU restores on CUDA and the reverse, and the continuation matches
 * the original backend's (tiny-a fixture, f32 weights). Also the explicit
 * backend choice: DS4_BACKEND_CUDA gives a working session; and two CUDA
 * sessions of one model share one device copy of each weight
 * (backend/weight_share.h) and compute the same logits; a warm-up
 * (ds4_session_warmup) changes no bit of a session's logits, nor does the
 * decode step walked ahead (DS4_CUDA_STEP_AHEAD). The in-graph kernel
 * times (DS4_CUDA_KTIME) pair every kernel of a replayed step with its
 * stamp, checked in a child process of this binary with one stream
 * (--ktime-one-stream). The greedy pick on the device
 * (ds4_session_decode_pick, ds4_session_decode_batch_pick) gives
 * ds4_argmax_excluding's token of the logits a plain decode gives, and the
 * logits read afterwards are those bits. Skips when
 * built without nvcc or when no CUDA device is present.
 *
 * Tolerance: both backends are within ~2e-5 of the reference logits
 * (test_model_golden), so their continuations must agree to 1e-3.
 */
#include "include/ds4.h"
#include "include/ds4_sampler.h"
#include "tests/model_fixture.h"
#include "tests/test.h"

#include <math.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#if DS4_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#include "backend/weight_share.h"

#define TINY_A "tests/data/dsv4-tiny-a"
#define GGUF_A "build/tests/tiny-a-f32-cuda-session.gguf"

static ds4_model *model;
static int32_t *tok;
static int64_t n_tok;
static int V;

static ds4_session *open_session(ds4_backend_kind kind, ds4_numerics nm)
{
    ds4_session_params p;
    ds4_session_params_default(&p);
    p.n_ctx = n_tok;
    p.numerics = nm;
    p.n_threads = 2;
    p.backend = kind;
    ds4_session *s = ds4_session_create(model, &p);
    if (!s) fprintf(stderr, "session (backend %d): %s\n", (int)kind, ds4_last_error());
    return s;
}

static void cross(ds4_backend_kind from, ds4_backend_kind to, ds4_numerics nm)
{
    enum { PRE = 301, CONT = 20 };
    ds4_session *a = open_session(from, nm), *b = open_session(to, nm);
    REQUIRE(a && b);
    REQUIRE(ds4_session_prefill(a, tok, PRE, NULL) == DS4_OK);
    void *snap = NULL;
    size_t len = 0;
    REQUIRE(ds4_session_snapshot(a, &snap, &len) == DS4_OK);
    REQUIRE(ds4_session_restore(b, snap, len) == DS4_OK);
    EXPECT(ds4_session_n_past(b) == PRE);
    double worst = 0;
    for (int i = 0; i < CONT; i++) {
        REQUIRE(ds4_session_decode(a, tok[PRE + i]) == DS4_OK);
        REQUIRE(ds4_session_decode(b, tok[PRE + i]) == DS4_OK);
        const float *la = ds4_session_logits(a), *lb = ds4_session_logits(b);
        for (int v = 0; v < V; v++) {
            double d = fabs((double)la[v] - lb[v]);
            if (!(d <= worst)) worst = isnan(d) ? INFINITY : d;
        }
    }
    printf("    backend %d -> %d, numerics %d: max |dlogit| over %d continued tokens = %.3g\n", (int)from,
           (int)to, (int)nm, CONT, worst);
    EXPECT_MSG(worst <= 1e-3, "backend %d -> %d: continuation differs by %.3g", (int)from, (int)to, worst);
    free(snap);
    ds4_session_free(a);
    ds4_session_free(b);
}

static int need(void)
{
    if (ds4_cuda_device_count() <= 0) {
        test_skip("no CUDA device (cudaGetDeviceCount found none)");
        return 0;
    }
    if (!model) {
        test_skip("tiny-a fixture model could not be built: %s", ds4_last_error());
        return 0;
    }
    return 1;
}

static void test_cpu_snapshot_restores_on_cuda(void)
{
    if (!need()) return;
    cross(DS4_BACKEND_CPU, DS4_BACKEND_CUDA, DS4_NUMERICS_HF);
    cross(DS4_BACKEND_CPU, DS4_BACKEND_CUDA, DS4_NUMERICS_AUTO);
}

static void test_cuda_snapshot_restores_on_cpu(void)
{
    if (!need()) return;
    cross(DS4_BACKEND_CUDA, DS4_BACKEND_CPU, DS4_NUMERICS_HF);
    cross(DS4_BACKEND_CUDA, DS4_BACKEND_CPU, DS4_NUMERICS_AUTO);
}

/* A second session on the device adds no weight copy; the copies live
 * until the last session using them is freed; both sessions agree. */
static void test_cuda_sessions_share_weights(void)
{
    if (!need()) return;
    const size_t before = ds4_wshare_count();
    ds4_session *a = open_session(DS4_BACKEND_CUDA, DS4_NUMERICS_HF);
    REQUIRE(a);
    const size_t one = ds4_wshare_count();
    ds4_session *b = open_session(DS4_BACKEND_CUDA, DS4_NUMERICS_HF);
    REQUIRE(b);
    EXPECT_MSG(one > before, "first session registered no weight copy (%zu -> %zu)", before, one);
    EXPECT_MSG(ds4_wshare_count() == one, "second session added copies: %zu -> %zu", one, ds4_wshare_count());
    int same = 1;
    for (int i = 0; i < 40; i++) {
        REQUIRE(ds4_session_decode(a, tok[i]) == DS4_OK);
        REQUIRE(ds4_session_decode(b, tok[i]) == DS4_OK);
        same &= memcmp(ds4_session_logits(a), ds4_session_logits(b), (size_t)V * sizeof(float)) == 0;
    }
    EXPECT_MSG(same, "two CUDA sessions on shared weights computed different logits");
    ds4_session_free(a);
    EXPECT_MSG(ds4_wshare_count() == one, "freeing one session dropped copies the other still uses");
    EXPECT(ds4_session_decode(b, tok[40]) == DS4_OK);
    ds4_session_free(b);
    EXPECT_MSG(ds4_wshare_count() == before, "copies left after the last session: %zu", ds4_wshare_count());
}

/* ds4_session_warmup on CUDA (a prefill step, a decode whose graph is
 * recorded, a reset) leaves a session that computes what one without it
 * does, bit for bit: a prefill and 20 decoded tokens. */
static void test_cuda_warmup_same_logits(void)
{
    if (!need()) return;
    enum { PRE = 301, CONT = 20 };
    ds4_session *a = open_session(DS4_BACKEND_CUDA, DS4_NUMERICS_AUTO), *b = open_session(DS4_BACKEND_CUDA, DS4_NUMERICS_AUTO);
    REQUIRE(a && b);
    REQUIRE(ds4_session_warmup(a, 0) == DS4_OK);
    EXPECT(ds4_session_n_past(a) == 0);
    REQUIRE(ds4_session_prefill(a, tok, PRE, NULL) == DS4_OK);
    REQUIRE(ds4_session_prefill(b, tok, PRE, NULL) == DS4_OK);
    int same = memcmp(ds4_session_logits(a), ds4_session_logits(b), (size_t)V * sizeof(float)) == 0;
    EXPECT_MSG(same, "the prefill's logits differ after a warm-up");
    for (int i = 0; i < CONT; i++) {
        REQUIRE(ds4_session_decode(a, tok[PRE + i]) == DS4_OK);
        REQUIRE(ds4_session_decode(b, tok[PRE + i]) == DS4_OK);
        same &= memcmp(ds4_session_logits(a), ds4_session_logits(b), (size_t)V * sizeof(float)) == 0;
    }
    EXPECT_MSG(same, "decoded logits differ after a warm-up");
    ds4_session_free(a);
    ds4_session_free(b);
}

/* The next decode step walked while the device runs this one (cuda_graph.cu,
 * AHEAD) changes nothing a session computes or counts: a session with it
 * and one with DS4_CUDA_STEP_AHEAD=0 give the same bits and the same work
 * counters over 20 decoded tokens, then again after both restore a state
 * 5 tokens back (the step held ahead is for a position no step takes).
 * The launches on a walk ahead are counted, so the path is seen to run. */
static int same_stats(const ds4_session *a, const ds4_session *b)
{
    ds4_session_stats x, y;
    ds4_session_get_stats(a, &x);
    ds4_session_get_stats(b, &y);
    return x.rows_attended == y.rows_attended && x.compressor_pushes == y.compressor_pushes &&
           x.rows_emitted == y.rows_emitted && x.indexer_keys_scored == y.indexer_keys_scored &&
           x.matmul_rows == y.matmul_rows;
}

static void test_cuda_step_ahead_same_logits(void)
{
    if (!need()) return;
    enum { PRE = 260, CONT = 20, BACK = 5 };
    unsetenv("DS4_CUDA_STEP_AHEAD");
    ds4_session *a = open_session(DS4_BACKEND_CUDA, DS4_NUMERICS_AUTO);
    setenv("DS4_CUDA_STEP_AHEAD", "0", 1);
    ds4_session *b = open_session(DS4_BACKEND_CUDA, DS4_NUMERICS_AUTO);
    unsetenv("DS4_CUDA_STEP_AHEAD");
    REQUIRE(a && b);
    REQUIRE(ds4_session_prefill(a, tok, PRE, NULL) == DS4_OK);
    REQUIRE(ds4_session_prefill(b, tok, PRE, NULL) == DS4_OK);
    const uint64_t ahead0 = ds4_cuda_graph_steps_ahead();
    void *snap = NULL;
    size_t len = 0;
    int same = 1, counted = 1;
    for (int i = 0; i < CONT; i++) {
        if (i == CONT - BACK) REQUIRE(ds4_session_snapshot(a, &snap, &len) == DS4_OK);
        REQUIRE(ds4_session_decode(a, tok[PRE + i]) == DS4_OK);
        REQUIRE(ds4_session_decode(b, tok[PRE + i]) == DS4_OK);
        same &= memcmp(ds4_session_logits(a), ds4_session_logits(b), (size_t)V * sizeof(float)) == 0;
        counted &= same_stats(a, b);
    }
    const uint64_t ahead1 = ds4_cuda_graph_steps_ahead();
    REQUIRE(ds4_session_restore(a, snap, len) == DS4_OK);
    REQUIRE(ds4_session_restore(b, snap, len) == DS4_OK);
    for (int i = CONT - BACK; i < CONT + 10; i++) {
        REQUIRE(ds4_session_decode(a, tok[PRE + i]) == DS4_OK);
        REQUIRE(ds4_session_decode(b, tok[PRE + i]) == DS4_OK);
        same &= memcmp(ds4_session_logits(a), ds4_session_logits(b), (size_t)V * sizeof(float)) == 0;
    }
    printf("    %llu of %d decode steps launched on a walk ahead before the restore, %llu after\n",
           (unsigned long long)(ahead1 - ahead0), CONT, (unsigned long long)(ds4_cuda_graph_steps_ahead() - ahead1));
    EXPECT_MSG(same, "decoded logits differ with the walk ahead on and off");
    EXPECT_MSG(counted, "work counters differ with the walk ahead on and off");
    /* the graph is recorded at the second decode step: the steps after the
     * third launch on the walk ahead */
    EXPECT_MSG(ahead1 - ahead0 >= CONT - 4, "only %llu of %d steps launched on a walk ahead",
               (unsigned long long)(ahead1 - ahead0), CONT);
    EXPECT_MSG(ds4_cuda_graph_steps_ahead() - ahead1 >= 10, "no walk ahead after the restore");
    free(snap);
    ds4_session_free(a);
    ds4_session_free(b);
}

/* The greedy pick on the device against the host's: a session stepping
 * with ds4_session_decode_pick (its decode steps replayed as graphs, the
 * pick launched after each) and one with ds4_session_decode +
 * ds4_argmax_excluding pick the same tokens, every other step with the
 * true maximum excluded, and the logits read after each pick (downloaded
 * then) are the other's bit for bit; a snapshot taken right after a pick
 * equals the other's. Then three sessions with decode_batch_pick against
 * three with decode_batch and the host's pick, the later sessions' logits
 * read first (each row copied into its own state). */
static void test_cuda_pick_same_tokens(void)
{
    if (!need()) return;
    enum { PRE = 200, STEPS = 24, NB = 3, BSTEPS = 8 };
    ds4_session *a = open_session(DS4_BACKEND_CUDA, DS4_NUMERICS_AUTO), *r = open_session(DS4_BACKEND_CUDA, DS4_NUMERICS_AUTO);
    REQUIRE(a && r);
    REQUIRE(ds4_session_prefill(a, tok, PRE, NULL) == DS4_OK && ds4_session_prefill(r, tok, PRE, NULL) == DS4_OK);
    int picks = 0, same = 0;
    int32_t t = tok[PRE];
    for (int i = 0; i < STEPS; i++) {
        REQUIRE(ds4_session_decode(r, t) == DS4_OK);
        const float *lr = ds4_session_logits(r);
        const int32_t ex = i % 2 ? ds4_argmax_excluding(lr, V, -1) : -1, want = ds4_argmax_excluding(lr, V, ex);
        int32_t got = -2;
        REQUIRE(ds4_session_decode_pick(a, t, ex, &got) == DS4_OK);
        if (i == STEPS / 2) { /* the snapshot first: it brings the row home itself */
            void *x = NULL, *y = NULL;
            size_t lx = 0, ly = 0;
            REQUIRE(ds4_session_snapshot(a, &x, &lx) == DS4_OK && ds4_session_snapshot(r, &y, &ly) == DS4_OK);
            EXPECT_MSG(lx == ly && memcmp(x, y, lx) == 0, "the snapshot right after a pick differs");
            free(x);
            free(y);
        }
        /* the pick is the host's on the logits the step left, and those are the plain decode's */
        picks += got == want && got >= 0 && got == ds4_argmax_excluding(ds4_session_logits(a), V, ex);
        same += memcmp(ds4_session_logits(a), lr, (size_t)V * sizeof(float)) == 0;
        t = want;
    }
    printf("    one session: %d steps, picks equal %d, logits bit-identical %d\n", STEPS, picks, same);
    EXPECT_MSG(picks == STEPS, "%d of %d device picks differ from ds4_argmax_excluding", STEPS - picks, STEPS);
    EXPECT_MSG(same == STEPS, "%d of %d steps' logits differ after a device pick", STEPS - same, STEPS);
    ds4_session_free(a);
    ds4_session_free(r);

    ds4_session *b[NB], *q[NB];
    int32_t tb[NB], got[NB];
    for (int k = 0; k < NB; k++) {
        b[k] = open_session(DS4_BACKEND_CUDA, DS4_NUMERICS_AUTO);
        q[k] = open_session(DS4_BACKEND_CUDA, DS4_NUMERICS_AUTO);
        REQUIRE(b[k] && q[k]);
        REQUIRE(ds4_session_prefill(b[k], tok + 11 * k, 100 + 30 * k, NULL) == DS4_OK);
        REQUIRE(ds4_session_prefill(q[k], tok + 11 * k, 100 + 30 * k, NULL) == DS4_OK);
        tb[k] = tok[11 * k + 100 + 30 * k];
    }
    picks = same = 0;
    for (int i = 0; i < BSTEPS; i++) {
        REQUIRE(ds4_session_decode_batch(q, tb, NB) == DS4_OK);
        const int32_t ex = i % 2 ? ds4_argmax_excluding(ds4_session_logits(q[0]), V, -1) : -1;
        REQUIRE(ds4_session_decode_batch_pick(b, tb, NB, ex, got) == DS4_OK);
        for (int k = NB - 1; k >= 0; k--) {
            const float *lq = ds4_session_logits(q[k]);
            const int32_t want = ds4_argmax_excluding(lq, V, ex);
            picks += got[k] == want && got[k] >= 0 && got[k] == ds4_argmax_excluding(ds4_session_logits(b[k]), V, ex);
            same += memcmp(ds4_session_logits(b[k]), lq, (size_t)V * sizeof(float)) == 0;
            tb[k] = want;
        }
    }
    printf("    %d sessions batched: %d steps, picks equal %d/%d, logits bit-identical %d/%d\n", NB, BSTEPS, picks,
           NB * BSTEPS, same, NB * BSTEPS);
    EXPECT_MSG(picks == NB * BSTEPS, "%d batched device picks differ", NB * BSTEPS - picks);
    EXPECT_MSG(same == NB * BSTEPS, "%d batched rows' logits differ after a device pick", NB * BSTEPS - same);
    for (int k = 0; k < NB; k++) {
        ds4_session_free(b[k]);
        ds4_session_free(q[k]);
    }
}

/* In-graph kernel times (cuda_ktrace.cu; DS4_CUDA_KTIME=2, collect
 * without printing): every kernel noted in a recorded decode step stamps
 * once in each replay (so each still waits for its predecessor in
 * ds4_pdl_enter), the stamps find their launches, and their span is
 * within the step's wall time measured here. Run in a child process with
 * the side streams off (DS4_CUDA_SIDE=0 DS4_CUDA_MOE_AHEAD=0, read once a
 * process), as the tool asks: forked kernels stamp out of launch order,
 * and kernels of one shape cannot then be told apart (the first GPU run,
 * with them on, paired 112 of 189 launches a replay). */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_cuda_ktime_stamps(void)
{
    if (!need()) return;
    enum { PRE = 200, WARM = 3, STEPS = 16 };
    ds4_session *s = open_session(DS4_BACKEND_CUDA, DS4_NUMERICS_AUTO);
    REQUIRE(s);
    REQUIRE(ds4_session_prefill(s, tok, PRE, NULL) == DS4_OK);
    /* a plain step, the recorded one, the first replay */
    for (int i = 0; i < WARM; i++) REQUIRE(ds4_session_decode(s, tok[PRE + i]) == DS4_OK);
    const double t0 = now_s();
    for (int i = WARM; i < STEPS; i++) REQUIRE(ds4_session_decode(s, tok[PRE + i]) == DS4_OK);
    const double wall_us = (now_s() - t0) / (STEPS - WARM) * 1e6;
    ds4_cuda_ktime k;
    ds4_cuda_ktime_totals(&k);
    printf("    %d kernels a step, %ld replays timed, %ld unmatched stamps, %ld launches without one; "
           "%.1f us from the first stamp to the last against %.1f us a step\n",
           k.kernels, k.replays, k.unmatched, k.unstamped, k.us_per_step, wall_us);
    EXPECT_MSG(k.kernels >= 10, "%d kernels noted in the recorded step", k.kernels);
    EXPECT_MSG(k.replays >= STEPS - WARM - 1, "%ld replays timed of %d", k.replays, STEPS - WARM);
    EXPECT_MSG(k.unstamped == 0, "%ld noted launches without a stamp (a kernel skips ds4_pdl_enter)", k.unstamped);
    EXPECT_MSG(k.unmatched <= 4 * k.replays, "%ld stamps matched no launch in %ld replays", k.unmatched, k.replays);
    EXPECT_MSG(k.us_per_step > 0.0 && k.us_per_step < wall_us, "%.1f us of kernels a step against %.1f us of wall time",
               k.us_per_step, wall_us);
    /* the phases the kernels of this model mark (the Flash-shaped sites,
     * hyper-connection clusters and routed experts, do not run on the tiny
     * model): each a time after its thread's wait, inside the step */
    int marked = 0;
    for (int site = 0; site < 8; site++)
        for (int ph = 0; ph < 8; ph++) {
            double per = 0.0;
            const double us = ds4_cuda_ktime_phase(site, ph, &per);
            if (per <= 0.0) continue;
            marked++;
            printf("    phase %d.%d: %.2f us after the wait, %.1f marks a replay\n", site, ph, us, per);
            EXPECT_MSG(us > 0.0 && us < k.us_per_step, "phase %d.%d at %.2f us of a %.1f us step", site, ph, us,
                       k.us_per_step);
        }
    printf("    %d phases marked\n", marked);
    ds4_session_free(s);
}

/* The child's environment: this one's with the one-stream switches. */
static char **ktime_env(void)
{
    extern char **environ;
    size_t n = 0;
    while (environ[n]) n++;
    char **env = calloc(n + 4, sizeof *env);
    if (!env) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "DS4_CUDA_SIDE=", 14) && strncmp(environ[i], "DS4_CUDA_MOE_AHEAD=", 19) &&
            strncmp(environ[i], "DS4_CUDA_KTIME=", 15))
            env[k++] = environ[i];
    static char side[] = "DS4_CUDA_SIDE=0", ahead[] = "DS4_CUDA_MOE_AHEAD=0", kt[] = "DS4_CUDA_KTIME=2";
    env[k++] = side;
    env[k++] = ahead;
    env[k++] = kt;
    return env;
}

static void test_cuda_ktime_one_stream(void)
{
    if (!need()) return;
    char **env = ktime_env();
    REQUIRE(env);
    char arg0[] = "test_cuda_session", arg1[] = "--ktime-one-stream";
    char *argv[] = {arg0, arg1, NULL};
    pid_t pid = 0;
    fflush(stdout);
    const int e = posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, env);
    free(env);
    EXPECT_MSG(e == 0, "cannot start the child: %s", strerror(e));
    if (e != 0) return;
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    EXPECT_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the one-stream child failed (status %d; its lines above)", st);
}

int main(int argc, char **argv)
{
    float *gold = NULL;
    const bool ktime_child = argc > 1 && strcmp(argv[1], "--ktime-one-stream") == 0;
    /* read once, at the first recording: the other tests run with the stamps on */
    setenv("DS4_CUDA_KTIME", "2", 1);
    if (ds4_cuda_device_count() > 0) {
        mkdir("build", 0755);
        mkdir("build/tests", 0755);
        if (fixture_write_gguf(TINY_A, GGUF_A, 0)) model = ds4_model_open(GGUF_A, NULL);
        if (model && !fixture_sequence(TINY_A, 0, &tok, &n_tok, &gold, &V)) {
            ds4_model_close(model);
            model = NULL;
        }
    }
    if (ktime_child) {
        RUN(test_cuda_ktime_stamps);
    } else {
        RUN(test_cpu_snapshot_restores_on_cuda);
        RUN(test_cuda_snapshot_restores_on_cpu);
        RUN(test_cuda_sessions_share_weights);
        RUN(test_cuda_warmup_same_logits);
        RUN(test_cuda_step_ahead_same_logits);
        RUN(test_cuda_pick_same_tokens);
        RUN(test_cuda_ktime_one_stream);
    }
    ds4_model_close(model);
    free(tok);
    free(gold);
    return test_finish();
}
#else
int main(void) { return test_skip_all_no_cuda(); }
#endif

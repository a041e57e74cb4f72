/*
 * test_steering.c - directional steering and the --power duty cycle
 * (engine/session_edit.c, model/dsv4_steer.c, util/throttle.c).
 *
 * The steering formula is checked against an independent computation:
 * y <- y - S v (v . y) on a sublayer output that is linear in its last
 * weight (attention: F = W_o_b u; MoE: F = sum_e w_e W_down_e h_e +
 * W_down_sh h_sh) is the same as running a model whose weights are
 * (I - S v v^T) W. The test writes that edited model from the same seed
 * and compares its plain logits with the steered logits of the original.
 */
#include "include/ds4.h"
#include "tests/model_synth.h"
#include "tests/test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GGUF_A "build/tests/steer_a.gguf"
#define GGUF_B "build/tests/steer_b.gguf"
#define STEER_F "build/tests/steer_dirs.f32"
#define N_TOK 40
static const int LA = 1, LF = 2; /* the layers with a direction */
static const float SA = 0.7f, SF = -1.5f;

static ds4_model *model_a, *model_b;
static float *dirs; /* [n_layer, n_embd]: unit rows at LA and LF, zero elsewhere */

/* W (rows = outputs of width E, cols inputs) <- (I - S v v^T) W */
static void project_rows(float *W, int E, int cols, const float *v, float S)
{
    for (int j = 0; j < cols; j++) {
        double d = 0;
        for (int k = 0; k < E; k++) d += (double)v[k] * W[(size_t)k * cols + j];
        for (int k = 0; k < E; k++) W[(size_t)k * cols + j] -= (float)(S * v[k] * d);
    }
}

/* Steering edits every layer whose direction row is not zero, at both
 * sublayers: the same edit of that layer's o_b and down projections. */
static void edit_b(const char *name, float *v, const uint64_t *ne, void *ctx)
{
    (void)ctx;
    int E = SYNTH_OFFICIAL.n_embd, il;
    char rest[64];
    if (sscanf(name, "blk.%d.%63s", &il, rest) != 2 || (il != LA && il != LF)) return;
    const float *d = dirs + (size_t)il * E;
    if (!strcmp(rest, "attn_output_b.weight")) project_rows(v, E, (int)ne[0], d, SA);
    if (!strcmp(rest, "ffn_down_exps.weight") || !strcmp(rest, "ffn_down_shexp.weight"))
        for (uint64_t e = 0; e < ne[2]; e++) project_rows(v + e * ne[0] * ne[1], E, (int)ne[0], d, SF);
}

static ds4_session *session(ds4_model *m)
{
    ds4_session_params p;
    ds4_session_params_default(&p);
    p.n_ctx = 256;
    p.numerics = DS4_NUMERICS_HF;
    p.n_threads = 2;
    p.max_chunk = 16;
    p.backend = DS4_BACKEND_CPU;
    return ds4_session_create(m, &p);
}

static int32_t toks[N_TOK];

/* logits of every position: a prefill of 24 (chunks of 16 and 8: the
 * chunked path), then 16 decode steps */
static float *run(ds4_session *s, int V)
{
    float *L = malloc((size_t)N_TOK * V * sizeof(float));
    if (ds4_session_prefill(s, toks, 24, L) != DS4_OK) {
        free(L);
        return NULL;
    }
    for (int t = 24; t < N_TOK; t++) {
        if (ds4_session_decode(s, toks[t]) != DS4_OK) {
            free(L);
            return NULL;
        }
        memcpy(L + (size_t)t * V, ds4_session_logits(s), (size_t)V * sizeof(float));
    }
    return L;
}

static void test_formula_against_edited_weights(void)
{
    REQUIRE(model_a && model_b);
    int V = ds4_model_n_vocab(model_a);
    ds4_session *sa = session(model_a), *sb = session(model_b), *plain = session(model_a);
    REQUIRE(sa && sb && plain);
    REQUIRE(ds4_session_set_steering(sa, dirs, SA, SF) == DS4_OK);
    float *la = run(sa, V), *lb = run(sb, V), *lp = run(plain, V);
    REQUIRE(la && lb && lp);
    double d = test_max_abs_diff(la, lb, (size_t)N_TOK * V), moved = test_max_abs_diff(la, lp, (size_t)N_TOK * V);
    printf("  steered vs edited weights: max |dlogit| %.3g; steering moved logits by up to %.3g\n", d, moved);
    EXPECT_MSG(d < 1e-3, "steered logits differ from the edited model's by %g", d);
    EXPECT_MSG(moved > 0.1, "steering moved the logits by only %g (the test would not see a wrong formula)", moved);
    free(la), free(lb), free(lp);
    ds4_session_free(sa), ds4_session_free(sb), ds4_session_free(plain);
}

static void test_scale_zero_is_identity(void)
{
    REQUIRE(model_a);
    int V = ds4_model_n_vocab(model_a);
    ds4_session *s0 = session(model_a), *s1 = session(model_a);
    REQUIRE(s0 && s1);
    REQUIRE(ds4_session_set_steering(s1, dirs, 0.0f, 0.0f) == DS4_OK);
    float *a = run(s0, V), *b = run(s1, V);
    REQUIRE(a && b);
    EXPECT_MSG(memcmp(a, b, (size_t)N_TOK * V * sizeof(float)) == 0, "scale 0 changed the logits");
    /* on, then off again: the plain forward */
    ds4_session_reset(s1);
    REQUIRE(ds4_session_set_steering(s1, dirs, 1.0f, 1.0f) == DS4_OK);
    REQUIRE(ds4_session_set_steering(s1, NULL, 1.0f, 1.0f) == DS4_OK);
    float *c = run(s1, V);
    REQUIRE(c);
    EXPECT(memcmp(a, c, (size_t)N_TOK * V * sizeof(float)) == 0);
    free(a), free(b), free(c);
    ds4_session_free(s0), ds4_session_free(s1);
}

static int write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    size_t w = fwrite(p, 1, n, f);
    return fclose(f) == 0 && w == n;
}

static void test_file_errors(void)
{
    REQUIRE(model_a);
    size_t n = (size_t)ds4_model_n_layer(model_a) * ds4_model_n_embd(model_a);
    float *d = NULL;
    REQUIRE(write_file(STEER_F, dirs, n * 4));
    EXPECT(ds4_steering_file_read(model_a, STEER_F, &d) == DS4_OK && d && !memcmp(d, dirs, n * 4));
    free(d);
    REQUIRE(write_file(STEER_F, dirs, n * 4 - 4)); /* one float short */
    EXPECT(ds4_steering_file_read(model_a, STEER_F, &d) == DS4_ERR_FORMAT && !d);
    EXPECT_MSG(strstr(ds4_last_error(), "needs") && strstr(ds4_last_error(), "layers"), "%s", ds4_last_error());
    float *bad = malloc(n * 4);
    memcpy(bad, dirs, n * 4);
    bad[(size_t)LF * ds4_model_n_embd(model_a) + 3] = NAN;
    REQUIRE(write_file(STEER_F, bad, n * 4));
    EXPECT(ds4_steering_file_read(model_a, STEER_F, &d) == DS4_ERR_FORMAT);
    EXPECT_MSG(strstr(ds4_last_error(), "layer 2, dim 3") && strstr(ds4_last_error(), "not finite"), "%s",
               ds4_last_error());
    memcpy(bad, dirs, n * 4);
    bad[(size_t)LA * ds4_model_n_embd(model_a)] += 0.5f; /* no longer unit */
    REQUIRE(write_file(STEER_F, bad, n * 4));
    EXPECT(ds4_steering_file_read(model_a, STEER_F, &d) == DS4_ERR_FORMAT);
    EXPECT_MSG(strstr(ds4_last_error(), "layer 1") && strstr(ds4_last_error(), "norm"), "%s", ds4_last_error());
    EXPECT(ds4_steering_file_read(model_a, "build/tests/no-such-steering.f32", &d) == DS4_ERR_IO);
    EXPECT_MSG(strstr(ds4_last_error(), "no-such-steering"), "%s", ds4_last_error());
    ds4_session *s = session(model_a);
    REQUIRE(s);
    EXPECT(ds4_session_set_steering(s, dirs, NAN, 1) == DS4_ERR_INVALID);
    free(bad);
    ds4_session_free(s);
}

/* The mean FFN output captured under FFN steering with S = 1 has no
 * component along that layer's direction (the edit removed it). */
static void test_capture(void)
{
    REQUIRE(model_a);
    int L = ds4_model_n_layer(model_a), E = ds4_model_n_embd(model_a);
    ds4_session *s = session(model_a);
    REQUIRE(s);
    REQUIRE(ds4_session_capture_ffn(s, 1) == DS4_OK);
    REQUIRE(ds4_session_prefill(s, toks, 20, NULL) == DS4_OK);
    double *m0 = malloc((size_t)L * E * sizeof(double)), *m1 = malloc((size_t)L * E * sizeof(double));
    EXPECT(ds4_session_capture_take(s, m0) == 20);
    ds4_session_reset(s);
    REQUIRE(ds4_session_set_steering(s, dirs, 0.0f, 1.0f) == DS4_OK);
    REQUIRE(ds4_session_prefill(s, toks, 20, NULL) == DS4_OK);
    EXPECT(ds4_session_capture_take(s, m1) == 20);
    double p0 = 0, p1 = 0;
    for (int i = 0; i < E; i++) {
        p0 += m0[(size_t)LF * E + i] * dirs[(size_t)LF * E + i];
        p1 += m1[(size_t)LF * E + i] * dirs[(size_t)LF * E + i];
    }
    printf("  mean FFN output . v at layer %d: %.4g plain, %.3g steered (S = 1)\n", LF, p0, p1);
    EXPECT(fabs(p0) > 1e-3);
    EXPECT(fabs(p1) < 1e-5);
    free(m0), free(m1);
    ds4_session_free(s);
}

static void count_sleep(double s, void *ctx)
{
    (void)s;
    ++*(int *)ctx;
}

static void test_power(void)
{
    REQUIRE(model_a);
    int V = ds4_model_n_vocab(model_a), L = ds4_model_n_layer(model_a);
    ds4_session *s0 = session(model_a), *s1 = session(model_a);
    REQUIRE(s0 && s1);
    EXPECT(ds4_session_set_power(s1, 0) == DS4_ERR_INVALID);
    EXPECT(ds4_session_set_power(s1, 101) == DS4_ERR_INVALID);
    REQUIRE(ds4_session_set_power(s1, 40) == DS4_OK);
    int calls = 0;
    ds4_session_set_power_sleep(s1, count_sleep, &calls);
    float *a = run(s0, V), *b = run(s1, V);
    REQUIRE(a && b);
    EXPECT_MSG(memcmp(a, b, (size_t)N_TOK * V * sizeof(float)) == 0, "--power changed the logits");
    ds4_power_stats ps;
    ds4_session_power_stats(s1, &ps);
    /* prefill of 24 in chunks 16 + 8: a rest after each layer of each
     * chunk; 16 decode steps: one rest each */
    int want = 2 * L + (N_TOK - 24);
    printf("  power 40: %llu rests, %.3g s asked for %.3g s of compute (ratio %.3f, 1.5 expected)\n",
           (unsigned long long)ps.sleeps, ps.slept_s, ps.busy_s, ps.busy_s > 0 ? ps.slept_s / ps.busy_s : 0);
    EXPECT_MSG((int)ps.sleeps == want && calls == want, "%llu rests, %d sleeps, %d expected",
               (unsigned long long)ps.sleeps, calls, want);
    EXPECT(ps.busy_s > 0 && fabs(ps.slept_s / ps.busy_s - 1.5) < 1e-6);
    /* 100: off */
    REQUIRE(ds4_session_set_power(s1, 100) == DS4_OK);
    REQUIRE(ds4_session_decode(s1, 5) == DS4_OK);
    ds4_session_power_stats(s1, &ps);
    EXPECT((int)ps.sleeps == want);
    free(a), free(b);
    ds4_session_free(s0), ds4_session_free(s1);
}

int main(void)
{
    const synth_shape *h = &SYNTH_OFFICIAL;
    int E = h->n_embd;
    dirs = calloc((size_t)h->n_layer * E, sizeof(float));
    uint64_t r = 99;
    for (int l = 0; l < h->n_layer; l++) {
        if (l != LA && l != LF) continue;
        double nn = 0;
        for (int i = 0; i < E; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            dirs[(size_t)l * E + i] = (float)((double)(r >> 11) * 0x1p-53 - 0.5);
            nn += (double)dirs[(size_t)l * E + i] * dirs[(size_t)l * E + i];
        }
        for (int i = 0; i < E; i++) dirs[(size_t)l * E + i] = (float)(dirs[(size_t)l * E + i] / sqrt(nn));
    }
    for (int t = 0; t < N_TOK; t++) toks[t] = (t * 37 + 11) % h->n_vocab;
    if (synth_write_gguf(h, 5, GGUF_A)) model_a = ds4_model_open(GGUF_A, NULL);
    synth_edit_hook = edit_b;
    if (synth_write_gguf(h, 5, GGUF_B)) model_b = ds4_model_open(GGUF_B, NULL);
    synth_edit_hook = NULL;
    if (!model_a || !model_b) fprintf(stderr, "models: %s\n", ds4_last_error());
    RUN(test_formula_against_edited_weights);
    RUN(test_scale_zero_is_identity);
    RUN(test_file_errors);
    RUN(test_capture);
    RUN(test_power);
    ds4_model_close(model_a);
    ds4_model_close(model_b);
    if (!getenv("KEEP")) unlink(GGUF_A), unlink(GGUF_B), unlink(STEER_F);
    free(dirs);
    return test_finish();
}

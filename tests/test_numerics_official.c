/*
 * test_numerics_official.c - the "official" numerics (dsv4-model.md §4.1):
 * each rounding step as the CPU ops apply it, checked against independent
 * implementations written here (E4M3 and E2M1 grids enumerated, an O(n^2)
 * Walsh-Hadamard in double, a table of every f16 value), and the whole model:
 * official logits differ from hf ones only through those steps (each step
 * alone moves the logits, all together move them about as much as the
 * steps alone do, and switching them off gives hf exactly), the official
 * path is chunk-invariant, and snapshots round-trip.
 *
 * The model is a random one of a shape the simulations accept
 * (tests/model_synth.h); the golden tiny models do not (§7.1), and loading
 * them with official numerics must say so.
 */
#include "backend/ops.h"
#include "include/ds4.h"
#include "model/dsv4_model.h"
#include "model/dsv4_state.h"
#include "tests/model_fixture.h"
#include "tests/model_synth.h"
#include "tests/test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define SYNTH_PATH "build/tests/synth-official.gguf"
#define TINY_A_PATH "build/tests/tiny-a-f32-official-test.gguf"

static uint64_t rng = 88172645463325252ull;
static double urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * 0x1p-53;
}

/* ---- independent references ------------------------------------------ */

/* all non-negative finite values of a minifloat (1 sign, e exp, m mantissa
 * bits, bias b, no inf; E4M3 "fn": top code NaN) in code order */
static int grid(int e, int m, int bias, int fn, double *out)
{
    int n = 0;
    for (int code = 0; code < (1 << (e + m)); code++) {
        int ex = code >> m, man = code & ((1 << m) - 1);
        if (fn && code == (1 << (e + m)) - 1) break; /* NaN */
        double v = ex == 0 ? ldexp(man, 1 - bias - m) : ldexp((1 << m) + man, ex - bias - m);
        out[n++] = v;
    }
    return n;
}

/* nearest grid value, ties to the even code */
static double round_grid(double v, const double *g, int n)
{
    double a = fabs(v);
    int best = 0;
    for (int i = 1; i < n; i++) {
        double d = fabs(g[i] - a), db = fabs(g[best] - a);
        if (d < db || (d == db && (i & 1) == 0)) best = i;
    }
    return v < 0 ? -g[best] : g[best];
}

/* nearest f16 value (ties to the even code), from the table of all finite
 * f16 magnitudes; overflow past the largest goes to infinity as IEEE does */
static float ref_f16(float v)
{
    static double g[0x7c00];
    static int n;
    if (!n)
        for (int code = 0; code < 0x7c00; code++) {
            int ex = code >> 10, man = code & 1023;
            g[n++] = ex == 0 ? ldexp(man, -24) : ldexp(1024 + man, ex - 25);
        }
    double a = fabs((double)v);
    if (a >= 65520.0) return v < 0 ? -INFINITY : INFINITY;
    int lo = 0, hi = n - 1;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (g[mid] <= a) lo = mid;
        else hi = mid;
    }
    double dl = a - g[lo], dh = g[hi] - a;
    int best = dl < dh ? lo : dh < dl ? hi : ((lo & 1) ? hi : lo);
    return (float)(v < 0 ? -g[best] : g[best]);
}

/* smallest power of two >= q (q > 0) */
static double pow2_ceil(double q)
{
    int e;
    double m = frexp(q, &e);
    return m == 0.5 ? ldexp(1, e - 1) : ldexp(1, e);
}

static void ref_block_roundtrip(float *x, int n, int block, double qmax, double amax_floor, const double *g, int ng)
{
    for (int b = 0; b < n; b += block) {
        double amax = 0;
        for (int i = 0; i < block; i++) amax = fmax(amax, fabs((double)x[b + i]));
        if (amax < amax_floor) amax = amax_floor;
        double scale = pow2_ceil((double)((float)amax / (float)qmax));
        for (int i = 0; i < block; i++) {
            double v = (double)x[b + i] / scale;
            v = fmin(fmax(v, -qmax), qmax);
            x[b + i] = (float)(round_grid(v, g, ng) * scale);
        }
    }
}

/* ---- op level ---------------------------------------------------------- */

static ds4_backend *be;

static void test_kv_round_fp8_and_f16(void)
{
    double g8[256];
    int n8 = grid(4, 3, 7, 1, g8);
    EXPECT(n8 == 127 && g8[126] == 448.0);
    enum { ROWS = 64, D = 80, NOPE = 64 };
    float *x = malloc(ROWS * D * sizeof *x), *want = malloc(ROWS * D * sizeof *x);
    for (int r = 0; r < ROWS; r++) {
        double mag = pow(10.0, -6 + 9 * urand()); /* amax from 1e-6 (floored) to 1e3 */
        for (int i = 0; i < D; i++) x[r * D + i] = (float)((urand() * 2 - 1) * mag);
    }
    /* exact grid points and ties survive / round to even */
    x[0] = 448.0f;
    x[1] = -448.0f;
    x[2] = 17.0f; /* between 16 and 18 at scale 1: tie -> 16 (even code) */
    memcpy(want, x, ROWS * D * sizeof *x);
    for (int r = 0; r < ROWS; r++) ref_block_roundtrip(want + r * D, NOPE, 64, 448.0, 1e-4, g8, n8);
    float *dev = be->alloc(be, ROWS * D * sizeof *x);
    be->upload(be, dev, x, ROWS * D * sizeof *x);
    ds4_kv_numerics nm = {NOPE, false, false};
    be->kv_round(be, dev, ROWS, D, &nm);
    float *got = malloc(ROWS * D * sizeof *x);
    be->download(be, got, dev, ROWS * D * sizeof *x);
    int bad = 0;
    for (int i = 0; i < ROWS * D; i++) bad += got[i] != want[i];
    EXPECT_MSG(bad == 0, "%d FP8 values differ from the E4M3 grid reference", bad);
    EXPECT(got[2] == 16.0f);
    for (int r = 0; r < ROWS; r++) /* RoPE dims untouched */
        for (int i = NOPE; i < D; i++) bad += got[r * D + i] != x[r * D + i];
    EXPECT(bad == 0);
    /* f16 storage on top: every value is the nearest half */
    nm.f16_store = true;
    be->upload(be, dev, x, ROWS * D * sizeof *x);
    be->kv_round(be, dev, ROWS, D, &nm);
    be->download(be, got, dev, ROWS * D * sizeof *x);
    for (int i = 0; i < ROWS * D; i++) bad += got[i] != ref_f16(want[i]);
    EXPECT_MSG(bad == 0, "%d values are not the f16 rounding of the FP8 result", bad);
    be->free(be, dev);
    free(x);
    free(want);
    free(got);
}

static void test_indexer_qat_hadamard_fp4(void)
{
    double g4[16];
    int n4 = grid(2, 1, 1, 0, g4);
    EXPECT(n4 == 8 && g4[7] == 6.0);
    enum { ROWS = 16, N = 128 };
    float x[ROWS * N], got[ROWS * N];
    for (int i = 0; i < ROWS * N; i++) x[i] = (float)((urand() * 2 - 1) * pow(10.0, -3 + 4 * urand()));
    float *dev = be->alloc(be, sizeof x);
    be->upload(be, dev, x, sizeof x);
    be->indexer_qat(be, dev, ROWS, N);
    be->download(be, got, dev, sizeof x);
    int bad = 0;
    for (int r = 0; r < ROWS; r++) {
        double h[N];
        for (int i = 0; i < N; i++) { /* y_i = 1/sqrt(N) sum_j (-1)^popcount(i&j) x_j */
            double s = 0;
            for (int j = 0; j < N; j++) s += (__builtin_popcount((unsigned)(i & j)) & 1 ? -1.0 : 1.0) * x[r * N + j];
            h[i] = s / sqrt((double)N);
        }
        for (int b = 0; b < N; b += 32) {
            double amax = 0;
            for (int i = 0; i < 32; i++) amax = fmax(amax, fabs(h[b + i]));
            double scale = pow2_ceil(amax / 6.0);
            for (int i = 0; i < 32; i++) {
                double v = fmin(fmax(h[b + i] / scale, -6.0), 6.0), q = round_grid(v, g4, n4);
                double o = got[r * N + b + i] / scale;
                /* on the grid, and the nearest point unless v sits on a rounding boundary */
                int on_grid = fabs(o) == round_grid(o, g4, n4) * (o < 0 ? -1 : 1);
                if (!on_grid || (o != q && fabs(fabs(v - o) - fabs(v - q)) > 1e-5)) bad++;
            }
        }
    }
    EXPECT_MSG(bad == 0, "%d indexer QAT values off the Hadamard+FP4 reference", bad);
    be->free(be, dev);
}

/* A compressor row under official numerics is exactly the hf row rounded by
 * the (independently checked) KV rounding. */
static void test_compressor_rounds_emitted_rows(void)
{
    enum { R = 4, OD = 80, WIN = 2 * OD, T = 9 };
    float c[T * WIN], z[T * WIN], ape[R * WIN], normw[OD], omega[8];
    for (int i = 0; i < T * WIN; i++) c[i] = (float)(urand() * 4 - 2), z[i] = (float)(urand() * 2 - 1);
    for (int i = 0; i < R * WIN; i++) ape[i] = (float)(urand() - 0.5);
    for (int i = 0; i < OD; i++) normw[i] = (float)(0.5 + urand());
    for (int i = 0; i < 8; i++) omega[i] = powf(160000.0f, -2.0f * i / 16);
    ds4_weight wape = {"ape", DS4_TYPE_F32, 2, {WIN, R, 1, 1}, ape, sizeof ape};
    ds4_weight wn = {"norm", DS4_TYPE_F32, 1, {OD, 1, 1, 1}, normw, sizeof normw};
    ds4_weight wo = {"omega", DS4_TYPE_F32, 1, {8, 1, 1, 1}, omega, sizeof omega};
    float rows[2][3 * OD];
    for (int mode = 0; mode < 2; mode++) {
        ds4_comp_state st = {R, OD, true, 3, NULL, NULL, NULL, NULL, NULL};
        st.buf_c = be->alloc(be, R * WIN * 4);
        st.buf_z = be->alloc(be, R * WIN * 4);
        st.prev_c = be->alloc(be, R * OD * 4);
        st.prev_z = be->alloc(be, R * OD * 4);
        st.rows = be->alloc(be, 3 * OD * 4);
        be->fill(be, st.prev_z, -INFINITY, R * OD);
        float *dc = be->alloc(be, sizeof c), *dz = be->alloc(be, sizeof z);
        be->upload(be, dc, c, sizeof c);
        be->upload(be, dz, z, sizeof z);
        ds4_kv_numerics nm = {mode ? 64 : 0, mode == 1, false};
        be->compressor_push(be, &st, dc, dz, 5, 0, &wape, &wn, 1e-6f, &wo, 16, &nm, false);
        be->compressor_push(be, &st, dc + 5 * WIN, dz + 5 * WIN, 4, 5, &wape, &wn, 1e-6f, &wo, 16, &nm, false);
        be->download(be, rows[mode], st.rows, 2 * OD * 4);
        void *p[] = {st.buf_c, st.buf_z, st.prev_c, st.prev_z, st.rows, dc, dz};
        for (int i = 0; i < 7; i++) be->free(be, p[i]);
    }
    double g8[256];
    int n8 = grid(4, 3, 7, 1, g8);
    int bad = 0;
    for (int w = 0; w < 2; w++) {
        float want[OD];
        memcpy(want, rows[0] + w * OD, sizeof want);
        ref_block_roundtrip(want, 64, 64, 448.0, 1e-4, g8, n8);
        for (int i = 0; i < OD; i++) bad += rows[1][w * OD + i] != ref_f16(want[i]);
    }
    EXPECT_MSG(bad == 0, "%d compressed-row values are not the rounded hf rows", bad);
}

/* ---- model level ------------------------------------------------------- */

static dsv4_model *synth;

static float *run_nm(const ds4_kv_numerics *nm, const int32_t *tok, int n, int chunk, int decode_from)
{
    dsv4_state *s = NULL;
    if (dsv4_state_create(synth, be, n, chunk, nm, &s) != DS4_OK) {
        fprintf(stderr, "state: %s\n", ds4_last_error());
        return NULL;
    }
    int V = synth->cfg.n_vocab;
    float *out = malloc((size_t)n * V * sizeof *out);
    int i = 0;
    while (i < decode_from) {
        int T = decode_from - i < chunk ? decode_from - i : chunk;
        if (dsv4_forward(s, tok + i, T, true, out + (size_t)i * V) != DS4_OK) break;
        i += T;
    }
    for (; i < n; i++)
        if (dsv4_forward(s, tok + i, 1, true, out + (size_t)i * V) != DS4_OK) break;
    if (i < n) {
        free(out);
        out = NULL;
    }
    dsv4_state_free(s);
    return out;
}

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* median over positions of the per-position max |a - b| */
static double median_diff(const float *a, const float *b, int n, int V)
{
    double *d = malloc((size_t)n * sizeof *d);
    for (int t = 0; t < n; t++) {
        d[t] = 0;
        for (int v = 0; v < V; v++) d[t] = fmax(d[t], fabs((double)a[(size_t)t * V + v] - b[(size_t)t * V + v]));
    }
    qsort(d, (size_t)n, sizeof *d, cmpd);
    double m = d[n / 2];
    free(d);
    return m;
}

static void test_official_differs_from_hf_only_by_the_steps(void)
{
    REQUIRE(synth);
    enum { N = 150 };
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(urand() * synth->cfg.n_vocab);
    size_t n = (size_t)N * synth->cfg.n_vocab;
    ds4_kv_numerics hf = dsv4_numerics(&synth->cfg, false), off = dsv4_numerics(&synth->cfg, true);
    ds4_kv_numerics only[3] = {{off.fp8_nope, false, false}, {0, true, false}, {0, false, true}};
    static const char *names[3] = {"FP8 KV", "f16 KV", "indexer Hadamard+FP4"};
    float *ref = run_nm(&hf, tok, N, 64, N), *all = run_nm(&off, tok, N, 64, N);
    REQUIRE(ref && all);
    double scale = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
    double sum = 0;
    for (int k = 0; k < 3; k++) {
        float *o = run_nm(&only[k], tok, N, 64, N);
        REQUIRE(o);
        double d = test_max_abs_diff(ref, o, n);
        printf("    %s alone: max|dlogit| = %.3g, median over positions %.3g (logit scale %.3g)\n", names[k], d,
               median_diff(ref, o, N, synth->cfg.n_vocab), scale);
        EXPECT_MSG(d > 0, "%s changes nothing", names[k]);
        sum += d;
        free(o);
    }
    double d = test_max_abs_diff(ref, all, n);
    printf("    official (all steps): max|dlogit| = %.3g, median %.3g, sum of the steps alone %.3g\n", d,
           median_diff(ref, all, N, synth->cfg.n_vocab), sum);
    EXPECT(d > 0);
    EXPECT_MSG(d <= 1.5 * sum, "official moves logits by %.3g, more than its steps explain (%.3g)", d, sum);
    /* single positions can jump (a rounded KV row flips an expert or an
     * indexer pick); the typical position moves by a few percent */
    double med = median_diff(ref, all, N, synth->cfg.n_vocab);
    EXPECT_MSG(med <= 0.05 * scale, "official moves the median position by %.3g of a %.3g scale", med, scale);
    /* the same code with every switch off is hf, bit for bit */
    ds4_kv_numerics none = {0, false, false};
    float *z = run_nm(&none, tok, N, 64, N);
    REQUIRE(z);
    EXPECT(test_max_abs_diff(ref, z, n) == 0);
    /* official is chunk- and decode-invariant like hf */
    float *c1 = run_nm(&off, tok, N, 1, N), *dec = run_nm(&off, tok, N, 13, 40);
    REQUIRE(c1 && dec);
    double dc = test_max_abs_diff(all, c1, n), dd = test_max_abs_diff(all, dec, n);
    printf("    official chunk 1 vs 64: %.3g; decode from 40: %.3g\n", dc, dd);
    EXPECT(dc <= 1e-4 && dd <= 1e-4);
    free(ref);
    free(all);
    free(z);
    free(c1);
    free(dec);
}

static void test_official_snapshot_roundtrip(void)
{
    REQUIRE(synth);
    ds4_model *m = ds4_model_open(SYNTH_PATH, NULL);
    REQUIRE(m);
    ds4_session_params p;
    ds4_session_params_default(&p);
    p.n_ctx = 200;
    p.n_threads = 2;
    /* the default (auto) is official on a model whose shapes allow it */
    EXPECT(p.numerics == DS4_NUMERICS_AUTO);
    ds4_session *a = ds4_session_create(m, &p), *b = ds4_session_create(m, &p);
    REQUIRE(a && b);
    int32_t tok[120];
    for (int i = 0; i < 120; i++) tok[i] = (int32_t)(urand() * 256);
    REQUIRE(ds4_session_prefill(a, tok, 70, NULL) == DS4_OK);
    void *snap;
    size_t len;
    REQUIRE(ds4_session_snapshot(a, &snap, &len) == DS4_OK);
    REQUIRE(ds4_session_restore(b, snap, len) == DS4_OK);
    int same = memcmp(ds4_session_logits(a), ds4_session_logits(b), 256 * sizeof(float)) == 0;
    for (int i = 70; i < 120; i++) {
        REQUIRE(ds4_session_decode(a, tok[i]) == DS4_OK && ds4_session_decode(b, tok[i]) == DS4_OK);
        same &= memcmp(ds4_session_logits(a), ds4_session_logits(b), 256 * sizeof(float)) == 0;
    }
    EXPECT(same);
    /* an hf session refuses an official snapshot */
    p.numerics = DS4_NUMERICS_HF;
    ds4_session *c = ds4_session_create(m, &p);
    REQUIRE(c);
    EXPECT(ds4_session_restore(c, snap, len) == DS4_ERR_INVALID);
    EXPECT(strstr(ds4_last_error(), "numerics") != NULL);
    free(snap);
    ds4_session_free(a);
    ds4_session_free(b);
    ds4_session_free(c);
    ds4_model_close(m);
}

static void test_official_needs_flash_block_shapes(void)
{
    REQUIRE(fixture_write_gguf("tests/data/dsv4-tiny-a", TINY_A_PATH, 0));
    ds4_model *m = ds4_model_open(TINY_A_PATH, NULL);
    REQUIRE(m);
    ds4_session_params p;
    ds4_session_params_default(&p);
    p.n_ctx = 16;
    p.numerics = DS4_NUMERICS_OFFICIAL;
    ds4_session *s = ds4_session_create(m, &p);
    EXPECT(s == NULL);
    EXPECT_MSG(strstr(ds4_last_error(), "48 non-RoPE dims") != NULL, "message: %s", ds4_last_error());
    ds4_session_free(s);
    /* auto falls back to the clean math: the same logits as an hf session */
    p.numerics = DS4_NUMERICS_AUTO;
    ds4_session *a = ds4_session_create(m, &p);
    p.numerics = DS4_NUMERICS_HF;
    ds4_session *h = ds4_session_create(m, &p);
    REQUIRE(a && h);
    int32_t tok[12] = {0, 5, 9, 700, 3, 3, 81, 1000, 42, 7, 6, 5};
    REQUIRE(ds4_session_prefill(a, tok, 12, NULL) == DS4_OK);
    REQUIRE(ds4_session_prefill(h, tok, 12, NULL) == DS4_OK);
    EXPECT(memcmp(ds4_session_logits(a), ds4_session_logits(h), (size_t)ds4_model_n_vocab(m) * sizeof(float)) == 0);
    ds4_session_free(a);
    ds4_session_free(h);
    ds4_model_close(m);
}

int main(void)
{
    mkdir("build", 0755);
    mkdir("build/tests", 0755);
    be = ds4_backend_cpu_create(2);
    if (synth_write_gguf(&SYNTH_OFFICIAL, 1234, SYNTH_PATH)) synth = dsv4_model_load(SYNTH_PATH);
    if (!synth) fprintf(stderr, "synthetic model: %s\n", ds4_last_error());
    RUN(test_kv_round_fp8_and_f16);
    RUN(test_indexer_qat_hadamard_fp4);
    RUN(test_compressor_rounds_emitted_rows);
    RUN(test_official_differs_from_hf_only_by_the_steps);
    RUN(test_official_snapshot_roundtrip);
    RUN(test_official_needs_flash_block_shapes);
    dsv4_model_free(synth);
    be->destroy(be);
    return test_finish();
}

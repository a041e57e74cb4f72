/*
 * ops_contract.h - the op tests every backend of backend/ops.h must pass
 * (the CPU one in tests/test_ops.c; a GPU backend includes this header and
 * calls ops_contract_main with its own backend).
 *
 * Each op runs on random inputs through the backend's own memory
 * (alloc/upload/download) and is compared with a double-precision
 * computation written here from dsv4-model.md, not with the CPU backend.
 * Tolerances are relative to the magnitude of the terms summed.
 */
#ifndef DS4_TESTS_OPS_CONTRACT_H
#define DS4_TESTS_OPS_CONTRACT_H

#include "backend/ops.h"
#include "quant/half.h"
#include "quant/quant.h"
#include "tests/test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static ds4_backend *oc_be;
static uint64_t oc_rng = 0x9e3779b97f4a7c15ull;

static double oc_u(void) /* uniform [-1, 1) */
{
    oc_rng = oc_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(oc_rng >> 11) * 0x1p-52 - 1.0;
}

static float *oc_rand(size_t n, double scale)
{
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = (float)(oc_u() * scale);
    return v;
}

/* device copy of host floats / ints; download into a fresh host array */
static void *oc_dev(const void *host, size_t bytes)
{
    void *d = oc_be->alloc(oc_be, bytes);
    if (host) oc_be->upload(oc_be, d, host, bytes);
    return d;
}

static float *oc_get(const void *dev, size_t n)
{
    float *h = malloc(n * sizeof *h);
    oc_be->download(oc_be, h, dev, n * sizeof *h);
    return h;
}

static ds4_weight oc_w(const char *name, ds4_type t, int nd, int64_t ne0, int64_t ne1, int64_t ne2, const void *data)
{
    ds4_weight w = {name, t, nd, {ne0, ne1, ne2, 1}, data, 0};
    w.nbytes = (uint64_t)(ds4_row_bytes(t, ne0) * ne1 * ne2);
    return w;
}

/* |got - want| <= tol, counting failures with the first reported */
static int oc_close(const char *what, size_t i, double got, double want, double tol)
{
    if (fabs(got - want) <= tol) return 0;
    static int reported;
    if (reported++ < 5) fprintf(stderr, "    %s[%zu]: got %.9g want %.9g (tol %.3g)\n", what, i, got, want, tol);
    return 1;
}

/* ---- matmul ---------------------------------------------------------- */

static void oc_matmul_type(ds4_type type, int64_t rows, int64_t cols, int T)
{
    float *wf = oc_rand((size_t)(rows * cols), 1.0), *x = oc_rand((size_t)(T * cols), 2.0);
    int64_t rb = ds4_row_bytes(type, cols);
    void *wq = malloc((size_t)(rb * rows));
    if (type == DS4_TYPE_F32) memcpy(wq, wf, (size_t)(rows * cols) * 4);
    else REQUIRE(ds4_quantize_rows(type, wf, wq, rows, cols, NULL) == DS4_OK);
    ds4_weight w = oc_w("w", type, 2, cols, rows, 1, wq);
    REQUIRE(oc_be->weight_prepare(oc_be, &w) == DS4_OK);
    float *dx = oc_dev(x, (size_t)(T * cols) * 4), *dy = oc_dev(NULL, (size_t)(T * rows) * 4);
    oc_be->matmul(oc_be, &w, dx, T, dy);
    float *y = oc_get(dy, (size_t)(T * rows)), *row = malloc((size_t)cols * 4);
    int bad = 0;
    int exact = type == DS4_TYPE_F32 || type == DS4_TYPE_F16 || type == DS4_TYPE_BF16;
    for (int64_t r = 0; r < rows; r++) {
        ds4_dequantize_row(type, (char *)wq + r * rb, row, cols);
        for (int t = 0; t < T; t++) {
            double s = 0, mag = 0, xmax = 0;
            for (int64_t c = 0; c < cols; c++) {
                s += (double)row[c] * x[t * cols + c];
                mag += fabs((double)row[c]);
                xmax = fmax(xmax, fabs((double)x[t * cols + c]));
            }
            /* float types: f32 rounding; quantized types may quantize x to 8 bits */
            double tol = exact ? 1e-5 * mag * xmax : mag * xmax / 100;
            bad += oc_close(ds4_type_name(type), (size_t)(t * rows + r), y[t * rows + r], s, tol);
        }
    }
    EXPECT_MSG(bad == 0, "matmul %s: %d values off", ds4_type_name(type), bad);
    oc_be->free(oc_be, dx);
    oc_be->free(oc_be, dy);
    free(wf), free(x), free(wq), free(y), free(row);
}

static void oc_test_matmul(void)
{
    static const ds4_type types[] = {DS4_TYPE_F32, DS4_TYPE_F16, DS4_TYPE_BF16, DS4_TYPE_Q8_0, DS4_TYPE_Q4_K, DS4_TYPE_Q2_K};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        oc_matmul_type(types[i], 33, 256, 1);
        oc_matmul_type(types[i], 17, 512, 6);
    }
    /* float weights with few rows over a prefill chunk's tokens (the mHC
     * mixing and routers; CUDA: cuda_fmv_tall.cu), a partial tile of each */
    for (int i = 0; i < 3; i++) {
        oc_matmul_type(types[i], 24, 4096, 70);
        oc_matmul_type(types[i], 40, 1000, 130);
        /* more than 1024 rows (the indexer's query product; CUDA: F16 /
         * BF16 in the tall kernel's tensor-core tiles, F32 in the GEMM) */
        oc_matmul_type(types[i], 1100, 256, 70);
    }
}

static void oc_test_matmul_grouped(void)
{
    enum { G = 3, ROWS = 8, COLS = 64, T = 4 };
    float *w = oc_rand(G * ROWS * COLS, 1), *x = oc_rand(T * G * COLS, 1);
    ds4_weight wt = oc_w("o_a", DS4_TYPE_F32, 2, COLS, G * ROWS, 1, w);
    float *dx = oc_dev(x, sizeof(float) * T * G * COLS), *dy = oc_dev(NULL, sizeof(float) * T * G * ROWS);
    oc_be->matmul_grouped(oc_be, &wt, G, dx, T, dy);
    float *y = oc_get(dy, T * G * ROWS);
    int bad = 0;
    for (int t = 0; t < T; t++)
        for (int g = 0; g < G; g++)
            for (int r = 0; r < ROWS; r++) {
                double s = 0;
                for (int c = 0; c < COLS; c++) s += (double)w[(g * ROWS + r) * COLS + c] * x[(t * G + g) * COLS + c];
                bad += oc_close("grouped", (size_t)((t * G + g) * ROWS + r), y[(t * G + g) * ROWS + r], s, 1e-4);
            }
    EXPECT(bad == 0);
    oc_be->free(oc_be, dx), oc_be->free(oc_be, dy);
    free(w), free(x), free(y);
}

/* ---- norms, rope, embedding ------------------------------------------ */

static void oc_test_rmsnorm(void)
{
    enum { R = 5, N = 96 };
    float *x = oc_rand(R * N, 3), *w = oc_rand(N, 1);
    ds4_weight wt = oc_w("norm", DS4_TYPE_F32, 1, N, 1, 1, w);
    for (int weighted = 0; weighted < 2; weighted++) {
        float *dx = oc_dev(x, sizeof(float) * R * N);
        oc_be->rmsnorm(oc_be, dx, weighted ? &wt : NULL, R, N, 1e-6f, dx); /* in place */
        float *y = oc_get(dx, R * N);
        int bad = 0;
        for (int r = 0; r < R; r++) {
            double ss = 0;
            for (int i = 0; i < N; i++) ss += (double)x[r * N + i] * x[r * N + i];
            double s = 1 / sqrt(ss / N + 1e-6);
            for (int i = 0; i < N; i++)
                bad += oc_close("rmsnorm", (size_t)(r * N + i), y[r * N + i], x[r * N + i] * s * (weighted ? w[i] : 1), 1e-5);
        }
        EXPECT(bad == 0);
        oc_be->free(oc_be, dx);
        free(y);
    }
    free(x), free(w);
}

static void oc_test_rope(void)
{
    enum { T = 3, H = 2, D = 24, R = 8 };
    float *x = oc_rand(T * H * D, 1), om[R / 2];
    for (int i = 0; i < R / 2; i++) om[i] = powf(10000.0f, -2.0f * i / R);
    ds4_weight w = oc_w("omega", DS4_TYPE_F32, 1, R / 2, 1, 1, om);
    float *dx = oc_dev(x, sizeof(float) * T * H * D);
    int64_t pos0 = 1000;
    oc_be->rope(oc_be, dx, T, H, D, R, &w, pos0, false);
    float *y = oc_get(dx, T * H * D);
    int bad = 0;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < D; i++) {
                const float *v = x + (t * H + h) * D;
                double want = v[i];
                if (i >= D - R) { /* interleaved pair k on the trailing R dims */
                    int k = (i - (D - R)) / 2, odd = (i - (D - R)) & 1;
                    double th = (double)(float)((float)(pos0 + t) * om[k]);
                    double x0 = v[D - R + 2 * k], x1 = v[D - R + 2 * k + 1];
                    want = odd ? x0 * sin(th) + x1 * cos(th) : x0 * cos(th) - x1 * sin(th);
                }
                bad += oc_close("rope", (size_t)((t * H + h) * D + i), y[(t * H + h) * D + i], want, 1e-5);
            }
    EXPECT(bad == 0);
    oc_be->rope(oc_be, dx, T, H, D, R, &w, pos0, true); /* the inverse undoes it */
    float *z = oc_get(dx, T * H * D);
    for (int i = 0; i < T * H * D; i++) bad += oc_close("rope^-1", (size_t)i, z[i], x[i], 1e-5);
    EXPECT(bad == 0);
    oc_be->free(oc_be, dx);
    free(x), free(y), free(z);
}

static void oc_test_embed(void)
{
    enum { V = 10, E = 16, T = 3, HC = 4 };
    uint16_t tab[V * E];
    for (int i = 0; i < V * E; i++) tab[i] = ds4_f32_to_f16((float)oc_u());
    ds4_weight w = oc_w("tok", DS4_TYPE_F16, 2, E, V, 1, tab);
    int32_t tok[T] = {7, 0, 9};
    int32_t *dt = oc_dev(tok, sizeof tok);
    float *dX = oc_dev(NULL, sizeof(float) * T * HC * E);
    oc_be->embed(oc_be, &w, dt, T, HC, dX);
    float *X = oc_get(dX, T * HC * E);
    int bad = 0;
    for (int t = 0; t < T; t++)
        for (int s = 0; s < HC; s++)
            for (int i = 0; i < E; i++) bad += X[(t * HC + s) * E + i] != ds4_f16_to_f32(tab[tok[t] * E + i]);
    EXPECT(bad == 0);
    oc_be->free(oc_be, dt), oc_be->free(oc_be, dX);
    free(X);
}

/* ---- hyper-connections (§3.3, §3.8) ----------------------------------- */

static void oc_ref_hc(const float *X, int HC, int D, const float *fn, int nmix, const float *sc, const float *bs,
                      int iters, double *pre, double *post, double *A, double *y)
{
    int n = HC * D;
    double ss = 0, m[64];
    for (int i = 0; i < n; i++) ss += (double)X[i] * X[i];
    double r = 1 / sqrt(ss / n + 1e-6);
    for (int k = 0; k < nmix; k++) {
        double s = 0;
        for (int i = 0; i < n; i++) s += (double)fn[k * n + i] * X[i];
        m[k] = s * r;
    }
    for (int i = 0; i < HC; i++) pre[i] = 1 / (1 + exp(-(m[i] * sc[0] + bs[i]))) + 1e-6;
    if (post) {
        for (int i = 0; i < HC; i++) post[i] = 2 / (1 + exp(-(m[HC + i] * sc[1] + bs[HC + i])));
        for (int i = 0; i < HC; i++) {
            double mx = -1e300, s = 0;
            for (int j = 0; j < HC; j++) mx = fmax(mx, A[i * HC + j] = m[2 * HC + i * HC + j] * sc[2] + bs[2 * HC + i * HC + j]);
            for (int j = 0; j < HC; j++) s += A[i * HC + j] = exp(A[i * HC + j] - mx);
            for (int j = 0; j < HC; j++) A[i * HC + j] = A[i * HC + j] / s + 1e-6;
        }
        for (int it = 0; it < iters; it++) {
            for (int i = 0; it > 0 && i < HC; i++) {
                double s = 0;
                for (int j = 0; j < HC; j++) s += A[i * HC + j];
                for (int j = 0; j < HC; j++) A[i * HC + j] /= s + 1e-6;
            }
            for (int j = 0; j < HC; j++) {
                double s = 0;
                for (int i = 0; i < HC; i++) s += A[i * HC + j];
                for (int i = 0; i < HC; i++) A[i * HC + j] /= s + 1e-6;
            }
        }
    }
    for (int d = 0; d < D; d++) {
        y[d] = 0;
        for (int i = 0; i < HC; i++) y[d] += pre[i] * X[i * D + d];
    }
}

static void oc_test_hc(void)
{
    enum { T = 3, HC = 4, D = 32, NMIX = (2 + HC) * HC };
    float *X = oc_rand(T * HC * D, 1), *fn = oc_rand(NMIX * HC * D, 0.2), *F = oc_rand(T * D, 1);
    float sc[3] = {0.7f, 1.2f, 0.9f}, *bs = oc_rand(NMIX, 0.5), hsc[1] = {1.1f};
    ds4_weight wfn = oc_w("fn", DS4_TYPE_F32, 2, HC * D, NMIX, 1, fn), wsc = oc_w("sc", DS4_TYPE_F32, 1, 3, 1, 1, sc);
    ds4_weight wbs = oc_w("bs", DS4_TYPE_F32, 1, NMIX, 1, 1, bs);
    ds4_weight whfn = oc_w("hfn", DS4_TYPE_F32, 2, HC * D, HC, 1, fn), whsc = oc_w("hsc", DS4_TYPE_F32, 1, 1, 1, 1, hsc);
    ds4_weight whbs = oc_w("hbs", DS4_TYPE_F32, 1, HC, 1, 1, bs);
    float *dX = oc_dev(X, sizeof(float) * T * HC * D), *dy = oc_dev(NULL, sizeof(float) * T * D);
    float *dpost = oc_dev(NULL, sizeof(float) * T * HC), *dcomb = oc_dev(NULL, sizeof(float) * T * HC * HC);
    float *dF = oc_dev(F, sizeof(float) * T * D), *dh = oc_dev(NULL, sizeof(float) * T * D);
    oc_be->hc_pre(oc_be, dX, T, HC, D, &wfn, &wsc, &wbs, 20, 1e-6f, 1e-6f, dy, dpost, dcomb);
    oc_be->hc_head(oc_be, dX, T, HC, D, &whfn, &whsc, &whbs, 1e-6f, 1e-6f, dh);
    oc_be->hc_post(oc_be, dX, T, HC, D, dF, dpost, dcomb);
    float *y = oc_get(dy, T * D), *post = oc_get(dpost, T * HC), *comb = oc_get(dcomb, T * HC * HC);
    float *X2 = oc_get(dX, T * HC * D), *h = oc_get(dh, T * D);
    int bad = 0;
    for (int t = 0; t < T; t++) {
        double pre[HC], po[HC], A[HC * HC], yr[D], hpre[HC], hy[D];
        oc_ref_hc(X + t * HC * D, HC, D, fn, NMIX, sc, bs, 20, pre, po, A, yr);
        oc_ref_hc(X + t * HC * D, HC, D, fn, HC, hsc, bs, 0, hpre, NULL, NULL, hy);
        for (int d = 0; d < D; d++) bad += oc_close("hc_pre y", (size_t)d, y[t * D + d], yr[d], 1e-5);
        for (int d = 0; d < D; d++) bad += oc_close("hc_head y", (size_t)d, h[t * D + d], hy[d], 1e-5);
        for (int i = 0; i < HC; i++) bad += oc_close("post", (size_t)i, post[t * HC + i], po[i], 1e-5);
        for (int k = 0; k < HC * HC; k++) bad += oc_close("comb", (size_t)k, comb[t * HC * HC + k], A[k], 1e-5);
        for (int j = 0; j < HC; j++) { /* doubly stochastic to ~1e-5 after 20 iterations */
            double rs = 0, cs = 0;
            for (int i = 0; i < HC; i++) rs += comb[t * HC * HC + j * HC + i], cs += comb[t * HC * HC + i * HC + j];
            bad += oc_close("row sum", (size_t)j, rs, 1, 1e-3) + oc_close("col sum", (size_t)j, cs, 1, 1e-5);
        }
        for (int j = 0; j < HC; j++) /* X'[j] = post[j] F + sum_i A[i][j] X[i] */
            for (int d = 0; d < D; d++) {
                double want = po[j] * F[t * D + d];
                for (int i = 0; i < HC; i++) want += A[i * HC + j] * X[(t * HC + i) * D + d];
                bad += oc_close("hc_post", (size_t)d, X2[(t * HC + j) * D + d], want, 1e-5);
            }
    }
    EXPECT_MSG(bad == 0, "%d hc values off", bad);
    void *d[] = {dX, dy, dpost, dcomb, dF, dh};
    for (int i = 0; i < 6; i++) oc_be->free(oc_be, d[i]);
    free(X), free(fn), free(F), free(bs), free(y), free(post), free(comb), free(X2), free(h);
}

/* ---- compressor (§3.5) ------------------------------------------------ */

/* window w of a compressor computed directly from all tokens' inputs */
static void oc_ref_pool(int r, int od, int overlap, const float *c, const float *z, const float *ape, const float *nw,
                        const float *om, int R, int w, double *row)
{
    int win = overlap ? 2 * od : od;
    for (int d = 0; d < od; d++) {
        double zs[16], cs[16];
        int n = 0;
        for (int s = 0; s < r; s++) {
            if (overlap && w > 0) {
                int p = (w - 1) * r + s;
                zs[n] = z[p * win + d] + ape[s * win + d], cs[n++] = c[p * win + d];
            }
        }
        for (int s = 0; s < r; s++) {
            int p = w * r + s, off = overlap ? od : 0;
            zs[n] = z[p * win + off + d] + ape[s * win + off + d], cs[n++] = c[p * win + off + d];
        }
        double mx = -1e300, den = 0, num = 0;
        for (int i = 0; i < n; i++) mx = fmax(mx, zs[i]);
        for (int i = 0; i < n; i++) den += exp(zs[i] - mx), num += exp(zs[i] - mx) * cs[i];
        row[d] = num / den;
    }
    double ss = 0;
    for (int d = 0; d < od; d++) ss += row[d] * row[d];
    double s = 1 / sqrt(ss / od + 1e-6);
    for (int d = 0; d < od; d++) row[d] *= s * nw[d];
    for (int k = 0; k < R / 2; k++) {
        double th = (double)(float)((float)(w * r) * om[k]);
        double *e = row + od - R + 2 * k, x0 = e[0], x1 = e[1];
        e[0] = x0 * cos(th) - x1 * sin(th);
        e[1] = x0 * sin(th) + x1 * cos(th);
    }
}

static void oc_compressor_case(int r, int overlap)
{
    enum { OD = 16, R = 4, N = 37 };
    int win = overlap ? 2 * OD : OD;
    float *c = oc_rand((size_t)(N * win), 2), *z = oc_rand((size_t)(N * win), 1), *ape = oc_rand((size_t)(r * win), 0.5);
    float *nw = oc_rand(OD, 1), om[R / 2] = {1.0f, 0.01f};
    ds4_weight wa = oc_w("ape", DS4_TYPE_F32, 2, win, r, 1, ape), wn = oc_w("n", DS4_TYPE_F32, 1, OD, 1, 1, nw);
    ds4_weight wo = oc_w("om", DS4_TYPE_F32, 1, R / 2, 1, 1, om);
    ds4_comp_state st = {r, OD, overlap != 0, N / r + 1, NULL, NULL, NULL, NULL, NULL};
    st.buf_c = oc_dev(NULL, sizeof(float) * r * win);
    st.buf_z = oc_dev(NULL, sizeof(float) * r * win);
    if (overlap) {
        st.prev_c = oc_dev(NULL, sizeof(float) * r * OD);
        st.prev_z = oc_dev(NULL, sizeof(float) * r * OD);
        oc_be->fill(oc_be, st.prev_z, -INFINITY, (size_t)(r * OD));
    }
    st.rows = oc_dev(NULL, sizeof(float) * (size_t)st.cap_rows * OD);
    float *dc = oc_dev(c, sizeof(float) * N * win), *dz = oc_dev(z, sizeof(float) * N * win);
    ds4_kv_numerics hf = {0, false, false};
    static const int cuts[] = {0, 3, 4, 5, 11, 12, 30, 37}; /* chunks across window boundaries */
    for (int i = 0; i + 1 < 8; i++)
        oc_be->compressor_push(oc_be, &st, dc + cuts[i] * win, dz + cuts[i] * win, cuts[i + 1] - cuts[i], cuts[i], &wa, &wn,
                               1e-6f, &wo, R, &hf, false);
    float *rows = oc_get(st.rows, (size_t)(N / r) * OD);
    int bad = 0;
    for (int w = 0; w < N / r; w++) {
        double want[OD];
        oc_ref_pool(r, OD, overlap, c, z, ape, nw, om, R, w, want);
        for (int d = 0; d < OD; d++) bad += oc_close("compressed row", (size_t)(w * OD + d), rows[w * OD + d], want[d], 1e-5);
    }
    EXPECT_MSG(bad == 0, "ratio %d: %d values off", r, bad);
    void *d[] = {st.buf_c, st.buf_z, st.prev_c, st.prev_z, st.rows, dc, dz};
    for (int i = 0; i < 7; i++)
        if (d[i]) oc_be->free(oc_be, d[i]);
    free(c), free(z), free(ape), free(nw), free(rows);
}

static void oc_test_compressor(void)
{
    oc_compressor_case(4, 1); /* CSA, overlapping windows */
    oc_compressor_case(8, 0); /* HCA */
}

/* ---- indexer top-k (§3.6): ties by lower index ------------------------- */

static void oc_test_indexer_topk(void)
{
    enum { T = 3, IH = 2, ID = 8, NK = 40, TOPK = 5, RATIO = 4 };
    /* small integers: scores are exact in f32 and double, with many ties */
    float q[T * IH * ID], w[T * IH], keys[NK * ID];
    for (int i = 0; i < T * IH * ID; i++) q[i] = (float)((int)(oc_u() * 3));
    for (int i = 0; i < T * IH; i++) w[i] = (float)(1 + (int)((oc_u() + 1) * 2));
    for (int i = 0; i < NK * ID; i++) keys[i] = (float)((int)(oc_u() * 2));
    for (int s = 7; s < NK; s++) /* every score repeats: the k-th place falls inside a tie */
        memcpy(keys + s * ID, keys + (s % 7) * ID, ID * sizeof(float));
    int64_t pos0 = 120; /* query t sees floor((121+t)/4) = 30 keys */
    float *dq = oc_dev(q, sizeof q), *dw = oc_dev(w, sizeof w), *dk = oc_dev(keys, sizeof keys);
    int32_t *ds = oc_dev(NULL, sizeof(int32_t) * T * TOPK);
    oc_be->indexer_topk(oc_be, dq, dw, T, IH, ID, dk, pos0, RATIO, TOPK, ds);
    int32_t sel[T * TOPK];
    oc_be->download(oc_be, sel, ds, sizeof sel);
    int bad = 0;
    for (int t = 0; t < T; t++) {
        int n = (int)((pos0 + t + 1) / RATIO);
        double sc[NK];
        int taken[NK] = {0}, want[TOPK];
        for (int s = 0; s < n; s++) {
            sc[s] = 0;
            for (int h = 0; h < IH; h++) {
                double dot = 0;
                for (int d = 0; d < ID; d++) dot += (double)q[(t * IH + h) * ID + d] * keys[s * ID + d];
                sc[s] += w[t * IH + h] * fmax(dot, 0);
            }
        }
        for (int k = 0; k < TOPK; k++) { /* score descending, index ascending */
            int b = -1;
            for (int s = 0; s < n; s++)
                if (!taken[s] && (b < 0 || sc[s] > sc[b])) b = s;
            taken[b] = 1;
            want[k] = b;
        }
        for (int k = 0; k < TOPK; k++) { /* output is the set in ascending order */
            int found = 0;
            for (int j = 0; j < TOPK; j++) found |= sel[t * TOPK + j] == want[k];
            bad += !found;
            if (k) bad += sel[t * TOPK + k] <= sel[t * TOPK + k - 1];
        }
    }
    EXPECT_MSG(bad == 0, "indexer top-k: %d mismatches", bad);
    /* few keys: all visible, -1 padded */
    oc_be->indexer_topk(oc_be, dq, dw, 1, IH, ID, dk, 10, RATIO, TOPK, ds);
    oc_be->download(oc_be, sel, ds, sizeof(int32_t) * TOPK);
    EXPECT(sel[0] == 0 && sel[1] == 1 && sel[2] == -1 && sel[4] == -1);
    void *d[] = {dq, dw, dk, ds};
    for (int i = 0; i < 4; i++) oc_be->free(oc_be, d[i]);
}

/* ---- attention with sinks over ring + chunk + compressed rows (§3.4) --- */

static void oc_attention_case(int use_sel)
{
    enum { T = 4, H = 3, D = 16, W = 6, NC = 12, RATIO = 4, TOPK = 3 };
    int64_t pos0 = 40;
    float *q = oc_rand(T * H * D, 1), *kv = oc_rand(T * D, 1), *ring = oc_rand(W * D, 1), *comp = oc_rand(NC * D, 1);
    float sinks[H] = {0.5f, -1.0f, 2.0f};
    int32_t sel[T * TOPK] = {0, 3, 9, 1, -1, -1, 2, 4, 10, 5, 6, 7};
    ds4_weight ws = oc_w("sinks", DS4_TYPE_F32, 1, H, 1, 1, sinks);
    float *dq = oc_dev(q, sizeof(float) * T * H * D), *dkv = oc_dev(kv, sizeof(float) * T * D);
    float *dr = oc_dev(ring, sizeof(float) * W * D), *dc = oc_dev(comp, sizeof(float) * NC * D);
    int32_t *dsel = oc_dev(sel, sizeof sel);
    float *dout = oc_dev(NULL, sizeof(float) * T * H * D);
    oc_be->attention(oc_be, dq, T, H, D, dkv, dr, W, pos0, dc, RATIO, use_sel ? dsel : NULL, TOPK, &ws, dout);
    float *out = oc_get(dout, T * H * D);
    int bad = 0;
    for (int t = 0; t < T; t++) {
        int64_t p = pos0 + t;
        const float *rows[64];
        int n = 0;
        for (int64_t pp = p - W + 1; pp <= p; pp++) rows[n++] = pp >= pos0 ? kv + (pp - pos0) * D : ring + (pp % W) * D;
        if (use_sel) {
            for (int k = 0; k < TOPK; k++)
                if (sel[t * TOPK + k] >= 0) rows[n++] = comp + sel[t * TOPK + k] * D;
        } else {
            for (int w = 0; w < (p + 1) / RATIO && w < NC; w++) rows[n++] = comp + w * D;
        }
        for (int h = 0; h < H; h++) {
            double s[64], mx = sinks[h], den, o[D] = {0};
            for (int i = 0; i < n; i++) {
                s[i] = 0;
                for (int d = 0; d < D; d++) s[i] += (double)q[(t * H + h) * D + d] * rows[i][d];
                s[i] /= sqrt((double)D);
                mx = fmax(mx, s[i]);
            }
            den = exp(sinks[h] - mx);
            for (int i = 0; i < n; i++) den += exp(s[i] - mx);
            for (int i = 0; i < n; i++)
                for (int d = 0; d < D; d++) o[d] += exp(s[i] - mx) / den * rows[i][d];
            for (int d = 0; d < D; d++) bad += oc_close("attention", (size_t)d, out[(t * H + h) * D + d], o[d], 1e-5);
        }
    }
    EXPECT_MSG(bad == 0, "attention (sel %d): %d values off", use_sel, bad);
    /* ring_push keeps the last W positions at slot p mod W */
    oc_be->ring_push(oc_be, dr, W, D, dkv, T, pos0);
    float *r2 = oc_get(dr, W * D);
    for (int t = 0; t < T; t++) bad += memcmp(r2 + ((pos0 + t) % W) * D, kv + t * D, D * sizeof(float)) != 0;
    for (int64_t pp = pos0 - W + T; pp < pos0; pp++) bad += memcmp(r2 + (pp % W) * D, ring + (pp % W) * D, D * sizeof(float)) != 0;
    EXPECT(bad == 0);
    void *d[] = {dq, dkv, dr, dc, dsel, dout};
    for (int i = 0; i < 6; i++) oc_be->free(oc_be, d[i]);
    free(q), free(kv), free(ring), free(comp), free(out), free(r2);
}

static void oc_test_attention(void)
{
    oc_attention_case(0); /* all compressed rows up to the causal limit (HCA) */
    oc_attention_case(1); /* indexer selection (CSA) */
}

/* ---- MoE (§3.7) --------------------------------------------------------- */

static double oc_swiglu(double g, double u, double clamp)
{
    g = fmin(g, clamp);
    u = fmin(fmax(u, -clamp), clamp);
    return g / (1 + exp(-g)) * u;
}

static void oc_test_moe(void)
{
    enum { T = 3, E = 6, K = 2, D = 32, F = 32, V = 5 };
    float logits[T * E], bias[E];
    for (int i = 0; i < T * E; i++) logits[i] = (float)(oc_u() * 3);
    for (int i = 0; i < E; i++) bias[i] = 0;
    logits[0] = logits[1] = logits[2] = 2.5f; /* a 3-way tie for 2 places: the lower ids win */
    logits[3] = logits[4] = logits[5] = -1;
    int32_t tid[V * K] = {0, 1, 2, 3, 4, 5, 5, 0, 1, 4}, tok[T] = {3, 0, 4};
    ds4_weight wb = oc_w("bias", DS4_TYPE_F32, 1, E, 1, 1, bias), wt = oc_w("tid2eid", DS4_TYPE_I32, 2, K, V, 1, tid);
    float *dl = oc_dev(logits, sizeof logits), *dw = oc_dev(NULL, sizeof(float) * T * K);
    int32_t *dtok = oc_dev(tok, sizeof tok), *dsel = oc_dev(NULL, sizeof(int32_t) * T * K);
    int32_t sel[T * K];
    float w[T * K];
    int bad = 0;
    for (int hash = 0; hash < 2; hash++) {
        oc_be->moe_route(oc_be, dl, T, E, K, hash ? NULL : &wb, hash ? &wt : NULL, dtok, 1.5f, dsel, dw);
        oc_be->download(oc_be, sel, dsel, sizeof sel);
        oc_be->download(oc_be, w, dw, sizeof w);
        for (int t = 0; t < T; t++) {
            double sc[E], sum = 0;
            for (int e = 0; e < E; e++) sc[e] = sqrt(log1p(exp((double)logits[t * E + e])));
            int want[K];
            if (hash) {
                for (int k = 0; k < K; k++) want[k] = tid[tok[t] * K + k];
            } else {
                int taken[E] = {0};
                for (int k = 0; k < K; k++) {
                    int b = -1;
                    for (int e = 0; e < E; e++)
                        if (!taken[e] && (b < 0 || sc[e] + bias[e] > sc[b] + bias[b])) b = e;
                    taken[b] = 1;
                    want[k] = b;
                }
            }
            for (int k = 0; k < K; k++) sum += sc[want[k]];
            for (int k = 0; k < K; k++) {
                bad += sel[t * K + k] != want[k];
                bad += oc_close("router weight", (size_t)k, w[t * K + k], sc[want[k]] / sum * 1.5, 1e-5);
            }
        }
    }
    EXPECT_MSG(bad == 0, "router: %d mismatches", bad);
    /* routed experts + shared expert, clamp 1.0 so it fires */
    float *gate = oc_rand(E * F * D, 0.5), *up = oc_rand(E * F * D, 0.5), *down = oc_rand(E * D * F, 0.5);
    float *x = oc_rand(T * D, 1);
    ds4_weight wg = oc_w("g", DS4_TYPE_F32, 3, D, F, E, gate), wu = oc_w("u", DS4_TYPE_F32, 3, D, F, E, up);
    ds4_weight wd = oc_w("d", DS4_TYPE_F32, 3, F, D, E, down);
    ds4_weight sg = oc_w("sg", DS4_TYPE_F32, 2, D, F, 1, gate), su = oc_w("su", DS4_TYPE_F32, 2, D, F, 1, up);
    ds4_weight sd = oc_w("sd", DS4_TYPE_F32, 2, F, D, 1, down);
    float *dx = oc_dev(x, sizeof(float) * T * D), *dout = oc_dev(NULL, sizeof(float) * T * D);
    oc_be->moe_experts(oc_be, &wg, &wu, &wd, dx, T, dsel, dw, K, 1.0f, dout, false);
    oc_be->ffn_swiglu(oc_be, &sg, &su, &sd, dx, T, 1.0f, dout, true);
    float *out = oc_get(dout, T * D);
    for (int t = 0; t < T; t++) {
        double o[D] = {0};
        for (int k = 0; k <= K; k++) { /* k == K: the shared expert (expert 0's matrices, weight 1) */
            int e = k < K ? sel[t * K + k] : 0;
            double wk = k < K ? w[t * K + k] : 1.0, h[F];
            for (int f = 0; f < F; f++) {
                double g = 0, u = 0;
                for (int d = 0; d < D; d++) {
                    g += (double)gate[(e * F + f) * D + d] * x[t * D + d];
                    u += (double)up[(e * F + f) * D + d] * x[t * D + d];
                }
                h[f] = oc_swiglu(g, u, 1.0);
            }
            for (int d = 0; d < D; d++) {
                double s = 0;
                for (int f = 0; f < F; f++) s += (double)down[(e * D + d) * F + f] * h[f];
                o[d] += wk * s;
            }
        }
        for (int d = 0; d < D; d++) bad += oc_close("moe out", (size_t)d, out[t * D + d], o[d], 1e-4);
    }
    EXPECT_MSG(bad == 0, "moe: %d values off", bad);
    void *d[] = {dl, dw, dtok, dsel, dx, dout};
    for (int i = 0; i < 6; i++) oc_be->free(oc_be, d[i]);
    free(gate), free(up), free(down), free(x), free(out);
}

/* Run every contract test on backend `be`. */
static void ops_contract_run(ds4_backend *be)
{
    oc_be = be;
    RUN(oc_test_matmul);
    RUN(oc_test_matmul_grouped);
    RUN(oc_test_rmsnorm);
    RUN(oc_test_rope);
    RUN(oc_test_embed);
    RUN(oc_test_hc);
    RUN(oc_test_compressor);
    RUN(oc_test_indexer_topk);
    RUN(oc_test_attention);
    RUN(oc_test_moe);
}

#endif

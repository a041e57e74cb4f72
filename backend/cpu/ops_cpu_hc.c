/*
 * ops_cpu_hc.c - CPU ops for the manifold-constrained hyper-connections
 * (mHC): the collapse with its Sinkhorn-normalized mixing matrix, the
 * expand back into the streams, and the final head collapse.
 * Math: dsv4-model.md §3.3 and §3.8 (comb[i][j]: i = source stream).
 */
#include "backend/cpu/ops_cpu.h"

#include <math.h>
#include <string.h>

#define HC_MAX 16

static float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

/* mix[t, k] = rms(flat X_t) * fn[k] . flat X_t  (fn: n_mix rows) */
static float *hc_mix(ds4_backend *be, const float *X, int T, int n_hc, int D,
                     const ds4_weight *fn, float rms_eps)
{
    int64_t n = (int64_t)n_hc * D, n_mix = fn->ne[1];
    float *mix = cpu_scratch(be, 0, (size_t)T * n_mix * sizeof(float));
    cpu_matmul_raw(be, fn->type, fn->data, n_mix, n, X, T, mix);
    for (int t = 0; t < T; t++) {
        const float *f = X + (size_t)t * n;
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)f[i] * f[i];
        float r = (float)(1.0 / sqrt(ss / (double)n + rms_eps));
        for (int64_t k = 0; k < n_mix; k++) mix[(size_t)t * n_mix + k] *= r;
    }
    return mix;
}

/* Sinkhorn of §3.3 on an n x n matrix of logits (row-major, row = source). */
static void sinkhorn(float *A, int n, int iters, float eps)
{
    for (int i = 0; i < n; i++) {
        float *row = A + i * n, m = row[0], s = 0;
        for (int j = 1; j < n; j++) m = row[j] > m ? row[j] : m;
        for (int j = 0; j < n; j++) s += (row[j] = expf(row[j] - m));
        for (int j = 0; j < n; j++) row[j] = row[j] / s + eps;
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0) {
            for (int i = 0; i < n; i++) {
                float s = 0;
                for (int j = 0; j < n; j++) s += A[i * n + j];
                for (int j = 0; j < n; j++) A[i * n + j] /= s + eps;
            }
        }
        for (int j = 0; j < n; j++) {
            float s = 0;
            for (int i = 0; i < n; i++) s += A[i * n + j];
            for (int i = 0; i < n; i++) A[i * n + j] /= s + eps;
        }
    }
}

/* Per-token work runs as one pool task per token. */
typedef struct {
    const float *X, *F, *mix, *sc, *bs;
    float *Xo, *y, *post, *comb;
    int n_hc, D, iters;
    float hc_eps;
} hc_task;

static void hc_pre_token(void *arg, int64_t t, int thread)
{
    (void)thread;
    hc_task *h = arg;
    int n_hc = h->n_hc, D = h->D, n_mix = (2 + n_hc) * n_hc;
    const float *m = h->mix + (size_t)t * n_mix, *sc = h->sc, *bs = h->bs;
    float pre[HC_MAX];
    for (int i = 0; i < n_hc; i++) {
        pre[i] = sigmoidf_(m[i] * sc[0] + bs[i]) + h->hc_eps;
        h->post[(size_t)t * n_hc + i] = 2.0f * sigmoidf_(m[n_hc + i] * sc[1] + bs[n_hc + i]);
    }
    float *A = h->comb + (size_t)t * n_hc * n_hc;
    for (int k = 0; k < n_hc * n_hc; k++) A[k] = m[2 * n_hc + k] * sc[2] + bs[2 * n_hc + k];
    sinkhorn(A, n_hc, h->iters, h->hc_eps);
    float *yt = h->y + (size_t)t * D;
    const float *Xt = h->X + (size_t)t * n_hc * D;
    for (int d = 0; d < D; d++) {
        float s = 0;
        for (int i = 0; i < n_hc; i++) s += pre[i] * Xt[(size_t)i * D + d];
        yt[d] = s;
    }
}

static void op_hc_pre(ds4_backend *be, const float *X, int T, int n_hc, int D,
                      const ds4_weight *fn, const ds4_weight *scale,
                      const ds4_weight *base, int iters, float rms_eps,
                      float hc_eps, float *y, float *post, float *comb)
{
    hc_task h = {X, NULL, NULL, scale->data, base->data, NULL, y, post, comb, n_hc, D, iters, hc_eps};
    h.mix = hc_mix(be, X, T, n_hc, D, fn, rms_eps);
    cpu_parallel(be, T, hc_pre_token, &h);
}

static void hc_post_token(void *arg, int64_t t, int thread)
{
    (void)thread;
    hc_task *h = arg;
    int n_hc = h->n_hc, D = h->D;
    float old[HC_MAX];
    float *Xt = h->Xo + (size_t)t * n_hc * D;
    const float *A = h->comb + (size_t)t * n_hc * n_hc, *p = h->post + (size_t)t * n_hc;
    const float *F = h->F + (size_t)t * D;
    for (int d = 0; d < D; d++) {
        for (int i = 0; i < n_hc; i++) old[i] = Xt[(size_t)i * D + d];
        for (int j = 0; j < n_hc; j++) {
            float s = p[j] * F[d];
            for (int i = 0; i < n_hc; i++) s += A[i * n_hc + j] * old[i];
            Xt[(size_t)j * D + d] = s;
        }
    }
}

static void op_hc_post(ds4_backend *be, float *X, int T, int n_hc, int D,
                       const float *F, const float *post, const float *comb)
{
    hc_task h = {NULL, F, NULL, NULL, NULL, X, NULL, (float *)post, (float *)comb, n_hc, D, 0, 0};
    cpu_parallel(be, T, hc_post_token, &h);
}

static void hc_head_token(void *arg, int64_t t, int thread)
{
    (void)thread;
    hc_task *h = arg;
    int n_hc = h->n_hc, D = h->D;
    float pre[HC_MAX];
    for (int i = 0; i < n_hc; i++) pre[i] = sigmoidf_(h->mix[(size_t)t * n_hc + i] * h->sc[0] + h->bs[i]) + h->hc_eps;
    const float *Xt = h->X + (size_t)t * n_hc * D;
    for (int d = 0; d < D; d++) {
        float s = 0;
        for (int i = 0; i < n_hc; i++) s += pre[i] * Xt[(size_t)i * D + d];
        h->y[(size_t)t * D + d] = s;
    }
}

static void op_hc_head(ds4_backend *be, const float *X, int T, int n_hc, int D,
                       const ds4_weight *fn, const ds4_weight *scale,
                       const ds4_weight *base, float rms_eps, float hc_eps, float *y)
{
    hc_task h = {X, NULL, NULL, scale->data, base->data, NULL, y, NULL, NULL, n_hc, D, 0, hc_eps};
    h.mix = hc_mix(be, X, T, n_hc, D, fn, rms_eps);
    cpu_parallel(be, T, hc_head_token, &h);
}

void cpu_install_hc(ds4_backend *be)
{
    be->hc_pre = op_hc_pre;
    be->hc_post = op_hc_post;
    be->hc_head = op_hc_head;
}

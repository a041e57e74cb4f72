/*
 * test_cuda_moe.c - the MoE and shared-expert ops on the CUDA backend
 * against the CPU backend, with quantized weights at the real Flash expert
 * shapes (IQ2_XXS gate/up 2048 x 4096, Q2_K down 4096 x 2048, Q8_0 shared
 * expert), built from ggml fixture rows (tests/data/quants).
 *
 * On the GPU these ops run the fused int8 kernels (cuda_mmvq.cu: gate+up
 * with the SwiGLU in one launch, down with the weighted sum over the
 * token's experts in another), whose activations are quantized exactly as
 * the CPU quantizes them; the float sums run in another order, and the
 * SwiGLU output is quantized again for the down projection, where a one-ulp
 * difference can move one int8 step. So the bound is relative:
 * ||cuda - cpu|| <= 1e-3 ||cpu|| (DS4_CUDA_MMVQ=0, f32 activations on the
 * GPU: 3e-2). Then, on the GPU alone and bit for bit: the moe_router op
 * (the router's matvec and pick in one launch) against matmul + moe_route,
 * and its picks against the spec computed here from the logits. Skips
 * (with the reason) without nvcc or a GPU.
 */
#include "tests/test.h"
#include "tests/test_cuda_fixture.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#if DS4_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/ops.h"
#include "quant/half.h"

/* rows x (k * fixture width) of fixture rows, row r part j = fixture row
 * (r * 3 + j * 5 + seed) % 8; experts are consecutive row blocks. */
static uint8_t *fixture_matrix(const char *file, int64_t rows, int k, int seed, int64_t *row_bytes)
{
    cuda_fixture f;
    if (cuda_fixture_load(file, &f) != 0) return NULL;
    *row_bytes = f.row_bytes * k;
    uint8_t *q = malloc((size_t)(rows * *row_bytes));
    for (int64_t r = 0; r < rows; r++)
        for (int j = 0; j < k; j++)
            memcpy(q + r * *row_bytes + j * f.row_bytes, f.q + ((r * 3 + j * 5 + seed) % 8) * f.row_bytes,
                   (size_t)f.row_bytes);
    cuda_fixture_free(&f);
    return q;
}

static ds4_weight weight(const char *name, ds4_type t, int nd, int64_t ne0, int64_t ne1, int64_t ne2,
                         const void *data, int64_t row_bytes)
{
    ds4_weight w = {name, t, nd, {ne0, ne1, ne2, 1}, data, 0};
    w.nbytes = (uint64_t)(row_bytes * ne1 * ne2);
    return w;
}

static void *to_be(ds4_backend *be, const void *h, size_t n)
{
    void *d = be->alloc(be, n);
    if (d && h) be->upload(be, d, h, n);
    return d;
}

enum { D = 4096, F = 2048, E = 16, K = 6 };

/* out = moe_experts (+ the shared expert when `shared`) on backend be. */
static float *run(ds4_backend *be, const ds4_weight *g, const ds4_weight *u, const ds4_weight *dn,
                  const ds4_weight *sg, const ds4_weight *su, const ds4_weight *sd, const float *x, int T,
                  const int32_t *sel, const float *w, int shared, int accumulate, const float *init)
{
    float *dx = to_be(be, x, sizeof(float) * (size_t)T * D);
    int32_t *dsel = to_be(be, sel, sizeof(int32_t) * (size_t)T * K);
    float *dw = to_be(be, w, sizeof(float) * (size_t)T * K);
    float *dout = to_be(be, init, sizeof(float) * (size_t)T * D);
    be->moe_experts(be, g, u, dn, dx, T, dsel, dw, K, 10.0f, dout, accumulate);
    if (shared) be->ffn_swiglu(be, sg, su, sd, dx, T, 10.0f, dout, true);
    float *out = malloc(sizeof(float) * (size_t)T * D);
    be->download(be, out, dout, sizeof(float) * (size_t)T * D);
    be->free(be, dx), be->free(be, dsel), be->free(be, dw), be->free(be, dout);
    return out;
}

static void test_moe_matches_cpu(void)
{
    if (ds4_cuda_device_count() <= 0) {
        test_skip("no CUDA device (cudaGetDeviceCount found none)");
        return;
    }
    int64_t rb_gu, rb_d, rb_sgu, rb_sd;
    uint8_t *gq = fixture_matrix("quants/iq2_xxs-n4096-imatrix.bin", (int64_t)E * F, 1, 1, &rb_gu);
    uint8_t *uq = fixture_matrix("quants/iq2_xxs-n4096-imatrix.bin", (int64_t)E * F, 1, 4, &rb_gu);
    uint8_t *dq = fixture_matrix("quants/q2_K-n2048-plain.bin", (int64_t)E * D, 1, 2, &rb_d);
    uint8_t *sgq = fixture_matrix("quants/q8_0-n4096-plain.bin", F, 1, 3, &rb_sgu);
    uint8_t *suq = fixture_matrix("quants/q8_0-n4096-plain.bin", F, 1, 6, &rb_sgu);
    uint8_t *sdq = fixture_matrix("quants/q8_0-n2048-plain.bin", D, 1, 5, &rb_sd);
    REQUIRE(gq && uq && dq && sgq && suq && sdq);
    ds4_weight g = weight("gate_exps", DS4_TYPE_IQ2_XXS, 3, D, F, E, gq, rb_gu);
    ds4_weight u = weight("up_exps", DS4_TYPE_IQ2_XXS, 3, D, F, E, uq, rb_gu);
    ds4_weight dn = weight("down_exps", DS4_TYPE_Q2_K, 3, F, D, E, dq, rb_d);
    ds4_weight sg = weight("gate_sh", DS4_TYPE_Q8_0, 2, D, F, 1, sgq, rb_sgu);
    ds4_weight su = weight("up_sh", DS4_TYPE_Q8_0, 2, D, F, 1, suq, rb_sgu);
    ds4_weight sd = weight("down_sh", DS4_TYPE_Q8_0, 2, F, D, 1, sdq, rb_sd);
    ds4_backend *cpu = ds4_backend_cpu_create(2), *gpu = ds4_backend_cuda_create(0);
    REQUIRE(cpu && gpu);
    const ds4_weight *all[] = {&g, &u, &dn, &sg, &su, &sd};
    for (int i = 0; i < 6; i++) REQUIRE(gpu->weight_prepare(gpu, all[i]) == DS4_OK);
    const char *env = getenv("DS4_CUDA_MMVQ");
    const double tol = env && env[0] == '0' ? 3e-2 : 1e-3;
    /* 40 and 100 tokens: prefill chunks, routed experts grouped by expert
     * (cuda_moe_grouped.cu: ~15 and ~37 tokens an expert, one group of the
     * tensor-core kernels, cuda_moe_mma.cu, or several of the dp4a ones);
     * the shared expert takes the bf16 GEMM */
    static const int toks[] = {1, 3, 40, 100};
    uint64_t seed = 77;
    for (int ti = 0; ti < 4; ti++) {
        const int T = toks[ti];
        float *x = malloc(sizeof(float) * (size_t)T * D), *init = malloc(sizeof(float) * (size_t)T * D);
        int32_t sel[100 * K];
        float w[100 * K];
        for (int i = 0; i < T * D; i++) x[i] = cuda_test_rand(&seed), init[i] = cuda_test_rand(&seed);
        for (int t = 0; t < T; t++)
            for (int j = 0; j < K; j++) { /* distinct, not sorted: the combine must sort by id */
                sel[t * K + j] = (int32_t)((13 + 5 * t + 7 * (K - j)) % E);
                w[t * K + j] = 0.1f + 0.15f * (float)j;
            }
        for (int mode = 0; mode < 3; mode++) { /* routed only; routed accumulated; routed + shared */
            const int shared = mode == 2, acc = mode >= 1;
            float *a = run(cpu, &g, &u, &dn, &sg, &su, &sd, x, T, sel, w, shared, acc, init);
            float *b = run(gpu, &g, &u, &dn, &sg, &su, &sd, x, T, sel, w, shared, acc, init);
            double num = 0, den = 0;
            int finite = 1;
            for (int i = 0; i < T * D; i++) {
                finite &= isfinite(b[i]);
                num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
                den += (double)a[i] * a[i];
            }
            const double rel = sqrt(num / (den > 0 ? den : 1));
            const double tol_m = shared && T > 16 ? 2e-2 : tol; /* the GEMM rounds w and x to bf16 */
            EXPECT_MSG(finite && rel <= tol_m, "T %d mode %d: ||cuda - cpu|| / ||cpu|| = %.3g (bound %.3g)", T, mode,
                       rel, tol_m);
            printf("    T %d %s: relative difference %.3g\n", T,
                   mode == 0 ? "routed" : mode == 1 ? "routed, accumulated" : "routed + shared", rel);
            const char *mma = getenv("DS4_CUDA_MOE_MMA");
            if (mode == 0 && T > 16 && !env && !getenv("DS4_CUDA_MOE_GROUPED") && mma && mma[0] == '0') {
                /* grouped by expert on the dp4a kernels, each token gets the
                 * decode kernels' numbers: bit for bit its own one-token run
                 * (the tensor-core kernels give the CPU's instead:
                 * test_cuda_kernels test_moe_mma_matches_cpu) */
                int differ = 0;
                for (int t = 0; t < T; t++) {
                    float *one = run(gpu, &g, &u, &dn, &sg, &su, &sd, x + (size_t)t * D, 1, sel + t * K, w + t * K,
                                     0, 0, init + (size_t)t * D);
                    differ += memcmp(one, b + (size_t)t * D, sizeof(float) * D) != 0;
                    free(one);
                }
                EXPECT_MSG(differ == 0, "T %d: %d tokens differ from their one-token run", T, differ);
            }
            free(a), free(b);
        }
        free(x), free(init);
    }
    cpu->destroy(cpu);
    gpu->destroy(gpu);
    free(gq), free(uq), free(dq), free(sgq), free(suq), free(sdq);
}

/* Flash's routed experts (E of them: IQ2_XXS gate and up, Q2_K down)
 * from fixture rows picked by the seeds, prepared on gpu; false when a
 * fixture or the upload fails. */
typedef struct {
    uint8_t *gq, *uq, *dq;
    ds4_weight g, u, dn;
} routed_experts;

static bool routed_experts_load(routed_experts *r, ds4_backend *gpu, int seed_g, int seed_u, int seed_d)
{
    int64_t rb_gu, rb_d;
    r->gq = fixture_matrix("quants/iq2_xxs-n4096-imatrix.bin", (int64_t)E * F, 1, seed_g, &rb_gu);
    r->uq = fixture_matrix("quants/iq2_xxs-n4096-imatrix.bin", (int64_t)E * F, 1, seed_u, &rb_gu);
    r->dq = fixture_matrix("quants/q2_K-n2048-plain.bin", (int64_t)E * D, 1, seed_d, &rb_d);
    if (!r->gq || !r->uq || !r->dq) return false;
    r->g = weight("gate_exps", DS4_TYPE_IQ2_XXS, 3, D, F, E, r->gq, rb_gu);
    r->u = weight("up_exps", DS4_TYPE_IQ2_XXS, 3, D, F, E, r->uq, rb_gu);
    r->dn = weight("down_exps", DS4_TYPE_Q2_K, 3, F, D, E, r->dq, rb_d);
    return gpu->weight_prepare(gpu, &r->g) == DS4_OK && gpu->weight_prepare(gpu, &r->u) == DS4_OK &&
           gpu->weight_prepare(gpu, &r->dn) == DS4_OK;
}

static void routed_experts_free(routed_experts *r) { free(r->gq), free(r->uq), free(r->dq); }

/* A routed expert id outside [0, n_expert) is computed as NaN, not read
 * out of bounds: one token at Flash's shapes (the one-token kernels of
 * cuda_moe_gateup1.cu / cuda_moe_down1.cu, or the pipelined kernel with
 * DS4_CUDA_MOE1=0) with its third expert id past the end gives NaN in
 * every output row, and the same token with valid ids gives none. */
static void test_moe_bad_expert_id_is_nan(void)
{
    if (ds4_cuda_device_count() <= 0) {
        test_skip("no CUDA device (cudaGetDeviceCount found none)");
        return;
    }
    ds4_backend *gpu = ds4_backend_cuda_create(0);
    REQUIRE(gpu);
    routed_experts re;
    REQUIRE(routed_experts_load(&re, gpu, 1, 4, 2));
    const ds4_weight g = re.g, u = re.u, dn = re.dn;
    uint64_t seed = 91;
    float x[D], init[D], w[K];
    for (int i = 0; i < D; i++) x[i] = cuda_test_rand(&seed), init[i] = 0.0f;
    int32_t sel[K] = {3, 9, 1, 14, 0, 7};
    for (int j = 0; j < K; j++) w[j] = 0.2f + 0.1f * (float)j;
    for (int bad = 0; bad < 2; bad++) {
        sel[2] = bad ? E + 5 : 1;
        float *y = run(gpu, &g, &u, &dn, NULL, NULL, NULL, x, 1, sel, w, 0, 0, init);
        int n_nan = 0;
        for (int i = 0; i < D; i++) n_nan += isnan(y[i]) != 0;
        EXPECT_MSG(n_nan == (bad ? D : 0), "expert id %d: %d of %d outputs NaN (expected %d)", sel[2], n_nan, D,
                   bad ? D : 0);
        free(y);
    }
    gpu->destroy(gpu);
    routed_experts_free(&re);
}

/* The moe_router op (one token: the router's matvec whose last block
 * picks) against matmul + moe_route on the same backend, bit for bit:
 * logits, picks and weights, at Flash's router shape (256 x 4096 F16, 6
 * picks) with the biased top-k, with ties (rows 7 and 200, 31 and 32 are
 * equal and biased to lead: the spec's order is 7, 200, 31, 32) and with
 * a hash layer; three tokens take the two ops. */
static void test_moe_router_same_bits(void)
{
    if (ds4_cuda_device_count() <= 0) {
        test_skip("no CUDA device (cudaGetDeviceCount found none)");
        return;
    }
    enum { NE = 256, RT_MAX = 3, VOCAB = 8 };
    uint16_t *rq = malloc(sizeof(uint16_t) * NE * D);
    float bias[NE], *x = malloc(sizeof(float) * RT_MAX * D);
    int32_t t2e[VOCAB * K], tokens[RT_MAX] = {5, 2, 7};
    uint64_t seed = 321;
    for (size_t i = 0; i < (size_t)NE * D; i++) rq[i] = ds4_f32_to_f16(0.05f * cuda_test_rand(&seed));
    memcpy(rq + (size_t)200 * D, rq + (size_t)7 * D, sizeof(uint16_t) * D);
    memcpy(rq + (size_t)32 * D, rq + (size_t)31 * D, sizeof(uint16_t) * D);
    /* the tied pairs lead: picks 7, 200, 31, 32 in that order (ties by lower id) */
    for (int e = 0; e < NE; e++) bias[e] = e == 7 || e == 200 ? 10.0f : e == 31 || e == 32 ? 5.0f : 0.0f;
    for (int i = 0; i < VOCAB * K; i++) t2e[i] = (int32_t)((i * 37 + 3) % NE);
    for (int i = 0; i < RT_MAX * D; i++) x[i] = cuda_test_rand(&seed);
    ds4_weight gi = weight("gate_inp", DS4_TYPE_F16, 2, D, NE, 1, rq, D * 2);
    ds4_weight bw = weight("exp_probs_b", DS4_TYPE_F32, 1, NE, 1, 1, bias, NE * 4);
    ds4_weight hw = weight("tid2eid", DS4_TYPE_I32, 2, K, VOCAB, 1, t2e, K * 4);
    ds4_backend *be = ds4_backend_cuda_create(0);
    REQUIRE(be && be->moe_router);
    REQUIRE(be->weight_prepare(be, &gi) == DS4_OK && be->weight_prepare(be, &bw) == DS4_OK &&
            be->weight_prepare(be, &hw) == DS4_OK);
    float *dx = to_be(be, x, sizeof(float) * RT_MAX * D);
    int32_t *dtok = to_be(be, tokens, sizeof tokens);
    int tied = 0;
    for (int hash = 0; hash < 2; hash++)
        for (int T = 1; T <= RT_MAX; T += 2)
            for (int rep = 0; rep < 2; rep++) { /* twice: the launch leaves its counter ready */
                float hl[2][RT_MAX * NE], hwt[2][RT_MAX * K];
                int32_t hsl[2][RT_MAX * K];
                for (int v = 0; v < 2; v++) { /* [0]: matmul + moe_route, [1]: moe_router */
                    float *lg = to_be(be, NULL, sizeof(float) * T * NE), *wt = to_be(be, NULL, sizeof(float) * T * K);
                    int32_t *sl = to_be(be, NULL, sizeof(int32_t) * T * K);
                    const ds4_weight *b = hash ? NULL : &bw, *h = hash ? &hw : NULL;
                    if (v == 0) {
                        be->matmul(be, &gi, dx, T, lg);
                        be->moe_route(be, lg, T, NE, K, b, h, dtok, 1.5f, sl, wt);
                    } else {
                        be->moe_router(be, &gi, dx, T, lg, NE, K, b, h, dtok, 1.5f, sl, wt);
                    }
                    be->download(be, hl[v], lg, sizeof(float) * T * NE);
                    be->download(be, hwt[v], wt, sizeof(float) * T * K);
                    be->download(be, hsl[v], sl, sizeof(int32_t) * T * K);
                    be->free(be, lg), be->free(be, wt), be->free(be, sl);
                }
                /* the spec's picks from the logits, computed here: top-k of
                 * sqrt(softplus) + bias, ties by lower id (or the hash row),
                 * weights normalized over the picks (host libm: a few ulp) */
                int bad_pick = 0;
                double max_rel = 0.0;
                for (int t = 0; t < T; t++) {
                    float sc[NE], key[NE];
                    int taken[NE] = {0}, pick[K];
                    for (int e = 0; e < NE; e++) {
                        const float v = hl[0][t * NE + e];
                        sc[e] = sqrtf(v > 20.0f ? v : log1pf(expf(v)));
                        key[e] = sc[e] + bias[e];
                    }
                    for (int j = 0; j < K; j++) {
                        int b = -1;
                        for (int e = 0; e < NE; e++)
                            if (!taken[e] && (b < 0 || key[e] > key[b])) b = e;
                        pick[j] = hash ? t2e[tokens[t] * K + j] : b;
                        if (!hash) taken[b] = 1;
                    }
                    float sum = 0.0f;
                    for (int j = 0; j < K; j++) sum += sc[pick[j]];
                    for (int j = 0; j < K; j++) {
                        bad_pick += hsl[1][t * K + j] != pick[j];
                        const double want = sc[pick[j]] / (sum + 1e-20f) * 1.5f;
                        const double rel = fabs(hwt[1][t * K + j] - want) / want;
                        max_rel = rel > max_rel ? rel : max_rel;
                    }
                }
                EXPECT_MSG(bad_pick == 0 && max_rel < 1e-5,
                           "%s router, T %d: %d picks differ from the spec's, weights within %.2g relative",
                           hash ? "hash" : "top-k", T, bad_pick, max_rel);
                for (int t = 0; t < T && !hash; t++)
                    tied += hsl[1][t * K] == 7 && hsl[1][t * K + 1] == 200 && hsl[1][t * K + 2] == 31 &&
                            hsl[1][t * K + 3] == 32;
                EXPECT_MSG(memcmp(hl[0], hl[1], sizeof(float) * T * NE) == 0,
                           "%s router, T %d: moe_router's logits differ from matmul's", hash ? "hash" : "top-k", T);
                EXPECT_MSG(memcmp(hsl[0], hsl[1], sizeof(int32_t) * T * K) == 0 &&
                               memcmp(hwt[0], hwt[1], sizeof(float) * T * K) == 0,
                           "%s router, T %d: moe_router's picks or weights differ from moe_route's (first pick %d vs %d)",
                           hash ? "hash" : "top-k", T, hsl[1][0], hsl[0][0]);
            }
    EXPECT_MSG(tied == 2 * (1 + RT_MAX), "%d of %d top-k tokens picked 7, 200, 31, 32 first", tied, 2 * (1 + RT_MAX));
    be->free(be, dx), be->free(be, dtok);
    be->destroy(be);
    free(rq), free(x);
}
/* The router's pick on keys that are not all finite (the pick's fast
 * rounds need finite keys; these take the walk): a +inf logit (its key
 * +inf) is picked first, a -inf one (key 0 + bias) and a NaN one never
 * here, the rest as the spec's host pick orders them; moe_route and the
 * fused moe_router (whose logits come from its matvec, so only moe_route
 * sees them) on Flash's 256 experts, 6 picks. The expected picks are
 * computed here from the logits, not by the code under test. */
static void test_moe_route_nonfinite_keys(void)
{
    if (ds4_cuda_device_count() <= 0) {
        test_skip("no CUDA device (cudaGetDeviceCount found none)");
        return;
    }
    enum { NE = 256 };
    float lg[NE], bias[NE];
    uint64_t seed = 77;
    for (int e = 0; e < NE; e++) lg[e] = cuda_test_rand(&seed), bias[e] = 0.01f * (float)(e % 7);
    lg[100] = INFINITY, lg[3] = -INFINITY, lg[40] = NAN;
    ds4_weight bw = weight("exp_probs_b", DS4_TYPE_F32, 1, NE, 1, 1, bias, NE * 4);
    ds4_backend *be = ds4_backend_cuda_create(0);
    REQUIRE(be && be->weight_prepare(be, &bw) == DS4_OK);
    float *dl = to_be(be, lg, sizeof lg), *dw = to_be(be, NULL, sizeof(float) * K);
    int32_t tok = 0, *dtok = to_be(be, &tok, sizeof tok), *ds = to_be(be, NULL, sizeof(int32_t) * K), got[K];
    be->moe_route(be, dl, 1, NE, K, &bw, NULL, dtok, 1.0f, ds, dw);
    be->download(be, got, ds, sizeof got);
    /* the spec: highest key first, ties by lower id; NaN keys skipped */
    int taken[NE] = {0}, want[K], bad = 0;
    float key[NE];
    for (int e = 0; e < NE; e++) {
        const float v = lg[e];
        key[e] = sqrtf(v > 20.0f ? v : log1pf(expf(v))) + bias[e];
    }
    for (int j = 0; j < K; j++) {
        int b = -1;
        for (int e = 0; e < NE; e++)
            if (!taken[e] && !isnan(key[e]) && (b < 0 || key[e] > key[b])) b = e;
        want[j] = b, taken[b] = 1;
    }
    for (int j = 0; j < K; j++) bad += got[j] != want[j];
    EXPECT_MSG(want[0] == 100, "the +inf logit's expert leads the spec's picks (%d)", want[0]);
    EXPECT_MSG(bad == 0, "%d of %d picks differ from the spec's with +inf, -inf and NaN logits (first %d vs %d)", bad,
               K, got[0], want[0]);
    be->free(be, dl), be->free(be, dw), be->free(be, dtok), be->free(be, ds);
    be->destroy(be);
}
/* A batched decode step's routed experts (2-16 tokens, each from its own
 * session: cuda_moe_gateup_batch.cu and cuda_moe_down_batch.cu, or the
 * pipelined kernel with DS4_CUDA_MOE_BATCH=0) give each token the outputs
 * of its own one-token run (cuda_moe_gateup1.cu / cuda_moe_down1.cu) bit
 * for bit: tokens sharing experts (16 experts, 6 picks each), written and
 * accumulated (2, 5, 9, 15 and 16 tokens); in the 16-token step one token
 * picks an expert id past the end and another a negative one, and only
 * their outputs are NaN (the first ranks last, the second first: the
 * down's two warps of a pair each see one, cuda_moe_down_pair.cu). */
static void test_moe_batch_same_bits(void)
{
    if (ds4_cuda_device_count() <= 0) {
        test_skip("no CUDA device (cudaGetDeviceCount found none)");
        return;
    }
    enum { TMAX = 16, BAD_TOK = 4, BAD_TOK2 = 11 };
    ds4_backend *gpu = ds4_backend_cuda_create(0);
    REQUIRE(gpu);
    routed_experts re;
    REQUIRE(routed_experts_load(&re, gpu, 2, 5, 3));
    const ds4_weight g = re.g, u = re.u, dn = re.dn;
    float *x = malloc(sizeof(float) * TMAX * D), *init = malloc(sizeof(float) * TMAX * D);
    int32_t sel[TMAX * K];
    float w[TMAX * K];
    uint64_t seed = 2024;
    for (int i = 0; i < TMAX * D; i++) x[i] = cuda_test_rand(&seed), init[i] = cuda_test_rand(&seed);
    /* on an H200 (132 SMs) 15 tokens' 90 slots keep the gate+up's
     * activations in shared memory, the other counts hold them in
     * registers (a grid of warps that is a multiple of the slots) */
    static const int toks[] = {2, 5, 9, 15, 16};
    for (int ti = 0; ti < (int)(sizeof toks / sizeof toks[0]); ti++) {
        const int T = toks[ti];
        for (int t = 0; t < T; t++)
            for (int j = 0; j < K; j++) { /* distinct within a token (5 j mod 16), shared among tokens */
                sel[t * K + j] = (int32_t)((3 * t + 5 * j + t % 3) % E);
                w[t * K + j] = 0.05f + 0.11f * (float)j + 0.01f * (float)t;
            }
        if (T == TMAX) sel[BAD_TOK * K + 2] = E + 5, sel[BAD_TOK2 * K + 1] = -1;
        for (int acc = 0; acc < 2; acc++) {
            float *b = run(gpu, &g, &u, &dn, NULL, NULL, NULL, x, T, sel, w, 0, acc, init);
            int differ = 0, nan_bad = 0, nan_other = 0;
            for (int t = 0; t < T; t++) {
                const float *bt = b + (size_t)t * D;
                if (T == TMAX && (t == BAD_TOK || t == BAD_TOK2)) {
                    for (int i = 0; i < D; i++) nan_bad += isnan(bt[i]) != 0;
                    continue;
                }
                for (int i = 0; i < D; i++) nan_other += isnan(bt[i]) != 0;
                float *one = run(gpu, &g, &u, &dn, NULL, NULL, NULL, x + (size_t)t * D, 1, sel + t * K, w + t * K, 0,
                                 acc, init + (size_t)t * D);
                differ += memcmp(one, bt, sizeof(float) * D) != 0;
                free(one);
            }
            EXPECT_MSG(differ == 0 && nan_other == 0, "T %d%s: %d tokens differ from their one-token run, %d NaN", T,
                       acc ? " accumulated" : "", differ, nan_other);
            if (T == TMAX)
                EXPECT_MSG(nan_bad == 2 * D, "T %d: the two tokens with a bad expert id have %d of %d outputs NaN", T,
                           nan_bad, 2 * D);
            free(b);
        }
    }
    printf("    2, 5, 9 and 16 tokens: each token bit for bit its own run\n");
    gpu->destroy(gpu);
    free(x), free(init);
    routed_experts_free(&re);
}
/* The shared expert started ahead (ffn_swiglu_ahead, on the CUDA side
 * stream: cuda_ops_moe_ahead.cu) and added by moe_shared gives the bits
 * of moe_experts followed by ffn_swiglu with accumulate, for one token,
 * 3 and 16 (the batch's tensor-core pass); and moe_shared whose ahead
 * product was of another activation computes the shared expert itself,
 * with the same bits. */
static void test_moe_ahead_same_bits(void)
{
    if (ds4_cuda_device_count() <= 0) {
        test_skip("no CUDA device (cudaGetDeviceCount found none)");
        return;
    }
    ds4_backend *gpu = ds4_backend_cuda_create(0);
    REQUIRE(gpu);
    if (!gpu->ffn_swiglu_ahead || !gpu->moe_shared) {
        gpu->destroy(gpu);
        test_skip("the CUDA backend offers no ffn_swiglu_ahead (DS4_CUDA_MOE_AHEAD=0)");
        return;
    }
    routed_experts re;
    REQUIRE(routed_experts_load(&re, gpu, 3, 6, 1));
    int64_t rb_sgu, rb_sd;
    uint8_t *sgq = fixture_matrix("quants/q8_0-n4096-plain.bin", F, 1, 2, &rb_sgu);
    uint8_t *suq = fixture_matrix("quants/q8_0-n4096-plain.bin", F, 1, 7, &rb_sgu);
    uint8_t *sdq = fixture_matrix("quants/q8_0-n2048-plain.bin", D, 1, 4, &rb_sd);
    REQUIRE(sgq && suq && sdq);
    ds4_weight sg = weight("gate_sh", DS4_TYPE_Q8_0, 2, D, F, 1, sgq, rb_sgu);
    ds4_weight su = weight("up_sh", DS4_TYPE_Q8_0, 2, D, F, 1, suq, rb_sgu);
    ds4_weight sd = weight("down_sh", DS4_TYPE_Q8_0, 2, F, D, 1, sdq, rb_sd);
    REQUIRE(gpu->weight_prepare(gpu, &sg) == DS4_OK && gpu->weight_prepare(gpu, &su) == DS4_OK &&
            gpu->weight_prepare(gpu, &sd) == DS4_OK);
    enum { TMAX = 16 };
    static const int toks[] = {1, 3, TMAX};
    uint64_t seed = 4242;
    float *x = malloc(sizeof(float) * TMAX * D), *x2 = malloc(sizeof(float) * TMAX * D);
    int32_t sel[TMAX * K];
    float w[TMAX * K];
    for (int i = 0; i < TMAX * D; i++) x[i] = cuda_test_rand(&seed), x2[i] = cuda_test_rand(&seed);
    for (int t = 0; t < TMAX; t++)
        for (int j = 0; j < K; j++) sel[t * K + j] = (int32_t)((2 + 3 * t + 5 * j) % E), w[t * K + j] = 0.05f * (float)(j + 1);
    for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++) {
        const int T = toks[ti];
        const size_t xb = sizeof(float) * (size_t)T * D;
        float *ref = run(gpu, &re.g, &re.u, &re.dn, &sg, &su, &sd, x, T, sel, w, 1, 0, NULL);
        float *dx = to_be(gpu, x, xb), *dx2 = to_be(gpu, x2, xb), *dout = to_be(gpu, NULL, xb);
        int32_t *dsel = to_be(gpu, sel, sizeof(int32_t) * (size_t)T * K);
        float *dw = to_be(gpu, w, sizeof(float) * (size_t)T * K);
        float *out = malloc(xb);
        for (int other = 0; other < 2; other++) { /* ahead on x, or on x2 (not used) */
            gpu->ffn_swiglu_ahead(gpu, &sg, &su, &sd, other ? dx2 : dx, T, 10.0f);
            gpu->moe_shared(gpu, &re.g, &re.u, &re.dn, &sg, &su, &sd, dx, T, dsel, dw, K, 10.0f, dout);
            gpu->download(gpu, out, dout, xb);
            int diff = 0;
            for (int i = 0; i < T * D; i++) diff += memcmp(&out[i], &ref[i], sizeof(float)) != 0;
            EXPECT_MSG(diff == 0, "%d tokens, ahead on %s: %d of %d outputs differ from moe_experts + ffn_swiglu", T,
                       other ? "another activation" : "x", diff, T * D);
        }
        free(out), free(ref);
        gpu->free(gpu, dx), gpu->free(gpu, dx2), gpu->free(gpu, dout), gpu->free(gpu, dsel), gpu->free(gpu, dw);
    }
    free(x), free(x2), free(sgq), free(suq), free(sdq);
    routed_experts_free(&re);
    gpu->destroy(gpu);
}

#else
static void test_moe_matches_cpu(void) { test_skip(TEST_SKIP_NO_CUDA); }
static void test_moe_bad_expert_id_is_nan(void) { test_skip(TEST_SKIP_NO_CUDA); }
static void test_moe_router_same_bits(void) { test_skip(TEST_SKIP_NO_CUDA); }
static void test_moe_route_nonfinite_keys(void) { test_skip(TEST_SKIP_NO_CUDA); }
static void test_moe_batch_same_bits(void) { test_skip(TEST_SKIP_NO_CUDA); }
static void test_moe_ahead_same_bits(void) { test_skip(TEST_SKIP_NO_CUDA); }
#endif

int main(void)
{
    RUN(test_moe_matches_cpu);
    RUN(test_moe_bad_expert_id_is_nan);
    RUN(test_moe_router_same_bits);
    RUN(test_moe_route_nonfinite_keys);
    RUN(test_moe_batch_same_bits);
    RUN(test_moe_ahead_same_bits);
    return test_finish();
}

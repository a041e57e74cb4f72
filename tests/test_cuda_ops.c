/*
 * test_cuda_ops.c - the backend op contract (tests/ops_contract.h: every
 * op against an independent double-precision computation, with the
 * contract's tolerances) on the CUDA backend; then attention and the
 * indexer at the model's shapes (64 heads of 512, a 128-row window, top-k
 * 512), where the split kernels cut rows into chunks: attention against a
 * double-precision computation written here, for the split kernels, the
 * one-pass prefill kernel (chunks of 256 or more queries; on the tensor
 * cores by default, with rows that are f16 values and rows that are not,
 * DS4_CUDA_ATTN_TC=0 the CUDA-core one) and the one-block ones
 * (DS4_CUDA_ATTN=0), the indexer's selection against
 * the CPU backend's, id for id (equal scores, ties included); the fused
 * and batched ops (attention_out, attention_out_seqs, rmsnorm_rope_qkv, rmsnorm_matmul (Q8_0, F16), query_rope,
 * indexer_query_rope, compress_two, rmsnorm_rope_qkv_seqs, compressor_push_seqs, ...) against the separate
 * ones, bit for bit, and indexer_topk_seqs against the CPU's selection per
 * sequence; a prefill's compressor pushes against one token at a time,
 * bit for bit.
 * Skips when built without nvcc or when no CUDA device is present.
 */
#include "tests/ops_contract.h"

#if DS4_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#include "backend/cuda/cuda_backend.h"
#endif

#if DS4_HAVE_CUDA
enum { RS_H = 64, RS_D = 512, RS_W = 128, RS_TOPK = 512, RS_IH = 64, RS_ID = 128 };

static ds4_backend *rs_split, *rs_oneblock; /* default kernels; DS4_CUDA_ATTN=0 DS4_CUDA_INDEXER=0 */

static int rs_same_bits(const char *what, const float *da, const float *db, size_t n);

/* DS4_CUDA_STATE_SEQS=0: the backend has no compressor_push_seqs and
 * indexer_topk_seqs (the model then calls the ops per sequence) */
static int rs_state_seqs_off(void)
{
    const char *e = getenv("DS4_CUDA_STATE_SEQS");
    return e && strcmp(e, "0") == 0;
}

/* o_a (8 groups of 1024 rows of 4096) and o_b (4096 rows of 8192), Q8_0
 * as the model's, prepared once on rs_split: the chain and the
 * attention_out_project tests' products. 0 when they could not be made. */
enum { RS_OG = 8, RS_ORA = 1024, RS_OCA = 4096, RS_ORB = 4096, RS_OCB = RS_OG * RS_ORA };
static struct {
    ds4_weight wa, wb;
    void *qa, *qb;
    int state; /* 0 not tried, 1 ready, -1 failed */
} rs_o;

static int rs_o_weights(void)
{
    if (rs_o.state) return rs_o.state > 0;
    rs_o.state = -1;
    float *fa = oc_rand((size_t)RS_OG * RS_ORA * RS_OCA, 0.05), *fb = oc_rand((size_t)RS_ORB * RS_OCB, 0.05);
    rs_o.qa = malloc((size_t)ds4_row_bytes(DS4_TYPE_Q8_0, RS_OCA) * RS_OG * RS_ORA);
    rs_o.qb = malloc((size_t)ds4_row_bytes(DS4_TYPE_Q8_0, RS_OCB) * RS_ORB);
    if (rs_o.qa && rs_o.qb &&
        ds4_quantize_rows(DS4_TYPE_Q8_0, fa, rs_o.qa, (int64_t)RS_OG * RS_ORA, RS_OCA, NULL) == DS4_OK &&
        ds4_quantize_rows(DS4_TYPE_Q8_0, fb, rs_o.qb, RS_ORB, RS_OCB, NULL) == DS4_OK) {
        rs_o.wa = oc_w("o_a", DS4_TYPE_Q8_0, 2, RS_OCA, (int64_t)RS_OG * RS_ORA, 1, rs_o.qa);
        rs_o.wb = oc_w("o_b", DS4_TYPE_Q8_0, 2, RS_OCB, RS_ORB, 1, rs_o.qb);
        if (rs_split->weight_prepare(rs_split, &rs_o.wa) == DS4_OK &&
            rs_split->weight_prepare(rs_split, &rs_o.wb) == DS4_OK)
            rs_o.state = 1;
    }
    free(fa), free(fb);
    EXPECT_MSG(rs_o.state > 0, "o_a / o_b weights: %s", ds4_last_error());
    return rs_o.state > 0;
}

/* attention_out_project against attention_out's output (dout, from the
 * three ops) and ring (dring) then matmul_grouped and matmul, bit for bit:
 * out, ring, u and y. One query takes the hand-off of the combine's Q8_0
 * blocks to o_a (the default; main keeps an explicit DS4_CUDA_Q8_HANDOFF_A=0),
 * more the plain ops. */
static void rs_attention_out_project_same_bits(ds4_backend *be, const float *dq, int T, const float *dkv,
                                               const float *ring, int64_t pos0, const float *dc, int ratio,
                                               const int32_t *dsel, const ds4_weight *ws, int n_rot,
                                               const ds4_weight *wom, const float *dout, const float *dring)
{
    if (!be->attention_out_project || !rs_o_weights()) return;
    const size_t no = (size_t)T * RS_H * RS_D;
    float *dr = oc_dev(ring, sizeof(float) * RS_W * RS_D), *dout1 = oc_dev(NULL, sizeof(float) * no);
    float *du[2], *dy[2];
    for (int i = 0; i < 2; i++) {
        du[i] = oc_dev(NULL, sizeof(float) * (size_t)T * RS_OCB);
        dy[i] = oc_dev(NULL, sizeof(float) * (size_t)T * RS_ORB);
    }
    be->matmul_grouped(be, &rs_o.wa, RS_OG, dout, T, du[0]);
    be->matmul(be, &rs_o.wb, du[0], T, dy[0]);
    be->attention_out_project(be, dq, T, RS_H, RS_D, dkv, dr, RS_W, pos0, dc, ratio, dsel, RS_TOPK, ws, n_rot, wom,
                              dout1, &rs_o.wa, RS_OG, du[1], &rs_o.wb, dy[1]);
    EXPECT_MSG(rs_same_bits("project out", dout, dout1, no), "T %d pos0 %lld ratio %d", T, (long long)pos0, ratio);
    EXPECT_MSG(rs_same_bits("project ring", dring, dr, (size_t)RS_W * RS_D), "T %d pos0 %lld ratio %d", T,
               (long long)pos0, ratio);
    EXPECT_MSG(rs_same_bits("project u", du[0], du[1], (size_t)T * RS_OCB), "T %d pos0 %lld ratio %d", T,
               (long long)pos0, ratio);
    EXPECT_MSG(rs_same_bits("project y", dy[0], dy[1], (size_t)T * RS_ORB), "T %d pos0 %lld ratio %d", T,
               (long long)pos0, ratio);
    for (int i = 0; i < 2; i++) be->free(be, du[i]), be->free(be, dy[i]);
    be->free(be, dr), be->free(be, dout1);
}

/* attention_out (attention, ring_push, the inverse RoPE of the output)
 * against the three ops, bit for bit: the output and the ring after; on
 * the default kernels attention_out_project too. */
static void rs_attention_out_same_bits(ds4_backend *be, const float *dq, int T, const float *dkv, const float *ring,
                                       int64_t pos0, const float *dc, int ratio, const int32_t *dsel,
                                       const ds4_weight *ws)
{
    enum { R = 64 };
    EXPECT(be->attention_out != NULL);
    if (!be->attention_out) return;
    float om[R / 2];
    for (int i = 0; i < R / 2; i++) om[i] = powf(10000.0f, -2.0f * (float)i / R);
    ds4_weight wom = oc_w("omega", DS4_TYPE_F32, 1, R / 2, 1, 1, om);
    float *dr[2], *dout[2];
    for (int i = 0; i < 2; i++) {
        dr[i] = oc_dev(ring, sizeof(float) * RS_W * RS_D);
        dout[i] = oc_dev(NULL, sizeof(float) * T * RS_H * RS_D);
    }
    be->attention(be, dq, T, RS_H, RS_D, dkv, dr[0], RS_W, pos0, dc, ratio, dsel, RS_TOPK, ws, dout[0]);
    be->ring_push(be, dr[0], RS_W, RS_D, dkv, T, pos0);
    be->rope(be, dout[0], T, RS_H, RS_D, R, &wom, pos0, true);
    be->attention_out(be, dq, T, RS_H, RS_D, dkv, dr[1], RS_W, pos0, dc, ratio, dsel, RS_TOPK, ws, R, &wom, dout[1]);
    EXPECT_MSG(rs_same_bits("attention_out out", dout[0], dout[1], (size_t)T * RS_H * RS_D), "T %d pos0 %lld ratio %d",
               T, (long long)pos0, ratio);
    EXPECT_MSG(rs_same_bits("attention_out ring", dr[0], dr[1], (size_t)RS_W * RS_D), "T %d pos0 %lld ratio %d", T,
               (long long)pos0, ratio);
    if (be == rs_split && T <= 3) /* decode and a short chunk: the products stay small */
        rs_attention_out_project_same_bits(be, dq, T, dkv, ring, pos0, dc, ratio, dsel, ws, R, &wom, dout[0], dr[0]);
    for (int i = 0; i < 2; i++) be->free(be, dr[i]), be->free(be, dout[i]);
}

/* 1: the KV rows rounded to f16 values, as the official numerics store
 * them (dsv4-model.md §4.1 D3); the tensor-core prefill attention
 * (cuda_attn_prefill_tc.cu) takes its two-term path on such rows and its
 * three-term one on the others */
static int rs_f16_rows;

static void rs_round_f16(float *v, size_t n)
{
    for (size_t i = 0; rs_f16_rows && i < n; i++) v[i] = ds4_f16_to_f32(ds4_f32_to_f16(v[i]));
}

/* T queries at pos0: ratio 0 (window only), sel (CSA: the indexer's ids,
 * or 0 .. n-1 then -1 while n <= top-k) or all causal compressed rows (HCA) */
static void rs_attention_case(ds4_backend *be, int T, int64_t pos0, int ratio, int use_sel)
{
    oc_be = be;
    const int64_t nc_all = ratio ? (pos0 + T) / ratio + 1 : 1;
    float *q = oc_rand((size_t)T * RS_H * RS_D, 4.0), *kv = oc_rand((size_t)T * RS_D, 1.0);
    float *ring = oc_rand((size_t)RS_W * RS_D, 1.0), *comp = oc_rand((size_t)nc_all * RS_D, 1.0);
    rs_round_f16(kv, (size_t)T * RS_D);
    rs_round_f16(ring, (size_t)RS_W * RS_D);
    rs_round_f16(comp, (size_t)nc_all * RS_D);
    float *sinks = oc_rand(RS_H, 2.0);
    int32_t *sel = malloc(sizeof(int32_t) * (size_t)T * RS_TOPK), *pick = malloc(sizeof(int32_t) * (size_t)nc_all);
    char *mark = malloc((size_t)nc_all);
    for (int t = 0; t < T; t++) {
        const int64_t nv = ratio ? (pos0 + t + 1) / ratio : 0;
        int32_t *st = sel + (size_t)t * RS_TOPK;
        if (nv <= RS_TOPK) {
            for (int k = 0; k < RS_TOPK; k++) st[k] = k < nv ? k : -1;
            continue;
        }
        for (int64_t i = 0; i < nv; i++) pick[i] = (int32_t)i; /* a random subset, kept in ascending order */
        for (int k = 0; k < RS_TOPK; k++) {
            int64_t j = k + (int64_t)((oc_u() + 1.0) * 0.5 * (double)(nv - k));
            if (j >= nv) j = nv - 1;
            int32_t x = pick[k];
            pick[k] = pick[j], pick[j] = x;
        }
        memset(mark, 0, (size_t)nv);
        for (int k = 0; k < RS_TOPK; k++) mark[pick[k]] = 1;
        int n = 0;
        for (int64_t i = 0; i < nv; i++)
            if (mark[i]) st[n++] = (int32_t)i;
    }
    ds4_weight ws = oc_w("sinks", DS4_TYPE_F32, 1, RS_H, 1, 1, sinks);
    float *dq = oc_dev(q, sizeof(float) * T * RS_H * RS_D), *dkv = oc_dev(kv, sizeof(float) * T * RS_D);
    float *dr = oc_dev(ring, sizeof(float) * RS_W * RS_D), *dc = oc_dev(comp, sizeof(float) * nc_all * RS_D);
    int32_t *dsel = oc_dev(sel, sizeof(int32_t) * T * RS_TOPK);
    float *dout = oc_dev(NULL, sizeof(float) * T * RS_H * RS_D);
    be->attention(be, dq, T, RS_H, RS_D, dkv, dr, RS_W, pos0, ratio ? dc : NULL, ratio, use_sel ? dsel : NULL,
                  RS_TOPK, &ws, dout);
    float *out = oc_get(dout, (size_t)T * RS_H * RS_D);
    const float **rows = malloc(sizeof(float *) * (size_t)(RS_W + nc_all + RS_TOPK));
    double *s = malloc(sizeof(double) * (size_t)(RS_W + nc_all + RS_TOPK)), o[RS_D];
    int bad = 0;
    for (int t = 0; t < T; t++) {
        if (T > 64 && t % 5 != 0 && t < T - 2) continue; /* a prefill chunk: every fifth query and the last two */
        int64_t p = pos0 + t, n = 0;
        for (int64_t pp = p - RS_W + 1 < 0 ? 0 : p - RS_W + 1; pp <= p; pp++)
            rows[n++] = pp >= pos0 ? kv + (pp - pos0) * RS_D : ring + (pp % RS_W) * RS_D;
        if (ratio && use_sel) {
            for (int k = 0; k < RS_TOPK && sel[t * RS_TOPK + k] >= 0; k++) rows[n++] = comp + sel[t * RS_TOPK + k] * RS_D;
        } else if (ratio) {
            for (int64_t w = 0; w < (p + 1) / ratio; w++) rows[n++] = comp + w * RS_D;
        }
        for (int h = 0; h < RS_H; h++) {
            const float *qh = q + ((size_t)t * RS_H + h) * RS_D;
            double mx = sinks[h], den;
            for (int64_t i = 0; i < n; i++) {
                s[i] = 0;
                for (int d = 0; d < RS_D; d++) s[i] += (double)qh[d] * rows[i][d];
                s[i] /= sqrt((double)RS_D);
                mx = fmax(mx, s[i]);
            }
            den = exp(sinks[h] - mx);
            for (int64_t i = 0; i < n; i++) den += exp(s[i] - mx);
            memset(o, 0, sizeof o);
            for (int64_t i = 0; i < n; i++)
                for (int d = 0; d < RS_D; d++) o[d] += exp(s[i] - mx) / den * rows[i][d];
            for (int d = 0; d < RS_D; d++)
                bad += oc_close("attention", (size_t)d, out[((size_t)t * RS_H + h) * RS_D + d], o[d], 2e-5);
        }
    }
    EXPECT_MSG(bad == 0, "attention T %d pos0 %lld ratio %d sel %d: %d values off", T, (long long)pos0, ratio,
               use_sel, bad);
    const char *fe = getenv("DS4_CUDA_FUSE"), *fa = getenv("DS4_CUDA_FUSE_ATTN");
    if (!(fe && fe[0] == '0') && !(fa && fa[0] == '0'))
        rs_attention_out_same_bits(be, dq, T, dkv, ring, pos0, ratio ? dc : NULL, ratio, use_sel ? dsel : NULL, &ws);
    void *d[] = {dq, dkv, dr, dc, dsel, dout};
    for (int i = 0; i < 6; i++) be->free(be, d[i]);
    free(q), free(kv), free(ring), free(comp), free(sinks), free(sel), free(pick), free(mark), free(out), free(rows), free(s);
}

static void rs_attention_cases(ds4_backend *be)
{
    rs_attention_case(be, 1, 5000, 4, 1);   /* CSA decode: 128 raw + 512 selected rows */
    rs_attention_case(be, 1, 50, 4, 1);     /* window partly filled, 12 compressed rows then -1 */
    rs_attention_case(be, 3, 2100, 4, 1);   /* a chunk: raw rows from the chunk and the ring */
    rs_attention_case(be, 1, 40000, 128, 0); /* HCA: 128 raw + 312 compressed rows */
    rs_attention_case(be, 2, 127, 128, 0);  /* HCA at its first compressed row */
    rs_attention_case(be, 1, 300, 0, 0);    /* window only */
    rs_attention_case(be, 1, 0, 4, 1);      /* the first token: one row */
    rs_attention_case(be, 30, 200, 4, 1);   /* prefill: more tokens than one launch of partials holds */
    /* chunks of 256 or more queries: the one-pass prefill kernel (split backend) */
    rs_attention_case(be, 300, 2100, 4, 1);    /* CSA: ring and chunk rows, selections past top-k */
    rs_attention_case(be, 260, 40000, 128, 0); /* HCA: 312 .. 314 compressed rows */
    rs_attention_case(be, 256, 0, 4, 1);       /* the first chunk: 1 .. 128 raw rows, 0 .. 64 selected */
    rs_f16_rows = 1; /* rows as the official numerics store them */
    rs_attention_case(be, 300, 2100, 4, 1);
    rs_attention_case(be, 260, 40000, 128, 0);
    rs_f16_rows = 0;
}

/* attention_out_seqs (batched decode: sequences of one query each, each
 * with its own ring, compressed rows, selection and position) against one
 * attention_out per sequence, bit for bit: outputs and rings. 9-16
 * sequences: the combine also stores its outputs' Q8_0 blocks for o_a's
 * tensor-core product and o_a its outputs' for o_b (ds4_cuda's q8m), so
 * o_a and o_b (matmul_grouped_chain) follow at once, and each token's o_a
 * and o_b outputs must be its one-token products'. */
static void rs_attention_seqs_case(ds4_backend *be, int ratio, const int64_t *pos, int n)
{
    enum { R = 64, NMAX = 16 };
    EXPECT(be->attention_out_seqs != NULL);
    if (!be->attention_out_seqs || n > NMAX) return;
    oc_be = be;
    float om[R / 2];
    for (int i = 0; i < R / 2; i++) om[i] = powf(10000.0f, -2.0f * (float)i / R);
    ds4_weight wom = oc_w("omega", DS4_TYPE_F32, 1, R / 2, 1, 1, om);
    float *sinks = oc_rand(RS_H, 2.0);
    ds4_weight ws = oc_w("sinks", DS4_TYPE_F32, 1, RS_H, 1, 1, sinks);
    float *q = oc_rand((size_t)n * RS_H * RS_D, 4.0), *kv = oc_rand((size_t)n * RS_D, 1.0);
    int32_t *sel = malloc(sizeof(int32_t) * (size_t)n * RS_TOPK);
    float *ring_h[NMAX], *comp_h[NMAX], *ring[2][NMAX];
    const float *comp[NMAX];
    for (int i = 0; i < n; i++) {
        const int64_t nv = ratio ? (pos[i] + 1) / ratio : 0, nc_all = nv + 1;
        ring_h[i] = oc_rand((size_t)RS_W * RS_D, 1.0);
        comp_h[i] = oc_rand((size_t)nc_all * RS_D, 1.0);
        int32_t *st = sel + (size_t)i * RS_TOPK; /* ascending ids: all visible ones, or every stride-th */
        const int64_t stride = nv > RS_TOPK ? nv / RS_TOPK : 1;
        for (int k = 0; k < RS_TOPK; k++) st[k] = k * stride < nv && k < nv ? (int32_t)(k * stride) : -1;
        comp[i] = oc_dev(comp_h[i], sizeof(float) * (size_t)nc_all * RS_D);
        for (int v = 0; v < 2; v++) ring[v][i] = oc_dev(ring_h[i], sizeof(float) * RS_W * RS_D);
    }
    float *dq = oc_dev(q, sizeof(float) * (size_t)n * RS_H * RS_D), *dkv = oc_dev(kv, sizeof(float) * (size_t)n * RS_D);
    int32_t *dsel = oc_dev(sel, sizeof(int32_t) * (size_t)n * RS_TOPK);
    float *dout[2];
    for (int v = 0; v < 2; v++) dout[v] = oc_dev(NULL, sizeof(float) * (size_t)n * RS_H * RS_D);
    const int32_t *use_sel = ratio == 4 ? dsel : NULL;
    for (int i = 0; i < n; i++)
        be->attention_out(be, dq + (size_t)i * RS_H * RS_D, 1, RS_H, RS_D, dkv + (size_t)i * RS_D, ring[0][i], RS_W,
                          pos[i], ratio ? comp[i] : NULL, ratio, use_sel ? use_sel + (size_t)i * RS_TOPK : NULL,
                          RS_TOPK, &ws, R, &wom, dout[0] + (size_t)i * RS_H * RS_D);
    be->attention_out_seqs(be, dq, n, RS_H, RS_D, dkv, ring[1], RS_W, pos, ratio ? comp : NULL, ratio, use_sel, RS_TOPK,
                           &ws, R, &wom, dout[1]);
    float *du = n >= 9 && rs_o_weights() && be->matmul_grouped_chain
                    ? oc_dev(NULL, sizeof(float) * (size_t)n * (RS_OCB + RS_ORB))
                    : NULL;
    float *dy = du ? du + (size_t)n * RS_OCB : NULL;
    if (du) /* at once: the combine's blocks hold */
        be->matmul_grouped_chain(be, &rs_o.wa, RS_OG, dout[1], n, du, &rs_o.wb, dy);
    EXPECT_MSG(rs_same_bits("attention_out_seqs out", dout[0], dout[1], (size_t)n * RS_H * RS_D), "ratio %d, %d sequences",
               ratio, n);
    if (du) {
        float *e = oc_dev(NULL, sizeof(float) * (RS_OCB + RS_ORB)), *ey = e + RS_OCB;
        int bad = 0;
        for (int i = 0; i < n; i++) {
            be->matmul_grouped(be, &rs_o.wa, RS_OG, dout[0] + (size_t)i * RS_H * RS_D, 1, e);
            be->matmul(be, &rs_o.wb, e, 1, ey);
            bad += !rs_same_bits("o_a of attention_out_seqs", du + (size_t)i * RS_OCB, e, RS_OCB);
            bad += !rs_same_bits("o_b of attention_out_seqs", dy + (size_t)i * RS_ORB, ey, RS_ORB);
        }
        EXPECT_MSG(bad == 0, "ratio %d: %d of %d sequences' o_a / o_b differ from their one-token products", ratio,
                   bad, n);
        be->free(be, e), be->free(be, du);
    }
    for (int i = 0; i < n; i++)
        EXPECT_MSG(rs_same_bits("attention_out_seqs ring", ring[0][i], ring[1][i], (size_t)RS_W * RS_D),
                   "ratio %d, sequence %d at %lld", ratio, i, (long long)pos[i]);
    for (int i = 0; i < n; i++) {
        be->free(be, (void *)comp[i]), be->free(be, ring[0][i]), be->free(be, ring[1][i]);
        free(ring_h[i]), free(comp_h[i]);
    }
    be->free(be, dq), be->free(be, dkv), be->free(be, dsel), be->free(be, dout[0]), be->free(be, dout[1]);
    free(q), free(kv), free(sel), free(sinks);
}

static void rs_attention_cases(ds4_backend *be);

static void test_attention_model_shapes_split(void)
{
    rs_attention_cases(rs_split);
    const char *fe = getenv("DS4_CUDA_FUSE"), *fa = getenv("DS4_CUDA_FUSE_ATTN");
    if ((fe && fe[0] == '0') || (fa && fa[0] == '0')) return;
    static const int64_t csa[] = {5000, 50, 2100, 777, 0}, hca[] = {40000, 127, 300, 5000}, win[] = {300, 10, 129};
    rs_attention_seqs_case(rs_split, 4, csa, 5);   /* CSA: selections, positions apart */
    rs_attention_seqs_case(rs_split, 128, hca, 4); /* HCA: every compressed row */
    rs_attention_seqs_case(rs_split, 0, win, 3);   /* window only */
    /* a batched step's 9-16 sequences: o_a takes the combine's blocks */
    static const int64_t csa12[] = {5000, 50, 2100, 777, 0, 3000, 131, 2047, 2048, 4100, 9000, 600},
                         hca16[] = {40000, 127, 300, 5000, 128, 129, 255, 256, 1000, 2000, 3000, 4000, 5001, 6000,
                                    7000, 8000};
    rs_attention_seqs_case(rs_split, 4, csa12, 12);
    rs_attention_seqs_case(rs_split, 128, hca16, 16);
}
static void test_attention_model_shapes_oneblock(void) { rs_attention_cases(rs_oneblock); }

/* The selection of T queries at pos0 (q on the host, dq its device copy)
 * over nk keys whose second half repeats the first (every key score
 * appears twice, so the k-th place falls inside ties): CUDA's ids against
 * the CPU backend's; returns how many differ. CUDA takes the queries in
 * `parts` calls, in row order (as a pass of several sequences does). */
static int rs_indexer_diff(ds4_backend *be, ds4_backend *cpu, const float *q, const float *dq, int T, int64_t pos0,
                           float *keys, int64_t nk, int parts)
{
    float *w = oc_rand((size_t)T * RS_IH, 1.0);
    for (int64_t s = nk / 2; s < nk; s++) memcpy(keys + s * RS_ID, keys + (s - nk / 2) * RS_ID, RS_ID * sizeof(float));
    int32_t *want = malloc(sizeof(int32_t) * (size_t)T * RS_TOPK), *got = malloc(sizeof(int32_t) * (size_t)T * RS_TOPK);
    cpu->indexer_topk(cpu, q, w, T, RS_IH, RS_ID, keys, pos0, 4, RS_TOPK, want);
    float *dw = oc_dev(w, sizeof(float) * T * RS_IH), *dk = oc_dev(keys, sizeof(float) * nk * RS_ID);
    int32_t *ds = oc_dev(NULL, sizeof(int32_t) * T * RS_TOPK);
    for (int p = 0; p < parts; p++) {
        const int t0 = T * p / parts, t1 = T * (p + 1) / parts;
        be->indexer_topk(be, dq + (size_t)t0 * RS_IH * RS_ID, dw + (size_t)t0 * RS_IH, t1 - t0, RS_IH, RS_ID, dk,
                         pos0 + t0, 4, RS_TOPK, ds + (size_t)t0 * RS_TOPK);
    }
    be->download(be, got, ds, sizeof(int32_t) * T * RS_TOPK);
    int bad = 0;
    for (int i = 0; i < T * RS_TOPK; i++)
        if (got[i] != want[i] && bad++ < 5) fprintf(stderr, "    sel[%d]: got %d want %d\n", i, got[i], want[i]);
    be->free(be, dw), be->free(be, dk), be->free(be, ds);
    free(w), free(want), free(got);
    return bad;
}

/* CUDA's selection equals the CPU backend's id for id (random rows: the
 * CUDA-core scores); classes > 0: key s is key s % classes, so every score
 * is one of `classes` values and the k-th place falls inside a tie of
 * thousands of keys */
static void rs_indexer_case_classes(ds4_backend *be, ds4_backend *cpu, int T, int64_t pos0, int classes)
{
    oc_be = be;
    const int64_t nk = (pos0 + T) / 4 + 1;
    float *q = oc_rand((size_t)T * RS_IH * RS_ID, 1.0), *keys = oc_rand((size_t)nk * RS_ID, 1.0);
    for (int64_t s = classes; classes > 0 && s < nk; s++)
        memcpy(keys + s * RS_ID, keys + (s % classes) * RS_ID, RS_ID * sizeof(float));
    float *dq = oc_dev(q, sizeof(float) * T * RS_IH * RS_ID);
    const int bad = rs_indexer_diff(be, cpu, q, dq, T, pos0, keys, nk, 1);
    EXPECT_MSG(bad == 0, "indexer T %d pos0 %lld (%d key classes): %d ids differ from the CPU's", T, (long long)pos0,
               classes, bad);
    be->free(be, dq);
    free(q), free(keys);
}
static void rs_indexer_case(ds4_backend *be, ds4_backend *cpu, int T, int64_t pos0)
{
    rs_indexer_case_classes(be, cpu, T, pos0, 0);
}

/* A prefill chunk in the official numerics: queries and keys through the
 * FP4 round trip (indexer_qat), so the tensor-core scores
 * (cuda_indexer_tc.cu) take the call; the selection equals the CPU's id
 * for id (keys repeat: ties at the k-th place). odd: some rows that the
 * exact integer form does not cover, which must take the CPU's float loop:
 * a block scaled by 2^12 (the pair bound fails), a query row of plain
 * floats, a key block scaled by 2^-70 (below the kept exponents). parts:
 * the rounded queries selected in that many calls. */
static void rs_indexer_qat_case(ds4_backend *be, ds4_backend *cpu, int T, int64_t pos0, int odd, int parts)
{
    oc_be = be;
    const int64_t nk = (pos0 + T) / 4 + 1, nq = (int64_t)T * RS_IH;
    float *q = oc_rand((size_t)nq * RS_ID, 1.0), *keys = oc_rand((size_t)nk * RS_ID, 1.0), *plain = oc_rand(RS_ID, 1.0);
    cpu->indexer_qat(cpu, keys, nk, RS_ID);
    float *dq = oc_dev(q, sizeof(float) * nq * RS_ID);
    be->indexer_qat(be, dq, nq, RS_ID);
    cpu->indexer_qat(cpu, q, nq, RS_ID);
    float *qd = oc_get(dq, (size_t)nq * RS_ID);
    EXPECT_MSG(memcmp(qd, q, sizeof(float) * (size_t)nq * RS_ID) == 0, "indexer_qat: CUDA rows differ from the CPU's");
    free(qd);
    if (odd) {
        for (int64_t r = 3; r < nq; r += 7)
            for (int i = 0; i < 32; i++) q[r * RS_ID + 32 * (r % 4) + i] *= 4096.0f;
        for (int64_t r = 5; r < nq; r += 97) memcpy(q + r * RS_ID, plain, sizeof(float) * RS_ID);
        for (int64_t s = 1; s < nk / 2; s += 13)
            for (int i = 0; i < 32; i++) keys[s * RS_ID + 32 * (s % 4) + i] *= 0x1p-70f;
        be->upload(be, dq, q, sizeof(float) * nq * RS_ID); /* the same rows the hint names */
    }
    const int bad = rs_indexer_diff(be, cpu, q, dq, T, pos0, keys, nk, parts);
    EXPECT_MSG(bad == 0, "indexer (FP4 rows%s, %d calls) T %d pos0 %lld: %d ids differ from the CPU's",
               odd ? ", odd rows" : "", parts, T, (long long)pos0, bad);
    be->free(be, dq);
    free(q), free(keys), free(plain);
}

/* indexer_topk_seqs (batched decode: one query per sequence, each with
 * its own keys and position) equals the CPU backend's selection of each
 * sequence alone, id for id (keys repeat, so the k-th place falls in a
 * tie); positions below, at and past the start of scoring, and more
 * sequences than one launch takes */
static void rs_indexer_seqs_case(ds4_backend *be, ds4_backend *cpu, int n)
{
    enum { NMAX = 20 };
    if (!be->indexer_topk_seqs) { /* only DS4_CUDA_STATE_SEQS=0 leaves it out */
        EXPECT(rs_state_seqs_off());
        return;
    }
    if (n > NMAX) return;
    oc_be = be;
    int64_t pos[NMAX];
    float *keys[NMAX];
    const float *dkeys[NMAX];
    float *q = oc_rand((size_t)n * RS_IH * RS_ID, 1.0), *w = oc_rand((size_t)n * RS_IH, 1.0);
    int32_t *want = malloc(sizeof(int32_t) * (size_t)n * RS_TOPK), *got = malloc(sizeof(int32_t) * (size_t)n * RS_TOPK);
    for (int i = 0; i < n; i++) {
        pos[i] = 2040 + 3 * i + (i % 3 == 2 ? 3000 * i : 0); /* 510 .. 513 keys, then far past top-k */
        const int64_t nk = (pos[i] + 1) / 4 + 1;
        keys[i] = oc_rand((size_t)nk * RS_ID, 1.0);
        for (int64_t s = nk / 2; s < nk; s++)
            memcpy(keys[i] + s * RS_ID, keys[i] + (s - nk / 2) * RS_ID, RS_ID * sizeof(float));
        cpu->indexer_topk(cpu, q + (size_t)i * RS_IH * RS_ID, w + (size_t)i * RS_IH, 1, RS_IH, RS_ID, keys[i], pos[i], 4,
                          RS_TOPK, want + (size_t)i * RS_TOPK);
        dkeys[i] = oc_dev(keys[i], sizeof(float) * nk * RS_ID);
    }
    float *dq = oc_dev(q, sizeof(float) * n * RS_IH * RS_ID), *dw = oc_dev(w, sizeof(float) * n * RS_IH);
    int32_t *ds = oc_dev(NULL, sizeof(int32_t) * n * RS_TOPK);
    be->indexer_topk_seqs(be, dq, dw, n, RS_IH, RS_ID, dkeys, pos, 4, RS_TOPK, ds);
    be->download(be, got, ds, sizeof(int32_t) * n * RS_TOPK);
    int bad = 0;
    for (int i = 0; i < n * RS_TOPK; i++)
        if (got[i] != want[i] && bad++ < 5)
            fprintf(stderr, "    sequence %d sel[%d]: got %d want %d\n", i / RS_TOPK, i % RS_TOPK, got[i], want[i]);
    EXPECT_MSG(bad == 0, "indexer_topk_seqs, %d sequences: %d ids differ from the CPU's", n, bad);
    for (int i = 0; i < n; i++) be->free(be, (void *)dkeys[i]), free(keys[i]);
    be->free(be, dq), be->free(be, dw), be->free(be, ds);
    free(q), free(w), free(want), free(got);
}

static void test_indexer_model_shapes(void)
{
    ds4_backend *cpu = ds4_backend_cpu_create(2);
    REQUIRE(cpu);
    rs_indexer_case(rs_split, cpu, 8, 2044);  /* 511 .. 513 keys: the step from all keys to a selection */
    rs_indexer_case(rs_split, cpu, 2, 8190);  /* 2047, 2048 keys */
    rs_indexer_case(rs_split, cpu, 1, 65535); /* 16384 keys (64K context) */
    /* one decode query: with DS4_CUDA_IS_NARROW=1 scored in blocks of 4
     * keys (513: 129 blocks, the last one key) and of 8 (2047: the last 7) */
    rs_indexer_case(rs_split, cpu, 1, 2051);
    rs_indexer_case(rs_split, cpu, 1, 8190);
    /* the selection's tiles of 16,384 keys (a thread's run of 16 in
     * registers): 8,192 keys (a 32K frontier: a run of 8), one key past a
     * tile, two whole tiles; and 8,192 keys of three scores (ties of
     * ~2,700 keys at the k-th place) */
    rs_indexer_case(rs_split, cpu, 1, 32767);
    rs_indexer_case(rs_split, cpu, 1, 65539);
    rs_indexer_case(rs_split, cpu, 1, 131071);
    rs_indexer_case_classes(rs_split, cpu, 1, 32767, 3);
    rs_indexer_qat_case(rs_split, cpu, 40, 2030, 0, 1); /* 512 .. 517 keys: most queries select all */
    rs_indexer_qat_case(rs_split, cpu, 64, 8100, 0, 1); /* 2025 .. 2041 keys: 16 key blocks, the last partial */
    rs_indexer_qat_case(rs_split, cpu, 37, 5003, 1, 1); /* the CPU's float loop for the odd rows */
    rs_indexer_qat_case(rs_split, cpu, 64, 6000, 1, 2); /* rounded rows selected in two calls of 32 */
    /* one decode query of rounded rows (with DS4_CUDA_IS_DEC_TC=1 the
     * tensor-core decode kernel, else the CUDA-core scores): 513 keys (the
     * last block one key), 8,192 (a 32K frontier), with odd rows (the
     * float loop, non-uniform rows), and 16,385 with odd rows */
    rs_indexer_qat_case(rs_split, cpu, 1, 2051, 0, 1);
    rs_indexer_qat_case(rs_split, cpu, 1, 32767, 0, 1);
    rs_indexer_qat_case(rs_split, cpu, 1, 32767, 1, 1);
    rs_indexer_qat_case(rs_split, cpu, 1, 65539, 1, 1);
    rs_indexer_seqs_case(rs_split, cpu, 5);
    rs_indexer_seqs_case(rs_split, cpu, 19);   /* two launches */
    rs_indexer_seqs_case(rs_oneblock, cpu, 4); /* the one-block kernel, sequence by sequence */
    cpu->destroy(cpu);
}
#endif

static void skip_all(void)
{
#if DS4_HAVE_CUDA
    test_skip("no CUDA device (cudaGetDeviceCount found none)");
#else
    test_skip(TEST_SKIP_NO_CUDA);
#endif
}

#if DS4_HAVE_CUDA
/* n floats at two device addresses, equal bit for bit */
static int rs_same_bits(const char *what, const float *da, const float *db, size_t n)
{
    float *a = oc_get(da, n), *b = oc_get(db, n);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(a + i, b + i, sizeof(float)) != 0 && bad++ == 0) first = i;
    if (bad) fprintf(stderr, "%s: %zu of %zu values differ (first at %zu: %.9g vs %.9g)\n", what, bad, n, first,
                     a[first], b[first]);
    free(a), free(b);
    return bad == 0;
}

/* compressor_push of a prefill (chunks: the chunk's windows in parallel,
 * cuda_ops_attention.cu) against the same tokens pushed one at a time (the
 * sequential kernel decode uses), bit for bit: the emitted rows and the
 * state left behind (buf, prev). The model's compressors: CSA (ratio 4,
 * overlapping windows, 512 wide), HCA (ratio 128, 512), the indexer's (4,
 * 128, QAT), with the KV rounding on; chunks cut across window ends. */
enum { CS_RR = 64 }; /* the compressor tests' RoPE width */

/* A compressor test's inputs at shape (r, od, overlap): n tokens' kv and
 * gate rows (host and device), ape, the norm, RoPE frequencies, the KV
 * rounding on (QAT for the indexer's). Used through its address only (the
 * weights point into it). */
typedef struct {
    int r, od, overlap, win, is_indexer;
    float *c, *z, *ape, *nw, *dc, *dz, om[CS_RR / 2];
    ds4_weight wa, wn, wo;
    ds4_kv_numerics nm;
} cs_fix;

static void cs_fix_init(cs_fix *f, int64_t n, int r, int od, int overlap, int is_indexer)
{
    f->r = r, f->od = od, f->overlap = overlap, f->is_indexer = is_indexer;
    f->win = overlap ? 2 * od : od;
    f->c = oc_rand((size_t)n * f->win, 2), f->z = oc_rand((size_t)n * f->win, 1);
    f->ape = oc_rand((size_t)r * f->win, 0.5), f->nw = oc_rand((size_t)od, 1);
    for (int i = 0; i < CS_RR / 2; i++) f->om[i] = powf(10000.0f, -2.0f * (float)i / CS_RR);
    f->wa = oc_w("ape", DS4_TYPE_F32, 2, f->win, r, 1, f->ape);
    f->wn = oc_w("n", DS4_TYPE_F32, 1, od, 1, 1, f->nw);
    f->wo = oc_w("om", DS4_TYPE_F32, 1, CS_RR / 2, 1, 1, f->om);
    f->dc = oc_dev(f->c, sizeof(float) * n * f->win), f->dz = oc_dev(f->z, sizeof(float) * n * f->win);
    f->nm = (ds4_kv_numerics){is_indexer ? 0 : 64, true, is_indexer != 0};
}

static void cs_fix_free(cs_fix *f)
{
    oc_be->free(oc_be, f->dc), oc_be->free(oc_be, f->dz);
    free(f->c), free(f->z), free(f->ape), free(f->nw);
}

/* T tokens of the inputs from token `from` pushed into e at position pos0. */
static void cs_push(const cs_fix *f, ds4_comp_state *e, int64_t from, int T, int64_t pos0)
{
    oc_be->compressor_push(oc_be, e, f->dc + (size_t)from * f->win, f->dz + (size_t)from * f->win, T, pos0, &f->wa,
                           &f->wn, 1e-6f, &f->wo, CS_RR, &f->nm, f->is_indexer != 0);
}

/* An empty state of f's shape with room for cap_rows rows (prev_z -inf,
 * as a session's state starts). */
static ds4_comp_state cs_state_new(const cs_fix *f, int64_t cap_rows)
{
    const int r = f->r, od = f->od, win = f->win;
    ds4_comp_state e = {r, od, f->overlap != 0, cap_rows, NULL, NULL, NULL, NULL, NULL};
    e.buf_c = oc_dev(NULL, sizeof(float) * r * win);
    e.buf_z = oc_dev(NULL, sizeof(float) * r * win);
    oc_be->fill(oc_be, e.buf_c, 0.0f, (size_t)r * win);
    oc_be->fill(oc_be, e.buf_z, 0.0f, (size_t)r * win);
    if (f->overlap) {
        e.prev_c = oc_dev(NULL, sizeof(float) * r * od);
        e.prev_z = oc_dev(NULL, sizeof(float) * r * od);
        oc_be->fill(oc_be, e.prev_c, 0.0f, (size_t)r * od);
        oc_be->fill(oc_be, e.prev_z, -INFINITY, (size_t)r * od);
    }
    e.rows = oc_dev(NULL, sizeof(float) * (size_t)cap_rows * od);
    oc_be->fill(oc_be, e.rows, 0.0f, (size_t)cap_rows * od);
    return e;
}

static void cs_state_free(ds4_comp_state *e)
{
    void *d[] = {e->buf_c, e->buf_z, e->prev_c, e->prev_z, e->rows};
    for (int i = 0; i < 5; i++)
        if (d[i]) oc_be->free(oc_be, d[i]);
}

/* Two states equal bit for bit: the first n_rows rows, buf, prev. */
static void cs_state_same(const cs_fix *f, const ds4_comp_state *a, const ds4_comp_state *b, int64_t n_rows,
                          const char *what, int64_t pos)
{
    const int r = f->r, od = f->od, win = f->win;
    EXPECT_MSG(rs_same_bits("compressor rows", a->rows, b->rows, (size_t)n_rows * od), "%s, ratio %d at %lld", what,
               r, (long long)pos);
    EXPECT_MSG(rs_same_bits("compressor buf_c", a->buf_c, b->buf_c, (size_t)r * win), "%s, ratio %d", what, r);
    EXPECT_MSG(rs_same_bits("compressor buf_z", a->buf_z, b->buf_z, (size_t)r * win), "%s, ratio %d", what, r);
    if (f->overlap) {
        EXPECT_MSG(rs_same_bits("compressor prev_c", a->prev_c, b->prev_c, (size_t)r * od), "%s, ratio %d", what, r);
        EXPECT_MSG(rs_same_bits("compressor prev_z", a->prev_z, b->prev_z, (size_t)r * od), "%s, ratio %d", what, r);
    }
}

static void compressor_chunks_same_bits(int r, int od, int overlap, int is_indexer)
{
    enum { N = 700 };
    cs_fix f;
    cs_fix_init(&f, N, r, od, overlap, is_indexer);
    ds4_comp_state st[2] = {cs_state_new(&f, N / r + 1), cs_state_new(&f, N / r + 1)};
    static const int cuts[] = {0, 1, 6, 130, 131, 259, 512, 640, 700}; /* the last chunk ends mid-window */
    for (int i = 0; i + 1 < 9; i++) cs_push(&f, &st[0], cuts[i], cuts[i + 1] - cuts[i], cuts[i]);
    for (int t = 0; t < N; t++) cs_push(&f, &st[1], t, 1, t);
    cs_state_same(&f, &st[0], &st[1], N / r, "chunks", N);
    cs_state_free(&st[0]), cs_state_free(&st[1]);
    cs_fix_free(&f);
}

/* compressor_push_seqs (batched decode: each sequence's one token into its
 * own state) against one compressor_push per sequence on twin states, bit
 * for bit: rows, buf, prev. The sequences stand at different positions
 * (pushed there in one chunk each first), so some complete a window in
 * the step and some do not; 18 sequences take two launches. */
static void compressor_seqs_same_bits(int r, int od, int overlap, int is_indexer)
{
    enum { N = 18 };
    if (!oc_be->compressor_push_seqs) { /* only DS4_CUDA_STATE_SEQS=0 leaves it out */
        EXPECT(rs_state_seqs_off());
        return;
    }
    int64_t pos[N], maxp = 0;
    for (int i = 0; i < N; i++) {
        pos[i] = (int64_t)r * (1 + i % 3) - 1 + (i % 2 ? 0 : i % 5); /* some at a window's last token */
        if (pos[i] > maxp) maxp = pos[i];
    }
    cs_fix f; /* the prefix tokens, then from maxp + 1 one row per sequence */
    cs_fix_init(&f, maxp + 1 + N, r, od, overlap, is_indexer);
    const float *dstep_c = f.dc + (size_t)(maxp + 1) * f.win, *dstep_z = f.dz + (size_t)(maxp + 1) * f.win;
    ds4_comp_state st[2][N];
    ds4_comp_state *seqs[N];
    for (int m = 0; m < 2; m++)
        for (int i = 0; i < N; i++) {
            st[m][i] = cs_state_new(&f, pos[i] / r + 2);
            /* sequence i's prefix: tokens i .. i + pos[i] - 1 of the inputs */
            if (pos[i] > 0) cs_push(&f, &st[m][i], i, (int)pos[i], 0);
            if (m == 1) seqs[i] = &st[m][i];
        }
    for (int i = 0; i < N; i++) cs_push(&f, &st[0][i], maxp + 1 + i, 1, pos[i]);
    oc_be->compressor_push_seqs(oc_be, seqs, dstep_c, dstep_z, N, pos, &f.wa, &f.wn, 1e-6f, &f.wo, CS_RR, &f.nm,
                                is_indexer != 0);
    for (int i = 0; i < N; i++) cs_state_same(&f, &st[0][i], &st[1][i], st[0][i].cap_rows, "seqs", pos[i]);
    for (int m = 0; m < 2; m++)
        for (int i = 0; i < N; i++) cs_state_free(&st[m][i]);
    cs_fix_free(&f);
}

static void test_compressor_chunks_model_shapes(void)
{
    oc_be = rs_split;
    compressor_chunks_same_bits(4, 512, 1, 0);   /* CSA */
    compressor_chunks_same_bits(128, 512, 0, 0); /* HCA */
    compressor_chunks_same_bits(4, 128, 1, 1);   /* the indexer's */
    compressor_seqs_same_bits(4, 512, 1, 0);
    compressor_seqs_same_bits(128, 512, 0, 0);
    compressor_seqs_same_bits(4, 128, 1, 1);
}

/* compress_two (the default; main asks for it whatever the caller's DS4_CUDA_COMP_TWO): a CSA
 * layer's compressor (ratio 4, 512 wide, overlapping windows, FP8 and f16
 * rounding) and its indexer's (128 wide, QAT) of one token, their four F16
 * products of the 4096-wide input in one launch and the two pushes in one,
 * against two matmul_pair and two compressor_push on twin states, bit for
 * bit: the products and the states (rows, buf, prev), six steps from
 * position 9 (two of them complete a window), then a 3-token chunk (the
 * ops). */
static void test_compress_two_same_bits(void)
{
    enum { D = 4096, R = 4, T0 = 9, STEPS = 6 };
    ds4_backend *be = rs_split;
    oc_be = be;
    if (!be->compress_two) {
        printf("  (no compress_two op)\n");
        return;
    }
    cs_fix f[2];
    cs_fix_init(&f[0], T0, R, 512, 1, 0);
    cs_fix_init(&f[1], T0, R, 128, 1, 1);
    const ds4_kv_numerics nm = {512 - CS_RR, true, true};
    ds4_weight kv[2], gate[2];
    void *hw[4];
    for (int k = 0; k < 2; k++) {
        const int64_t rows = f[k].win;
        for (int m = 0; m < 2; m++) {
            float *fw = oc_rand((size_t)rows * D, 0.05);
            hw[2 * k + m] = malloc((size_t)ds4_row_bytes(DS4_TYPE_F16, D) * rows);
            EXPECT(ds4_quantize_rows(DS4_TYPE_F16, fw, hw[2 * k + m], rows, D, NULL) == DS4_OK);
            free(fw);
        }
        kv[k] = oc_w("comp_kv", DS4_TYPE_F16, 2, D, rows, 1, hw[2 * k]);
        gate[k] = oc_w("comp_gate", DS4_TYPE_F16, 2, D, rows, 1, hw[2 * k + 1]);
        EXPECT(be->weight_prepare(be, &kv[k]) == DS4_OK && be->weight_prepare(be, &gate[k]) == DS4_OK);
    }
    float *xs = oc_rand((size_t)(STEPS + 3) * D, 1.0);
    float *dx = oc_dev(xs, sizeof(float) * (size_t)(STEPS + 3) * D);
    ds4_comp_state st[2][2]; /* [twin][kind] */
    float *dc[2][2], *dz[2][2];
    const int64_t cap = (T0 + STEPS + 3) / R + 2;
    for (int m = 0; m < 2; m++)
        for (int k = 0; k < 2; k++) {
            st[m][k] = cs_state_new(&f[k], cap);
            be->compressor_push(be, &st[m][k], f[k].dc, f[k].dz, T0, 0, &f[k].wa, &f[k].wn, 1e-6f, &f[0].wo, CS_RR,
                                &nm, k == 1);
            dc[m][k] = oc_dev(NULL, sizeof(float) * 3 * f[k].win);
            dz[m][k] = oc_dev(NULL, sizeof(float) * 3 * f[k].win);
        }
    const ds4_weight *const kvp[2] = {&kv[0], &kv[1]}, *const gp[2] = {&gate[0], &gate[1]};
    const ds4_weight *const ap[2] = {&f[0].wa, &f[1].wa}, *const np[2] = {&f[0].wn, &f[1].wn};
    float *const cp[2] = {dc[1][0], dc[1][1]}, *const zp[2] = {dz[1][0], dz[1][1]};
    ds4_comp_state *const sp[2] = {&st[1][0], &st[1][1]};
    for (int step = 0; step <= STEPS; step++) {
        const int T = step < STEPS ? 1 : 3;
        const int64_t pos = T0 + step;
        const float *x = dx + (size_t)step * D;
        for (int k = 0; k < 2; k++) {
            if (be->matmul_pair) {
                be->matmul_pair(be, &kv[k], &gate[k], x, T, dc[0][k], dz[0][k]);
            } else {
                be->matmul(be, &kv[k], x, T, dc[0][k]);
                be->matmul(be, &gate[k], x, T, dz[0][k]);
            }
            be->compressor_push(be, &st[0][k], dc[0][k], dz[0][k], T, pos, &f[k].wa, &f[k].wn, 1e-6f, &f[0].wo,
                                CS_RR, &nm, k == 1);
        }
        be->compress_two(be, kvp, gp, x, T, cp, zp, sp, pos, ap, np, 1e-6f, &f[0].wo, CS_RR, &nm);
        for (int k = 0; k < 2; k++) {
            char what[80];
            for (int g = 0; g < 2; g++) {
                snprintf(what, sizeof what, "compress_two %s %s, %d token%s at %lld", k ? "indexer" : "attention",
                         g ? "gate" : "kv", T, T > 1 ? "s" : "", (long long)pos);
                EXPECT(rs_same_bits(what, g ? dz[0][k] : dc[0][k], g ? dz[1][k] : dc[1][k], (size_t)T * f[k].win));
            }
            cs_state_same(&f[k], &st[0][k], &st[1][k], cap, k ? "compress_two, indexer" : "compress_two, attention",
                          pos);
        }
    }
    for (int m = 0; m < 2; m++)
        for (int k = 0; k < 2; k++) {
            cs_state_free(&st[m][k]);
            be->free(be, dc[m][k]), be->free(be, dz[m][k]);
        }
    be->free(be, dx);
    free(xs);
    for (int i = 0; i < 4; i++) free(hw[i]);
    cs_fix_free(&f[0]), cs_fix_free(&f[1]);
}

/* A site's 24 mixing rows of 4 x 4096 as a prepared weight: F32 (fn
 * itself) or (f16 = 1) F16 rounded into *fq (malloc'd; the caller frees
 * it); fnr, when given, receives the rows as the weight holds them. */
static ds4_weight site_fn(ds4_backend *be, const float *fn, int f16, void **fq, float *fnr)
{
    enum { HC = 4, D = 4096, NMIX = (2 + HC) * HC };
    ds4_weight w;
    if (f16) {
        *fq = malloc((size_t)ds4_row_bytes(DS4_TYPE_F16, HC * D) * NMIX);
        EXPECT(ds4_quantize_rows(DS4_TYPE_F16, fn, *fq, NMIX, HC * D, NULL) == DS4_OK);
        for (int r = 0; fnr && r < NMIX; r++)
            ds4_dequantize_row(DS4_TYPE_F16, (char *)*fq + (size_t)r * ds4_row_bytes(DS4_TYPE_F16, HC * D),
                               fnr + (size_t)r * HC * D, HC * D);
        w = oc_w("fn16", DS4_TYPE_F16, 2, HC * D, NMIX, 1, *fq);
    } else {
        if (fnr) memcpy(fnr, fn, sizeof(float) * NMIX * HC * D);
        w = oc_w("fn", DS4_TYPE_F32, 2, HC * D, NMIX, 1, fn);
    }
    EXPECT(be->weight_prepare(be, &w) == DS4_OK);
    return w;
}

/* hc_post_pre_norm at Flash's shape against hc_post then hc_pre_norm, bit
 * for bit (X, y, post, comb, a), with post_in / comb_in separate from post /
 * comb and the same memory (as the model calls it); the mixing rows F32 or
 * (f16 = 1) F16 as in the model files. The F16 site's y is also held to the
 * double-precision reference on the f16-rounded rows, through X after
 * hc_post (itself held to the reference by test_hc). */
static void hc_post_pre_norm_same_bits(ds4_backend *be, const float *X, const float *fn, const ds4_weight *wsc,
                                       const ds4_weight *wbs, const ds4_weight *wn, int f16)
{
    enum { T = 2, HC = 4, D = 4096, NMIX = (2 + HC) * HC };
    EXPECT(be->hc_post_pre_norm != NULL);
    if (!be->hc_post_pre_norm) return;
    float *fnr = malloc(sizeof(float) * NMIX * HC * D);
    void *fq = NULL;
    ds4_weight wfn = site_fn(be, fn, f16, &fq, fnr);
    float *F = oc_rand((size_t)T * D, 1), *po = oc_rand((size_t)T * HC, 1), *cm = oc_rand((size_t)T * HC * HC, 0.5);
    const size_t nx = (size_t)T * HC * D, ny = (size_t)T * D, np = (size_t)T * HC, nc = (size_t)T * HC * HC;
    float *dF = oc_dev(F, sizeof(float) * ny), *dpo = oc_dev(po, sizeof(float) * np), *dcm = oc_dev(cm, sizeof(float) * nc);
    float *dX[3], *dy[3], *dpost[3], *dcomb[3], *da[3];
    for (int i = 0; i < 3; i++) {
        dX[i] = oc_dev(X, sizeof(float) * nx);
        dy[i] = oc_dev(NULL, sizeof(float) * ny);
        dpost[i] = oc_dev(i == 2 ? po : NULL, sizeof(float) * np);
        dcomb[i] = oc_dev(i == 2 ? cm : NULL, sizeof(float) * nc);
        da[i] = oc_dev(NULL, sizeof(float) * ny);
    }
    be->hc_post(be, dX[0], T, HC, D, dF, dpo, dcm);
    be->hc_pre_norm(be, dX[0], T, HC, D, &wfn, wsc, wbs, 20, 1e-6f, 1e-6f, dy[0], dpost[0], dcomb[0], wn, 1e-6f, da[0]);
    be->hc_post_pre_norm(be, dX[1], T, HC, D, dF, dpo, dcm, &wfn, wsc, wbs, 20, 1e-6f, 1e-6f, dy[1], dpost[1], dcomb[1],
                         wn, 1e-6f, da[1]);
    be->hc_post_pre_norm(be, dX[2], T, HC, D, dF, dpost[2], dcomb[2], &wfn, wsc, wbs, 20, 1e-6f, 1e-6f, dy[2], dpost[2],
                         dcomb[2], wn, 1e-6f, da[2]);
    for (int i = 1; i < 3; i++) {
        EXPECT(rs_same_bits("hc_post_pre_norm X", dX[0], dX[i], nx));
        EXPECT(rs_same_bits("hc_post_pre_norm y", dy[0], dy[i], ny));
        EXPECT(rs_same_bits("hc_post_pre_norm post", dpost[0], dpost[i], np));
        EXPECT(rs_same_bits("hc_post_pre_norm comb", dcomb[0], dcomb[i], nc));
        EXPECT(rs_same_bits("hc_post_pre_norm a", da[0], da[i], ny));
    }
    float *X1 = oc_get(dX[0], nx), *y = oc_get(dy[0], ny);
    const float *sc = wsc->data, *bs = wbs->data;
    int bad = 0;
    for (int t = 0; t < T; t++) {
        double pre[HC], pst[HC], A[HC * HC], *yr = malloc(sizeof(double) * D);
        oc_ref_hc(X1 + (size_t)t * HC * D, HC, D, fnr, NMIX, sc, bs, 20, pre, pst, A, yr);
        for (int d = 0; d < D; d++) bad += oc_close("hc_post_pre_norm y", (size_t)d, y[t * D + d], yr[d], 1e-5);
        free(yr);
    }
    EXPECT_MSG(bad == 0, "%d y values of the site (%s rows) off the reference", bad, f16 ? "F16" : "F32");
    for (int i = 0; i < 3; i++) {
        be->free(be, dX[i]), be->free(be, dy[i]), be->free(be, dpost[i]), be->free(be, dcomb[i]);
        be->free(be, da[i]);
    }
    be->free(be, dF), be->free(be, dpo), be->free(be, dcm);
    free(X1), free(y), free(F), free(po), free(cm), free(fnr), free(fq);
}

/* A batch's hyper-connection site (hc_post_pre_norm over T = 3 tokens of
 * a batched step: two tokens share a cluster, the third has one to itself)
 * gives each token the bits of its own one-token call (one token a
 * cluster, the decode step's form): X, y, post, comb, a; then hc_pre_norm
 * (a site without hc_post, the first layer's) the same way. F16 and F32
 * mixing rows. With the defaults (DS4_CUDA_HCC_SPLIT=1) the one-token
 * calls take the 16-block form and the batch's the 8-block one, so this
 * holds the two forms to each other; with =2 the batch's clusters take 16
 * blocks too, with =0 the one-token calls 8. */
static void hc_site_tokens_same_bits(ds4_backend *be, const float *fn, const ds4_weight *wsc, const ds4_weight *wbs,
                                     const ds4_weight *wn, int f16)
{
    enum { T = 3, HC = 4, D = 4096, NMIX = (2 + HC) * HC };
    void *fq = NULL;
    ds4_weight wfn = site_fn(be, fn, f16, &fq, NULL);
    float *X = oc_rand((size_t)T * HC * D, 1), *F = oc_rand((size_t)T * D, 1), *po = oc_rand((size_t)T * HC, 1);
    float *cm = oc_rand((size_t)T * HC * HC, 0.5);
    const size_t nx = (size_t)T * HC * D, ny = (size_t)T * D, np = (size_t)T * HC, nc = (size_t)T * HC * HC;
    float *dF = oc_dev(F, sizeof(float) * ny), *dpo = oc_dev(po, sizeof(float) * np), *dcm = oc_dev(cm, sizeof(float) * nc);
    float *dX[2], *dy[2], *dpost[2], *dcomb[2], *da[2];
    for (int i = 0; i < 2; i++) {
        dX[i] = oc_dev(X, sizeof(float) * nx);
        dy[i] = oc_dev(NULL, sizeof(float) * ny);
        dpost[i] = oc_dev(NULL, sizeof(float) * np);
        dcomb[i] = oc_dev(NULL, sizeof(float) * nc);
        da[i] = oc_dev(NULL, sizeof(float) * ny);
    }
    be->hc_post_pre_norm(be, dX[0], T, HC, D, dF, dpo, dcm, &wfn, wsc, wbs, 20, 1e-6f, 1e-6f, dy[0], dpost[0], dcomb[0],
                         wn, 1e-6f, da[0]);
    for (int t = 0; t < T; t++)
        be->hc_post_pre_norm(be, dX[1] + (size_t)t * HC * D, 1, HC, D, dF + (size_t)t * D, dpo + (size_t)t * HC,
                             dcm + (size_t)t * HC * HC, &wfn, wsc, wbs, 20, 1e-6f, 1e-6f, dy[1] + (size_t)t * D,
                             dpost[1] + (size_t)t * HC, dcomb[1] + (size_t)t * HC * HC, wn, 1e-6f, da[1] + (size_t)t * D);
    EXPECT_MSG(rs_same_bits("site X", dX[0], dX[1], nx), "%s rows", f16 ? "F16" : "F32");
    EXPECT_MSG(rs_same_bits("site y", dy[0], dy[1], ny), "%s rows", f16 ? "F16" : "F32");
    EXPECT_MSG(rs_same_bits("site post", dpost[0], dpost[1], np), "%s rows", f16 ? "F16" : "F32");
    EXPECT_MSG(rs_same_bits("site comb", dcomb[0], dcomb[1], nc), "%s rows", f16 ? "F16" : "F32");
    EXPECT_MSG(rs_same_bits("site a", da[0], da[1], ny), "%s rows", f16 ? "F16" : "F32");
    be->hc_pre_norm(be, dX[0], T, HC, D, &wfn, wsc, wbs, 20, 1e-6f, 1e-6f, dy[0], dpost[0], dcomb[0], wn, 1e-6f, da[0]);
    for (int t = 0; t < T; t++)
        be->hc_pre_norm(be, dX[1] + (size_t)t * HC * D, 1, HC, D, &wfn, wsc, wbs, 20, 1e-6f, 1e-6f, dy[1] + (size_t)t * D,
                        dpost[1] + (size_t)t * HC, dcomb[1] + (size_t)t * HC * HC, wn, 1e-6f, da[1] + (size_t)t * D);
    EXPECT_MSG(rs_same_bits("pre site y", dy[0], dy[1], ny), "%s rows", f16 ? "F16" : "F32");
    EXPECT_MSG(rs_same_bits("pre site post", dpost[0], dpost[1], np), "%s rows", f16 ? "F16" : "F32");
    EXPECT_MSG(rs_same_bits("pre site comb", dcomb[0], dcomb[1], nc), "%s rows", f16 ? "F16" : "F32");
    EXPECT_MSG(rs_same_bits("pre site a", da[0], da[1], ny), "%s rows", f16 ? "F16" : "F32");
    for (int i = 0; i < 2; i++) {
        be->free(be, dX[i]), be->free(be, dy[i]), be->free(be, dpost[i]), be->free(be, dcomb[i]);
        be->free(be, da[i]);
    }
    be->free(be, dF), be->free(be, dpo), be->free(be, dcm);
    free(X), free(F), free(po), free(cm), free(fq);
}

/* The fused ops at Flash's shapes (D = 4096, 64 query heads of 512, n_rot
 * 64, the official KV rounding) give bit for bit what their separate ops
 * give, and hc_pre at D = 4096 (the register kernel) stays within the
 * contract's tolerance of the double-precision reference. */
static void test_fused_ops_model_shapes(void)
{
    enum { T = 2, HC = 4, D = 4096, NMIX = (2 + HC) * HC, H = 64, HD = 512, R = 64 };
    ds4_backend *be = rs_split;
    oc_be = be;
    const char *fe = getenv("DS4_CUDA_FUSE");
    const bool fused = !(fe && fe[0] == '0');
    EXPECT(fused == (be->hc_pre_norm != NULL && be->rmsnorm_rope != NULL && be->matmul_pair != NULL));
    if (!fused) printf("  (DS4_CUDA_FUSE=0: the fused ops are off; hc_pre at D 4096 against the reference only)\n");
    float *X = oc_rand((size_t)T * HC * D, 1), *fn = oc_rand((size_t)NMIX * HC * D, 0.02), *bs = oc_rand(NMIX, 0.5);
    float *nw = oc_rand(D, 1), sc[3] = {0.7f, 1.2f, 0.9f};
    ds4_weight wfn = oc_w("fn", DS4_TYPE_F32, 2, HC * D, NMIX, 1, fn), wsc = oc_w("sc", DS4_TYPE_F32, 1, 3, 1, 1, sc);
    ds4_weight wbs = oc_w("bs", DS4_TYPE_F32, 1, NMIX, 1, 1, bs), wn = oc_w("norm", DS4_TYPE_F32, 1, D, 1, 1, nw);
    float *dX = oc_dev(X, sizeof(float) * T * HC * D), *dv[8];
    const size_t nv[8] = {T * D, T * HC, T * HC * HC, T * D, T * D, T * HC, T * HC * HC, T * D};
    for (int i = 0; i < 8; i++) dv[i] = oc_dev(NULL, sizeof(float) * nv[i]);
    be->hc_pre(be, dX, T, HC, D, &wfn, &wsc, &wbs, 20, 1e-6f, 1e-6f, dv[0], dv[1], dv[2]);
    be->rmsnorm(be, dv[0], &wn, T, D, 1e-6f, dv[3]);
    if (fused) {
        be->hc_pre_norm(be, dX, T, HC, D, &wfn, &wsc, &wbs, 20, 1e-6f, 1e-6f, dv[4], dv[5], dv[6], &wn, 1e-6f, dv[7]);
        EXPECT(rs_same_bits("hc_pre_norm y", dv[0], dv[4], nv[0]));
        EXPECT(rs_same_bits("hc_pre_norm post", dv[1], dv[5], nv[1]));
        EXPECT(rs_same_bits("hc_pre_norm comb", dv[2], dv[6], nv[2]));
        EXPECT(rs_same_bits("hc_pre_norm a", dv[3], dv[7], nv[3]));
        hc_post_pre_norm_same_bits(be, X, fn, &wsc, &wbs, &wn, 0);
        hc_post_pre_norm_same_bits(be, X, fn, &wsc, &wbs, &wn, 1);
        hc_site_tokens_same_bits(be, fn, &wsc, &wbs, &wn, 0);
        hc_site_tokens_same_bits(be, fn, &wsc, &wbs, &wn, 1);
    }
    float *y = oc_get(dv[0], nv[0]), *comb = oc_get(dv[2], nv[2]);
    int bad = 0;
    for (int t = 0; t < T; t++) {
        double pre[HC], po[HC], A[HC * HC], *yr = malloc(sizeof(double) * D);
        oc_ref_hc(X + (size_t)t * HC * D, HC, D, fn, NMIX, sc, bs, 20, pre, po, A, yr);
        for (int d = 0; d < D; d++) bad += oc_close("hc_pre y (D 4096)", (size_t)d, y[t * D + d], yr[d], 1e-5);
        for (int k = 0; k < HC * HC; k++) bad += oc_close("comb (D 4096)", (size_t)k, comb[t * HC * HC + k], A[k], 1e-5);
        free(yr);
    }
    EXPECT_MSG(bad == 0, "%d hc values off at D 4096", bad);

    if (!fused) {
        for (int i = 0; i < 8; i++) be->free(be, dv[i]);
        be->free(be, dX);
        free(X), free(fn), free(bs), free(nw), free(y), free(comb);
        return;
    }
    float *q = oc_rand((size_t)T * H * HD, 3), *kv = oc_rand((size_t)T * HD, 3), *kw = oc_rand(HD, 1);
    float *om = malloc(sizeof(float) * R / 2);
    for (int i = 0; i < R / 2; i++) om[i] = powf(10000.0f, -2.0f * (float)i / R);
    ds4_weight wom = oc_w("omega", DS4_TYPE_F32, 1, R / 2, 1, 1, om), wkw = oc_w("kv_norm", DS4_TYPE_F32, 1, HD, 1, 1, kw);
    const ds4_kv_numerics nm = {448, true, false};
    float *dq[3], *dkv[3];
    for (int i = 0; i < 3; i++) {
        dq[i] = oc_dev(q, sizeof(float) * T * H * HD);
        dkv[i] = oc_dev(kv, sizeof(float) * T * HD);
    }
    const int64_t pos0 = 1000;
    be->rmsnorm(be, dq[0], NULL, (int64_t)T * H, HD, 1e-6f, dq[0]);
    be->rope(be, dq[0], T, H, HD, R, &wom, pos0, false);
    be->rmsnorm(be, dkv[0], &wkw, T, HD, 1e-6f, dkv[0]);
    be->rope(be, dkv[0], T, 1, HD, R, &wom, pos0, false);
    be->kv_round(be, dkv[0], T, HD, &nm);
    be->rmsnorm_rope(be, dq[1], NULL, T, H, HD, 1e-6f, R, &wom, pos0, NULL);
    be->rmsnorm_rope(be, dkv[1], &wkw, T, 1, HD, 1e-6f, R, &wom, pos0, &nm);
    EXPECT(rs_same_bits("rmsnorm_rope q", dq[0], dq[1], (size_t)T * H * HD));
    EXPECT(rs_same_bits("rmsnorm_rope kv", dkv[0], dkv[1], (size_t)T * HD));
    const char *fa = getenv("DS4_CUDA_FUSE_ATTN");
    EXPECT((be->rmsnorm_rope_qkv != NULL) == !(fa && fa[0] == '0'));
    if (be->rmsnorm_rope_qkv) { /* both in one op: the two calls' bits */
        be->rmsnorm_rope_qkv(be, dq[2], H, dkv[2], &wkw, T, HD, 1e-6f, R, &wom, pos0, &nm);
        EXPECT(rs_same_bits("rmsnorm_rope_qkv q", dq[1], dq[2], (size_t)T * H * HD));
        EXPECT(rs_same_bits("rmsnorm_rope_qkv kv", dkv[1], dkv[2], (size_t)T * HD));
    }
    EXPECT((be->rmsnorm_rope_qkv_seqs != NULL) == !(fa && fa[0] == '0'));
    if (be->rmsnorm_rope_qkv_seqs) { /* rows as sequences at their own positions: each one's own call's bits */
        const int64_t pos[T] = {1000, 37};
        float *sq[2], *skv[2];
        for (int v = 0; v < 2; v++) sq[v] = oc_dev(q, sizeof(float) * T * H * HD), skv[v] = oc_dev(kv, sizeof(float) * T * HD);
        for (int i = 0; i < T; i++)
            be->rmsnorm_rope_qkv(be, sq[0] + (size_t)i * H * HD, H, skv[0] + (size_t)i * HD, &wkw, 1, HD, 1e-6f, R, &wom,
                                 pos[i], &nm);
        be->rmsnorm_rope_qkv_seqs(be, sq[1], H, skv[1], &wkw, T, HD, 1e-6f, R, &wom, pos, &nm);
        EXPECT(rs_same_bits("rmsnorm_rope_qkv_seqs q", sq[0], sq[1], (size_t)T * H * HD));
        EXPECT(rs_same_bits("rmsnorm_rope_qkv_seqs kv", skv[0], skv[1], (size_t)T * HD));
        /* and the positions matter: row 1 at 37 differs from the chunk's row 1 at 1001 */
        float *a = oc_get(sq[1], (size_t)T * H * HD), *b = oc_get(dq[1], (size_t)T * H * HD);
        EXPECT(memcmp(a + (size_t)H * HD, b + (size_t)H * HD, sizeof(float) * H * HD) != 0);
        free(a), free(b);
        for (int v = 0; v < 2; v++) be->free(be, sq[v]), be->free(be, skv[v]);
    }

    /* matmul_pair: q_a and kv (Q8_0, 1024 and 512 rows of 4096), the
     * compressor's kv and gate (F16, 1024 rows each), one token (one
     * launch) and 12 (a batched step: Q8_0's x quantized once for both) */
    static const int pair_tokens[2] = {1, 12};
    for (int pi = 0; pi < 2; pi++) {
        enum { C = 4096 };
        const int nt = pair_tokens[pi];
        const int64_t r1s[2] = {1024, 1024}, r2s[2] = {512, 1024};
        const ds4_type ts[2] = {DS4_TYPE_Q8_0, DS4_TYPE_F16};
        float *x = oc_rand((size_t)nt * C, 2);
        float *dx = oc_dev(x, sizeof(float) * (size_t)nt * C);
        for (int c = 0; c < 2; c++) {
            const int64_t r1 = r1s[c], r2 = r2s[c];
            float *f1 = oc_rand((size_t)r1 * C, 0.1), *f2 = oc_rand((size_t)r2 * C, 0.1);
            void *q1 = malloc((size_t)ds4_row_bytes(ts[c], C) * r1), *q2 = malloc((size_t)ds4_row_bytes(ts[c], C) * r2);
            EXPECT(ds4_quantize_rows(ts[c], f1, q1, r1, C, NULL) == DS4_OK);
            EXPECT(ds4_quantize_rows(ts[c], f2, q2, r2, C, NULL) == DS4_OK);
            ds4_weight w1 = oc_w("pair1", ts[c], 2, C, r1, 1, q1), w2 = oc_w("pair2", ts[c], 2, C, r2, 1, q2);
            EXPECT(be->weight_prepare(be, &w1) == DS4_OK && be->weight_prepare(be, &w2) == DS4_OK);
            float *dy[4];
            for (int i = 0; i < 4; i++) dy[i] = oc_dev(NULL, sizeof(float) * (size_t)nt * (i % 2 ? r2 : r1));
            be->matmul(be, &w1, dx, nt, dy[0]);
            be->matmul(be, &w2, dx, nt, dy[1]);
            be->matmul_pair(be, &w1, &w2, dx, nt, dy[2], dy[3]);
            EXPECT(rs_same_bits(c ? "matmul_pair F16 y1" : "matmul_pair Q8_0 y1", dy[0], dy[2], (size_t)nt * r1));
            EXPECT(rs_same_bits(c ? "matmul_pair F16 y2" : "matmul_pair Q8_0 y2", dy[1], dy[3], (size_t)nt * r2));
            for (int i = 0; i < 4; i++) be->free(be, dy[i]);
            free(f1), free(f2), free(q1), free(q2);
        }
        be->free(be, dx);
        free(x);
    }

    /* rmsnorm_matmul (DS4_CUDA_QB_NORM, set by main): the q_a norm inside
     * q_b's product (Q8_0, rows of 1024) and the indexer's (F16), against
     * rmsnorm + matmul, bit for bit; one token takes the one launch, three
     * the two ops on a copy; x is left as it was either way */
    if (fused) {
        enum { QL = 1024, QR = 8192 };
        EXPECT_MSG(be->rmsnorm_matmul != NULL, "DS4_CUDA_QB_NORM=1 but the backend has no rmsnorm_matmul");
        float *nwt = oc_rand(QL, 1.0), *xq = oc_rand((size_t)3 * QL, 3.0);
        ds4_weight wn = oc_w("q_a_norm", DS4_TYPE_F32, 1, QL, 1, 1, nwt);
        EXPECT(be->weight_prepare(be, &wn) == DS4_OK);
        static const ds4_type nm_types[2] = {DS4_TYPE_Q8_0, DS4_TYPE_F16};
        for (int ti = 0; ti < 2 && be->rmsnorm_matmul; ti++) {
            float *f = oc_rand((size_t)QR * QL, 0.1);
            void *qw = malloc((size_t)ds4_row_bytes(nm_types[ti], QL) * QR);
            EXPECT(ds4_quantize_rows(nm_types[ti], f, qw, QR, QL, NULL) == DS4_OK);
            ds4_weight wq = oc_w(ti ? "idx_q_b" : "q_b", nm_types[ti], 2, QL, QR, 1, qw);
            EXPECT(be->weight_prepare(be, &wq) == DS4_OK);
            for (int nt = 1; nt <= 3; nt += 2) {
                float *xa = oc_dev(xq, sizeof(float) * (size_t)nt * QL), *xb = oc_dev(xq, sizeof(float) * (size_t)nt * QL);
                float *ya = oc_dev(NULL, sizeof(float) * (size_t)nt * QR), *yb = oc_dev(NULL, sizeof(float) * (size_t)nt * QR);
                be->rmsnorm(be, xa, &wn, nt, QL, 1e-6f, xa);
                be->matmul(be, &wq, xa, nt, ya);
                be->rmsnorm_matmul(be, xb, &wn, nt, QL, 1e-6f, &wq, yb);
                char what[64];
                snprintf(what, sizeof what, "rmsnorm_matmul %s, %d token%s", ti ? "F16" : "Q8_0", nt, nt > 1 ? "s" : "");
                EXPECT(rs_same_bits(what, ya, yb, (size_t)nt * QR));
                float *xk = oc_get(xb, (size_t)nt * QL);
                EXPECT_MSG(memcmp(xk, xq, sizeof(float) * (size_t)nt * QL) == 0, "%s: x was written", what);
                free(xk);
                be->free(be, xa), be->free(be, xb), be->free(be, ya), be->free(be, yb);
            }
            free(f), free(qw);
        }
        free(nwt), free(xq);
    }
    for (int i = 0; i < 8; i++) be->free(be, dv[i]);
    for (int i = 0; i < 3; i++) be->free(be, dq[i]), be->free(be, dkv[i]);
    be->free(be, dX);
    free(X), free(fn), free(bs), free(nw), free(y), free(comb), free(q), free(kv), free(kw), free(om);
}

/* query_rope (DS4_CUDA_QB_ROPE, on; main says so): q_b's product (Q8_0, Flash's
 * 32768 rows of 1024: 256 blocks of 128 rows, 64 heads of 512) with each
 * head's rmsnorm + RoPE done by the last of its four blocks (or, with
 * DS4_CUDA_QB_ROPE=2, by the four as a cluster), the kv row's (weight,
 * rounding) by an extra block, against rmsnorm_matmul and
 * rmsnorm_rope_qkv, bit for bit: one token (the one launch) three times
 * over at three positions, so a head counter left short of 0 would show
 * in the next call; with and without the kv rounding; two tokens (the two
 * ops). qr is left as it was. */
static void test_query_rope_same_bits(void)
{
    enum { QL = 1024, H = 64, HD = 512, QR = H * HD, R = 64 };
    ds4_backend *be = rs_split;
    oc_be = be;
    if (!be->query_rope || !be->rmsnorm_matmul || !be->rmsnorm_rope_qkv) {
        printf("  (no query_rope, rmsnorm_matmul or rmsnorm_rope_qkv op)\n");
        return;
    }
    float *nwt = oc_rand(QL, 1.0), *f = oc_rand((size_t)QR * QL, 0.1), *kw = oc_rand(HD, 1);
    float *xr = oc_rand((size_t)2 * QL, 3.0), *kv = oc_rand((size_t)2 * HD, 3);
    float *om = malloc(sizeof(float) * R / 2);
    for (int i = 0; i < R / 2; i++) om[i] = powf(160000.0f, -2.0f * (float)i / R);
    void *qw = malloc((size_t)ds4_row_bytes(DS4_TYPE_Q8_0, QL) * QR);
    EXPECT(ds4_quantize_rows(DS4_TYPE_Q8_0, f, qw, QR, QL, NULL) == DS4_OK);
    ds4_weight wn = oc_w("q_a_norm", DS4_TYPE_F32, 1, QL, 1, 1, nwt), wq = oc_w("q_b", DS4_TYPE_Q8_0, 2, QL, QR, 1, qw);
    ds4_weight wkw = oc_w("kv_norm", DS4_TYPE_F32, 1, HD, 1, 1, kw), wom = oc_w("omega", DS4_TYPE_F32, 1, R / 2, 1, 1, om);
    EXPECT(be->weight_prepare(be, &wn) == DS4_OK && be->weight_prepare(be, &wq) == DS4_OK);
    const ds4_kv_numerics nm = {448, true, false};
    static const int64_t positions[3] = {1000, 5, 70000};
    for (int call = 0; call < 4; call++) {
        const int nt = call < 3 ? 1 : 2;
        const int64_t pos0 = positions[call % 3];
        const ds4_kv_numerics *nmp = call == 1 ? NULL : &nm;
        float *dx = oc_dev(xr, sizeof(float) * (size_t)nt * QL);
        float *qa = oc_dev(NULL, sizeof(float) * (size_t)nt * QR), *qb = oc_dev(NULL, sizeof(float) * (size_t)nt * QR);
        float *ka = oc_dev(kv, sizeof(float) * (size_t)nt * HD), *kb = oc_dev(kv, sizeof(float) * (size_t)nt * HD);
        be->rmsnorm_matmul(be, dx, &wn, nt, QL, 1e-6f, &wq, qa);
        be->rmsnorm_rope_qkv(be, qa, H, ka, &wkw, nt, HD, 1e-6f, R, &wom, pos0, nmp);
        be->query_rope(be, dx, &wn, nt, QL, 1e-6f, &wq, qb, H, kb, &wkw, HD, R, &wom, pos0, nmp);
        char what[80];
        snprintf(what, sizeof what, "query_rope q, %d token%s at %lld%s", nt, nt > 1 ? "s" : "", (long long)pos0,
                 nmp ? ", rounded" : "");
        EXPECT(rs_same_bits(what, qa, qb, (size_t)nt * QR));
        snprintf(what, sizeof what, "query_rope kv, %d token%s at %lld%s", nt, nt > 1 ? "s" : "", (long long)pos0,
                 nmp ? ", rounded" : "");
        EXPECT(rs_same_bits(what, ka, kb, (size_t)nt * HD));
        float *xk = oc_get(dx, (size_t)nt * QL);
        EXPECT_MSG(memcmp(xk, xr, sizeof(float) * (size_t)nt * QL) == 0, "query_rope: qr was written");
        free(xk);
        be->free(be, dx), be->free(be, qa), be->free(be, qb), be->free(be, ka), be->free(be, kb);
    }
    free(nwt), free(f), free(kw), free(xr), free(kv), free(om), free(qw);
}

/* indexer_query_rope (the default; main asks for it unless the caller's DS4_CUDA_IDX_QROPE is 2, its
 * form of two blocks a head, which it then tests): the
 * indexer's q_b (F16, Flash's 8192 rows of 1024: 64 heads of 128, the
 * one-launch form's shape, test_cuda_kernels checks that it covers it)
 * with each head's RoPE and QAT done by the head's block, against
 * rmsnorm_matmul, rope and indexer_qat, bit for bit: one token (the one
 * launch) at four positions, one of them without the QAT; two tokens (the
 * ops). qr is left as it was. */
static void test_indexer_query_rope_same_bits(void)
{
    enum { QL = 1024, H = 64, HD = 128, QR = H * HD, R = 64 };
    ds4_backend *be = rs_split;
    oc_be = be;
    if (!be->indexer_query_rope || !be->rmsnorm_matmul) {
        printf("  (no indexer_query_rope or rmsnorm_matmul op)\n");
        return;
    }
    float *nwt = oc_rand(QL, 1.0), *f = oc_rand((size_t)QR * QL, 0.1), *xr = oc_rand((size_t)2 * QL, 3.0);
    float *om = malloc(sizeof(float) * R / 2);
    for (int i = 0; i < R / 2; i++) om[i] = powf(160000.0f, -2.0f * (float)i / R);
    void *hw = malloc((size_t)ds4_row_bytes(DS4_TYPE_F16, QL) * QR);
    EXPECT(ds4_quantize_rows(DS4_TYPE_F16, f, hw, QR, QL, NULL) == DS4_OK);
    ds4_weight wn = oc_w("q_a_norm", DS4_TYPE_F32, 1, QL, 1, 1, nwt), wq = oc_w("idx_q_b", DS4_TYPE_F16, 2, QL, QR, 1, hw);
    ds4_weight wom = oc_w("omega", DS4_TYPE_F32, 1, R / 2, 1, 1, om);
    EXPECT(be->weight_prepare(be, &wn) == DS4_OK && be->weight_prepare(be, &wq) == DS4_OK);
    static const int64_t positions[4] = {1000, 5, 70000, 123457};
    for (int call = 0; call < 5; call++) {
        const int nt = call < 4 ? 1 : 2;
        const int64_t pos0 = positions[call % 4];
        const bool qat = call != 1;
        float *dx = oc_dev(xr, sizeof(float) * (size_t)nt * QL);
        float *qa = oc_dev(NULL, sizeof(float) * (size_t)nt * QR), *qb = oc_dev(NULL, sizeof(float) * (size_t)nt * QR);
        be->rmsnorm_matmul(be, dx, &wn, nt, QL, 1e-6f, &wq, qa);
        be->rope(be, qa, nt, H, HD, R, &wom, pos0, false);
        if (qat) be->indexer_qat(be, qa, (int64_t)nt * H, HD);
        be->indexer_query_rope(be, dx, &wn, nt, QL, 1e-6f, &wq, qb, H, HD, R, &wom, pos0, qat);
        char what[80];
        snprintf(what, sizeof what, "indexer_query_rope, %d token%s at %lld%s", nt, nt > 1 ? "s" : "",
                 (long long)pos0, qat ? ", QAT" : "");
        EXPECT(rs_same_bits(what, qa, qb, (size_t)nt * QR));
        float *xk = oc_get(dx, (size_t)nt * QL);
        EXPECT_MSG(memcmp(xk, xr, sizeof(float) * (size_t)nt * QL) == 0, "indexer_query_rope: qr was written");
        free(xk);
        be->free(be, dx), be->free(be, qa), be->free(be, qb);
    }
    free(nwt), free(f), free(xr), free(om), free(hw);
}

/* side_begin .. side_end .. side_join (cuda_ops_side.cu): a float
 * product of the compressor's shape on the side stream beside a Q8_0
 * pair on the backend's stream, then an op that reads the side's output:
 * on the backend's stream after the join (even rounds) or in a second
 * side window before it (odd rounds); 20 rounds, the outputs refilled
 * with NaN before each, so a join that did not wait or a side window
 * out of order would show: every result bit for bit the in-order calls'. */
static void test_side_ops_same_bits(void)
{
    enum { C = 4096, RC = 1024, R1 = 1024, R2 = 512, T = 1 };
    ds4_backend *be = rs_split;
    oc_be = be;
    const char *se = getenv("DS4_CUDA_SIDE");
    const bool on = !(se && se[0] == '0');
    EXPECT(on == (be->side_begin != NULL && be->side_end != NULL && be->side_join != NULL));
    if (!on) {
        printf("  (DS4_CUDA_SIDE=0: no side ops; nothing more to check)\n");
        return;
    }
    float *x = oc_rand((size_t)T * C, 2), *fc = oc_rand((size_t)RC * C, 0.1), *f1 = oc_rand((size_t)R1 * C, 0.1),
          *f2 = oc_rand((size_t)R2 * C, 0.1), *nw = oc_rand(RC, 1);
    void *qc = malloc((size_t)ds4_row_bytes(DS4_TYPE_F16, C) * RC), *q1 = malloc((size_t)ds4_row_bytes(DS4_TYPE_Q8_0, C) * R1),
         *q2 = malloc((size_t)ds4_row_bytes(DS4_TYPE_Q8_0, C) * R2);
    EXPECT(ds4_quantize_rows(DS4_TYPE_F16, fc, qc, RC, C, NULL) == DS4_OK);
    EXPECT(ds4_quantize_rows(DS4_TYPE_Q8_0, f1, q1, R1, C, NULL) == DS4_OK);
    EXPECT(ds4_quantize_rows(DS4_TYPE_Q8_0, f2, q2, R2, C, NULL) == DS4_OK);
    ds4_weight wc = oc_w("comp", DS4_TYPE_F16, 2, C, RC, 1, qc), w1 = oc_w("q_a", DS4_TYPE_Q8_0, 2, C, R1, 1, q1),
               w2 = oc_w("kv", DS4_TYPE_Q8_0, 2, C, R2, 1, q2), wn = oc_w("norm", DS4_TYPE_F32, 1, RC, 1, 1, nw);
    EXPECT(be->weight_prepare(be, &wc) == DS4_OK && be->weight_prepare(be, &w1) == DS4_OK &&
           be->weight_prepare(be, &w2) == DS4_OK && be->weight_prepare(be, &wn) == DS4_OK);
    float *dx = oc_dev(x, sizeof(float) * T * C), *d[8];
    const size_t n[4] = {(size_t)T * RC, (size_t)T * R1, (size_t)T * R2, (size_t)T * RC};
    for (int i = 0; i < 8; i++) d[i] = oc_dev(NULL, sizeof(float) * n[i % 4]);
    /* in order: d[0..3] */
    be->matmul(be, &wc, dx, T, d[0]);
    be->matmul_pair(be, &w1, &w2, dx, T, d[1], d[2]);
    be->rmsnorm(be, d[0], &wn, T, RC, 1e-6f, d[3]);
    int bad = 0;
    for (int round = 0; round < 20; round++) {
        be->fill(be, d[4], NAN, n[0]);
        be->fill(be, d[7], NAN, n[3]);
        be->side_begin(be);
        be->matmul(be, &wc, dx, T, d[4]);
        be->side_end(be);
        be->matmul_pair(be, &w1, &w2, dx, T, d[5], d[6]);
        if (round % 2) { /* a second side window before the join: its op after the first's */
            be->side_begin(be);
            be->rmsnorm(be, d[4], &wn, T, RC, 1e-6f, d[7]);
            be->side_end(be);
            be->side_join(be);
        } else {
            be->side_join(be);
            be->rmsnorm(be, d[4], &wn, T, RC, 1e-6f, d[7]);
        }
        bad += !rs_same_bits("side: the side's product", d[0], d[4], n[0]);
        bad += !rs_same_bits("side: the pair beside it", d[1], d[5], n[1]) + !rs_same_bits("side: kv", d[2], d[6], n[2]);
        bad += !rs_same_bits("side: the norm after the join", d[3], d[7], n[3]);
        if (bad) break;
    }
    EXPECT_MSG(bad == 0, "side ops: %d results differ from the in-order calls", bad);
    for (int i = 0; i < 8; i++) be->free(be, d[i]);
    be->free(be, dx);
    free(x), free(fc), free(f1), free(f2), free(nw), free(qc), free(q1), free(q2);
}

/* A prefill chunk's hyper-connection site at Flash's shape (96 tokens: the
 * kernels of a site from 64 tokens on): hc_post's X bit for bit against
 * the expression in C (post_j * f, then fmaf over the source streams in
 * order: one rounding each, so any correct kernel gives these bits), then
 * hc_pre_norm's y, post, comb against the double-precision reference and a
 * against the reference norm of the kernel's own y. */
static void test_hc_site_prefill_model_shape(void)
{
    enum { T = 96, HC = 4, D = 4096, NMIX = (2 + HC) * HC };
    ds4_backend *be = rs_split;
    oc_be = be;
    float *X = oc_rand((size_t)T * HC * D, 1), *fn = oc_rand((size_t)NMIX * HC * D, 0.02), *bs = oc_rand(NMIX, 0.5);
    float *nw = oc_rand(D, 1), sc[3] = {0.7f, 1.2f, 0.9f};
    float *F = oc_rand((size_t)T * D, 1), *po = oc_rand((size_t)T * HC, 1), *cm = oc_rand((size_t)T * HC * HC, 0.5);
    ds4_weight wfn = oc_w("fn", DS4_TYPE_F32, 2, HC * D, NMIX, 1, fn), wsc = oc_w("sc", DS4_TYPE_F32, 1, 3, 1, 1, sc);
    ds4_weight wbs = oc_w("bs", DS4_TYPE_F32, 1, NMIX, 1, 1, bs), wn = oc_w("norm", DS4_TYPE_F32, 1, D, 1, 1, nw);
    EXPECT(be->weight_prepare(be, &wfn) == DS4_OK);
    const size_t nx = (size_t)T * HC * D, ny = (size_t)T * D;
    float *dX = oc_dev(X, sizeof(float) * nx), *dF = oc_dev(F, sizeof(float) * ny);
    float *dpo = oc_dev(po, sizeof(float) * T * HC), *dcm = oc_dev(cm, sizeof(float) * T * HC * HC);
    float *dy = oc_dev(NULL, sizeof(float) * ny), *da = oc_dev(NULL, sizeof(float) * ny);
    float *dpost = oc_dev(NULL, sizeof(float) * T * HC), *dcomb = oc_dev(NULL, sizeof(float) * T * HC * HC);
    be->hc_post(be, dX, T, HC, D, dF, dpo, dcm);
    float *X1 = oc_get(dX, nx);
    size_t off = 0;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < HC; j++)
            for (int d = 0; d < D; d++) {
                float v = po[t * HC + j] * F[(size_t)t * D + d];
                for (int k = 0; k < HC; k++) v = fmaf(cm[(t * HC + k) * HC + j], X[((size_t)t * HC + k) * D + d], v);
                const size_t i = ((size_t)t * HC + j) * D + d;
                uint32_t a, b;
                memcpy(&a, &v, 4), memcpy(&b, &X1[i], 4);
                if (a != b && !off) off = i + 1;
            }
    EXPECT_MSG(off == 0, "hc_post X[%zu] is not post_j * f + the fmaf chain's value", off ? off - 1 : 0);
    if (be->hc_pre_norm)
        be->hc_pre_norm(be, dX, T, HC, D, &wfn, &wsc, &wbs, 20, 1e-6f, 1e-6f, dy, dpost, dcomb, &wn, 1e-6f, da);
    else {
        be->hc_pre(be, dX, T, HC, D, &wfn, &wsc, &wbs, 20, 1e-6f, 1e-6f, dy, dpost, dcomb);
        be->rmsnorm(be, dy, &wn, T, D, 1e-6f, da);
    }
    float *y = oc_get(dy, ny), *a = oc_get(da, ny), *post = oc_get(dpost, (size_t)T * HC);
    float *comb = oc_get(dcomb, (size_t)T * HC * HC);
    int bad = 0;
    double *yr = malloc(sizeof(double) * D);
    for (int t = 0; t < T; t++) {
        double pre[HC], pr[HC], A[HC * HC], ss = 0.0;
        oc_ref_hc(X1 + (size_t)t * HC * D, HC, D, fn, NMIX, sc, bs, 20, pre, pr, A, yr);
        for (int d = 0; d < D; d++) bad += oc_close("prefill site y", (size_t)d, y[(size_t)t * D + d], yr[d], 1e-5);
        for (int i = 0; i < HC; i++) bad += oc_close("prefill site post", (size_t)i, post[t * HC + i], pr[i], 1e-5);
        for (int k = 0; k < HC * HC; k++) bad += oc_close("prefill site comb", (size_t)k, comb[t * HC * HC + k], A[k], 1e-5);
        for (int d = 0; d < D; d++) ss += (double)y[(size_t)t * D + d] * y[(size_t)t * D + d];
        const double rs = 1.0 / sqrt(ss / D + 1e-6);
        for (int d = 0; d < D; d++)
            bad += oc_close("prefill site a", (size_t)d, a[(size_t)t * D + d], y[(size_t)t * D + d] * rs * nw[d], 1e-5);
    }
    EXPECT_MSG(bad == 0, "%d values of the 96-token site off the reference", bad);
    be->free(be, dX), be->free(be, dF), be->free(be, dpo), be->free(be, dcm), be->free(be, dy), be->free(be, da);
    be->free(be, dpost), be->free(be, dcomb);
    free(X), free(fn), free(bs), free(nw), free(F), free(po), free(cm), free(X1), free(y), free(a), free(post), free(comb);
    free(yr);
}

/* sublayer_input (the site's Q8_0 blocks of a for the sublayer's products,
 * DS4_CUDA_Q8_HANDOFF_S=1, set in main; for 9-16 tokens in the tensor-core
 * products' fragment order, DS4_CUDA_Q8M_SITE, the default): one token's
 * and twelve tokens' hc_pre_norm at Flash's shape, then matmul_pair (q_a
 * and kv: Q8_0, 1024 and 512 rows of 4096) and a matmul (Q8_0, 1024 rows)
 * reading a, against the same ops without the announcement, bit for bit,
 * and each of the twelve tokens' product against its one-token product;
 * the norm weight's first 32 values 0 (a Q8_0 block of zeros). After the
 * release a is overwritten and a product of it must read the new values,
 * not the site's blocks. */
static void test_sublayer_input_same_bits(void)
{
    enum { HC = 4, D = 4096, NMIX = (2 + HC) * HC, R1 = 1024, R2 = 512 };
    ds4_backend *be = rs_split;
    oc_be = be;
    if (!be->sublayer_input || !be->hc_pre_norm || !be->matmul_pair) {
        printf("  (no sublayer_input, hc_pre_norm or matmul_pair op)\n");
        return;
    }
    float *fn = oc_rand((size_t)NMIX * HC * D, 0.02), *bs = oc_rand(NMIX, 0.5);
    float *nw = oc_rand(D, 1), sc[3] = {0.7f, 1.2f, 0.9f};
    for (int i = 0; i < 32; i++) nw[i] = 0.0f;
    ds4_weight wfn = oc_w("fn", DS4_TYPE_F32, 2, HC * D, NMIX, 1, fn), wsc = oc_w("sc", DS4_TYPE_F32, 1, 3, 1, 1, sc);
    ds4_weight wbs = oc_w("bs", DS4_TYPE_F32, 1, NMIX, 1, 1, bs), wn = oc_w("norm", DS4_TYPE_F32, 1, D, 1, 1, nw);
    const int64_t rows[3] = {R1, R2, R1};
    void *qw[3];
    ds4_weight w[3];
    for (int m = 0; m < 3; m++) {
        float *f = oc_rand((size_t)rows[m] * D, 0.1);
        qw[m] = malloc((size_t)ds4_row_bytes(DS4_TYPE_Q8_0, D) * rows[m]);
        EXPECT(ds4_quantize_rows(DS4_TYPE_Q8_0, f, qw[m], rows[m], D, NULL) == DS4_OK);
        w[m] = oc_w(m == 0 ? "q_a" : m == 1 ? "kv" : "w3", DS4_TYPE_Q8_0, 2, D, rows[m], 1, qw[m]);
        EXPECT(be->weight_prepare(be, &w[m]) == DS4_OK);
        free(f);
    }
    /* one token (Q8_0 blocks for the one-token products) and twelve (a
     * batched step's: the blocks in the tensor-core products' order) */
    const int nts[2] = {1, 12};
    for (int c = 0; c < 2; c++) {
        const int T = nts[c];
        float *X = oc_rand((size_t)T * HC * D, 1);
        float *dX = oc_dev(X, sizeof(float) * T * HC * D), *dy[2], *dpost[2], *dcomb[2], *da[2], *dq[2], *dk[2],
              *dm[2];
        for (int i = 0; i < 2; i++) {
            dy[i] = oc_dev(NULL, sizeof(float) * T * D), da[i] = oc_dev(NULL, sizeof(float) * T * D);
            dpost[i] = oc_dev(NULL, sizeof(float) * T * HC), dcomb[i] = oc_dev(NULL, sizeof(float) * T * HC * HC);
            dq[i] = oc_dev(NULL, sizeof(float) * T * R1), dk[i] = oc_dev(NULL, sizeof(float) * T * R2);
            dm[i] = oc_dev(NULL, sizeof(float) * T * R1);
        }
        for (int i = 0; i < 2; i++) { /* 0: the plain ops; 1: announced */
            if (i == 1) be->sublayer_input(be, da[1], T);
            be->hc_pre_norm(be, dX, T, HC, D, &wfn, &wsc, &wbs, 20, 1e-6f, 1e-6f, dy[i], dpost[i], dcomb[i], &wn,
                            1e-6f, da[i]);
            be->matmul_pair(be, &w[0], &w[1], da[i], T, dq[i], dk[i]);
            be->matmul(be, &w[2], da[i], T, dm[i]);
        }
        be->sublayer_input(be, NULL, 0);
        char what[64];
        snprintf(what, sizeof what, "T %d: sublayer_input a", T);
        EXPECT(rs_same_bits(what, da[0], da[1], (size_t)T * D));
        snprintf(what, sizeof what, "T %d: sublayer_input q_a", T);
        EXPECT(rs_same_bits(what, dq[0], dq[1], (size_t)T * R1));
        snprintf(what, sizeof what, "T %d: sublayer_input kv", T);
        EXPECT(rs_same_bits(what, dk[0], dk[1], (size_t)T * R2));
        snprintf(what, sizeof what, "T %d: sublayer_input w3", T);
        EXPECT(rs_same_bits(what, dm[0], dm[1], (size_t)T * R1));
        if (T > 1) { /* and each token's products its one-token ones */
            float *e = oc_dev(NULL, sizeof(float) * R1);
            int bad = 0;
            for (int t = 0; t < T; t++) {
                be->matmul(be, &w[2], da[0] + (size_t)t * D, 1, e);
                bad += !rs_same_bits("sublayer_input w3, one token", dm[1] + (size_t)t * R1, e, R1);
            }
            EXPECT_MSG(bad == 0, "T %d: %d tokens' products differ from their one-token product", T, bad);
            be->free(be, e);
        }
        /* released: a's new values are read as they are */
        float *m_old = oc_get(dm[1], (size_t)T * R1), *x2 = oc_rand((size_t)T * D, 1);
        be->upload(be, da[1], x2, sizeof(float) * T * D);
        be->upload(be, da[0], x2, sizeof(float) * T * D);
        be->matmul(be, &w[2], da[1], T, dm[1]);
        be->sublayer_input(be, da[0], T); /* announced, but no site writes it: nothing on offer */
        be->matmul(be, &w[2], da[0], T, dm[0]);
        be->sublayer_input(be, NULL, 0);
        snprintf(what, sizeof what, "T %d: released a", T);
        EXPECT(rs_same_bits(what, dm[0], dm[1], (size_t)T * R1));
        float *m_new = oc_get(dm[1], (size_t)T * R1);
        EXPECT(memcmp(m_new, m_old, sizeof(float) * T * R1) != 0); /* the new values gave other products */
        free(m_new), free(m_old), free(x2);
        for (int i = 0; i < 2; i++) {
            be->free(be, dy[i]), be->free(be, da[i]), be->free(be, dpost[i]), be->free(be, dcomb[i]);
            be->free(be, dq[i]), be->free(be, dk[i]), be->free(be, dm[i]);
        }
        be->free(be, dX);
        free(X);
    }
    for (int m = 0; m < 3; m++) free(qw[m]);
    free(fn), free(bs), free(nw);
}

/* matmul_grouped_chain (the attention's o_a then o_b: Q8_0, 8 groups of
 * 1024 rows of 4096, then 4096 rows of 8192) against matmul_grouped then
 * matmul, bit for bit: with the hand-off (the default; main keeps an
 * explicit DS4_CUDA_Q8_HANDOFF=0) o_a's kernel stores its outputs' Q8_0
 * blocks and o_b takes them instead of quantizing; one token (the
 * hand-off) and two (the plain ops). */
static void test_matmul_grouped_chain_same_bits(void)
{
    enum { G = RS_OG, CA = RS_OCA, RB = RS_ORB, CB = RS_OCB };
    ds4_backend *be = rs_split;
    if (!be->matmul_grouped_chain) {
        printf("  (no matmul_grouped_chain op)\n");
        return;
    }
    if (!rs_o_weights()) return;
    for (int nt = 1; nt <= 2; nt++) {
        /* one token: group 0's input zero (o_a's first 1024 outputs 0: Q8_0
         * blocks of zeros for the hand-off's quantizer) and a NaN in group
         * 1's input (as o_a's own quantizer takes it) */
        float *x = oc_rand((size_t)nt * G * CA, 1);
        if (nt == 1) {
            memset(x, 0, sizeof(float) * CA);
            x[CA + 5] = NAN;
        }
        float *dx = oc_dev(x, sizeof(float) * (size_t)nt * G * CA);
        float *du[2], *dy[2];
        for (int i = 0; i < 2; i++) {
            du[i] = oc_dev(NULL, sizeof(float) * (size_t)nt * CB);
            dy[i] = oc_dev(NULL, sizeof(float) * (size_t)nt * RB);
        }
        be->matmul_grouped(be, &rs_o.wa, G, dx, nt, du[0]);
        be->matmul(be, &rs_o.wb, du[0], nt, dy[0]);
        be->matmul_grouped_chain(be, &rs_o.wa, G, dx, nt, du[1], &rs_o.wb, dy[1]);
        EXPECT(rs_same_bits(nt == 1 ? "chain u, one token" : "chain u, two tokens", du[0], du[1], (size_t)nt * CB));
        EXPECT(rs_same_bits(nt == 1 ? "chain y, one token" : "chain y, two tokens", dy[0], dy[1], (size_t)nt * RB));
        /* the product is not constant: two tokens' rows differ */
        if (nt == 2) {
            float *y = oc_get(dy[0], (size_t)nt * RB);
            EXPECT(memcmp(y, y + RB, sizeof(float) * RB) != 0);
            free(y);
        }
        for (int i = 0; i < 2; i++) be->free(be, du[i]), be->free(be, dy[i]);
        be->free(be, dx);
        free(x);
    }
}

/* A batched step's q_a norm and the products after it (9-16 tokens, the
 * tensor-core products of cuda_q8split_mma.cu): the norm stores its rows'
 * Q8_0 blocks for the next product (ds4_cuda's q8m), which takes them
 * instead of quantizing; q_a and kv read one activation in one launch.
 * Each token's norm and products must be its own one-token ops', bit for
 * bit (the numbers the batch promises each session): q_b-shaped products
 * of 4096 rows (the streaming kernel) and 512 (the round-by-round one)
 * after the norm in place, as the model calls it; a norm whose rows are
 * then overwritten by an upload, so that its blocks no longer hold and
 * the product must quantize the new rows; the q_a / kv pair. */
static void test_batch_q8m_same_bits(void)
{
    enum { QL = 1024, D = 4096, RB = 4096, RS = 512, RA = 1024, RK = 512 };
    ds4_backend *be = rs_split;
    oc_be = be;
    const float eps = 1e-6f;
    float *fw[4] = {oc_rand((size_t)RB * QL, 0.05), oc_rand((size_t)RS * QL, 0.05), oc_rand((size_t)RA * D, 0.05),
                    oc_rand((size_t)RK * D, 0.05)};
    const int64_t rows[4] = {RB, RS, RA, RK}, cols[4] = {QL, QL, D, D};
    void *qw[4];
    ds4_weight w[4];
    for (int m = 0; m < 4; m++) {
        qw[m] = malloc((size_t)ds4_row_bytes(DS4_TYPE_Q8_0, cols[m]) * rows[m]);
        EXPECT(ds4_quantize_rows(DS4_TYPE_Q8_0, fw[m], qw[m], rows[m], cols[m], NULL) == DS4_OK);
        w[m] = oc_w(m < 2 ? "q_b" : m == 2 ? "q_a" : "kv", DS4_TYPE_Q8_0, 2, cols[m], rows[m], 1, qw[m]);
        EXPECT(be->weight_prepare(be, &w[m]) == DS4_OK);
    }
    float *nw = oc_rand(QL, 1.0);
    for (int i = 0; i < QL; i++) nw[i] += 1.5f;
    ds4_weight wn = oc_w("q_a_norm", DS4_TYPE_F32, 1, QL, 1, 1, nw);
    EXPECT(be->weight_prepare(be, &wn) == DS4_OK);
    const int nts[2] = {16, 11};
    for (int c = 0; c < 2; c++) {
        const int T = nts[c];
        float *x = oc_rand((size_t)T * QL, 3.0), *x2 = oc_rand((size_t)T * QL, 2.0), *xa = oc_rand((size_t)T * D, 1.0);
        float *dxn = oc_dev(x, sizeof(float) * T * QL), *dy = oc_dev(NULL, sizeof(float) * T * RB);
        float *dys = oc_dev(NULL, sizeof(float) * T * RS), *dxa = oc_dev(xa, sizeof(float) * T * D);
        float *dya = oc_dev(NULL, sizeof(float) * T * RA), *dyk = oc_dev(NULL, sizeof(float) * T * RK);
        float *d1 = oc_dev(NULL, sizeof(float) * QL), *e1 = oc_dev(NULL, sizeof(float) * RB);
        float *e2 = oc_dev(NULL, sizeof(float) * RA), *e3 = oc_dev(NULL, sizeof(float) * RK);
        float *dxo = oc_dev(x2, sizeof(float) * T * QL), *dyo = oc_dev(NULL, sizeof(float) * T * RB);
        /* the batch: the norm in place, then a product of its rows (one
         * norm for each of the two product shapes) */
        be->rmsnorm(be, dxn, &wn, T, QL, eps, dxn);
        be->matmul(be, &w[0], dxn, T, dy);
        float *dxs = oc_dev(x, sizeof(float) * T * QL);
        be->rmsnorm(be, dxs, &wn, T, QL, eps, dxs);
        be->matmul(be, &w[1], dxs, T, dys);
        /* a norm whose rows are replaced before the product */
        be->rmsnorm(be, dxo, &wn, T, QL, eps, dxo);
        be->upload(be, dxo, x, sizeof(float) * T * QL);
        be->matmul(be, &w[0], dxo, T, dyo);
        be->matmul_pair(be, &w[2], &w[3], dxa, T, dya, dyk);
        int bad = 0;
        for (int t = 0; t < T && bad < 4; t++) {
            char what[96];
            be->upload(be, d1, x + (size_t)t * QL, sizeof(float) * QL);
            be->rmsnorm(be, d1, &wn, 1, QL, eps, d1);
            snprintf(what, sizeof what, "T %d: token %d's norm", T, t);
            bad += !rs_same_bits(what, dxn + (size_t)t * QL, d1, QL);
            be->matmul(be, &w[0], d1, 1, e1);
            snprintf(what, sizeof what, "T %d: token %d's product of 4096 rows", T, t);
            bad += !rs_same_bits(what, dy + (size_t)t * RB, e1, RB);
            be->matmul(be, &w[1], d1, 1, e1);
            snprintf(what, sizeof what, "T %d: token %d's product of 512 rows", T, t);
            bad += !rs_same_bits(what, dys + (size_t)t * RS, e1, RS);
            /* the rows given after the norm, unnormalized */
            be->upload(be, d1, x + (size_t)t * QL, sizeof(float) * QL);
            be->matmul(be, &w[0], d1, 1, e1);
            snprintf(what, sizeof what, "T %d: token %d's product of rows uploaded after a norm", T, t);
            bad += !rs_same_bits(what, dyo + (size_t)t * RB, e1, RB);
            be->matmul(be, &w[2], dxa + (size_t)t * D, 1, e2);
            be->matmul(be, &w[3], dxa + (size_t)t * D, 1, e3);
            snprintf(what, sizeof what, "T %d: token %d's q_a of the pair", T, t);
            bad += !rs_same_bits(what, dya + (size_t)t * RA, e2, RA);
            snprintf(what, sizeof what, "T %d: token %d's kv of the pair", T, t);
            bad += !rs_same_bits(what, dyk + (size_t)t * RK, e3, RK);
        }
        EXPECT_MSG(bad == 0, "%d token outputs differ from their one-token ops' (T %d)", bad, T);
        /* the products are not constant: two tokens' rows differ */
        float *y = oc_get(dy, (size_t)2 * RB);
        EXPECT(memcmp(y, y + RB, sizeof(float) * RB) != 0);
        free(y);
        float *ps[] = {dxn, dy, dys, dxa, dya, dyk, d1, e1, e2, e3, dxo, dyo, dxs};
        for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) be->free(be, ps[i]);
        free(x), free(x2), free(xa);
    }
    /* qw and nw stay: the backend keys its copies of a weight by its host
     * bytes' address, which a later test's allocation could reuse */
    for (int m = 0; m < 4; m++) free(fw[m]);
}
#endif

int main(void)
{
#if !DS4_HAVE_CUDA
    (void)ops_contract_run; /* the contract runs on the CPU in test_ops.c */
#endif
#if DS4_HAVE_CUDA
    if (ds4_cuda_device_count() > 0) {
        /* the opt-in rmsnorm_matmul op is tested against the two ops here
         * (a switch read once a process; an explicit 0 is kept) */
        setenv("DS4_CUDA_QB_NORM", "1", 0);
        setenv("DS4_CUDA_Q8_HANDOFF", "1", 0); /* the default, said: the chain test's hand-off */
        setenv("DS4_CUDA_Q8_HANDOFF_A", "1", 0); /* the default, said: attention_out_project's hand-off */
        setenv("DS4_CUDA_Q8_HANDOFF_S", "1", 0); /* opt-in: sublayer_input's hand-off */
        setenv("DS4_CUDA_QB_ROPE", "1", 0);      /* the default, said: query_rope in one launch */
        const char *iq = getenv("DS4_CUDA_IDX_QROPE"); /* the default, asked for: indexer_query_rope in one */
        if (!iq || iq[0] != '2') setenv("DS4_CUDA_IDX_QROPE", "1", 1); /* launch; 2 (two blocks a head) is kept */
        setenv("DS4_CUDA_COMP_TWO", "1", 1);     /* the default, asked for: compress_two in two launches */
        ds4_backend *be = ds4_backend_cuda_create(0);
        if (!be) {
            fprintf(stderr, "cuda backend: %s\n", ds4_last_error());
            return 1;
        }
        printf("-- cuda backend\n");
        ops_contract_run(be);
        setenv("DS4_CUDA_ATTN", "0", 1);
        setenv("DS4_CUDA_INDEXER", "0", 1);
        rs_oneblock = ds4_backend_cuda_create(0);
        unsetenv("DS4_CUDA_ATTN");
        unsetenv("DS4_CUDA_INDEXER");
        if (!rs_oneblock) {
            fprintf(stderr, "cuda backend: %s\n", ds4_last_error());
            return 1;
        }
        rs_split = be;
        printf("-- model shapes\n");
        RUN(test_attention_model_shapes_split);
        RUN(test_attention_model_shapes_oneblock);
        RUN(test_indexer_model_shapes);
        RUN(test_fused_ops_model_shapes);
        RUN(test_query_rope_same_bits);
        RUN(test_indexer_query_rope_same_bits);
        RUN(test_compress_two_same_bits);
        RUN(test_side_ops_same_bits);
        RUN(test_hc_site_prefill_model_shape);
        RUN(test_compressor_chunks_model_shapes);
        RUN(test_matmul_grouped_chain_same_bits);
        RUN(test_sublayer_input_same_bits);
        RUN(test_batch_q8m_same_bits);
        rs_oneblock->destroy(rs_oneblock);
        be->destroy(be);
        free(rs_o.qa), free(rs_o.qb);
        return test_finish();
    }
#endif
    RUN(skip_all);
    return test_finish();
}

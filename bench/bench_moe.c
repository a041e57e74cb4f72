/*
 * bench_moe.c - `ds4-bench --kernels --tables moe`: one token's MoE
 * sublayer at Flash's shapes, the one-region op (`moe_shared`, both
 * routed and shared experts in one pool run) against the two ops it
 * replaces (`moe_experts` then `ffn_swiglu`, ~60 pool runs), interleaved
 * in one process so that load from other processes falls on both.
 *
 * The experts: E of Flash's (IQ2_XXS gate/up 2048 x 4096, Q2_K down
 * 4096 x 2048, Q8_0 shared expert), made of random bytes with valid
 * scales (every byte pattern is a valid block of these types), 32 by
 * default so the ~250 MiB of weights come from DRAM as in decode. Each
 * iteration routes the token to 6 random distinct experts and runs both
 * sides, in alternating order; it reports the medians and the median of
 * the per-iteration ratios, and checks that both sides gave the same
 * bits.
 */
#include "backend/ops.h"
#include "bench/bench.h"
#include "quant/quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t rng_state = 88172645463325252ull;
static uint64_t rng(void) { return ds4_bench_xorshift(&rng_state); }

/* nblk blocks of bsz random bytes, the f16 scale(s) at off set to small
 * normal values (two for Q2_K: d, dmin). */
static uint8_t *random_blocks(size_t nblk, size_t bsz, size_t off, int two)
{
    size_t bytes = nblk * bsz;
    uint8_t *p = malloc(bytes);
    if (!p) return NULL;
    for (size_t i = 0; i < bytes; i += 8) {
        uint64_t r = rng();
        memcpy(p + i, &r, bytes - i < 8 ? bytes - i : 8);
    }
    for (size_t b = 0; b < nblk; b++) {
        uint16_t h = (uint16_t)(0x2000 + (rng() & 0x3ff));
        memcpy(p + b * bsz + off, &h, 2);
        if (two) {
            h = (uint16_t)(0x1c00 + (rng() & 0x3ff));
            memcpy(p + b * bsz + off + 2, &h, 2);
        }
    }
    return p;
}

static ds4_weight weight(ds4_type t, int nd, int64_t a, int64_t b, int64_t c, const void *d)
{
    ds4_weight w = {"w", t, nd, {a, b, c, 1}, d, 0};
    w.nbytes = (uint64_t)(ds4_row_bytes(t, a) * b * c);
    return w;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int ds4_bench_moe_table(const ds4_bench_opts *o)
{
    const int E = 32, K = 6, N = 30 * o->reps;
    const int64_t D = 4096, F = 2048;
    /* block sizes: IQ2_XXS 66 (d first), Q2_K 84 (d, dmin last), Q8_0 34 */
    size_t giq = (size_t)(D / 256) * (size_t)F * E, dq2 = (size_t)(F / 256) * (size_t)D * E, s8 = (size_t)(D / 32) * F;
    uint8_t *g = random_blocks(giq, 66, 0, 0), *u = random_blocks(giq, 66, 0, 0), *d = random_blocks(dq2, 84, 80, 1);
    uint8_t *sg = random_blocks(s8, 34, 0, 0), *su = random_blocks(s8, 34, 0, 0), *sd = random_blocks(s8, 34, 0, 0);
    float *x = malloc(sizeof(float) * D), *oa = malloc(sizeof(float) * D), *ob = malloc(sizeof(float) * D);
    double *ta = malloc(sizeof(double) * N), *tb = malloc(sizeof(double) * N), *tr = malloc(sizeof(double) * N);
    ds4_backend *be = ds4_backend_cpu_create(o->threads);
    int rc = 1;
    if (!g || !u || !d || !sg || !su || !sd || !x || !oa || !ob || !ta || !tb || !tr || !be) {
        fprintf(stderr, "ds4-bench: out of memory for the moe table\n");
        goto out;
    }
    if (!be->moe_shared) {
        printf("\nmoe: the CPU backend has no one-region MoE op\n");
        rc = 0;
        goto out;
    }
    ds4_weight wg = weight(DS4_TYPE_IQ2_XXS, 3, D, F, E, g), wu = weight(DS4_TYPE_IQ2_XXS, 3, D, F, E, u);
    ds4_weight wd = weight(DS4_TYPE_Q2_K, 3, F, D, E, d);
    ds4_weight wsg = weight(DS4_TYPE_Q8_0, 2, D, F, 1, sg), wsu = weight(DS4_TYPE_Q8_0, 2, D, F, 1, su);
    ds4_weight wsd = weight(DS4_TYPE_Q8_0, 2, F, D, 1, sd);
    for (int64_t i = 0; i < D; i++) x[i] = (float)((int)(rng() % 2001) - 1000) * 1e-3f;
    int differ = 0;
    double sum_a = 0, sum_b = 0;
    for (int it = -10; it < N; it++) { /* 10 warm-up iterations */
        int32_t sel[6];
        float w[6];
        for (int j = 0; j < K; j++) {
            int fresh;
            do {
                sel[j] = (int32_t)(rng() % (uint64_t)E);
                fresh = 1;
                for (int q = 0; q < j; q++) fresh &= sel[q] != sel[j];
            } while (!fresh);
            w[j] = 0.1f + 0.01f * (float)j;
        }
        double a = 0, b = 0;
        for (int side = 0; side < 2; side++) {
            double t0 = ds4_bench_now_s();
            if ((side ^ (it & 1)) == 0) {
                be->moe_experts(be, &wg, &wu, &wd, x, 1, sel, w, K, 10.0f, oa, false);
                be->ffn_swiglu(be, &wsg, &wsu, &wsd, x, 1, 10.0f, oa, true);
                a = ds4_bench_now_s() - t0;
            } else {
                be->moe_shared(be, &wg, &wu, &wd, &wsg, &wsu, &wsd, x, 1, sel, w, K, 10.0f, ob);
                b = ds4_bench_now_s() - t0;
            }
        }
        differ += memcmp(oa, ob, sizeof(float) * (size_t)D) != 0;
        if (it < 0) continue;
        ta[it] = a, tb[it] = b, tr[it] = a / b;
        sum_a += a, sum_b += b;
    }
    qsort(ta, (size_t)N, sizeof(double), cmp_double);
    qsort(tb, (size_t)N, sizeof(double), cmp_double);
    qsort(tr, (size_t)N, sizeof(double), cmp_double);
    printf("\nmoe: one token's MoE sublayer, Flash shapes (6 of %d routed experts IQ2_XXS/Q2_K + the Q8_0\n"
           "shared expert), %d interleaved iterations, threads %d (0: all); ratio = op pair / one region\n\n",
           E, N, o->threads);
    printf("| op pair ms (median) | one region ms (median) | ratio, median per iteration (q1-q3) | ratio of the totals | outputs with other bits |\n");
    printf("| --- | --- | --- | --- | --- |\n");
    printf("| %.3f | %.3f | %.2fx (%.2f-%.2f) | %.2fx | %d of %d |\n", ta[N / 2] * 1e3, tb[N / 2] * 1e3, tr[N / 2],
           tr[N / 4], tr[3 * N / 4], sum_a / sum_b, differ, N + 10);
    rc = differ ? 1 : 0;
    if (differ) fprintf(stderr, "ds4-bench: moe: the one-region op gave other bits than the op pair\n");
out:
    if (be) be->destroy(be);
    free(g), free(u), free(d), free(sg), free(su), free(sd), free(x), free(oa), free(ob), free(ta), free(tb), free(tr);
    return rc;
}

/*
 * ops_cpu_moe.c - CPU ops for the mixture of experts: the router
 * (sqrt-softplus scores, hash or biased top-k selection, normalized
 * weights), the routed experts and the dense shared expert, both with the
 * clamped SwiGLU. Math: dsv4-model.md §3.7. With a streaming cache
 * attached (docs/STREAMING.md) the routed experts come from it instead of
 * the mapping, in the same order and through the same kernels.
 */
#include "backend/cpu/ops_cpu.h"

#include "backend/expert_cache.h"

#include <math.h>
#include <string.h>

#define MOE_MAX_K 64

static void op_moe_route(ds4_backend *be, const float *logits, int T, int n_expert, int k,
                         const ds4_weight *bias, const ds4_weight *tid2eid,
                         const int32_t *tokens, float scale, int32_t *sel, float *w)
{
    float *sc = cpu_scratch(be, 0, (size_t)n_expert * 2 * sizeof(float));
    float *key = sc + n_expert;
    const float *bv = bias ? bias->data : NULL;
    for (int t = 0; t < T; t++) {
        const float *lg = logits + (size_t)t * n_expert;
        for (int e = 0; e < n_expert; e++) {
            float x = lg[e];
            float sp = x > 20.0f ? x : log1pf(expf(x));
            sc[e] = sqrtf(sp);
            key[e] = bv ? sc[e] + bv[e] : sc[e];
        }
        int32_t *s = sel + (size_t)t * k;
        if (tid2eid) {
            const int32_t *row = (const int32_t *)tid2eid->data + (size_t)tokens[t] * tid2eid->ne[0];
            for (int j = 0; j < k; j++) s[j] = row[j];
        } else {
            /* top-k by key descending, ties by lower id (k is small) */
            for (int j = 0; j < k; j++) {
                int best = -1;
                for (int e = 0; e < n_expert; e++) {
                    int taken = 0;
                    for (int i = 0; i < j; i++) taken |= s[i] == e;
                    if (taken) continue;
                    if (best < 0 || key[e] > key[best]) best = e;
                }
                s[j] = best;
            }
        }
        float sum = 0;
        for (int j = 0; j < k; j++) sum += sc[s[j]];
        for (int j = 0; j < k; j++) w[(size_t)t * k + j] = sc[s[j]] / (sum + 1e-20f) * scale;
    }
}

/* h = silu(min(g, clamp)) * clamp(u, -clamp, clamp) */
static void swiglu_clamped(float *g, const float *u, int64_t n, float clamp)
{
    for (int64_t i = 0; i < n; i++) {
        float gv = g[i] > clamp ? clamp : g[i];
        float uv = u[i] > clamp ? clamp : (u[i] < -clamp ? -clamp : u[i]);
        g[i] = gv / (1.0f + expf(-gv)) * uv;
    }
}

/* One expert's clamped SwiGLU over the n tokens gathered for it, added
 * into their rows of out with their routing weights. */
static void run_expert(ds4_backend *be, const ds4_weight *gate, const ds4_weight *up, const ds4_weight *down,
                       const void *gp, const void *up_p, const void *dp, int n, const int32_t *toks,
                       const float *wt, const float *xs, float *g, float *u, float *y, float clamp, float *out)
{
    int64_t D = gate->ne[0], F = gate->ne[1];
    cpu_matmul_raw(be, gate->type, gp, F, D, xs, n, g);
    cpu_matmul_raw(be, up->type, up_p, F, D, xs, n, u);
    swiglu_clamped(g, u, (int64_t)n * F, clamp);
    cpu_matmul_raw(be, down->type, dp, D, F, g, n, y);
    for (int i = 0; i < n; i++) {
        float *o = out + (size_t)toks[i] * D;
        for (int64_t d = 0; d < D; d++) o[d] += wt[i] * y[(size_t)i * D + d];
    }
}

/* Reads ahead of the expert being computed (streaming): enough to keep an
 * SSD's queue busy during a prefill layer that needs most experts. */
#define STREAM_WINDOW 64

static void op_moe_experts(ds4_backend *be, const ds4_weight *gate, const ds4_weight *up,
                           const ds4_weight *down, const float *x, int T,
                           const int32_t *sel, const float *w, int k, float clamp,
                           float *out, bool accumulate)
{
    int64_t D = gate->ne[0], F = gate->ne[1], E = gate->ne[2];
    size_t gsz = cpu_row_bytes(gate->type, D) * (size_t)F;
    size_t usz = cpu_row_bytes(up->type, D) * (size_t)F;
    size_t dsz = cpu_row_bytes(down->type, F) * (size_t)D;
    /* scratch: token ids + weights, gathered x, g, u, y */
    size_t need = (size_t)T * (sizeof(int32_t) + sizeof(float)) +
                  (size_t)T * (size_t)(D + 2 * F + D) * sizeof(float);
    char *base = cpu_scratch(be, 0, need);
    int32_t *toks = (int32_t *)base;
    float *wt = (float *)(toks + T), *xs = wt + T, *g = xs + (size_t)T * D,
          *u = g + (size_t)T * F, *y = u + (size_t)T * F;
    /* the experts the chunk uses, ascending: results are summed in expert
     * order, whatever memory (mapping or streaming cache) holds them */
    int32_t *used = cpu_scratch(be, 1, (size_t)E * (sizeof(int32_t) + sizeof(int64_t)));
    int64_t *pin = (int64_t *)(used + E);
    memset(used, 0, (size_t)E * sizeof(int32_t));
    for (size_t i = 0; i < (size_t)T * (size_t)k; i++)
        if (sel[i] >= 0) used[sel[i]] = 1; /* < 0: another rank's expert (tensor parallel) */
    int nu = 0;
    for (int64_t e = 0; e < E; e++)
        if (used[e]) used[nu++] = (int32_t)e;
    if (!accumulate) memset(out, 0, (size_t)T * D * sizeof(float));

    ds4_expert_cache *xc = cpu_of(be)->experts;
    int layer = xc ? ds4_expert_cache_layer(xc, gate->data) : -1;
    if (layer >= 0) ds4_expert_cache_touch(xc, layer, used, nu);
    int head = 0; /* streaming: next expert to acquire */
    for (int ui = 0; ui < nu; ui++) {
        int32_t e = used[ui];
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < k; j++)
                if (sel[(size_t)t * k + j] == e) {
                    toks[n] = t;
                    wt[n] = w[(size_t)t * k + j];
                    memcpy(xs + (size_t)n * D, x + (size_t)t * D, (size_t)D * sizeof(float));
                    n++;
                }
        if (layer < 0) {
            run_expert(be, gate, up, down, (const char *)gate->data + e * gsz, (const char *)up->data + e * usz,
                       (const char *)down->data + e * dsz, n, toks, wt, xs, g, u, y, clamp, out);
            continue;
        }
        /* queue the reads of the next experts (misses go to the reader
         * threads in parallel) while this one is computed; block for a
         * slot only when holding none, so callers never wait on each other */
        while (head < nu && head - ui < STREAM_WINDOW) {
            int64_t s = ds4_expert_cache_acquire(xc, layer, used[head], head == ui);
            if (s < 0) break;
            pin[head++] = s;
        }
        const void *gp, *upp, *dp;
        ds4_expert_cache_wait(xc, pin[ui], &gp, &upp, &dp);
        run_expert(be, gate, up, down, gp, upp, dp, n, toks, wt, xs, g, u, y, clamp, out);
        ds4_expert_cache_release(xc, pin[ui]);
    }
}

static void cpu_set_expert_cache(ds4_backend *be, struct ds4_expert_cache *c) { cpu_of(be)->experts = c; }

static void op_ffn_swiglu(ds4_backend *be, const ds4_weight *gate, const ds4_weight *up,
                          const ds4_weight *down, const float *x, int T, float clamp,
                          float *out, bool accumulate)
{
    int64_t D = gate->ne[0], F = gate->ne[1];
    float *g = cpu_scratch(be, 0, (size_t)T * (size_t)(2 * F + D) * sizeof(float));
    float *u = g + (size_t)T * F, *y = u + (size_t)T * F;
    cpu_matmul_raw(be, gate->type, gate->data, F, D, x, T, g);
    cpu_matmul_raw(be, up->type, up->data, F, D, x, T, u);
    swiglu_clamped(g, u, (int64_t)T * F, clamp);
    cpu_matmul_raw(be, down->type, down->data, D, F, g, T, y);
    for (size_t i = 0; i < (size_t)T * D; i++) out[i] = accumulate ? out[i] + y[i] : y[i];
}

void cpu_install_moe(ds4_backend *be)
{
    be->moe_route = op_moe_route;
    be->moe_experts = op_moe_experts;
    be->ffn_swiglu = op_ffn_swiglu;
    be->set_expert_cache = cpu_set_expert_cache;
}

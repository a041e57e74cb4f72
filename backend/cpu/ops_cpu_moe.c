/*
 * ops_cpu_moe.c - CPU ops for the mixture of experts: the router
 * (sqrt-softplus scores, hash or biased top-k selection, normalized
 * weights), the routed experts and the dense shared expert, both with the
 * clamped SwiGLU. Math: dsv4-model.md §3.7. With a streaming cache
 * attached (docs/STREAMING.md) the routed experts come from it instead of
 * the mapping, in the same order and through the same kernels.
 */
#include "backend/cpu/ops_cpu.h"

#include "backend/cpu/cpu_matmul_kernels.h"
#include "backend/expert_cache.h"

#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MOE_RELAX() _mm_pause()
#else
#define MOE_RELAX() ((void)0)
#endif

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
    /* the experts the chunk uses, ascending: results are summed in expert
     * order, whatever memory (mapping or streaming cache) holds them */
    int32_t *used = cpu_scratch(be, 1, (size_t)E * (sizeof(int32_t) + sizeof(int64_t)));
    int64_t *pin = (int64_t *)(used + E);
    memset(used, 0, (size_t)E * sizeof(int32_t));
    for (size_t i = 0; i < (size_t)T * (size_t)k; i++)
        if (sel[i] >= 0) used[sel[i]]++; /* < 0: another rank's expert (tensor parallel) */
    /* rows of the busiest expert: T, or more where a token's selection
     * names an expert twice (a hash table may) */
    int nu = 0, maxn = 0;
    for (int64_t e = 0; e < E; e++)
        if (used[e]) {
            maxn = used[e] > maxn ? used[e] : maxn;
            used[nu++] = (int32_t)e;
        }
    /* scratch: token ids + weights, gathered x, g, u, y */
    size_t need = (size_t)maxn * (sizeof(int32_t) + sizeof(float)) +
                  (size_t)maxn * (size_t)(D + 2 * F + D) * sizeof(float);
    char *base = cpu_scratch(be, 0, need);
    int32_t *toks = (int32_t *)base;
    float *wt = (float *)(toks + maxn), *xs = wt + maxn, *g = xs + (size_t)maxn * D,
          *u = g + (size_t)maxn * F, *y = u + (size_t)maxn * F;
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

/* ---- decode (one token): routed + shared experts in one pool run -------
 *
 * One token's MoE is k + 1 small SwiGLUs (k routed experts and the shared
 * one, 2048 x 4096 each for Flash). Called as separate matmuls it is
 * 3 (k + 1) matmul calls of 2-3 pool runs each (activation conversion,
 * packing, rows): ~60 barriers per layer, each one a point where a thread
 * waits for the slowest. Here: the token is converted once per weight type
 * on the calling thread; one pool run does the rest. Its first tasks
 * compute every expert's gate and up rows in chunks (a chunk does the
 * SwiGLU of its rows at once); the task that finishes an expert's last
 * chunk converts its hidden vector for the down product (a few thousand
 * values) and marks it ready; the remaining tasks compute the down rows,
 * each waiting for its expert's mark. Tasks are claimed in index order,
 * so when a down task starts, every gate/up chunk of its expert has been
 * claimed by a running thread and the wait ends (in practice it almost
 * never waits: the k + 1 experts' down tasks come in the order their
 * gate/up chunks did). The products are ds4_cpu_mv_rows (the bits of
 * ds4_cpu_matmul with one token), the SwiGLU is the same function, and the
 * sums are made in the same order as op_moe_experts then op_ffn_swiglu
 * (experts ascending, then the shared one added), so the output has the
 * same bits as those two calls. */

static void op_ffn_swiglu(ds4_backend *be, const ds4_weight *gate, const ds4_weight *up,
                          const ds4_weight *down, const float *x, int T, float clamp,
                          float *out, bool accumulate);

#define MV_CHUNK 64 /* rows per task: ~64 tasks per expert pair, enough to balance 2-8 threads */

struct moe_mv {
    int n;                     /* matrices: k routed experts, then the shared one */
    const void *gw[MOE_MAX_K + 1], *uw[MOE_MAX_K + 1], *dw[MOE_MAX_K + 1];
    const ds4_mv_token *xg[MOE_MAX_K + 1], *xu[MOE_MAX_K + 1];
    ds4_mv_token hd[MOE_MAX_K + 1];
    int64_t F[MOE_MAX_K + 1], D;
    int64_t gu_chunks[MOE_MAX_K + 1], d_chunks; /* per matrix */
    int64_t ngu;                                /* gate/up tasks in all */
    ds4_type hd_type[MOE_MAX_K + 1];            /* down weights' types */
    uint8_t *hd_buf[MOE_MAX_K + 1];             /* where hd[e] is packed */
    atomic_int left[MOE_MAX_K + 1];             /* gate/up chunks of e not done */
    atomic_int ready[MOE_MAX_K + 1];            /* 1: hd[e] packed */
    float *g, *u, *y; /* [n][Fmax], [n][Fmax], [n][D] */
    int64_t Fmax;
    float clamp;
};

static void moe_mv_gate_up(struct moe_mv *m, int64_t i)
{
    int e = 0;
    while (i >= m->gu_chunks[e]) i -= m->gu_chunks[e++];
    int64_t r0 = i * MV_CHUNK, r1 = r0 + MV_CHUNK < m->F[e] ? r0 + MV_CHUNK : m->F[e];
    float *g = m->g + (size_t)e * m->Fmax, *u = m->u + (size_t)e * m->Fmax;
    ds4_cpu_mv_rows(m->xg[e], m->gw[e], r0, r1, g + r0);
    ds4_cpu_mv_rows(m->xu[e], m->uw[e], r0, r1, u + r0);
    swiglu_clamped(g + r0, u + r0, r1 - r0, m->clamp);
    /* the last chunk of e (acq_rel: it sees the other chunks' rows) packs
     * e's hidden vector for the down product and publishes it */
    if (atomic_fetch_sub_explicit(&m->left[e], 1, memory_order_acq_rel) == 1) {
        ds4_cpu_mv_pack(m->hd_type[e], m->F[e], g, m->hd_buf[e], &m->hd[e]);
        atomic_store_explicit(&m->ready[e], 1, memory_order_release);
    }
}

static void moe_mv_down(struct moe_mv *m, int64_t i)
{
    int e = (int)(i / m->d_chunks);
    int64_t r0 = (i % m->d_chunks) * MV_CHUNK, r1 = r0 + MV_CHUNK < m->D ? r0 + MV_CHUNK : m->D;
    /* e's gate/up chunks were all claimed before this task (claims go in
     * index order) and are running on other threads: wait for them,
     * yielding now and then in case those threads share this core */
    for (int s = 0; !atomic_load_explicit(&m->ready[e], memory_order_acquire); s++) {
        if (s % 64 == 63) sched_yield();
        else MOE_RELAX();
    }
    ds4_cpu_mv_rows(&m->hd[e], m->dw[e], r0, r1, m->y + (size_t)e * m->D + r0);
}

static void moe_mv_task(void *arg, int64_t i, int thread_index)
{
    (void)thread_index;
    struct moe_mv *m = arg;
    if (i < m->ngu) moe_mv_gate_up(m, i);
    else moe_mv_down(m, i - m->ngu);
}

/* Returns false (nothing done) where the fast path does not apply. */
static bool moe_decode_fused(ds4_backend *be, const ds4_weight *gate, const ds4_weight *up, const ds4_weight *down,
                             const ds4_weight *gsh, const ds4_weight *ush, const ds4_weight *dsh, const float *x,
                             const int32_t *sel, const float *w, int k, float clamp, float *out)
{
    cpu_backend *c = cpu_of(be);
    if (c->experts || k < 1 || k > MOE_MAX_K) return false;
    int64_t D = gate->ne[0], F = gate->ne[1], E = gate->ne[2], Fs = gsh->ne[1];
    if (up->ne[0] != D || up->ne[1] != F || down->ne[0] != F || down->ne[1] != D || gsh->ne[0] != D ||
        ush->ne[0] != D || ush->ne[1] != Fs || dsh->ne[0] != Fs || dsh->ne[1] != D)
        return false; /* (the loader checks these; a mismatch takes the general path) */
    for (int j = 0; j < k; j++)
        if (sel[j] < 0 || sel[j] >= E) return false;
    /* the token in the formats of the four input weight types, and the
     * hidden vectors for the two down types */
    const ds4_type in_ty[4] = {gate->type, up->type, gsh->type, ush->type};
    size_t xb[4], tot = 0;
    for (int t = 0; t < 4; t++) {
        xb[t] = ds4_cpu_mv_bytes(in_ty[t], D);
        if (!xb[t]) return false;
        tot += xb[t];
    }
    size_t hb = ds4_cpu_mv_bytes(down->type, F), hbs = ds4_cpu_mv_bytes(dsh->type, Fs);
    if (!hb || !hbs) return false;
    int n = k + 1;
    int64_t Fmax = F > Fs ? F : Fs;
    tot += (size_t)k * hb + hbs + 64 * 8;
    size_t fl = (size_t)n * (size_t)(2 * Fmax + D) * sizeof(float);
    uint8_t *buf = cpu_scratch(be, 1, tot + fl + 64);
    struct moe_mv *m = cpu_scratch(be, 0, sizeof(struct moe_mv));
    if (!buf || !m) return false;
    uint8_t *p = (uint8_t *)(((uintptr_t)buf + 63) & ~(uintptr_t)63);
    float *fbase = (float *)p;
    p += (fl + 63) & ~(size_t)63;
    m->n = n;
    m->D = D;
    m->Fmax = Fmax;
    m->clamp = clamp;
    m->g = fbase;
    m->u = m->g + (size_t)n * Fmax;
    m->y = m->u + (size_t)n * Fmax;
    ds4_mv_token xt[4];
    for (int t = 0; t < 4; t++) {
        ds4_cpu_mv_pack(in_ty[t], D, x, p, &xt[t]);
        p += (xb[t] + 63) & ~(size_t)63;
    }
    /* routed in op_moe_experts' order: experts ascending, a repeated
     * expert in slot order */
    int ord[MOE_MAX_K];
    for (int j = 0; j < k; j++) {
        int i = j;
        while (i > 0 && sel[ord[i - 1]] > sel[j]) {
            ord[i] = ord[i - 1];
            i--;
        }
        ord[i] = j;
    }
    size_t gsz = cpu_row_bytes(gate->type, D) * (size_t)F, usz = cpu_row_bytes(up->type, D) * (size_t)F;
    size_t dsz = cpu_row_bytes(down->type, F) * (size_t)D;
    int64_t ngu = 0;
    for (int e = 0; e < n; e++) {
        if (e < k) {
            int32_t id = sel[ord[e]];
            m->gw[e] = (const char *)gate->data + (size_t)id * gsz;
            m->uw[e] = (const char *)up->data + (size_t)id * usz;
            m->dw[e] = (const char *)down->data + (size_t)id * dsz;
            m->xg[e] = &xt[0];
            m->xu[e] = &xt[1];
            m->F[e] = F;
        } else {
            m->gw[e] = gsh->data;
            m->uw[e] = ush->data;
            m->dw[e] = dsh->data;
            m->xg[e] = &xt[2];
            m->xu[e] = &xt[3];
            m->F[e] = Fs;
        }
        m->gu_chunks[e] = (m->F[e] + MV_CHUNK - 1) / MV_CHUNK;
        ngu += m->gu_chunks[e];
    }
    m->d_chunks = (D + MV_CHUNK - 1) / MV_CHUNK;
    m->ngu = ngu;
    for (int e = 0; e < n; e++) {
        m->hd_type[e] = e < k ? down->type : dsh->type;
        m->hd_buf[e] = p;
        p += ((e < k ? hb : hbs) + 63) & ~(size_t)63;
        atomic_store_explicit(&m->left[e], (int)m->gu_chunks[e], memory_order_relaxed);
        atomic_store_explicit(&m->ready[e], 0, memory_order_relaxed);
    }
    be->stats.matmul_rows += (uint64_t)(2 * F + D) * (uint64_t)k + (uint64_t)(2 * Fs + D);
    cpu_parallel(be, ngu + (int64_t)n * m->d_chunks, moe_mv_task, m);
    /* out = sum of the routed experts (ascending), then + the shared one */
    memset(out, 0, (size_t)D * sizeof(float));
    for (int e = 0; e < k; e++) {
        const float *y = m->y + (size_t)e * D;
        float wt = w[ord[e]];
        for (int64_t d = 0; d < D; d++) out[d] += wt * y[d];
    }
    c->moe_fused_calls++;
    const float *ys = m->y + (size_t)k * D;
    for (int64_t d = 0; d < D; d++) out[d] = out[d] + ys[d];
    return true;
}

/* Routed experts, then the shared one added (the two ops above, in that
 * order); one token in one region where the kernels allow. */
static void op_moe_shared(ds4_backend *be, const ds4_weight *gate, const ds4_weight *up, const ds4_weight *down,
                          const ds4_weight *gsh, const ds4_weight *ush, const ds4_weight *dsh, const float *x, int T,
                          const int32_t *sel, const float *w, int k, float clamp, float *out)
{
    if (T == 1 && moe_decode_fused(be, gate, up, down, gsh, ush, dsh, x, sel, w, k, clamp, out)) return;
    op_moe_experts(be, gate, up, down, x, T, sel, w, k, clamp, out, false);
    op_ffn_swiglu(be, gsh, ush, dsh, x, T, clamp, out, true);
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
    be->moe_shared = op_moe_shared;
    be->set_expert_cache = cpu_set_expert_cache;
}

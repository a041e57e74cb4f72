/*
 * cuda_ops_moe.cu - CUDA ops for the mixture of experts: the router
 * (sqrt-softplus scores, hash or biased top-k, normalized weights), the
 * routed experts and the dense shared expert with the clamped SwiGLU.
 * Math: dsv4-model.md §3.7, as backend/cpu/ops_cpu_moe.c.
 *
 * Routing stays on the device: the expert ids written by moe_route are
 * read by the routed-MoE matvec kernel itself (cuda_matvec.cu), which
 * streams only the selected experts' weights; no host round trip. One
 * token's router (moe_router) is the float matvec whose last block picks
 * (cuda_fmv.cu); the pick's code is cuda_moe_route.cuh, shared with the
 * moe_route kernel.
 */
#include "backend/cuda/cuda_backend.cuh"
#include "backend/cuda/cuda_mmvq.cuh"
#include "backend/cuda/cuda_moe_route.cuh"
#include "backend/cuda/cuda_expert_cache.cuh" /* issue 14 */

/* The pick's keys in registers (cb_route_pick_reg; the same picks);
 * DS4_CUDA_ROUTE_REG=0: the shared-memory walk, for A/B */
static int cb_route_reg_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_ROUTE_REG", &on) ? 1 : 0;
}

/* One block per token (cb_moe_route_block, cuda_moe_route.cuh). */
__global__ void cb_moe_route_kernel(const float *logits, int n_expert, int k, const float *bias,
                                    const int32_t *tid2eid, int64_t tid_ld, const int32_t *tokens, float scale,
                                    int32_t *sel, float *w, int reg)
{
    const cb_route_args a = {bias, tid2eid, tid_ld, tokens, scale, n_expert, k, sel, w, reg};
    const float bias_own = cb_route_bias_own(a);
    ds4_pdl_enter();
    extern __shared__ float s_sc[]; /* sc[n_expert], key[n_expert] */
    cb_moe_route_block(logits, blockIdx.x, a, s_sc, bias_own);
}

static void op_moe_route(ds4_backend *be, const float *logits, int T, int n_expert, int k, const ds4_weight *bias,
                         const ds4_weight *tid2eid, const int32_t *tokens, float scale, int32_t *sel, float *w)
{
    cb_prof_scope prof_(be, "moe_route");
    const float *bd = bias ? (const float *)cb_weight(be, bias) : NULL;
    const int32_t *td = tid2eid ? (const int32_t *)cb_weight(be, tid2eid) : NULL;
    if ((bias && !bd) || (tid2eid && !td)) return;
    if (k < 1 || k > 64) {
        cb_fail_status(be, ds4_fail(DS4_ERR_UNSUPPORTED, "cuda moe_route: %d experts per token (at most 64)", k),
                       "moe_route");
        return;
    }
    CB_GRAPH_SKIP(be, 9, logits, T, n_expert, k, bd, td, tokens, scale, sel, w);
    ds4_launch(cb_moe_route_kernel, T, 256, (size_t)n_expert * 2 * sizeof(float), cb_stream(be),
        logits, n_expert, k, bd, td, tid2eid ? tid2eid->ne[0] : 0, tokens, scale, sel, w, cb_route_reg_on());
    cb_check_launch(be, "moe_route");
}

static bool cb_router_fuse_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_ROUTER_FUSE", &on);
}

/* The router's matvec and pick in one launch for one token
 * (ds4_cuda_fmv_route: the matvec's last block picks); otherwise, and with
 * DS4_CUDA_ROUTER_FUSE=0, the two ops. */
static void op_moe_router(ds4_backend *be, const ds4_weight *gate_inp, const float *x, int T, float *logits,
                          int n_expert, int k, const ds4_weight *bias, const ds4_weight *tid2eid,
                          const int32_t *tokens, float scale, int32_t *sel, float *w)
{
    cuda_backend *c = cb_of(be);
    const bool try_fused = T == 1 && cb_router_fuse_on() && gate_inp->n_dims == 2 && gate_inp->ne[1] == n_expert;
    const void *dw = try_fused ? cb_weight(be, gate_inp) : NULL;
    const float *bd = dw && bias ? (const float *)cb_weight(be, bias) : NULL;
    const int32_t *td = dw && tid2eid ? (const int32_t *)cb_weight(be, tid2eid) : NULL;
    const cb_route_args a = {bd, td, tid2eid ? tid2eid->ne[0] : 0, tokens, scale, n_expert, k, sel, w,
                             cb_route_reg_on()};
    if (!dw || (bias && !bd) || (tid2eid && !td) ||
        !ds4_cuda_fmv_route(c->cu, gate_inp->type, dw, n_expert, gate_inp->ne[0], x, logits, &a, c->ticket, 0,
                            NULL)) {
        be->matmul(be, gate_inp, x, T, logits);
        be->moe_route(be, logits, T, n_expert, k, bias, tid2eid, tokens, scale, sel, w);
        return;
    }
    cb_prof_scope prof_(be, "moe_router");
    be->stats.matmul_rows += (uint64_t)n_expert;
    /* a site's pending Sinkhorn, in an extra block beside the rows */
    const ds4_sink_job sj = cb_sink_take(be);
    CB_GRAPH_SKIP(be, 14, dw, gate_inp->ne[0], x, logits, n_expert, k, bd, td, tokens, scale, sel, w, sj.comb, sj.T);
    if (!ds4_cuda_fmv_route(c->cu, gate_inp->type, dw, n_expert, gate_inp->ne[0], x, logits, &a, c->ticket, 1, &sj))
        cb_fail_status(be, ds4_fail(DS4_ERR_BACKEND, "cuda moe_router: launch failed"), "moe_router");
}

/* g = silu(min(g, clamp)) * clamp(u, -clamp, clamp), in place on g */
__global__ void cb_swiglu_kernel(float *g, const float *u, int64_t n, float clamp)
{
    ds4_pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        g[i] = ds4_swiglu_clamped(g[i], u[i], clamp);
    }
}

/* Float experts of any width (the fast kernel needs widths % 32 == 0):
 * one thread per (slot, row); a bad id gives NaN. */
__global__ void cb_moe_generic_kernel(int type, const void *w, int64_t n_expert, int64_t rows, int64_t cols,
                                      const int32_t *ids, int64_t n_slots, int64_t x_share, const float *x,
                                      float *y)
{
    ds4_pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_slots * rows) return;
    const int64_t s = i / rows, r = i % rows;
    const int32_t e = ids[s];
    if (e < 0 || e >= n_expert) {
        y[i] = __int_as_float(0x7fc00000);
        return;
    }
    const int64_t base = ((int64_t)e * rows + r) * cols;
    const float *xs = x + (s / x_share) * cols;
    float acc = 0.f;
    for (int64_t c = 0; c < cols; c++) {
        float v;
        if (type == DS4_TYPE_F32) v = ((const float *)w)[base + c];
        else if (type == DS4_TYPE_F16) v = __half2float(__ushort_as_half(((const unsigned short *)w)[base + c]));
        else v = __uint_as_float((uint32_t)((const unsigned short *)w)[base + c] << 16);
        acc += v * xs[c];
    }
    y[i] = acc;
}

static ds4_status cb_moe_matvec(ds4_backend *be, ds4_type type, const void *w, int64_t n_expert, int64_t rows,
                                int64_t cols, const int32_t *ids, int64_t n_slots, int64_t x_share, const float *x,
                                float *y)
{
    const bool is_float = type == DS4_TYPE_F32 || type == DS4_TYPE_F16 || type == DS4_TYPE_BF16;
    if (is_float && (cols % 32 != 0 || (uintptr_t)x % 16 != 0)) {
        ds4_launch(cb_moe_generic_kernel, cb_blocks(n_slots * rows, 128), 128, 0, cb_stream(be),
            (int)type, w, n_expert, rows, cols, ids, n_slots, x_share, x, y);
        return cudaGetLastError() == cudaSuccess ? DS4_OK : ds4_fail(DS4_ERR_BACKEND, "cuda moe: launch failed");
    }
    return ds4_cuda_moe_matvec(cb_of(be)->cu, type, w, n_expert, rows, cols, ids, n_slots, x_share, x, y);
}

/* out[t, d] (+)= sum_j w[t, j] y[t*k + j, d] */
__global__ void cb_moe_combine_kernel(const float *y, const float *w, int T, int k, int64_t D, float *out,
                                      int accumulate)
{
    ds4_pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)T * D) return;
    const int64_t t = i / D, d = i % D;
    float s = accumulate ? out[i] : 0.f;
    for (int j = 0; j < k; j++) s += w[t * k + j] * y[(t * k + j) * D + d];
    out[i] = s;
}

__global__ void cb_add_kernel(float *out, const float *y, int64_t n, int accumulate)
{
    ds4_pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = accumulate ? out[i] + y[i] : y[i];
}

static bool cb_moe_grouped_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_MOE_GROUPED", &on);
}

static void op_moe_experts(ds4_backend *be, const ds4_weight *gate, const ds4_weight *up, const ds4_weight *down,
                           const float *x, int T, const int32_t *sel, const float *w, int k, float clamp, float *out,
                           bool accumulate)
{
    cb_prof_scope prof_(be, "moe_experts");
    /* issue 14: a layer served by the VRAM expert cache (cuda_expert_cache.cu) */
    const int xl = cb_xcache_layer(cb_of(be)->xc, gate->data);
    if (xl >= 0) {
        cb_xcache_moe(be, xl, gate, up, down, x, T, sel, w, k, clamp, out, accumulate);
        return;
    }
    const void *dg = cb_weight(be, gate), *du = cb_weight(be, up), *dd = cb_weight(be, down);
    if (!dg || !du || !dd) return;
    cb_moe_compute(be, gate, up, down, dg, du, dd, sel, gate->ne[2], sel, NULL, x, T, w, k, clamp, out, accumulate, T);
}

void cb_moe_compute(ds4_backend *be, const ds4_weight *gate, const ds4_weight *up, const ds4_weight *down,
                    const void *dg, const void *du, const void *dd, const int32_t *ids_addr, int64_t n_addr,
                    const int32_t *sel, const int32_t *slot_of, const float *x, int T, const float *w, int k,
                    float clamp, float *out, bool accumulate, int path_T)
{
    cuda_backend *c = cb_of(be);
    const int64_t D = gate->ne[0], F = gate->ne[1], E = gate->ne[2], slots = (int64_t)T * k;
    float *g = (float *)cb_scratch(be, 0, (size_t)slots * (size_t)(2 * F + D) * sizeof(float));
    if (!g) return;
    float *u = g + slots * F, *y = u + slots * F;
    be->stats.matmul_rows += (uint64_t)slots * (uint64_t)(2 * F + D);
    CB_GRAPH_SKIP(be, 10, dg, du, dd, g, x, T, sel, w, k, clamp, out, accumulate);
    /* Decode: the fused int8 kernels, gate+up+SwiGLU in one launch and down
     * + the weighted sum in another (plus the two activation quantizers).
     * With DS4_CUDA_MOE_GROUP_MIN=N (N <= 16), steps of N tokens or more
     * (a batch) take the grouped path below instead. */
    const int64_t gb = F * (int64_t)ds4_cuda_row_bytes(gate->type, D), db = D * (int64_t)ds4_cuda_row_bytes(down->type, F);
    if (path_T <= DS4_CUDA_MATVEC_MAX_TOK && path_T < c->moe_group_min && gate->type == up->type &&
        (uintptr_t)x % 16 == 0 && D % 4 == 0 && ds4_cuda_mmvq_active(gate->type, dg, D, gb) &&
        ds4_cuda_mmvq_active(up->type, du, D, gb) && ds4_cuda_mmvq_active(down->type, dd, F, db) && k <= 16) {
        ds4_status st = ds4_cuda_mmvq_swiglu(c->cu, gate->type, dg, du, F, D, ids_addr, n_addr, slots, k, x, clamp, g);
        if (st == DS4_OK)
            st = ds4_cuda_mmvq_down_slots(c->cu, down->type, dd, D, F, sel, slot_of, E, w, k, T, g, out, accumulate);
        if (st != DS4_OK) cb_fail_status(be, st, "moe_experts");
        return;
    }
    /* Prefill: the chunk's slots grouped by expert, each expert's rows read
     * once per group of its tokens (cuda_moe_grouped.cu: 64 on the tensor
     * cores, else 4); DS4_CUDA_MOE_GROUPED=0 keeps the slot-by-slot path
     * below. Not for the VRAM expert cache's
     * pools (slot_of), which keep theirs. */
    if (!slot_of && ids_addr == sel && cb_moe_grouped_on() && gate->type == up->type && (uintptr_t)x % 16 == 0 &&
        ds4_cuda_mmvq_active(gate->type, dg, D, gb) && ds4_cuda_mmvq_active(up->type, du, D, gb) &&
        ds4_cuda_mmvq_active(down->type, dd, F, db) && k <= 16 && E <= 1024) {
        const size_t need = ds4_cuda_moe_grouped_scratch(gate->type, down->type, D, F, E, T, k);
        void *scr = cb_scratch(be, 0, need);
        if (!scr) return;
        ds4_status st = ds4_cuda_moe_grouped(c->cu, gate->type, dg, du, down->type, dd, D, F, E, sel, w, T, k, x,
                                             clamp, out, accumulate ? 1 : 0, scr, need);
        if (st != DS4_OK) cb_fail_status(be, st, "moe_experts");
        return;
    }
    for (int64_t s0 = 0; s0 < slots; s0 += 65535 - 65535 % k) {
        const int64_t ns = slots - s0 < 65535 - 65535 % k ? slots - s0 : 65535 - 65535 % k;
        ds4_status st =
            cb_moe_matvec(be, gate->type, dg, n_addr, F, D, ids_addr + s0, ns, k, x + (s0 / k) * D, g + s0 * F);
        if (st == DS4_OK)
            st = cb_moe_matvec(be, up->type, du, n_addr, F, D, ids_addr + s0, ns, k, x + (s0 / k) * D, u + s0 * F);
        if (st != DS4_OK) {
            cb_fail_status(be, st, "moe_experts");
            return;
        }
    }
    ds4_launch(cb_swiglu_kernel, cb_blocks(slots * F, 256) > 8192 ? 8192 : cb_blocks(slots * F, 256), 256, 0, cb_stream(be), g, u, slots * F, clamp);
    for (int64_t s0 = 0; s0 < slots; s0 += 65535) {
        const int64_t ns = slots - s0 < 65535 ? slots - s0 : 65535;
        ds4_status st = cb_moe_matvec(be, down->type, dd, n_addr, D, F, ids_addr + s0, ns, 1, g + s0 * F, y + s0 * D);
        if (st != DS4_OK) {
            cb_fail_status(be, st, "moe_experts");
            return;
        }
    }
    ds4_launch(cb_moe_combine_kernel, cb_blocks((int64_t)T * D, 256), 256, 0, cb_stream(be), y, w, T, k, D, out,
                                                                                   accumulate ? 1 : 0);
    cb_check_launch(be, "moe_experts");
}

bool cb_ffn_decode_form(ds4_backend *be, const ds4_weight *gate, const ds4_weight *up, const ds4_weight *down,
                        const float *x, int T, const void **dg, const void **du, const void **dd)
{
    const int64_t D = gate->ne[0], F = gate->ne[1];
    *dg = cb_weight(be, gate), *du = cb_weight(be, up), *dd = cb_weight(be, down);
    return T <= DS4_CUDA_MATVEC_MAX_TOK && gate->type == up->type && (uintptr_t)x % 16 == 0 && D % 4 == 0 && *dg &&
           *du && *dd && ds4_cuda_mmvq_active(gate->type, *dg, D, 16) && ds4_cuda_mmvq_active(up->type, *du, D, 16) &&
           ds4_cuda_mmvq_active(down->type, *dd, F, 16);
}

static void op_ffn_swiglu(ds4_backend *be, const ds4_weight *gate, const ds4_weight *up, const ds4_weight *down,
                          const float *x, int T, float clamp, float *out, bool accumulate)
{
    cb_prof_scope prof_(be, "ffn_swiglu");
    const int64_t D = gate->ne[0], F = gate->ne[1];
    float *g = (float *)cb_scratch(be, 0, (size_t)T * (size_t)(2 * F + D) * sizeof(float));
    if (!g) return;
    float *u = g + (int64_t)T * F, *y = u + (int64_t)T * F;
    const void *dg, *du, *dd;
    if (cb_ffn_decode_form(be, gate, up, down, x, T, &dg, &du, &dd)) {
        /* decode: gate+up+SwiGLU in one launch, down + the add in another */
        be->stats.matmul_rows += (uint64_t)T * (uint64_t)(2 * F + D);
        CB_GRAPH_SKIP(be, 40, dg, du, dd, g, x, T, F, D, clamp, out, accumulate);
        ds4_status st = ds4_cuda_mmvq_swiglu(cb_of(be)->cu, gate->type, dg, du, F, D, NULL, 1, T, 1, x, clamp, g);
        if (st == DS4_OK) st = ds4_cuda_mmvq_down(cb_of(be)->cu, down->type, dd, D, F, NULL, 1, NULL, 1, T, g, out,
                                                  accumulate);
        cb_fail_status(be, st, "ffn_swiglu");
        return;
    }
    cb_matmul_raw(be, gate->type, dg, F, D, x, D, T, g, F);
    cb_matmul_raw(be, up->type, du, F, D, x, D, T, u, F);
    const bool dry = cb_graph_dry(be);
    cb_graph_note(be, 11, g, T, F, D, clamp, out, accumulate);
    if (!dry)
        ds4_launch(cb_swiglu_kernel, cb_blocks((int64_t)T * F, 256) > 8192 ? 8192 : cb_blocks((int64_t)T * F, 256), 256, 0, cb_stream(be), g, u, (int64_t)T * F, clamp);
    cb_matmul_raw(be, down->type, dd, D, F, g, F, T, y, D);
    if (dry) return;
    ds4_launch(cb_add_kernel, cb_blocks((int64_t)T * D, 256) > 8192 ? 8192 : cb_blocks((int64_t)T * D, 256), 256, 0, cb_stream(be), out, y, (int64_t)T * D, accumulate ? 1 : 0);
    cb_check_launch(be, "ffn_swiglu");
}

void cb_install_moe(ds4_backend *be)
{
    be->moe_route = op_moe_route;
    be->moe_experts = op_moe_experts;
    be->ffn_swiglu = op_ffn_swiglu;
    if (cb_fuse_on()) be->moe_router = op_moe_router;
}

/*
 * cuda_l2_prefetch.cu - the prefetch hint (backend/ops.h): weights the
 * forward reads next are moved into L2 while latency-bound kernels run.
 *
 * Why: a full-size decode layer spends ~50 of its ~170 us in kernels that
 * read almost nothing (the two hyper-connection sites, the attention, the
 * router's pick: docs/BENCHMARKS.md), and DRAM idles meanwhile; the weight
 * products after them (q_a + kv + q_b: 42 MB, o_a: 36 MB, the shared
 * expert: 27 MB) stream at 2-3 TB/s from DRAM. With their first tens of
 * megabytes already in L2 (50 MB on the H200) they start from there.
 *
 * How: a kernel of a few one-warp blocks, launched in stream order right
 * before the latency-bound ops. It first lets its successor launch
 * (griddepcontrol.launch_dependents), then each thread hands the copy
 * engine one `cp.async.bulk.prefetch.L2` of a 16 KB chunk (the copy
 * engine fetches it; the thread does not wait), then waits on its own
 * predecessor (griddepcontrol.wait) so that its completion, which its
 * successor waits for, still implies the predecessor's: the ops' order of
 * results is what it was. Weights only: read-only for the backend's life,
 * so reading them early cannot see a stale value. Q8_0 matrices are
 * prefetched in the split copy the decode kernels read (cuda_q8split.cu).
 * The bytes of one hint are capped at 3/4 of L2 (the earlier ranges
 * first), so a hint does not evict its own head. sm_90+ only (the bulk
 * prefetch); elsewhere the hint does nothing.
 * DS4_CUDA_L2PF=0: no hints (A/B runs); DS4_CUDA_L2PF_MB=n: cap n MB.
 */
#include "backend/cuda/cuda_backend.cuh"

#include <stdlib.h>

#define PF_MAX_RANGES 8
#define PF_CHUNK 16384u /* bytes per bulk prefetch */
#define PF_MAX_T 16     /* tokens of a step up to which hints are taken */

struct ds4_pf_params {
    const uint8_t *p[PF_MAX_RANGES];
    uint64_t bytes[PF_MAX_RANGES];
    uint32_t chunks[PF_MAX_RANGES];
    int n;
    uint32_t total; /* chunks of all ranges */
};

__global__ void __launch_bounds__(32) ds4_l2pf_kernel(const ds4_pf_params P)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    for (uint32_t c = blockIdx.x * 32u + threadIdx.x; c < P.total; c += gridDim.x * 32u) {
        uint32_t k = c;
        int r = 0;
        while (r + 1 < P.n && k >= P.chunks[r]) k -= P.chunks[r++];
        const uint64_t off = (uint64_t)k * PF_CHUNK, left = P.bytes[r] - off;
        const uint32_t n = left < PF_CHUNK ? (uint32_t)left : PF_CHUNK;
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(P.p[r] + off), "r"(n) : "memory");
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

extern "C" int ds4_cuda_pf_plan(const ds4_cuda_pf_range *in, int n, uint64_t budget, ds4_cuda_pf_range *out)
{
    int m = 0;
    for (int i = 0; i < n && m < DS4_CUDA_PF_MAX && budget >= 16; i++) {
        if (!in[i].p || in[i].bytes < 16) continue;
        /* whole 16-byte units inside the range (the instruction's rule) */
        const uintptr_t a = ((uintptr_t)in[i].p + 15u) & ~(uintptr_t)15u;
        const uintptr_t e = ((uintptr_t)in[i].p + (uintptr_t)in[i].bytes) & ~(uintptr_t)15u;
        if (e <= a) continue;
        uint64_t b = (uint64_t)(e - a);
        if (b > budget) b = budget & ~(uint64_t)15u;
        out[m].p = (const void *)a;
        out[m].bytes = b;
        budget -= b;
        m++;
    }
    return m;
}

static bool pf_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_L2PF", &on);
}

static uint64_t pf_budget(const ds4_cuda *cu)
{
    static long long mb = -2;
    if (mb == -2) {
        const char *e = getenv("DS4_CUDA_L2PF_MB");
        mb = e && atoll(e) > 0 ? atoll(e) : -1;
    }
    return mb > 0 ? (uint64_t)mb << 20 : (uint64_t)cu->l2_bytes / 4 * 3;
}

/* The device range a decode product of w reads: the split copy of a Q8_0
 * matrix when it has one, else the prepared copy itself. */
static ds4_cuda_pf_range pf_range(ds4_backend *be, const ds4_weight *w, const void *dev)
{
    ds4_cuda_pf_range r = {dev, cb_weight_bytes(w)};
    if (w->type == DS4_TYPE_Q8_0 && w->n_dims == 2) {
        int64_t rows = 0;
        const uint8_t *split = ds4_q8split_find(cb_of(be)->cu->device, dev, w->ne[1], w->ne[0], &rows);
        if (split) r = (ds4_cuda_pf_range){split, (uint64_t)rows * (uint64_t)w->ne[0] / 32u * 34u};
    }
    return r;
}

static void op_prefetch(ds4_backend *be, const ds4_weight *const *w, int n, int T)
{
    cuda_backend *c = cb_of(be);
    ds4_cuda *cu = c->cu;
    if (!pf_on() || cu->cc_major < 9 || T < 1 || T > PF_MAX_T || n < 1 || c->failed) return;
    if (n > PF_MAX_RANGES) n = PF_MAX_RANGES;
    cb_prof_scope prof_(be, "prefetch");
    const void *dev[PF_MAX_RANGES];
    uint64_t sig[2 + PF_MAX_RANGES] = {44, (uint64_t)n};
    for (int i = 0; i < n; i++) {
        dev[i] = cb_weight_resident(be, w[i]);
        sig[2 + i] = cb_sig_v(dev[i]);
    }
    if (c->g.mode != CB_STEP_NONE) cb_graph_note_v(be, sig, 2 + n);
    if (cb_graph_dry(be)) return;
    ds4_cuda_pf_range in[PF_MAX_RANGES], out[PF_MAX_RANGES];
    int m = 0;
    for (int i = 0; i < n; i++)
        if (dev[i]) in[m++] = pf_range(be, w[i], dev[i]);
    m = ds4_cuda_pf_plan(in, m, pf_budget(cu), out);
    if (m == 0) return;
    ds4_pf_params P;
    memset(&P, 0, sizeof P);
    uint64_t total = 0;
    for (int i = 0; i < m; i++) {
        P.p[i] = (const uint8_t *)out[i].p;
        P.bytes[i] = out[i].bytes;
        P.chunks[i] = (uint32_t)((out[i].bytes + PF_CHUNK - 1) / PF_CHUNK);
        total += P.chunks[i];
    }
    P.n = m;
    P.total = (uint32_t)total;
    /* a thread a chunk, spread over SMs so that many copy engines fetch */
    uint64_t blocks = (total + 31) / 32;
    if (blocks > (uint64_t)cu->n_sm) blocks = (uint64_t)cu->n_sm;
    ds4_launch(ds4_l2pf_kernel, dim3((unsigned)blocks), 32, 0, cu->stream, P);
    cb_check_launch(be, "prefetch");
}

/* One token's routed experts: their down matrices while the gate+up
 * kernel runs (it is bound by its instruction stream at ~1.3 TB/s, so
 * DRAM has room). The ids are the router's output, so this kernel waits
 * for its predecessor first, then lets its successor launch. */
__global__ void __launch_bounds__(32) ds4_l2pf_experts_kernel(const uint8_t *base, int64_t expert_bytes,
                                                              const int32_t *ids, const int32_t *slot_of,
                                                              int64_t n_expert, int k)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    ds4_pdl_enter();
    const uint32_t per = (uint32_t)((expert_bytes / 16 * 16 + PF_CHUNK - 1) / PF_CHUNK);
    for (uint32_t c = blockIdx.x * 32u + threadIdx.x; c < per * (uint32_t)k; c += gridDim.x * 32u) {
        const int32_t e = ids[c / per];
        if (e < 0 || e >= n_expert) continue;
        const int64_t slot = slot_of ? slot_of[e] : e, off = (int64_t)(c % per) * PF_CHUNK;
        const int64_t left = expert_bytes / 16 * 16 - off;
        const uint32_t n = left < (int64_t)PF_CHUNK ? (uint32_t)left : PF_CHUNK;
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + slot * expert_bytes + off), "r"(n)
                     : "memory");
    }
#endif
}

static bool pf_experts_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_L2PF_EXP", &on);
}

extern "C" void ds4_cuda_l2pf_experts(ds4_cuda *cu, const void *d_down, int64_t expert_bytes, const int32_t *d_ids,
                                      const int32_t *d_slot_of, int64_t n_expert, int k)
{
    if (!pf_on() || !pf_experts_on() || cu->cc_major < 9 || k < 1 || expert_bytes < 16 ||
        ((uintptr_t)d_down | (uintptr_t)expert_bytes) % 16 != 0)
        return;
    if ((uint64_t)expert_bytes * (uint64_t)k > pf_budget(cu)) return;
    const uint64_t chunks = ((uint64_t)expert_bytes + PF_CHUNK - 1) / PF_CHUNK * (uint64_t)k;
    uint64_t blocks = (chunks + 31) / 32;
    if (blocks > (uint64_t)cu->n_sm) blocks = (uint64_t)cu->n_sm;
    ds4_launch(ds4_l2pf_experts_kernel, dim3((unsigned)blocks), 32, 0, cu->stream, (const uint8_t *)d_down,
               expert_bytes, d_ids, d_slot_of, n_expert, k);
}

void cb_install_prefetch(ds4_backend *be) { be->prefetch = op_prefetch; }

/*
 * cuda_moe_route.cuh - the router's pick of one token (ops.h moe_route:
 * sqrt-softplus scores, top-k of score + bias or the hash table's ids,
 * weights normalized over the picks), as a device function a whole block
 * runs: the moe_route kernel (cuda_ops_moe.cu) and the last block of the
 * router's matvec (cuda_fmv.cu, the moe_router op) call the same code, so
 * both give the same picks and weights.
 */
#ifndef DS4_CUDA_MOE_ROUTE_CUH
#define DS4_CUDA_MOE_ROUTE_CUH

#include "backend/cuda/cuda_internal.cuh"

#include <cuda_runtime.h>
#include <stdint.h>

struct cb_route_args {
    const float *bias;      /* [n_expert] or NULL */
    const int32_t *tid2eid; /* hash layers: [vocab, tid_ld] ids, or NULL */
    int64_t tid_ld;
    const int32_t *tokens;
    float scale;
    int n_expert, k; /* k <= 64 */
    int32_t *sel;    /* [T, k] */
    float *w;        /* [T, k] */
    int reg;         /* pick from registers (cb_route_reg_on; n_expert <= CB_ROUTE_REG_MAX) */
};

/* Experts a lane holds in registers for the pick (32 lanes: 256 experts,
 * Flash's count) */
#define CB_ROUTE_REG_PER_LANE 8
#define CB_ROUTE_REG_MAX (32 * CB_ROUTE_REG_PER_LANE)

/* a's best untaken expert (highest key, ties by lower id) combined across
 * the warp by a butterfly: every lane ends with the same (bv, bi) */
__device__ __forceinline__ void cb_route_warp_best(float &bv, int &bi)
{
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
    }
}

/* The pick's k rounds with lane l's keys (experts l, l + 32, ...) in
 * registers. Why: in the replayed decode step the router took ~9 us a
 * layer where it picks and ~5.3 where the hash table gives the ids; a
 * round was then 8 register compares and a butterfly, where the first
 * form waited on 8 dependent shared loads. One warp.
 * With every key finite and k <= n_expert (always, for a sane model) a
 * round is two warp reductions (redux.sync): the largest key's order
 * image (ds4_order_key: never 0 for a finite key, so 0 marks a taken
 * expert), then the lowest expert id holding it: the best untaken expert,
 * highest key, ties to the lower id, which is what the walk below picks
 * then (it offers a taken expert only when every key of its lane is
 * taken, and a finite untaken key is left somewhere in every round);
 * thirty-fifth session, 4.2 us from the last block's ticket to the
 * stored picks on an H100 before it. Any key not finite takes the walk,
 * whose comparisons are the shared-memory walk's on the same values in
 * the same order. */
__device__ __forceinline__ void cb_route_pick_reg(const float *key, int n_expert, int k, int32_t *s)
{
    const int lane = threadIdx.x & 31;
    float kv[CB_ROUTE_REG_PER_LANE];
    uint32_t u[CB_ROUTE_REG_PER_LANE];
    bool finite = true;
#pragma unroll
    for (int i = 0; i < CB_ROUTE_REG_PER_LANE; i++) {
        const int e = lane + 32 * i;
        kv[i] = e < n_expert ? key[e] : -INFINITY;
        if (e < n_expert) finite = finite && isfinite(kv[i]);
        u[i] = e < n_expert ? ds4_order_key(kv[i]) : 0u;
    }
    if (__all_sync(0xffffffffu, finite) && k <= n_expert) {
        for (int j = 0; j < k; j++) {
            uint32_t best = u[0];
#pragma unroll
            for (int i = 1; i < CB_ROUTE_REG_PER_LANE; i++) best = max(best, u[i]);
            const uint32_t top = __reduce_max_sync(0xffffffffu, best);
            uint32_t id = 0xffffffffu; /* the lane's lowest expert holding top */
#pragma unroll
            for (int i = CB_ROUTE_REG_PER_LANE - 1; i >= 0; i--)
                if (u[i] == top) id = (uint32_t)(lane + 32 * i);
            id = __reduce_min_sync(0xffffffffu, id);
            if (lane == 0) s[j] = (int32_t)id;
#pragma unroll
            for (int i = 0; i < CB_ROUTE_REG_PER_LANE; i++)
                if (id == (uint32_t)(lane + 32 * i)) u[i] = 0u; /* taken */
        }
        return;
    }
    for (int j = 0; j < k; j++) {
        float bv = -INFINITY;
        int bi = -1;
#pragma unroll
        for (int i = 0; i < CB_ROUTE_REG_PER_LANE; i++) {
            const int e = lane + 32 * i;
            if (e >= n_expert) break;
            if (kv[i] == -INFINITY && bi >= 0) continue;
            if (bi < 0 || kv[i] > bv || (kv[i] == bv && e < bi)) bv = kv[i], bi = e;
        }
        cb_route_warp_best(bv, bi);
        if (lane == 0) s[j] = bi;
#pragma unroll
        for (int i = 0; i < CB_ROUTE_REG_PER_LANE; i++)
            if (bi >= 0 && bi == lane + 32 * i) kv[i] = -INFINITY; /* taken */
    }
}

/* The bias of expert threadIdx.x (0 without one), for cb_moe_route_block:
 * a weight, so callers read it before their dependency wait, where it was
 * a DRAM round trip on the pick's path. */
__device__ __forceinline__ float cb_route_bias_own(const cb_route_args &a)
{
    return a.bias && (int)threadIdx.x < a.n_expert ? __ldg(a.bias + threadIdx.x) : 0.0f;
}

/* Token t's picks from logits[t * n_expert ...]. Every thread of the block
 * calls it (blockDim a multiple of 32); s_sc is 2 * n_expert
 * floats of shared memory (scores, then keys). The logits are read from
 * L2 (__ldcg): the router's matvec calls this after other blocks wrote
 * them in the same launch. Picks and scores stay in shared memory (read
 * back from global memory by one thread, they were a dependent L2 round
 * trip each) and are written out once. bias_own: cb_route_bias_own(a),
 * read by the caller before its wait. */
__device__ __forceinline__ void cb_moe_route_block(const float *logits, int t, const cb_route_args &a, float *s_sc,
                                                   float bias_own)
{
    __shared__ int32_t s[64];
    const int n_expert = a.n_expert, k = a.k;
    float *key = s_sc + n_expert;
    const float *lg = logits + (size_t)t * n_expert;
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
        const float x = __ldcg(lg + e);
        const float sp = x > 20.0f ? x : log1pf(expf(x));
        s_sc[e] = sqrtf(sp);
        key[e] = a.bias ? __fadd_rn(s_sc[e], e == (int)threadIdx.x ? bias_own : a.bias[e]) : s_sc[e];
    }
    __syncthreads();
    if (a.tid2eid) {
        for (int j = threadIdx.x; j < k; j += blockDim.x) s[j] = a.tid2eid[(size_t)a.tokens[t] * a.tid_ld + j];
    } else if (a.reg && n_expert <= CB_ROUTE_REG_MAX) {
        if (threadIdx.x < 32) cb_route_pick_reg(key, n_expert, k, s);
    } else if (threadIdx.x < 32) {
        /* one warp: k rounds of a lane's best over experts lane, lane + 32,
         * ... and a butterfly; every lane ends with the same pick. (A block
         * of 8 warps met in shared memory twice a round: ~4 us a token.) */
        const int lane = threadIdx.x;
        for (int j = 0; j < k; j++) {
            /* best untaken expert: highest key, ties by lower id */
            float bv = -INFINITY;
            int bi = -1;
            for (int e = lane; e < n_expert; e += 32) {
                if (key[e] == -INFINITY && bi >= 0) continue;
                if (bi < 0 || key[e] > bv || (key[e] == bv && e < bi)) bv = key[e], bi = e;
            }
            cb_route_warp_best(bv, bi);
            if (lane == 0) s[j] = bi;
            if (bi >= 0 && (bi & 31) == lane) key[bi] = -INFINITY; /* taken: only its lane reads it */
            __syncwarp();
        }
    }
    __syncthreads();
    for (int j = threadIdx.x; j < k; j += blockDim.x) a.sel[(size_t)t * k + j] = s[j];
    if (threadIdx.x == 0) {
        float sum = 0.f;
        for (int j = 0; j < k; j++) {
            const int e = s[j];
            sum += (e >= 0 && e < n_expert) ? s_sc[e] : 0.f;
        }
        for (int j = 0; j < k; j++) {
            const int e = s[j];
            const float v = (e >= 0 && e < n_expert) ? s_sc[e] : 0.f;
            a.w[(size_t)t * k + j] = v / (sum + 1e-20f) * a.scale;
        }
    }
}

#endif

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
};

/* Token t's picks from logits[t * n_expert ...]. Every thread of the block
 * calls it (blockDim a multiple of 32, at most 1024); s_sc is 2 * n_expert
 * floats of shared memory (scores, then keys). The logits are read from
 * L2 (__ldcg): the router's matvec calls this after other blocks wrote
 * them in the same launch. Picks and scores stay in shared memory (read
 * back from global memory by one thread, they were a dependent L2 round
 * trip each) and are written out once. */
__device__ __forceinline__ void cb_moe_route_block(const float *logits, int t, const cb_route_args &a, float *s_sc)
{
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    __shared__ int32_t s[64];
    const int n_expert = a.n_expert, k = a.k;
    float *key = s_sc + n_expert;
    const float *lg = logits + (size_t)t * n_expert;
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
        const float x = __ldcg(lg + e);
        const float sp = x > 20.0f ? x : log1pf(expf(x));
        s_sc[e] = sqrtf(sp);
        key[e] = a.bias ? __fadd_rn(s_sc[e], a.bias[e]) : s_sc[e];
    }
    __syncthreads();
    if (a.tid2eid) {
        for (int j = threadIdx.x; j < k; j += blockDim.x) s[j] = a.tid2eid[(size_t)a.tokens[t] * a.tid_ld + j];
    } else {
        const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
        for (int j = 0; j < k; j++) {
            /* best untaken expert: highest key, ties by lower id */
            float bv = -INFINITY;
            int bi = -1;
            for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
                if (key[e] == -INFINITY && bi >= 0) continue;
                if (bi < 0 || key[e] > bv || (key[e] == bv && e < bi)) bv = key[e], bi = e;
            }
            for (int o = 16; o > 0; o >>= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
                if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
            }
            if (lane == 0) best_v[wid] = bv, best_i[wid] = bi;
            __syncthreads();
            if (threadIdx.x == 0) {
                float v = best_v[0];
                int b = best_i[0];
                for (int q = 1; q < nw; q++)
                    if (best_i[q] >= 0 && (b < 0 || best_v[q] > v || (best_v[q] == v && best_i[q] < b)))
                        v = best_v[q], b = best_i[q];
                s[j] = b;
                key[b] = -INFINITY; /* taken */
            }
            __syncthreads();
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

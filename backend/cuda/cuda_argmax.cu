/*
 * cuda_argmax.cu - the greedy pick on the device: for rows of logits, the
 * index of each row's largest value by the host's rule
 * (ds4_argmax_excluding, engine/sampler.c): the lowest index on ties, -0
 * and +0 equal, NaN and -inf never chosen, one id excluded, -1 when no
 * value is left.
 *
 * Why: a greedy decode step ended with the logits row's download (517 KB
 * for Flash's 129,280 values) and a pass over it on the host (~50 us, ~1%
 * of a one-token step; a 16-session step 16 rows, ~4%). Picked here, 4
 * bytes a row cross (docs/CUDA.md "The greedy pick on the device").
 *
 * How: one block of 1024 threads a row (a row is in L2, just written by
 * the LM head; a block reads it in a few microseconds, and a 16-session
 * step's rows go to 16 SMs at once). Each thread walks its slice in
 * increasing index order, 16-byte loads where the row allows (the values
 * before the first 16-byte boundary and after the last whole load one a
 * thread), and keeps the first of its largest values: `v > best`, best
 * starting at -inf, skips NaN and -inf by itself (neither compares
 * greater) and keeps the earlier of equal values. The block then merges
 * the threads' (value, index) pairs: the larger value, on equal values the
 * lower index; a thread without a candidate holds (-inf, -1), which any
 * candidate beats. That merge is the maximum of a total order, so the
 * shuffle tree's shape does not change the answer. Values are compared as
 * floats, never by their bits: -0 and +0 tie and the lower index wins.
 */
#include "backend/cuda/cuda_internal.cuh"

#include <math.h>

enum { AM_THREADS = 1024 };

/* Value v at index i into the thread's best (bv, bi), indices coming in
 * increasing order. */
__device__ __forceinline__ void am_take(float v, int i, int excluded, float &bv, int &bi)
{
    if (v > bv && i != excluded) {
        bv = v;
        bi = i;
    }
}

/* (ov, oi) merged into (bv, bi). Equal values are both candidates (indices
 * >= 0) or both none (-inf, -1), so the index comparison needs no case. */
__device__ __forceinline__ void am_merge(float ov, int oi, float &bv, int &bi)
{
    if (ov > bv || (ov == bv && oi < bi)) {
        bv = ov;
        bi = oi;
    }
}

__device__ __forceinline__ void am_warp_merge(float &bv, int &bi)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        am_merge(ov, oi, bv, bi);
    }
}

/* Block b: row b of n values at x + b * n; its pick into out[b]. */
__global__ void __launch_bounds__(AM_THREADS) cb_argmax_rows_kernel(const float *x, int n, int excluded, int32_t *out)
{
    ds4_pdl_enter();
    const float *row = x + (size_t)blockIdx.x * (size_t)n;
    const int t = threadIdx.x;
    /* values before the row's first 16-byte boundary (rows of a width not
     * a multiple of 4 start anywhere), then whole float4s, then the rest */
    int pre = (int)(((16u - ((unsigned)(uintptr_t)row & 15u)) & 15u) >> 2);
    if (pre > n) pre = n;
    const int nv = (n - pre) >> 2;
    const float4 *body = (const float4 *)(row + pre);
    float bv = -INFINITY;
    int bi = -1;
    if (t < pre) am_take(row[t], t, excluded, bv, bi);
#pragma unroll 4
    for (int c = t; c < nv; c += AM_THREADS) {
        const float4 q = body[c];
        const int i = pre + 4 * c;
        am_take(q.x, i, excluded, bv, bi);
        am_take(q.y, i + 1, excluded, bv, bi);
        am_take(q.z, i + 2, excluded, bv, bi);
        am_take(q.w, i + 3, excluded, bv, bi);
    }
    const int rest = pre + 4 * nv + t;
    if (rest < n) am_take(row[rest], rest, excluded, bv, bi);

    __shared__ float sv[AM_THREADS / 32];
    __shared__ int si[AM_THREADS / 32];
    am_warp_merge(bv, bi);
    const int w = t >> 5, lane = t & 31;
    if (lane == 0) {
        sv[w] = bv;
        si[w] = bi;
    }
    __syncthreads();
    if (w != 0) return;
    bv = sv[lane];
    bi = si[lane];
    am_warp_merge(bv, bi);
    if (lane == 0) out[blockIdx.x] = bi;
}

extern "C" ds4_status ds4_cuda_argmax_rows(ds4_cuda *cu, const float *d_x, int64_t n_rows, int64_t n,
                                           int32_t excluded, int32_t *d_out)
{
    if (n_rows < 1 || n_rows > INT32_MAX || n < 0 || n > INT32_MAX)
        return ds4_fail(DS4_ERR_INVALID, "cuda argmax: %lld rows of %lld values (1..2^31-1 rows of 0..2^31-1)",
                        (long long)n_rows, (long long)n);
    if (!d_x || !d_out) return ds4_fail(DS4_ERR_INVALID, "cuda argmax: NULL logits or output");
    if ((uintptr_t)d_x % sizeof(float) != 0)
        return ds4_fail(DS4_ERR_INVALID, "cuda argmax: logits at %p are not float-aligned", (const void *)d_x);
    ds4_launch(cb_argmax_rows_kernel, dim3((unsigned)n_rows), dim3(AM_THREADS), 0, cu->stream, d_x, (int)n,
               (int)excluded, d_out);
    DS4_CUDA_CHECK(cudaGetLastError());
    return DS4_OK;
}

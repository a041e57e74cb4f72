/*
 * cuda_rmsnorm_row.cuh - the block-wide sum of squares and the one-row
 * rmsnorm from registers, as device functions: the rmsnorm op's kernels
 * (cuda_ops_dense.cu) and the products that normalize their own input
 * (the rmsnorm_matmul op, DS4_CUDA_QB_NORM: cuda_q8split_fused.cu for
 * Q8_0, cuda_fmv.cu for float weights) call the same code, so a fused
 * norm gives the op's bits.
 */
#ifndef DS4_CUDA_RMSNORM_ROW_CUH
#define DS4_CUDA_RMSNORM_ROW_CUH

#include <cuda_runtime.h>

/* The block's sum of each thread's ss (warp trees, then one warp over the
 * warps' sums), returned to every thread. */
__device__ __forceinline__ double cb_block_sum_double(double ss)
{
    __shared__ double red[32];
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        double v = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.0;
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (threadIdx.x == 0) red[0] = v;
    }
    __syncthreads();
    const double total = red[0];
    __syncthreads(); /* red may be reused by a next call */
    return total;
}

/* One row's rmsnorm as cb_rmsnorm_kernel computes it at nt threads (thread
 * i < nt takes values i, i + nt, ...; the same reduction), for rows of at
 * most 4 values per thread, from registers: wv holds the thread's weights
 * (the caller loads them, before its wait on the previous kernel; w NULL:
 * unweighted). Writes dst (global or shared memory; dst == xr is fine: a
 * thread reads its values before the block's barriers). Every thread of
 * the block calls it; those from nt on add exact zeros to the sum (whose
 * second stage already adds zeros past the warps), so a block of more
 * threads than nt gives the bits of a block of nt. keep: also the thread's
 * values, value i + k nt in keep[k]. */
__device__ __forceinline__ void cb_rmsnorm_reg_row_nt(const float *xr, const float *w, const float wv[4], int n,
                                                      float eps, float *dst, int nt, float *keep = nullptr)
{
    const bool mine = (int)threadIdx.x < nt;
    float xv[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int i = threadIdx.x + k * nt;
        xv[k] = mine && i < n ? xr[i] : 0.0f;
    }
    double ss = 0.0;
#pragma unroll
    for (int k = 0; k < 4; k++)
        if (mine && (int)threadIdx.x + k * nt < n) ss += (double)xv[k] * xv[k];
    const float s = (float)(1.0 / sqrt(cb_block_sum_double(ss) / n + eps));
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int i = threadIdx.x + k * nt;
        if (mine && i < n) {
            const float y = w ? (xv[k] * s) * wv[k] : xv[k] * s;
            dst[i] = y;
            if (keep) keep[k] = y; /* the caller's copy of the thread's values (else 0 as it gave them) */
        }
    }
}

/* The same at the block's own thread count. */
__device__ __forceinline__ void cb_rmsnorm_reg_row(const float *xr, const float *w, const float wv[4], int n,
                                                   float eps, float *dst)
{
    cb_rmsnorm_reg_row_nt(xr, w, wv, n, eps, dst, (int)blockDim.x);
}

/* The thread's (up to 4) weights of a row of n at nt threads, 1 where
 * there are none. */
__device__ __forceinline__ void cb_rmsnorm_reg_weights_nt(const float *w, int n, float wv[4], int nt)
{
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int i = threadIdx.x + k * nt;
        wv[k] = w && (int)threadIdx.x < nt && i < n ? __ldg(w + i) : 1.0f;
    }
}

__device__ __forceinline__ void cb_rmsnorm_reg_weights(const float *w, int n, float wv[4])
{
    cb_rmsnorm_reg_weights_nt(w, n, wv, (int)blockDim.x);
}

#endif

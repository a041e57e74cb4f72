/*
 * cuda_rope_row.cuh - the RoPE pair rotation and one head row's rmsnorm +
 * RoPE as device functions: the rope and rmsnorm_rope ops' kernels
 * (cuda_ops_dense.cu), the attention combine and the q_b product that
 * normalizes and rotates its own heads (cuda_q8split_fused.cu, ops.h
 * query_rope) call the same code, so they give the same bits.
 */
#ifndef DS4_CUDA_ROPE_ROW_CUH
#define DS4_CUDA_ROPE_ROW_CUH

#include "backend/cuda/cuda_rmsnorm_row.cuh"

#include <cuda_runtime.h>
#include <stdint.h>

/* A kernel's position: in a graph step the device copy plus the argument
 * (pos0 - the step's position), else the argument itself (d_pos NULL). */
__device__ __forceinline__ int64_t cb_pos(const int64_t *d_pos, int64_t pos) { return d_pos ? *d_pos + pos : pos; }

/* The rotation of theta = pos * om_k (the rope op's math): its cosine
 * and sine, which a kernel may make before its dependency wait where it
 * knows the position, then the pair rotated by them. */
__device__ __forceinline__ void cb_rope_cs(int64_t pos, float om_k, int inverse, float *c, float *s)
{
    const float theta = __fmul_rn((float)pos, om_k);
    *c = (float)cos((double)theta);
    *s = (float)sin((double)theta);
    if (inverse) *s = -*s;
}
__device__ __forceinline__ void cb_rope_rot(float *v, float c, float s)
{
    const float x0 = v[0], x1 = v[1];
    v[0] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)); /* no FMA: as the CPU rounds */
    v[1] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

/* Pair v[0], v[1] rotated by theta = pos * om_k. */
__device__ __forceinline__ void cb_rope_pair(float *v, int64_t pos, float om_k, int inverse)
{
    float c, s;
    cb_rope_cs(pos, om_k, inverse, &c, &s);
    cb_rope_rot(v, c, s);
}

/* One head row of n (xr) into row (shared memory): its rmsnorm as a block
 * of nt threads computes it (cb_rmsnorm_reg_row_nt: wv the thread's
 * weights, w NULL for none), then the forward RoPE of its last n_rot
 * values at pos (thread k < n_rot / 2 rotates pair k with omk, its
 * frequency). Every thread of the block calls it; it ends with a block
 * barrier. */
__device__ __forceinline__ void cb_norm_rope_row(const float *xr, const float *w, const float wv[4], int n, float eps,
                                                 int n_rot, float omk, int64_t pos, float *row, int nt)
{
    cb_rmsnorm_reg_row_nt(xr, w, wv, n, eps, row, nt);
    __syncthreads();
    if ((int)threadIdx.x < n_rot / 2) cb_rope_pair(row + (n - n_rot) + 2 * threadIdx.x, pos, omk, 0);
    __syncthreads();
}

#endif

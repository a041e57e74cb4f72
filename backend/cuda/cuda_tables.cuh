/*
 * cuda_tables.cuh - the lookup tables of the block formats, for kernels
 * (device copies staged into shared memory per thread block) and for the
 * host check (static arrays). Values are format facts from
 * tests/data/quants/tables.json.
 */
#ifndef DS4_CUDA_TABLES_CUH
#define DS4_CUDA_TABLES_CUH

#include "backend/cuda/cuda_blocks.cuh"
#include "backend/cuda/cuda_iq2xxs_grid.h"

/* E2M1 values, doubled (the MXFP4 scale 2^(e-128) undoes the doubling). */
#define DS4_MXFP4_VALUES \
    0.f, 1.f, 2.f, 3.f, 4.f, 6.f, 8.f, 12.f, 0.f, -1.f, -2.f, -3.f, -4.f, -6.f, -8.f, -12.f

static __device__ const uint64_t ds4_iq2xxs_grid_dev[256] = {DS4_IQ2XXS_GRID_VALUES};
static __device__ const float ds4_mxfp4_dev[16] = {DS4_MXFP4_VALUES};

/* Shared-memory tables of one thread block; sized 1 for types that need
 * none so that they cost nothing. */
template <int T> struct ds4_block_luts {
    enum { NG = T == DS4_TYPE_IQ2_XXS ? 256 : 1, NK = T == DS4_TYPE_MXFP4 ? 16 : 1 };
    uint64_t grid[NG];
    float kv[NK];

    /* Every thread of the block calls this, then __syncthreads(); cols:
     * the values of the weight's rows (their IQ2_XXS / Q2_K layout). */
    __device__ __forceinline__ ds4_luts fill(int64_t cols)
    {
        if (T == DS4_TYPE_IQ2_XXS)
            for (int i = threadIdx.x; i < 256; i += blockDim.x) grid[i] = ds4_iq2xxs_grid_dev[i];
        if (T == DS4_TYPE_MXFP4)
            for (int i = threadIdx.x; i < 16; i += blockDim.x) kv[i] = ds4_mxfp4_dev[i];
        ds4_luts L = {grid, kv, T == DS4_TYPE_IQ2_XXS && ds4_iq2_runs(cols), T == DS4_TYPE_Q2_K && ds4_q2k_runs(cols)};
        return L;
    }
};

#endif

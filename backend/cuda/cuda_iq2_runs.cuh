/*
 * cuda_iq2_runs.cuh - IQ2_XXS weights as the GPU keeps them: in runs of 8
 * blocks.
 *
 * Why: a GGUF IQ2_XXS block is 66 bytes (an fp16 scale, then 8 groups of
 * 8 bytes), so every group but those of every fourth block sits on a
 * 2-byte boundary, and shared memory has no unaligned loads: a lane read
 * its group as 3 aligned words and 2 funnel shifts, and the words of a
 * warp's groups spread over more banks than their bytes need (the routed
 * gate+up kernels of a batched step were bound by shared-memory traffic,
 * docs/CUDA.md forty-fifth paragraph). Here a run of 8 consecutive blocks
 * of a row (528 bytes, a multiple of 16 like the GGUF bytes it replaces)
 * holds the 8 scales first (16 bytes), then the 8 blocks' 64-byte groups
 * in block order: every group is one aligned 8-byte load, every block's
 * groups 4 aligned 16-byte pieces, and the scales of blocks j and j + 4
 * are adjacent (one 4-byte load for a lane that takes blocks b, b + 4, as
 * the routed gate+up kernels' lanes do).
 *
 * Which tensors: IQ2_XXS rows of a multiple of 2048 values (8 blocks), so
 * every row starts a run and a run never crosses rows (Flash's routed gate
 * and up, 4096 columns). Other IQ2_XXS rows keep the GGUF layout. The CUDA
 * backend rearranges a tensor once, when it copies it to the GPU
 * (ds4_cuda_iq2_runs, cuda_iq2_runs.cu), in place; the same bytes, the
 * same size, the same numbers: a reader decodes the same values from
 * either layout, so every product's results are bit for bit those of the
 * GGUF layout.
 */
#ifndef DS4_CUDA_IQ2_RUNS_CUH
#define DS4_CUDA_IQ2_RUNS_CUH

#include <stdint.h>

/* standalone: cuda_blocks.cuh, which every decoder includes, includes this */
#define DS4_IQ2_HD __host__ __device__ __forceinline__

enum {
    DS4_IQ2_RUN_BLOCKS = 8,
    DS4_IQ2_RUN_BYTES = 8 * 66, /* 528 = 33 x 16 */
    DS4_IQ2_RUN_QS = 16,        /* the first group's byte in a run */
};

/* Whether IQ2_XXS rows of cols values are kept in runs. */
DS4_IQ2_HD bool ds4_iq2_runs(int64_t cols)
{
    return cols > 0 && cols % (256 * DS4_IQ2_RUN_BLOCKS) == 0;
}

/* The slot of block j's scale among its run's 8 (j and j + 4 adjacent). */
DS4_IQ2_HD int ds4_iq2_run_dslot(int j)
{
    return 2 * (j & 3) + (j >> 2);
}

/* Block b's scale (2 bytes) and its 64 bytes of groups as byte offsets
 * from a run's first byte (a row's, or any whole number of runs into it);
 * runs = false: the GGUF layout. */
DS4_IQ2_HD int64_t ds4_iq2_d_ofs(int64_t b, bool runs)
{
    return runs ? DS4_IQ2_RUN_BYTES * (b >> 3) + 2 * ds4_iq2_run_dslot((int)(b & 7)) : 66 * b;
}
DS4_IQ2_HD int64_t ds4_iq2_qs_ofs(int64_t b, bool runs)
{
    return runs ? DS4_IQ2_RUN_BYTES * (b >> 3) + DS4_IQ2_RUN_QS + 64 * (b & 7) : 66 * b + 2;
}

/* Byte i of a run in the runs layout: the byte of the run's 8 GGUF blocks
 * it comes from (a permutation of 0 .. 527). */
DS4_IQ2_HD int ds4_iq2_run_src(int i)
{
    if (i < DS4_IQ2_RUN_QS) { /* scale slot i / 2 holds block j: slot = 2 (j & 3) + (j >> 2) */
        const int slot = i >> 1, j = (slot >> 1) + 4 * (slot & 1);
        return 66 * j + (i & 1);
    }
    const int q = i - DS4_IQ2_RUN_QS;
    return 66 * (q >> 6) + 2 + (q & 63);
}

#endif

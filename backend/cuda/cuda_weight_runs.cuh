/*
 * cuda_weight_runs.cuh - quantized weights as the GPU keeps them: IQ2_XXS
 * in runs of 8 blocks, Q2_K in runs of 4; the same bytes as the GGUF
 * blocks they replace, rearranged within each run (the tensor's size, row
 * strides and expert offsets unchanged), so that each piece a kernel reads
 * is aligned. The CUDA backend rearranges a tensor once, in place, where
 * it reaches the GPU (ds4_cuda_upload_weight, ds4_cuda_runs_on,
 * cuda_weight_runs.cu); a reader decodes the same values from either
 * layout, so every product's results are bit for bit those of the GGUF
 * layout. A row starts a run when its width is a multiple of the run's
 * values (ds4_iq2_runs, ds4_q2k_runs); other rows keep the GGUF layout.
 *
 * IQ2_XXS. Why: a GGUF block is 66 bytes (an fp16 scale, then 8 groups of
 * 8 bytes), so every group but those of every fourth block sits on a
 * 2-byte boundary, and shared memory has no unaligned loads: a lane read
 * its group as 3 aligned words and 2 funnel shifts, and the words of a
 * warp's groups spread over more banks than their bytes need (the routed
 * gate+up kernels of a batched step were bound by shared-memory traffic,
 * docs/CUDA.md forty-fifth paragraph). A run of 8 consecutive blocks of a
 * row (528 bytes, a multiple of 16) holds the 8 scales first (16 bytes),
 * then the 8 blocks' 64-byte groups in block order: every group is one
 * aligned 8-byte load, every block's groups 4 aligned 16-byte pieces, and
 * the scales of blocks j and j + 4 are adjacent (one 4-byte load for a
 * lane that takes blocks b, b + 4, as the routed gate+up kernels' lanes
 * do). Rows of a multiple of 2048 values (Flash's routed gate and up, 4096
 * columns).
 *
 * Q2_K. Why: a GGUF block is 84 bytes (16 bytes of scale / min nibbles, 64
 * of 2-bit quants, then the fp16 d and dmin), so only every fourth block
 * starts on a 16-byte boundary: a lane of the routed down kernels read a
 * quarter's 16 bytes of quants as 4 words, its 8 scale bytes as 2 and the
 * (d, dmin) pair as 1 (`g2_term_of`, cuda_moe_g2.cuh). A run of 4
 * consecutive blocks of a row (336 bytes = 21 x 16) holds the 4 (d, dmin)
 * words first (16 bytes), then the 4 blocks' scales (4 x 16), then their
 * quants (4 x 64): a quarter's quants are one 16-byte load, its scales one
 * 8-byte load. Rows of a multiple of 1024 values (Flash's routed down,
 * 2048 columns).
 */
#ifndef DS4_CUDA_WEIGHT_RUNS_CUH
#define DS4_CUDA_WEIGHT_RUNS_CUH

#include <stdint.h>

/* standalone: cuda_blocks.cuh, which every decoder includes, includes this */
#define DS4_RUNS_HD __host__ __device__ __forceinline__

/* ---- IQ2_XXS: runs of 8 blocks ------------------------------------------ */

enum {
    DS4_IQ2_RUN_BLOCKS = 8,
    DS4_IQ2_RUN_BYTES = 8 * 66, /* 528 = 33 x 16 */
    DS4_IQ2_RUN_QS = 16,        /* the first group's byte in a run */
};

/* Whether IQ2_XXS rows of cols values are kept in runs. */
DS4_RUNS_HD bool ds4_iq2_runs(int64_t cols)
{
    return cols > 0 && cols % (256 * DS4_IQ2_RUN_BLOCKS) == 0;
}

/* The slot of block j's scale among its run's 8 (j and j + 4 adjacent). */
DS4_RUNS_HD int ds4_iq2_run_dslot(int j)
{
    return 2 * (j & 3) + (j >> 2);
}

/* Block b's scale (2 bytes) and its 64 bytes of groups as byte offsets
 * from a run's first byte (a row's, or any whole number of runs into it);
 * runs = false: the GGUF layout. */
DS4_RUNS_HD int64_t ds4_iq2_d_ofs(int64_t b, bool runs)
{
    return runs ? DS4_IQ2_RUN_BYTES * (b >> 3) + 2 * ds4_iq2_run_dslot((int)(b & 7)) : 66 * b;
}
DS4_RUNS_HD int64_t ds4_iq2_qs_ofs(int64_t b, bool runs)
{
    return runs ? DS4_IQ2_RUN_BYTES * (b >> 3) + DS4_IQ2_RUN_QS + 64 * (b & 7) : 66 * b + 2;
}

/* Byte i of a run in the runs layout: the byte of the run's 8 GGUF blocks
 * it comes from (a permutation of 0 .. 527). */
DS4_RUNS_HD int ds4_iq2_run_src(int i)
{
    if (i < DS4_IQ2_RUN_QS) { /* scale slot i / 2 holds block j: slot = 2 (j & 3) + (j >> 2) */
        const int slot = i >> 1, j = (slot >> 1) + 4 * (slot & 1);
        return 66 * j + (i & 1);
    }
    const int q = i - DS4_IQ2_RUN_QS;
    return 66 * (q >> 6) + 2 + (q & 63);
}

/* ---- Q2_K: runs of 4 blocks --------------------------------------------- */

enum {
    DS4_Q2K_RUN_BLOCKS = 4,
    DS4_Q2K_RUN_BYTES = 4 * 84, /* 336 = 21 x 16 */
    DS4_Q2K_RUN_SC = 16,        /* the first block's scales in a run */
    DS4_Q2K_RUN_QS = 80,        /* the first block's quants */
};

/* Whether Q2_K rows of cols values are kept in runs. */
DS4_RUNS_HD bool ds4_q2k_runs(int64_t cols)
{
    return cols > 0 && cols % (256 * DS4_Q2K_RUN_BLOCKS) == 0;
}

/* Block b's 16 scale bytes, its 64 quant bytes and its (d, dmin) pair as
 * byte offsets from a run's first byte (a row's, or any whole number of
 * runs into it); runs = false: the GGUF layout. */
DS4_RUNS_HD int64_t ds4_q2k_sc_ofs(int64_t b, bool runs)
{
    return runs ? DS4_Q2K_RUN_BYTES * (b >> 2) + DS4_Q2K_RUN_SC + 16 * (b & 3) : 84 * b;
}
DS4_RUNS_HD int64_t ds4_q2k_qs_ofs(int64_t b, bool runs)
{
    return runs ? DS4_Q2K_RUN_BYTES * (b >> 2) + DS4_Q2K_RUN_QS + 64 * (b & 3) : 84 * b + 16;
}
DS4_RUNS_HD int64_t ds4_q2k_dd_ofs(int64_t b, bool runs)
{
    return runs ? DS4_Q2K_RUN_BYTES * (b >> 2) + 4 * (b & 3) : 84 * b + 80;
}

/* Byte i of a run in the runs layout: the byte of the run's 4 GGUF blocks
 * it comes from (a permutation of 0 .. 335). */
DS4_RUNS_HD int ds4_q2k_run_src(int i)
{
    if (i < DS4_Q2K_RUN_SC) return 84 * (i >> 2) + 80 + (i & 3);
    if (i < DS4_Q2K_RUN_QS) return 84 * ((i - DS4_Q2K_RUN_SC) >> 4) + ((i - DS4_Q2K_RUN_SC) & 15);
    return 84 * ((i - DS4_Q2K_RUN_QS) >> 6) + 16 + ((i - DS4_Q2K_RUN_QS) & 63);
}

#endif

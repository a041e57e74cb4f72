/*
 * cuda_q2k_runs.cuh - Q2_K weights as the GPU keeps them: in runs of 4
 * blocks.
 *
 * Why: a GGUF Q2_K block is 84 bytes (16 bytes of scale / min nibbles, 64
 * of 2-bit quants, then the fp16 d and dmin), so only every fourth block
 * starts on a 16-byte boundary: a lane of the routed down kernels read a
 * quarter's 16 bytes of quants as 4 words, its 8 scale bytes as 2 and the
 * (d, dmin) pair as 1 (`g2_term_of`, cuda_moe_g2.cuh). Here a run of 4
 * consecutive blocks of a row (336 bytes = 21 x 16) holds the 4 (d, dmin)
 * words first (16 bytes), then the 4 blocks' scales (4 x 16), then their
 * quants (4 x 64): a quarter's quants are one 16-byte load, its scales
 * one 8-byte load.
 *
 * Which tensors: Q2_K rows of a multiple of 1024 values (4 blocks), so a
 * row starts a run (Flash's routed down, 2048 columns). Other Q2_K rows
 * keep the GGUF layout. Rearranged in place where weights reach the GPU,
 * as IQ2_XXS's runs (cuda_iq2_runs.cuh, cuda_weight_runs.cu): the same
 * bytes in each run, the same numbers.
 */
#ifndef DS4_CUDA_Q2K_RUNS_CUH
#define DS4_CUDA_Q2K_RUNS_CUH

#include <stdint.h>

#define DS4_Q2K_HD __host__ __device__ __forceinline__

enum {
    DS4_Q2K_RUN_BLOCKS = 4,
    DS4_Q2K_RUN_BYTES = 4 * 84, /* 336 = 21 x 16 */
    DS4_Q2K_RUN_SC = 16,        /* the first block's scales in a run */
    DS4_Q2K_RUN_QS = 80,        /* the first block's quants */
};

/* Whether Q2_K rows of cols values are kept in runs. */
DS4_Q2K_HD bool ds4_q2k_runs(int64_t cols)
{
    return cols > 0 && cols % (256 * DS4_Q2K_RUN_BLOCKS) == 0;
}

/* Block b's 16 scale bytes, its 64 quant bytes and its (d, dmin) pair as
 * byte offsets from a run's first byte (a row's, or any whole number of
 * runs into it); runs = false: the GGUF layout. */
DS4_Q2K_HD int64_t ds4_q2k_sc_ofs(int64_t b, bool runs)
{
    return runs ? DS4_Q2K_RUN_BYTES * (b >> 2) + DS4_Q2K_RUN_SC + 16 * (b & 3) : 84 * b;
}
DS4_Q2K_HD int64_t ds4_q2k_qs_ofs(int64_t b, bool runs)
{
    return runs ? DS4_Q2K_RUN_BYTES * (b >> 2) + DS4_Q2K_RUN_QS + 64 * (b & 3) : 84 * b + 16;
}
DS4_Q2K_HD int64_t ds4_q2k_dd_ofs(int64_t b, bool runs)
{
    return runs ? DS4_Q2K_RUN_BYTES * (b >> 2) + 4 * (b & 3) : 84 * b + 80;
}

/* Byte i of a run in the runs layout: the byte of the run's 4 GGUF blocks
 * it comes from (a permutation of 0 .. 335). */
DS4_Q2K_HD int ds4_q2k_run_src(int i)
{
    if (i < DS4_Q2K_RUN_SC) return 84 * (i >> 2) + 80 + (i & 3);
    if (i < DS4_Q2K_RUN_QS) return 84 * ((i - DS4_Q2K_RUN_SC) >> 4) + ((i - DS4_Q2K_RUN_SC) & 15);
    return 84 * ((i - DS4_Q2K_RUN_QS) >> 6) + 16 + ((i - DS4_Q2K_RUN_QS) & 63);
}

#endif

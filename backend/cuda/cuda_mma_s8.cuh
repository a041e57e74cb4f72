/*
 * cuda_mma_s8.cuh - the int8 tensor-core mma (m16n8k32, sm_80 and later)
 * of the integer-exact kernels (cuda_moe_mma.cu, cuda_indexer_tc.cu).
 *
 * Fragments (g = lane / 4, c = lane % 4; 4 int8 a register): a0 (row g, k
 * 4c .. 4c + 3), a1 (row g + 8, same k), a2 (row g, k 16 + 4c ..), a3 (row
 * g + 8, k 16 + 4c ..); b0 (k 4c .., column g), b1 (k 16 + 4c .., column
 * g); c0 (row g, column 2c), c1 (g, 2c + 1), c2 (g + 8, 2c), c3 (g + 8,
 * 2c + 1). An integer dot product does not depend on the order of k, so a
 * kernel may give k any order that A and B share.
 */
#ifndef DS4_CUDA_MMA_S8_CUH
#define DS4_CUDA_MMA_S8_CUH

#include <stdint.h>

/* c += a (16 x 32, rows) * b (32 x 8, columns), int8 in, int32 out. */
__device__ __forceinline__ void ds4_mmc_s8(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap(); /* the host launches these kernels on sm_80 and later only */
#endif
}

#endif

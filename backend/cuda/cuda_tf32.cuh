/*
 * cuda_tf32.cuh - the tf32 tensor-core pieces of the fp32-grade kernels
 * (cuda_attn_prefill_tc.cu, cuda_fmv_tall.cu): rounding to tf32, an fp32
 * value as two tf32 terms, and the m16n8k8 mma.
 *
 * Why fp32-grade: a tf32 mma multiplies 11-bit significands exactly and
 * adds in fp32. A value that is a tf32 value (every f16 and bf16 value is)
 * goes in as it is; an fp32 value goes in as hi = rna(x) and lo =
 * rna(x - hi) (x - hi is exact), 22 of its 24 bits, the part dropped below
 * the fp32 rounding of the long sums these kernels make.
 */
#ifndef DS4_CUDA_TF32_CUH
#define DS4_CUDA_TF32_CUH

#include <stdint.h>

__device__ __forceinline__ uint32_t ds4_tf32(float x)
{
    uint32_t r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
#else
    r = __float_as_uint(x); /* never launched below sm_80 */
#endif
    return r;
}

/* x = hi + lo as two tf32 values */
__device__ __forceinline__ void ds4_tf32_split(float x, uint32_t &hi, uint32_t &lo)
{
    hi = ds4_tf32(x);
    lo = ds4_tf32(x - __uint_as_float(hi));
}

/* c += A (16 x 8, tf32) x B (8 x 8, tf32), f32 accumulation. Fragments
 * (g = lane / 4, t = lane % 4): a0 (row g, col t), a1 (g + 8, t), a2 (g,
 * t + 4), a3 (g + 8, t + 4); b0 (k t, n g), b1 (k t + 4, n g); c0 (g, 2t),
 * c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1). */
__device__ __forceinline__ void ds4_mma_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    (void)a, (void)b0, (void)b1;
    c[0] = c[1] = c[2] = c[3] = __int_as_float(0x7fc00000); /* never launched below sm_80 */
#endif
}

#endif

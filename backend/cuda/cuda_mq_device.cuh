/*
 * cuda_mq_device.cuh - device pieces the int8 matvec kernels share
 * (cuda_mmvq.cu and the one-token expert kernels, cuda_moe1.cuh):
 * the in-kernel Q8_K quantizer of one activation block (the CPU's bytes),
 * the warp sum in the order every form uses, the cp.async copies and
 * 32-bit shared loads.
 * CUDA only (cuda_mmvq.cuh is also compiled as C for the host check).
 */
#ifndef DS4_CUDA_MQ_DEVICE_CUH
#define DS4_CUDA_MQ_DEVICE_CUH

#include "backend/cuda/cuda_mmvq.cuh"

/* The lane's 8 values of block k of one activation row (loads apart from
 * the quantizing, so that a warp quantizing several blocks can have all
 * their loads in flight). */
__device__ __forceinline__ void ds4_mq_q8k_load(const float *xrow, int64_t k, int lane, float v[8])
{
    const float *xb = xrow + k * 256 + 8 * lane;
    const float4 a0 = *(const float4 *)xb, a1 = *(const float4 *)(xb + 4);
    v[0] = a0.x; v[1] = a0.y; v[2] = a0.z; v[3] = a0.w;
    v[4] = a1.x; v[5] = a1.y; v[6] = a1.z; v[7] = a1.w;
}

/* Q8_K block of one activation row by one warp (lane l owns values 8l ..
 * 8l+7, loaded by ds4_mq_q8k_load), the CPU's bytes: the lane's 8 quants
 * go to q (4-byte aligned), the pair (l, l^1)'s bsum to bs by the even
 * lane, the scale to d by lane 0. The scale comes from the first value of
 * largest magnitude (the CPU's scan order, a strict >; NaN never wins,
 * here neither: a lane's amax starts at 0 and only a > replaces it).
 * Finding it: the warp's largest |v| by a max butterfly (exact), then the
 * lowest lane holding it gives its first such value; the same value as
 * the three-value butterfly this replaced (largest |v|, ties to the lower
 * index), in 5 shuffles where that took 15 (thirty-fifth session). */
__device__ __forceinline__ void ds4_mq_q8k_vals_at(const float v[8], int lane, int8_t *q, int16_t *bs, float *d)
{
    float amax = 0.0f, mx = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const float ax = fabsf(v[j]);
        if (ax > amax) amax = ax, mx = v[j];
    }
    float m = amax;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const int src = __ffs(__ballot_sync(0xffffffffu, amax == m)) - 1;
    mx = __shfl_sync(0xffffffffu, mx, src);
    int s = 0;
    uint32_t lo = 0, hi = 0;
    if (m != 0.0f) {
        const float iscale = -127.0f / mx;
        int8_t qv[8];
#pragma unroll
        for (int j = 0; j < 8; j++) s += (qv[j] = ds4_mmvq_q8_k_q(v[j], iscale));
#pragma unroll
        for (int j = 0; j < 4; j++) {
            lo |= (uint32_t)(uint8_t)qv[j] << (8 * j);
            hi |= (uint32_t)(uint8_t)qv[j + 4] << (8 * j);
        }
    }
    ((uint32_t *)q)[0] = lo;
    ((uint32_t *)q)[1] = hi;
    s += __shfl_xor_sync(0xffffffffu, s, 1); /* a bsum covers 16 values: two lanes */
    if ((lane & 1) == 0) *bs = (int16_t)s;
    if (lane == 0) *d = m == 0.0f ? 0.0f : 1.0f / (-127.0f / mx);
}

/* Block k of the row `row` in the CPU's layout (cols values: the quants,
 * then cols / 256 float scales, then cols / 16 int16 bsums; row 4-byte
 * aligned). */
__device__ __forceinline__ void ds4_mq_q8k_vals(const float v[8], int64_t k, uint8_t *row, int64_t cols, int lane)
{
    float *d = (float *)(row + cols);
    int16_t *bs = (int16_t *)(d + cols / 256);
    ds4_mq_q8k_vals_at(v, lane, (int8_t *)row + k * 256 + 8 * lane, bs + k * 16 + lane / 2, d + k);
}

/* The same from the row in memory. */
__device__ __forceinline__ void ds4_mq_q8k_block(const float *xrow, int64_t k, uint8_t *row, int64_t cols, int lane)
{
    float v[8];
    ds4_mq_q8k_load(xrow, k, lane, v);
    ds4_mq_q8k_vals(v, k, row, cols, lane);
}

__device__ __forceinline__ float ds4_mq_warp_sum(float s)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}

/* N sums over the warp (N a power of two, at most 32), each with the bits
 * ds4_mq_warp_sum gives it, in N - 1 + 5 - log2 N shuffles instead of 5 N
 * (8 values: 9 instead of 40). The lane keeps one: the sum of v[k] for k =
 * ds4_warp_sums_index<N>(lane). Why the same bits: a xor butterfly ends
 * with every lane holding the same sum, and at each step a lane adds its
 * own value and its partner's; here, at the steps xor 16, 8, .. a lane
 * sends its partner the half of its values the partner keeps and adds the
 * half it keeps to the partner's, so each value a lane keeps is the
 * butterfly's value at that lane (the g1_warp_sum2 pairing, generalized). */
template <int N> __device__ __forceinline__ int ds4_warp_sums_index(int lane)
{
    int k = 0;
#pragma unroll
    for (int m = N, o = 16; m > 1; m >>= 1, o >>= 1)
        if (lane & o) k += m / 2;
    return k;
}
template <int N> __device__ __forceinline__ float ds4_warp_sums(const float (&v)[N], int lane)
{
    static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0, "a power of two values, at most a lane each");
    constexpr int L = N >= 32 ? 5 : N >= 16 ? 4 : N >= 8 ? 3 : N >= 4 ? 2 : N >= 2 ? 1 : 0;
    float w[N];
#pragma unroll
    for (int i = 0; i < N; i++) w[i] = v[i];
#pragma unroll
    for (int s = 0; s < L; s++) {
        const int o = 16 >> s, h = N >> (s + 1); /* the offset, the values kept */
        const bool hi = (lane & o) != 0;
#pragma unroll
        for (int i = 0; i < h; i++) {
            const float keep = hi ? w[i + h] : w[i], send = hi ? w[i] : w[i + h];
            w[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
    }
#pragma unroll
    for (int o = 16 >> L; o > 0; o >>= 1) w[0] += __shfl_xor_sync(0xffffffffu, w[0], o);
    return w[0];
}

__device__ __forceinline__ void ds4_mq_cp16(void *smem, const void *gmem)
{
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(gmem) : "memory");
}
/* The same at constant offsets from both addresses (they become the
 * instruction's immediates, where added in C they were each a 64-bit add:
 * ds4_gb256_kernel's fetch) */
template <int SO, int GO> __device__ __forceinline__ void ds4_mq_cp16_at(uint32_t sa, const void *gmem)
{
    asm volatile("cp.async.cg.shared.global [%0+%2], [%1+%3], 16;\n" ::"r"(sa), "l"(gmem), "n"(SO), "n"(GO) : "memory");
}
/* The same, zeros when !ok (gmem is then not read: a tile's edge) */
__device__ __forceinline__ void ds4_mq_cp16z(void *smem, const void *gmem, bool ok)
{
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(gmem), "r"(ok ? 16 : 0) : "memory");
}
/* 4 bytes (cp.async.ca: 4-byte copies go through L1) */
__device__ __forceinline__ void ds4_mq_cp4(void *smem, const void *gmem)
{
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(sa), "l"(gmem) : "memory");
}
__device__ __forceinline__ void ds4_mq_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void ds4_mq_cp_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Loads at 32-bit shared-window addresses (__cvta_generic_to_shared): the
 * compiler keeps generic 64-bit loads for pointers it cannot prove shared,
 * and a constant added to the address becomes the load's immediate. */
__device__ __forceinline__ uint32_t ds4_lds32(uint32_t a)
{
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(a));
    return v;
}
__device__ __forceinline__ uint32_t ds4_lds_u16(uint32_t a)
{
    unsigned short v;
    asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(a));
    return v;
}
__device__ __forceinline__ int ds4_lds_s16(uint32_t a)
{
    int v;
    asm volatile("ld.shared.s16 %0, [%1];" : "=r"(v) : "r"(a));
    return v;
}
__device__ __forceinline__ float ds4_lds_f32(uint32_t a)
{
    float v;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(a));
    return v;
}
__device__ __forceinline__ uint2 ds4_lds64(uint32_t a)
{
    uint2 v;
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(a));
    return v;
}
__device__ __forceinline__ uint4 ds4_lds128(uint32_t a)
{
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
    return v;
}

#endif

/*
 * cuda_numerics.cuh - device versions of the official-numerics simulations
 * of quant/fp8.c (dsv4-model.md §4.1 D1-D3), step for step the same float
 * operations so that the GPU rounds exactly as the CPU:
 *   E4M3 / E2M1 encode (RNE, saturating) and decode, the power-of-two block
 *   scale 2^ceil(log2(amax / max)) via frexpf, Hadamard-128 butterflies,
 *   f16 storage rounding (RNE, as __float2half_rn).
 */
#ifndef DS4_CUDA_NUMERICS_CUH
#define DS4_CUDA_NUMERICS_CUH

#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#define CB_E4M3_MAX 448.0f
#define CB_E2M1_MAX 6.0f

__device__ __forceinline__ float cb_e4m3_to_f32(uint32_t code)
{
    const int exp = (code >> 3) & 15, man = code & 7;
    float v;
    if ((code & 0x7F) == 0x7F) return __int_as_float(0x7fc00000);
    if (exp == 0) v = ldexpf((float)man, -9);
    else v = ldexpf(1.f + (float)man / 8.f, exp - 7);
    return code & 0x80 ? -v : v;
}

__device__ __forceinline__ uint32_t cb_f32_to_e4m3(float v)
{
    const uint32_t sign = signbit(v) ? 0x80 : 0;
    if (isnan(v)) return sign | 0x7F;
    const float a = fabsf(v);
    if (a >= CB_E4M3_MAX) return sign | 0x7E;
    if (a < 0x1p-6f) return sign | (uint32_t)(int)rintf(a * 0x1p9f);
    int e;
    frexpf(a, &e);
    int E = e - 1;
    int m = (int)rintf((ldexpf(a, -E) - 1.f) * 8.f);
    if (m == 8) {
        m = 0;
        E++;
    }
    int code = ((E + 7) << 3) | m;
    return sign | (uint32_t)(code > 0x7E ? 0x7E : code);
}

__device__ __forceinline__ float cb_e2m1_to_f32(uint32_t code)
{
    const float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
    const float v = mag[code & 7];
    return code & 8 ? -v : v;
}

__device__ __forceinline__ uint32_t cb_f32_to_e2m1(float v)
{
    if (isnan(v)) return 0;
    const uint32_t sign = signbit(v) ? 8 : 0;
    const float a = fabsf(v);
    if (a >= CB_E2M1_MAX) return sign | 7;
    if (a < 1.f) return sign | (uint32_t)(int)rintf(a * 2.f);
    int e;
    frexpf(a, &e);
    int E = e - 1;
    int m = (int)rintf((ldexpf(a, -E) - 1.f) * 2.f);
    if (m == 2) {
        m = 0;
        E++;
    }
    return sign | (uint32_t)(((E + 1) << 1) | m);
}

__device__ __forceinline__ float cb_pow2_ceil(float q)
{
    int e;
    float f = frexpf(q, &e);
    return ldexpf(1.f, f == 0.5f ? e - 1 : e);
}


/* One block of n values (a multiple of 32) by one warp: scale from the
 * floored amax, clamp, round, rescale; a non-finite amax poisons the block
 * (a serial thread per 64-value block in global memory took ~25 us per KV
 * row). amax by shuffles of fmaxf, which,
 * like a serial fmaxf loop, ignores NaN and keeps inf, so the order of the
 * reduction cannot change the result; each value is rounded by its lane. */
__device__ __forceinline__ void cb_roundtrip_block_warp(float *x, int n, float vmax, float amax_floor, int fp8)
{
    const int lane = threadIdx.x & 31;
    float amax = 0.f;
    for (int i = lane; i < n; i += 32) amax = fmaxf(amax, fabsf(x[i]));
    for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    if (!isfinite(amax)) {
        for (int i = lane; i < n; i += 32) x[i] = __int_as_float(0x7fc00000);
        return;
    }
    if (amax < amax_floor) amax = amax_floor;
    const float scale = cb_pow2_ceil(__fdiv_rn(amax, vmax));
    for (int i = lane; i < n; i += 32) {
        float v = __fdiv_rn(x[i], scale);
        v = v > vmax ? vmax : v < -vmax ? -vmax : v;
        const float r = fp8 ? cb_e4m3_to_f32(cb_f32_to_e4m3(v)) : cb_e2m1_to_f32(cb_f32_to_e2m1(v));
        x[i] = __fmul_rn(r, scale);
    }
}

__device__ __forceinline__ float cb_f16_round(float v) { return __half2float(__float2half_rn(v)); }

/* Cooperative (whole thread block, blockDim a multiple of 32) rounding of
 * one row in shared or global memory: D1 FP8 on dims [0, fp8_nope) by
 * 64-blocks, a warp per block, then D3 f16. */
__device__ __forceinline__ void cb_kv_round_row_block(float *row, int row_len, int fp8_nope, int f16_store)
{
    for (int b = threadIdx.x >> 5; b < fp8_nope / 64; b += blockDim.x >> 5)
        cb_roundtrip_block_warp(row + 64 * b, 64, CB_E4M3_MAX, 1e-4f, 1);
    __syncthreads();
    if (f16_store)
        for (int i = threadIdx.x; i < row_len; i += blockDim.x) row[i] = cb_f16_round(row[i]);
    __syncthreads();
}

/* Cooperative D2 on one 128-wide row (x: its 128 floats in shared memory):
 * Hadamard (butterflies at strides 1..64, then one multiply by the f32 of
 * 1/sqrt(128)), then FP4 by 32-blocks. WARP: one warp does the row with
 * warp barriers (a prefill chunk's QAT, a warp a row); else the whole
 * block with block barriers. The same operations in the same order either
 * way, so the same bits. */
template <bool WARP> __device__ __forceinline__ void cb_indexer_qat_row(float *x)
{
    const int t = WARP ? (int)(threadIdx.x & 31) : (int)threadIdx.x, nt = WARP ? 32 : (int)blockDim.x;
    const int w0 = WARP ? 0 : (int)(threadIdx.x >> 5), nw = WARP ? 1 : (int)(blockDim.x >> 5);
    for (int stride = 1; stride < 128; stride <<= 1) {
        if (WARP) __syncwarp();
        else __syncthreads();
        for (int k = t; k < 64; k += nt) {
            const int base = (k / stride) * 2 * stride, i = base + k % stride;
            const float a = x[i], b = x[i + stride];
            x[i] = __fadd_rn(a, b);
            x[i + stride] = __fsub_rn(a, b);
        }
    }
    if (WARP) __syncwarp();
    else __syncthreads();
    for (int i = t; i < 128; i += nt) x[i] = __fmul_rn(x[i], 0.08838834764831845f);
    if (WARP) __syncwarp();
    else __syncthreads();
    for (int b = w0; b < 4; b += nw) cb_roundtrip_block_warp(x + 32 * b, 32, CB_E2M1_MAX, 6.f * 0x1p-126f, 0);
    if (WARP) __syncwarp();
    else __syncthreads();
}

#endif

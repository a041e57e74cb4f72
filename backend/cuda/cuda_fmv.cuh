/*
 * cuda_fmv.cuh - the per-value math of the float-weight decode matvec
 * (cuda_fmv.cu), __host__ __device__ so that the host check
 * (cuda_host_check.cu) runs exactly the kernel's arithmetic.
 *
 * A "unit" is 16 bytes of a weight row: 8 F16 / BF16 values or 4 F32
 * values. A unit is decoded to f32 (exact for all three types) and dotted
 * with the matching x values by fused multiply-adds in value order, so a
 * lane's sum does not depend on the compiler's contraction choices.
 */
#ifndef DS4_CUDA_FMV_CUH
#define DS4_CUDA_FMV_CUH

#include "backend/cuda/cuda_blocks.cuh"

template <int T> struct ds4_fmv_t;
template <> struct ds4_fmv_t<DS4_TYPE_F16> { enum { VPU = 8 }; };
template <> struct ds4_fmv_t<DS4_TYPE_BF16> { enum { VPU = 8 }; };
template <> struct ds4_fmv_t<DS4_TYPE_F32> { enum { VPU = 4 }; };

/* The unit's values in row order (little-endian halves: low half first). */
template <int T> DS4_HD void ds4_fmv_decode(const uint4 &u, float (&w)[8]);

template <> DS4_HD void ds4_fmv_decode<DS4_TYPE_F16>(const uint4 &u, float (&w)[8])
{
    const uint32_t q[4] = {u.x, u.y, u.z, u.w};
    DS4_UNROLL
    for (int k = 0; k < 4; k++) {
        w[2 * k] = ds4_f16(q[k] & 0xffffu);
        w[2 * k + 1] = ds4_f16(q[k] >> 16);
    }
}

template <> DS4_HD void ds4_fmv_decode<DS4_TYPE_BF16>(const uint4 &u, float (&w)[8])
{
    const uint32_t q[4] = {u.x, u.y, u.z, u.w};
    DS4_UNROLL
    for (int k = 0; k < 4; k++) {
        w[2 * k] = ds4_bits_f32(q[k] << 16);
        w[2 * k + 1] = ds4_bits_f32(q[k] & 0xffff0000u);
    }
}

template <> DS4_HD void ds4_fmv_decode<DS4_TYPE_F32>(const uint4 &u, float (&w)[8])
{
    w[0] = ds4_bits_f32(u.x);
    w[1] = ds4_bits_f32(u.y);
    w[2] = ds4_bits_f32(u.z);
    w[3] = ds4_bits_f32(u.w);
    w[4] = w[5] = w[6] = w[7] = 0.0f;
}

/* acc + sum over the unit's values of w[k] * x[k], one fma per value, in
 * value order. */
template <int T> DS4_HD float ds4_fmv_dot(const float (&w)[8], const float (&x)[8], float acc)
{
    DS4_UNROLL
    for (int k = 0; k < ds4_fmv_t<T>::VPU; k++) acc = fmaf(w[k], x[k], acc);
    return acc;
}

/* The kernel's summation order, for the host check: a row is cut into
 * units; lane j of a group of G lanes (G = 32 x warps per row) sums units
 * j, j + G, ... in order; each warp adds its 32 lanes by a butterfly
 * (xor 16, 8, 4, 2, 1); a block's 8 warps' sums are added in warp order
 * from 0.
 * partial[] needs G floats. */
template <int T>
static inline float ds4_fmv_row_host(const uint8_t *row, int64_t units, const float *x, int G, float *partial)
{
    enum { VPU = ds4_fmv_t<T>::VPU };
    for (int j = 0; j < G; j++) {
        float acc = 0.0f;
        for (int64_t u = j; u < units; u += G) {
            uint4 q;
            memcpy(&q, row + 16 * u, 16);
            float w[8], xv[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            ds4_fmv_decode<T>(q, w);
            for (int k = 0; k < VPU; k++) xv[k] = x[u * VPU + k];
            acc = ds4_fmv_dot<T>(w, xv, acc);
        }
        partial[j] = acc;
    }
    float total = 0.0f; /* a warp per row stores its sum as is (no 0 + s) */
    for (int wi = 0; wi < G / 32; wi++) {
        float *p = partial + 32 * wi;
        for (int o = 16; o > 0; o >>= 1) {
            float nv[32];
            for (int l = 0; l < 32; l++) nv[l] = p[l] + p[l ^ o];
            memcpy(p, nv, sizeof nv);
        }
        total = G == 32 ? p[0] : total + p[0];
    }
    return total;
}

#endif

/*
 * cuda_blocks.cuh - decoding GGML weight blocks, shared by every CUDA kernel
 * and by the host-side check (cuda_host_check.cu).
 *
 * The unit of work is a "piece": 32 consecutive values of a row. Every
 * supported type splits into pieces (Q8_0 and MXFP4 blocks are one piece,
 * the 256-value K-quant and IQ2_XXS blocks eight), so one kernel shape fits
 * all types: a lane decodes a piece into 32 raw floats plus, per half of 16
 * values, a scale and a min, and the value is  scale * raw - min.
 * Factoring the scale out lets the matvec multiply raw values by x and
 * apply the scale once per half:  sum(v x) = sc*sum(raw x) - mn*sum(x).
 *
 * The functions are __host__ __device__ so that the exact same decoding
 * runs on the CPU in tests (no GPU needed) and compares bit for bit with
 * ggml's dequantization in tests/data/quants.
 *
 * Format facts (ggml-common.h layouts, see quant/blocks.h):
 *   Q8_0    v = d * q
 *   Q2_K    value e of a block: h = e/128, j = (e%128)/32, l = e%32;
 *           q = (qs[32h + l] >> 2j) & 3, scale byte scales[8h + 2j + l/16]
 *           v = d * (s & 15) * q - dmin * (s >> 4)
 *   Q4_K    piece p (0..7) uses qs[32(p/2) + l], low nibble for even p,
 *           6-bit scale/min pair p of the 12 packed scale bytes
 *   IQ2_XXS piece p: u32 a = grid indices (4 bytes), u32 b = 4 x 7 sign
 *           bits + 4-bit scale in the top; v = d*(0.5 + b>>28)/4 * grid * sign;
 *           the 8th sign bit of each group is the parity of the other 7
 *   MXFP4   v = E2M1[q] (table values doubled) * 2^(e - 128)
 */
#ifndef DS4_CUDA_BLOCKS_CUH
#define DS4_CUDA_BLOCKS_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "quant/blocks.h"

#define DS4_HD __host__ __device__ __forceinline__

/* "#pragma unroll" only where nvcc compiles for the device; the host
 * compiler would warn about it (and -Werror). */
#ifdef __CUDA_ARCH__
#define DS4_UNROLL _Pragma("unroll")
#else
#define DS4_UNROLL
#endif

/* Lookup tables the decoders need; on the device they point to shared
 * memory, on the host to static arrays. */
struct ds4_luts {
    const uint64_t *iq2xxs_grid; /* 256 entries */
    const float *mxfp4;          /* 16 entries, E2M1 values doubled */
};

/* Static facts per type: values and bytes per block, and whether the
 * decoded value has a min term. */
template <int T> struct ds4_qt;
template <> struct ds4_qt<DS4_TYPE_Q8_0> { enum { BE = 32, BB = 34, MIN = 0 }; };
template <> struct ds4_qt<DS4_TYPE_Q2_K> { enum { BE = 256, BB = 84, MIN = 1 }; };
template <> struct ds4_qt<DS4_TYPE_Q4_K> { enum { BE = 256, BB = 144, MIN = 1 }; };
template <> struct ds4_qt<DS4_TYPE_IQ2_XXS> { enum { BE = 256, BB = 66, MIN = 0 }; };
template <> struct ds4_qt<DS4_TYPE_MXFP4> { enum { BE = 32, BB = 17, MIN = 0 }; };
template <> struct ds4_qt<DS4_TYPE_F16> { enum { BE = 1, BB = 2, MIN = 0 }; };
template <> struct ds4_qt<DS4_TYPE_BF16> { enum { BE = 1, BB = 2, MIN = 0 }; };
template <> struct ds4_qt<DS4_TYPE_F32> { enum { BE = 1, BB = 4, MIN = 0 }; };

/* ---- loads that work on host (any alignment) and device (aligned) ------ */

DS4_HD uint32_t ds4_ld_u16(const uint8_t *p)
{
#ifdef __CUDA_ARCH__
    return *(const uint16_t *)p;
#else
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
#endif
}

DS4_HD uint32_t ds4_ld_u32(const uint8_t *p)
{
#ifdef __CUDA_ARCH__
    return *(const uint32_t *)p;
#else
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
#endif
}

DS4_HD float ds4_bits_f32(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

DS4_HD float4 ds4_ld_f4(const float *p)
{
#ifdef __CUDA_ARCH__
    return __ldg((const float4 *)p);
#else
    float4 v;
    memcpy(&v, p, sizeof v);
    return v;
#endif
}

DS4_HD int ds4_popc(uint32_t v)
{
#ifdef __CUDA_ARCH__
    return __popc(v);
#else
    return __builtin_popcount(v);
#endif
}

DS4_HD float ds4_f16(uint32_t bits)
{
    __half_raw r;
    r.x = (unsigned short)bits;
    return __half2float(__half(r));
}

DS4_HD float ds4_bf16(uint32_t bits) { return ds4_bits_f32(bits << 16); }

/* E8M0 exponent to 2^(e-128): the MXFP4 scale with the table's doubling
 * undone. e < 2 gives a subnormal float. */
DS4_HD float ds4_e8m0_half(uint32_t e)
{
    return ds4_bits_f32(e < 2 ? (0x00200000u << e) : ((e - 1) << 23));
}

/* ---- piece decoders: w[32] raw values, sc/mn per half of 16 ----------- */

template <int T>
DS4_HD void ds4_decode_piece(const uint8_t *row, int p, float (&w)[32],
                             float (&sc)[2], float (&mn)[2], const ds4_luts &L);

template <>
DS4_HD void ds4_decode_piece<DS4_TYPE_Q8_0>(const uint8_t *row, int p,
                                            float (&w)[32], float (&sc)[2],
                                            float (&mn)[2], const ds4_luts &L)
{
    (void)L;
    const uint8_t *b = row + (int64_t)p * 34;
    float d = ds4_f16(ds4_ld_u16(b));
DS4_UNROLL
    for (int k = 0; k < 16; k++) {
        uint32_t u = ds4_ld_u16(b + 2 + 2 * k);
        w[2 * k] = (float)(int8_t)(u & 0xff);
        w[2 * k + 1] = (float)(int8_t)(u >> 8);
    }
    sc[0] = sc[1] = d;
    mn[0] = mn[1] = 0.0f;
}

template <>
DS4_HD void ds4_decode_piece<DS4_TYPE_Q2_K>(const uint8_t *row, int p,
                                            float (&w)[32], float (&sc)[2],
                                            float (&mn)[2], const ds4_luts &L)
{
    (void)L;
    const uint8_t *b = row + (int64_t)(p >> 3) * 84;
    int h = (p >> 2) & 1, j = p & 3;
    float d = ds4_f16(ds4_ld_u16(b + 80));
    float dmin = ds4_f16(ds4_ld_u16(b + 82));
    uint32_t s0 = b[8 * h + 2 * j], s1 = b[8 * h + 2 * j + 1];
    sc[0] = d * (float)(s0 & 15);
    sc[1] = d * (float)(s1 & 15);
    mn[0] = dmin * (float)(s0 >> 4);
    mn[1] = dmin * (float)(s1 >> 4);
    const uint8_t *q = b + 16 + 32 * h;
    int shift = 2 * j;
DS4_UNROLL
    for (int i = 0; i < 8; i++) {
        uint32_t u = ds4_ld_u32(q + 4 * i) >> shift;
DS4_UNROLL
        for (int k = 0; k < 4; k++) w[4 * i + k] = (float)((u >> (8 * k)) & 3);
    }
}

template <>
DS4_HD void ds4_decode_piece<DS4_TYPE_Q4_K>(const uint8_t *row, int p,
                                            float (&w)[32], float (&sc)[2],
                                            float (&mn)[2], const ds4_luts &L)
{
    (void)L;
    const uint8_t *b = row + (int64_t)(p >> 3) * 144;
    int j = p & 7;
    float d = ds4_f16(ds4_ld_u16(b));
    float dmin = ds4_f16(ds4_ld_u16(b + 2));
    const uint8_t *s = b + 4;
    uint32_t scv, mv;
    if (j < 4) {
        scv = s[j] & 63;
        mv = s[j + 4] & 63;
    } else {
        scv = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        mv = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    sc[0] = sc[1] = d * (float)scv;
    mn[0] = mn[1] = dmin * (float)mv;
    const uint8_t *q = b + 16 + 32 * (j >> 1);
    int shift = 4 * (j & 1);
DS4_UNROLL
    for (int i = 0; i < 8; i++) {
        uint32_t u = ds4_ld_u32(q + 4 * i) >> shift;
DS4_UNROLL
        for (int k = 0; k < 4; k++) w[4 * i + k] = (float)((u >> (8 * k)) & 15);
    }
}

template <>
DS4_HD void ds4_decode_piece<DS4_TYPE_IQ2_XXS>(const uint8_t *row, int p,
                                               float (&w)[32], float (&sc)[2],
                                               float (&mn)[2], const ds4_luts &L)
{
    const uint8_t *b = row + (int64_t)(p >> 3) * 66;
    const uint8_t *q = b + 2 + 8 * (p & 7);
    float d = ds4_f16(ds4_ld_u16(b));
    uint32_t a = ds4_ld_u16(q) | (ds4_ld_u16(q + 2) << 16);
    uint32_t s = ds4_ld_u16(q + 4) | (ds4_ld_u16(q + 6) << 16);
    float db = d * (0.5f + (float)(s >> 28)) * 0.25f;
DS4_UNROLL
    for (int l = 0; l < 4; l++) {
        uint64_t g = L.iq2xxs_grid[(a >> (8 * l)) & 0xff];
        uint32_t s7 = (s >> (7 * l)) & 127;
        uint32_t signs = s7 | ((uint32_t)(ds4_popc(s7) & 1) << 7);
DS4_UNROLL
        for (int k = 0; k < 8; k++) {
            float m = (float)(uint32_t)((g >> (8 * k)) & 0xff);
            w[8 * l + k] = (signs >> k) & 1 ? -m : m;
        }
    }
    sc[0] = sc[1] = db;
    mn[0] = mn[1] = 0.0f;
}

template <>
DS4_HD void ds4_decode_piece<DS4_TYPE_MXFP4>(const uint8_t *row, int p,
                                             float (&w)[32], float (&sc)[2],
                                             float (&mn)[2], const ds4_luts &L)
{
    const uint8_t *b = row + (int64_t)p * 17;
    float d = ds4_e8m0_half(b[0]);
DS4_UNROLL
    for (int k = 0; k < 16; k++) {
        uint32_t u = b[1 + k];
        w[k] = L.mxfp4[u & 15];
        w[k + 16] = L.mxfp4[u >> 4];
    }
    sc[0] = sc[1] = d;
    mn[0] = mn[1] = 0.0f;
}

template <>
DS4_HD void ds4_decode_piece<DS4_TYPE_F16>(const uint8_t *row, int p,
                                           float (&w)[32], float (&sc)[2],
                                           float (&mn)[2], const ds4_luts &L)
{
    (void)L;
    const uint8_t *b = row + (int64_t)p * 64;
DS4_UNROLL
    for (int k = 0; k < 32; k++) w[k] = ds4_f16(ds4_ld_u16(b + 2 * k));
    sc[0] = sc[1] = 1.0f;
    mn[0] = mn[1] = 0.0f;
}

template <>
DS4_HD void ds4_decode_piece<DS4_TYPE_BF16>(const uint8_t *row, int p,
                                            float (&w)[32], float (&sc)[2],
                                            float (&mn)[2], const ds4_luts &L)
{
    (void)L;
    const uint8_t *b = row + (int64_t)p * 64;
DS4_UNROLL
    for (int k = 0; k < 32; k++) w[k] = ds4_bf16(ds4_ld_u16(b + 2 * k));
    sc[0] = sc[1] = 1.0f;
    mn[0] = mn[1] = 0.0f;
}

template <>
DS4_HD void ds4_decode_piece<DS4_TYPE_F32>(const uint8_t *row, int p,
                                           float (&w)[32], float (&sc)[2],
                                           float (&mn)[2], const ds4_luts &L)
{
    (void)L;
    const uint8_t *b = row + (int64_t)p * 128;
DS4_UNROLL
    for (int k = 0; k < 32; k++) w[k] = ds4_bits_f32(ds4_ld_u32(b + 4 * k));
    sc[0] = sc[1] = 1.0f;
    mn[0] = mn[1] = 0.0f;
}

/* acc[t] += sum over the piece of value * x_t, for NT tokens whose inputs
 * start at x + t * x_stride (x already offset to the piece's column). */
template <int T, int NT>
DS4_HD void ds4_dot_piece(const uint8_t *row, int p, const float *x,
                          int64_t x_stride, float (&acc)[NT], const ds4_luts &L)
{
    float w[32], sc[2], mn[2];
    ds4_decode_piece<T>(row, p, w, sc, mn, L);
DS4_UNROLL
    for (int t = 0; t < NT; t++) {
        const float *xt = x + t * x_stride;
        float s[2] = {0.0f, 0.0f}, m[2] = {0.0f, 0.0f};
DS4_UNROLL
        for (int k = 0; k < 32; k += 4) {
            float4 v = ds4_ld_f4(xt + k);
            s[k >> 4] += w[k] * v.x + w[k + 1] * v.y + w[k + 2] * v.z + w[k + 3] * v.w;
            if (ds4_qt<T>::MIN) m[k >> 4] += (v.x + v.y) + (v.z + v.w);
        }
        float r = sc[0] * s[0] + sc[1] * s[1];
        if (ds4_qt<T>::MIN) r -= mn[0] * m[0] + mn[1] * m[1];
        acc[t] += r;
    }
}

/* Dispatch a ds4_type to a template functor call F::template run<T>(args). */
#define DS4_CUDA_FOR_TYPE(type, F, ...)                                          \
    switch (type) {                                                              \
    case DS4_TYPE_Q8_0: return F::template run<DS4_TYPE_Q8_0>(__VA_ARGS__);      \
    case DS4_TYPE_Q2_K: return F::template run<DS4_TYPE_Q2_K>(__VA_ARGS__);      \
    case DS4_TYPE_Q4_K: return F::template run<DS4_TYPE_Q4_K>(__VA_ARGS__);      \
    case DS4_TYPE_IQ2_XXS: return F::template run<DS4_TYPE_IQ2_XXS>(__VA_ARGS__);\
    case DS4_TYPE_MXFP4: return F::template run<DS4_TYPE_MXFP4>(__VA_ARGS__);    \
    case DS4_TYPE_F16: return F::template run<DS4_TYPE_F16>(__VA_ARGS__);        \
    case DS4_TYPE_BF16: return F::template run<DS4_TYPE_BF16>(__VA_ARGS__);      \
    case DS4_TYPE_F32: return F::template run<DS4_TYPE_F32>(__VA_ARGS__);        \
    default: break;                                                              \
    }

#endif

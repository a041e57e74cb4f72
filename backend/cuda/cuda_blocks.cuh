/*
 * cuda_blocks.cuh - decoding GGML weight blocks, shared by every CUDA kernel
 * and by the host-side check (cuda_host_check.cu).
 *
 * The unit of work is an "octet": 8 consecutive values of a row (one
 * IQ2_XXS grid entry; never across a 16-value sub-block of any type), so
 * one kernel shape fits all types: a thread decodes an octet into 8 raw
 * floats plus one scale and one min, and the value is  sc * raw - mn.
 * Factoring the scale out lets the matvec multiply raw values by x and
 * apply the scale once per octet:  sum(v x) = sc*sum(raw x) - mn*sum(x).
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
 *   Q4_K    value e: j = e/32 uses qs[32(j/2) + e%32], low nibble for
 *           even j, and the 6-bit scale/min pair j of the 12 scale bytes
 *   IQ2_XXS per 32 values: u32 a = grid indices (4 bytes), u32 b = 4 x 7 sign
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

#include "backend/cuda/cuda_weight_runs.cuh"
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
    bool iq2_runs;               /* IQ2_XXS rows in runs of 8 blocks (cuda_weight_runs.cuh) */
    bool q2k_runs;               /* Q2_K rows in runs of 4 blocks (cuda_weight_runs.cuh) */
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

/* ---- octet decoders: 8 raw values w[], value = sc * w - mn ----------- */
/* o is the octet index in the row (values 8o .. 8o+7); an octet never
 * straddles a 16-value sub-block, so one (sc, mn) pair covers it. */

template <int T>
DS4_HD void ds4_decode_octet(const uint8_t *row, int64_t o, float (&w)[8], float &sc, float &mn,
                             const ds4_luts &L);

template <>
DS4_HD void ds4_decode_octet<DS4_TYPE_Q8_0>(const uint8_t *row, int64_t o, float (&w)[8],
                                            float &sc, float &mn, const ds4_luts &L)
{
    (void)L;
    const uint8_t *b = row + (o >> 2) * 34;
    const uint8_t *q = b + 2 + 8 * (o & 3);
    sc = ds4_f16(ds4_ld_u16(b));
    mn = 0.0f;
    DS4_UNROLL
    for (int k = 0; k < 4; k++) {
        uint32_t u = ds4_ld_u16(q + 2 * k);
        w[2 * k] = (float)(int8_t)(u & 0xff);
        w[2 * k + 1] = (float)(int8_t)(u >> 8);
    }
}

template <>
DS4_HD void ds4_decode_octet<DS4_TYPE_Q2_K>(const uint8_t *row, int64_t o, float (&w)[8],
                                            float &sc, float &mn, const ds4_luts &L)
{
    const int64_t blk = o >> 5;
    const uint8_t *dd = row + ds4_q2k_dd_ofs(blk, L.q2k_runs);
    const int e0 = 8 * (int)(o & 31), h = e0 >> 7, j = (e0 >> 5) & 3, l0 = e0 & 31;
    const uint32_t s = row[ds4_q2k_sc_ofs(blk, L.q2k_runs) + 8 * h + 2 * j + (l0 >> 4)];
    sc = ds4_f16(ds4_ld_u16(dd)) * (float)(s & 15);
    mn = ds4_f16(ds4_ld_u16(dd + 2)) * (float)(s >> 4);
    const uint8_t *q = row + ds4_q2k_qs_ofs(blk, L.q2k_runs) + 32 * h + l0;
    DS4_UNROLL
    for (int i = 0; i < 2; i++) {
        uint32_t u = ds4_ld_u32(q + 4 * i) >> (2 * j);
        DS4_UNROLL
        for (int k = 0; k < 4; k++) w[4 * i + k] = (float)((u >> (8 * k)) & 3);
    }
}

template <>
DS4_HD void ds4_decode_octet<DS4_TYPE_Q4_K>(const uint8_t *row, int64_t o, float (&w)[8],
                                            float &sc, float &mn, const ds4_luts &L)
{
    (void)L;
    const uint8_t *b = row + (o >> 5) * 144;
    const int e0 = 8 * (int)(o & 31), j = e0 >> 5, l0 = e0 & 31;
    const uint8_t *s = b + 4;
    uint32_t scv, mv;
    if (j < 4) {
        scv = s[j] & 63;
        mv = s[j + 4] & 63;
    } else {
        scv = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        mv = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    sc = ds4_f16(ds4_ld_u16(b)) * (float)scv;
    mn = ds4_f16(ds4_ld_u16(b + 2)) * (float)mv;
    const uint8_t *q = b + 16 + 32 * (j >> 1) + l0;
    DS4_UNROLL
    for (int i = 0; i < 2; i++) {
        uint32_t u = ds4_ld_u32(q + 4 * i) >> (4 * (j & 1));
        DS4_UNROLL
        for (int k = 0; k < 4; k++) w[4 * i + k] = (float)((u >> (8 * k)) & 15);
    }
}

template <>
DS4_HD void ds4_decode_octet<DS4_TYPE_IQ2_XXS>(const uint8_t *row, int64_t o, float (&w)[8],
                                               float &sc, float &mn, const ds4_luts &L)
{
    const int64_t blk = o >> 5;
    const uint8_t *q = row + ds4_iq2_qs_ofs(blk, L.iq2_runs) + 8 * ((o >> 2) & 7);
    const int l = (int)(o & 3);
    const uint32_t s = ds4_ld_u16(q + 4) | (ds4_ld_u16(q + 6) << 16);
    sc = ds4_f16(ds4_ld_u16(row + ds4_iq2_d_ofs(blk, L.iq2_runs))) * (0.5f + (float)(s >> 28)) * 0.25f;
    mn = 0.0f;
    const uint64_t g = L.iq2xxs_grid[q[l]];
    const uint32_t s7 = (s >> (7 * l)) & 127;
    const uint32_t signs = s7 | ((uint32_t)(ds4_popc(s7) & 1) << 7);
    DS4_UNROLL
    for (int k = 0; k < 8; k++) {
        float m = (float)(uint32_t)((g >> (8 * k)) & 0xff);
        w[k] = (signs >> k) & 1 ? -m : m;
    }
}

template <>
DS4_HD void ds4_decode_octet<DS4_TYPE_MXFP4>(const uint8_t *row, int64_t o, float (&w)[8],
                                             float &sc, float &mn, const ds4_luts &L)
{
    const uint8_t *b = row + (o >> 2) * 17;
    const int part = (int)(o & 3);
    const uint8_t *q = b + 1 + 8 * (part & 1);
    sc = ds4_e8m0_half(b[0]);
    mn = 0.0f;
    const int shift = 4 * (part >> 1);
    DS4_UNROLL
    for (int k = 0; k < 8; k++) w[k] = L.mxfp4[(q[k] >> shift) & 15];
}

template <>
DS4_HD void ds4_decode_octet<DS4_TYPE_F16>(const uint8_t *row, int64_t o, float (&w)[8],
                                           float &sc, float &mn, const ds4_luts &L)
{
    (void)L;
    const uint8_t *b = row + o * 16;
    DS4_UNROLL
    for (int k = 0; k < 8; k++) w[k] = ds4_f16(ds4_ld_u16(b + 2 * k));
    sc = 1.0f;
    mn = 0.0f;
}

template <>
DS4_HD void ds4_decode_octet<DS4_TYPE_BF16>(const uint8_t *row, int64_t o, float (&w)[8],
                                            float &sc, float &mn, const ds4_luts &L)
{
    (void)L;
    const uint8_t *b = row + o * 16;
    DS4_UNROLL
    for (int k = 0; k < 8; k++) w[k] = ds4_bf16(ds4_ld_u16(b + 2 * k));
    sc = 1.0f;
    mn = 0.0f;
}

template <>
DS4_HD void ds4_decode_octet<DS4_TYPE_F32>(const uint8_t *row, int64_t o, float (&w)[8],
                                           float &sc, float &mn, const ds4_luts &L)
{
    (void)L;
    const uint8_t *b = row + o * 32;
    DS4_UNROLL
    for (int k = 0; k < 8; k++) w[k] = ds4_bits_f32(ds4_ld_u32(b + 4 * k));
    sc = 1.0f;
    mn = 0.0f;
}

/* sum(w * x) of one decoded octet: sc * sum(raw * x) - mn * sum(x). xs is
 * sum(x) (only used by the types with a min). */
template <int T>
DS4_HD float ds4_octet_dot(const float (&w)[8], float sc, float mn, const float (&x)[8], float xs)
{
    float d = 0.0f;
    DS4_UNROLL
    for (int k = 0; k < 8; k++) d += w[k] * x[k];
    return ds4_qt<T>::MIN ? sc * d - mn * xs : sc * d;
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

/*
 * cuda_mmvq.cuh - the integer pieces of the decode matvec on quantized
 * activations (cuda_mmvq.cu), shared by the kernels and by the host check
 * (cuda_host_check.cu), so `make test` on a machine without a GPU proves
 * that they compute the CPU's numbers.
 *
 * The CPU multiplies Q8_0 / MXFP4 weights by Q8_0 activations and the
 * K-quants (Q2_K, IQ2_XXS) by Q8_K activations (backend/cpu/
 * cpu_matmul_act.c, ggml's formats). Doing the same on the GPU, with the
 * same quantizer bit for bit, makes every block's integer dot product equal
 * to the CPU's; only the float sum over blocks runs in another order. It
 * is also what makes the kernel fast: 4 weight bytes times 4 activation
 * bytes per dp4a instruction instead of a float conversion and an FMA per
 * value.
 *
 * Activation rows use the CPU's layout (cpu_matmul_kernels.h):
 *   Q8_0: int8 qs[n]; float d[n/32]
 *   Q8_K: int8 qs[n]; float d[n/256]; int16 bsums[n/16]
 * one row taking ds4_mmvq_act_row_bytes() bytes (a multiple of 64).
 *
 * Work unit ("task") of one lane, and the integer it returns:
 *   Q8_0     one block of 32 values          sum q_w * q_x
 *   Q2_K     a quarter block (64 values)     (sum sc*dot16, sum m*bsum) pair
 *   IQ2_XXS  one 32-value group              ls * sum grid*sign*q_x
 * Each lane turns its task's integers into a float term with the block's
 * scales (ds4_mq_term, the CPU scalar kernel's operation order); the CPU
 * sums a block's integers before that product, so Q2_K and IQ2_XXS terms
 * differ from the CPU's in float rounding only.
 */
#ifndef DS4_CUDA_MMVQ_CUH
#define DS4_CUDA_MMVQ_CUH

#include "backend/cuda/cuda_blocks.cuh"

/* Tasks per block, values per task. */
template <int T> struct ds4_mmvq_t;
template <> struct ds4_mmvq_t<DS4_TYPE_Q8_0> { enum { TPB = 1, BE = 32, BB = 34 }; };
template <> struct ds4_mmvq_t<DS4_TYPE_Q2_K> { enum { TPB = 4, BE = 256, BB = 84 }; };
template <> struct ds4_mmvq_t<DS4_TYPE_IQ2_XXS> { enum { TPB = 8, BE = 256, BB = 66 }; };

/* Bytes of one activation row of n values in the Q8_0 (k = 0) or Q8_K
 * (k = 1) format, as ds4_act_row_bytes on the CPU. */
DS4_HD int64_t ds4_mmvq_act_row_bytes(int k, int64_t n)
{
    const int64_t b = k ? n + 4 * (n / 256) + 2 * (n / 16) : n + 4 * (n / 32);
    return (b + 63) & ~(int64_t)63;
}

/* ---- the activation quantizers, value by value ------------------------- */

/* roundf (half away from zero) as the CPU's round_away, non-finite and
 * out-of-range inputs clamped the same way. */
DS4_HD int ds4_mmvq_round_away(float x)
{
    if (!(x > -128.0f && x < 128.0f)) return x > 0 ? 127 : x < 0 ? -127 : 0;
    const int i = (int)x;
    const float r = x - (float)i;
    return i + (r >= 0.5f) - (r <= -0.5f);
}

/* Nearest, ties to even, for |f| < 2^22 (the CPU's nearest_even). */
DS4_HD int ds4_mmvq_nearest_even(float f)
{
#ifdef __CUDA_ARCH__
    return __float2int_rn(f);
#else
    union { float f; int32_t i; } v = {f + 12582912.0f};
    return (v.i & 0x007fffff) - 0x00400000;
#endif
}

/* f32 rounded to f16 and back (the stored Q8_0 scale), nearest even. */
DS4_HD float ds4_mmvq_round_f16(float d)
{
    return __half2float(__float2half_rn(d));
}

/* Q8_0: amax of the 32 values -> the value's int8 and the block's scale. */
DS4_HD float ds4_mmvq_q8_0_id(float amax)
{
    const float d = amax / 127.0f;
    return d != 0.0f ? 1.0f / d : 0.0f;
}
DS4_HD int8_t ds4_mmvq_q8_0_q(float x, float id) { return (int8_t)ds4_mmvq_round_away(x * id); }
DS4_HD float ds4_mmvq_q8_0_d(float amax) { return ds4_mmvq_round_f16(amax / 127.0f); }

/* Q8_K: `max` is the first value of largest magnitude in the 256 (the CPU
 * scans in order with a strict >); 0 when all are zero. */
DS4_HD int8_t ds4_mmvq_q8_k_q(float x, float iscale)
{
    const int v = ds4_mmvq_nearest_even(iscale * x);
    return (int8_t)(v > 127 ? 127 : v);
}

/* ---- integer dot products ------------------------------------------------ */

DS4_HD int ds4_dp4a(uint32_t a, uint32_t b, int c)
{
#ifdef __CUDA_ARCH__
    return __dp4a((int)a, (int)b, c);
#else
    for (int k = 0; k < 4; k++) c += (int)(int8_t)(a >> (8 * k)) * (int)(int8_t)(b >> (8 * k));
    return c;
#endif
}

/* A 32-bit word at a 2-byte aligned address, from the aligned words around
 * it (one funnel shift on the device; shared memory has no unaligned loads). */
DS4_HD uint32_t ds4_mmvq_u32_a2(const uint8_t *p)
{
#ifdef __CUDA_ARCH__
    const uint32_t *q = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
    return __funnelshift_r(q[0], q[1], (unsigned)((uintptr_t)p & 3) * 8u);
#else
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
#endif
}

/* 16 activation bytes at a 16-aligned address (one vector load, through
 * the read-only cache, on the device; SH: from shared memory, where the
 * kernel quantized the activation itself). */
template <bool SH = false> DS4_HD void ds4_mmvq_ld16(const uint8_t *p, uint32_t v[4])
{
#ifdef __CUDA_ARCH__
    const uint4 u = SH ? *(const uint4 *)p : __ldg((const uint4 *)p);
    v[0] = u.x; v[1] = u.y; v[2] = u.z; v[3] = u.w;
#else
    memcpy(v, p, 16);
#endif
}

/* ---- a task: its weights decoded once to int8 words, then dotted with
 * each token's activations (several tokens share one decode) ----------- */

/* Q8_0 block (34 bytes at a 2-aligned address): 8 words of int8 and d. */
struct ds4_mq_q8_0 {
    uint32_t w[8];
    float d;
};
DS4_HD void ds4_mq_decode(const uint8_t *blk, int part, const uint64_t *grid, const uint64_t *signs, ds4_mq_q8_0 &t)
{
    (void)part;
    (void)grid;
    (void)signs;
    DS4_UNROLL
    for (int i = 0; i < 8; i++) t.w[i] = ds4_mmvq_u32_a2(blk + 2 + 4 * i);
    t.d = ds4_f16(ds4_ld_u16(blk));
}
/* . the block's 32 activation int8 (xq_blk, 16-aligned) */
template <bool SH = false>
DS4_HD int ds4_mq_dot(const ds4_mq_q8_0 &t, const uint8_t *xq_blk, const int16_t *bsums_blk, int part, int *ms)
{
    (void)bsums_blk;
    (void)part;
    *ms = 0;
    uint32_t x[8];
    ds4_mmvq_ld16<SH>(xq_blk, x);
    ds4_mmvq_ld16<SH>(xq_blk + 16, x + 4);
    int s = 0;
    DS4_UNROLL
    for (int i = 0; i < 8; i++) s = ds4_dp4a(t.w[i], x[i], s);
    return s;
}

/* Q2_K quarter `part` (0..3) of a block (84 bytes, 4-aligned): its 4
 * sub-blocks of 16 are j = 0..3 of half h = part / 2, values 16 hh .. 16
 * hh + 15 of each 32 with hh = part % 2 (value e = 128 h + 32 j + 16 hh +
 * i; sub-block 8 h + 2 j + hh). The 2-bit values are unpacked to bytes. */
struct ds4_mq_q2_k {
    uint32_t w[16]; /* w[4 j + k]: bytes 4k .. 4k+3 of sub-block j */
    uint32_t sc;    /* the 4 scale bytes (low nibble scale, high nibble min) */
    float d, dmin;
};
/* sc, qs, dd: the block's 16 scale bytes, 64 quant bytes and (d, dmin)
 * (the GGUF layout's blk, blk + 16, blk + 80; in runs, cuda_weight_runs.cuh) */
DS4_HD void ds4_mq_decode_q2k(const uint8_t *sc, const uint8_t *qs, const uint8_t *dd, int part, ds4_mq_q2_k &t)
{
    const int h = part >> 1, hh = part & 1;
    uint32_t q[4];
    DS4_UNROLL
    for (int k = 0; k < 4; k++) q[k] = ds4_ld_u32(qs + 32 * h + 16 * hh + 4 * k);
    DS4_UNROLL
    for (int j = 0; j < 4; j++)
        DS4_UNROLL
        for (int k = 0; k < 4; k++) t.w[4 * j + k] = (q[k] >> (2 * j)) & 0x03030303u;
    t.sc = 0;
    DS4_UNROLL
    for (int j = 0; j < 4; j++) t.sc |= (uint32_t)sc[8 * h + 2 * j + hh] << (8 * j);
    t.d = ds4_f16(ds4_ld_u16(dd));
    t.dmin = ds4_f16(ds4_ld_u16(dd + 2));
}
/* The GGUF layout's block at blk. */
DS4_HD void ds4_mq_decode(const uint8_t *blk, int part, const uint64_t *grid, const uint64_t *signs, ds4_mq_q2_k &t)
{
    (void)grid;
    (void)signs;
    ds4_mq_decode_q2k(blk, blk + 16, blk + 80, part, t);
}
/* . the block's 256 activation int8 and its 16 sums: sum of scale * dot16
 * returned, sum of min * bsum in *ms */
template <bool SH = false>
DS4_HD int ds4_mq_dot(const ds4_mq_q2_k &t, const uint8_t *xq_blk, const int16_t *bsums_blk, int part, int *ms)
{
    const int h = part >> 1, hh = part & 1;
    int is = 0, m = 0;
    DS4_UNROLL
    for (int j = 0; j < 4; j++) {
        const int sb = 8 * h + 2 * j + hh;
        const uint32_t sc = (t.sc >> (8 * j)) & 255u;
        uint32_t xv[4];
        ds4_mmvq_ld16<SH>(xq_blk + 16 * sb, xv);
        int si = 0;
        DS4_UNROLL
        for (int k = 0; k < 4; k++) si = ds4_dp4a(t.w[4 * j + k], xv[k], si);
        is += (int)(sc & 15) * si;
        m += (int)(sc >> 4) * (int)bsums_blk[sb];
    }
    *ms = m;
    return is;
}

/* 4 sign bits -> byte masks 0x00 / 0xff: bit k goes to bit 8k by the
 * multiply (the shifted copies do not overlap, so nothing carries). */
DS4_HD uint32_t ds4_mmvq_sign_mask4(uint32_t s4)
{
#ifdef __CUDA_ARCH__
    /* two instructions: bit k to the top bit of byte k (copies at 7, 14,
     * 21, 28: no overlap), then prmt's sign-replicating selectors (8 | k)
     * fill byte k from its top bit */
    uint32_t r;
    asm("prmt.b32 %0, %1, 0, 0xBA98;" : "=r"(r) : "r"(s4 * 0x10204080u));
    return r;
#else
    return ((s4 * 0x00204081u) & 0x01010101u) * 0xffu;
#endif
}

/* The byte masks of a 7-bit IQ2_XXS sign index: the 8th sign is the
 * parity of the 7; low word for values 0..3, high word for 4..7. A kernel
 * keeps the 128 of them in shared memory (`signs`), which saves the
 * decode more than half its instructions; NULL computes them. */
DS4_HD uint64_t ds4_mmvq_sign_masks(uint32_t s7)
{
    const uint32_t s = s7 | (uint32_t)(ds4_popc(s7) & 1) << 7;
    return (uint64_t)ds4_mmvq_sign_mask4(s & 15) | (uint64_t)ds4_mmvq_sign_mask4(s >> 4) << 32;
}

/* IQ2_XXS group `part` (0..7, 32 values) of a block (66 bytes, 2-aligned):
 * grid rows with their signs applied, as signed bytes, and the group's
 * odd scale ls; grid = the 256 eight-byte grid rows. */
struct ds4_mq_iq2_xxs {
    uint32_t w[8];
    int ls;
    float d;
};
/* The two words of IQ2_XXS group `part` of a block whose groups start at
 * qs (2-aligned: the GGUF layout's blk + 2; in runs 8-aligned,
 * cuda_weight_runs.cuh): a = its 4 grid indices, b = its 4 x 7 sign bits and
 * the scale nibble (on the device 3 aligned words and 2 funnel shifts:
 * shared memory has no unaligned loads). */
DS4_HD void ds4_mq_iq2_words(const uint8_t *qs, int part, uint32_t *a, uint32_t *b)
{
#ifdef __CUDA_ARCH__
    const uint8_t *p = qs + 8 * part;
    const uint32_t *q = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
    const unsigned sh = (unsigned)((uintptr_t)p & 3) * 8u;
    const uint32_t q0 = q[0], q1 = q[1], q2 = q[2];
    *a = __funnelshift_r(q0, q1, sh);
    *b = __funnelshift_r(q1, q2, sh);
#else
    *a = ds4_mmvq_u32_a2(qs + 8 * part);
    *b = ds4_mmvq_u32_a2(qs + 4 + 8 * part);
#endif
}

/* The grid may be kept as 2^r interleaved copies, row i's copy c at
 * grid[(i << r) | c], each lane reading copy lane mod 2^r: with r = 4 the
 * 16 lanes of a half-warp (one shared-memory pass of 8-byte loads) always
 * hit 16 different bank pairs, where one table costs ~4 passes of bank
 * conflicts per lookup (random rows). r = 0: the plain table. dp: the
 * block's scale, qs: its groups (the GGUF layout's blk, blk + 2). */
DS4_HD void ds4_mq_decode_iq2(const uint8_t *dp, const uint8_t *qs, int part, const uint64_t *grid, int r, int lane,
                              const uint64_t *signs, ds4_mq_iq2_xxs &t)
{
    uint32_t a, b;
    ds4_mq_iq2_words(qs, part, &a, &b);
    const uint32_t c = (uint32_t)lane & ((1u << r) - 1u);
    DS4_UNROLL
    for (int l = 0; l < 4; l++) {
        const uint64_t gr = grid[(((a >> (8 * l)) & 255) << r) | c];
        const uint32_t s7 = (b >> (7 * l)) & 127;
        const uint64_t mm = signs ? signs[s7] : ds4_mmvq_sign_masks(s7);
        const uint32_t m0 = (uint32_t)mm, m1 = (uint32_t)(mm >> 32);
        /* negate the bytes under the mask: ~g + 1 never carries, grid bytes are 8..43 */
        t.w[2 * l] = ((uint32_t)gr ^ m0) + (m0 & 0x01010101u);
        t.w[2 * l + 1] = ((uint32_t)(gr >> 32) ^ m1) + (m1 & 0x01010101u);
    }
    t.ls = 2 * (int)(b >> 28) + 1;
    t.d = ds4_f16(ds4_ld_u16(dp));
}
/* The GGUF layout's block at blk. */
DS4_HD void ds4_mq_decode(const uint8_t *blk, int part, const uint64_t *grid, const uint64_t *signs,
                          ds4_mq_iq2_xxs &t)
{
    ds4_mq_decode_iq2(blk, blk + 2, part, grid, 0, 0, signs, t);
}
/* . the block's 256 activation int8: ls * the group's 32-value dot */
template <bool SH = false>
DS4_HD int ds4_mq_dot(const ds4_mq_iq2_xxs &t, const uint8_t *xq_blk, const int16_t *bsums_blk, int part, int *ms)
{
    (void)bsums_blk;
    *ms = 0;
    uint32_t x[8];
    ds4_mmvq_ld16<SH>(xq_blk + 32 * part, x);
    ds4_mmvq_ld16<SH>(xq_blk + 32 * part + 16, x + 4);
    int s = 0;
    DS4_UNROLL
    for (int i = 0; i < 8; i++) s = ds4_dp4a(t.w[i], x[i], s);
    return s * t.ls;
}

/* prmt.b32: output byte k is byte (nibble k & 7) of b:a, or with bit 3 of
 * the nibble that byte's sign replicated (the host's form below). On the
 * device __byte_perm, or RAW the instruction itself: __byte_perm's
 * contract ignores bit 3, so nvcc masks every selector with 0x7777 first,
 * one LOP3 a prmt (8 of a group's ~83 instructions in ds4_gb_kernel's
 * SASS, ncu's source view, forty-eighth session); the selectors here never
 * set it, so both give the same bytes. */
template <bool RAW = false> DS4_HD uint32_t ds4_prmt(uint32_t a, uint32_t b, uint32_t sel)
{
#ifdef __CUDA_ARCH__
    if constexpr (RAW) {
        uint32_t d;
        asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
        return d;
    } else return __byte_perm(a, b, sel);
#else
    const uint64_t v = (uint64_t)b << 32 | a;
    uint32_t r = 0;
    for (int k = 0; k < 4; k++) {
        const uint32_t n = (sel >> (4 * k)) & 15u;
        uint32_t byte = (uint32_t)(v >> (8 * (n & 7u))) & 255u;
        if (n & 8u) byte = byte & 0x80u ? 0xffu : 0u;
        r |= byte << (8 * k);
    }
    return r;
#endif
}

/* The byte offsets of a group's 4 grid rows (go) and 4 sign entries (so)
 * in tables of 128-byte rows (the copies of one entry), from the group's
 * packed words: one shift and one and-or each. R256: the grid's rows 256
 * bytes apart, so a row's offset is its index byte put in cofs' byte 1, one
 * byte permute instead of a shift and an and-or. cofs: the copy's offset,
 * or'ed with the tables' address where that is a multiple of 64 KiB (byte
 * 1 and bits 7-13 free: cuda_moe_g1.cuh's SEL 3 reads at the sums). */
template <bool R256 = false>
DS4_HD void ds4_iq2_tab_offsets(uint32_t qa, uint32_t qb, uint32_t cofs, uint32_t go[4], uint32_t so[4])
{
    if constexpr (R256) {
        DS4_UNROLL
        for (int l = 0; l < 4; l++) go[l] = ds4_prmt(qa, cofs, 0x7604u | (uint32_t)l << 4); /* cofs.b0, qa.b_l, cofs.b2, cofs.b3 */
    } else {
        go[0] = ((qa << 7) & 0x7f80u) | cofs, go[1] = ((qa >> 1) & 0x7f80u) | cofs;
        go[2] = ((qa >> 9) & 0x7f80u) | cofs, go[3] = ((qa >> 17) & 0x7f80u) | cofs;
    }
    so[0] = ((qb << 7) & 0x3f80u) | cofs, so[1] = (qb & 0x3f80u) | cofs;
    so[2] = ((qb >> 7) & 0x3f80u) | cofs, so[3] = ((qb >> 14) & 0x3f80u) | cofs;
}

/* The lean IQ2_XXS group (cuda_mmvq.cu, ds4_mq_iq2_lean): the same
 * integer as ds4_mq_decode_iq2 + ds4_mq_dot, in fewer instructions.
 * qa: the group's 4 grid indices; qb: its 4 x 7 sign bits and the scale
 * nibble; x: the 32 activation int8. gtab: the grid in 16 interleaved
 * copies (row i's copy c at byte 128 i + 8 c), stab: the 128 sign masks
 * (ds4_mmvq_sign_masks) the same way; cofs = 8 * the copy this lane reads.
 * An entry's byte offset is one shift and one and-or of the packed index;
 * the signs apply by linearity, not to the bytes: sum s_i g_i x_i =
 * sum g_i x_i - 2 sum_{s_i < 0} g_i x_i, so a word costs two dp4a and one
 * and instead of an xor, an and, an add and a dp4a. */
DS4_HD int ds4_mq_iq2_lean_group(uint32_t qa, uint32_t qb, const uint32_t x[8], const uint8_t *gtab,
                                 const uint8_t *stab, uint32_t cofs)
{
    uint32_t go[4], so[4];
    ds4_iq2_tab_offsets(qa, qb, cofs, go, so);
    int s_all = 0, s_neg = 0;
    DS4_UNROLL
    for (int l = 0; l < 4; l++) {
#ifdef __CUDA_ARCH__
        const uint2 g2 = *(const uint2 *)(gtab + go[l]), m2 = *(const uint2 *)(stab + so[l]);
        const uint32_t g[2] = {g2.x, g2.y}, m[2] = {m2.x, m2.y};
#else
        uint32_t g[2], m[2];
        memcpy(g, gtab + go[l], 8);
        memcpy(m, stab + so[l], 8);
#endif
        s_all = ds4_dp4a(g[0], x[2 * l], s_all);
        s_all = ds4_dp4a(g[1], x[2 * l + 1], s_all);
        s_neg = ds4_dp4a(g[0] & m[0], x[2 * l], s_neg);
        s_neg = ds4_dp4a(g[1] & m[1], x[2 * l + 1], s_neg);
    }
    return (s_all - 2 * s_neg) * (2 * (int)(qb >> 28) + 1);
}

/* ---- the selector form of the lean IQ2_XXS group ------------------------
 * Every byte of a grid row is 8, 25 or 43, so a signed row is 8 picks among
 * the 6 bytes +-8, +-25, +-43, and one prmt makes 4 of them from a 16-bit
 * selector (nibble k picks output byte k of the 8 bytes of its two
 * sources). A grid row is kept as its selector (nibble k = 0, 1, 2 for
 * byte k = 8, 25, 43) and a sign index as the selector bits that move a
 * pick to its negative (bit 4 k + 2 for value k, the parity bit the 8th),
 * so a row's signed bytes are an or, a shift and two prmt of two 4-byte
 * table reads: half the shared-memory wavefronts of the lean form's two
 * 8-byte reads, and 2 dp4a a row instead of 4 plus 2 ands. The integer is
 * the lean form's (sum s g x, exact), checked on the host. */
#define DS4_IQ2_SEL_POS 0x002b1908u /* source bytes 0..2: 8, 25, 43 */
#define DS4_IQ2_SEL_NEG 0x00d5e7f8u /* source bytes 4..6: -8, -25, -43 */

/* constexpr as well: cuda_moe_g1.cuh keeps the 384 selectors as a device
 * constant built at compile time, so a block's table fill is a copy */
__host__ __device__ constexpr uint32_t ds4_iq2_grid_sel(uint64_t row)
{
    uint32_t sel = 0;
    for (int k = 0; k < 8; k++) {
        const uint32_t b = (uint32_t)(row >> (8 * k)) & 255u;
        sel |= (b == 0x08u ? 0u : b == 0x19u ? 1u : 2u) << (4 * k);
    }
    return sel;
}

__host__ __device__ constexpr uint32_t ds4_iq2_sign_sel(uint32_t s7)
{
    uint32_t par = 0;
    for (int k = 0; k < 7; k++) par ^= (s7 >> k) & 1u;
    const uint32_t s = s7 | par << 7;
    uint32_t sel = 0;
    for (int k = 0; k < 8; k++) sel |= ((s >> k) & 1u) << (4 * k + 2);
    return sel;
}

/* The selector tables read through pointers: g holds the 256 grid
 * selectors (ds4_iq2_grid_sel) in 32 interleaved copies (row i's copy c at
 * byte 128 i + 4 c, or 256 i + 4 c for R256 below), s the 128 sign
 * selectors (ds4_iq2_sign_sel) in 128-byte rows the same way. */
struct ds4_iq2_sel_ptrs {
    const uint8_t *g, *s;
    DS4_HD uint32_t grid(uint32_t o) const { return ds4_ld_u32(g + o); }
    DS4_HD uint32_t sign(uint32_t o) const { return ds4_ld_u32(s + o); }
};

/* The lean group's integer from the selector tables, read by tab's grid()
 * and sign() at the offsets of ds4_iq2_tab_offsets<R256>; cofs = 4 * the
 * copy this lane reads (its lane: a warp's 4-byte reads then always hit 32
 * different banks, one wavefront). RAW: ds4_prmt's RAW form, with pos
 * (DS4_IQ2_SEL_POS) from the caller, who may hold it in a register ptxas
 * cannot rematerialize (cuda_moe_g1.cuh's g1_cofs). */
template <bool RAW = false, bool R256 = false, class Tab>
DS4_HD int ds4_mq_iq2_sel_group_t(uint32_t qa, uint32_t qb, const uint32_t x[8], const Tab &tab, uint32_t cofs,
                                  uint32_t pos = DS4_IQ2_SEL_POS)
{
    uint32_t go[4], so[4];
    ds4_iq2_tab_offsets<R256>(qa, qb, cofs, go, so);
    int s = 0;
    DS4_UNROLL
    for (int l = 0; l < 4; l++) {
        const uint32_t sel = tab.grid(go[l]) | tab.sign(so[l]);
        const uint32_t p = RAW ? pos : DS4_IQ2_SEL_POS; /* not RAW: the immediate, as measured */
        s = ds4_dp4a(ds4_prmt<RAW>(p, DS4_IQ2_SEL_NEG, sel), x[2 * l], s);
        s = ds4_dp4a(ds4_prmt<RAW>(p, DS4_IQ2_SEL_NEG, sel >> 16), x[2 * l + 1], s);
    }
    return s * (2 * (int)(qb >> 28) + 1);
}
/* The same on the tables at gtab and stab. */
template <bool RAW = false>
DS4_HD int ds4_mq_iq2_sel_group(uint32_t qa, uint32_t qb, const uint32_t x[8], const uint8_t *gtab,
                                const uint8_t *stab, uint32_t cofs, uint32_t pos = DS4_IQ2_SEL_POS)
{
    return ds4_mq_iq2_sel_group_t<RAW>(qa, qb, x, ds4_iq2_sel_ptrs{gtab, stab}, cofs, pos);
}

/* dp4a of 4 unsigned bytes (a) with 4 signed bytes (b). */
DS4_HD int ds4_dp4a_us(uint32_t a, uint32_t b, int c)
{
#ifdef __CUDA_ARCH__
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#else
    for (int k = 0; k < 4; k++) c += (int)(uint8_t)(a >> (8 * k)) * (int)(int8_t)(b >> (8 * k));
    return c;
#endif
}

/* The lean Q2_K quarter (one token's products, cuda_mmvq.cu): the same
 * integers as ds4_mq_decode + ds4_mq_dot for quarter `part` of the block
 * whose scales are at sc and quants at qs (4-aligned: the GGUF layout's
 * blk, blk + 16) and its activation block, without unpacking the 2-bit
 * values to bytes: sub-block j's values sit at bits 2j..2j+1 of each byte,
 * so the packed word masked in place is 4^j times them, and an unsigned x
 * signed dp4a of it, shifted right by 2j, is the sub-block's dot exactly.
 * One and per word instead of a shift and an and; the 4 scale bytes come
 * from two word loads and one byte permute. Returns sum sc * dot16, and
 * sum m * bsum in *ms. */
template <bool SH = false>
DS4_HD int ds4_mq_q2k_lean(const uint8_t *sc_blk, const uint8_t *qs, int part, const uint8_t *xq_blk,
                           const int16_t *bsums_blk, int *ms)
{
    const int h = part >> 1, hh = part & 1;
    uint32_t q[4];
    DS4_UNROLL
    for (int k = 0; k < 4; k++) q[k] = ds4_ld_u32(qs + 32 * h + 16 * hh + 4 * k);
    const uint32_t s0 = ds4_ld_u32(sc_blk + 8 * h), s1 = ds4_ld_u32(sc_blk + 8 * h + 4);
#ifdef __CUDA_ARCH__
    const uint32_t sc4 = __byte_perm(s0, s1, hh ? 0x7531 : 0x6420);
#else
    const uint32_t sc4 = hh ? ((s0 >> 8) & 255) | ((s0 >> 24) << 8) | (((s1 >> 8) & 255) << 16) | ((s1 >> 24) << 24)
                            : (s0 & 255) | (((s0 >> 16) & 255) << 8) | ((s1 & 255) << 16) | (((s1 >> 16) & 255) << 24);
#endif
    int is = 0, m = 0;
    DS4_UNROLL
    for (int j = 0; j < 4; j++) {
        const int sb = 8 * h + 2 * j + hh;
        const uint32_t sc = (sc4 >> (8 * j)) & 255u, mask = 0x03030303u << (2 * j);
        uint32_t xv[4];
        ds4_mmvq_ld16<SH>(xq_blk + 16 * sb, xv);
        int si = 0;
        DS4_UNROLL
        for (int k = 0; k < 4; k++) si = ds4_dp4a_us(q[k] & mask, xv[k], si);
        is += (int)(sc & 15) * (si >> (2 * j));
        m += (int)(sc >> 4) * (int)bsums_blk[sb];
    }
    *ms = m;
    return is;
}

/* The task type of a weight type. */
template <int T> struct ds4_mq_task_of;
template <> struct ds4_mq_task_of<DS4_TYPE_Q8_0> { typedef ds4_mq_q8_0 type; };
template <> struct ds4_mq_task_of<DS4_TYPE_Q2_K> { typedef ds4_mq_q2_k type; };
template <> struct ds4_mq_task_of<DS4_TYPE_IQ2_XXS> { typedef ds4_mq_iq2_xxs type; };

/* A block's float term from its (lane-summed) integers, in the CPU scalar
 * kernel's operation order; dx = the activation block's scale. IQ2_XXS
 * leaves the final 1/8 to the caller (the CPU applies it to the row sum). */
DS4_HD float ds4_mq_term(const ds4_mq_q8_0 &t, float dx, int is, int ms)
{
    (void)ms;
    return t.d * dx * (float)is;
}
DS4_HD float ds4_mq_term(const ds4_mq_q2_k &t, float dx, int is, int ms)
{
    return dx * t.d * (float)is - dx * t.dmin * (float)ms;
}
DS4_HD float ds4_mq_term(const ds4_mq_iq2_xxs &t, float dx, int is, int ms)
{
    (void)ms;
    return t.d * dx * (float)is;
}

/* The clamped SwiGLU of the expert FFNs (dsv4-model.md §3.7, as the CPU's
 * swiglu_clamped): silu(min(g, c)) * clamp(u, -c, c). */
DS4_HD float ds4_swiglu_clamped(float g, float u, float c)
{
    const float gv = g > c ? c : g;
    const float uv = u > c ? c : (u < -c ? -c : u);
    return gv / (1.0f + expf(-gv)) * uv;
}

/* ord[0..k) = 0..k-1 sorted by eid (ascending; insertion sort, k is 6):
 * the order in which the CPU adds a token's experts. */
DS4_HD void ds4_mq_order_by_id(const int32_t *eid, int k, int *ord)
{
    for (int j = 0; j < k; j++) {
        int at = j;
        while (at > 0 && eid[ord[at - 1]] > eid[j]) {
            ord[at] = ord[at - 1];
            at--;
        }
        ord[at] = j;
    }
}

#endif

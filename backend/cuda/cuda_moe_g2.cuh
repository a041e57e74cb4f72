/*
 * cuda_moe_g2.cuh - the device pieces of the routed down kernels on Q2_K
 * experts 2048 columns wide, 6 a token: one token's (cuda_moe_down1.cu)
 * and a batch's (cuda_moe_down_batch.cu). Both take a lane's term with
 * g2_term and sum a row's 6 experts in the same order, so a batched token
 * gets its one-token numbers bit for bit.
 */
#ifndef DS4_CUDA_MOE_G2_CUH
#define DS4_CUDA_MOE_G2_CUH

#include "backend/cuda/cuda_mq_device.cuh"
#include "backend/cuda/cuda_weight_runs.cuh"

enum {
    G2_COLS = 2048,
    G2_NB = G2_COLS / 256,  /* blocks per row */
    G2_RB = G2_NB * 84,     /* bytes per row: 672 = 42 x 16 */
    G2_K = 6,               /* experts per token */
    G2_UB = G2_K * G2_RB,   /* bytes per unit */
    G2_ABLK = 320,          /* bytes per padded activation block */
    G2_AROW = G2_NB * G2_ABLK,
    G2_ACT = 0,
    G2_DX = G2_ACT + G2_K * G2_AROW,
    G2_BS = G2_DX + G2_K * G2_NB * 4,
    G2_EB = G2_BS + G2_K * G2_COLS / 16 * 2,
    G2_W = G2_EB + 8 * 8,
    G2_RANK = G2_W + 8 * 4,
    G2_FIXED = G2_RANK + 8 * 4,
};
static_assert(G2_FIXED % 16 == 0 && G2_UB % 16 == 0, "stage buffers stay 16-byte aligned");
static_assert(G2_RB == 2 * DS4_Q2K_RUN_BYTES, "a row is two Q2_K runs (cuda_weight_runs.cuh)");

/* A lane's offsets in a row as the GPU keeps it (two runs of 4 Q2_K
 * blocks, cuda_weight_runs.cuh) for quarter `part` of block bl: its 16 quant
 * bytes (one aligned 16-byte load), its 8 scale bytes (one 8-byte load)
 * and its block's (d, dmin) word. */
struct g2_lane {
    uint32_t qs, sc, dd;
};
__device__ __forceinline__ g2_lane g2_lane_of(int bl, int part)
{
    const int h = part >> 1, hh = part & 1;
    return {(uint32_t)(ds4_q2k_qs_ofs(bl, true) + 32 * h + 16 * hh), (uint32_t)(ds4_q2k_sc_ofs(bl, true) + 8 * h),
            (uint32_t)ds4_q2k_dd_ofs(bl, true)};
}

/* Slot j's place among a token's G2_K expert ids (e = ids[j]): its rank
 * by (expert id, slot), the order every form of the down sums the experts
 * in, so a batched token's sum is its one-token sum bit for bit. */
__device__ __forceinline__ int g2_rank_of(const int32_t *ids, int32_t e, int j)
{
    int rank = 0;
    for (int i = 0; i < G2_K; i++) {
        const int32_t o = ids[i];
        rank += o < e || (o == e && i < j);
    }
    return rank;
}

/* Copy row r of the 6 experts at byte offsets eb[0..5] of w into dst (672
 * bytes a row, in eb's order) by cp.async and commit; a negative offset (a
 * bad expert) copies nothing, its term is NaN. */
__device__ __forceinline__ void g2_fetch_rows(const uint8_t *w, const int64_t *eb, uint32_t r, uint8_t *dst, int lane)
{
#pragma unroll
    for (int j = 0; j < G2_K; j++) {
        if (eb[j] < 0) continue;
        const uint8_t *src = w + eb[j] + (int64_t)r * G2_RB;
        ds4_mq_cp16(dst + j * G2_RB + 16 * lane, src + 16 * lane);
        if (lane < G2_RB / 16 - 32) ds4_mq_cp16(dst + j * G2_RB + 512 + 16 * lane, src + 512 + 16 * lane);
    }
    ds4_mq_cp_commit();
}

/* The unit's 6 lane terms (one an expert) added over the warp, each by
 * ds4_mq_warp_sum's xor tree, so each sum has its bits (a butterfly ends
 * with every lane holding the same sum): at the offset-16 step a lane
 * keeps one of each pair of values and sends the other, at 8 and 4 the
 * pairs of what is left, so 8 shuffles carry what 30 did, and 5 more bring
 * the sums to lane 0 (thirty-fourth session). Value j's sum ends in lane
 * 0, 16, 8, 24, 4, 20; v[0..5] valid in lane 0. */
__device__ __forceinline__ void g2_warp_sum6(float v[G2_K], int lane)
{
    static_assert(G2_K == 6, "the exchange is written for 6 experts");
    const unsigned m = 0xffffffffu;
    const bool h16 = (lane & 16) != 0, h8 = (lane & 8) != 0, h4 = (lane & 4) != 0;
    float a = h16 ? v[1] : v[0], b = h16 ? v[3] : v[2], c = h16 ? v[5] : v[4];
    a += __shfl_xor_sync(m, h16 ? v[0] : v[1], 16);
    b += __shfl_xor_sync(m, h16 ? v[2] : v[3], 16);
    c += __shfl_xor_sync(m, h16 ? v[4] : v[5], 16);
    float d = h8 ? b : a;
    d += __shfl_xor_sync(m, h8 ? a : b, 8);
    c += __shfl_xor_sync(m, c, 8);
    float e = h4 ? c : d;
    e += __shfl_xor_sync(m, h4 ? d : c, 4);
    e += __shfl_xor_sync(m, e, 2);
    e += __shfl_xor_sync(m, e, 1);
    v[0] = e;
    v[1] = __shfl_sync(m, e, 16);
    v[2] = __shfl_sync(m, e, 8);
    v[3] = __shfl_sync(m, e, 24);
    v[4] = __shfl_sync(m, e, 4);
    v[5] = __shfl_sync(m, e, 20);
}

/* Where 16-byte piece pc of a Q8_K row goes in its padded activation
 * (blocks G2_ABLK apart, a block's second half 32 bytes further on). */
__device__ __forceinline__ int g2_act_at(int pc)
{
    const int sb = pc & 15;
    return (pc >> 4) * G2_ABLK + 16 * sb + 32 * (sb >> 3);
}

/* The activation share g2_term_of reads, from the padded copy in shared
 * memory: sub-block sb = 8 h + 2 j + hh of the row's block at act, its bsum
 * at bs + 2 sb, the block's scale (h = part / 2, hh = part % 2). */
struct g2_act_smem {
    uint32_t act, bs;
    float d;
    int h, hh;
    __device__ __forceinline__ uint4 x(int j) const { return ds4_lds128(act + 16 * (8 * h + 2 * j + hh) + 32 * h); }
    __device__ __forceinline__ int bsum(int j) const { return ds4_lds_s16(bs + 2 * (8 * h + 2 * j + hh)); }
    __device__ __forceinline__ float dx() const { return d; }
};

/* Lane term of one expert row (staged at w): quarter `part` of block bl
 * (o = g2_lane_of(bl, part)), as ds4_mq_q2k_lean and the pipelined
 * kernel's float term; a: the activation's share (g2_act_smem, or the
 * batch's copy in registers, cuda_moe_down_regs.cu), the same values
 * either way. */
template <class A> __device__ __forceinline__ float g2_term_of(uint32_t w, const g2_lane &o, int part, const A &a)
{
    const int hh = part & 1;
    const uint4 qv = ds4_lds128(w + o.qs);
    const uint2 sv = ds4_lds64(w + o.sc);
    const uint32_t dd = ds4_lds32(w + o.dd);
    const uint32_t q[4] = {qv.x, qv.y, qv.z, qv.w};
    const uint32_t sc4 = __byte_perm(sv.x, sv.y, hh ? 0x7531 : 0x6420);
    int is = 0, m = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const uint32_t sc = (sc4 >> (8 * j)) & 255u, mask = 0x03030303u << (2 * j);
        const uint4 xv = a.x(j);
        int si = 0;
        si = ds4_dp4a_us(q[0] & mask, xv.x, si);
        si = ds4_dp4a_us(q[1] & mask, xv.y, si);
        si = ds4_dp4a_us(q[2] & mask, xv.z, si);
        si = ds4_dp4a_us(q[3] & mask, xv.w, si);
        is += (int)(sc & 15) * (si >> (2 * j));
        m += (int)(sc >> 4) * a.bsum(j);
    }
    const float d = __half2float(__ushort_as_half((unsigned short)(dd & 0xffffu)));
    const float dmin = __half2float(__ushort_as_half((unsigned short)(dd >> 16)));
    const float dx = a.dx();
    /* the pipelined kernel's contraction: fma(dx d, is, -(dx dmin) ms), added to 0 */
    return __fadd_rn(0.0f, __fmaf_rn(__fmul_rn(dx, d), (float)is, -__fmul_rn(__fmul_rn(dx, dmin), (float)m)));
}

/* A lane's share of one expert's activation, held in registers: the 4
 * sub-blocks of its quarter (16 values each), their bsums and the block's
 * scale; read by g2_term_of as g2_act_smem is (the batch's down kernels that hold
 * their token's activations in registers: cuda_moe_down_regs.cu,
 * cuda_moe_down_pair.cu). */
struct g2_act_regs {
    uint4 xs[4];
    uint32_t bs[2]; /* bsum j in half j % 2 of word j / 2 */
    float d;
    __device__ __forceinline__ uint4 x(int j) const { return xs[j]; }
    __device__ __forceinline__ int bsum(int j) const { return (int)(int16_t)(bs[j >> 1] >> (16 * (j & 1))); }
    __device__ __forceinline__ float dx() const { return d; }
};

/* Lane (bl, part)'s share of a token's Q8_K row q (the CPU's layout: 2048
 * values, 8 float scales, 128 int16 bsums), as g2_term reads its padded
 * copy: sub-block sb = 8 h + 2 j + hh of block bl (h = part / 2, hh =
 * part % 2). */
__device__ __forceinline__ void g2_act_load(const uint8_t *q, int bl, int part, g2_act_regs &r)
{
    const int h = part >> 1, hh = part & 1;
    const int16_t *bs = (const int16_t *)(q + G2_COLS + G2_NB * 4);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int sb = 8 * h + 2 * j + hh;
        r.xs[j] = *(const uint4 *)(q + 256 * bl + 16 * sb);
    }
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const int sb = 8 * h + 4 * k + hh; /* sub-blocks of j = 2 k, 2 k + 1 */
        r.bs[k] = (uint32_t)(uint16_t)bs[16 * bl + sb] | (uint32_t)(uint16_t)bs[16 * bl + sb + 2] << 16;
    }
    r.d = ((const float *)(q + G2_COLS))[bl];
}

/* The term from the padded activation block at act (its 16 bsums at bs,
 * its scale dx) in shared memory. */
__device__ __forceinline__ float g2_term(uint32_t w, const g2_lane &o, int part, uint32_t act, uint32_t bs, float dx)
{
    return g2_term_of(w, o, part, g2_act_smem{act, bs, dx, part >> 1, part & 1});
}

#endif

/*
 * cuda_moe_g1.cuh - the device pieces of the routed gate+up kernels on
 * IQ2_XXS experts 4096 columns wide: one token's (cuda_moe_gateup1.cu) and
 * a batch's (cuda_moe_gateup_batch.cu). Both compute a row's lane sums
 * with g1_row, so a batched token gets its one-token numbers bit for bit.
 */
#ifndef DS4_CUDA_MOE_G1_CUH
#define DS4_CUDA_MOE_G1_CUH

#include "backend/cuda/cuda_weight_runs.cuh"
#include "backend/cuda/cuda_mq_device.cuh"
#include "backend/cuda/cuda_tables.cuh"

enum {
    G1_COLS = 4096,
    G1_NB = G1_COLS / 256,     /* blocks per row */
    G1_RB = G1_NB * 66,        /* bytes per row: 1,056 = 66 x 16 */
    G1_UB = 2 * G1_RB,         /* bytes per unit (gate row, up row) */
    G1_ABLK = 272,             /* bytes per padded activation block */
    G1_MAXS = 64,              /* slots (the token's experts) */
    G1_QB = G1_COLS + G1_NB * 4 + G1_COLS / 16 * 2, /* a Q8_K row (cuda_mmvq.cuh) */
    G1_FIXED = G1_NB * G1_ABLK + G1_NB * 4 + G1_MAXS * 8 + G1_QB,
};
static_assert(G1_FIXED % 16 == 0 && G1_UB % 16 == 0, "stage buffers stay 16-byte aligned");

/* The grid's 256 rows in 16 interleaved copies (row i's copy c at byte
 * 128 i + 8 c), then the 128 sign masks the same way: lane l reads copy
 * l mod 16, so a half-warp's 8-byte loads hit 16 different bank pairs.
 * SEL (the batch's kernel by default, one token's with DS4_CUDA_IQ2_SEL=1;
 * cuda_moe1.cuh): the same 48 KiB hold the selector form's tables
 * (ds4_mq_iq2_sel_group: 4-byte entries in 32 copies, lane l reading copy
 * l), at the same byte offsets of an index. */
static __shared__ __align__(16) uint2 g1_tab[(256 + 128) * 16];
static_assert(sizeof g1_tab == (256 + 128) * 32 * 4, "the selector tables fill the lean tables' bytes");

/* The selector form's 256 grid and 128 sign selectors, made at compile
 * time: computing them in every block's fill added a quarter to the
 * kernel's instructions (ncu, thirty-third session). */
struct g1_sel_vals {
    uint32_t v[256 + 128];
};
constexpr g1_sel_vals g1_sel_make()
{
    constexpr uint64_t grid[256] = {DS4_IQ2XXS_GRID_VALUES};
    g1_sel_vals t{};
    for (int i = 0; i < 256; i++) t.v[i] = ds4_iq2_grid_sel(grid[i]);
    for (int i = 0; i < 128; i++) t.v[256 + i] = ds4_iq2_sign_sel((uint32_t)i);
    return t;
}
static __device__ const g1_sel_vals g1_sel_dev = g1_sel_make();

/* SEL 3 (the batch's ds4_gb256_kernel, DS4_CUDA_IQ2_ROW256): SEL 2's
 * form with the grid's selectors in rows of 256 bytes (the 32 copies in
 * the first 128, ds4_iq2_tab_offsets<true>), the sign selectors' 128-byte
 * rows after them: 80 KiB of the kernel's dynamic shared memory (more than
 * a static array may hold), at a shared address that is a multiple of 64
 * KiB, which each lane's table offset carries (g1_cofs). */
enum {
    G1_T256_GRID = 256 * 256, /* the grid's rows */
    G1_T256 = G1_T256_GRID + 128 * 128, /* and the signs' */
};

/* SEL, the IQ2_XXS group's form: 0 the lean tables, 1 the selector
 * tables, 2 the selector tables with the raw prmt (ds4_prmt<true>) and
 * its constant in a register (DS4_CUDA_IQ2_PRMT, on by default; the same integers),
 * 3 as 2 on the tables of 256-byte grid rows.
 *
 * The lane's table copy offset (g1_group's cofs): 8 (lane mod 16), or
 * SEL 4 lane, passed through a shuffle so that ptxas cannot see its bits:
 * knowing them, it put the mask into every table offset (shift, and,
 * and-or: 3 instructions an offset, in the SASS ncu listed in the
 * thirty-fourth session) instead of the 2 that an and-or with the ready
 * offset takes (SEL 3: or'ed with tab, the tables' shared address, a
 * multiple of 64 KiB). SEL 2's prmt constant (pos, DS4_IQ2_SEL_POS: prmt takes
 * its first source from a register) is read from a variable: as an
 * immediate, ptxas moved it into a register again at ~5 of a group's 8
 * prmt (an IMAD from a uniform register each, ncu's source view,
 * forty-eighth session), and as often in a 16-warp build with registers
 * to spare. */
struct g1_tabl {
    uint32_t cofs, pos;
};
static __device__ uint32_t g1_sel_pos_dev = DS4_IQ2_SEL_POS; /* not const: read, not folded */
template <int SEL> __device__ __forceinline__ g1_tabl g1_cofs(int lane, uint32_t tab = 0)
{
    const uint32_t c = SEL == 3 ? (uint32_t)(lane & 31) * 4u | tab
                       : SEL     ? (uint32_t)(lane & 31) * 4u
                                 : (uint32_t)(lane & 15) * 8u;
    return {__shfl_sync(0xffffffffu, c, lane),
            SEL >= 2 ? *(volatile const uint32_t *)&g1_sel_pos_dev : 0u};
}

/* A table word at a shared-window address (not volatile: the tables are
 * constants once filled, so the compiler may move the reads). */
__device__ __forceinline__ uint32_t g1_ldt(uint32_t a)
{
    uint32_t v;
    asm("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(a));
    return v;
}

/* SEL 3's tables for ds4_mq_iq2_sel_group_t<true, true>, read at the
 * offsets themselves: cofs carries the tables' shared address (g1_cofs),
 * so no read adds a base (with the tables at the start of the dynamic
 * shared memory, ptxas added its symbol's address to every read: the
 * unit's loop 574 instructions against 507 in the SASS). test_cuda_decode checks the same form on the host
 * on this layout. */
struct g1_sel256_tab {
    __device__ uint32_t grid(uint32_t o) const { return g1_ldt(o); }
    __device__ uint32_t sign(uint32_t o) const { return g1_ldt(o + G1_T256_GRID); }
};

/* One group's integer from g1_tab: ds4_mq_iq2_lean_group's (cuda_mmvq.cuh;
 * sum s g x = sum g x - 2 sum_{s<0} g x, times the odd scale) or, SEL,
 * ds4_mq_iq2_sel_group's, the same integer. */
template <int SEL>
__device__ __forceinline__ int g1_group(uint32_t qa, uint32_t qb, const uint4 &xa, const uint4 &xb, g1_tabl cofs)
{
    const char *gt = (const char *)g1_tab, *st = gt + 256 * 16 * 8;
    const uint32_t x[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
    if constexpr (SEL == 3) return ds4_mq_iq2_sel_group_t<true, true>(qa, qb, x, g1_sel256_tab{}, cofs.cofs, cofs.pos);
    else if constexpr (SEL == 2)
        return ds4_mq_iq2_sel_group<true>(qa, qb, x, (const uint8_t *)gt, (const uint8_t *)st, cofs.cofs, cofs.pos);
    else if constexpr (SEL) return ds4_mq_iq2_sel_group(qa, qb, x, (const uint8_t *)gt, (const uint8_t *)st, cofs.cofs);
    else return ds4_mq_iq2_lean_group(qa, qb, x, (const uint8_t *)gt, (const uint8_t *)st, cofs.cofs);
}

/* Copy one unit's gate row (g0) and up row (u0), 66 16-byte pieces each,
 * into dst by cp.async (the warp's 32 lanes; the caller commits). */
__device__ __forceinline__ void g1_copy_pair(uint8_t *dst, const uint8_t *g0, const uint8_t *u0, int lane)
{
    ds4_mq_cp16(dst + 16 * lane, g0 + 16 * lane);
    ds4_mq_cp16(dst + 512 + 16 * lane, g0 + 512 + 16 * lane);
    ds4_mq_cp16(dst + G1_RB + 16 * lane, u0 + 16 * lane);
    ds4_mq_cp16(dst + G1_RB + 512 + 16 * lane, u0 + 512 + 16 * lane);
    if (lane < 4) {
        const int c = 64 + (lane & 1);
        ds4_mq_cp16(dst + (lane >> 1) * G1_RB + 16 * c, (lane >> 1 ? u0 : g0) + 16 * c);
    }
}

/* The same unit into the stage at shared address ds (+16 lane: the lane's
 * first piece), its pieces at immediate offsets from two addresses, the
 * gate row's and the up row's + 16 lane, where 64-bit adds a piece became
 * an add pair each; lanes 0-3 copy pieces 64-65 of the gate row (lanes
 * 0-1) or of the up row (lanes 2-3). The caller commits. */
__device__ __forceinline__ void g1_copy_pair_at(uint32_t ds, const uint8_t *g0, const uint8_t *u0, int lane)
{
    ds4_mq_cp16_at<0, 0>(ds, g0);
    ds4_mq_cp16_at<512, 512>(ds, g0);
    ds4_mq_cp16_at<G1_RB, 0>(ds, u0);
    ds4_mq_cp16_at<G1_RB + 512, 512>(ds, u0);
    if (lane < 4) ds4_mq_cp16_at<1024, 1024>(ds + (lane & 2) * 512, lane < 2 ? g0 : u0 - 32);
}

/* SEL 3's fetch of row r of the expert at byte offset eb (a bad expert's,
 * eb < 0, copies nothing: computed as NaN) into the stage at shared address
 * ds (+16 lane), then the commit. A: one token's or the batch's arguments
 * (their gate and up). */
template <class A>
__device__ __forceinline__ void g1_fetch3(const A &a, int64_t eb, uint32_t r, uint32_t ds, int lane)
{
    if (eb >= 0) {
        const int64_t o = eb + (int64_t)r * G1_RB + 16 * lane;
        g1_copy_pair_at(ds, a.gate + o, a.up + o, lane);
    }
    ds4_mq_cp_commit();
}

/* The gate (g) and up (u) lane sums added over the warp, the same tree and
 * the same bits as ds4_mq_warp_sum of each (a xor butterfly ends with every
 * lane holding the same sum; its first step pairs lane l with l ^ 16): the
 * gate's in lanes 0-15 and the up's in 16-31 after 5 shuffles instead of
 * 10, then the up's moved to every lane: lanes 0-15 return both. */
__device__ __forceinline__ void g1_warp_sum2(float &g, float &u, int lane)
{
    const bool hi = (lane & 16) != 0;
    float v = hi ? u : g;
    v += __shfl_xor_sync(0xffffffffu, hi ? g : u, 16);
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    g = v;
    u = __shfl_sync(0xffffffffu, v, 16);
}

/* Where 16-byte piece c of a token's Q8_K values goes in its padded
 * activation (block c / 16, group (c / 2) % 8: each block's 8 groups of
 * 32 at 32 p + 16 (p / 4), blocks G1_ABLK apart). */
__device__ __forceinline__ int g1_act_at(int c)
{
    const int b = c >> 4, p = (c >> 1) & 7;
    return b * G1_ABLK + 32 * p + 16 * (p >> 2) + 16 * (c & 1);
}

/* Fill g1_tab, or SEL 3's tables at tab (every thread of the block takes
 * part; the tables are constants, so this may run before the PDL wait). */
template <int SEL>
__device__ __forceinline__ void g1_tab_fill(int tid, int nthreads, uint8_t *tab = nullptr)
{
    if constexpr (SEL == 3) {
        uint32_t *t = (uint32_t *)tab; /* row i's copy c at word 64 i + c */
        for (int i = tid; i < 256 * 32; i += nthreads) t[(i >> 5) * 64 + (i & 31)] = g1_sel_dev.v[i >> 5];
        for (int i = tid; i < 128 * 32; i += nthreads) t[G1_T256_GRID / 4 + i] = g1_sel_dev.v[256 + (i >> 5)];
    } else if constexpr (SEL) {
        uint32_t *t = (uint32_t *)g1_tab;
        for (int i = tid; i < (256 + 128) * 32; i += nthreads) t[i] = g1_sel_dev.v[i >> 5];
    } else {
        for (int i = tid; i < 256 * 16; i += nthreads) {
            const uint64_t g = ds4_iq2xxs_grid_dev[i >> 4];
            g1_tab[i] = make_uint2((uint32_t)g, (uint32_t)(g >> 32));
        }
        for (int i = tid; i < 128 * 16; i += nthreads) {
            const uint64_t m = ds4_mmvq_sign_masks((uint32_t)(i >> 4));
            g1_tab[256 * 16 + i] = make_uint2((uint32_t)m, (uint32_t)(m >> 32));
        }
    }
}

/* The lane's activation: its 4 groups' 32 values and their blocks'
 * scales, from shared memory at each use or (AR) held in registers for
 * the whole kernel (every unit reads the same ones). */
template <bool AR> struct g1_act;
template <> struct g1_act<false> {
    uint32_t act, dx; /* shared addresses of group k = 0 and its block's scale */
    __device__ __forceinline__ void load(uint32_t a, uint32_t d) { act = a, dx = d; }
    __device__ __forceinline__ uint4 xa(int k) const { return ds4_lds128(act + 4 * G1_ABLK * k); }
    __device__ __forceinline__ uint4 xb(int k) const { return ds4_lds128(act + 4 * G1_ABLK * k + 16); }
    __device__ __forceinline__ float d(int k) const { return ds4_lds_f32(dx + 16 * k); }
};
template <> struct g1_act<true> {
    uint4 a[4], b[4];
    float s[4];
    __device__ __forceinline__ void load(uint32_t act, uint32_t dx)
    {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            a[k] = ds4_lds128(act + 4 * G1_ABLK * k);
            b[k] = ds4_lds128(act + 4 * G1_ABLK * k + 16);
            s[k] = ds4_lds_f32(dx + 16 * k);
        }
    }
    /* the same from the token's Q8_K row in global memory (row: its first
     * byte; the lane's group p of blocks b0 + 4 k) */
    __device__ __forceinline__ void load_global(const uint8_t *row, int b0, int p)
    {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            a[k] = *(const uint4 *)(row + 256 * (b0 + 4 * k) + 32 * p);
            b[k] = *(const uint4 *)(row + 256 * (b0 + 4 * k) + 32 * p + 16);
            s[k] = ((const float *)(row + G1_COLS))[b0 + 4 * k];
        }
    }
    __device__ __forceinline__ uint4 xa(int k) const { return a[k]; }
    __device__ __forceinline__ uint4 xb(int k) const { return b[k]; }
    __device__ __forceinline__ float d(int k) const { return s[k]; }
};

/* A row of Flash's routed gate / up as the GPU keeps it: two runs of 8
 * IQ2_XXS blocks (cuda_weight_runs.cuh). The lane's 4 groups p of blocks
 * b0 + 4 k are in run k / 2, block b0 + 4 (k & 1) of it: one aligned
 * 8-byte load each, at g1_qofs(b0, p) + 528 (k / 2) + 256 (k & 1) (4
 * blocks' groups on); the scales of blocks k = 0, 1 (and 2, 3) are one
 * 4-byte word, at g1_dofs(b0) + 528 (k / 2), block b0 + 8 (k / 2) in its
 * low half. */
__device__ __forceinline__ uint32_t g1_qofs(int b0, int p) { return (uint32_t)ds4_iq2_qs_ofs(b0, true) + 8 * p; }
__device__ __forceinline__ uint32_t g1_dofs(int b0) { return (uint32_t)ds4_iq2_d_ofs(b0, true); }
static_assert(DS4_IQ2_RUN_BYTES == 528 && G1_RB == 2 * DS4_IQ2_RUN_BYTES, "g1_term reads rows of two runs");

/* Group k's float term of a row added to acc, the order every form adds. */
template <bool AR, int SEL>
__device__ __forceinline__ void g1_term(uint32_t w, uint32_t qo, uint32_t dd, int k, const g1_act<AR> &x,
                                        const uint4 &xa, const uint4 &xb, g1_tabl cofs, float &acc)
{
    const uint2 q = ds4_lds64(w + qo + 528 * (k >> 1) + 256 * (k & 1));
    const int is = g1_group<SEL>(q.x, q.y, xa, xb, cofs);
    const float d = __half2float(__ushort_as_half((unsigned short)(k & 1 ? dd >> 16 : dd)));
    acc = __fmaf_rn(__fmul_rn(d, x.d(k)), (float)is, acc);
}

/* One row's lane sum: its 4 groups (blocks b0, b0 + 4, ..), the float
 * terms added in block order as every form adds them. w: the row's first
 * byte; qo, dofs: the lane's g1_qofs and g1_dofs. */
template <bool AR, int SEL>
__device__ __forceinline__ float g1_row(uint32_t w, uint32_t qo, uint32_t dofs, const g1_act<AR> &x, g1_tabl cofs)
{
    float acc = 0.0f;
#pragma unroll
    for (int r = 0; r < 2; r++) { /* the run */
        const uint32_t dd = ds4_lds32(w + dofs + 528 * r);
#pragma unroll
        for (int h = 0; h < 2; h++) g1_term<AR, SEL>(w, qo, dd, 2 * r + h, x, x.xa(2 * r + h), x.xb(2 * r + h), cofs, acc);
    }
    return acc;
}

/* The gate row (at w) and the up row (at w + G1_RB) of one unit, each sum
 * exactly g1_row's, with each activation group read once for both rows
 * (the shared-memory loads are volatile, so two g1_row calls would read it
 * twice). For the batch's kernel, which ncu finds bound by shared-memory/L1
 * throughput; the step measured the same with it as with two g1_row calls
 * (227 against 234 us in two runs, docs/BENCHMARKS.md eighteenth session).
 * AR: the activation held in registers (a warp whose units are all of one
 * token). */
template <bool AR, int SEL>
__device__ __forceinline__ void g1_row_pair(uint32_t w, uint32_t qo, uint32_t dofs, const g1_act<AR> &x,
                                            g1_tabl cofs, float &gacc, float &uacc)
{
    gacc = 0.0f, uacc = 0.0f;
#pragma unroll
    for (int r = 0; r < 2; r++) { /* the run */
        const uint32_t dg = ds4_lds32(w + dofs + 528 * r), du = ds4_lds32(w + G1_RB + dofs + 528 * r);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int k = 2 * r + h;
            const uint4 xa = x.xa(k), xb = x.xb(k);
            g1_term<AR, SEL>(w, qo, dg, k, x, xa, xb, cofs, gacc);
            g1_term<AR, SEL>(w + G1_RB, qo, du, k, x, xa, xb, cofs, uacc);
        }
    }
}

#endif

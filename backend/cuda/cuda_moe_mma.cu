/*
 * cuda_moe_mma.cu - the routed experts of a prefill chunk on the int8
 * tensor cores (mma.sync, sm_80 and later): IQ2_XXS gate + up + clamped
 * SwiGLU, and the Q2_K down, for groups of up to 64 of an expert's tokens
 * (cuda_moe_grouped.cu sorts the chunk's slots by expert and calls these in
 * place of the dp4a group kernels).
 *
 * Numbers: each (row, token) product is the CPU's scalar kernel's bit for
 * bit (backend/cpu/kernels_scalar.c, dot_iq2_xxs and dot_q2_K): an integer
 * sum over each 256-value block, one float term a block, the terms added
 * in block order.
 *  - IQ2_XXS: an mma gives a 32-value group's integer sum exactly; it is
 *    multiplied by the group's odd scale ls in int32 and summed over the
 *    block's 8 groups (bsum); then acc += (d * xd) * bsum, and 0.125 acc.
 *  - Q2_K: the 4-bit sub-block scales are folded into the A bytes (3 * 15
 *    fits a byte), so the mma's accumulator over the block's 8 steps is the
 *    block's isum. The mins' sum (4-bit mins times the activation's 16-value
 *    sums, |sum| <= 16 * 127) is one f16 mma with f32 accumulation: every
 *    operand, product and partial sum is an integer below 2^24, so exact.
 *    Then acc += (xd * d) * isum - (xd * dmin) * summs.
 * The float terms use the CPU's operations in its order, without fused
 * multiply-adds (__fmul_rn / __fadd_rn; the CPU is built -std=c11, where
 * GCC does not contract).
 *
 * Why: the previous form gave each token the decode kernels' numbers (a
 * float term per 32 values, added in a warp's reduction tree), ~20 float
 * instructions an mma, and decoded each weight fragment for 16 tokens; it
 * ran at ~60 TOPS. Here the float work is a term per 8 mma, each decoded
 * fragment feeds up to 8 tiles of 8 tokens (a 2048-token step gives an
 * expert ~48 tokens), and the weights and activations stream through a
 * cp.async ring one 256-value block at a time (gate/up 2 stages, down 3),
 * so a block of the kernel walks the whole row with only 30 KiB a stage.
 *
 * Layout: a gate/up block is 8 warps on 64 rows (warps 0-3 the gate's 16-row
 * tiles, 4-7 the up's same rows), a down block 8 warps on 128 rows; a warp
 * walks its 16 rows' whole width for all the group's tiles. Fragment k
 * order: lane quad c takes the 8 physical values 8c .. 8c + 7 of a 32-value
 * step (one IQ2_XXS grid row; one 64-bit activation load), the mma's k
 * 4c .. 4c+3 and 16 + 4c .. 16 + 4c + 3; any k permutation applied to both
 * A and B gives the same integer sum. The tokens past a group's count (its
 * last 8-token tile) compute on the scratch's spare rows (the gate/up with
 * a row a token, P.tok: on the group's last token's row) and are not
 * stored.
 */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_mma_s8.cuh"
#include "backend/cuda/cuda_mq_device.cuh"
#include "backend/cuda/cuda_tables.cuh"

#include <stdlib.h>
#include <string.h>

#define MMC_TOK 64    /* tokens a group */
#define MMC_NT 8      /* 8-token tiles a group */
#define MMC_STAGES 3  /* 256-value blocks in the down kernel's ring (gate/up: ds4_mmc_gu_stages) */
#define MMC_ROWS 128  /* staged weight rows a block (gate/up: 64 of each) */
/* An activation row in a stage: 256 int8 and (Q2_K) the block's 16 sums,
 * 288 bytes: 72 words, 8 mod 32, so the 64-bit fragment loads of 8 tokens
 * x 4 lane quads fall in distinct banks (a half warp a wavefront). */
#define MMC_XS 288
/* A weight row's block in a stage, from rows in runs (cuda_weight_runs.cuh;
 * nd % 8 == 0 and nf % 4 == 0 here). IQ2_XXS: the run's
 * 16 bytes of scales, then the block's 64 bytes of groups, 5 units, rows
 * 80 bytes (20 words) apart; Q2_K: the block's 16 scale bytes, its 64
 * quant bytes, then the run's 16 bytes of (d, dmin) words (the block's at
 * 80 + 4 (b % 4): the GGUF block's image but for that), 6 units, rows 112
 * bytes (28 words) apart, so a fragment's 8 rows sit in different banks. */
#define MMC_IQ2_NU 5
#define MMC_IQ2_AS 80
#define MMC_Q2K_NU 6
#define MMC_Q2K_AS 112

struct ds4_mmc_params {
    const uint8_t *w[2]; /* gate and up, or the down in w[0] */
    int64_t expert_bytes, row_bytes;
    int rows, nblk;        /* rows of a matrix; 256-value blocks a row */
    const uint8_t *act;    /* Q8_K rows in the expert-sorted slot order: cols int8, nblk floats, cols / 16 int16 sums */
    int64_t act_ld, cols;
    float *y; /* rows in that order */
    int64_t y_ld;
    const ds4_mq_group *groups;
    const int32_t *n_groups;
    float clamp;
    int store_both; /* gate/up: store gate and up (y row: rows gate values, then rows up values), not SwiGLU */
    const int32_t *tok; /* gate/up: NULL, or act holds a row a token and slot s reads row tok[s] / tok_div */
    int tok_div;
};

/* d = a (16 x 16, rows) * b (16 x 8, columns), f16 in, f32 out. */
__device__ __forceinline__ void ds4_mmc_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
#else
    __trap();
#endif
}

/* Two small integers (exact in f16) as a half2 word, lo in the low half. */
__device__ __forceinline__ uint32_t ds4_mmc_h2(int lo, int hi)
{
    const __half2 h = __floats2half2_rn((float)lo, (float)hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}

/* The group and first row of block blockIdx.x (P.rows / rb blocks a
 * group); false past the chunk's groups (the grid is sized for the most a
 * chunk can have), for the whole block, so no barrier is left waiting. */
__device__ __forceinline__ bool ds4_mmc_block_of(const ds4_mmc_params &P, int rb, ds4_mq_group *G, int64_t *row0)
{
    const uint32_t rbs = (uint32_t)(P.rows / rb);
    const uint32_t gi = blockIdx.x / rbs, r = blockIdx.x - gi * rbs;
    if ((int)gi >= *P.n_groups) return false;
    *G = P.groups[gi];
    *row0 = (int64_t)r * rb;
    return true;
}

/* The row unit (16 bytes) that stage unit j of block b comes from. */
enum { MMC_IQ2_RUNS = 0, MMC_Q2K_RUNS = 1 };
template <int L> __device__ __forceinline__ int64_t ds4_mmc_unit(int b, int j)
{
    if (L == MMC_IQ2_RUNS) { /* the run's scales, then the block's groups */
        const int64_t r = (int64_t)(DS4_IQ2_RUN_BYTES / 16) * (b >> 3);
        return j ? r + 1 + 4 * (b & 7) + j - 1 : r;
    }
    const int64_t r = (int64_t)(DS4_Q2K_RUN_BYTES / 16) * (b >> 2); /* the block's scales, quants, the run's (d, dmin) */
    return j == 0 ? r + DS4_Q2K_RUN_SC / 16 + (b & 3) : j < 5 ? r + DS4_Q2K_RUN_QS / 16 + 4 * (b & 3) + j - 1 : r;
}

/* Stages block b of the 128 weight rows (NMAT matrices of 128 / NMAT rows
 * from row0; its NU units, ds4_mmc_unit<L>) and of the group's ntok
 * activation rows (their int8, and with SUMS the block's 16 sums). */
template <int L, int NU, int AS, int NMAT, bool SUMS>
__device__ __forceinline__ void ds4_mmc_stage(const ds4_mmc_params &P, const ds4_mq_group &G, int64_t row0, int ntok,
                                              int b, uint8_t *sA, const int64_t *arow)
{
    uint8_t *sX = sA + MMC_ROWS * AS;
    for (int k = threadIdx.x; k < MMC_ROWS * NU; k += blockDim.x) {
        const int r = k / NU, j = k - r * NU, m = r / (MMC_ROWS / NMAT), rr = r - m * (MMC_ROWS / NMAT);
        const uint8_t *src = P.w[m] + (int64_t)G.expert * P.expert_bytes + (row0 + rr) * P.row_bytes +
                             16 * ds4_mmc_unit<L>(b, j);
        ds4_mq_cp16(sA + r * AS + 16 * j, src);
    }
    const int xu = SUMS ? 18 : 16;
    for (int k = threadIdx.x; k < ntok * xu; k += blockDim.x) {
        const int t = k / xu, j = k - t * xu;
        const uint8_t *row = P.act + (arow ? arow[t] : (int64_t)(G.first + t)) * P.act_ld;
        const uint8_t *src = j < 16 ? row + 256 * b + 16 * j : row + P.cols + 4 * P.nblk + 32 * b + 16 * (j - 16);
        ds4_mq_cp16(sX + t * MMC_XS + 16 * j, src);
    }
}

/* The group's activation scales, [block][token] (token pairs 2c, 2c + 1
 * adjacent for one 64-bit load). */
__device__ __forceinline__ void ds4_mmc_scales(const ds4_mmc_params &P, const ds4_mq_group &G, int ntok, float *xsc,
                                               const int64_t *arow)
{
    for (int k = threadIdx.x; k < ntok * P.nblk; k += blockDim.x) {
        const int t = k / P.nblk, b = k - t * P.nblk;
        const int64_t r = arow ? arow[t] : (int64_t)(G.first + t);
        xsc[b * MMC_TOK + t] = *(const float *)(P.act + r * P.act_ld + P.cols + 4 * b);
    }
}

/* Rows gate / up of 16 IQ2_XXS rows a warp times the group's tiles, the
 * CPU's numbers (before the 0.125); then SwiGLU, or both stored. ST: the
 * ring's stages. 2 (the default) at three blocks an SM (80 registers, 64
 * KB of shared memory): three stages held two blocks an SM, latency-bound
 * (ncu, thirteenth session: 2.28 IPC, 43% of cycles with no eligible
 * warp); full-size prefill +1.7-1.9% at the 2K-8K frontiers in one run
 * (docs/BENCHMARKS.md, fifteenth session, run y). DS4_CUDA_MOE_MMA_ST=3
 * keeps three stages. */
template <int ST>
__global__ void __launch_bounds__(256, ST == 2 ? 3 : 2) ds4_mmc_iq2_swiglu_kernel(const __grid_constant__ ds4_mmc_params P)
{
    extern __shared__ __align__(16) uint8_t sm[];
    uint2 *grid = (uint2 *)sm;         /* 256 grid rows */
    uint2 *sign = grid + 256;          /* 128 sign masks (0xff bytes for minus) */
    float *xsc = (float *)(sign + 128); /* [nblk][64] */
    uint8_t *stage = (uint8_t *)(xsc + P.nblk * MMC_TOK);
    const int stage_bytes = MMC_ROWS * MMC_IQ2_AS + MMC_TOK * MMC_XS;
    ds4_pdl_enter();
    ds4_mq_group G;
    int64_t row0;
    if (!ds4_mmc_block_of(P, 64, &G, &row0)) return;
    const int ntl = (G.n + 7) >> 3, ntok = 8 * ntl;
    /* the activation row of each of the group's tokens (its last tile's
     * spare tokens read the group's last row) */
    __shared__ int64_t s_arow[MMC_TOK];
    const int64_t *arow = nullptr;
    if (P.tok) {
        for (int t = threadIdx.x; t < ntok; t += blockDim.x)
            s_arow[t] = P.tok[G.first + (t < G.n ? t : G.n - 1)] / P.tok_div;
        __syncthreads();
        arow = s_arow;
    }
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        if (s < P.nblk)
            ds4_mmc_stage<MMC_IQ2_RUNS, MMC_IQ2_NU, MMC_IQ2_AS, 2, false>(P, G, row0, ntok, s, stage + s * stage_bytes, arow);
        ds4_mq_cp_commit();
    }
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
        const uint64_t v = ds4_iq2xxs_grid_dev[i];
        grid[i] = make_uint2((uint32_t)v, (uint32_t)(v >> 32));
    }
    for (int i = threadIdx.x; i < 128; i += blockDim.x) {
        const uint64_t v = ds4_mmvq_sign_masks((uint32_t)i);
        sign[i] = make_uint2((uint32_t)v, (uint32_t)(v >> 32));
    }
    ds4_mmc_scales(P, G, ntok, xsc, arow);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int m = warp >> 2, rt = warp & 3;
    int acc_i[MMC_NT][4];
    float acc_f[MMC_NT][4];
#pragma unroll
    for (int nt = 0; nt < MMC_NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc_i[nt][i] = 0, acc_f[nt][i] = 0.0f;
    for (int b = 0; b < P.nblk; b++) {
        ds4_mq_cp_wait<ST - 2>();
        __syncthreads(); /* block b staged by every thread; block b - 1's buffer read by every warp */
        if (b + ST - 1 < P.nblk)
            ds4_mmc_stage<MMC_IQ2_RUNS, MMC_IQ2_NU, MMC_IQ2_AS, 2, false>(P, G, row0, ntok, b + ST - 1,
                                                               stage + ((b + ST - 1) % ST) * stage_bytes, arow);
        ds4_mq_cp_commit();
        const uint8_t *sA = stage + (b % ST) * stage_bytes, *sX = sA + MMC_ROWS * MMC_IQ2_AS;
        const uint8_t *rA = sA + (m * 64 + rt * 16 + g) * MMC_IQ2_AS, *rB = rA + 8 * MMC_IQ2_AS;
        const int dslot = ds4_iq2_run_dslot(b & 7);
        const float d0 = ds4_f16(((const uint16_t *)rA)[dslot]), d1 = ds4_f16(((const uint16_t *)rB)[dslot]);
        const uint8_t *xg = sX + g * MMC_XS + 8 * c;
#pragma unroll
        for (int p = 0; p < 8; p++) {
            /* group p: grid row c of rows g and g + 8, its 7 sign bits and the group's scale */
            const uint8_t *qA = rA + DS4_IQ2_RUN_QS + 8 * p, *qB = rB + DS4_IQ2_RUN_QS + 8 * p;
            const uint32_t sA32 = ((const uint32_t *)qA)[1], sB32 = ((const uint32_t *)qB)[1];
            const uint2 gA = grid[qA[c]], gB = grid[qB[c]];
            const uint2 mA = sign[(sA32 >> (7 * c)) & 127u], mB = sign[(sB32 >> (7 * c)) & 127u];
            /* grid bytes are 8..43: ~v + 1 never carries */
            const uint32_t a[4] = {(gA.x ^ mA.x) + (mA.x & 0x01010101u), (gB.x ^ mB.x) + (mB.x & 0x01010101u),
                                   (gA.y ^ mA.y) + (mA.y & 0x01010101u), (gB.y ^ mB.y) + (mB.y & 0x01010101u)};
            const int lsA = 2 * (int)(sA32 >> 28) + 1, lsB = 2 * (int)(sB32 >> 28) + 1;
#pragma unroll
            for (int nt = 0; nt < MMC_NT; nt++) {
                if (nt >= ntl) break;
                const uint2 x = *(const uint2 *)(xg + nt * 8 * MMC_XS + 32 * p);
                int C[4] = {0, 0, 0, 0};
                ds4_mmc_s8(C, a, x.x, x.y);
                acc_i[nt][0] += C[0] * lsA, acc_i[nt][1] += C[1] * lsA;
                acc_i[nt][2] += C[2] * lsB, acc_i[nt][3] += C[3] * lsB;
            }
        }
        /* the block's terms: acc += (d * xd) * (float)bsum, as the CPU */
#pragma unroll
        for (int nt = 0; nt < MMC_NT; nt++) {
            if (nt >= ntl) break;
            const float2 xd = *(const float2 *)(xsc + b * MMC_TOK + nt * 8 + 2 * c);
            acc_f[nt][0] = __fadd_rn(acc_f[nt][0], __fmul_rn(__fmul_rn(d0, xd.x), (float)acc_i[nt][0]));
            acc_f[nt][1] = __fadd_rn(acc_f[nt][1], __fmul_rn(__fmul_rn(d0, xd.y), (float)acc_i[nt][1]));
            acc_f[nt][2] = __fadd_rn(acc_f[nt][2], __fmul_rn(__fmul_rn(d1, xd.x), (float)acc_i[nt][2]));
            acc_f[nt][3] = __fadd_rn(acc_f[nt][3], __fmul_rn(__fmul_rn(d1, xd.y), (float)acc_i[nt][3]));
#pragma unroll
            for (int i = 0; i < 4; i++) acc_i[nt][i] = 0;
        }
    }
    ds4_mq_cp_wait<0>();
    __syncthreads(); /* the ring is free: the up warps' results go through it */
    const int64_t rbase = row0 + rt * 16 + g;
    if (P.store_both) {
#pragma unroll
        for (int nt = 0; nt < MMC_NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int tok = 8 * nt + 2 * c + (i & 1);
                if (tok < G.n)
                    P.y[(int64_t)(G.first + tok) * P.y_ld + (int64_t)m * P.rows + rbase + 8 * (i >> 1)] =
                        __fmul_rn(0.125f, acc_f[nt][i]);
            }
        return;
    }
    float *xch = (float *)stage; /* [4 tiles][4 MMC_NT][32 lanes] */
    if (m == 1)
#pragma unroll
        for (int nt = 0; nt < MMC_NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) xch[(rt * 4 * MMC_NT + 4 * nt + i) * 32 + lane] = __fmul_rn(0.125f, acc_f[nt][i]);
    __syncthreads();
    if (m == 1) return;
#pragma unroll
    for (int nt = 0; nt < MMC_NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int tok = 8 * nt + 2 * c + (i & 1);
            if (tok < G.n)
                P.y[(int64_t)(G.first + tok) * P.y_ld + rbase + 8 * (i >> 1)] = ds4_swiglu_clamped(
                    __fmul_rn(0.125f, acc_f[nt][i]), xch[(rt * 4 * MMC_NT + 4 * nt + i) * 32 + lane], P.clamp);
        }
}

/* y rows = down(h) for one group, 16 Q2_K rows a warp, the CPU's numbers. */
__global__ void __launch_bounds__(256, 2) ds4_mmc_q2k_store_kernel(const __grid_constant__ ds4_mmc_params P)
{
    extern __shared__ __align__(16) uint8_t sm[];
    float *xsc = (float *)sm; /* [nblk][64] */
    uint8_t *stage = (uint8_t *)(xsc + P.nblk * MMC_TOK);
    const int stage_bytes = MMC_ROWS * MMC_Q2K_AS + MMC_TOK * MMC_XS;
    ds4_pdl_enter();
    ds4_mq_group G;
    int64_t row0;
    if (!ds4_mmc_block_of(P, MMC_ROWS, &G, &row0)) return;
    const int ntl = (G.n + 7) >> 3, ntok = 8 * ntl;
#pragma unroll
    for (int s = 0; s < MMC_STAGES - 1; s++) {
        if (s < P.nblk)
            ds4_mmc_stage<MMC_Q2K_RUNS, MMC_Q2K_NU, MMC_Q2K_AS, 1, true>(P, G, row0, ntok, s, stage + s * stage_bytes, nullptr);
        ds4_mq_cp_commit();
    }
    ds4_mmc_scales(P, G, ntok, xsc, nullptr);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    float acc_f[MMC_NT][4];
#pragma unroll
    for (int nt = 0; nt < MMC_NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc_f[nt][i] = 0.0f;
    for (int b = 0; b < P.nblk; b++) {
        ds4_mq_cp_wait<MMC_STAGES - 2>();
        __syncthreads();
        if (b + MMC_STAGES - 1 < P.nblk)
            ds4_mmc_stage<MMC_Q2K_RUNS, MMC_Q2K_NU, MMC_Q2K_AS, 1, true>(P, G, row0, ntok, b + MMC_STAGES - 1,
                                                               stage + ((b + MMC_STAGES - 1) % MMC_STAGES) * stage_bytes, nullptr);
        ds4_mq_cp_commit();
        const uint8_t *sA = stage + (b % MMC_STAGES) * stage_bytes, *sX = sA + MMC_ROWS * MMC_Q2K_AS;
        const uint8_t *rA = sA + (warp * 16 + g) * MMC_Q2K_AS, *rB = rA + 8 * MMC_Q2K_AS;
        const int dw = 40 + 2 * (b & 3); /* the block's (d, dmin) in the run's unit at 80 */
        uint32_t scA[4], scB[4]; /* the 16 scale (low) / min (high) nibble bytes */
#pragma unroll
        for (int i = 0; i < 4; i++) scA[i] = ((const uint32_t *)rA)[i], scB[i] = ((const uint32_t *)rB)[i];
        const float dA = ds4_f16(((const uint16_t *)rA)[dw]), mA = ds4_f16(((const uint16_t *)rA)[dw + 1]);
        const float dB = ds4_f16(((const uint16_t *)rB)[dw]), mB = ds4_f16(((const uint16_t *)rB)[dw + 1]);
        const uint8_t *xg = sX + g * MMC_XS + 8 * c;
        int isum[MMC_NT][4];
#pragma unroll
        for (int nt = 0; nt < MMC_NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) isum[nt][i] = 0;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            /* values 128 h + 32 jj + 8c .. + 7: bits 2 jj of qs bytes 32 h + 8c .. + 7 */
            const uint32_t *qa = (const uint32_t *)(rA + 16 + 32 * h + 8 * c), *qb = (const uint32_t *)(rB + 16 + 32 * h + 8 * c);
            const uint32_t qA0 = qa[0], qA1 = qa[1], qB0 = qb[0], qB1 = qb[1];
#pragma unroll
            for (int jj = 0; jj < 4; jj++) {
                const int j = 4 * h + jj; /* sub-block 2j + (c >> 1): byte 2 (j & 1) + (c >> 1) of scale word j >> 1 */
                const uint32_t sh = 16u * (uint32_t)(j & 1) + 8u * (uint32_t)(c >> 1);
                const uint32_t sa = (scA[j >> 1] >> sh) & 15u, sb = (scB[j >> 1] >> sh) & 15u;
                const uint32_t a[4] = {((qA0 >> (2 * jj)) & 0x03030303u) * sa, ((qB0 >> (2 * jj)) & 0x03030303u) * sb,
                                       ((qA1 >> (2 * jj)) & 0x03030303u) * sa, ((qB1 >> (2 * jj)) & 0x03030303u) * sb};
#pragma unroll
                for (int nt = 0; nt < MMC_NT; nt++) {
                    if (nt >= ntl) break;
                    const uint2 x = *(const uint2 *)(xg + nt * 8 * MMC_XS + 32 * j);
                    ds4_mmc_s8(isum[nt], a, x.x, x.y);
                }
            }
        }
        /* the mins: k order (2c, 2c + 1, 2c + 8, 2c + 9) <-> sub-blocks 4c .. 4c + 3 on both sides */
        const uint32_t mwA = (((const uint32_t *)rA)[c] >> 4) & 0x0f0f0f0fu;
        const uint32_t mwB = (((const uint32_t *)rB)[c] >> 4) & 0x0f0f0f0fu;
        const uint32_t am[4] = {ds4_mmc_h2((int)(mwA & 255u), (int)((mwA >> 8) & 255u)),
                                ds4_mmc_h2((int)(mwB & 255u), (int)((mwB >> 8) & 255u)),
                                ds4_mmc_h2((int)((mwA >> 16) & 255u), (int)(mwA >> 24)),
                                ds4_mmc_h2((int)((mwB >> 16) & 255u), (int)(mwB >> 24))};
#pragma unroll
        for (int nt = 0; nt < MMC_NT; nt++) {
            if (nt >= ntl) break;
            const uint2 bs = *(const uint2 *)(xg + nt * 8 * MMC_XS + 256);
            float ms[4];
            ds4_mmc_f16(ms, am, ds4_mmc_h2((int)(int16_t)(bs.x & 0xffffu), (int)(int16_t)(bs.x >> 16)),
                        ds4_mmc_h2((int)(int16_t)(bs.y & 0xffffu), (int)(int16_t)(bs.y >> 16)));
            const float2 xd = *(const float2 *)(xsc + b * MMC_TOK + nt * 8 + 2 * c);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float yd = i & 1 ? xd.y : xd.x, d = i < 2 ? dA : dB, dm = i < 2 ? mA : mB;
                const float t1 = __fmul_rn(__fmul_rn(yd, d), (float)isum[nt][i]);
                const float t2 = __fmul_rn(__fmul_rn(yd, dm), ms[i]);
                acc_f[nt][i] = __fadd_rn(acc_f[nt][i], __fsub_rn(t1, t2));
            }
        }
    }
    ds4_mq_cp_wait<0>();
    const int64_t rbase = row0 + warp * 16 + g;
#pragma unroll
    for (int nt = 0; nt < MMC_NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int tok = 8 * nt + 2 * c + (i & 1);
            if (tok < G.n) P.y[(int64_t)(G.first + tok) * P.y_ld + rbase + 8 * (i >> 1)] = acc_f[nt][i];
        }
}

/* Shared memory of a block: gate/up: the grid and sign tables, the scales,
 * the ring; down: the scales and the ring. */
static size_t ds4_mmc_gu_smem(int nblk, int st)
{
    return 8 * (256 + 128) + 4 * (size_t)nblk * MMC_TOK + st * (size_t)(MMC_ROWS * MMC_IQ2_AS + MMC_TOK * MMC_XS);
}

/* The gate/up kernel's ring: DS4_CUDA_MOE_MMA_ST=3 three stages, else two. */
static int ds4_mmc_gu_stages(void)
{
    static int st = 0;
    if (!st) {
        const char *e = getenv("DS4_CUDA_MOE_MMA_ST");
        st = e && !strcmp(e, "3") ? 3 : 2;
    }
    return st;
}

static size_t ds4_mmc_down_smem(int nblk)
{
    return 4 * (size_t)nblk * MMC_TOK + MMC_STAGES * (size_t)(MMC_ROWS * MMC_Q2K_AS + MMC_TOK * MMC_XS);
}

extern "C" int ds4_cuda_moe_mma_group_tokens(void) { return MMC_TOK; }

/* The shapes the kernels take: whole 256-value blocks, rows whole 16-byte
 * units (IQ2_XXS: 8 blocks a multiple, Q2_K: 4; cp.async, and a block's
 * last unit never past its row), activation rows of 16-byte units whose
 * sums start on one, 64 gate/up rows and 128 down rows a block, two blocks
 * an SM (gate/up three at its default 2-stage ring). */
static bool ds4_mmc_shapes_ok(int64_t D, int64_t F)
{
    const int64_t nd = D / 256, nf = F / 256;
    if (D % 256 || F % 256 || nd % 8 || nf % 4 || F % 64 || D % MMC_ROWS || nd > 64 || nf > 64) return false;
    if (ds4_cuda_mmvq_act_bytes(DS4_TYPE_IQ2_XXS, D) % 16 || ds4_cuda_mmvq_act_bytes(DS4_TYPE_Q2_K, F) % 16)
        return false;
    /* the gate/up bound at its larger, 3-stage ring: either form then fits */
    return ds4_mmc_gu_smem((int)nd, 3) <= 112 * 1024 && ds4_mmc_down_smem((int)nf) <= 112 * 1024;
}

extern "C" bool ds4_cuda_moe_mma_covers(ds4_cuda *cu, ds4_type gu_type, ds4_type down_type, int64_t D, int64_t F)
{
    static int on = -1;
    if (!ds4_env_switch_on("DS4_CUDA_MOE_MMA", &on) || cu->cc_major < 8) return false;
    return gu_type == DS4_TYPE_IQ2_XXS && down_type == DS4_TYPE_Q2_K && ds4_mmc_shapes_ok(D, F);
}

template <typename K>
static ds4_status ds4_mmc_launch(ds4_cuda *cu, K kernel, const ds4_mmc_params &P, int64_t max_groups, int rb,
                                 size_t smem)
{
    DS4_CUDA_CHECK(cudaFuncSetAttribute((const void *)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const int64_t blocks = max_groups * (P.rows / rb);
    if (blocks >= INT32_MAX) return ds4_fail(DS4_ERR_INVALID, "cuda moe mma: %lld blocks", (long long)blocks);
    ds4_launch(kernel, (unsigned)blocks, 256, smem, cu->stream, P);
    DS4_CUDA_CHECK(cudaGetLastError());
    return DS4_OK;
}

static ds4_status ds4_mmc_gu_launch(ds4_cuda *cu, const ds4_mmc_params &P, int64_t max_groups)
{
    return ds4_mmc_gu_stages() == 2
               ? ds4_mmc_launch(cu, ds4_mmc_iq2_swiglu_kernel<2>, P, max_groups, 64, ds4_mmc_gu_smem(P.nblk, 2))
               : ds4_mmc_launch(cu, ds4_mmc_iq2_swiglu_kernel<3>, P, max_groups, 64, ds4_mmc_gu_smem(P.nblk, 3));
}

static ds4_mmc_params ds4_mmc_gu_params(const void *d_gate, const void *d_up, int64_t F, int64_t D,
                                        const ds4_mq_group *d_groups, const int32_t *d_n_groups, const void *d_act,
                                        int64_t act_ld, float *d_y, int64_t y_ld, float clamp, int store_both)
{
    ds4_mmc_params P = {};
    P.w[0] = (const uint8_t *)d_gate, P.w[1] = (const uint8_t *)d_up;
    P.row_bytes = 66 * (D / 256), P.rows = (int)F, P.nblk = (int)(D / 256), P.expert_bytes = F * P.row_bytes;
    P.act = (const uint8_t *)d_act, P.act_ld = act_ld, P.cols = D, P.y = d_y, P.y_ld = y_ld;
    P.groups = d_groups, P.n_groups = d_n_groups, P.clamp = clamp, P.store_both = store_both;
    return P;
}

static ds4_mmc_params ds4_mmc_down_params(const void *d_down, int64_t D, int64_t F, const ds4_mq_group *d_groups,
                                          const int32_t *d_n_groups, const void *d_act, int64_t act_ld, float *d_y,
                                          int64_t y_ld)
{
    ds4_mmc_params P = {};
    P.w[0] = (const uint8_t *)d_down;
    P.row_bytes = 84 * (F / 256), P.rows = (int)D, P.nblk = (int)(F / 256), P.expert_bytes = D * P.row_bytes;
    P.act = (const uint8_t *)d_act, P.act_ld = act_ld, P.cols = F, P.y = d_y, P.y_ld = y_ld;
    P.groups = d_groups, P.n_groups = d_n_groups;
    return P;
}

extern "C" ds4_status ds4_cuda_moe_mma_swiglu(ds4_cuda *cu, const void *d_gate, const void *d_up, int64_t F,
                                              int64_t D, const ds4_mq_group *d_groups, const int32_t *d_n_groups,
                                              int64_t max_groups, const void *d_act, int64_t act_ld, float *d_h,
                                              float clamp, const int32_t *d_tok, int tok_div)
{
    if (!ds4_mmc_shapes_ok(D, F)) return ds4_fail(DS4_ERR_UNSUPPORTED, "cuda moe mma: gate/up %lld x %lld", (long long)F, (long long)D);
    ds4_mmc_params P = ds4_mmc_gu_params(d_gate, d_up, F, D, d_groups, d_n_groups, d_act, act_ld, d_h, F, clamp, 0);
    P.tok = d_tok, P.tok_div = tok_div < 1 ? 1 : tok_div;
    return ds4_mmc_gu_launch(cu, P, max_groups);
}

extern "C" ds4_status ds4_cuda_moe_mma_down(ds4_cuda *cu, const void *d_down, int64_t D, int64_t F,
                                            const ds4_mq_group *d_groups, const int32_t *d_n_groups,
                                            int64_t max_groups, const void *d_act, int64_t act_ld, float *d_y)
{
    if (!ds4_mmc_shapes_ok(D, F)) return ds4_fail(DS4_ERR_UNSUPPORTED, "cuda moe mma: down %lld x %lld", (long long)D, (long long)F);
    const ds4_mmc_params P = ds4_mmc_down_params(d_down, D, F, d_groups, d_n_groups, d_act, act_ld, d_y, D);
    return ds4_mmc_launch(cu, ds4_mmc_q2k_store_kernel, P, max_groups, MMC_ROWS, ds4_mmc_down_smem(P.nblk));
}

extern "C" ds4_status ds4_cuda_moe_mma_products(ds4_cuda *cu, ds4_type type, const void *d_w0, const void *d_w1,
                                                int64_t rows, int64_t cols, const int32_t *groups, int n_groups,
                                                const void *d_act, int64_t act_ld, float *d_y, int64_t y_ld)
{
    if (n_groups < 1 || cu->cc_major < 8 || (type != DS4_TYPE_IQ2_XXS && type != DS4_TYPE_Q2_K))
        return ds4_fail(DS4_ERR_UNSUPPORTED, "cuda moe mma products: type %d, %d groups", (int)type, n_groups);
    const bool iq2 = type == DS4_TYPE_IQ2_XXS;
    if (!(iq2 ? ds4_mmc_shapes_ok(cols, rows) : ds4_mmc_shapes_ok(rows, cols)) || y_ld < (iq2 ? 2 * rows : rows))
        return ds4_fail(DS4_ERR_UNSUPPORTED, "cuda moe mma products: %lld x %lld", (long long)rows, (long long)cols);
    for (int i = 0; i < n_groups; i++)
        if (groups[4 * i + 2] < 1 || groups[4 * i + 2] > MMC_TOK)
            return ds4_fail(DS4_ERR_INVALID, "cuda moe mma products: group %d has %d tokens", i, groups[4 * i + 2]);
    void *d_g = NULL;
    DS4_CUDA_CHECK(cudaMalloc(&d_g, sizeof(ds4_mq_group) * (size_t)n_groups + 16));
    int32_t *d_n = (int32_t *)((uint8_t *)d_g + sizeof(ds4_mq_group) * (size_t)n_groups);
    ds4_status st = DS4_OK;
    if (cudaMemcpy(d_g, groups, sizeof(ds4_mq_group) * (size_t)n_groups, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(d_n, &n_groups, sizeof n_groups, cudaMemcpyHostToDevice) != cudaSuccess)
        st = ds4_fail(DS4_ERR_BACKEND, "cuda moe mma products: upload");
    if (st == DS4_OK) {
        const ds4_mq_group *dg = (const ds4_mq_group *)d_g;
        st = iq2 ? ds4_mmc_gu_launch(
                       cu, ds4_mmc_gu_params(d_w0, d_w1, rows, cols, dg, d_n, d_act, act_ld, d_y, y_ld, 0.0f, 1),
                       n_groups)
                 : ds4_mmc_launch(cu, ds4_mmc_q2k_store_kernel,
                                  ds4_mmc_down_params(d_w0, rows, cols, dg, d_n, d_act, act_ld, d_y, y_ld), n_groups,
                                  MMC_ROWS, ds4_mmc_down_smem((int)(cols / 256)));
    }
    if (cudaStreamSynchronize(cu->stream) != cudaSuccess && st == DS4_OK)
        st = ds4_fail(DS4_ERR_BACKEND, "cuda moe mma products: %s", cudaGetErrorString(cudaGetLastError()));
    cudaFree(d_g);
    return st;
}

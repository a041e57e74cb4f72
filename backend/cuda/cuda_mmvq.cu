/*
 * cuda_mmvq.cu - decode matvec for the quantized weight types on int8
 * activations: Q8_0 weights x Q8_0 activations, Q2_K and IQ2_XXS weights x
 * Q8_K activations, with dp4a (cuda_mmvq.cuh has the integer pieces and
 * why the formats are the CPU's).
 *
 * Two launches per matrix product:
 *  1. the activation rows are quantized into the CPU's format (one warp per
 *     Q8_0 block of 32 or per Q8_K block of 256), bit for bit the CPU's
 *     bytes;
 *  2. the matvec: a warp per weight row (or group of rows), persistent
 *     grid. The row is not a whole number of 16-byte units per block (34,
 *     84 and 66 bytes), so each warp copies its rows into its own slice of
 *     shared memory with 16-byte copies and each lane takes tasks
 *     (cuda_mmvq.cuh) from there. The pipelined kernel (rows that fit its
 *     buffers: every decode shape of Flash but Q8_0 rows of 8192) copies
 *     with cp.async into two buffers, the next group in flight while one is
 *     computed; the plain kernel (wider rows, DS4_CUDA_MMVQ_PIPE=0) goes a
 *     chunk at a time through registers. Warps never wait for each other
 *     (only __syncwarp). Activations are read through L1 (the same int8
 *     vector serves every row).
 * Up to 4 tokens share each weight pass (per-token accumulators); a
 * (row, token) result does not depend on how many tokens ran with it.
 * Routed experts: blockIdx.y = slot; the slot's expert id is read on the
 * device. Block-diagonal (grouped) products: slot s uses block s mod G.
 */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_mmvq.cuh"
#include "backend/cuda/cuda_tables.cuh"
#include "backend/cuda/cuda_weight_runs.cuh"
#include "backend/cuda/cuda_moe1.cuh"
#include "backend/cuda/cuda_mq_device.cuh"

#include <stdlib.h>
#include <string.h>

#define MQ_WARPS 8
#define MQ_THREADS (MQ_WARPS * 32)

/* Shared-memory bytes of one warp's row chunk: a whole number of blocks and
 * of 16-byte units (Q8_0 128 blocks = 4096 values, Q2_K and IQ2_XXS 32
 * blocks = 8192 values). */
template <int T> struct ds4_mq_chunk;
template <> struct ds4_mq_chunk<DS4_TYPE_Q8_0> { enum { BYTES = 34 * 128 }; };
template <> struct ds4_mq_chunk<DS4_TYPE_Q2_K> { enum { BYTES = 84 * 32 }; };
template <> struct ds4_mq_chunk<DS4_TYPE_IQ2_XXS> { enum { BYTES = 66 * 32 }; };

/* What a launch computes. An "item" is one output row of one slot (or,
 * for the MoE combine, one output row of one token); a warp takes items
 * i, i + (warps in the grid), ... so the grid is sized to the GPU, not to
 * the matrix (a warp per item and exit left small matrices latency bound:
 * the loads of a warp's next row now overlap other warps' arithmetic).
 * Epilogues:
 *   MQ_STORE    y = row . x
 *   MQ_SWIGLU   two matrices (gate, up) on the same x: y = silu(min(g, c)) *
 *               clamp(u, -c, c), as the CPU's clamped SwiGLU
 *   MQ_ADD      y = (accumulate ? y : 0) + row . x
 *   MQ_COMBINE  routed experts' down projection and the weighted sum:
 *               out[t] = (accumulate ? out[t] : 0) + sum over the token's
 *               slots in ascending expert id of w_j * (row_e . h_j), the
 *               CPU's order, so the combine adds what the CPU adds */
enum { MQ_STORE = 0, MQ_SWIGLU = 1, MQ_ADD = 2, MQ_COMBINE = 3 };

struct ds4_mq_params {
    const uint8_t *w[2];  /* weight base of each matrix (gate, up for MQ_SWIGLU) */
    int64_t rows, cols, row_bytes;
    const uint8_t *act;   /* quantized activation rows */
    int64_t act_ld;       /* bytes between activation rows */
    float *y;
    int64_t y_tok_stride;  /* floats between the NT tokens of a launch */
    int64_t n_slots;       /* items = n_slots * rows (MQ_COMBINE: n_slots / k tokens) */
    int64_t x_share;       /* slot s reads activation row s / x_share */
    int64_t y_slot_stride; /* floats between slots (MQ_COMBINE: between tokens) */
    const int32_t *ids;    /* MoE: expert of each slot (or NULL) */
    int64_t n_expert, expert_bytes; /* ids NULL, n_expert = G > 1: slot s uses block s mod G */
    const float *route_w;  /* MQ_COMBINE: weight of each slot */
    int k;                 /* MQ_COMBINE: slots per token (at most MQ_MAX_K) */
    float clamp;           /* MQ_SWIGLU */
    int accumulate;        /* MQ_ADD, MQ_COMBINE */
    int rs;                /* pipelined MQ_STORE / MQ_ADD: rows per group */
    /* issue 14 (VRAM expert cache, cuda_expert_cache.cu): expert -> slot of
     * the pool at w[]; the order stays by expert id. NULL: slot = expert. */
    const int32_t *slot_of;
    /* expert-grouped products (ds4_cuda_mmvq_groups, plain kernel only):
     * slot s is token group s of *n_groups: expert groups[s].expert on
     * activation / output rows groups[s].first .. + groups[s].n (<= NT),
     * rows y_tok_stride floats apart in y */
    const ds4_mq_group *groups;
    const int32_t *n_groups;
    /* the pipelined kernel's QX form: one token's float activation, which
     * each block quantizes (Q8_K) into its shared memory; act unused */
    const float *xf;
};
#define MQ_MAX_K 16

/* ---- activation quantizers -------------------------------------------- */

/* One warp per 32-value block; lane j owns value j. */
__global__ void ds4_mq_quant_q8_0_kernel(const float *x, int64_t x_ld, int64_t n_rows, int64_t cols,
                                         uint8_t *out, int64_t out_ld, const int32_t *map, int map_div)
{
    ds4_pdl_enter();
    const int lane = threadIdx.x & 31;
    const int64_t nb = cols / 32;
    const int64_t b = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (b >= n_rows * nb) return; /* whole warps leave together */
    const int64_t r = b / nb, k = b % nb;
    const int64_t src = map ? map[r] / map_div : r; /* out row r quantizes x row src */
    const float v = x[src * x_ld + k * 32 + lane];
    float amax = fabsf(v);
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    uint8_t *row = out + r * out_ld;
    row[k * 32 + lane] = (uint8_t)ds4_mmvq_q8_0_q(v, ds4_mmvq_q8_0_id(amax));
    if (lane == 0) ((float *)(row + cols))[k] = ds4_mmvq_q8_0_d(amax);
}


/* One warp per 256-value block. */
__global__ void ds4_mq_quant_q8_k_kernel(const float *x, int64_t x_ld, int64_t n_rows, int64_t cols,
                                         uint8_t *out, int64_t out_ld, const int32_t *map, int map_div)
{
    ds4_pdl_enter();
    const int lane = threadIdx.x & 31;
    const int64_t nb = cols / 256;
    const int64_t b = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (b >= n_rows * nb) return;
    const int64_t r = b / nb, k = b % nb;
    const int64_t src = map ? map[r] / map_div : r; /* out row r quantizes x row src */
    ds4_mq_q8k_block(x + src * x_ld, k, out + r * out_ld, cols, lane);
}

/* ---- the matvec ------------------------------------------------------------ */

/* GR = MQ_LEAN selects the lean forms of one token's products: IQ2_XXS
 * here, Q2_K in ds4_mq_compute (ds4_mq_q2k_lean).
 * The lean IQ2_XXS form of one token's row: the grid
 * and the 128 sign masks each in 16 interleaved shared-memory copies
 * (lane l reads copy l mod 16, so the 16 lanes of a half-warp's 8-byte
 * loads hit 16 different bank pairs) and a group's integer computed by
 * ds4_mq_iq2_lean_group (cuda_mmvq.cuh, checked on the host). Lane l always
 * takes part l mod 8 of blocks l / 8, l / 8 + 4, ...: the generic loop's
 * tasks in its order, and the same integers and float terms, so the
 * result is bit for bit that of the other forms. tab: the grid copies
 * (32 KiB), then the sign-mask copies (16 KiB). */
#define MQ_LEAN 5
template <bool SH>
__device__ __forceinline__ float ds4_mq_iq2_lean(const uint8_t *blocks, int nblk, int64_t blk0, const uint8_t *act0,
                                                 int64_t cols, const uint64_t *tab)
{
    const int lane = threadIdx.x & 31, part = lane & 7;
    const uint32_t cofs = (uint32_t)(lane & 15) * 8u; /* this lane's copy, in bytes */
    const uint8_t *gtab = (const uint8_t *)tab, *stab = gtab + 256 * 16 * 8;
    const float *dxs = (const float *)(act0 + cols);
    const bool runs = ds4_iq2_runs(cols); /* blocks starts a run: blk0 is a multiple of 32 */
    float acc = 0.0f;
    for (int bl = lane >> 3; bl < nblk; bl += 4) {
        const uint8_t *dp = blocks + ds4_iq2_d_ofs(bl, runs);
        const int64_t b = blk0 + bl;
        uint32_t qa, qb; /* the group's 4 grid indices, then 4 x 7 sign bits and the scale */
        ds4_mq_iq2_words(blocks + ds4_iq2_qs_ofs(bl, runs), part, &qa, &qb);
        uint32_t x[8];
        ds4_mmvq_ld16<SH>(act0 + b * 256 + 32 * part, x);
        ds4_mmvq_ld16<SH>(act0 + b * 256 + 32 * part + 16, x + 4);
        const int is = ds4_mq_iq2_lean_group(qa, qb, x, gtab, stab, cofs);
        acc += ds4_f16(ds4_ld_u16(dp)) * dxs[b] * (float)is;
    }
    return acc;
}

/* Add one weight row's dot products with NT activation rows (act0, act_ld
 * apart) to the lanes' partial sums acc[]. The row goes through the warp's
 * shared-memory slice a chunk at a time: all its 16-byte loads issued, then
 * stored, then each lane decodes its tasks once and dots them with every
 * token. Integers of a block are summed across its lanes before the block's
 * float term (the CPU's number), which the block's first lane adds. */
/* Add the dot products of nblk weight blocks (a row's blocks blk0 ..,
 * already in shared memory at `blocks`) with NT activation rows (act0,
 * act_ld apart) to the lanes' partial sums acc[]: each lane decodes its
 * tasks once and dots them with every token, and adds its task's float
 * term (the integer dot of its part of the block times the block's
 * scales; summing the parts' integers across lanes first, as the CPU sums
 * the block, cost a shuffle chain per block for a difference in float
 * rounding only). tables: the IQ2_XXS grid (256) then the sign masks (128). */
template <int T, int NT, int GR = 0, bool SH = false>
__device__ __forceinline__ void ds4_mq_compute(const uint8_t *blocks, int nblk, int64_t blk0, const uint8_t *act0,
                                               int64_t act_ld, int64_t cols, const uint64_t *grid, float acc[NT])
{
    typedef ds4_mmvq_t<T> M;
    typedef typename ds4_mq_task_of<T>::type Task;
    enum { TPB = M::TPB };
    const int lane = threadIdx.x & 31;
    if constexpr (T == DS4_TYPE_IQ2_XXS && GR == MQ_LEAN && NT == 1) {
        acc[0] += ds4_mq_iq2_lean<SH>(blocks, nblk, blk0, act0, cols, grid);
        return;
    }
    if constexpr (T == DS4_TYPE_Q2_K && GR == MQ_LEAN && NT == 1) {
        /* lane l takes quarter l mod 4 of blocks l / 4, l / 4 + 8, ...: the
         * generic loop's tasks and terms in its order (bit for bit) */
        const float *dxs = (const float *)(act0 + cols);
        const int16_t *bsums = (const int16_t *)(dxs + cols / 256);
        const int part = lane & 3;
        const bool runs = ds4_q2k_runs(cols); /* blocks starts a run: blk0 is a multiple of 32 */
        for (int bl = lane >> 2; bl < nblk; bl += 8) {
            const uint8_t *dd = blocks + ds4_q2k_dd_ofs(bl, runs);
            const int64_t b = blk0 + bl;
            int ms = 0;
            const int is = ds4_mq_q2k_lean<SH>(blocks + ds4_q2k_sc_ofs(bl, runs), blocks + ds4_q2k_qs_ofs(bl, runs),
                                               part, act0 + b * 256, bsums + b * 16, &ms);
            const float dx = dxs[b];
            acc[0] += dx * ds4_f16(ds4_ld_u16(dd)) * (float)is - dx * ds4_f16(ds4_ld_u16(dd + 2)) * (float)ms;
        }
        return;
    }
    const int ntask = nblk * TPB;
    for (int t0 = 0; t0 < ntask; t0 += 32) {
        const int t = t0 + lane;
        const bool on = t < ntask;
        const int bl = on ? t / TPB : 0, part = t % TPB;
        const int64_t b = blk0 + bl; /* block index in the row */
        Task task;
        if constexpr (T == DS4_TYPE_IQ2_XXS) { /* GR > 0: a replicated grid, the signs computed */
            const bool runs = ds4_iq2_runs(cols); /* blocks starts a run: blk0 is a multiple of 32 */
            ds4_mq_decode_iq2(blocks + ds4_iq2_d_ofs(bl, runs), blocks + ds4_iq2_qs_ofs(bl, runs), part, grid,
                              GR != MQ_LEAN ? GR : 0, lane, GR > 0 && GR != MQ_LEAN ? NULL : grid + 256, task);
        } else if constexpr (T == DS4_TYPE_Q2_K) {
            const bool runs = ds4_q2k_runs(cols); /* blocks starts a run: blk0 is a multiple of 32 */
            ds4_mq_decode_q2k(blocks + ds4_q2k_sc_ofs(bl, runs), blocks + ds4_q2k_qs_ofs(bl, runs),
                              blocks + ds4_q2k_dd_ofs(bl, runs), part, task);
        } else
            ds4_mq_decode(blocks + bl * M::BB, part, grid, NULL, task);
#pragma unroll
        for (int tok = 0; tok < NT; tok++) {
            const uint8_t *a = act0 + tok * act_ld;
            const float *dxs = (const float *)(a + cols);
            const int16_t *bsums = (const int16_t *)(dxs + cols / M::BE);
            if (on) {
                int ms = 0;
                const int is = ds4_mq_dot<SH>(task, a + b * M::BE, bsums + b * 16, part, &ms);
                acc[tok] += ds4_mq_term(task, dxs[b], is, ms);
            }
        }
    }
}

/* One weight row through the warp's shared-memory slice a chunk at a time
 * (all of a chunk's 16-byte loads issued, then stored, then computed): the
 * path for rows longer than the pipelined kernel's buffers. */
template <int T, int NT>
__device__ __forceinline__ void ds4_mq_row(const uint8_t *wr, const uint8_t *act0, int64_t act_ld, int64_t cols,
                                           uint8_t *chunk, const uint64_t *grid, float acc[NT])
{
    typedef ds4_mmvq_t<T> M;
    enum { CH = ds4_mq_chunk<T>::BYTES, N16 = (CH + 15) / 16, PER_LANE = (N16 + 31) / 32 };
    const int lane = threadIdx.x & 31;
    const int64_t nblk_row = cols / M::BE;
    for (int64_t blk0 = 0; blk0 < nblk_row; blk0 += CH / M::BB) {
        const int nblk = (int)min((int64_t)(CH / M::BB), nblk_row - blk0);
        const int n16 = nblk * M::BB / 16; /* whole: row_bytes % 16 == 0 is a precondition */
        const uint4 *src = (const uint4 *)(wr + blk0 * M::BB);
        uint4 v[PER_LANE];
#pragma unroll
        for (int k = 0; k < PER_LANE; k++)
            if (lane + 32 * k < n16) v[k] = __ldcs(src + lane + 32 * k);
        __syncwarp(); /* the previous chunk's readers are done */
#pragma unroll
        for (int k = 0; k < PER_LANE; k++)
            if (lane + 32 * k < n16) ((uint4 *)chunk)[lane + 32 * k] = v[k];
        __syncwarp();
        ds4_mq_compute<T, NT>(chunk, nblk, blk0, act0, act_ld, cols, grid, acc);
    }
}


/* Weight row `row` of matrix `m` for `slot`, or NULL for a bad expert id. */
__device__ __forceinline__ const uint8_t *ds4_mq_wrow(const ds4_mq_params &P, int m, int64_t slot, int64_t row)
{
    const uint8_t *w = P.w[m];
    if (P.groups) { /* slot = token group */
        const int32_t e = P.groups[slot].expert;
        if (e < 0 || e >= P.n_expert) return NULL;
        w += (int64_t)e * P.expert_bytes;
    } else if (P.ids) {
        const int32_t e = P.ids[slot];
        if (e < 0 || e >= P.n_expert) return NULL;
        w += (int64_t)(P.slot_of ? P.slot_of[e] : e) * P.expert_bytes; /* issue 14: slot_of */
    } else if (P.n_expert > 1) {
        w += (slot % P.n_expert) * P.expert_bytes;
    }
    return w + row * P.row_bytes;
}

template <int T, int NT, int EPI>
__global__ void __launch_bounds__(MQ_THREADS) ds4_mq_kernel(const ds4_mq_params P)
{
    ds4_pdl_enter();
    enum { CH = ds4_mq_chunk<T>::BYTES, NMAT = EPI == MQ_SWIGLU ? 2 : 1 };
    __shared__ __align__(16) uint8_t s_chunk[MQ_WARPS][(CH + 15) / 16 * 16 + 16];
    __shared__ uint64_t s_grid[T == DS4_TYPE_IQ2_XXS ? 384 : 1];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (T == DS4_TYPE_IQ2_XXS) {
        for (int i = tid; i < 384; i += MQ_THREADS)
            s_grid[i] = i < 256 ? ds4_iq2xxs_grid_dev[i] : ds4_mmvq_sign_masks((uint32_t)(i - 256));
        __syncthreads();
    }
    uint8_t *chunk = s_chunk[warp];
    const float fnan = __int_as_float(0x7fc00000);
    const float fin = T == DS4_TYPE_IQ2_XXS ? 0.125f : 1.0f; /* IQ2_XXS grid values are 8x; exact */
    const int64_t n_tok_items = P.groups ? *P.n_groups : EPI == MQ_COMBINE ? P.n_slots / P.k : P.n_slots;
    const int64_t n_items = n_tok_items * P.rows;
    const int64_t stride = (int64_t)gridDim.x * MQ_WARPS;
    for (int64_t item = (int64_t)blockIdx.x * MQ_WARPS + warp; item < n_items; item += stride) {
        const int64_t s = item / P.rows, row = item - s * P.rows;
        int n_valid = NT;
        int64_t first = 0;
        if constexpr (EPI != MQ_COMBINE) {
            if (P.groups) {
                const ds4_mq_group gr = P.groups[s];
                n_valid = gr.n;
                first = gr.first;
            }
        }
        if constexpr (EPI == MQ_COMBINE) {
            /* s is the token; its slots in ascending expert id */
            int ord[MQ_MAX_K];
            int32_t eid[MQ_MAX_K];
            for (int j = 0; j < P.k; j++) eid[j] = P.ids[s * P.k + j];
            ds4_mq_order_by_id(eid, P.k, ord);
            float *out = P.y + s * P.y_slot_stride + row;
            float tot = P.accumulate ? *out : 0.0f;
            for (int jj = 0; jj < P.k; jj++) {
                const int64_t slot = s * P.k + ord[jj];
                const uint8_t *wr = ds4_mq_wrow(P, 0, slot, row);
                if (!wr) {
                    tot = fnan;
                    continue;
                }
                float acc[1] = {0.0f};
                ds4_mq_row<T, 1>(wr, P.act + (slot / P.x_share) * P.act_ld, P.act_ld, P.cols, chunk, s_grid, acc);
                const float v = ds4_mq_warp_sum(acc[0]) * fin;
                tot = __fadd_rn(tot, __fmul_rn(P.route_w[slot], v));
            }
            if (lane == 0) *out = tot;
        } else {
        float acc[NMAT][NT];
#pragma unroll
        for (int m = 0; m < NMAT; m++)
#pragma unroll
            for (int t = 0; t < NT; t++) acc[m][t] = 0.0f;
        bool bad = false;
        const uint8_t *act0 = P.groups ? P.act + first * P.act_ld : P.act + (s / P.x_share) * P.act_ld;
#pragma unroll
        for (int m = 0; m < NMAT; m++) {
            const uint8_t *wr = ds4_mq_wrow(P, m, s, row);
            if (!wr) {
                bad = true;
                break;
            }
            ds4_mq_row<T, NT>(wr, act0, P.act_ld, P.cols, chunk, s_grid, acc[m]);
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v[NMAT];
#pragma unroll
            for (int m = 0; m < NMAT; m++) v[m] = bad ? fnan : ds4_mq_warp_sum(acc[m][t]) * fin;
            float *yp = P.groups ? P.y + (first + t) * P.y_tok_stride + row
                                 : P.y + s * P.y_slot_stride + t * P.y_tok_stride + row;
            if (lane != 0 || t >= n_valid) continue;
            if (EPI == MQ_SWIGLU) {
                *yp = ds4_swiglu_clamped(v[0], v[NMAT - 1], P.clamp);
            } else if (EPI == MQ_ADD) {
                *yp = P.accumulate ? __fadd_rn(*yp, v[0]) : v[0];
            } else {
                *yp = v[0];
            }
        }
        }
    }
}

/* ---- the pipelined matvec: whole rows, double-buffered ----------------

 * When a "group" of weight rows fits one buffer (every decode shape of the
 * model does), each warp owns two buffers: while it computes group i from
 * one, cp.async is already copying group i + 1 into the other, so every
 * warp always has a group's bytes in flight (the plain kernel waited for
 * each chunk). A group is RS consecutive rows of one slot (MQ_STORE,
 * MQ_ADD), the gate and up rows of one output (MQ_SWIGLU), or the k expert
 * rows of one output of one token (MQ_COMBINE): one DRAM round trip for all
 * of them. */
template <int T> struct ds4_mq_pipe;
template <> struct ds4_mq_pipe<DS4_TYPE_Q8_0> { enum { WARPS = 4, CH = 34 * 128 }; };
template <> struct ds4_mq_pipe<DS4_TYPE_Q2_K> { enum { WARPS = 4, CH = 84 * 48 }; };
template <> struct ds4_mq_pipe<DS4_TYPE_IQ2_XXS> { enum { WARPS = 4, CH = 66 * 32 }; };
#define MQ_MAX_RS 8


/* Where work unit g is: its slot (MQ_COMBINE: token), its first row and
 * how many rows it has. Unsigned 32-bit division (the host launches this
 * kernel only for fewer than 2^31 units and rows): the 64-bit divisions
 * it replaces were a subroutine call each, several per unit. */
struct ds4_mq_at {
    int64_t s, row;
    int nr;
};
template <int EPI>
__device__ __forceinline__ ds4_mq_at ds4_mq_locate(const ds4_mq_params &P, int64_t g, uint32_t ngs)
{
    ds4_mq_at at;
    if (EPI == MQ_SWIGLU || EPI == MQ_COMBINE) {
        const uint32_t s = (uint32_t)g / (uint32_t)P.rows;
        at.s = s;
        at.row = (uint32_t)g - s * (uint32_t)P.rows;
        at.nr = EPI == MQ_SWIGLU ? 2 : P.k;
    } else {
        const uint32_t s = (uint32_t)g / ngs;
        at.s = s;
        at.row = (int64_t)((uint32_t)g - s * ngs) * P.rs;
        at.nr = (int)min((int64_t)P.rs, P.rows - at.row);
    }
    return at;
}

/* The activation row of slot s: s / x_share (most calls share nothing). */
__device__ __forceinline__ int64_t ds4_mq_xrow(const ds4_mq_params &P, int64_t s)
{
    return P.x_share == 1 ? s : (int64_t)((uint32_t)s / (uint32_t)P.x_share);
}

template <int T, int EPI>
__device__ __forceinline__ void ds4_mq_prefetch(const ds4_mq_params &P, const ds4_mq_at &at, uint8_t *buf)
{
    const int lane = threadIdx.x & 31;
    const int n16 = (int)(P.row_bytes / 16);
    /* MQ_COMBINE: the k expert ids in one load by k lanes, not k dependent ones */
    const int32_t my_id = EPI == MQ_COMBINE && lane < P.k ? P.ids[at.s * P.k + lane] : 0;
    for (int r = 0; r < at.nr; r++) {
        const uint8_t *src;
        if (EPI == MQ_COMBINE) {
            const int32_t e = __shfl_sync(0xffffffffu, my_id, r);
            src = e < 0 || e >= P.n_expert ? NULL
                                           : P.w[0] + (int64_t)(P.slot_of ? P.slot_of[e] : e) * P.expert_bytes +
                                                 at.row * P.row_bytes; /* issue 14: slot_of */
        } else if (EPI == MQ_SWIGLU) {
            src = ds4_mq_wrow(P, r, at.s, at.row);
        } else {
            src = ds4_mq_wrow(P, 0, at.s, at.row + r);
        }
        if (!src) continue; /* a bad expert id: computed as NaN */
        for (int k = lane; k < n16; k += 32) ds4_mq_cp16(buf + r * P.row_bytes + 16 * k, src + 16 * k);
    }
    ds4_mq_cp_commit();
}

template <int T, int NT, int EPI, int GR, bool QX>
__device__ __forceinline__ void ds4_mq_group_compute(const ds4_mq_params &P, const ds4_mq_at &at, const uint8_t *buf,
                                                     const uint64_t *grid, const uint8_t *s_act)
{
    typedef ds4_mmvq_t<T> M;
    const int lane = threadIdx.x & 31;
    const int nblk = (int)(P.cols / M::BE);
    const float fnan = __int_as_float(0x7fc00000);
    const float fin = T == DS4_TYPE_IQ2_XXS ? 0.125f : 1.0f; /* IQ2_XXS grid values are 8x; exact */
    if constexpr (EPI == MQ_COMBINE) {
        const int64_t tok = at.s, row = at.row;
        /* The token's slots are added in ascending expert id, ties in slot
         * order (the CPU's order, ds4_mq_order_by_id): lane j < k finds
         * its slot's rank, and step jj takes the lane ranked jj. */
        const int32_t my_id = lane < P.k ? P.ids[tok * P.k + lane] : 0;
        const float my_w = lane < P.k ? P.route_w[tok * P.k + lane] : 0.0f;
        int rank = 0;
        for (int i = 0; i < P.k; i++) {
            const int32_t e = __shfl_sync(0xffffffffu, my_id, i);
            rank += e < my_id || (e == my_id && i < lane);
        }
        float *out = P.y + tok * P.y_slot_stride + row;
        float tot = P.accumulate ? *out : 0.0f;
        for (int jj = 0; jj < P.k; jj++) {
            const int j = __ffs(__ballot_sync(0xffffffffu, lane < P.k && rank == jj)) - 1;
            const int32_t e = __shfl_sync(0xffffffffu, my_id, j);
            const int64_t slot = tok * P.k + j;
            if (e < 0 || e >= P.n_expert) {
                tot = fnan;
                continue;
            }
            float acc[1] = {0.0f};
            ds4_mq_compute<T, 1, GR>(buf + j * P.row_bytes, nblk, 0, P.act + ds4_mq_xrow(P, slot) * P.act_ld,
                                     P.act_ld, P.cols, grid, acc);
            const float v = ds4_mq_warp_sum(acc[0]) * fin;
            tot = __fadd_rn(tot, __fmul_rn(__shfl_sync(0xffffffffu, my_w, j), v));
        }
        if (lane == 0) *out = tot;
    } else if constexpr (EPI == MQ_SWIGLU) {
        const int64_t s = at.s, row = at.row;
        const bool bad = ds4_mq_wrow(P, 0, s, row) == NULL;
        float acc[2][NT];
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int t = 0; t < NT; t++) acc[m][t] = 0.0f;
        const int n_valid = P.groups ? P.groups[s].n : NT;
        const int64_t first = P.groups ? P.groups[s].first : 0;
        const uint8_t *act0 = QX         ? s_act
                              : P.groups ? P.act + first * P.act_ld
                                         : P.act + ds4_mq_xrow(P, s) * P.act_ld;
        if (!bad) {
            ds4_mq_compute<T, NT, GR, QX>(buf, nblk, 0, act0, P.act_ld, P.cols, grid, acc[0]);
            ds4_mq_compute<T, NT, GR, QX>(buf + P.row_bytes, nblk, 0, act0, P.act_ld, P.cols, grid, acc[1]);
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float gv0 = bad ? fnan : ds4_mq_warp_sum(acc[0][t]) * fin;
            const float uv0 = bad ? fnan : ds4_mq_warp_sum(acc[1][t]) * fin;
            float *yp = P.groups ? P.y + (first + t) * P.y_tok_stride + row
                                 : P.y + s * P.y_slot_stride + t * P.y_tok_stride + row;
            if (lane == 0 && t < n_valid) *yp = ds4_swiglu_clamped(gv0, uv0, P.clamp);
        }
    } else {
        const int64_t s = at.s, row0 = at.row;
        const int nr = at.nr;
        const bool bad = ds4_mq_wrow(P, 0, s, row0) == NULL;
        const int n_valid = P.groups ? P.groups[s].n : NT;
        const int64_t first = P.groups ? P.groups[s].first : 0;
        const uint8_t *act0 = P.groups ? P.act + first * P.act_ld : P.act + ds4_mq_xrow(P, s) * P.act_ld;
        for (int r = 0; r < nr; r++) {
            float acc[NT];
#pragma unroll
            for (int t = 0; t < NT; t++) acc[t] = 0.0f;
            if (!bad) ds4_mq_compute<T, NT, GR>(buf + r * P.row_bytes, nblk, 0, act0, P.act_ld, P.cols, grid, acc);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const float v = bad ? fnan : ds4_mq_warp_sum(acc[t]) * fin;
                float *yp = P.groups ? P.y + (first + t) * P.y_tok_stride + row0 + r
                                     : P.y + s * P.y_slot_stride + t * P.y_tok_stride + row0 + r;
                if (lane == 0 && t < n_valid) *yp = EPI == MQ_ADD && P.accumulate ? __fadd_rn(*yp, v) : v;
            }
        }
    }
}

/* Warps of a pipelined block: 8 with IQ2_XXS tables in shared memory (the
 * replicated grid's 32 KiB: 3 blocks = 24 warps fit an SM; the lean form's
 * 48 KiB: 2 blocks = 16 warps), so more warps share them, else the type's
 * own. */
template <int T, int GR> struct ds4_mq_pipe_w { enum { W = T == DS4_TYPE_IQ2_XXS && GR > 0 ? 8 : ds4_mq_pipe<T>::WARPS }; };

/* 64-bit words of the IQ2_XXS tables in dynamic shared memory for GR. */
template <int T, int GR> __host__ __device__ constexpr int ds4_mq_rep_words()
{
    return T != DS4_TYPE_IQ2_XXS ? 0 : GR == MQ_LEAN ? (256 + 128) * 16 : GR > 0 ? 256 << GR : 0;
}

/* GR > 0 (IQ2_XXS only): the grid in 2^GR interleaved copies in dynamic
 * shared memory (cuda_mmvq.cuh, ds4_mq_decode_iq2), or for GR = MQ_LEAN
 * the lean form's grid and sign-mask copies, written before the wait on
 * the previous kernel (they read constants only). */
template <int T, int NT, int EPI, int GR, bool QX>
__global__ void __launch_bounds__(ds4_mq_pipe_w<T, GR>::W * 32) ds4_mq_pipe_kernel(const ds4_mq_params P)
{
    enum { W = ds4_mq_pipe_w<T, GR>::W, CH = ds4_mq_pipe<T>::CH };
    /* +16: a task's funnel-shifted loads read up to 4 bytes past its block */
    __shared__ __align__(16) uint8_t s_buf[W][2][CH + 16];
    __shared__ uint64_t s_grid[T == DS4_TYPE_IQ2_XXS && GR == 0 ? 384 : 1];
    extern __shared__ uint64_t s_rep[];
    const uint64_t *grid = s_grid;
    if constexpr (T == DS4_TYPE_IQ2_XXS && GR == MQ_LEAN) { /* 16 copies of the grid, then of the signs */
        for (int i = threadIdx.x; i < 256 * 16; i += W * 32) s_rep[i] = ds4_iq2xxs_grid_dev[i >> 4];
        for (int i = threadIdx.x; i < 128 * 16; i += W * 32)
            s_rep[256 * 16 + i] = ds4_mmvq_sign_masks((uint32_t)(i >> 4));
        __syncthreads();
        grid = s_rep;
    } else if constexpr (T == DS4_TYPE_IQ2_XXS && GR > 0) {
        for (int i = threadIdx.x; i < (256 << GR); i += W * 32) s_rep[i] = ds4_iq2xxs_grid_dev[i >> GR];
        __syncthreads();
        grid = s_rep;
    }
    ds4_pdl_enter();
    const int warp = threadIdx.x >> 5;
    /* QX (one token, SwiGLU): the activation quantized here, after the
     * grid copies in dynamic shared memory, by the quantizer kernel's code */
    uint8_t *s_act = (uint8_t *)(s_rep + ds4_mq_rep_words<T, GR>());
    if constexpr (QX) {
        for (int64_t kb = warp; kb < P.cols / 256; kb += W) ds4_mq_q8k_block(P.xf, kb, s_act, P.cols, threadIdx.x & 31);
        __syncthreads();
    }
    if (T == DS4_TYPE_IQ2_XXS && GR == 0) {
        for (int i = threadIdx.x; i < 384; i += W * 32)
            s_grid[i] = i < 256 ? ds4_iq2xxs_grid_dev[i] : ds4_mmvq_sign_masks((uint32_t)(i - 256));
        __syncthreads();
    }
    const int64_t n_slots = P.groups ? *P.n_groups : P.n_slots;
    int64_t n_groups;
    if (EPI == MQ_SWIGLU) n_groups = n_slots * P.rows;
    else if (EPI == MQ_COMBINE) n_groups = n_slots / P.k * P.rows;
    else n_groups = n_slots * ((P.rows + P.rs - 1) / P.rs);
    const uint32_t ngs = EPI == MQ_SWIGLU || EPI == MQ_COMBINE ? 1u : (uint32_t)((P.rows + P.rs - 1) / P.rs);
    const int64_t stride = (int64_t)gridDim.x * W;
    int64_t g = (int64_t)blockIdx.x * W + warp;
    if (g >= n_groups) return;
    ds4_mq_at at = ds4_mq_locate<EPI>(P, g, ngs);
    ds4_mq_prefetch<T, EPI>(P, at, s_buf[warp][0]);
    for (int i = 0; g < n_groups; i++, g += stride) {
        const bool more = g + stride < n_groups;
        ds4_mq_at next = at;
        if (more) {
            next = ds4_mq_locate<EPI>(P, g + stride, ngs);
            ds4_mq_prefetch<T, EPI>(P, next, s_buf[warp][(i + 1) & 1]);
        }
        if (more) ds4_mq_cp_wait<1>();
        else ds4_mq_cp_wait<0>();
        __syncwarp();
        ds4_mq_group_compute<T, NT, EPI, GR, QX>(P, at, s_buf[warp][i & 1], grid, s_act);
        __syncwarp(); /* the buffer is refilled by the prefetch two groups on */
        at = next;
    }
}

/* ---- host side -------------------------------------------------------------- */

static bool ds4_mq_env_on(void)
{
    const char *e = getenv("DS4_CUDA_MMVQ");
    return !(e && e[0] == '0');
}

extern "C" int ds4_cuda_mmvq_active(ds4_type type, const void *d_w, int64_t cols, int64_t expert_bytes)
{
    if (type != DS4_TYPE_Q8_0 && type != DS4_TYPE_Q2_K && type != DS4_TYPE_IQ2_XXS) return 0;
    static int on = -1;
    if (on < 0) on = ds4_mq_env_on() ? 1 : 0;
    if (!on) return 0;
    const int64_t be = ds4_cuda_block_elems(type), bb = ds4_cuda_block_bytes(type);
    if (cols <= 0 || cols % be != 0) return 0;
    const int64_t row_bytes = cols / be * bb;
    return row_bytes % 16 == 0 && (uintptr_t)d_w % 16 == 0 && expert_bytes % 16 == 0;
}

extern "C" int64_t ds4_cuda_mmvq_act_bytes(ds4_type type, int64_t cols)
{
    return ds4_mmvq_act_row_bytes(type == DS4_TYPE_Q8_0 ? 0 : 1, cols);
}

/* Quantize n_rows activation rows (x_ld floats apart) into the context's
 * activation buffer, grown as needed (a growth bumps mem_gen, so a recorded
 * graph is recorded anew). Returns the buffer and the row stride. */
static ds4_status ds4_mq_quantize_into(ds4_cuda *cu, int kind_k, const float *d_x, int64_t x_ld, int64_t n_rows,
                                       int64_t cols, uint8_t *out, int64_t ld, const int32_t *map = NULL,
                                       int map_div = 1)
{
    if ((uintptr_t)d_x % 16 != 0 || x_ld % 4 != 0 || cols % (kind_k ? 256 : 32) != 0)
        return ds4_fail(DS4_ERR_INVALID, "cuda mmvq: x must be 16-byte aligned, x_ld %% 4 == 0 and cols a whole "
                                         "number of blocks (x_ld %lld, cols %lld)", (long long)x_ld, (long long)cols);
    const int64_t blocks = n_rows * (cols / (kind_k ? 256 : 32));
    const unsigned grid = (unsigned)((blocks + MQ_WARPS - 1) / MQ_WARPS);
    if (blocks == 0) return DS4_OK;
    if (kind_k)
        ds4_launch(ds4_mq_quant_q8_k_kernel, grid, MQ_THREADS, 0, cu->stream, d_x, x_ld, n_rows, cols, out, ld, map,
                   map_div);
    else
        ds4_launch(ds4_mq_quant_q8_0_kernel, grid, MQ_THREADS, 0, cu->stream, d_x, x_ld, n_rows, cols, out, ld, map,
                   map_div);
    DS4_CUDA_CHECK(cudaGetLastError());
    return DS4_OK;
}

extern "C" ds4_status ds4_cuda_mmvq_quantize(ds4_cuda *cu, ds4_type type, const float *d_x, int64_t x_ld,
                                             int64_t n_rows, int64_t cols, void *d_out)
{
    if (type != DS4_TYPE_Q8_0 && type != DS4_TYPE_Q2_K && type != DS4_TYPE_IQ2_XXS)
        return ds4_fail(DS4_ERR_UNSUPPORTED, "cuda mmvq: weight type %d", (int)type);
    const int k = type == DS4_TYPE_Q8_0 ? 0 : 1;
    return ds4_mq_quantize_into(cu, k, d_x, x_ld, n_rows, cols, (uint8_t *)d_out, ds4_mmvq_act_row_bytes(k, cols));
}

ds4_status ds4_mq_act_reserve(ds4_cuda *cu, size_t need, uint8_t **buf)
{
    if (cu->act_bytes < need) {
        if (cu->act) {
            DS4_CUDA_CHECK(cudaStreamSynchronize(cu->stream));
            cudaFree(cu->act);
            cu->act = NULL;
            cu->act_bytes = 0;
        }
        cu->mem_gen++;
        const size_t want = need < ((size_t)1 << 20) ? ((size_t)1 << 20) : need;
        DS4_CUDA_CHECK(cudaMalloc(&cu->act, want));
        cu->act_bytes = want;
    }
    *buf = (uint8_t *)cu->act;
    return DS4_OK;
}

static ds4_status ds4_mq_quantize(ds4_cuda *cu, int kind_k, const float *d_x, int64_t x_ld, int64_t n_rows,
                                  int64_t cols, uint8_t **act, int64_t *act_ld)
{
    const int64_t ld = ds4_mmvq_act_row_bytes(kind_k, cols);
    uint8_t *buf = NULL;
    ds4_status st = ds4_mq_act_reserve(cu, (size_t)ld * (size_t)n_rows, &buf);
    if (st != DS4_OK) return st;
    st = ds4_mq_quantize_into(cu, kind_k, d_x, x_ld, n_rows, cols, buf, ld);
    if (st != DS4_OK) return st;
    *act = buf;
    *act_ld = ld;
    return DS4_OK;
}

/* Blocks for a launch: enough to fill every SM at the kernel's occupancy
 * (asked once per kernel), fewer when there are fewer work units. */
template <typename K>
static unsigned ds4_mq_grid_of(ds4_cuda *cu, K kernel, int threads, int *per_sm, int64_t n_units, int warps,
                               size_t smem = 0)
{
    if (*per_sm == 0) {
        int n = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem) != cudaSuccess || n < 1) n = 1;
        *per_sm = n;
    }
    const int64_t need = (n_units + warps - 1) / warps, full = (int64_t)*per_sm * cu->n_sm;
    return (unsigned)(need < full ? (need < 1 ? 1 : need) : full);
}

static bool ds4_mq_pipe_off(void)
{
    static int off = -1;
    if (off < 0) {
        const char *e = getenv("DS4_CUDA_MMVQ_PIPE");
        off = e && e[0] == '0';
    }
    return off == 1;
}

/* One form of the pipelined kernel: its dynamic shared memory (the grid
 * copies, the QX activation row) may pass the 48 KiB a launch gets without
 * the opt-in attribute, which is raised per device as needed. */
template <int T, int NT, int EPI, int GR, bool QX>
static void ds4_mq_pipe_go(ds4_cuda *cu, const ds4_mq_params &P, int64_t n_groups)
{
    enum { W = ds4_mq_pipe_w<T, GR>::W };
    const size_t smem = (size_t)ds4_mq_rep_words<T, GR>() * sizeof(uint64_t) +
                        (QX ? (size_t)ds4_mmvq_act_row_bytes(1, P.cols) : 0);
    static size_t attr_smem[32]; /* per device: the dynamic size allowed so far */
    static int per_sm = 0;
    if (smem > 0 && cu->device < 32 && attr_smem[cu->device] < smem) {
        cudaFuncSetAttribute(ds4_mq_pipe_kernel<T, NT, EPI, GR, QX>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)smem);
        attr_smem[cu->device] = smem;
    }
    const unsigned grid = ds4_mq_grid_of(cu, ds4_mq_pipe_kernel<T, NT, EPI, GR, QX>, W * 32, &per_sm, n_groups, W, smem);
    ds4_launch(ds4_mq_pipe_kernel<T, NT, EPI, GR, QX>, grid, W * 32, smem, cu->stream, P);
}

static bool ds4_mq_rep_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_IQ2_REP", &on);
}

/* The lean forms for one token's products (IQ2_XXS: ds4_mq_iq2_lean;
 * Q2_K: ds4_mq_q2k_lean); DS4_CUDA_IQ2_LEAN=0 keeps the replicated-grid
 * IQ2_XXS form and the generic Q2_K loop, for A/B runs. */
static bool ds4_mq_lean_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_IQ2_LEAN", &on);
}

/* The pipelined kernel over n_groups work units. IQ2_XXS and Q2_K for one
 * token take the lean forms (DS4_CUDA_IQ2_LEAN=0: IQ2_XXS with the
 * replicated grid, or with DS4_CUDA_IQ2_REP=0 too the single table; Q2_K
 * the generic loop; for A/B runs). Several tokens per pass (prefill groups) share each
 * lookup among them, and there the plain table's higher occupancy
 * measured better (full q2 prefill at 2K: 564-568 tok/s with the copies,
 * 579-589 without, 2026-12-02). P.xf (one token's SwiGLU, set by
 * ds4_cuda_mmvq_swiglu): the QX form, which quantizes the activation. */
template <int T, int NT, int EPI>
static void ds4_mq_pipe_launch(ds4_cuda *cu, const ds4_mq_params &P, int64_t n_groups)
{
    constexpr bool rep_type = T == DS4_TYPE_IQ2_XXS && NT == 1;
    constexpr bool lean_type = (T == DS4_TYPE_IQ2_XXS || T == DS4_TYPE_Q2_K) && NT == 1;
    constexpr int lean = lean_type ? MQ_LEAN : 0, rep = rep_type ? 4 : 0;
    if constexpr (NT == 1 && EPI == MQ_SWIGLU && T != DS4_TYPE_Q8_0) {
        if (P.xf) {
            if (T == DS4_TYPE_IQ2_XXS && P.ids && !P.groups) { /* Flash's width: cuda_moe_gateup1.cu */
                const ds4_g1_args g = {P.w[0], P.w[1], P.rows, P.cols, P.expert_bytes, P.n_expert, P.ids,
                                       P.slot_of, P.n_slots, P.xf, P.clamp, P.y, P.y_slot_stride};
                if (ds4_g1_gateup(cu, g)) return;
            }
            if (lean_type && ds4_mq_lean_on()) ds4_mq_pipe_go<T, NT, EPI, lean, true>(cu, P, n_groups);
            else if (rep_type && ds4_mq_rep_on()) ds4_mq_pipe_go<T, NT, EPI, rep, true>(cu, P, n_groups);
            else ds4_mq_pipe_go<T, NT, EPI, 0, true>(cu, P, n_groups);
            return;
        }
    }
    if (lean_type && ds4_mq_lean_on()) ds4_mq_pipe_go<T, NT, EPI, lean, false>(cu, P, n_groups);
    else if (rep_type && ds4_mq_rep_on()) ds4_mq_pipe_go<T, NT, EPI, rep, false>(cu, P, n_groups);
    else ds4_mq_pipe_go<T, NT, EPI, 0, false>(cu, P, n_groups);
}

template <int T, int NT, int EPI>
static void ds4_mq_launch_one(ds4_cuda *cu, ds4_mq_params P)
{
    enum { CH = ds4_mq_pipe<T>::CH };
    const int nr = EPI == MQ_SWIGLU ? 2 : EPI == MQ_COMBINE ? P.k : 1;
    if (!ds4_mq_pipe_off() && P.row_bytes * nr <= CH) {
        int64_t n_groups;
        if (EPI == MQ_SWIGLU) {
            n_groups = P.n_slots * P.rows;
        } else if (EPI == MQ_COMBINE) {
            n_groups = P.n_slots / P.k * P.rows;
        } else {
            P.rs = (int)(CH / P.row_bytes < MQ_MAX_RS ? CH / P.row_bytes : MQ_MAX_RS);
            n_groups = P.n_slots * ((P.rows + P.rs - 1) / P.rs);
        }
        if (n_groups < INT32_MAX) { /* the kernel locates its units in 32 bits */
            ds4_mq_pipe_launch<T, NT, EPI>(cu, P, n_groups);
            return;
        }
    }
    static int per_sm = 0;
    const int64_t n_items = (EPI == MQ_COMBINE ? P.n_slots / P.k : P.n_slots) * P.rows;
    const unsigned grid = ds4_mq_grid_of(cu, ds4_mq_kernel<T, NT, EPI>, MQ_THREADS, &per_sm, n_items, MQ_WARPS);
    ds4_launch(ds4_mq_kernel<T, NT, EPI>, grid, MQ_THREADS, 0, cu->stream, P);
}

template <int T, int EPI>
static ds4_status ds4_mq_launch_t(ds4_cuda *cu, const ds4_mq_params &P, int nt)
{
    switch (nt) {
    case 1: ds4_mq_launch_one<T, 1, EPI>(cu, P); break;
    case 2: ds4_mq_launch_one<T, 2, EPI>(cu, P); break;
    case 3: ds4_mq_launch_one<T, 3, EPI>(cu, P); break;
    case 4: ds4_mq_launch_one<T, 4, EPI>(cu, P); break;
    default: return ds4_fail(DS4_ERR_INVALID, "cuda mmvq: bad token group %d", nt);
    }
    DS4_CUDA_CHECK(cudaGetLastError());
    return DS4_OK;
}

template <int T>
static ds4_status ds4_mq_launch_e(ds4_cuda *cu, const ds4_mq_params &P, int nt, int epi)
{
    switch (epi) {
    case MQ_STORE: return ds4_mq_launch_t<T, MQ_STORE>(cu, P, nt);
    case MQ_SWIGLU: return ds4_mq_launch_t<T, MQ_SWIGLU>(cu, P, nt);
    case MQ_ADD: return ds4_mq_launch_t<T, MQ_ADD>(cu, P, nt);
    case MQ_COMBINE: return nt == 1 ? ds4_mq_launch_t<T, MQ_COMBINE>(cu, P, 1)
                                    : ds4_fail(DS4_ERR_INVALID, "cuda mmvq: combine takes one token group");
    default: return ds4_fail(DS4_ERR_INVALID, "cuda mmvq: epilogue %d", epi);
    }
}

static_assert((int)MQ_STORE == (int)DS4_Q8S_STORE && (int)MQ_SWIGLU == (int)DS4_Q8S_SWIGLU && (int)MQ_ADD == (int)DS4_Q8S_ADD,
              "the split-layout kernel shares the epilogue numbers");

/* Q8_0 matrices with a split-layout copy (cuda_q8split.cu) take that
 * kernel: dense and block-diagonal products, not routed experts; true when
 * launched (nt 1-4 or 8 tokens). */
static bool ds4_mq_q8s_run(ds4_cuda *cu, ds4_type type, const ds4_mq_params &P, int nt, int epi)
{
    if (type != DS4_TYPE_Q8_0 || P.ids || P.x_share != 1 || epi == MQ_COMBINE) return false;
    const ds4_q8s_args a = {{P.w[0], P.w[1]}, P.rows, P.cols, P.n_expert, P.act, P.act_ld, P.y,
                            P.y_tok_stride, P.y_slot_stride, P.n_slots, P.clamp, P.accumulate};
    return ds4_q8split_run(cu, &a, nt, epi) != 0;
}

static ds4_status ds4_mq_run(ds4_cuda *cu, ds4_type type, const ds4_mq_params &P, int nt, int epi)
{
    if (ds4_mq_q8s_run(cu, type, P, nt, epi)) {
        DS4_CUDA_CHECK(cudaGetLastError());
        return DS4_OK;
    }
    switch (type) {
    case DS4_TYPE_Q8_0: return ds4_mq_launch_e<DS4_TYPE_Q8_0>(cu, P, nt, epi);
    case DS4_TYPE_Q2_K: return ds4_mq_launch_e<DS4_TYPE_Q2_K>(cu, P, nt, epi);
    case DS4_TYPE_IQ2_XXS: return ds4_mq_launch_e<DS4_TYPE_IQ2_XXS>(cu, P, nt, epi);
    default: return ds4_fail(DS4_ERR_UNSUPPORTED, "cuda mmvq: weight type %d", (int)type);
    }
}

static int ds4_mq_kind(ds4_type type) { return type == DS4_TYPE_Q8_0 ? 0 : 1; }

static void ds4_mq_base(ds4_type type, const void *d_w, int64_t rows, int64_t cols, ds4_mq_params *P)
{
    memset(P, 0, sizeof *P);
    P->w[0] = P->w[1] = (const uint8_t *)d_w;
    P->rows = rows;
    P->cols = cols;
    P->row_bytes = cols / ds4_cuda_block_elems(type) * ds4_cuda_block_bytes(type);
    P->x_share = 1;
    P->n_slots = 1;
}

/* Dense: tokens x_ld / y_ld floats apart, up to 4 per weight pass. */
static ds4_status ds4_mq_dense_epi(ds4_cuda *cu, ds4_type type, const void *d_w, const void *d_w2, int64_t rows,
                                   int64_t cols, const float *d_x, int64_t x_ld, int64_t n_tok, float *d_y,
                                   int64_t y_ld, int epi, float clamp, int accumulate)
{
    if (type == DS4_TYPE_Q8_0 && n_tok == 1 && epi != MQ_COMBINE) { /* one token: quantized in the matvec */
        const ds4_q8f_args f = {{d_w, d_w2 ? d_w2 : d_w}, rows, cols, 1, d_x, x_ld, d_y, 0, 1, clamp, accumulate,
                                NULL, 0.0f};
        if (ds4_q8split_fused_run(cu, &f, epi)) {
            DS4_CUDA_CHECK(cudaGetLastError());
            return DS4_OK;
        }
    }
    if (type == DS4_TYPE_Q8_0 && n_tok >= 9 && n_tok <= 16 && epi != MQ_COMBINE) {
        /* 9-16 tokens in one weight pass on the tensor cores, the activation
         * quantized in the launch (cuda_q8split_mma.cu; on unless
         * DS4_CUDA_Q8S_MMA=0); each token's sums as below */
        const ds4_q8m_args m = {{d_w, d_w2 ? d_w2 : d_w}, rows, cols, 1, d_x, x_ld, d_y, y_ld, 0, (int)n_tok,
                                clamp, accumulate};
        if (ds4_q8split_mma_run(cu, &m, epi)) {
            DS4_CUDA_CHECK(cudaGetLastError());
            return DS4_OK;
        }
    }
    uint8_t *act = NULL;
    int64_t act_ld = 0;
    ds4_status st = ds4_mq_quantize(cu, ds4_mq_kind(type), d_x, x_ld, n_tok, cols, &act, &act_ld);
    if (st != DS4_OK) return st;
    ds4_mq_params P;
    ds4_mq_base(type, d_w, rows, cols, &P);
    if (d_w2) P.w[1] = (const uint8_t *)d_w2;
    P.act_ld = act_ld;
    P.y_tok_stride = y_ld;
    P.clamp = clamp;
    P.accumulate = accumulate;
    for (int64_t t0 = 0; t0 < n_tok;) {
        P.act = act + t0 * act_ld;
        P.y = d_y + t0 * y_ld;
        /* 8 tokens a weight pass where the split-layout kernel takes them
         * (batched decode: 16 sessions read each matrix twice, not 4 times);
         * each token's sums are those of a pass of 1-4 */
        if (n_tok - t0 >= 8 && ds4_mq_q8s_run(cu, type, P, 8, epi)) {
            DS4_CUDA_CHECK(cudaGetLastError());
            t0 += 8;
            continue;
        }
        const int nt = (int)(n_tok - t0 < 4 ? n_tok - t0 : 4);
        st = ds4_mq_run(cu, type, P, nt, epi);
        if (st != DS4_OK) return st;
        t0 += nt;
    }
    return DS4_OK;
}

ds4_status ds4_cuda_mmvq_dense(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows, int64_t cols,
                               const float *d_x, int64_t x_ld, int64_t n_tok, float *d_y, int64_t y_ld)
{
    return ds4_mq_dense_epi(cu, type, d_w, NULL, rows, cols, d_x, x_ld, n_tok, d_y, y_ld, MQ_STORE, 0.0f, 0);
}

/* The slot form's common part: quantize the activation rows the slots read
 * (slot s reads row s / x_share of x, cols floats apart) and fill P for
 * rows-per-slot outputs rows apart in y. */
static ds4_status ds4_mq_slot_setup(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows, int64_t cols,
                                    const int32_t *d_ids, int64_t n_expert, int64_t expert_bytes, int64_t n_slots,
                                    int64_t x_share, const float *d_x, float *d_y, ds4_mq_params *P, bool qx = false)
{
    uint8_t *act = NULL;
    int64_t act_ld = 0;
    const int64_t n_x = (n_slots + x_share - 1) / x_share;
    if (!qx) { /* qx: the kernel quantizes x itself (ds4_mq_qx_takes) */
        ds4_status st = ds4_mq_quantize(cu, ds4_mq_kind(type), d_x, cols, n_x, cols, &act, &act_ld);
        if (st != DS4_OK) return st;
    }
    ds4_mq_base(type, d_w, rows, cols, P);
    P->xf = qx ? d_x : NULL;
    P->act = act;
    P->act_ld = act_ld;
    P->y = d_y;
    P->y_tok_stride = rows;
    P->n_slots = n_slots;
    P->x_share = x_share;
    P->y_slot_stride = rows;
    P->ids = d_ids;
    P->n_expert = n_expert;
    P->expert_bytes = expert_bytes;
    return DS4_OK;
}

ds4_status ds4_cuda_mmvq_slots(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows, int64_t cols,
                               const int32_t *d_ids, int64_t n_expert, int64_t expert_bytes, int64_t n_slots,
                               int64_t x_share, const float *d_x, float *d_y)
{
    if (type == DS4_TYPE_Q8_0 && !d_ids && x_share == 1 && n_expert > 1 && n_slots % n_expert == 0 &&
        n_slots / n_expert >= 9 && n_slots / n_expert <= 16) {
        /* block-diagonal with 9-16 tokens (slot t * G + g: token t, group
         * g): each group's rows read once for all tokens on the tensor
         * cores (cuda_q8split_mma.cu), each slot's sums as below */
        const ds4_q8m_args m = {{d_w, d_w}, rows, cols, n_expert, d_x, cols, d_y, n_expert * rows, rows,
                                (int)(n_slots / n_expert), 0.0f, 0};
        if (ds4_q8split_mma_run(cu, &m, MQ_STORE)) {
            DS4_CUDA_CHECK(cudaGetLastError());
            return DS4_OK;
        }
    }
    if (type == DS4_TYPE_Q8_0 && !d_ids && x_share == 1) { /* block-diagonal: each slot's x quantized in the matvec */
        const ds4_q8f_args f = {{d_w, d_w}, rows, cols, n_expert, d_x, cols, d_y, rows, n_slots, 0.0f, 0, NULL, 0.0f};
        if (ds4_q8split_fused_run(cu, &f, MQ_STORE)) {
            DS4_CUDA_CHECK(cudaGetLastError());
            return DS4_OK;
        }
    }
    ds4_mq_params P;
    ds4_status st = ds4_mq_slot_setup(cu, type, d_w, rows, cols, d_ids, n_expert, expert_bytes, n_slots, x_share,
                                      d_x, d_y, &P);
    return st != DS4_OK ? st : ds4_mq_run(cu, type, P, 1, MQ_STORE);
}

/* Whether one token's routed SwiGLU takes the QX form of the pipelined
 * kernel: K-quant weights (Q8_K activations), every slot on the one token
 * (x_share >= n_slots), the pipelined kernel's shapes, x 16-byte aligned.
 * DS4_CUDA_MOE_QX=0: the quantizer launch, for A/B runs. */
static bool ds4_mq_qx_takes(ds4_type type, int64_t rows, int64_t cols, int64_t n_slots, int64_t x_share,
                            const float *d_x)
{
    static int on = -1;
    if (type == DS4_TYPE_Q8_0 || x_share < n_slots || cols % 256 != 0 || ((uintptr_t)d_x & 15u) != 0) return false;
    if (!ds4_env_switch_on("DS4_CUDA_MOE_QX", &on) || ds4_mq_pipe_off()) return false;
    const int64_t row_bytes = cols / ds4_cuda_block_elems(type) * ds4_cuda_block_bytes(type);
    const int64_t ch = type == DS4_TYPE_IQ2_XXS ? (int64_t)ds4_mq_pipe<DS4_TYPE_IQ2_XXS>::CH
                                                : (int64_t)ds4_mq_pipe<DS4_TYPE_Q2_K>::CH;
    return 2 * row_bytes <= ch && n_slots * rows < INT32_MAX;
}

extern "C" ds4_status ds4_cuda_mmvq_swiglu(ds4_cuda *cu, ds4_type type, const void *d_gate, const void *d_up,
                                           int64_t rows, int64_t cols, const int32_t *d_ids, int64_t n_expert,
                                           int64_t n_slots, int64_t x_share, const float *d_x, float clamp,
                                           float *d_h)
{
    const int64_t eb = rows * (cols / ds4_cuda_block_elems(type) * ds4_cuda_block_bytes(type));
    if (!ds4_cuda_mmvq_active(type, d_gate, cols, eb) || !ds4_cuda_mmvq_active(type, d_up, cols, eb))
        return ds4_fail(DS4_ERR_UNSUPPORTED, "cuda mmvq swiglu: weights not supported by the int8 path");
    if (!d_ids) /* dense: the n_slots tokens are rows of x */
        return ds4_mq_dense_epi(cu, type, d_gate, d_up, rows, cols, d_x, cols, n_slots, d_h, rows, MQ_SWIGLU,
                                clamp, 0);
    ds4_mq_params P;
    /* one token's routed experts: the pipelined kernel may quantize the
     * activation itself (the QX form), no quantizer launch */
    ds4_status st = ds4_mq_slot_setup(cu, type, d_gate, rows, cols, d_ids, n_expert, eb, n_slots, x_share, d_x, d_h,
                                      &P, ds4_mq_qx_takes(type, rows, cols, n_slots, x_share, d_x));
    if (st != DS4_OK) return st;
    if (type == DS4_TYPE_IQ2_XXS && x_share < n_slots && P.act) { /* a batched step: cuda_moe_gateup_batch.cu */
        const ds4_gb_args b = {(const uint8_t *)d_gate, (const uint8_t *)d_up, rows, cols, eb, n_expert, d_ids,
                               n_slots, x_share, P.act, P.act_ld, (int)((n_slots + x_share - 1) / x_share), clamp,
                               d_h, rows, 0};
        if (ds4_gb_gateup(cu, b)) {
            DS4_CUDA_CHECK(cudaGetLastError());
            return DS4_OK;
        }
    }
    P.w[1] = (const uint8_t *)d_up;
    P.clamp = clamp;
    return ds4_mq_run(cu, type, P, 1, MQ_SWIGLU);
}

/* issue 14: ds4_cuda_mmvq_down with experts at slots of a pool (slot_of). */
extern "C" ds4_status ds4_cuda_mmvq_down_slots(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows,
                                               int64_t cols, const int32_t *d_ids, const int32_t *d_slot_of,
                                               int64_t n_expert, const float *d_route_w, int k, int64_t n_tok,
                                               const float *d_h, float *d_out, int accumulate);

extern "C" ds4_status ds4_cuda_mmvq_down(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows, int64_t cols,
                                         const int32_t *d_ids, int64_t n_expert, const float *d_route_w, int k,
                                         int64_t n_tok, const float *d_h, float *d_out, int accumulate)
{
    return ds4_cuda_mmvq_down_slots(cu, type, d_w, rows, cols, d_ids, NULL, n_expert, d_route_w, k, n_tok, d_h,
                                    d_out, accumulate);
}

extern "C" ds4_status ds4_cuda_mmvq_down_slots(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows,
                                               int64_t cols, const int32_t *d_ids, const int32_t *d_slot_of,
                                               int64_t n_expert, const float *d_route_w, int k, int64_t n_tok,
                                               const float *d_h, float *d_out, int accumulate)
{
    const int64_t eb = rows * (cols / ds4_cuda_block_elems(type) * ds4_cuda_block_bytes(type));
    if (!ds4_cuda_mmvq_active(type, d_w, cols, eb))
        return ds4_fail(DS4_ERR_UNSUPPORTED, "cuda mmvq down: weights not supported by the int8 path");
    if (!d_ids)
        return ds4_mq_dense_epi(cu, type, d_w, NULL, rows, cols, d_h, cols, n_tok, d_out, rows, MQ_ADD, 0.0f,
                                accumulate);
    if (k < 1 || k > MQ_MAX_K)
        return ds4_fail(DS4_ERR_INVALID, "cuda mmvq down: %d experts per token (at most %d)", k, MQ_MAX_K);
    /* the shared expert's result, added in the store when offered and this
     * is a plain sum (its event waited for just before the launch) */
    const float *addend = cu->down_add.y && !accumulate ? cu->down_add.y : NULL;
    if (type == DS4_TYPE_Q2_K && n_tok == 1) { /* Flash's shape: h quantized in the kernel */
        const ds4_g2_args g = {(const uint8_t *)d_w, rows, cols, eb, n_expert, d_ids, d_slot_of, d_route_w, k, d_h,
                               d_out, accumulate, addend};
        if (addend) DS4_CUDA_CHECK(cudaStreamWaitEvent(cu->stream, cu->down_add.ready, 0));
        if (ds4_g2_down(cu, g)) {
            DS4_CUDA_CHECK(cudaGetLastError());
            if (addend) cu->down_add.taken = 1;
            return DS4_OK;
        }
    }
    ds4_mq_params P; /* a slot per (token, expert), its own h row; outputs per token, rows apart */
    ds4_status st = ds4_mq_slot_setup(cu, type, d_w, rows, cols, d_ids, n_expert, eb, n_tok * k, 1, d_h, d_out, &P);
    if (st != DS4_OK) return st;
    if (type == DS4_TYPE_Q2_K && n_tok > 1 && !d_slot_of) { /* a batched step: cuda_moe_down_batch.cu */
        const ds4_gd_args b = {(const uint8_t *)d_w, rows, cols, eb, n_expert, d_ids, d_route_w, k, (int)n_tok,
                               P.act, P.act_ld, d_out, rows, accumulate, addend};
        if (addend) DS4_CUDA_CHECK(cudaStreamWaitEvent(cu->stream, cu->down_add.ready, 0));
        if (ds4_gd_down(cu, b)) { /* it checks the token count */
            DS4_CUDA_CHECK(cudaGetLastError());
            if (addend) cu->down_add.taken = 1;
            return DS4_OK;
        }
    }
    P.route_w = d_route_w;
    P.k = k;
    P.accumulate = accumulate;
    P.slot_of = d_slot_of; /* issue 14 */
    return ds4_mq_run(cu, type, P, 1, MQ_COMBINE);
}

/* ---- expert-grouped products (prefill chunks; cuda_moe_grouped.cu) -------- */

extern "C" ds4_status ds4_cuda_mmvq_quantize_map(ds4_cuda *cu, ds4_type type, const float *d_x, int64_t x_ld,
                                                 const int32_t *d_map, int map_div, int64_t n_rows, int64_t cols,
                                                 void *d_out)
{
    if (type != DS4_TYPE_Q8_0 && type != DS4_TYPE_Q2_K && type != DS4_TYPE_IQ2_XXS)
        return ds4_fail(DS4_ERR_UNSUPPORTED, "cuda mmvq: weight type %d", (int)type);
    const int k = type == DS4_TYPE_Q8_0 ? 0 : 1;
    return ds4_mq_quantize_into(cu, k, d_x, x_ld, n_rows, cols, (uint8_t *)d_out, ds4_mmvq_act_row_bytes(k, cols),
                                d_map, map_div < 1 ? 1 : map_div);
}

/* The pipelined kernel when a work unit's rows fit its buffers (every
 * Flash expert shape), else the plain one; grids for the most groups the
 * chunk can have (the kernels read the real count on the device). */
template <int T, int EPI>
static void ds4_mq_launch_groups(ds4_cuda *cu, ds4_mq_params P, int64_t max_groups)
{
    enum { CH = ds4_mq_pipe<T>::CH };
    const int nr = EPI == MQ_SWIGLU ? 2 : 1;
    if (!ds4_mq_pipe_off() && P.row_bytes * nr <= CH) {
        int64_t units = max_groups * P.rows;
        if (EPI == MQ_STORE) {
            P.rs = (int)(CH / P.row_bytes < MQ_MAX_RS ? CH / P.row_bytes : MQ_MAX_RS);
            units = max_groups * ((P.rows + P.rs - 1) / P.rs);
        }
        if (units < INT32_MAX) { /* the kernel locates its units in 32 bits */
            ds4_mq_pipe_launch<T, 4, EPI>(cu, P, units);
            return;
        }
    }
    static int per_sm = 0;
    const unsigned grid =
        ds4_mq_grid_of(cu, ds4_mq_kernel<T, 4, EPI>, MQ_THREADS, &per_sm, max_groups * P.rows, MQ_WARPS);
    ds4_launch(ds4_mq_kernel<T, 4, EPI>, grid, MQ_THREADS, 0, cu->stream, P);
}

extern "C" ds4_status ds4_cuda_mmvq_groups(ds4_cuda *cu, ds4_type type, const void *d_w, const void *d_w2,
                                           int64_t rows, int64_t cols, int64_t expert_bytes, int64_t n_expert,
                                           const ds4_mq_group *d_groups, const int32_t *d_n_groups,
                                           int64_t max_groups, const void *d_act, float *d_y, int64_t y_ld, int epi,
                                           float clamp)
{
    if (!ds4_cuda_mmvq_active(type, d_w, cols, expert_bytes) || (d_w2 && !ds4_cuda_mmvq_active(type, d_w2, cols,
                                                                                                 expert_bytes)))
        return ds4_fail(DS4_ERR_UNSUPPORTED, "cuda mmvq groups: weights not supported by the int8 path");
    if (epi != MQ_STORE && epi != MQ_SWIGLU)
        return ds4_fail(DS4_ERR_INVALID, "cuda mmvq groups: epilogue %d", epi);
    ds4_mq_params P;
    ds4_mq_base(type, d_w, rows, cols, &P);
    if (d_w2) P.w[1] = (const uint8_t *)d_w2;
    P.act = (const uint8_t *)d_act;
    P.act_ld = ds4_mmvq_act_row_bytes(ds4_mq_kind(type), cols);
    P.y = d_y;
    P.y_tok_stride = y_ld;
    P.n_expert = n_expert;
    P.expert_bytes = expert_bytes;
    P.clamp = clamp;
    P.groups = d_groups;
    P.n_groups = d_n_groups;
    if (max_groups < 1) return DS4_OK;
    switch (type) {
    case DS4_TYPE_Q8_0:
        if (epi == MQ_SWIGLU) ds4_mq_launch_groups<DS4_TYPE_Q8_0, MQ_SWIGLU>(cu, P, max_groups);
        else ds4_mq_launch_groups<DS4_TYPE_Q8_0, MQ_STORE>(cu, P, max_groups);
        break;
    case DS4_TYPE_Q2_K:
        if (epi == MQ_SWIGLU) ds4_mq_launch_groups<DS4_TYPE_Q2_K, MQ_SWIGLU>(cu, P, max_groups);
        else ds4_mq_launch_groups<DS4_TYPE_Q2_K, MQ_STORE>(cu, P, max_groups);
        break;
    default:
        if (epi == MQ_SWIGLU) ds4_mq_launch_groups<DS4_TYPE_IQ2_XXS, MQ_SWIGLU>(cu, P, max_groups);
        else ds4_mq_launch_groups<DS4_TYPE_IQ2_XXS, MQ_STORE>(cu, P, max_groups);
        break;
    }
    DS4_CUDA_CHECK(cudaGetLastError());
    return DS4_OK;
}

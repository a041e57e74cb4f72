/*
 * cuda_moe_down_regs.cu - the batch's routed down (cuda_moe_down_batch.cu's
 * products and weighted sums) with each warp's token's 6 activations held
 * in registers, the default where the pair kernel (cuda_moe_down_pair.cu)
 * does not run (DS4_CUDA_MOE_DOWN_REGS=0 keeps the shared-memory kernel).
 * Measured (ncu, caches flushed, 8 layers, 16 sessions, H100,
 * forty-sixth session): 103.30 -> 96.50 us a layer; a 30-layer step's
 * 16 sessions 990.7 against 986.3 tokens/s (three and four runs).
 *
 * Why: the batch's down kernel reads each term's activation (four 16-byte
 * pieces a lane, its bsums and scale) from shared memory at every unit, ~21
 * of a term's ~31 shared-memory wavefronts; a 16-session step spends 104
 * us a layer in it (ncu, 8 layers, H100, forty-fifth session), ~17% of the
 * step, with the shared-memory pipe about half busy. The gate+up kernel's
 * warps hold their one token's activation in registers (194 against 230
 * us, twentieth session); a down unit needs six (a lane's quarter block of
 * each: 64 bytes, 4 bsums, the scale: ~120 registers), so the block is 12
 * warps (170 registers a thread at most) and the units' rows come three
 * stages deep (ST 3, ~12 KB a warp).
 *
 * The units: warp gw of the grid takes token gw % n_tok (the grid's warps
 * a multiple of n_tok) and rows gw / n_tok, + stride / n_tok, ..: its
 * token's 6 expert rows (ascending expert id, ties in slot order, as
 * every form sums them) by cp.async into its ring, the terms by
 * g2_term_of (g2_term's arithmetic on the same values), the six sums by
 * g2_warp_sum6 and the row's weighted sum in the same order as the other
 * kernel: a token's outputs are bit for bit those of its own decode step
 * (test_decode_batch, test_cuda_moe).
 *
 * ENDS (the default since the fiftieth session, where this kernel runs:
 * ncu 96.36 -> 93.68 us a launch; DS4_CUDA_MOE_DOWN_ENDS=0 not): lane 0's
 * two values around a row's sum (the output's value when accumulating, the
 * addend) come by cp.async with the row's stage (gr_fetch) instead of by
 * loads at their use, where the warp waited on them at every unit: the
 * add of the addend held 11% of the kernel's stall samples (long
 * scoreboard), more than any other instruction; and the fetch takes its
 * skip test from the bad mask and each offset from shared memory at its
 * copy, which leaves ptxas -v's 8 bytes of spill (two offset words
 * reloaded at every unit, ~2% of the samples) at 0 (ncu's source view,
 * forty-eighth session, bench/results/h100-flash8x256-batchdetail-sass-*-s48.txt).
 */
#include "backend/cuda/cuda_moe1.cuh"
#include "backend/cuda/cuda_moe_g2.cuh"

enum {
    GR_W = 12,  /* warps a block */
    GR_ST = 3,  /* stages a warp */
    GR_MAXT = 16,
};

/* ENDS: copy row r of the warp's 6 experts into stage dst (g2_fetch_rows'
 * copies, written out again: a copy helper shared with it changed the
 * default kernels' SASS; the skip test from bad, each offset read from
 * shared memory at eb_s by a volatile load at its copy) and, by lane 0,
 * the row's output value (when accumulating) and addend into ends, in the
 * same commit group. */
__device__ __forceinline__ void gr_fetch(const ds4_gd_args &a, uint32_t eb_s, uint32_t bad, uint32_t r,
                                         const float *out_t, const float *add_t, uint8_t *dst, float *ends, int lane)
{
#pragma unroll
    for (int j = 0; j < G2_K; j++) {
        if (bad >> j & 1u) continue;
        const uint2 e = ds4_lds64(eb_s + 8 * j);
        const uint8_t *src = a.w + (int64_t)((uint64_t)e.y << 32 | e.x) + (int64_t)r * G2_RB;
        ds4_mq_cp16(dst + j * G2_RB + 16 * lane, src + 16 * lane);
        if (lane < G2_RB / 16 - 32) ds4_mq_cp16(dst + j * G2_RB + 512 + 16 * lane, src + 512 + 16 * lane);
    }
    if (lane == 0 && a.accumulate) ds4_mq_cp4(ends, out_t + r);
    if (lane == 0 && add_t) ds4_mq_cp4(ends + 1, add_t + r);
    ds4_mq_cp_commit();
}

template <bool ENDS> __global__ void __launch_bounds__(GR_W * 32, 1) ds4_gd_regs_kernel(const ds4_gd_args a)
{
    extern __shared__ __align__(16) uint8_t gr_dyn[];
    __shared__ int64_t s_eb[GR_W][8];
    __shared__ float s_w[GR_W][8];
    __shared__ int s_slot[GR_W][8];
    __shared__ float s_ends[ENDS ? GR_W : 1][GR_ST][2]; /* ENDS: a stage's row's output value and addend */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t gw = blockIdx.x * GR_W + warp, n = (uint32_t)a.n_tok, t = gw % n;
    const uint32_t stride = gridDim.x * GR_W / n, rows = (uint32_t)a.rows; /* rows a warp steps */
    uint8_t *mine = gr_dyn + (size_t)warp * GR_ST * G2_UB;
    ds4_pdl_enter();
    if (lane < G2_K) { /* slot lane of the token: its place by (expert id, slot) */
        const int32_t *ids = a.ids + (int64_t)t * G2_K;
        const int32_t e = ids[lane];
        const int rank = g2_rank_of(ids, e, lane);
        s_eb[warp][rank] = e < 0 || e >= a.n_expert ? -1 : (int64_t)e * a.expert_bytes;
        s_w[warp][rank] = a.route_w[(int64_t)t * G2_K + lane];
        s_slot[warp][rank] = lane;
    }
    __syncwarp();
    const int64_t *eb = s_eb[warp]; /* read at each fetch: registers go to the activations */
    uint32_t bad = 0;               /* bit j: expert j is out of range */
#pragma unroll
    for (int j = 0; j < G2_K; j++) bad |= (eb[j] < 0 ? 1u : 0u) << j;
    const uint32_t eb_s = (uint32_t)__cvta_generic_to_shared(s_eb[warp]);
    float *const out_t = a.out + (int64_t)t * a.out_tok_stride;
    const float *const add_t = a.addend ? a.addend + (int64_t)t * a.rows : nullptr;
    float(*const ends)[2] = s_ends[ENDS ? warp : 0];
    uint32_t fr = gw / n; /* the next row fetched */
#pragma unroll
    for (int i = 0; i < GR_ST - 1; i++) {
        if (fr >= rows) ds4_mq_cp_commit();
        else if constexpr (ENDS) gr_fetch(a, eb_s, bad, fr, out_t, add_t, mine + i * G2_UB, ends[i], lane);
        else g2_fetch_rows(a.w, eb, fr, mine + i * G2_UB, lane);
        fr += stride;
    }
    const int part = lane & 3, bl = lane >> 2;
    g2_act_regs act[G2_K];
#pragma unroll
    for (int j = 0; j < G2_K; j++)
        g2_act_load(a.act + ((int64_t)t * G2_K + s_slot[warp][j]) * a.act_ld, bl, part, act[j]);
    const uint32_t mine_s = (uint32_t)__cvta_generic_to_shared(mine);
    const g2_lane lo = g2_lane_of(bl, part);
    const float fnan = __int_as_float(0x7fc00000);
    int st = 0;
    for (uint32_t r = gw / n; r < rows; r += stride) {
        const int sn = st == 0 ? GR_ST - 1 : st - 1;
        if (fr >= rows) ds4_mq_cp_commit();
        else if constexpr (ENDS) gr_fetch(a, eb_s, bad, fr, out_t, add_t, mine + sn * G2_UB, ends[sn], lane);
        else g2_fetch_rows(a.w, eb, fr, mine + sn * G2_UB, lane);
        fr += stride;
        ds4_mq_cp_wait<GR_ST - 1>();
        __syncwarp();
        const uint32_t w = mine_s + st * G2_UB;
        float v[G2_K];
#pragma unroll
        for (int j = 0; j < G2_K; j++) v[j] = bad >> j & 1u ? 0.0f : g2_term_of(w + j * G2_RB, lo, part, act[j]);
        g2_warp_sum6(v, lane);
        if (lane == 0) {
            float *out = a.out + (int64_t)t * a.out_tok_stride + r;
            float tot = a.accumulate ? (ENDS ? ends[st][0] : *out) : 0.0f;
#pragma unroll
            for (int j = 0; j < G2_K; j++) tot = bad >> j & 1u ? fnan : __fadd_rn(tot, __fmul_rn(s_w[warp][j], v[j]));
            if (a.addend) /* the add kernel's out + y */
                tot = __fadd_rn(tot, ENDS ? ends[st][1] : a.addend[(int64_t)t * a.rows + r]);
            *out = tot;
        }
        __syncwarp(); /* the stage is refilled GR_ST - 1 units on */
        st = st == GR_ST - 1 ? 0 : st + 1;
    }
    ds4_mq_cp_wait<0>(); /* no copy outlives the block */
}

/* True when launched: the switch is on, the shape is the batch kernel's
 * (the caller checked it) and a grid of whole token sets of warps fits. */
bool ds4_gd_down_regs(ds4_cuda *cu, const ds4_gd_args &a)
{
    static int on = -1, ends_on = -1;
    if (!ds4_env_switch_on("DS4_CUDA_MOE_DOWN_REGS", &on) || a.n_tok < 1 || a.n_tok > GR_MAXT) return false;
    const bool ends = ds4_env_switch_on("DS4_CUDA_MOE_DOWN_ENDS", &ends_on);
    const size_t smem = (size_t)GR_W * GR_ST * G2_UB;
    if (!ds4_moe1_smem_fits(cu->device, smem + sizeof(int64_t) * GR_W * 8 + (4 + 4) * GR_W * 8 +
                                            (ends ? 4 * GR_W * GR_ST * 2 : 0)))
        return false;
    static size_t attr_smem[32];
    if (cu->device < 32 && attr_smem[cu->device] < smem) {
        cudaFuncSetAttribute(ds4_gd_regs_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        cudaFuncSetAttribute(ds4_gd_regs_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        attr_smem[cu->device] = smem;
    }
    /* a block an SM, as many as make the grid's warps a multiple of the
     * tokens (each warp one token's) */
    int64_t gx = cu->n_sm;
    while (gx > 1 && gx * GR_W % a.n_tok != 0) gx--;
    if (gx * GR_W % a.n_tok != 0) return false;
    if (ends) ds4_launch(ds4_gd_regs_kernel<true>, (unsigned)gx, GR_W * 32, smem, cu->stream, a);
    else ds4_launch(ds4_gd_regs_kernel<false>, (unsigned)gx, GR_W * 32, smem, cu->stream, a);
    return true;
}

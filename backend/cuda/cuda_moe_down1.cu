/*
 * cuda_moe_down1.cu - one token's routed down products and their weighted
 * sum, Q2_K experts 2048 columns wide, 6 per token (Flash's routed experts;
 * docs/CUDA.md "One token's routed experts at Flash's shapes").
 *
 * The general pipelined kernel (cuda_mmvq.cu, MQ_COMBINE) took 20-21 us
 * for these 16.5 MB (0.8 TB/s): a separate quantizer launch before it, the
 * token's expert order found by every warp for every output, run-time row
 * sizes and block counts, and the activation's 16-byte loads four to a
 * bank quad (sub-blocks of one Q2_K quarter are 32 bytes apart, and the
 * two halves of a block 128). Here, with the shape fixed at compile time:
 *  - each block quantizes the token's 6 SwiGLU outputs itself (Q8_K, the
 *    CPU's bytes) and stores them in the order the sum takes them
 *    (ascending expert id, ties in slot order: the CPU's order), found
 *    once per block; a unit (one output row) copies its 6 expert rows
 *    (6 x 672 bytes) by cp.async in that order too, so the sum is a
 *    straight loop;
 *  - the activation's blocks are 320 bytes apart and a block's second half
 *    32 bytes further on, so the 8 lanes of a quarter-warp (2 blocks x 4
 *    quarters) read 8 different bank quads;
 *  - lane l takes quarter l mod 4 of block l / 4 of each row: the lean
 *    Q2_K form's integers and float terms (cuda_mmvq.cuh,
 *    ds4_mq_q2k_lean), so the result is bit for bit the other forms'.
 */
#include "backend/cuda/cuda_moe1.cuh"
#include "backend/cuda/cuda_moe_g2.cuh"

#include <stdlib.h>
#include <string.h>

/* EARLY (ds4_moe1_early_on): the sum's order from the expert ids and the
 * first ST - 1 units' rows asked for before the dependency wait (the ids
 * and weights are the router's, two launches back; the rows constants),
 * and the 6 activations' loads all issued before any is quantized: a
 * replayed step measured ~7 us from the wait to the staged activations
 * (twenty-fifth session's phase times), the ids' round trip, a barrier and
 * three quantizations a warp one after another among them. */
template <int W, int ST, bool EARLY>
__global__ void __launch_bounds__(W * 32, 1) ds4_g2_kernel(const ds4_g2_args a)
{
    extern __shared__ __align__(16) uint8_t g2_dyn[];
    int64_t *s_eb = (int64_t *)(g2_dyn + G2_EB); /* by position in the sum */
    float *s_w = (float *)(g2_dyn + G2_W);
    int32_t *s_rank = (int32_t *)(g2_dyn + G2_RANK); /* by slot: its position in the sum */
    uint8_t *s_stage = g2_dyn + G2_FIXED;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const bool kt = (blockIdx.x | tid) == 0; /* in-graph phase times (DS4_CUDA_KTIME) */
    if (!EARLY) {
        ds4_pdl_enter();
        ds4_kt_start(kt, DS4_KT_G2);
    }
    if (tid < G2_K) { /* slot tid's position: its rank by (expert id, slot) */
        const int32_t e = a.ids[tid];
        const int rank = g2_rank_of(a.ids, e, tid);
        s_eb[rank] = e < 0 || e >= a.n_expert ? -1 : (int64_t)(a.slot_of ? a.slot_of[e] : e) * a.expert_bytes;
        s_w[rank] = a.route_w[tid];
        s_rank[tid] = rank;
    }
    __syncthreads();
    const uint32_t n_units = (uint32_t)a.rows, stride = gridDim.x * W;
    uint32_t g = blockIdx.x * W + warp;
    uint8_t *mine = s_stage + warp * ST * G2_UB;
#pragma unroll
    for (int i = 0; i < ST - 1; i++) {
        if (g + i * stride < n_units) g2_fetch_rows(a.w, s_eb, g + i * stride, mine + i * G2_UB, lane);
        else ds4_mq_cp_commit();
    }
    if (EARLY) {
        ds4_pdl_enter(); /* from here on h, the gate+up's result */
        ds4_kt_start(kt, DS4_KT_G2);
    }
    /* the 6 activations, quantized (Q8_K) straight into their padded
     * places in the sum's order: lane l's 8 quants are half of 16-byte
     * piece 16 b + l / 2 of its row (g2_act_at), its pair's bsum the
     * row's entry 16 b + l / 2, the block scale entry b. (They went to a
     * Q8_K row a slot first and were copied there after a second barrier
     * until the thirty-fifth session.) */
    enum { QB = G2_K * G2_NB, PW = (QB + W - 1) / W }; /* Q8_K blocks, and a warp's share */
    float v[PW][8];
#pragma unroll
    for (int i = 0; i < PW; i++) {
        const int kb = warp + W * i;
        if (kb < QB) ds4_mq_q8k_load(a.h + (int64_t)(kb / G2_NB) * G2_COLS, kb % G2_NB, lane, v[i]);
    }
#pragma unroll
    for (int i = 0; i < PW; i++) {
        const int kb = warp + W * i;
        if (kb >= QB) continue;
        /* g2_act_at(16 b + sb) spelled out: with the helper's own shifts
         * the file compiled 1,792 bytes of code larger (sm_90) */
        const int jj = s_rank[kb / G2_NB], b = kb % G2_NB, sb = lane >> 1;
        ds4_mq_q8k_vals_at(v[i], lane,
                           (int8_t *)(g2_dyn + G2_ACT + jj * G2_AROW + b * G2_ABLK + 16 * sb + 32 * (sb >> 3) +
                                      8 * (lane & 1)),
                           (int16_t *)(g2_dyn + G2_BS) + jj * (G2_COLS / 16) + 16 * b + sb,
                           (float *)(g2_dyn + G2_DX) + jj * G2_NB + b);
    }
    __syncthreads();
    ds4_kt_phase(kt, DS4_KT_G2, 0);

    const int part = lane & 3, bl = lane >> 2;
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(g2_dyn);
    const uint32_t act = base + G2_ACT + bl * G2_ABLK, bs = base + G2_BS + bl * 32, dx = base + G2_DX + bl * 4;
    const uint32_t mine_s = (uint32_t)__cvta_generic_to_shared(mine);
    const g2_lane lo = g2_lane_of(bl, part);
    const float fnan = __int_as_float(0x7fc00000);
    int st = 0;
    for (; g < n_units; g += stride) {
        const uint32_t gn = g + (ST - 1) * stride;
        const int sn = st == 0 ? ST - 1 : st - 1;
        if (gn < n_units) g2_fetch_rows(a.w, s_eb, gn, mine + sn * G2_UB, lane);
        else ds4_mq_cp_commit();
        ds4_mq_cp_wait<ST - 1>();
        __syncwarp();
        const uint32_t w = mine_s + st * G2_UB;
        float v[G2_K];
#pragma unroll
        for (int jj = 0; jj < G2_K; jj++)
            v[jj] = s_eb[jj] < 0 ? 0.0f
                                 : g2_term(w + jj * G2_RB, lo, part, act + jj * G2_AROW, bs + jj * (G2_COLS / 8),
                                           ds4_lds_f32(dx + jj * G2_NB * 4));
        g2_warp_sum6(v, lane);
        if (lane == 0) {
            float *out = a.out + g;
            float tot = a.accumulate ? *out : 0.0f;
#pragma unroll
            for (int jj = 0; jj < G2_K; jj++) tot = s_eb[jj] < 0 ? fnan : __fadd_rn(tot, __fmul_rn(s_w[jj], v[jj]));
            if (a.addend) tot = __fadd_rn(tot, a.addend[g]); /* the add kernel's out + y */
            *out = tot;
        }
        __syncwarp();
        st = st == ST - 1 ? 0 : st + 1;
    }
    ds4_kt_phase(kt, DS4_KT_G2, 1);
}

template <int W, int ST, bool EARLY>
static bool ds4_g2_go(ds4_cuda *cu, const ds4_g2_args &a)
{
    const size_t smem = (size_t)G2_FIXED + (size_t)W * ST * G2_UB;
    if (!ds4_moe1_smem_fits(cu->device, smem)) return false;
    static size_t attr_smem[32];
    static int per_sm = 0;
    if (cu->device < 32 && attr_smem[cu->device] < smem) {
        cudaFuncSetAttribute(ds4_g2_kernel<W, ST, EARLY>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        attr_smem[cu->device] = smem;
    }
    if (per_sm == 0) {
        int n = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, ds4_g2_kernel<W, ST, EARLY>, W * 32, smem) !=
                cudaSuccess ||
            n < 1)
            n = 1;
        per_sm = n;
    }
    const int64_t need = (a.rows + W - 1) / W, full = (int64_t)per_sm * cu->n_sm;
    ds4_launch(ds4_g2_kernel<W, ST, EARLY>, (unsigned)(need < full ? need : full), W * 32, smem, cu->stream, a);
    return true;
}

bool ds4_g2_down(ds4_cuda *cu, const ds4_g2_args &a)
{
    static int on = -1, cfg = -1;
    if (!ds4_env_switch_on("DS4_CUDA_MOE1", &on)) return false;
    if (a.cols != G2_COLS || a.k != G2_K || a.rows < 1 || a.rows >= ((int64_t)1 << 31) ||
        a.expert_bytes != a.rows * G2_RB || ((uintptr_t)a.w & 15u) != 0 || ((uintptr_t)a.h & 15u) != 0)
        return false;
    if (cfg < 0) {
        const char *e = getenv("DS4_CUDA_MOE1_DCFG");
        cfg = !e ? 0 : !strcmp(e, "24x2") ? 1 : !strcmp(e, "16x3") ? 2 : 0;
    }
    if (ds4_moe1_early_on())
        return cfg == 1   ? ds4_g2_go<24, 2, true>(cu, a)
               : cfg == 2 ? ds4_g2_go<16, 3, true>(cu, a)
                          : ds4_g2_go<16, 2, true>(cu, a);
    return cfg == 1   ? ds4_g2_go<24, 2, false>(cu, a)
           : cfg == 2 ? ds4_g2_go<16, 3, false>(cu, a)
                      : ds4_g2_go<16, 2, false>(cu, a);
}

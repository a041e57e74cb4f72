/*
 * cuda_moe_gateup1.cu - one token's routed gate+up+SwiGLU, IQ2_XXS experts
 * 4096 columns wide (Flash's routed experts; docs/CUDA.md "One token's
 * routed gate+up at Flash's width").
 *
 * The general pipelined kernel (cuda_mmvq.cu) ran this product at 0.87
 * TB/s, bound by its instruction stream: about 1,280 instructions per
 * output row pair, 40% of them outside the dot products (locating the unit
 * with 64-bit arithmetic, a copy loop over a run-time row size, generic
 * 64-bit loads of the staged words, a loop over a run-time block count that
 * the compiler could not unroll). With the shape fixed at compile time the
 * work per unit is straight-line code:
 *  - a unit is one output row (the gate row and the up row, 2 x 1,056
 *    bytes), copied by cp.async into one of ST stages of the warp's slice
 *    (ST - 1 units in flight while one is computed); the experts' byte
 *    offsets are read once per block into shared memory, so a copy never
 *    waits for an id load;
 *  - lane l takes group l mod 8 of blocks l / 8, l / 8 + 4, .. of each row,
 *    as every other form does (same integers, same float terms in the same
 *    order: the result is bit for bit theirs);
 *  - the grid and sign-mask copies (as the lean form, cuda_mmvq.cu) are a
 *    static shared array, so a lookup is a shift, one and-or and a load
 *    with the table's offset as the immediate;
 *  - staged words and scales are read at 32-bit shared addresses with the
 *    row and block offsets as immediates;
 *  - the activation is quantized once per block (Q8_K, the CPU's bytes)
 *    and stored with each block's 8 groups of 32 at 32 p + 16 (p / 4)
 *    (blocks 272 bytes apart), so a quarter-warp's 16-byte loads of one
 *    block's 8 groups hit 8 different bank quads (at 32-byte strides
 *    they were 2-way conflicts).
 */
#include "backend/cuda/cuda_moe1.cuh"
#include "backend/cuda/cuda_moe_g1.cuh"

#include <stdlib.h>
#include <string.h>

/* Copy the unit of slot s, row r into dst: 66 16-byte pieces a row; a bad
 * expert copies nothing (computed as NaN). */
__device__ __forceinline__ void g1_fetch(const ds4_g1_args &a, const int64_t *s_eb, uint32_t s, uint32_t r,
                                         uint8_t *dst, int lane)
{
    const int64_t eb = s_eb[s];
    if (eb >= 0) g1_copy_pair(dst, a.gate + eb + (int64_t)r * G1_RB, a.up + eb + (int64_t)r * G1_RB, lane);
    ds4_mq_cp_commit();
}

/* The token's activation quantized (Q8_K, the CPU's bytes) into s_q by the
 * block's warps, then moved to its padded places (s_act) and the blocks'
 * scales to s_dx; the caller's next barrier publishes them. */
template <int W>
__device__ __forceinline__ void g1_stage_x(const float *x, uint8_t *s_q, uint8_t *s_act, float *s_dx, int tid)
{
    const int lane = tid & 31, warp = tid >> 5;
    for (int kb = warp; kb < G1_NB; kb += W) ds4_mq_q8k_block(x, kb, s_q, G1_COLS, lane);
    __syncthreads();
    for (int c = tid; c < G1_COLS / 16; c += W * 32) *(uint4 *)(s_act + g1_act_at(c)) = ((const uint4 *)s_q)[c];
    if (tid < G1_NB) s_dx[tid] = ((const float *)(s_q + G1_COLS))[tid];
}

/* SEL 3's tables (cuda_moe_g1.cuh) at the next multiple of 64 KiB of the
 * shared window after the stages and the phase times' 32 bytes: their
 * offsets carry that address (g1_cofs<3>), as the batch's ds4_gb256_kernel
 * places them. */
template <int W, int ST> __host__ __device__ constexpr uint32_t g1_tables_at(uint32_t base)
{
    return (base + G1_FIXED + W * ST * G1_UB + 32 + 0xffffu) & ~0xffffu;
}
static_assert(g1_tables_at<24, 2>(0) + G1_T256 <= 227 * 1024, "SEL 3's launch fits sm_90's 227 KiB a block");

/* EARLY: the activation is quantized before the dependency wait. It is
 * the FFN input, written two launches back (the router's launch, which
 * writes the ids, is between), so it is complete once this kernel may
 * start; a replayed step measured ~3.5 us from the wait to the staged
 * activation (twenty-fifth session's phase times). */
template <int W, int ST, bool AR, bool EARLY, int SEL>
__global__ void __launch_bounds__(W * 32, 1) ds4_g1_kernel(const ds4_g1_args a)
{
    extern __shared__ __align__(16) uint8_t g1_dyn[];
    uint8_t *s_act = g1_dyn;                                        /* padded Q8_K values */
    float *s_dx = (float *)(g1_dyn + G1_NB * G1_ABLK);              /* the blocks' scales */
    int64_t *s_eb = (int64_t *)(s_dx + G1_NB);                      /* slot -> expert byte offset */
    uint8_t *s_q = (uint8_t *)(s_eb + G1_MAXS);                     /* the quantizer's row */
    uint8_t *s_stage = g1_dyn + G1_FIXED;                           /* W x ST units */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    /* SEL 3: where the window's start leaves too little room for the
     * tables, every slot is computed as a bad expert's (NaN) */
    uint32_t tab = 0;
    uint8_t *tabp = nullptr;
    bool placed = true;
    if constexpr (SEL == 3) {
        const uint32_t base = (uint32_t)__cvta_generic_to_shared(g1_dyn);
        uint32_t dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        tab = g1_tables_at<W, ST>(base);
        tabp = g1_dyn + (tab - base);
        placed = tab + G1_T256 <= base + dyn;
    }
    /* the tables read constants only: written before the previous kernel ends */
    if (placed) g1_tab_fill<SEL>(tid, W * 32, tabp);
    if (EARLY) g1_stage_x<W>(a.x, s_q, s_act, s_dx, tid);
    ds4_pdl_enter();
    /* in-graph phase times (DS4_CUDA_KTIME), the start kept past the stages
     * (the grid tables fill static shared memory's 48 KB) */
    const bool kt = (blockIdx.x | tid) == 0;
#define G1_KT_T0 ((unsigned long long *)(g1_dyn + G1_FIXED + W * ST * G1_UB + 16))
    ds4_kt_start_at(kt, G1_KT_T0);
    for (int s = tid; s < (int)a.n_slots; s += W * 32) {
        const int32_t e = a.ids[s];
        s_eb[s] = !placed || e < 0 || e >= a.n_expert ? -1 : (int64_t)(a.slot_of ? a.slot_of[e] : e) * a.expert_bytes;
    }
    __syncthreads();
    const uint32_t rows = (uint32_t)a.rows, n_slots = (uint32_t)a.n_slots, n_units = n_slots * rows;
    const uint32_t stride = gridDim.x * W, dq = stride / rows, dr = stride - dq * rows;
    uint32_t g = blockIdx.x * W + warp;
    /* unit g's slot and row (cs, cr), and the next fetched unit's (fs, fr) */
    uint32_t cs = g / rows, cr = g - cs * rows, fs = cs, fr = cr;
    uint8_t *mine = s_stage + warp * ST * G1_UB;
    /* the first ST - 1 units in flight while the activation is quantized */
#pragma unroll
    for (int i = 0; i < ST - 1; i++) {
        if constexpr (SEL == 3) {
            if (fs < n_slots)
                g1_fetch3(a, s_eb[fs], fr, (uint32_t)__cvta_generic_to_shared(mine) + i * G1_UB + 16 * lane, lane);
            else ds4_mq_cp_commit();
        } else if (fs < n_slots) g1_fetch(a, s_eb, fs, fr, mine + i * G1_UB, lane);
        else ds4_mq_cp_commit();
        ds4_moe_walk_next(fs, fr, dq, dr, rows);
    }
    if (!EARLY) {
        g1_stage_x<W>(a.x, s_q, s_act, s_dx, tid);
        __syncthreads();
    }
    ds4_kt_phase_at(kt, DS4_KT_G1, 0, G1_KT_T0);

    /* the lane's fixed offsets: group p of block b0 (+ 4 k) */
    const int p = lane & 7, b0 = lane >> 3;
    const uint32_t qo = g1_qofs(b0, p), dofs = g1_dofs(b0);
    g1_act<AR> x;
    x.load((uint32_t)__cvta_generic_to_shared(s_act) + b0 * G1_ABLK + 32 * p + 16 * (p >> 2),
           (uint32_t)__cvta_generic_to_shared(s_dx) + 4 * b0);
    const g1_tabl cofs = g1_cofs<SEL>(lane, tab);
    const uint32_t mine_s = (uint32_t)__cvta_generic_to_shared(mine);
    const float fnan = __int_as_float(0x7fc00000);
    int st = 0;
    /* SEL 3: the units' sums wait in lanes 0-15 (unit j of the batch in
     * lane j) and the SwiGLU runs once for up to 16 units, as the batch's
     * gb_units does; the same function of the same sums */
    float qg = 0.0f, qu = 0.0f;
    int64_t qdst = 0;
    uint32_t nq = 0;
    for (; g < n_units; g += stride) {
        const int sn = st == 0 ? ST - 1 : st - 1; /* the stage computed last */
        if constexpr (SEL == 3) {
            if (fs < n_slots) g1_fetch3(a, s_eb[fs], fr, mine_s + sn * G1_UB + 16 * lane, lane);
            else ds4_mq_cp_commit();
        } else if (fs < n_slots) g1_fetch(a, s_eb, fs, fr, mine + sn * G1_UB, lane);
        else ds4_mq_cp_commit();
        ds4_moe_walk_next(fs, fr, dq, dr, rows);
        ds4_mq_cp_wait<ST - 1>();
        __syncwarp();
        const uint32_t w = mine_s + st * G1_UB;
        const bool bad = s_eb[cs] < 0;
        float gv = 0.0f, uv = 0.0f;
        if (!bad) {
            gv = g1_row<AR, SEL>(w, qo, dofs, x, cofs);
            uv = g1_row<AR, SEL>(w + G1_RB, qo, dofs, x, cofs);
        }
        g1_warp_sum2(gv, uv, lane);
        gv = bad ? fnan : gv * 0.125f; /* IQ2_XXS grid values are 8x; exact */
        uv = bad ? fnan : uv * 0.125f;
        if constexpr (SEL == 3) {
            if (lane == (int)nq) qg = gv, qu = uv, qdst = (int64_t)cs * a.y_slot_stride + cr;
            if (++nq == 16 || g + stride >= n_units) {
                if (lane < (int)nq) a.y[qdst] = ds4_swiglu_clamped(qg, qu, a.clamp);
                nq = 0;
            }
        } else if (lane == 0) a.y[(int64_t)cs * a.y_slot_stride + cr] = ds4_swiglu_clamped(gv, uv, a.clamp);
        __syncwarp(); /* the stage is refilled ST - 1 units on */
        st = st == ST - 1 ? 0 : st + 1;
        ds4_moe_walk_next(cs, cr, dq, dr, rows);
    }
    ds4_kt_phase_at(kt, DS4_KT_G1, 1, G1_KT_T0);
#undef G1_KT_T0
}

template <int W, int ST, bool AR, bool EARLY, int SEL = 0>
static bool ds4_g1_go(ds4_cuda *cu, const ds4_g1_args &a)
{
    /* +16: spare (the GGUF layout's word loads read past a unit); +16: the
     * phase times' start (ds4_kt_start_at); SEL 3: its tables at the next
     * 64 KiB boundary (the window's dynamic memory starting at 0) */
    const size_t smem = SEL == 3 ? (size_t)g1_tables_at<W, ST>(0) + G1_T256
                                 : (size_t)G1_FIXED + (size_t)W * ST * G1_UB + 32;
    if (!ds4_moe1_smem_fits(cu->device, smem + (SEL == 3 ? 0 : sizeof g1_tab))) return false;
    static size_t attr_smem[32];
    static int per_sm = 0;
    if (cu->device < 32 && attr_smem[cu->device] < smem) {
        cudaFuncSetAttribute(ds4_g1_kernel<W, ST, AR, EARLY, SEL>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)smem);
        attr_smem[cu->device] = smem;
    }
    if (per_sm == 0) {
        int n = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, ds4_g1_kernel<W, ST, AR, EARLY, SEL>, W * 32, smem) !=
                cudaSuccess ||
            n < 1)
            n = 1;
        per_sm = n;
    }
    const int64_t units = a.n_slots * a.rows, need = (units + W - 1) / W, full = (int64_t)per_sm * cu->n_sm;
    const unsigned grid = (unsigned)(need < full ? need : full);
    ds4_launch(ds4_g1_kernel<W, ST, AR, EARLY, SEL>, grid, W * 32, smem, cu->stream, a);
    return true;
}

bool ds4_g1_gateup(ds4_cuda *cu, const ds4_g1_args &a)
{
    static int on = -1, cfg = -1;
    if (!ds4_env_switch_on("DS4_CUDA_MOE1", &on)) return false;
    if (a.cols != G1_COLS || a.n_slots < 1 || a.n_slots > G1_MAXS || a.rows < 1 ||
        a.n_slots * a.rows >= ((int64_t)1 << 31) || a.expert_bytes != a.rows * G1_RB ||
        ((uintptr_t)a.gate & 15u) != 0 || ((uintptr_t)a.up & 15u) != 0 || ((uintptr_t)a.x & 15u) != 0)
        return false;
    if (cfg < 0) {
        const char *e = getenv("DS4_CUDA_MOE1_CFG");
        cfg = e && !strcmp(e, "16x3") ? 1 : 0;
    }
    /* 24 warps, 2 stages, the activation in registers: 0-4% faster than
     * 16 x 3 from shared memory in the same runs (docs/BENCHMARKS.md); a
     * third stage for the 24 warps (211 of sm_90's 227 KB) was 2.5% slower
     * a step (thirty-fourth session) */
    const bool early = ds4_moe1_early_on();
    /* the selector tables (opt-in) in this default shape only: with
     * DS4_CUDA_MOE1_CFG set, DS4_CUDA_IQ2_SEL is not read */
    if (cfg == 0 && ds4_iq2_sel_on()) {
        /* the 256-byte grid rows (SEL 3) where the switch of the batch's
         * form is on (its default), else SEL 2 / 1 */
        if (ds4_iq2_prmt_on() && ds4_iq2_row256_on() &&
            (early ? ds4_g1_go<24, 2, true, true, 3>(cu, a) : ds4_g1_go<24, 2, true, false, 3>(cu, a)))
            return true;
        return ds4_iq2_prmt_on() ? (early ? ds4_g1_go<24, 2, true, true, 2>(cu, a) : ds4_g1_go<24, 2, true, false, 2>(cu, a))
                                 : (early ? ds4_g1_go<24, 2, true, true, 1>(cu, a) : ds4_g1_go<24, 2, true, false, 1>(cu, a));
    }
    if (early) return cfg == 1 ? ds4_g1_go<16, 3, false, true>(cu, a) : ds4_g1_go<24, 2, true, true>(cu, a);
    return cfg == 1 ? ds4_g1_go<16, 3, false, false>(cu, a) : ds4_g1_go<24, 2, true, false>(cu, a);
}

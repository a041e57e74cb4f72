/*
 * cuda_moe_gateup_batch.cu - the routed gate+up+SwiGLU of a batched decode
 * step (2-16 tokens, each from its own session), IQ2_XXS experts 4096
 * columns wide (Flash's routed experts).
 *
 * Why: a 16-session step took these products on the general pipelined
 * kernel (cuda_mmvq.cu), 394 us a layer for 96 slots on the 8-layer,
 * 256-expert model (ncu, docs/BENCHMARKS.md eighteenth session), bound by
 * its instruction stream (~1,280 instructions an output row pair); one
 * token's kernel (cuda_moe_gateup1.cu) does the same row pair in about a
 * third of them but holds one token's activation. Here:
 *  - the step's tokens' activations (Q8_K rows quantized by the caller's
 *    launch, the CPU's bytes) are staged once per block in shared memory,
 *    padded as the one-token kernel pads its own (up to 16 tokens, 68 KB);
 *  - a unit is one output row of one slot, as there, but the units are
 *    numbered row-major (unit u: row u / n_slots, slot u % n_slots), so the
 *    slots that share an expert (16 sessions pick ~81 distinct experts for
 *    96 slots) fetch the same row at about the same time and all but the
 *    first find it in L2;
 *  - each row's lane sums are g1_row's (cuda_moe_g1.cuh, g1_row_pair: the
 *    gate and up rows with one read of each activation group), the
 *    one-token kernel's integers and float terms in its order: a batched
 *    token's outputs are bit for bit those of its own decode step;
 *  - a warp takes units g, g + stride, ..; when the grid's warps (stride)
 *    are a multiple of the slots, all of a warp's units are of one slot,
 *    so the warp holds that token's activation in registers and reads only
 *    weights and tables from shared memory (the grid gives up at most 1/20
 *    of the SMs for it; 16 tokens' 96 slots on 132 SMs need none).
 *    DS4_CUDA_MOE_BATCH_AR=0 keeps every warp on shared memory (A/B).
 * DS4_CUDA_MOE_BATCH=0 leaves these launches to the pipelined kernel.
 * Not kept: 1-4 of a group's 4 sign masks computed (prmt) instead of read
 * from the table, to trade shared-memory wavefronts for instructions:
 * 191 -> 197, 207, 218, 226 us a layer (ncu, twenty-first session), so
 * the kernel is bound by its instruction stream, not the table reads.
 */
#include "backend/cuda/cuda_moe1.cuh"
#include "backend/cuda/cuda_moe_g1.cuh"

#include <stdlib.h>
#include <string.h>

enum {
    GB_MAXT = 16,                 /* tokens */
    GB_MAXS = 128,                /* slots */
    GB_AROW = G1_NB * G1_ABLK,    /* a token's padded activation */
    GB_FIXED = GB_MAXS * 8,       /* slot -> expert byte offset */
};

/* Copy the unit of row r, slot s into dst: 66 16-byte pieces a row; a bad
 * expert copies nothing (computed as NaN). */
__device__ __forceinline__ void gb_fetch(const ds4_gb_args &a, const int64_t *s_eb, uint32_t r, uint32_t s,
                                         uint8_t *dst, int lane)
{
    const int64_t eb = s_eb[s];
    if (eb >= 0) g1_copy_pair(dst, a.gate + eb + (int64_t)r * G1_RB, a.up + eb + (int64_t)r * G1_RB, lane);
    ds4_mq_cp_commit();
}

/* The warp's units g, g + stride, ..: each unit's copy ST - 1 units ahead
 * in the warp's ring, its gate and up sums (g1_row_pair), the SwiGLU. x:
 * the activation of token 0 in shared memory (moved to each unit's token)
 * or (AR) the warp's one token's, in registers. A unit's (row, slot) and
 * the next fetched one's step by ds4_moe_walk_next (dq, dr: stride / n_slots,
 * stride % n_slots); the caller fetched the first ST - 1. */
template <int ST, bool AR, int SEL>
__device__ __forceinline__ void gb_units(const ds4_gb_args &a, const int64_t *s_eb, const g1_act<AR> &x0, uint32_t g,
                                         uint32_t stride, uint32_t n_slots, uint32_t n_units, uint32_t fr, uint32_t fs,
                                         uint8_t *mine, uint32_t mine_s, uint32_t qo, uint32_t dofs,
                                         g1_tabl cofs, int lane)
{
    const float fnan = __int_as_float(0x7fc00000);
    const uint32_t dq = stride / n_slots, dr = stride - dq * n_slots, rows = n_units / n_slots;
    uint32_t cr = g / n_slots, cs = g - cr * n_slots;
    int st = 0;
    /* SEL 3: the units' sums wait in lanes 0-15 (unit j of the batch in
     * lane j) and the SwiGLU runs once for 16 units, every lane one, instead
     * of the warp for each unit (~25 instructions a unit, lane 0's alone
     * doing work); the same function of the same sums, the same bits */
    float qg = 0.0f, qu = 0.0f;
    uint32_t qdst = 0, nq = 0;
    for (; g < n_units; g += stride) {
        const int sn = st == 0 ? ST - 1 : st - 1; /* the stage computed last */
        if (fr >= rows) ds4_mq_cp_commit();
        else if constexpr (SEL == 3) g1_fetch3(a, s_eb[fs], fr, mine_s + sn * G1_UB + 16 * lane, lane);
        else gb_fetch(a, s_eb, fr, fs, mine + sn * G1_UB, lane);
        ds4_moe_walk_next(fr, fs, dq, dr, n_slots);
        ds4_mq_cp_wait<ST - 1>();
        __syncwarp();
        const uint32_t w = mine_s + st * G1_UB;
        const bool bad = s_eb[cs] < 0;
        g1_act<AR> x = x0;
        if constexpr (!AR) {
            const uint32_t t = cs / (uint32_t)a.x_share;
            x.load(x0.act + t * GB_AROW, x0.dx + t * (G1_NB * 4));
        }
        float gv = 0.0f, uv = 0.0f;
        if (!bad) g1_row_pair<AR, SEL>(w, qo, dofs, x, cofs, gv, uv);
        g1_warp_sum2(gv, uv, lane);
        gv = bad ? fnan : gv * 0.125f; /* IQ2_XXS grid values are 8x; exact */
        uv = bad ? fnan : uv * 0.125f;
        if constexpr (SEL == 3) {
            if (lane == (int)nq) qg = gv, qu = uv, qdst = cs * (uint32_t)a.y_slot_stride + cr;
            if (++nq == 16 || g + stride >= n_units) {
                if (lane < (int)nq) a.y[qdst] = ds4_swiglu_clamped(qg, qu, a.clamp);
                nq = 0;
            }
        } else if (lane == 0) a.y[(int64_t)cs * a.y_slot_stride + cr] = ds4_swiglu_clamped(gv, uv, a.clamp);
        __syncwarp(); /* the stage is refilled ST - 1 units on */
        st = st == ST - 1 ? 0 : st + 1;
        ds4_moe_walk_next(cr, cs, dq, dr, n_slots);
    }
}

template <int W, int ST, int SEL>
__global__ void __launch_bounds__(W * 32, 1) ds4_gb_kernel(const ds4_gb_args a)
{
    extern __shared__ __align__(16) uint8_t gb_dyn[];
    int64_t *s_eb = (int64_t *)gb_dyn;                               /* slot -> expert byte offset */
    uint8_t *s_act = gb_dyn + GB_FIXED;                              /* n_tok padded Q8_K rows */
    float *s_dx = (float *)(s_act + (size_t)a.n_tok * GB_AROW);      /* their blocks' scales */
    uint8_t *s_stage = (uint8_t *)(s_dx + GB_MAXT * G1_NB);          /* W x ST units */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    g1_tab_fill<SEL>(tid, W * 32); /* constants: before the wait */
    ds4_pdl_enter();
    for (int s = tid; s < (int)a.n_slots; s += W * 32) {
        const int32_t e = a.ids[s];
        s_eb[s] = e < 0 || e >= a.n_expert ? -1 : (int64_t)e * a.expert_bytes;
    }
    __syncthreads();
    const uint32_t n_slots = (uint32_t)a.n_slots, n_units = n_slots * (uint32_t)a.rows;
    const uint32_t stride = gridDim.x * W, rows = (uint32_t)a.rows;
    const uint32_t dq = stride / n_slots, dr = stride - dq * n_slots;
    uint32_t g = blockIdx.x * W + warp;
    uint32_t fr = g / n_slots, fs = g - fr * n_slots; /* the next fetched unit's row and slot */
    uint8_t *mine = s_stage + warp * ST * G1_UB;
    /* the first ST - 1 units in flight while the activations are staged */
#pragma unroll
    for (int i = 0; i < ST - 1; i++) {
        if (fr < rows) gb_fetch(a, s_eb, fr, fs, mine + i * G1_UB, lane);
        else ds4_mq_cp_commit();
        ds4_moe_walk_next(fr, fs, dq, dr, n_slots);
    }
    for (int c = tid; c < a.n_tok * (G1_COLS / 16); c += W * 32) { /* piece c & 255 of token c / 256 */
        const int t = c >> 8, pc = c & 255;
        *(uint4 *)(s_act + t * GB_AROW + g1_act_at(pc)) = *(const uint4 *)(a.act + (int64_t)t * a.act_ld + 16 * pc);
    }
    for (int i = tid; i < a.n_tok * G1_NB; i += W * 32)
        s_dx[i] = ((const float *)(a.act + (int64_t)(i / G1_NB) * a.act_ld + G1_COLS))[i % G1_NB];
    __syncthreads();

    /* the lane's fixed offsets: group p of block b0 (+ 4 k), as one token's kernel */
    const int p = lane & 7, b0 = lane >> 3;
    const uint32_t qo = g1_qofs(b0, p), dofs = g1_dofs(b0);
    const uint32_t act0 = (uint32_t)__cvta_generic_to_shared(s_act) + b0 * G1_ABLK + 32 * p + 16 * (p >> 2);
    const uint32_t dx0 = (uint32_t)__cvta_generic_to_shared(s_dx) + 4 * b0;
    const g1_tabl cofs = g1_cofs<SEL>(lane);
    const uint32_t mine_s = (uint32_t)__cvta_generic_to_shared(mine);
    /* a grid of warps that is a multiple of the slots gives each warp units
     * of one slot, so of one token: its activation stays in registers */
    if (a.act_regs && stride % n_slots == 0) {
        g1_act<true> x;
        const uint32_t t = g % n_slots / (uint32_t)a.x_share;
        x.load(act0 + t * GB_AROW, dx0 + t * (G1_NB * 4));
        gb_units<ST, true, SEL>(a, s_eb, x, g, stride, n_slots, n_units, fr, fs, mine, mine_s, qo, dofs, cofs, lane);
    } else {
        g1_act<false> x;
        x.load(act0, dx0);
        gb_units<ST, false, SEL>(a, s_eb, x, g, stride, n_slots, n_units, fr, fs, mine, mine_s, qo, dofs, cofs, lane);
    }
}

/* ds4_gb256_kernel (forty-ninth session; the default since the fiftieth
 * where its grid fits: ncu 183.58 -> 141.16 us a launch, 16 sessions at
 * 2K +9.2%; DS4_CUDA_IQ2_ROW256=0 not): the same units on SEL 3's tables (cuda_moe_g1.cuh: a grid
 * offset one byte permute instead of a shift and an and-or), whose 80 KiB
 * fit beside the stages because the activations are not staged: every
 * warp's units are of one token (the launcher takes this kernel only for
 * such a grid), whose activation each lane loads from global memory into
 * registers once. The SwiGLU once for 16 units (gb_units) and the fetch's
 * pieces at immediate offsets (g1_fetch3) are SEL 3's too.
 * Dynamic shared memory: the slots' expert offsets, the stages, then the
 * tables at the next multiple of 64 KiB of the shared window (their
 * offsets carry that address; where the window's start leaves too little
 * room, every slot's outputs are NaN, as a bad expert's). */
extern __shared__ __align__(16) uint8_t gb3_dyn[];
template <int W, int ST> __host__ __device__ constexpr uint32_t gb3_tables_at(uint32_t base)
{
    return (base + GB_FIXED + W * ST * G1_UB + 0xffffu) & ~0xffffu;
}
template <int W, int ST>
__global__ void __launch_bounds__(W * 32, 1) ds4_gb256_kernel(const ds4_gb_args a)
{
    int64_t *s_eb = (int64_t *)gb3_dyn;          /* slot -> expert byte offset */
    uint8_t *s_stage = gb3_dyn + GB_FIXED;       /* W x ST units */
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(gb3_dyn), tab = gb3_tables_at<W, ST>(base);
    uint32_t dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    const bool placed = tab + G1_T256 <= base + dyn;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (placed) g1_tab_fill<3>(tid, W * 32, gb3_dyn + (tab - base)); /* constants: before the wait */
    ds4_pdl_enter();
    for (int s = tid; s < (int)a.n_slots; s += W * 32) {
        const int32_t e = a.ids[s];
        s_eb[s] = !placed || e < 0 || e >= a.n_expert ? -1 : (int64_t)e * a.expert_bytes;
    }
    __syncthreads();
    const uint32_t n_slots = (uint32_t)a.n_slots, n_units = n_slots * (uint32_t)a.rows;
    const uint32_t stride = gridDim.x * W, rows = (uint32_t)a.rows;
    const uint32_t dq = stride / n_slots, dr = stride - dq * n_slots;
    uint32_t g = blockIdx.x * W + warp;
    uint32_t fr = g / n_slots, fs = g - fr * n_slots;
    uint8_t *mine = s_stage + warp * ST * G1_UB;
    const uint32_t mine_s = (uint32_t)__cvta_generic_to_shared(mine);
#pragma unroll
    for (int i = 0; i < ST - 1; i++) {
        if (fr < rows) g1_fetch3(a, s_eb[fs], fr, mine_s + i * G1_UB + 16 * lane, lane);
        else ds4_mq_cp_commit();
        ds4_moe_walk_next(fr, fs, dq, dr, n_slots);
    }
    const int p = lane & 7, b0 = lane >> 3;
    g1_act<true> x;
    x.load_global(a.act + (int64_t)(g % n_slots / (uint32_t)a.x_share) * a.act_ld, b0, p);
    const uint32_t qo = g1_qofs(b0, p), dofs = g1_dofs(b0);
    gb_units<ST, true, 3>(a, s_eb, x, g, stride, n_slots, n_units, fr, fs, mine, mine_s, qo, dofs,
                          g1_cofs<3>(lane, tab), lane);
}

/* The launch of ds4_gb256_kernel, or false (the caller's kernel then) when
 * no grid of up to a block an SM, at most 1/20 of them left idle, gives
 * every warp units of one token. */
template <int W, int ST>
static bool ds4_gb256_go(ds4_cuda *cu, const ds4_gb_args &a)
{
    /* the window's dynamic memory starting at 0 (or up to ~29 KiB on, the
     * same 64 KiB boundary); the GGUF layout's spare 16 bytes are the
     * tables' gap */
    const size_t smem = (size_t)gb3_tables_at<W, ST>(0) + G1_T256;
    if (!ds4_moe1_smem_fits(cu->device, smem) || a.n_slots * a.y_slot_stride >= ((int64_t)1 << 32))
        return false; /* the outputs' indices wait in 32 bits (gb_units) */
    const int64_t units = a.n_slots * a.rows, need = (units + W - 1) / W, full = (int64_t)cu->n_sm;
    int64_t gx = 0;
    if (need <= full) gx = need; /* a unit a warp at most */
    else
        for (int64_t c = full; c >= full - full / 20 && c >= 1; c--)
            if (c * W % a.n_slots == 0) {
                gx = c;
                break;
            }
    if (gx == 0) return false;
    static size_t attr_smem[32];
    if (cu->device < 32 && attr_smem[cu->device] < smem) {
        cudaFuncSetAttribute(ds4_gb256_kernel<W, ST>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        attr_smem[cu->device] = smem;
    }
    ds4_gb_args b = a;
    b.act_regs = 1;
    ds4_launch(ds4_gb256_kernel<W, ST>, (unsigned)gx, W * 32, smem, cu->stream, b);
    return true;
}

template <int W, int ST, int SEL = 0>
static bool ds4_gb_go(ds4_cuda *cu, const ds4_gb_args &a)
{
    const size_t smem = (size_t)GB_FIXED + (size_t)a.n_tok * GB_AROW + GB_MAXT * G1_NB * 4 +
                        (size_t)W * ST * G1_UB + 16; /* +16: spare (the GGUF layout's word loads read past a unit) */
    if (!ds4_moe1_smem_fits(cu->device, smem + sizeof g1_tab)) return false;
    static size_t attr_smem[32];
    if (cu->device < 32 && attr_smem[cu->device] < smem) {
        /* the largest a launch can ask (16 tokens), so that the occupancy
         * below stays what every launch gets */
        const size_t most = (size_t)GB_FIXED + (size_t)GB_MAXT * GB_AROW + GB_MAXT * G1_NB * 4 +
                            (size_t)W * ST * G1_UB + 16;
        cudaFuncSetAttribute(ds4_gb_kernel<W, ST, SEL>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)most);
        attr_smem[cu->device] = most;
    }
    const int64_t units = a.n_slots * a.rows, need = (units + W - 1) / W, full = (int64_t)cu->n_sm;
    int64_t gx = need < full ? need : full;
    /* a block an SM, but up to 1/20 of the SMs left idle where that makes
     * the grid's warps a multiple of the slots (activations in registers):
     * 16 tokens' 96 slots need none on 132 SMs */
    static int ar = -1;
    const bool want_ar = ds4_env_switch_on("DS4_CUDA_MOE_BATCH_AR", &ar);
    for (int64_t c = gx; want_ar && gx == full && c >= full - full / 20 && c >= 1; c--)
        if (c * W % a.n_slots == 0) {
            gx = c;
            break;
        }
    ds4_gb_args b = a;
    b.act_regs = want_ar;
    ds4_launch(ds4_gb_kernel<W, ST, SEL>, (unsigned)gx, W * 32, smem, cu->stream, b);
    return true;
}

bool ds4_gb_gateup(ds4_cuda *cu, const ds4_gb_args &a)
{
    static int on = -1;
    if (!ds4_env_switch_on("DS4_CUDA_MOE_BATCH", &on)) return false;
    if (a.cols != G1_COLS || a.n_tok < 1 || a.n_tok > GB_MAXT || a.n_slots < 1 || a.n_slots > GB_MAXS ||
        a.x_share < 1 || (a.n_slots + a.x_share - 1) / a.x_share > a.n_tok || a.rows < 1 ||
        a.n_slots * a.rows >= ((int64_t)1 << 31) || a.expert_bytes != a.rows * G1_RB || a.act_ld % 16 != 0 ||
        ((uintptr_t)a.gate & 15u) != 0 || ((uintptr_t)a.up & 15u) != 0 || ((uintptr_t)a.act & 15u) != 0)
        return false;
    static int cfg = -1;
    if (cfg < 0) {
        const char *e = getenv("DS4_CUDA_MOE_BATCH_CFG");
        cfg = e && !strcmp(e, "16x2") ? 1 : e && !strcmp(e, "16x3") ? 2 : 0;
    }
    /* 24 warps and 2 stages as one token's kernel, the most that fits
     * beside 16 tokens' activations; DS4_CUDA_MOE_BATCH_CFG=16x2 / 16x3
     * for A/B runs */
    if (cfg == 0 && ds4_iq2_sel_batch_on()) { /* the selector tables */
        if (ds4_iq2_row256_on() && ds4_gb256_go<24, 2>(cu, a)) return true;
        return ds4_iq2_prmt_on() ? ds4_gb_go<24, 2, 2>(cu, a) : ds4_gb_go<24, 2, 1>(cu, a);
    }
    return cfg == 1 ? ds4_gb_go<16, 2>(cu, a) : cfg == 2 ? ds4_gb_go<16, 3>(cu, a) : ds4_gb_go<24, 2>(cu, a);
}

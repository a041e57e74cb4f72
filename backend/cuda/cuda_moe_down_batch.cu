/*
 * cuda_moe_down_batch.cu - the routed down products and their weighted sums
 * of a batched decode step (2-16 tokens, each from its own session), Q2_K
 * experts 2048 columns wide, 6 a token (Flash's routed experts).
 *
 * Why: a 16-session step took these on the general pipelined kernel
 * (cuda_mmvq.cu, MQ_COMBINE), 210 us a layer on the 8-layer, 256-expert
 * model (ncu, docs/BENCHMARKS.md eighteenth session); one token's kernel
 * (cuda_moe_down1.cu) does a row's 6 experts in fewer instructions but
 * holds one token's 6 activations. Here:
 *  - a token's 6 activations take 17 KB padded, so a block serves a group
 *    of up to 4 tokens (TG) and the grid is split among the groups;
 *    within a group a unit is one output row of one token, numbered
 *    row-major (row u / n, token u % n), so tokens that share an expert
 *    fetch its row at about the same time and all but the first find it in
 *    L2 (the groups' blocks walk the rows at about the same pace too);
 *  - the activations are the caller's Q8_K rows (the CPU's bytes),
 *    staged per token in the order its sum takes them (ascending expert id,
 *    ties in slot order), as one token's kernel stages its own;
 *  - each term is g2_term (cuda_moe_g2.cuh) and each row's sum adds the
 *    6 weighted terms in that order: a batched token's outputs are bit for
 *    bit those of its own decode step.
 * DS4_CUDA_MOE_BATCH=0 leaves these launches to the pipelined kernel.
 */
#include "backend/cuda/cuda_moe1.cuh"
#include "backend/cuda/cuda_moe_g2.cuh"

#include <stdlib.h>
#include <string.h>

enum {
    GD_MAXT = 16,                               /* tokens a launch */
    GD_BSROW = G2_COLS / 16 * 2,                /* a position's bsums */
    GD_TOK = G2_K * (G2_AROW + G2_NB * 4 + GD_BSROW), /* a token's staged activations */
    GD_ACT = 0,                                 /* per token: 6 padded rows, */
    GD_DX = G2_K * G2_AROW,                     /* their scales, */
    GD_BS = GD_DX + G2_K * G2_NB * 4,           /* their bsums */
};
/* A block serving TG tokens: their activations, then per token and
 * position the expert byte offset and the route weight, then the stages. */
template <int TG> struct gd_layout {
    enum { EB = TG * GD_TOK, W = EB + TG * 8 * 8, FIXED = W + TG * 8 * 4 };
    static_assert(GD_TOK % 16 == 0 && FIXED % 16 == 0, "stage buffers stay 16-byte aligned");
};

template <int W, int ST, int TG>
__global__ void __launch_bounds__(W * 32, 1) ds4_gd_kernel(const ds4_gd_args a)
{
    typedef gd_layout<TG> L;
    extern __shared__ __align__(16) uint8_t gd_dyn[];
    int64_t *s_eb = (int64_t *)(gd_dyn + L::EB); /* [token in group][position] */
    float *s_w = (float *)(gd_dyn + L::W);
    uint8_t *s_stage = gd_dyn + L::FIXED;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int t0 = blockIdx.y * TG;
    const int nt = a.n_tok - t0 < TG ? a.n_tok - t0 : TG;
    __shared__ int s_slot[TG][8];
    ds4_pdl_enter();
    if (tid < nt * G2_K) { /* slot j of token t: its position, the rank by (expert id, slot) */
        const int t = tid / G2_K, j = tid % G2_K;
        const int32_t *ids = a.ids + (int64_t)(t0 + t) * G2_K;
        const int32_t e = ids[j];
        const int rank = g2_rank_of(ids, e, j);
        s_eb[t * 8 + rank] = e < 0 || e >= a.n_expert ? -1 : (int64_t)e * a.expert_bytes;
        s_w[t * 8 + rank] = a.route_w[(int64_t)(t0 + t) * G2_K + j];
        s_slot[t][rank] = j;
    }
    __syncthreads();
    const uint32_t n = (uint32_t)nt, rows = (uint32_t)a.rows, n_units = n * rows, stride = gridDim.x * W;
    const uint32_t dq = stride / n, dr = stride - dq * n; /* units step as (row, token): ds4_moe_walk_next */
    uint32_t g = blockIdx.x * W + warp;
    uint32_t cr = g / n, ct = g - cr * n, fr = cr, ft = ct; /* unit g's, and the next fetched one's */
    uint8_t *mine = s_stage + warp * ST * G2_UB;
#pragma unroll
    for (int i = 0; i < ST - 1; i++) {
        if (fr < rows) g2_fetch_rows(a.w, s_eb + ft * 8, fr, mine + i * G2_UB, lane);
        else ds4_mq_cp_commit();
        ds4_moe_walk_next(fr, ft, dq, dr, n);
    }
    /* each token's 6 Q8_K rows to their padded places, in the sum's order */
    for (int c = tid; c < nt * G2_K * (G2_COLS / 16); c += W * 32) {
        const int tj = c / (G2_COLS / 16), pc = c % (G2_COLS / 16), t = tj / G2_K, jj = tj % G2_K;
        const uint8_t *q = a.act + ((int64_t)(t0 + t) * G2_K + s_slot[t][jj]) * a.act_ld;
        *(uint4 *)(gd_dyn + t * GD_TOK + GD_ACT + jj * G2_AROW + g2_act_at(pc)) =
            *(const uint4 *)(q + 16 * pc);
    }
    for (int i = tid; i < nt * G2_K * G2_NB; i += W * 32) {
        const int tj = i / G2_NB, t = tj / G2_K, jj = tj % G2_K;
        const uint8_t *q = a.act + ((int64_t)(t0 + t) * G2_K + s_slot[t][jj]) * a.act_ld;
        ((float *)(gd_dyn + t * GD_TOK + GD_DX))[jj * G2_NB + i % G2_NB] = ((const float *)(q + G2_COLS))[i % G2_NB];
    }
    for (int i = tid; i < nt * G2_K * (G2_COLS / 16); i += W * 32) {
        const int tj = i / (G2_COLS / 16), t = tj / G2_K, jj = tj % G2_K;
        const uint8_t *q = a.act + ((int64_t)(t0 + t) * G2_K + s_slot[t][jj]) * a.act_ld;
        ((int16_t *)(gd_dyn + t * GD_TOK + GD_BS))[jj * (G2_COLS / 16) + i % (G2_COLS / 16)] =
            ((const int16_t *)(q + G2_COLS + G2_NB * 4))[i % (G2_COLS / 16)];
    }
    __syncthreads();

    const int part = lane & 3, bl = lane >> 2;
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(gd_dyn);
    const uint32_t act0 = base + GD_ACT + bl * G2_ABLK, bs0 = base + GD_BS + bl * 32, dx0 = base + GD_DX + bl * 4;
    const uint32_t mine_s = (uint32_t)__cvta_generic_to_shared(mine);
    const g2_lane lo = g2_lane_of(bl, part);
    const float fnan = __int_as_float(0x7fc00000);
    int st = 0;
    for (; g < n_units; g += stride) {
        const int sn = st == 0 ? ST - 1 : st - 1;
        if (fr < rows) g2_fetch_rows(a.w, s_eb + ft * 8, fr, mine + sn * G2_UB, lane);
        else ds4_mq_cp_commit();
        ds4_moe_walk_next(fr, ft, dq, dr, n);
        ds4_mq_cp_wait<ST - 1>();
        __syncwarp();
        const uint32_t r = cr, t = ct, tofs = t * GD_TOK;
        const int64_t *eb = s_eb + t * 8;
        const uint32_t w = mine_s + st * G2_UB;
        float v[G2_K];
#pragma unroll
        for (int jj = 0; jj < G2_K; jj++)
            v[jj] = eb[jj] < 0 ? 0.0f
                               : g2_term(w + jj * G2_RB, lo, part, act0 + tofs + jj * G2_AROW,
                                         bs0 + tofs + jj * (G2_COLS / 8), ds4_lds_f32(dx0 + tofs + jj * G2_NB * 4));
        g2_warp_sum6(v, lane);
        if (lane == 0) {
            float *out = a.out + (int64_t)(t0 + t) * a.out_tok_stride + r;
            float tot = a.accumulate ? *out : 0.0f;
#pragma unroll
            for (int jj = 0; jj < G2_K; jj++)
                tot = eb[jj] < 0 ? fnan : __fadd_rn(tot, __fmul_rn(s_w[t * 8 + jj], v[jj]));
            if (a.addend) tot = __fadd_rn(tot, a.addend[(int64_t)(t0 + t) * a.rows + r]); /* the add kernel's out + y */
            *out = tot;
        }
        __syncwarp();
        st = st == ST - 1 ? 0 : st + 1;
        ds4_moe_walk_next(cr, ct, dq, dr, n);
    }
}

template <int W, int ST, int TG>
static bool ds4_gd_go(ds4_cuda *cu, const ds4_gd_args &a)
{
    const size_t smem = (size_t)gd_layout<TG>::FIXED + (size_t)W * ST * G2_UB;
    if (!ds4_moe1_smem_fits(cu->device, smem + sizeof(int) * TG * 8)) return false;
    static size_t attr_smem[32];
    if (cu->device < 32 && attr_smem[cu->device] < smem) {
        cudaFuncSetAttribute(ds4_gd_kernel<W, ST, TG>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        attr_smem[cu->device] = smem;
    }
    /* the SMs shared among the token groups, one block an SM */
    const int groups = (a.n_tok + TG - 1) / TG;
    const int64_t per = cu->n_sm / groups > 0 ? cu->n_sm / groups : 1;
    const int64_t units = (int64_t)(a.n_tok < TG ? a.n_tok : TG) * a.rows, need = (units + W - 1) / W;
    const dim3 grid((unsigned)(need < per ? need : per), (unsigned)groups);
    ds4_launch(ds4_gd_kernel<W, ST, TG>, grid, W * 32, smem, cu->stream, a);
    return true;
}

bool ds4_gd_down(ds4_cuda *cu, const ds4_gd_args &a)
{
    static int on = -1;
    if (!ds4_env_switch_on("DS4_CUDA_MOE_BATCH", &on)) return false;
    if (a.cols != G2_COLS || a.k != G2_K || a.n_tok < 1 || a.n_tok > GD_MAXT || a.rows < 1 ||
        4 * a.rows >= ((int64_t)1 << 31) || a.expert_bytes != a.rows * G2_RB || a.act_ld % 16 != 0 ||
        ((uintptr_t)a.w & 15u) != 0 || ((uintptr_t)a.act & 15u) != 0)
        return false;
    if (ds4_gd_down_pair(cu, a) || ds4_gd_down_regs(cu, a)) return true;
    static int cfg = -1;
    if (cfg < 0) {
        const char *e = getenv("DS4_CUDA_MOE_BATCH_DCFG");
        cfg = e && !strcmp(e, "2x16x3") ? 1 : 0;
    }
    /* (with DS4_CUDA_MOE_DOWN_REGS=0) 4 tokens a block, 16 warps, 2 stages;
     * DS4_CUDA_MOE_BATCH_DCFG=2x16x3: 2 tokens a block and 3 stages (more
     * rows in flight an SM), for A/B */
    return cfg == 1 ? ds4_gd_go<16, 3, 2>(cu, a) : ds4_gd_go<16, 2, 4>(cu, a);
}

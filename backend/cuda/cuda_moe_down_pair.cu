/*
 * cuda_moe_down_pair.cu - the batch's routed down (cuda_moe_down_regs.cu's
 * products and weighted sums) by warp pairs, each warp holding three of
 * its token's six activations in registers: the default where a pair has
 * at most GP_R rows (DS4_CUDA_MOE_DOWN_PAIR=0: ds4_gd_regs_kernel).
 * Measured (ncu, caches flushed, 8 layers, 16 sessions, H100, fiftieth
 * session, call 64): 96.36 -> 81.04 us a launch with 4% fewer executed
 * instructions; a 30-layer step's 16 sessions at 2K +3.2% alone, +3.0%
 * beside the gate+up on 256-byte rows (docs/BENCHMARKS.md).
 *
 * Why: ds4_gd_regs_kernel holds a token's six activations in a lane's
 * registers (~114 of its 168), so an SM runs 12 warps, 3 a scheduler, and
 * its issue slots were busy 47.5% of the time with the warps waiting on
 * their own chains (ncu, H100, 16 sessions, call 53: "wait" 29.9% of the
 * stall samples, short scoreboard 15.5%, long scoreboard 14.6%). Its unit
 * computes the six terms one after the other, each behind a branch on the
 * bad-expert mask, and fetches each expert's row behind two more (~150 of
 * the unit's ~730 instructions in the SASS ncu listed). Here a pair of
 * warps takes a token's rows: warp h of the pair computes the terms of the
 * experts of rank 3 h .. 3 h + 2 (ascending expert id, ties in slot order),
 * so a lane holds three activations (~57 registers) and an SM runs 16
 * warps; a warp's three rows come by four copies a lane without branches
 * (a bad expert's pieces are zeros, cp.async's source size 0), its terms
 * without a branch (a bad expert's term is replaced in the sum).
 *
 * The sum keeps its order: warp 0 of the pair adds (the output's value when
 * accumulating, or 0) + w0 v0 + w1 v1 + w2 v2 and hands that prefix to warp
 * 1 through shared memory, which adds w3 v3 + w4 v4 + w5 v5 and the addend
 * and stores: each step the same __fadd_rn / __fmul_rn as ds4_gd_regs_kernel
 * takes, so a token's outputs are bit for bit its own decode step's
 * (test_cuda_moe, test_decode_batch). Each lane term is g2_term_of's and
 * each row's three sums take ds4_mq_warp_sum's xor tree (g2_warp_sum3).
 *
 * The hand-off: a pair walks its rows in the same order in both warps;
 * warp 0's lane 0 writes row k's prefix with a flag into slot k of the
 * pair's GP_R slots (one 64-bit relaxed store, so the flag and the value
 * are seen together) and warp 1's lane 0 waits for the flag. Each slot is
 * written once a launch, so warp 0 never waits for warp 1; the launch is
 * taken only where a pair has at most GP_R rows.
 */
#include "backend/cuda/cuda_moe1.cuh"
#include "backend/cuda/cuda_moe_g2.cuh"

enum {
    GP_P = 8,                 /* warp pairs a block */
    GP_W = 2 * GP_P,          /* warps a block */
    GP_H = G2_K / 2,          /* experts a warp */
    GP_ST = 3,                /* stages a warp */
    GP_PR = G2_RB / 16,       /* 16-byte pieces a row (42) */
    GP_PW = GP_H * GP_PR,     /* a warp's three rows' pieces (126) */
    GP_SB = 128 * 16,         /* a stage: the 126 pieces and 2 of padding */
    GP_R = 64,                /* rows a pair at most */
    GP_MAXT = 16,
};
static_assert(GP_PR * 16 == G2_RB && GP_PW <= 128 && GP_PW > 96, "a warp's three rows are 4 pieces a lane, the last with padding");

/* A lane's three values summed over the warp, each by ds4_mq_warp_sum's
 * xor tree (its bits: a butterfly leaves every lane the same sum): at the
 * offset-16 step a lane keeps v0 or v1 and sends the other, v2 is
 * exchanged whole; at 8 a lane keeps v2 or what it kept; 4, 2 and 1 sum
 * that. v0's sum ends in lane 0, v1's in 16, v2's in 8, then in lane 0. */
__device__ __forceinline__ void g2_warp_sum3(float v[GP_H], int lane)
{
    const unsigned m = 0xffffffffu;
    const bool h16 = (lane & 16) != 0, h8 = (lane & 8) != 0;
    float a = h16 ? v[1] : v[0], c = v[2];
    a += __shfl_xor_sync(m, h16 ? v[0] : v[1], 16);
    c += __shfl_xor_sync(m, c, 16);
    float d = h8 ? c : a;
    d += __shfl_xor_sync(m, h8 ? a : c, 8);
    d += __shfl_xor_sync(m, d, 4);
    d += __shfl_xor_sync(m, d, 2);
    d += __shfl_xor_sync(m, d, 1);
    v[0] = d;
    v[1] = __shfl_sync(m, d, 16);
    v[2] = __shfl_sync(m, d, 8);
}

/* 64-bit relaxed shared-memory accesses at cta scope: single-copy atomic,
 * so the reader sees the flag and the value of one store together. */
__device__ __forceinline__ void gp_put(uint32_t a, uint64_t v)
{
    asm volatile("st.relaxed.cta.shared.b64 [%0], %1;" ::"r"(a), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t gp_get(uint32_t a)
{
    uint64_t v;
    asm volatile("ld.relaxed.cta.shared.b64 %0, [%1];" : "=l"(v) : "r"(a) : "memory");
    return v;
}

/* Copy row r of the warp's three experts into the stage at dst_s: piece
 * i of a lane is piece lane + 32 i of the three rows (16 bytes at 16 (lane
 * + 32 i) in the stage), from src[i] + r G2_RB; zeros where ok bit i is
 * clear (a bad expert's pieces, the padding). Lane 0 adds the row's end
 * value (the output's value for warp 0 when accumulating, the addend for
 * warp 1) into its slot of the stage. One commit group. */
__device__ __forceinline__ void gp_fetch(const uint8_t *const src[4], uint32_t ok, uint32_t r, uint32_t dst_s,
                                         const float *end, float *end_dst)
{
    const int64_t ro = (int64_t)r * G2_RB;
#pragma unroll
    for (int i = 0; i < 4; i++)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst_s + 512 * i), "l"(src[i] + ro),
                     "r"(ok >> i & 1u ? 16 : 0)
                     : "memory");
    if (end) ds4_mq_cp4(end_dst, end + r);
    ds4_mq_cp_commit();
}

__global__ void __launch_bounds__(GP_W * 32, 1) ds4_gd_pair_kernel(const ds4_gd_args a)
{
    extern __shared__ __align__(16) uint8_t gp_dyn[];
    __shared__ int64_t s_eb[GP_W][GP_H];
    __shared__ float s_w[GP_W][GP_H];
    __shared__ int s_slot[GP_W][GP_H];
    __shared__ float s_end[GP_W][GP_ST];                /* a stage's row's end value */
    __shared__ __align__(8) uint64_t s_pre[GP_P][GP_R]; /* warp 0's prefixes: flag << 32 | bits */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, pair = warp >> 1, h = warp & 1;
    const uint32_t gp = blockIdx.x * GP_P + pair, n = (uint32_t)a.n_tok, t = gp % n;
    const uint32_t stride = gridDim.x * GP_P / n, rows = (uint32_t)a.rows;
    for (int i = threadIdx.x; i < GP_P * GP_R; i += blockDim.x) s_pre[i / GP_R][i % GP_R] = 0;
    ds4_pdl_enter();
    if (lane < G2_K) { /* slot lane of the token: its place by (expert id, slot) */
        const int32_t *ids = a.ids + (int64_t)t * G2_K;
        const int32_t e = ids[lane];
        const int rank = g2_rank_of(ids, e, lane);
        if (rank / GP_H == h) {
            s_eb[warp][rank % GP_H] = e < 0 || e >= a.n_expert ? -1 : (int64_t)e * a.expert_bytes;
            s_w[warp][rank % GP_H] = a.route_w[(int64_t)t * G2_K + lane];
            s_slot[warp][rank % GP_H] = lane;
        }
    }
    __syncthreads(); /* the rank tables and the cleared hand-off slots */
    uint32_t bad = 0; /* bit j: expert j of the warp is out of range */
#pragma unroll
    for (int j = 0; j < GP_H; j++) bad |= (s_eb[warp][j] < 0 ? 1u : 0u) << j;
    /* a lane's four pieces: source and whether to read it */
    const uint8_t *src[4];
    uint32_t ok = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int idx = lane + 32 * i, j = idx / GP_PR < GP_H ? idx / GP_PR : GP_H - 1;
        const bool live = idx < GP_PW && !(bad >> j & 1u);
        src[i] = live ? a.w + s_eb[warp][j] + 16 * (idx - GP_PR * j) : a.w;
        ok |= (live ? 1u : 0u) << i;
    }
    float *const out_t = a.out + (int64_t)t * a.out_tok_stride;
    const float *const add_t = a.addend ? a.addend + (int64_t)t * a.rows : nullptr;
    const float *const end = lane != 0 ? nullptr : h == 0 ? (a.accumulate ? out_t : nullptr) : add_t;
    /* the warp's stages, and the lane's first piece in them */
    const uint32_t stage0 = (uint32_t)__cvta_generic_to_shared(gp_dyn) + (uint32_t)warp * GP_ST * GP_SB;
    const uint32_t mine_s = stage0 + 16 * lane;
    uint32_t fr = gp / n; /* the next row fetched */
#pragma unroll
    for (int i = 0; i < GP_ST - 1; i++) {
        if (fr >= rows) ds4_mq_cp_commit();
        else gp_fetch(src, ok, fr, mine_s + i * GP_SB, end, &s_end[warp][i]);
        fr += stride;
    }
    const int part = lane & 3, bl = lane >> 2;
    g2_act_regs act[GP_H];
#pragma unroll
    for (int j = 0; j < GP_H; j++)
        g2_act_load(a.act + ((int64_t)t * G2_K + s_slot[warp][j]) * a.act_ld, bl, part, act[j]);
    const uint32_t pre_s = (uint32_t)__cvta_generic_to_shared(s_pre[pair]);
    const g2_lane lo = g2_lane_of(bl, part);
    const float fnan = __int_as_float(0x7fc00000);
    int st = 0;
    uint32_t k = 0; /* the pair's row count, its hand-off slot */
    for (uint32_t r = gp / n; r < rows; r += stride, k++) {
        const int sn = st == 0 ? GP_ST - 1 : st - 1;
        if (fr >= rows) ds4_mq_cp_commit();
        else gp_fetch(src, ok, fr, mine_s + sn * GP_SB, end, &s_end[warp][sn]);
        fr += stride;
        ds4_mq_cp_wait<GP_ST - 1>();
        __syncwarp();
        const uint32_t w = stage0 + st * GP_SB;
        float v[GP_H];
#pragma unroll
        for (int j = 0; j < GP_H; j++) v[j] = g2_term_of(w + j * G2_RB, lo, part, act[j]);
        g2_warp_sum3(v, lane);
        if (lane == 0) {
            float tot;
            if (h == 0) tot = a.accumulate ? s_end[warp][st] : 0.0f;
            else {
                uint64_t x;
                while (((x = gp_get(pre_s + 8 * k)) >> 32) == 0) __nanosleep(32);
                tot = __uint_as_float((uint32_t)x);
            }
#pragma unroll
            for (int j = 0; j < GP_H; j++) tot = bad >> j & 1u ? fnan : __fadd_rn(tot, __fmul_rn(s_w[warp][j], v[j]));
            if (h == 0) gp_put(pre_s + 8 * k, (uint64_t)1 << 32 | __float_as_uint(tot));
            else {
                if (a.addend) tot = __fadd_rn(tot, s_end[warp][st]); /* the add kernel's out + y */
                out_t[r] = tot;
            }
        }
        __syncwarp(); /* the stage is refilled GP_ST - 1 units on */
        st = st == GP_ST - 1 ? 0 : st + 1;
    }
    ds4_mq_cp_wait<0>(); /* no copy outlives the block */
}

bool ds4_gd_down_pair(ds4_cuda *cu, const ds4_gd_args &a)
{
    static int on = -1;
    if (!ds4_env_switch_on("DS4_CUDA_MOE_DOWN_PAIR", &on) || a.n_tok < 1 || a.n_tok > GP_MAXT) return false;
    const size_t smem = (size_t)GP_W * GP_ST * GP_SB;
    if (!ds4_moe1_smem_fits(cu->device, smem + (8 + 4 + 4) * GP_W * GP_H + 4 * GP_W * GP_ST + 8 * GP_P * GP_R))
        return false;
    /* a block an SM, as many as make the grid's pairs a multiple of the
     * tokens (each pair one token's), and each pair at most GP_R rows */
    int64_t gx = cu->n_sm;
    while (gx > 1 && gx * GP_P % a.n_tok != 0) gx--;
    if (gx * GP_P % a.n_tok != 0) return false;
    const int64_t stride = gx * GP_P / a.n_tok;
    if ((a.rows + stride - 1) / stride > GP_R) return false;
    static size_t attr_smem[32];
    if (cu->device < 32 && attr_smem[cu->device] < smem) {
        cudaFuncSetAttribute(ds4_gd_pair_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        attr_smem[cu->device] = smem;
    }
    ds4_launch(ds4_gd_pair_kernel, (unsigned)gx, GP_W * 32, smem, cu->stream, a);
    return true;
}

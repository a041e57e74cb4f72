/*
 * cuda_moe1.cuh - one token's routed experts at Flash's shapes, the decode
 * step's two largest kernels: gate+up+SwiGLU on IQ2_XXS experts 4096
 * columns wide (cuda_moe_gateup1.cu) and down + the weighted sum on Q2_K
 * experts 2048 columns wide (cuda_moe_down1.cu). cuda_mmvq.cu offers them
 * the launches they can take and keeps its pipelined kernel for the rest.
 */
#ifndef DS4_CUDA_MOE1_CUH
#define DS4_CUDA_MOE1_CUH

#include "backend/cuda/cuda_internal.cuh"

/* What the routed kernels read of launches two or more back, read before
 * their dependency wait: the gate+up's activation (the FFN input; the
 * router's launch is between), the down's expert ids, weights and first
 * rows (the router's results; the gate+up's launch is between). The same
 * bits; full size, 2K: 148.3 / 149.3 -> 150.1 / 151.0 tokens/s, the two
 * kernels 17.1 + 14.2 -> 14.9 + 11.4 us in-graph (twenty-fifth
 * session). DS4_CUDA_MOE_EARLY=0: after the wait, for A/B; read once a
 * process. */
static inline bool ds4_moe1_early_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_MOE_EARLY", &on);
}

/* The routed gate+up kernels' IQ2_XXS from the selector tables
 * (ds4_mq_iq2_sel_group, cuda_mmvq.cuh): half the table wavefronts, the
 * same integers, so either kernel may take either form. The batch's
 * kernel takes them by default (16 sessions +0.9%, +1.2% in two H100 runs,
 * thirty-fourth session; DS4_CUDA_IQ2_SEL_BATCH=0 for the lean tables),
 * one token's only with DS4_CUDA_IQ2_SEL=1 (-0.6% there; since the
 * fifty-first session on SEL 3's 256-byte grid rows where the two switches
 * below are on, cuda_moe_gateup1.cu). Read once a process. */
static inline bool ds4_iq2_sel_on(void)
{
    static int on = -1;
    return ds4_env_flag_on("DS4_CUDA_IQ2_SEL", &on);
}
static inline bool ds4_iq2_sel_batch_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_IQ2_SEL_BATCH", &on);
}
/* The selector form through the raw prmt with its constant in a register
 * (cuda_moe_g1.cuh, SEL 2), the default where the batch's gate+up is not
 * on the 256-byte rows below: ncu (H100, 16 sessions, fiftieth session)
 * 183.58 -> 160.03 us a launch, 144.6M -> 123.6M warp instructions; the
 * same integers. DS4_CUDA_IQ2_PRMT=0: SEL 1. */
static inline bool ds4_iq2_prmt_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_IQ2_PRMT", &on);
}

/* The batch's gate+up on tables of 256-byte grid rows with its
 * activations in registers from global memory (ds4_gb256_kernel,
 * cuda_moe_gateup_batch.cu), the default where its grid fits: ncu (H100,
 * 16 sessions, fiftieth session) 183.58 -> 141.16 us a launch, 144.6M ->
 * 108.3M warp instructions. DS4_CUDA_IQ2_ROW256=0: ds4_gb_kernel. */
static inline bool ds4_iq2_row256_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_IQ2_ROW256", &on);
}

/* A warp's units g, g + stride, .. as (q, r) = (g / m, g % m), stepped
 * without a division: the quotient's magic-number sequence took ~20
 * instructions a unit, twice (its fetch and its sums), ~6% of one token's
 * gate+up main loop in ncu's SASS listing (thirty-fourth session).
 * dq, dr: stride / m and stride % m; r < m and dr < m, so one carry. */
__device__ __forceinline__ void ds4_moe_walk_next(uint32_t &q, uint32_t &r, uint32_t dq, uint32_t dr, uint32_t m)
{
    r += dr, q += dq;
    if (r >= m) r -= m, q++;
}

/* Whether a block of `bytes` of shared memory (static + dynamic) fits the
 * device's opt-in limit (sm_90: 227 KiB; sm_86 / sm_89: 99 KiB, where
 * these kernels leave the launch to the pipelined kernel). */
static inline bool ds4_moe1_smem_fits(int device, size_t bytes)
{
    static int limit[32];
    if (device < 0 || device >= 32) return false;
    if (limit[device] == 0) {
        int v = 0;
        if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess || v < 1)
            v = -1;
        limit[device] = v;
    }
    return limit[device] > 0 && bytes <= (size_t)limit[device];
}

/* What the kernel computes: for slot s < n_slots (expert ids[s], at pool
 * slot slot_of[e] when slot_of is set) and row r < rows,
 * y[s * y_slot_stride + r] = swiglu(gate_row . x, up_row . x) with x (cols
 * floats) quantized to Q8_K in the kernel. */
struct ds4_g1_args {
    const uint8_t *gate, *up;
    int64_t rows, cols, expert_bytes, n_expert;
    const int32_t *ids, *slot_of;
    int64_t n_slots;
    const float *x;
    float clamp;
    float *y;
    int64_t y_slot_stride;
};

/* Launches the kernel and returns true when it takes the shape (cols =
 * 4096, at most 64 slots, 16-byte aligned rows and x) and the device has
 * its shared memory; false leaves the launch to the caller.
 * DS4_CUDA_MOE1=0: never (A/B runs);
 * DS4_CUDA_MOE1_CFG=16x3: 16 warps per block and 3 pipeline stages with
 * the activation read from shared memory at each use, instead of 24 warps,
 * 2 stages and the activation held in registers. */
bool ds4_g1_gateup(ds4_cuda *cu, const ds4_g1_args &a);

/* A batched step's routed gate+up (cuda_moe_gateup_batch.cu): slot s < n_slots
 * (expert ids[s]) reads token s / x_share's activation, the Q8_K row at act
 * + (s / x_share) * act_ld (n_tok rows, quantized by the caller), and for
 * row r < rows y[s * y_slot_stride + r] = swiglu(gate_row . x, up_row . x),
 * bit for bit ds4_g1_gateup's value for that token alone. */
struct ds4_gb_args {
    const uint8_t *gate, *up;
    int64_t rows, cols, expert_bytes, n_expert;
    const int32_t *ids;
    int64_t n_slots, x_share;
    const uint8_t *act;
    int64_t act_ld;
    int n_tok;
    float clamp;
    float *y;
    int64_t y_slot_stride;
    int act_regs; /* set by the launcher: a warp may hold its token's activation in registers */
};

/* Launches and returns true when it takes the shape (cols = 4096, 1-16
 * tokens, at most 128 slots, 16-byte aligned rows and activations) and the
 * device has the shared memory; false leaves the launch to the caller.
 * DS4_CUDA_MOE_BATCH=0: never (A/B runs). */
bool ds4_gb_gateup(ds4_cuda *cu, const ds4_gb_args &a);

/* One token's down products and their weighted sum: for output row r <
 * rows, out[r] = (accumulate ? out[r] : 0) + sum over the k slots in
 * ascending expert id (ties in slot order, the CPU's order) of route_w[j] *
 * (row r of expert ids[j] . h_j), h_j = h + j * cols quantized to Q8_K in
 * the kernel. */
struct ds4_g2_args {
    const uint8_t *w;
    int64_t rows, cols, expert_bytes, n_expert;
    const int32_t *ids, *slot_of;
    const float *route_w;
    int k;
    const float *h;
    float *out;
    int accumulate;
    /* or NULL: out[r] = that sum + addend[r], one rounding more (the shared
     * expert's result, ds4_cuda's down_add) */
    const float *addend;
};

/* As ds4_g1_gateup, for cols = 2048 and k = 6 (Flash's routed experts per
 * token); the same switch DS4_CUDA_MOE1=0 turns it off;
 * DS4_CUDA_MOE1_DCFG = 16x3 or 24x2: warps per block x pipeline stages
 * instead of 16 x 2 (all three within noise, docs/BENCHMARKS.md). */
bool ds4_g2_down(ds4_cuda *cu, const ds4_g2_args &a);

/* A batched step's down products and weighted sums (cuda_moe_down_batch.cu):
 * for token t < n_tok and row r < rows, out[t * out_tok_stride + r] =
 * (accumulate ? that : 0) + sum over its k = 6 slots t * k + j, in ascending
 * expert id (ties in slot order), of route_w[t * k + j] * (row r of expert
 * ids[t * k + j] . h_j), h_j the Q8_K row at act + (t * k + j) * act_ld
 * (quantized by the caller): bit for bit ds4_g2_down's value for the token
 * alone. */
struct ds4_gd_args {
    const uint8_t *w;
    int64_t rows, cols, expert_bytes, n_expert;
    const int32_t *ids;
    const float *route_w;
    int k, n_tok;
    const uint8_t *act;
    int64_t act_ld;
    float *out;
    int64_t out_tok_stride;
    int accumulate;
    const float *addend; /* or NULL: as ds4_g2_args', token t's at addend + t * rows */
};

/* Launches and returns true when it takes the shape (cols = 2048, k = 6,
 * 1-16 tokens, 16-byte aligned rows and activations) and the device has
 * the shared memory; false leaves the launch to the caller.
 * DS4_CUDA_MOE_BATCH=0: never (A/B runs). */
bool ds4_gd_down(ds4_cuda *cu, const ds4_gd_args &a);
/* The same with each warp's token's activations in registers
 * (cuda_moe_down_regs.cu; the default, DS4_CUDA_MOE_DOWN_REGS=0 not), for a shape
 * ds4_gd_down has checked; false leaves the launch to it. */
bool ds4_gd_down_regs(ds4_cuda *cu, const ds4_gd_args &a);
/* The same by warp pairs, each warp three of its token's activations in
 * registers (cuda_moe_down_pair.cu; the default, DS4_CUDA_MOE_DOWN_PAIR=0 not), for
 * a shape ds4_gd_down has checked; false leaves the launch to the others. */
bool ds4_gd_down_pair(ds4_cuda *cu, const ds4_gd_args &a);

#endif

/*
 * cuda_moe_grouped.cu - the routed experts of a prefill chunk, grouped by
 * expert.
 *
 * Why: the slot-by-slot path reads an expert's 6.75 MiB (q2) once for every
 * (token, expert) pair of the chunk: a 128-token chunk of Flash is 768
 * slots, 5 GB of weight reads per layer, which made prefill weight-bound
 * at a few hundred tokens/s on the H200. Here the chunk's slots are sorted
 * by expert on the device and each expert's rows are read once per group
 * of its tokens: up to 64 by the int8 tensor-core kernels where they cover
 * the types and shapes (cuda_moe_mma.cu: Flash's IQ2_XXS gate/up and Q2_K
 * down), else up to 4 by the dp4a kernel that decode uses with 4 tokens
 * per weight pass (cuda_mmvq.cu, ds4_mq_kernel).
 *
 * Steps (6 launches per MoE layer):
 *  1. bucket: one block counts slots per expert, lays the slots out
 *     expert by expert (perm, and inv = a slot's row in that order) and
 *     cuts each expert's run into token groups of <= 64 or 4;
 *  2. quantize x rows into that order (Q8_K / Q8_0 as the weights need);
 *  3. gate + up + clamped SwiGLU per group  -> h rows (sorted order);
 *  4. quantize h;  5. down per group -> y rows (sorted order);
 *  6. combine: out[t] (+)= sum over the token's experts in ascending id of
 *     w * y, as the decode kernel's combine epilogue adds.
 * A (row, token) product does not depend on the tokens it shared a weight
 * pass with, so the order of slots inside an expert's run (atomics) cannot
 * change a result: the tensor-core kernels give each product the CPU scalar
 * kernel's numbers, the dp4a kernels the decode path's.
 * Ids outside [0, E) give NaN for their token, as the other paths do.
 */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_mmvq.cuh"

#define MOEG_THREADS 1024
#define MOEG_MAX_E 1024
#define MOEG_TOK 4 /* tokens per weight pass of the dp4a kernels (their NT) */
#define MOEG_SPARE 15 /* rows past the last slot a group's reads may touch (mma: its last 8-token tile, 7) */

/* One block. sh: cnt, start, gstart, cursor, each E + 1 (bucket E holds bad ids). */
__global__ void ds4_moeg_bucket_kernel(const int32_t *sel, int64_t slots, int E, int gt, int32_t *perm, int32_t *inv,
                                       ds4_mq_group *groups, int32_t *n_groups)
{
    ds4_pdl_enter();
    __shared__ int32_t cnt[MOEG_MAX_E + 1], start[MOEG_MAX_E + 1], gstart[MOEG_MAX_E + 1], cursor[MOEG_MAX_E + 1];
    for (int e = threadIdx.x; e <= E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int64_t s = threadIdx.x; s < slots; s += blockDim.x) {
        const int32_t id = sel[s];
        atomicAdd(&cnt[id >= 0 && id < E ? id : E], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) { /* E + 1 entries: a serial scan is a few microseconds */
        int32_t at = 0, g = 0;
        for (int e = 0; e <= E; e++) {
            start[e] = at;
            cursor[e] = at;
            gstart[e] = g;
            at += cnt[e];
            if (e < E) g += (cnt[e] + gt - 1) / gt;
        }
        *n_groups = g;
    }
    __syncthreads();
    for (int64_t s = threadIdx.x; s < slots; s += blockDim.x) {
        const int32_t id = sel[s];
        const int32_t pos = atomicAdd(&cursor[id >= 0 && id < E ? id : E], 1);
        perm[pos] = (int32_t)s;
        inv[s] = pos;
    }
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        for (int32_t j = 0; j * gt < cnt[e]; j++) {
            const int32_t n = cnt[e] - j * gt;
            groups[gstart[e] + j] = ds4_mq_group{e, start[e] + j * gt, n < gt ? n : gt, 0};
        }
}

/* out[t, d] (+)= sum over t's slots in ascending expert id of w * y[inv[slot], d]
 * (the order and the roundings of the decode kernel's combine). */
__global__ void ds4_moeg_combine_kernel(const float *y, const int32_t *inv, const int32_t *sel, const float *w,
                                        int T, int k, int64_t D, int E, float *out, int accumulate)
{
    ds4_pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)T * D) return;
    const int64_t t = i / D, d = i % D;
    int32_t eid[16];
    int ord[16];
    for (int j = 0; j < k; j++) eid[j] = sel[t * k + j];
    ds4_mq_order_by_id(eid, k, ord); /* the CPU's order */
    float tot = accumulate ? out[i] : 0.0f;
    for (int jj = 0; jj < k; jj++) {
        const int j = ord[jj];
        if (eid[j] < 0 || eid[j] >= E) {
            tot = __int_as_float(0x7fc00000);
            continue;
        }
        const int64_t slot = t * k + j;
        tot = __fadd_rn(tot, __fmul_rn(w[slot], y[(int64_t)inv[slot] * D + d]));
    }
    out[i] = tot;
}

/* The same, four neighbouring outputs a thread (D % 4 == 0, 16-byte
 * aligned y and out), grid (column blocks, tokens): the token's picks are
 * read and ordered once a block, by one thread, into shared memory, and y
 * is read in 16-byte pieces; each value's sum is the one above, term by
 * term. (Ordered per thread, the picks and their order sat in local
 * memory: 96 us a 2048-token call, ncu, 8-layer prefill.) */
__global__ void ds4_moeg_combine4_kernel(const float4 *y, const int32_t *inv, const int32_t *sel, const float *w, int k,
                                         int64_t D4, int E, float4 *out, int accumulate)
{
    ds4_pdl_enter();
    __shared__ int64_t s_row[16]; /* y row of the token's jj-th term, -1 for a pick outside 0 .. E - 1 */
    __shared__ float s_w[16];
    const int64_t t = blockIdx.y;
    if (threadIdx.x == 0) {
        int32_t eid[16];
        int ord[16];
        for (int j = 0; j < k; j++) eid[j] = sel[t * k + j];
        ds4_mq_order_by_id(eid, k, ord);
        for (int jj = 0; jj < k; jj++) {
            const int j = ord[jj];
            const int64_t slot = t * k + j;
            const bool ok = eid[j] >= 0 && eid[j] < E;
            s_row[jj] = ok ? (int64_t)inv[slot] : -1;
            s_w[jj] = ok ? w[slot] : 0.0f;
        }
    }
    __syncthreads();
    const int64_t d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= D4) return;
    const int64_t i = t * D4 + d;
    float4 tot = accumulate ? out[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float nan = __int_as_float(0x7fc00000);
    for (int jj = 0; jj < k; jj++) {
        const int64_t r = s_row[jj];
        if (r < 0) {
            tot = make_float4(nan, nan, nan, nan);
            continue;
        }
        const float ws = s_w[jj];
        const float4 v = y[r * D4 + d];
        tot.x = __fadd_rn(tot.x, __fmul_rn(ws, v.x));
        tot.y = __fadd_rn(tot.y, __fmul_rn(ws, v.y));
        tot.z = __fadd_rn(tot.z, __fmul_rn(ws, v.z));
        tot.w = __fadd_rn(tot.w, __fmul_rn(ws, v.w));
    }
    out[i] = tot;
}

/* Scratch layout, every part 256-byte aligned. */
typedef struct {
    size_t perm, inv, groups, n_groups, act_x, h, act_h, y, total;
    int64_t max_groups, act_x_ld, act_h_ld;
} moeg_layout;

static size_t moeg_up(size_t v) { return (v + 255) & ~(size_t)255; }

static moeg_layout moeg_plan(ds4_type gu_type, ds4_type down_type, int64_t D, int64_t F, int64_t E, int T, int k)
{
    moeg_layout L;
    const int64_t slots = (int64_t)T * k, rows = slots + MOEG_SPARE; /* a group's last reads may pass the end */
    L.max_groups = slots / MOEG_TOK + E;
    L.act_x_ld = ds4_cuda_mmvq_act_bytes(gu_type, D);
    L.act_h_ld = ds4_cuda_mmvq_act_bytes(down_type, F);
    size_t at = 0;
    L.perm = at, at = moeg_up(at + sizeof(int32_t) * (size_t)slots);
    L.inv = at, at = moeg_up(at + sizeof(int32_t) * (size_t)slots);
    L.groups = at, at = moeg_up(at + sizeof(ds4_mq_group) * (size_t)L.max_groups);
    L.n_groups = at, at = moeg_up(at + sizeof(int32_t));
    L.act_x = at, at = moeg_up(at + (size_t)L.act_x_ld * (size_t)rows);
    L.h = at, at = moeg_up(at + sizeof(float) * (size_t)F * (size_t)rows);
    L.act_h = at, at = moeg_up(at + (size_t)L.act_h_ld * (size_t)rows);
    L.y = at, at = moeg_up(at + sizeof(float) * (size_t)D * (size_t)slots);
    L.total = at;
    return L;
}

/* DS4_CUDA_MOE_GATHER=0: the quantized activations a row a slot for the
 * tensor-core gate/up too (A/B; same numbers). */
static bool moeg_gather_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_MOE_GATHER", &on);
}

static bool moeg_type_ok(ds4_type t)
{
    return t == DS4_TYPE_Q8_0 || t == DS4_TYPE_Q2_K || t == DS4_TYPE_IQ2_XXS;
}

size_t ds4_cuda_moe_grouped_scratch(ds4_type gu_type, ds4_type down_type, int64_t D, int64_t F, int64_t E, int T,
                                    int k)
{
    return moeg_plan(gu_type, down_type, D, F, E, T, k).total;
}

ds4_status ds4_cuda_moe_grouped(ds4_cuda *cu, ds4_type gu_type, const void *d_gate, const void *d_up,
                                ds4_type down_type, const void *d_down, int64_t D, int64_t F, int64_t E,
                                const int32_t *d_sel, const float *d_w, int T, int k, const float *d_x, float clamp,
                                float *d_out, int accumulate, void *d_scratch, size_t scratch_bytes)
{
    if (!moeg_type_ok(gu_type) || !moeg_type_ok(down_type) || E < 1 || E > MOEG_MAX_E || k < 1 || k > 16 || T < 1)
        return ds4_fail(DS4_ERR_UNSUPPORTED, "cuda moe grouped: shape not covered");
    const moeg_layout L = moeg_plan(gu_type, down_type, D, F, E, T, k);
    if (!d_scratch || scratch_bytes < L.total) return ds4_fail(DS4_ERR_INVALID, "cuda moe grouped: scratch too small");
    uint8_t *base = (uint8_t *)d_scratch;
    int32_t *perm = (int32_t *)(base + L.perm), *inv = (int32_t *)(base + L.inv);
    ds4_mq_group *groups = (ds4_mq_group *)(base + L.groups);
    int32_t *n_groups = (int32_t *)(base + L.n_groups);
    float *h = (float *)(base + L.h), *y = (float *)(base + L.y);
    const int64_t slots = (int64_t)T * k;
    const int64_t gb = F * ds4_cuda_row_bytes(gu_type, D), db = D * ds4_cuda_row_bytes(down_type, F);

    /* the tensor-core kernels where they cover the shapes, else dp4a */
    const bool mma = ds4_cuda_moe_mma_covers(cu, gu_type, down_type, D, F);
    const int gt = mma ? ds4_cuda_moe_mma_group_tokens() : MOEG_TOK;
    const int64_t max_groups = slots / gt + E;
    ds4_launch(ds4_moeg_bucket_kernel, 1, MOEG_THREADS, 0, cu->stream, d_sel, slots, (int)E, gt, perm, inv, groups,
               n_groups);
    DS4_CUDA_CHECK(cudaGetLastError());
    /* the tensor-core kernel reads each token's quantized row through perm
     * (a row a token: the quantizer wrote each token's row six times, 63 us
     * a 2048-token chunk, ncu); the dp4a kernels take them in slot order */
    const bool gather = mma && moeg_gather_on();
    ds4_status st = gather ? ds4_cuda_mmvq_quantize_map(cu, gu_type, d_x, D, NULL, 1, T, D, base + L.act_x)
                           : ds4_cuda_mmvq_quantize_map(cu, gu_type, d_x, D, perm, k, slots, D, base + L.act_x);
    if (st == DS4_OK)
        st = mma ? ds4_cuda_moe_mma_swiglu(cu, d_gate, d_up, F, D, groups, n_groups, max_groups, base + L.act_x,
                                           L.act_x_ld, h, clamp, gather ? perm : NULL, k)
                 : ds4_cuda_mmvq_groups(cu, gu_type, d_gate, d_up, F, D, gb, E, groups, n_groups, max_groups,
                                        base + L.act_x, h, F, DS4_Q8S_SWIGLU, clamp);
    if (st == DS4_OK) st = ds4_cuda_mmvq_quantize_map(cu, down_type, h, F, NULL, 1, slots, F, base + L.act_h);
    if (st == DS4_OK)
        st = mma ? ds4_cuda_moe_mma_down(cu, d_down, D, F, groups, n_groups, max_groups, base + L.act_h, L.act_h_ld, y)
                 : ds4_cuda_mmvq_groups(cu, down_type, d_down, NULL, D, F, db, E, groups, n_groups, max_groups,
                                        base + L.act_h, y, D, DS4_Q8S_STORE, 0.0f);
    if (st != DS4_OK) return st;
    const int64_t n = (int64_t)T * D;
    if (D % 4 == 0 && ((uintptr_t)y | (uintptr_t)d_out) % 16 == 0 && k <= 16 && T <= 65535)
        ds4_launch(ds4_moeg_combine4_kernel, dim3((unsigned)((D / 4 + 255) / 256), (unsigned)T), 256, 0, cu->stream,
                   (const float4 *)y, (const int32_t *)inv, d_sel, d_w, k, D / 4, (int)E, (float4 *)d_out,
                   accumulate);
    else
        ds4_launch(ds4_moeg_combine_kernel, (unsigned)((n + 255) / 256), 256, 0, cu->stream, (const float *)y,
                   (const int32_t *)inv, d_sel, d_w, T, k, D, (int)E, d_out, accumulate);
    DS4_CUDA_CHECK(cudaGetLastError());
    return DS4_OK;
}

/*
 * cuda_q8split_fused.cu - one token's decode matvec on the split-layout
 * Q8_0 copies (cuda_q8split.cu) that quantizes its activation itself.
 *
 * Why: at full size a decode step is ~6 Q8_0 products per layer of 2-36 MB
 * each, and ncu (2026-12-02, docs/BENCHMARKS.md) put them at 1.2-1.5 TB/s
 * against 4.1 TB/s for the 563 MB LM head on the same kernel. The gap is
 * per product: a quantizer launch before each (2.6 us), the kernel's DRAM
 * pipeline starting empty after it, and rows of 1024 values leaving each
 * lane with two 16-byte loads in flight. Here:
 *  - each block quantizes the activation into shared memory (bit for bit
 *    the quantizer kernel's bytes: the same per-value functions);
 *  - a warp's first weight loads are issued before ds4_pdl_enter(): the
 *    weights are read-only for the backend's life, so they may be read
 *    while the previous kernel (which writes the activation) still runs;
 *  - every lane keeps 8 loads (128 bytes) in flight: short rows are taken
 *    several at a time (CPL = 16-byte chunks per lane per row).
 * Each lane adds its chunks in ascending order and the warp sums lanes as
 * ds4_q8s_kernel does, so results are bit-identical to the quantizer +
 * ds4_q8s_kernel pair (tests/test_cuda_kernels checks it).
 */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_blocks.cuh"
#include "backend/cuda/cuda_mmvq.cuh"
#include "backend/cuda/cuda_mq_device.cuh"
#include "backend/cuda/cuda_numerics.cuh"
#include "backend/cuda/cuda_q8f_rope.cuh"
#include "backend/cuda/cuda_rmsnorm_row.cuh"
#include "backend/cuda/cuda_rope_row.cuh"

#include <cooperative_groups.h>
#include <stdlib.h>
#include <string.h>

#define Q8F_WARPS 8
#define Q8F_LOADS 8 /* 16-byte weight loads in flight per lane */
#define Q8F_BK_STAGE 4352 /* BK: a batch's 4096 weight bytes and their 128 scales */

struct ds4_q8f_params {
    const uint8_t *qs[2];
    const uint16_t *d[2];
    int64_t rows, cols, n_group;
    const float *x;
    int64_t x_ld;
    float *y;
    int64_t y_slot_stride;
    float clamp;
    int accumulate;
    /* DS4_Q8S_PAIR: blockIdx.y = 1 takes matrix 1 (rows2 rows) into y2 */
    int64_t rows2;
    float *y2;
    /* NORM (ds4_q8split_fused_norm): x is first normalized by these
     * weights, as the rmsnorm op does */
    const float *norm_w;
    float norm_eps;
    /* the Q8_0 hand-off (ds4_cuda's q8o): QO stores the outputs' Q8_0
     * blocks in qo (int8, y's layout) and qo_d (a scale per 32 outputs);
     * xq / xd set: x comes already quantized (cols int8, cols / 32 scales) */
    int8_t *qo;
    float *qo_d;
    const int8_t *xq;
    const float *xd;
    /* HR (ds4_q8split_fused_norm_rope): the heads' norm + RoPE, the kv row */
    ds4_q8f_rope hr;
    /* BK: the stages of each warp's ring (2-4) */
    int bk;
};

/* HR's extra last block: the kv row's rmsnorm (its weight, at the op's
 * thread count) + RoPE + rounding in place, as the rmsnorm_rope kernel
 * does it, then the pending Sinkhorn. Shared memory: row (head_dim). */
__device__ __forceinline__ void q8f_hr_kv(const ds4_q8f_rope &R, float *row)
{
    float wv[4];
    cb_rmsnorm_reg_weights_nt(R.kv_w, R.head_dim, wv, R.nt);
    const float omk = (int)threadIdx.x < R.n_rot / 2 ? __ldg(R.om + threadIdx.x) : 0.0f;
    ds4_pdl_enter(); /* the kv row is the previous product's */
    const int64_t pos = cb_pos(R.d_pos, R.pos);
    cb_norm_rope_row(R.kv, R.kv_w, wv, R.head_dim, R.eps, R.n_rot, omk, pos, row, R.nt);
    if (R.fp8_nope || R.f16_store) cb_kv_round_row_block(row, R.head_dim, R.fp8_nope, R.f16_store);
    for (int i = threadIdx.x; i < R.head_dim; i += blockDim.x) R.kv[i] = row[i];
    if (R.sj.comb) ds4_sink_job_run(R.sj);
}

/* HR's end of a head block: its rows' stores made visible, a ticket on
 * the head's counter; the head's last block reads the head back from L2
 * and normalizes and rotates it in place (no weight), as the rmsnorm_rope
 * kernel does, and sets the counter back to 0. omk: the thread's RoPE
 * frequency (read before the wait). */
__device__ __forceinline__ void q8f_hr_head(const ds4_q8f_rope &R, float *y, float omk, float *row)
{
    __shared__ bool s_last;
    const int bph = R.head_dim / 128, head = (int)blockIdx.x / bph;
    __threadfence(); /* this thread's stores of y, before the ticket */
    __syncthreads();
    if (threadIdx.x == 0) {
        s_last = atomicAdd(R.cnt + head, 1u) == (unsigned)(bph - 1);
        __threadfence();
    }
    __syncthreads();
    if (!s_last) return;
    float *xr = y + (size_t)head * R.head_dim;
    for (int i = threadIdx.x; i < R.head_dim; i += blockDim.x) row[i] = __ldcg(xr + i); /* the other blocks' rows */
    __syncthreads();
    const float wv[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    cb_norm_rope_row(row, NULL, wv, R.head_dim, R.eps, R.n_rot, omk, cb_pos(R.d_pos, R.pos), row, R.nt);
    for (int i = threadIdx.x; i < R.head_dim; i += blockDim.x) xr[i] = row[i];
    if (threadIdx.x == 0) R.cnt[head] = 0; /* for the next launch */
}

/* The cluster forms' end of a head block: ss, thread t's sum of the
 * head's four squares at t (t < 128), through the op's block sum to the
 * scale; the block's 128 values scaled, rank 3 rotating the head's last
 * n_rot, then stored. */
__device__ __forceinline__ void q8f_hc_finish(const ds4_q8f_rope &R, float *y, float omk, float *rows, double ss,
                                              int head, int q)
{
    const int t = threadIdx.x;
    const float s = (float)(1.0 / sqrt(cb_block_sum_double(ss) / R.head_dim + R.eps));
    if (t < 128) rows[t] = rows[t] * s;
    __syncthreads();
    if (q == 3 && t < R.n_rot / 2) cb_rope_pair(rows + (R.head_dim - R.n_rot - 384) + 2 * t, cb_pos(R.d_pos, R.pos), omk, 0);
    __syncthreads();
    if (t < 128) y[(size_t)head * R.head_dim + 128 * q + t] = rows[t];
}

/* HC (DS4_CUDA_QB_ROPE=2, the cluster form of HR; heads of 512 at the op's
 * 128 threads): a head's four blocks are a cluster, and block q keeps its
 * 128 outputs (the head's values 128 q .. 128 q + 127) in rows. Each squares
 * its values (double) into sq; after a cluster barrier every block forms
 * each thread t's sum as the op does, sq of rank 0, 1, 2, 3 at t in turn
 * (the op's thread t holds values t, t + 128, t + 256, t + 384), the op's
 * block sum over the 128 sums (cb_block_sum_double, the other threads
 * adding exact zeros), and scales its own values; rank 3 rotates the
 * head's last n_rot values (in its rows: n_rot <= 128). No ticket, no
 * fence, no read back from L2. A second barrier keeps each block's sq
 * until the others have read it. */
__device__ __forceinline__ void q8f_hc_head(const ds4_q8f_rope &R, float *y, float omk, float *rows, double *sq)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    const int t = threadIdx.x, q = (int)cluster.block_rank(), head = (int)blockIdx.x / 4;
    __syncthreads(); /* the block's rows are in */
    if (t < 128) sq[t] = (double)rows[t] * rows[t];
    ds4_cluster_arrive();
    ds4_cluster_wait();
    double ss = 0.0;
    if (t < 128)
#pragma unroll
        for (int k = 0; k < 4; k++) ss += *cluster.map_shared_rank(sq + t, k);
    ds4_cluster_arrive(); /* done reading the others' sq */
    q8f_hc_finish(R, y, omk, rows, ss, head, q);
    ds4_cluster_wait(); /* no block leaves while its sq is read */
#else
    (void)R, (void)y, (void)omk, (void)rows, (void)sq;
#endif
}

/* The push form's shared memory, declared here so that the other forms' kernels
 * keep their layout (and their code): the barrier (its shared-window
 * address) and the head's squares as pushed, r_sq[rank][t]. */
__device__ __forceinline__ uint32_t q8f_hc_mb()
{
    __shared__ __align__(8) uint64_t mb;
    return (uint32_t)__cvta_generic_to_shared(&mb);
}
__device__ __forceinline__ double (*q8f_hc_rsq())[128]
{
    __shared__ double r_sq[4][128];
    return r_sq;
}

/* q8f_hc_head with pushes (HC with R.cluster 2, DS4_CUDA_QB_ROPE=3, opt-in): block q
 * pushes its 128 squares into r_sq[q] of each of the head's four blocks
 * (st.async, counted off the barrier made at the kernel's start with the
 * cluster arrival that this waits on) and sums r_sq[0..3][t] from its own
 * shared memory, as q8f_hc_head sums the ranks' sq[t]: the same bits, with
 * no cluster barrier after the start's and no remote load. */
__device__ __forceinline__ void q8f_hc_head_push(const ds4_q8f_rope &R, float *y, float omk, float *rows)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    double(*r_sq)[128] = q8f_hc_rsq();
    const uint32_t mb = q8f_hc_mb();
    const int t = threadIdx.x, head = (int)blockIdx.x / 4;
    const uint32_t q = (uint32_t)blockIdx.x % 4; /* the cluster is 4 consecutive blocks */
    __syncthreads(); /* the block's rows are in */
    ds4_cluster_wait(); /* every block of the head has made its barrier */
    if (t < 128) {
        const double v = (double)rows[t] * rows[t];
        const uint32_t a = (uint32_t)__cvta_generic_to_shared(&r_sq[q][t]);
#pragma unroll
        for (uint32_t k = 0; k < 4; k++) ds4_push8(ds4_cluster_map(a, k), v, ds4_cluster_map(mb, k));
    }
    ds4_mbar_wait0(mb);
    double ss = 0.0;
    if (t < 128)
#pragma unroll
        for (int k = 0; k < 4; k++) ss += r_sq[k][t];
    q8f_hc_finish(R, y, omk, rows, ss, head, q);
#else
    (void)R, (void)y, (void)omk, (void)rows;
#endif
}

/* Work of one warp: an "item" is RPB rows of one matrix pair, a "batch"
 * Q8F_LOADS chunks per lane. CPL < 8: a batch is RPB = 8 / CPL whole rows;
 * CPL >= 8: a row takes NB = CPL / 8 batches. Load k of batch j of an item
 * is chunk lane + 32 * (CPL < 8 ? k % CPL : 8 j + k) of row k / CPL (CPL < 8)
 * or of the item's row. */
template <int CPL> struct ds4_q8f_shape {
    enum { RPB = CPL < 8 ? 8 / CPL : 1, NB = CPL < 8 ? 1 : CPL / 8 };
};

template <int CPL>
__device__ __forceinline__ void ds4_q8f_load(const uint8_t *qs, const uint16_t *d, int64_t row0, int64_t cols,
                                             int j, int lane, uint4 *w, uint16_t *dw)
{
    const int nblk_row = (int)(cols / 32);
#pragma unroll
    for (int k = 0; k < Q8F_LOADS; k++) {
        const int64_t row = row0 + (CPL < 8 ? k / CPL : 0);
        const int c = lane + 32 * (CPL < 8 ? k % CPL : 8 * j + k);
        w[k] = ds4_ld_stream16(qs + row * cols + 16 * (int64_t)c);
        dw[k] = __ldg(d + row * nblk_row + (c >> 1));
    }
}

/* BK: batch j of the item whose first row is row0 (matrix qs / d), the
 * chunks ds4_q8f_load gives a warp, as bulk copies into stage sb counted
 * off the stage's barrier mb (one lane issues). Whatever CPL, a batch's
 * weights are one run of 4096 bytes (8 / CPL whole rows, or a row's
 * 4096 j .. 4096 j + 4095) and its scales one run of 128. */
__device__ __forceinline__ void q8f_bk_issue(const uint8_t *qs, const uint16_t *d, int64_t row0, int64_t cols, int j,
                                             uint32_t sb, uint32_t mb)
{
    ds4_mbar_expect(mb, Q8F_BK_STAGE);
    ds4_bulk_g2s(sb, qs + row0 * cols + 4096 * (int64_t)j, 4096, mb);
    ds4_bulk_g2s(sb + 4096, d + row0 * (cols / 32) + 128 * (int64_t)j, 256, mb);
}
/* BK: the lane's registers of ds4_q8f_load, from the stage: load k is
 * the batch's bytes 512 k + 16 lane and scale 16 k + lane / 2 */
__device__ __forceinline__ void q8f_bk_read(uint32_t sb, int lane, uint4 *w, uint16_t *dw)
{
#pragma unroll
    for (int k = 0; k < Q8F_LOADS; k++) {
        w[k] = ds4_lds128(sb + 512 * k + 16 * lane);
        dw[k] = (uint16_t)ds4_lds_u16(sb + 4096 + 32 * k + 2 * (lane >> 1));
    }
}

/* DB (items of several batches; launched for the SwiGLU's two matrices):
 * two register buffers, each batch's loads issued before the previous
 * batch is computed, where one buffer left a DRAM round trip per batch
 * exposed; the same sums in the same order.
 * NORM (one slot, cols = 1024, the q_a norm before q_b): the block first
 * makes rmsnorm(x) * norm_w in shared memory with the rmsnorm op's code
 * at its thread count (cb_rmsnorm_reg_row: 256 threads for a row of
 * 1024), so the quantizer sees the op's values and the product has the
 * bits of the two ops. Why: the norm was a launch of one block (~4.3 us a
 * layer in the replayed step) between q_a and q_b.
 * PK (DS4_CUDA_Q8F_PAIRK; rows of 8192, two batches a row, the o_b
 * product): warps 2p and 2p + 1 take the same row, one batch each, so
 * both batches' loads are in flight at once and each warp issues its next
 * row's batch before it waits, where one warp exposed a DRAM round trip a
 * row (its second batch loaded after the first was computed). The odd warp
 * continues each lane's sum from the even warp's (a named barrier a pair,
 * two a row): the same products added in the same order. */
/* QO (the Q8_0 hand-off, for o_a: rows of 4096, one batch a row): block
 * (b, s) takes rows 32 b .. 32 b + 31 of slot s, warp w rows 32 b + w + 8 i,
 * so that the block holds one Q8_0 block of the outputs; after its rows it
 * quantizes them as the next product would (ds4_mmvq_q8_0_*: the largest
 * magnitude by fmaxf, then each value) and stores them beside y. The row
 * sums are those of the other assignment (a warp a row, the same order).
 * Why: o_b's blocks each read o_a's 8192 floats twice to quantize them
 * (the second pass from L1: with L1 cut to 28 KB by a larger shared-memory
 * carveout, o_b took 1.5 us longer in-graph, thirty-seventh session). */
/* HR (ds4_q8split_fused_norm_rope; q_b: rows of 1024, the q_a norm, stored):
 * block b takes rows 128 b .. 128 b + 127 (warp w the items 32 b + w + 8 i,
 * as QO's blocks take theirs), and after them q8f_hr_head; the last block
 * of the grid does the kv row and the pending Sinkhorn (q8f_hr_kv). The
 * row sums are those of the other assignment. */
/* BK (DS4_CUDA_Q8F_BULK=N, opt-in, sm_90): each warp streams its batches
 * through a ring of P.bk stages in shared memory filled by bulk copies,
 * where the register forms keep one batch (4 KB a warp) in flight. The
 * weights are constants, so the first P.bk batches of every warp are
 * asked for before the programmatic-launch wait: with 3 stages and two
 * blocks an SM, ~27 MB of a 35.6 MB product (q_b, o_a, o_b) is on its way
 * while the kernel before still runs. A lane reads the same chunks as
 * from ds4_q8f_load and sums them in the same order: the same bits. */
template <int CPL, int EPI, bool DB, bool NORM = false, bool PK = false, bool QO = false, bool HR = false,
          bool HC = false, bool BK = false>
__global__ void __launch_bounds__(Q8F_WARPS * 32, 2) ds4_q8f_kernel(const ds4_q8f_params P)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    if constexpr (BK) return; /* launched on sm_90 and later only */
#endif
    enum { NM = EPI == DS4_Q8S_SWIGLU ? 2 : 1, RPB = ds4_q8f_shape<CPL>::RPB, NB = ds4_q8f_shape<CPL>::NB,
           NS = NM * NB, /* batches per item */
           VPT = 2 * CPL /* activation values per thread: cols / 256 */,
           IPB = PK ? Q8F_WARPS / 2 : Q8F_WARPS /* items a block takes at once */ };
    static_assert(!DB || NS % 2 == 0, "the next item's first batch lands in buffer 0");
    static_assert(!PK || (NB == 2 && NM == 1 && !DB && !NORM), "pairs: two batches a row, one matrix");
    static_assert(!QO || (CPL == 8 && NS == 1 && !DB && !NORM && !PK && EPI == DS4_Q8S_STORE),
                  "the hand-off: rows of 4096, stored");
    static_assert(!HR || (CPL == 2 && NORM && !DB && !PK && !QO && EPI == DS4_Q8S_STORE),
                  "the heads' norm: q_b's rows of 1024, normalized input, stored");
    static_assert(!HC || HR, "the cluster form is HR's");
    static_assert(!BK || (!DB && !PK), "the ring replaces the register buffers");
    extern __shared__ __align__(16) uint8_t q8f_smem[];
    if constexpr (HR) {
        /* the last block, or (HC) the last cluster's first; the rest of that cluster has nothing to do */
        const unsigned extra = gridDim.x - (HC ? 4 : 1);
        if (blockIdx.x >= extra) { /* uniform over the block */
            if (blockIdx.x == extra) q8f_hr_kv(P.hr, (float *)q8f_smem);
            return;
        }
    }
    __shared__ float q8f_hc_rows[HC ? 128 : 1];   /* HC: the block's 128 outputs */
    __shared__ double q8f_hc_sq[HC ? 128 : 1];    /* and their squares, read by the cluster */
    if (HC && P.hr.cluster == 2) { /* the barrier ready before any block of the head pushes */
        if (threadIdx.x == 0) {
            ds4_mbar_init(q8f_hc_mb(), 4 * 128 * 8);
            ds4_mbar_init_fence();
        }
        __syncwarp();
        ds4_cluster_arrive_relaxed();
    }
    __shared__ float q8f_qo_rows[QO ? 32 : 1]; /* QO: the block's 32 outputs */
    int8_t *xq = (int8_t *)q8f_smem;
    float *xd = (float *)(q8f_smem + P.cols);
    const int lane = threadIdx.x & 31;
    /* PAIR: blockIdx.y picks the matrix, both read x row 0 */
    const int pm = EPI == DS4_Q8S_PAIR ? (int)blockIdx.y : 0;
    const int64_t s = EPI == DS4_Q8S_PAIR ? 0 : blockIdx.y;
    const int64_t n_items = (pm ? P.rows2 : P.rows) / RPB;
    enum { OWN = QO ? 32 : HR ? 128 / RPB : 0 }; /* items a block owns (QO, HR), else all in turn */
    const int64_t stride = OWN ? Q8F_WARPS : (int64_t)gridDim.x * IPB;
    const int64_t gbase = P.n_group > 1 ? (s % P.n_group) * P.rows : 0;
    const uint8_t *qs0 = P.qs[pm];
    const uint16_t *d0 = P.d[pm];
    float *yb = pm ? P.y2 : P.y;
    const int warp = threadIdx.x >> 5, pkb = PK ? warp & 1 : 0; /* PK: the batch this warp takes */
    int64_t item = (int64_t)blockIdx.x * (OWN ? OWN : IPB) + (PK ? warp >> 1 : warp);
    /* QO, HR: the block's items, else all */
    const int64_t item_end = OWN ? ((int64_t)blockIdx.x + 1) * OWN : n_items;
    uint4 w[Q8F_LOADS], w2[DB ? Q8F_LOADS : 1];
    uint16_t dw[Q8F_LOADS], dw2[DB ? Q8F_LOADS : 1];
    /* BK: the warp's stages and their barriers after the activation's bytes;
     * the issue cursor (batch bst of item bit) runs P.bk batches ahead of
     * the one computed, whose stage it refills */
    const int bks = BK ? P.bk : 1;
    const uint32_t bk_ring = (uint32_t)__cvta_generic_to_shared(q8f_smem) + (uint32_t)P.cols +
                             (uint32_t)(P.cols / 32 * sizeof(float)) + (NORM ? (uint32_t)(P.cols * sizeof(float)) : 0u) +
                             (uint32_t)(warp * bks * Q8F_BK_STAGE),
                   bk_bar = bk_ring - (uint32_t)(warp * bks * Q8F_BK_STAGE) +
                            (uint32_t)(Q8F_WARPS * bks * Q8F_BK_STAGE + warp * bks * 8);
    int64_t bit = item;
    int bst = 0, bslot = 0;
    uint32_t bpar = 0;
    if constexpr (BK) {
        if (lane == 0) {
            for (int u = 0; u < bks; u++) ds4_mbar_init1(bk_bar + 8 * u);
            ds4_mbar_init_fence();
        }
        __syncwarp();
        for (int u = 0; u < bks && bit < item_end && bit < n_items; u++) {
            if (lane == 0)
                q8f_bk_issue(bst / NB ? P.qs[1] : qs0, bst / NB ? P.d[1] : d0, gbase + bit * RPB, P.cols, bst % NB,
                             bk_ring + u * Q8F_BK_STAGE, bk_bar + 8 * u);
            if (++bst == NS) bst = 0, bit += stride;
        }
    } else if (item < n_items) {
        ds4_q8f_load<CPL>(qs0, d0, gbase + item * RPB, P.cols, pkb, lane, w, dw);
    }
    float nw[4]; /* NORM: this thread's norm weights, constants */
    if (NORM) cb_rmsnorm_reg_weights(P.norm_w, (int)P.cols, nw);
    const float hr_omk = HR && (int)threadIdx.x < P.hr.n_rot / 2 ? __ldg(P.hr.om + threadIdx.x) : 0.0f;

    ds4_pdl_enter(); /* from here on the activation is the previous kernel's result */

    const float *xrow = P.x + s * P.x_ld;
    if (NORM) {
        float *xn = (float *)(q8f_smem + P.cols + P.cols / 32 * sizeof(float));
        cb_rmsnorm_reg_row(xrow, P.norm_w, nw, (int)P.cols, P.norm_eps, xn);
        __syncthreads(); /* the quantizer below reads other threads' values */
        xrow = xn;
    }
    if (P.xq) { /* quantized by the kernel before (the hand-off), slot s at s * cols (x_ld = cols) */
        const uint4 *sq = (const uint4 *)(P.xq + s * P.cols);
        const float *sd = P.xd + s * (P.cols / 32);
        for (int i = threadIdx.x; i < (int)(P.cols / 16); i += blockDim.x) ((uint4 *)xq)[i] = __ldcg(sq + i);
        for (int i = threadIdx.x; i < (int)(P.cols / 32); i += blockDim.x) xd[i] = __ldcg(sd + i);
    } else {
        /* quantize x: thread t owns values VPT t .. VPT t + VPT - 1, so a
         * block of 32 spans 32 / VPT neighbouring lanes */
        const float *xs = xrow + (int64_t)threadIdx.x * VPT;
        /* two passes over the thread's values (the second from L1), so
         * that they are not all held in registers beside the prefetched
         * weights */
        float amax = 0.0f;
#pragma unroll
        for (int i = 0; i < VPT; i += 4) {
            const float4 f = *(const float4 *)(xs + i);
            amax = fmaxf(fmaxf(fmaxf(amax, fabsf(f.x)), fmaxf(fabsf(f.y), fabsf(f.z))), fabsf(f.w));
        }
#pragma unroll
        for (int o = 1; o < 32 / VPT; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const float id = ds4_mmvq_q8_0_id(amax);
#pragma unroll
        for (int i = 0; i < VPT; i += 4) {
            const float4 f = *(const float4 *)(xs + i);
            const uint32_t p = (uint32_t)(uint8_t)ds4_mmvq_q8_0_q(f.x, id) |
                               (uint32_t)(uint8_t)ds4_mmvq_q8_0_q(f.y, id) << 8 |
                               (uint32_t)(uint8_t)ds4_mmvq_q8_0_q(f.z, id) << 16 |
                               (uint32_t)(uint8_t)ds4_mmvq_q8_0_q(f.w, id) << 24;
            *(uint32_t *)(xq + threadIdx.x * VPT + i) = p;
        }
        if ((threadIdx.x * VPT) % 32 == 0) xd[threadIdx.x * VPT / 32] = ds4_mmvq_q8_0_d(amax);
    }
    __syncthreads();

    if constexpr (PK) {
        __shared__ float s_pk[Q8F_WARPS / 2][32]; /* the even warps' lane sums */
        const int pair = warp >> 1;
        for (; item < n_items; item += stride) { /* the same items for both warps of a pair */
            float acc = 0.0f;
            if (pkb == 1) { /* the even warp's sums, then the slot is free again */
                asm volatile("bar.sync %0, 64;" ::"r"(1 + pair) : "memory");
                acc = s_pk[pair][lane];
                asm volatile("bar.sync %0, 64;" ::"r"(1 + pair) : "memory");
            }
#pragma unroll
            for (int k = 0; k < Q8F_LOADS; k++) {
                const int c = lane + 32 * (8 * pkb + k);
                const uint4 x = *(const uint4 *)(xq + 16 * c);
                int is = __dp4a((int)w[k].x, (int)x.x, 0);
                is = __dp4a((int)w[k].y, (int)x.y, is);
                is = __dp4a((int)w[k].z, (int)x.z, is);
                is = __dp4a((int)w[k].w, (int)x.w, is);
                acc += ds4_f16(dw[k]) * xd[c >> 1] * (float)is;
            }
            if (item + stride < n_items)
                ds4_q8f_load<CPL>(qs0, d0, gbase + (item + stride) * RPB, P.cols, pkb, lane, w, dw);
            if (pkb == 0) {
                s_pk[pair][lane] = acc;
                asm volatile("bar.sync %0, 64;" ::"r"(1 + pair) : "memory");
                asm volatile("bar.sync %0, 64;" ::"r"(1 + pair) : "memory");
                continue;
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
            if (lane == 0) { /* not `continue`: the warp reaches the next aligned bar.sync whole */
                float *yp = yb + s * P.y_slot_stride + item * RPB;
                if (EPI == DS4_Q8S_ADD) *yp = P.accumulate ? __fadd_rn(*yp, acc) : acc;
                else *yp = acc;
            }
            __syncwarp();
        }
    } else {
        for (; item < item_end && item < n_items; item += stride) {
            float acc[NM][RPB];
#pragma unroll
            for (int m = 0; m < NM; m++)
#pragma unroll
                for (int r = 0; r < RPB; r++) acc[m][r] = 0.0f;
#pragma unroll
            for (int st = 0; st < NS; st++) {
                const int m = st / NB, j = st % NB;
                /* DB: batch st + 1 (or the next item's first) goes out into the
                 * other buffer before batch st is computed */
                uint4 *wc = DB && (st & 1) ? w2 : w;
                uint16_t *dc = DB && (st & 1) ? dw2 : dw;
                if constexpr (BK) {
                    const uint32_t mb = bk_bar + 8 * bslot;
                    ds4_mbar_wait_parity(mb, (bpar >> bslot) & 1u);
                    bpar ^= 1u << bslot;
                    q8f_bk_read(bk_ring + bslot * Q8F_BK_STAGE, lane, w, dw);
                } else if constexpr (DB) {
                    uint4 *wn = (st & 1) ? w : w2;
                    uint16_t *dn = (st & 1) ? dw : dw2;
                    if (st + 1 < NS)
                        ds4_q8f_load<CPL>((st + 1) / NB ? P.qs[1] : qs0, (st + 1) / NB ? P.d[1] : d0,
                                          gbase + item * RPB, P.cols, (st + 1) % NB, lane, wn, dn);
                    else if (item + stride < n_items)
                        ds4_q8f_load<CPL>(qs0, d0, gbase + (item + stride) * RPB, P.cols, 0, lane, wn, dn);
                } else if (st > 0) {
                    ds4_q8f_load<CPL>(m ? P.qs[m] : qs0, m ? P.d[m] : d0, gbase + item * RPB, P.cols, j, lane, w, dw);
                }
#pragma unroll
                for (int k = 0; k < Q8F_LOADS; k++) {
                    const int c = lane + 32 * (CPL < 8 ? k % CPL : 8 * j + k);
                    const uint4 x = *(const uint4 *)(xq + 16 * c);
                    int is = __dp4a((int)wc[k].x, (int)x.x, 0);
                    is = __dp4a((int)wc[k].y, (int)x.y, is);
                    is = __dp4a((int)wc[k].z, (int)x.z, is);
                    is = __dp4a((int)wc[k].w, (int)x.w, is);
                    acc[m][CPL < 8 ? k / CPL : 0] += ds4_f16(dc[k]) * xd[c >> 1] * (float)is;
                }
                if constexpr (BK) { /* the stage's reads are used: the batch P.bk ahead into it */
                    __syncwarp();
                    if (lane == 0 && bit < item_end && bit < n_items) {
                        ds4_fence_async_after_reads();
                        q8f_bk_issue(bst / NB ? P.qs[1] : qs0, bst / NB ? P.d[1] : d0, gbase + bit * RPB, P.cols,
                                     bst % NB, bk_ring + bslot * Q8F_BK_STAGE, bk_bar + 8 * bslot);
                    }
                    if (++bst == NS) bst = 0, bit += stride;
                    bslot = bslot + 1 == bks ? 0 : bslot + 1;
                }
            }
            /* the next item's first loads go out before this one's sums */
            if (!DB && !BK && item + stride < n_items && item + stride < item_end)
                ds4_q8f_load<CPL>(qs0, d0, gbase + (item + stride) * RPB, P.cols, 0, lane, w, dw);
#pragma unroll
            for (int r = 0; r < RPB; r++) {
                float v[NM];
#pragma unroll
                for (int m = 0; m < NM; m++) {
                    float x = acc[m][r];
#pragma unroll
                    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
                    v[m] = x;
                }
                if (lane != 0) continue;
                if constexpr (HC) { /* stored once scaled (q8f_hc_head) */
                    q8f_hc_rows[(item - (int64_t)blockIdx.x * OWN) * RPB + r] = v[0];
                    continue;
                }
                float *yp = yb + s * P.y_slot_stride + item * RPB + r;
                if (EPI == DS4_Q8S_SWIGLU) *yp = ds4_swiglu_clamped(v[0], v[NM - 1], P.clamp);
                else if (EPI == DS4_Q8S_ADD) *yp = P.accumulate ? __fadd_rn(*yp, v[0]) : v[0];
                else *yp = v[0];
                if constexpr (QO) q8f_qo_rows[item & 31] = v[0];
            }
        }
        if constexpr (QO) { /* the block's 32 outputs as one Q8_0 block (warp 0) */
            __syncthreads();
            if (warp == 0 && blockIdx.x * 32 + 32 <= n_items) {
                const float v = q8f_qo_rows[lane];
                float amax = fmaxf(0.0f, fabsf(v)); /* from 0, as the quantizer above: NaN counts as 0 */
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
                const size_t at = (size_t)s * P.y_slot_stride + blockIdx.x * 32 + lane;
                P.qo[at] = (int8_t)ds4_mmvq_q8_0_q(v, ds4_mmvq_q8_0_id(amax));
                if (lane == 0) P.qo_d[at / 32] = ds4_mmvq_q8_0_d(amax);
            }
        }
        if constexpr (HC) {
            if (P.hr.cluster == 2) q8f_hc_head_push(P.hr, P.y, hr_omk, q8f_hc_rows);
            else q8f_hc_head(P.hr, P.y, hr_omk, q8f_hc_rows, q8f_hc_sq);
        }
        else if constexpr (HR) q8f_hr_head(P.hr, P.y, hr_omk, (float *)q8f_smem); /* xq / xd are done with */
    }
}

static bool ds4_q8f_enabled(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_Q8FUSE", &on);
}

/* BK's ring (DS4_CUDA_Q8F_BULK=N: N stages a warp, 2-4; 0, the default:
 * the register forms), on sm_90 and later: the stages a warp for cu, else 0.
 * Opt-in: full size on an H100 2K -1.9% (2 stages) / -3.3% (3), the bits
 * the same (forty-fourth session, docs/BENCHMARKS.md); kept for an H200. */
static int ds4_q8f_bulk(const ds4_cuda *cu)
{
    static int n = -1;
    const int v = ds4_env_choice("DS4_CUDA_Q8F_BULK", &n, 0, "0234");
    return cu->cc_major >= 9 ? v : 0;
}
/* DS4_CUDA_Q8F_BULK_LONG=1: the ring only for rows of 8192 (o_b), where
 * with the ring on every product o_b's in-graph time fell most (12.19 ->
 * 7.58 us, H100, forty-fourth session) and the others rose */
static bool ds4_q8f_bulk_long(void)
{
    static int on = -1;
    return ds4_env_flag_on("DS4_CUDA_Q8F_BULK_LONG", &on);
}
static size_t ds4_q8f_bk_bytes(int stages)
{
    return (size_t)Q8F_WARPS * (size_t)stages * (Q8F_BK_STAGE + 8);
}
/* kernel may take smem bytes of dynamic shared memory (asked once a
 * kernel: *done 1 yes, 2 no) */
static bool ds4_q8f_room(const void *kernel, size_t smem, int *done)
{
    if (smem <= 48 * 1024) return true;
    if (*done == 0) {
        const bool ok = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) == cudaSuccess;
        if (!ok) cudaGetLastError();
        *done = ok ? 1 : 2;
    }
    return *done == 1;
}

static bool ds4_q8f_db_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_Q8F_DB", &on);
}

/* The Q8_0 hand-off (on unless DS4_CUDA_Q8_HANDOFF=0, for A/B runs): full
 * size on an H100, 2K +2.3%, 32K +3.8% (docs/BENCHMARKS.md, thirty-seventh
 * session) */
static bool ds4_q8f_handoff_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_Q8_HANDOFF", &on);
}

/* o_a takes the attention combine's Q8_0 blocks (ops.h
 * attention_out_project, cuda_attn_split.cu; on unless
 * DS4_CUDA_Q8_HANDOFF_A=0, for A/B runs): full size on an H100, 2K +1.0%,
 * 32K +1.0%, in-graph o_a 14.01 -> 12.43 us a layer, the combine 7.91 ->
 * 8.22 (docs/BENCHMARKS.md, thirty-eighth session) */
bool ds4_q8_handoff_a_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_Q8_HANDOFF_A", &on);
}

/* DS4_CUDA_Q8_HANDOFF_S=1: the products of a sublayer take the site's
 * Q8_0 blocks of its input (ops.h sublayer_input, cuda_hc_cluster.cu).
 * Opt-in: it cut the one-stream step by 1.6% but lost 1% at 2K with the
 * side streams (H100, thirty-ninth session, docs/CUDA.md) */
bool ds4_q8_handoff_s_on(void)
{
    static int on = -1;
    return ds4_env_flag_on("DS4_CUDA_Q8_HANDOFF_S", &on);
}

bool ds4_q8_handoff_reserve(ds4_cuda *cu, ds4_q8_handoff *h, int64_t n)
{
    if (n <= 0 || n % 32 != 0) return false;
    if (h->cap >= n) return true;
    /* a new buffer only outside a recording (the WARM step before it sizes
     * every buffer, cuda_graph.cu) */
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(cu->stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) return false;
    if (h->q) cudaFree(h->q);
    if (h->d) cudaFree(h->d);
    h->q = NULL, h->d = NULL, h->cap = 0;
    /* zeros at first: q8m's producers store only their nt tokens' slots
     * (cuda_q8m.cuh), the rest being read as the quantizer's zeros */
    if (cudaMalloc((void **)&h->q, (size_t)n) != cudaSuccess ||
        cudaMalloc((void **)&h->d, (size_t)n / 32 * sizeof(float)) != cudaSuccess ||
        cudaMemsetAsync(h->q, 0, (size_t)n, cu->stream) != cudaSuccess ||
        cudaMemsetAsync(h->d, 0, (size_t)n / 32 * sizeof(float), cu->stream) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    h->cap = n;
    cu->mem_gen++; /* a recorded step holding the old buffers is dropped */
    return true;
}

/* o_a with its outputs' Q8_0 copy (the kernel's QO): a block for every 32
 * rows of a slot. False where the shape or the buffers do not allow it
 * (the caller launches the plain kernel). */
static bool ds4_q8f_go_qo(ds4_cuda *cu, ds4_q8f_params &P, int64_t n_slots)
{
    const int64_t n = n_slots * P.rows;
    if (P.rows % 32 != 0 || P.y_slot_stride != P.rows || P.rows / 32 > 65535) return false;
    if (!ds4_q8_handoff_reserve(cu, &cu->q8o, n)) return false;
    P.qo = cu->q8o.q;
    P.qo_d = cu->q8o.d;
    const size_t smem = (size_t)P.cols + (size_t)P.cols / 32 * sizeof(float);
    const dim3 grid((unsigned)(P.rows / 32), (unsigned)n_slots);
    static int bk_room = 0;
    auto bk_kernel = ds4_q8f_kernel<8, DS4_Q8S_STORE, false, false, false, true, false, false, true>;
    P.bk = ds4_q8f_bulk_long() ? 0 : ds4_q8f_bulk(cu);
    if (P.bk && ds4_q8f_room((const void *)bk_kernel, smem + ds4_q8f_bk_bytes(P.bk), &bk_room))
        ds4_launch(bk_kernel, grid, Q8F_WARPS * 32, smem + ds4_q8f_bk_bytes(P.bk), cu->stream, P);
    else
        ds4_launch(ds4_q8f_kernel<8, DS4_Q8S_STORE, false, false, false, true>, grid, Q8F_WARPS * 32, smem, cu->stream,
                   P);
    cu->q8o.y = P.y;
    cu->q8o.n = n;
    return true;
}

template <int CPL, int EPI, bool DB, bool NORM = false, bool PK = false, bool BK = false>
static void ds4_q8f_go(ds4_cuda *cu, const ds4_q8f_params &P, int64_t n_slots)
{
    static int per_sm = 0;
    const size_t smem = (size_t)P.cols + (size_t)P.cols / 32 * sizeof(float) +
                        (NORM ? (size_t)P.cols * sizeof(float) : 0) + (BK ? ds4_q8f_bk_bytes(P.bk) : 0);
    auto kernel = ds4_q8f_kernel<CPL, EPI, DB, NORM, PK, false, false, false, BK>;
    if (per_sm == 0) {
        int n = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, Q8F_WARPS * 32, smem) != cudaSuccess || n < 1)
            n = 1;
        per_sm = n;
    }
    /* a slot's blocks quantize its activation once each, so few blocks per
     * slot are better; enough of them to fill the GPU at the occupancy */
    const int64_t items = (EPI == DS4_Q8S_PAIR && P.rows2 > P.rows ? P.rows2 : P.rows) / ds4_q8f_shape<CPL>::RPB;
    const int64_t ipb = PK ? Q8F_WARPS / 2 : Q8F_WARPS, need = (items + ipb - 1) / ipb;
    int64_t full = ((int64_t)per_sm * cu->n_sm + n_slots - 1) / n_slots;
    if (full < 1) full = 1;
    const unsigned gx = (unsigned)(need < full ? need : full);
    ds4_launch(kernel, dim3(gx, (unsigned)n_slots), Q8F_WARPS * 32, smem, cu->stream, P);
}

/* ds4_q8f_go with BK's ring where DS4_CUDA_Q8F_BULK asks for it and the
 * kernel may take its shared memory; true when launched. P.bk is set. */
template <int CPL, int EPI, bool NORM = false>
static bool ds4_q8f_go_bk(ds4_cuda *cu, ds4_q8f_params &P, int64_t n_slots)
{
    static int room = 0;
    P.bk = ds4_q8f_bulk_long() && CPL != 16 ? 0 : ds4_q8f_bulk(cu);
    const size_t smem = (size_t)P.cols + (size_t)P.cols / 32 * sizeof(float) +
                        (NORM ? (size_t)P.cols * sizeof(float) : 0) + ds4_q8f_bk_bytes(P.bk);
    if (!P.bk ||
        !ds4_q8f_room((const void *)ds4_q8f_kernel<CPL, EPI, false, NORM, false, false, false, false, true>, smem, &room))
        return false;
    ds4_q8f_go<CPL, EPI, false, NORM, false, true>(cu, P, n_slots);
    return true;
}

/* The double-buffered form for the SwiGLU's two matrices (the shared
 * expert's gate and up: 9.1 -> 8.4 us a layer under ncu, H200), not for
 * rows of 8192 (o_b): there the second buffer spilled registers and the
 * kernel was slower (15.2 -> 16.9 us; docs/BENCHMARKS.md, seventh session).
 * DS4_CUDA_Q8F_DB=0: one buffer, for A/B. */
/* Rows of 8192 (two batches) in warp pairs (the kernel's PK; the same
 * bits); DS4_CUDA_Q8F_PAIRK=0: a warp a row, for A/B */
static bool ds4_q8f_pairk_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_Q8F_PAIRK", &on);
}

template <int CPL, int EPI>
static void ds4_q8f_launch(ds4_cuda *cu, ds4_q8f_params &P, int64_t n_slots)
{
    constexpr bool several = EPI == DS4_Q8S_SWIGLU && ds4_q8f_shape<CPL>::NB == 1;
    constexpr bool pairs = EPI != DS4_Q8S_SWIGLU && ds4_q8f_shape<CPL>::NB == 2;
    if (ds4_q8f_go_bk<CPL, EPI>(cu, P, n_slots)) return;
    if (several && ds4_q8f_db_on()) ds4_q8f_go<CPL, EPI, several>(cu, P, n_slots);
    else if (pairs && ds4_q8f_pairk_on()) ds4_q8f_go<CPL, EPI, false, false, pairs>(cu, P, n_slots);
    else ds4_q8f_go<CPL, EPI, false>(cu, P, n_slots);
}

template <int EPI>
static void ds4_q8f_launch_cpl(ds4_cuda *cu, ds4_q8f_params &P, int64_t n_slots)
{
    switch (P.cols / 512) {
    case 2: ds4_q8f_launch<2, EPI>(cu, P, n_slots); break;
    case 4: ds4_q8f_launch<4, EPI>(cu, P, n_slots); break;
    case 8: ds4_q8f_launch<8, EPI>(cu, P, n_slots); break;
    default: ds4_q8f_launch<16, EPI>(cu, P, n_slots); break;
    }
}

/* The shapes the kernel takes: cols a multiple of 512 with 2-16 chunks of
 * 512 per lane, whole row batches. */
static bool ds4_q8f_shape_ok(int64_t rows, int64_t cols)
{
    const int64_t cpl = cols / 512;
    if (cols % 512 != 0 || (cpl != 2 && cpl != 4 && cpl != 8 && cpl != 16)) return false;
    const int64_t rpb = cpl < 8 ? 8 / cpl : 1;
    return rows >= 1 && rows % rpb == 0;
}

int ds4_q8split_fused_pair(ds4_cuda *cu, const void *w1, int64_t rows1, float *y1, const void *w2, int64_t rows2,
                           float *y2, int64_t cols, const float *x, int launch)
{
    if (!ds4_q8f_enabled() || !ds4_q8f_shape_ok(rows1, cols) || !ds4_q8f_shape_ok(rows2, cols)) return 0;
    if (((uintptr_t)x & 15u) != 0) return 0;
    ds4_q8f_params P;
    memset(&P, 0, sizeof P);
    const void *w[2] = {w1, w2};
    const int64_t rows[2] = {rows1, rows2};
    for (int m = 0; m < 2; m++) {
        int64_t total_rows = 0;
        const uint8_t *split = ds4_q8split_find(cu->device, w[m], rows[m], cols, &total_rows);
        if (!split) return 0;
        P.qs[m] = split;
        P.d[m] = (const uint16_t *)(split + total_rows * cols);
    }
    if (!launch) return 1;
    if (cu->q8s.y && x == cu->q8s.y && cols == cu->q8s.n) { /* the sublayer's input, the site's blocks */
        P.xq = cu->q8s.q;
        P.xd = cu->q8s.d;
    }
    P.rows = rows1;
    P.rows2 = rows2;
    P.cols = cols;
    P.n_group = 1;
    P.x = x;
    P.y = y1;
    P.y2 = y2;
    ds4_q8f_launch_cpl<DS4_Q8S_PAIR>(cu, P, 2);
    return 1;
}

/* The kernel's parameters for a (false: not covered) */
static bool ds4_q8f_prepare(ds4_cuda *cu, const ds4_q8f_args *a, int epi, ds4_q8f_params *P)
{
    if (!ds4_q8f_enabled()) return false;
    if (epi != DS4_Q8S_STORE && epi != DS4_Q8S_ADD && epi != DS4_Q8S_SWIGLU) return false;
    const int64_t cpl = a->cols / 512;
    if (a->cols % 512 != 0 || (cpl != 2 && cpl != 4 && cpl != 8 && cpl != 16)) return false;
    const int64_t rpb = cpl < 8 ? 8 / cpl : 1;
    if (a->rows < 1 || a->rows % rpb != 0 || a->n_slots < 1 || a->n_slots > 65535) return false;
    if (((uintptr_t)a->x & 15u) != 0 || (a->n_slots > 1 && a->x_ld % 4 != 0)) return false;
    /* NORM: the rmsnorm op's thread count for a row of 1024
     * (cb_row_threads) is the kernel's; one slot, stored */
    if (a->norm_w && (a->cols != 1024 || a->n_slots != 1 || epi != DS4_Q8S_STORE || a->n_group > 1 ||
                      ((uintptr_t)a->norm_w & 15u) != 0))
        return false;
    const int nmat = epi == DS4_Q8S_SWIGLU ? 2 : 1;
    const int64_t rows_needed = a->rows * (a->n_group > 1 ? a->n_group : 1);
    memset(P, 0, sizeof *P);
    for (int m = 0; m < nmat; m++) {
        int64_t total_rows = 0;
        const uint8_t *split = ds4_q8split_find(cu->device, a->w[m], rows_needed, a->cols, &total_rows);
        if (!split) return false;
        P->qs[m] = split;
        P->d[m] = (const uint16_t *)(split + total_rows * a->cols);
    }
    if (nmat == 1) {
        P->qs[1] = P->qs[0];
        P->d[1] = P->d[0];
    }
    P->rows = a->rows;
    P->cols = a->cols;
    P->n_group = a->n_group;
    P->x = a->x;
    P->x_ld = a->x_ld;
    P->y = a->y;
    P->y_slot_stride = a->y_slot_stride;
    P->clamp = a->clamp;
    P->accumulate = a->accumulate;
    P->norm_w = a->norm_w;
    P->norm_eps = a->norm_eps;
    return true;
}

int ds4_q8split_fused_run(ds4_cuda *cu, const ds4_q8f_args *a, int epi)
{
    ds4_q8f_params P;
    if (a->norm_w || !ds4_q8f_prepare(cu, a, epi, &P)) return 0;
    /* the hand-off (ds4_cuda's q8o): x made by the product before with its
     * Q8_0 copy; this product's own outputs with theirs where asked */
    if (cu->q8o.y && a->x == cu->q8o.y && a->n_slots == 1 && a->cols == cu->q8o.n) {
        P.xq = cu->q8o.q;
        P.xd = cu->q8o.d;
    } else if (cu->q8a.y && a->x == cu->q8a.y && a->x_ld == a->cols && a->n_slots * a->cols == cu->q8a.n) {
        P.xq = cu->q8a.q; /* the attention's output, the combine's blocks (o_a) */
        P.xd = cu->q8a.d;
    } else if (cu->q8s.y && a->x == cu->q8s.y && a->n_slots == 1 && a->cols == cu->q8s.n) {
        P.xq = cu->q8s.q; /* the sublayer's input, the site's blocks (kept for the sublayer's other products) */
        P.xd = cu->q8s.d;
    }
    cu->q8o.y = NULL; /* offered to the next product only */
    cu->q8a.y = NULL;
    if (cu->q8o.want && ds4_q8f_handoff_on() && epi == DS4_Q8S_STORE && a->cols == 4096 && a->n_group > 1 &&
        a->n_slots == a->n_group && ds4_q8f_go_qo(cu, P, a->n_slots))
        return 1;
    switch (epi) {
    case DS4_Q8S_STORE: ds4_q8f_launch_cpl<DS4_Q8S_STORE>(cu, P, a->n_slots); break;
    case DS4_Q8S_ADD: ds4_q8f_launch_cpl<DS4_Q8S_ADD>(cu, P, a->n_slots); break;
    default: ds4_q8f_launch_cpl<DS4_Q8S_SWIGLU>(cu, P, a->n_slots); break;
    }
    return 1;
}

/* HR's cluster form (HC): clusters of 4 blocks a head of 512 (the op's 128
 * threads), the kv row in a last cluster, with programmatic dependent
 * launch when that is on. False where it does not apply or the clusters
 * would not all be resident at once (the caller takes the ticket form). */
template <bool BK>
static bool ds4_q8f_go_hc(ds4_cuda *cu, const ds4_q8f_params &P, int64_t rows, size_t smem)
{
    const ds4_q8f_rope &r = P.hr;
    if (cu->cc_major < 9 || r.head_dim != 512 || r.nt != 128 || r.n_rot > 128) return false;
    auto kernel = ds4_q8f_kernel<2, DS4_Q8S_STORE, false, true, false, false, true, true, BK>;
    static int smem_room = 0;
    if (!ds4_q8f_room((const void *)kernel, smem, &smem_room)) return false;
    /* refused or without room: the ticket form takes the launch */
    static int room[32] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                           -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
    return ds4_launch_clusters(cu, kernel, (unsigned)(rows / 128 + 4), Q8F_WARPS * 32, smem, 4, room, P);
}

int ds4_q8split_fused_norm_rope(ds4_cuda *cu, const ds4_q8f_args *a, const ds4_q8f_rope *r, int launch)
{
    ds4_q8f_params P;
    const int hd = r->head_dim;
    if (!a->norm_w || !r->cnt || !r->om || !r->kv || hd < 128 || hd > 1024 || hd % 128 != 0 || a->rows % hd != 0 ||
        r->nt < 32 || r->nt > Q8F_WARPS * 32 || r->nt % 32 != 0 || 4 * r->nt < hd || r->n_rot < 2 || r->n_rot % 2 != 0 ||
        r->n_rot > hd || r->n_rot / 2 > r->nt || a->rows / 128 + 1 > 65535)
        return 0;
    if (!ds4_q8f_prepare(cu, a, DS4_Q8S_STORE, &P)) return 0;
    if (!launch) return 1;
    P.hr = *r;
    /* the NORM form's shared memory: a head row (4 hd <= 4096 bytes) fits it after the product */
    const size_t smem = (size_t)P.cols + (size_t)P.cols / 32 * sizeof(float) + (size_t)P.cols * sizeof(float);
    const dim3 grid((unsigned)(a->rows / 128 + 1));
    static int bk_room = 0;
    auto bk_kernel = ds4_q8f_kernel<2, DS4_Q8S_STORE, false, true, false, false, true, false, true>;
    P.bk = ds4_q8f_bulk_long() ? 0 : ds4_q8f_bulk(cu);
    const size_t smem_bk = smem + ds4_q8f_bk_bytes(P.bk);
    if (P.bk && !ds4_q8f_room((const void *)bk_kernel, smem_bk, &bk_room)) P.bk = 0;
    if (r->cluster && (P.bk ? ds4_q8f_go_hc<true>(cu, P, a->rows, smem_bk) : ds4_q8f_go_hc<false>(cu, P, a->rows, smem)))
        return 1;
    if (P.bk) ds4_launch(bk_kernel, grid, Q8F_WARPS * 32, smem_bk, cu->stream, P);
    else
        ds4_launch(ds4_q8f_kernel<2, DS4_Q8S_STORE, false, true, false, false, true>, grid, Q8F_WARPS * 32, smem,
                   cu->stream, P);
    return 1;
}

int ds4_q8split_fused_norm(ds4_cuda *cu, const ds4_q8f_args *a, int launch)
{
    ds4_q8f_params P;
    if (!a->norm_w || !ds4_q8f_prepare(cu, a, DS4_Q8S_STORE, &P)) return 0;
    if (launch && !ds4_q8f_go_bk<2, DS4_Q8S_STORE, true>(cu, P, 1)) ds4_q8f_go<2, DS4_Q8S_STORE, false, true>(cu, P, 1);
    return 1;
}

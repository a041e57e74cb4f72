/*
 * cuda_fmv_iq.cu - the lightning indexer's queries of one token in one
 * launch (ops.h indexer_query_rope): the q_b product of the normalized
 * q_a output (F16 or BF16, 1024 columns, heads of 128), each head's RoPE
 * on its last n_rot values and its QAT round trip (§3.6, D2).
 *
 * Why: in a CSA layer that scores, those were three launches on the query
 * path, 8.4 + 2.4 + 3.5 us (the normalizing float matvec, the rope op, the
 * QAT op; one-stream kernel times, H100, 30 layers, forty-first session),
 * the RoPE and QAT for 64 rows of 128 floats each. A head's 128 rows are
 * one block's here, so the block has the whole head in shared memory when
 * its rows are done and rotates and rounds it there: no second pass, no
 * exchange between blocks.
 *
 * The bits are those of the three ops: x normalized with the rmsnorm op's
 * code at its thread count (cb_rmsnorm_reg_row at 256 threads, as
 * ds4_fmv_kernel's NORM form), each row's sum as that kernel takes it with
 * a warp a row (lane j adds units j, j + 32, ... in order with
 * ds4_fmv_dot, then the butterfly xor 16 .. 1), the pair rotation of the
 * rope op (cb_rope_pair) and the QAT op's row code (cb_indexer_qat_row).
 * tests/test_cuda_ops.c holds the op to the three ops bit for bit.
 *
 * A head is 64 blocks' worth of bandwidth only if each warp keeps enough
 * loads in flight: a warp takes its 16 rows 4 at a time (16 16-byte loads a
 * lane), the next 4 rows' loads issued before the current ones are summed,
 * and the first 8 rows' loads go out before the wait on the previous kernel
 * (the weights are read-only).
 *
 * DS4_CUDA_IDX_QROPE=2 (opt-in): a head over a cluster of two blocks, 64
 * rows each, so that the 64 heads take 128 SMs, not 64 (one block a head
 * read its 16 MB at 1.74 TB/s in-graph, H100, forty-fourth session), and
 * each warp's 8 rows are all asked for before the wait. The second block
 * holds the head's last 64 values, so it makes the RoPE (n_rot <= 64) on
 * its own, reads the first block's 64 from that block's shared memory
 * and rounds the head; the same sums, rotations and rounding, so the
 * same bits.
 */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_fmv.cuh"
#include "backend/cuda/cuda_mq_device.cuh"
#include "backend/cuda/cuda_numerics.cuh"
#include "backend/cuda/cuda_rmsnorm_row.cuh"
#include "backend/cuda/cuda_rope_row.cuh"

#include <string.h>

#define IQ_WARPS 8
#define IQ_THREADS (IQ_WARPS * 32)
#define IQ_HEAD 128                      /* rows a block takes: one head */
#define IQ_COLS 1024                     /* the normalized q_a row (the rmsnorm op's 256 threads) */
#define IQ_ROWS 4                        /* rows a warp takes at once */
#define IQ_UPL 4                         /* 16-byte units a lane takes of a row: 2048 bytes / 16 / 32 */

struct ds4_fmv_iq_params {
    const uint8_t *w; /* [n_heads * 128 rows][1024] halves */
    const float *x, *norm_w;
    float eps;
    float *y; /* n_heads * 128 */
    const float *om;
    const int64_t *d_pos;
    int64_t pos;
    int n_rot, qat;
};

/* The 4 rows of batch b of this warp, units lane + 32 k of each. */
__device__ __forceinline__ void iq_load(const uint8_t *w, int64_t row0, int lane, uint4 (&v)[IQ_ROWS][IQ_UPL])
{
#pragma unroll
    for (int r = 0; r < IQ_ROWS; r++) {
        const uint4 *wr = (const uint4 *)(w + (row0 + r) * (int64_t)(IQ_COLS * 2));
#pragma unroll
        for (int k = 0; k < IQ_UPL; k++) v[r][k] = __ldcs(wr + lane + 32 * k);
    }
}

/* Rows row0 .. row0 + 3 summed into s_rows: WS, the 4 sums by
 * ds4_warp_sums (6 shuffles; lanes 8 r .. 8 r + 7 hold row r's, the
 * butterfly's bits), else a butterfly a row (20; lane 0 stores). */
template <int T, bool WS>
__device__ __forceinline__ void iq_sum(const uint4 (&v)[IQ_ROWS][IQ_UPL], const float *xn, int lane, float *s_rows)
{
    float acc[IQ_ROWS];
#pragma unroll
    for (int r = 0; r < IQ_ROWS; r++) acc[r] = 0.0f;
#pragma unroll
    for (int k = 0; k < IQ_UPL; k++) {
        const float *xp = xn + (lane + 32 * k) * 8;
        const float4 a = *(const float4 *)xp, b = *(const float4 *)(xp + 4);
        const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int r = 0; r < IQ_ROWS; r++) {
            float wv[8];
            ds4_fmv_decode<T>(v[r][k], wv);
            acc[r] = ds4_fmv_dot<T>(wv, xv, acc[r]);
        }
    }
    if constexpr (WS) {
        const float s = ds4_warp_sums<IQ_ROWS>(acc, lane);
        if ((lane & (32 / IQ_ROWS - 1)) == 0) s_rows[ds4_warp_sums_index<IQ_ROWS>(lane)] = s;
    } else {
#pragma unroll
        for (int r = 0; r < IQ_ROWS; r++) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
            if (lane == 0) s_rows[r] = acc[r];
        }
    }
}

/* CL: blocks a head (1, or 2 as a cluster); block rank q of a head takes
 * its rows 64 q .. 64 q + 63 (CL 2) into s_rows at the same places. WS:
 * iq_sum's. */
template <int T, int CL, bool WS = true> __global__ void __launch_bounds__(IQ_THREADS) ds4_fmv_iq_kernel(const ds4_fmv_iq_params P)
{
    static_assert(ds4_fmv_t<T>::VPU == 8 && IQ_UPL * 32 * 16 == IQ_COLS * 2, "rows of 1024 halves");
    enum { RB = IQ_HEAD / CL, RW = RB / IQ_WARPS, IQ_BATCHES = RW / IQ_ROWS };
    static_assert(IQ_BATCHES >= 2, "two batches a warp in flight");
    __shared__ __align__(16) float s_xn[IQ_COLS];
    __shared__ float s_rows[IQ_HEAD];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int64_t head = blockIdx.x / CL;
    const int q = CL == 1 ? 0 : (int)(blockIdx.x % CL); /* the cluster is CL consecutive blocks */
    const int64_t row0 = head * IQ_HEAD + q * RB + warp * RW;
    uint4 va[IQ_ROWS][IQ_UPL], vb[IQ_ROWS][IQ_UPL];
    iq_load(P.w, row0, lane, va);
    iq_load(P.w, row0 + IQ_ROWS, lane, vb);
    float nw[4];
    cb_rmsnorm_reg_weights(P.norm_w, IQ_COLS, nw);
    const float omk = tid < P.n_rot / 2 ? __ldg(P.om + tid) : 0.0f;

    ds4_pdl_enter(); /* x is the previous kernel's */

    cb_rmsnorm_reg_row(P.x, P.norm_w, nw, IQ_COLS, P.eps, s_xn);
    __syncthreads(); /* every row reads every thread's values */
    float *mine = s_rows + q * RB + warp * RW;
#pragma unroll
    for (int b = 0; b < IQ_BATCHES; b++) {
        /* batch b + 2 goes out into b's buffer once b is summed */
        if (b & 1) {
            iq_sum<T, WS>(vb, s_xn, lane, mine + IQ_ROWS * b);
            if (b + 2 < IQ_BATCHES) iq_load(P.w, row0 + IQ_ROWS * (b + 2), lane, vb);
        } else {
            iq_sum<T, WS>(va, s_xn, lane, mine + IQ_ROWS * b);
            if (b + 2 < IQ_BATCHES) iq_load(P.w, row0 + IQ_ROWS * (b + 2), lane, va);
        }
    }
    __syncthreads(); /* the block's values are in (CL 1: the head's 128) */
    if (q == CL - 1 && tid < P.n_rot / 2) /* CL 2: n_rot <= 64, all in the last block's rows */
        cb_rope_pair(s_rows + (IQ_HEAD - P.n_rot) + 2 * tid, cb_pos(P.d_pos, P.pos), omk, 0);
    if constexpr (CL == 2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        /* the first block's 64 values (its arrival releases them) into the
         * second's s_rows; the first leaves only after they are read */
        ds4_cluster_arrive();
        ds4_cluster_wait();
        if (q == 1 && warp == 0) {
            const uint32_t a = ds4_cluster_map((uint32_t)__cvta_generic_to_shared(s_rows), 0);
#pragma unroll
            for (int i = lane; i < RB; i += 32) {
                float v;
                asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(a + 4u * (uint32_t)i));
                s_rows[i] = v;
            }
        }
        ds4_cluster_arrive();
        if (q == 0) {
            ds4_cluster_wait();
            return;
        }
#endif
    }
    __syncthreads();
    if (warp != 0) {
        if (CL == 2) ds4_cluster_wait();
        return;
    }
    if (P.qat) cb_indexer_qat_row<true>(s_rows);
    float *y = P.y + head * IQ_HEAD;
#pragma unroll
    for (int i = lane; i < IQ_HEAD; i += 32) y[i] = s_rows[i];
    if (CL == 2) ds4_cluster_wait();
}

/* DS4_CUDA_IDX_QROPE=2: the pairs' form (clusters of two blocks a head) */
static bool iq_pairs_on(void)
{
    static int mode = -1;
    return ds4_env_choice("DS4_CUDA_IDX_QROPE", &mode, 1, "012") == 2;
}

/* The pairs' form's launch: false where the device, n_rot or the room for
 * the clusters does not allow it (the caller launches a block a head). */
template <int T> static bool iq_go_pairs(ds4_cuda *cu, const ds4_fmv_iq_params &P, int64_t heads)
{
    if (cu->cc_major < 9 || P.n_rot > IQ_HEAD / 2) return false;
    static int room[32] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                           -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
    return ds4_launch_clusters(cu, ds4_fmv_iq_kernel<T, 2>, (unsigned)(2 * heads), IQ_THREADS, 0, 2, room, P);
}

extern "C" int ds4_cuda_fmv_index_query(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows, int64_t cols,
                                        const float *x, const float *norm_w, float eps, float *y, int head_dim,
                                        int n_rot, const float *om, const int64_t *d_pos, int64_t pos, int qat,
                                        int launch)
{
    if ((type != DS4_TYPE_F16 && type != DS4_TYPE_BF16) || !ds4_cuda_fmv_active(type, d_w, cols) ||
        cols != IQ_COLS || head_dim != IQ_HEAD || rows < IQ_HEAD || rows % IQ_HEAD != 0 || rows / IQ_HEAD > 65535 ||
        n_rot < 2 || n_rot % 2 != 0 || n_rot > IQ_HEAD || !norm_w || !om || (uintptr_t)x % 16 != 0 ||
        ds4_cuda_fmv_warps_per_row(cu, rows) != 1) /* the plain kernel's rows a warp each: its sums */
        return 0;
    if (!launch) return 1;
    ds4_fmv_iq_params P;
    memset(&P, 0, sizeof P);
    P.w = (const uint8_t *)d_w;
    P.x = x;
    P.norm_w = norm_w;
    P.eps = eps;
    P.y = y;
    P.om = om;
    P.d_pos = d_pos;
    P.pos = pos;
    P.n_rot = n_rot;
    P.qat = qat;
    const int64_t heads = rows / IQ_HEAD;
    if (iq_pairs_on() && (type == DS4_TYPE_F16 ? iq_go_pairs<DS4_TYPE_F16>(cu, P, heads)
                                               : iq_go_pairs<DS4_TYPE_BF16>(cu, P, heads)))
        return 1;
    const dim3 grid((unsigned)heads);
    const bool ws = ds4_warp_sums_on();
    if (type == DS4_TYPE_F16)
        ds4_launch(ws ? ds4_fmv_iq_kernel<DS4_TYPE_F16, 1, true> : ds4_fmv_iq_kernel<DS4_TYPE_F16, 1, false>, grid,
                   IQ_THREADS, 0, cu->stream, P);
    else
        ds4_launch(ws ? ds4_fmv_iq_kernel<DS4_TYPE_BF16, 1, true> : ds4_fmv_iq_kernel<DS4_TYPE_BF16, 1, false>, grid,
                   IQ_THREADS, 0, cu->stream, P);
    return 1; /* a launch error is the caller's cb_check_launch's to report */
}

/*
 * cuda_q8split_mma_stream.cu - the tensor-core product of 9-16 tokens on a
 * split-layout Q8_0 matrix (cuda_q8split_mma.cu) with its weights streamed
 * through a cp.async ring, for the products with tiles for every SM (8
 * warps a tile: q_b, o_a, o_b and the LM head of a 16-session step).
 *
 * Why: the round-by-round kernel gives a warp two 16-row blocks of 32
 * columns (1 KB) in flight and then waits for them; a block owns one
 * 16-row tile and ends after it. ncu (nineteenth session, the 8-layer
 * model's 16-session step) put q_b, o_a and o_b (35.7 MB each) at 30.4,
 * 25.7 and 25.5 us (1.2-1.4 TB/s) where one token's kernel reads them in
 * 11-15 us, and the 563 MB LM head at ~350 us. This kernel takes them in
 * 26.2, 22.6, 22.0 and ~297 us: each 16-row tile reads as many activation
 * bytes as weight bytes, so a step moves twice the matrix through L2, and
 * that, not the copy pattern, is what is left (docs/CUDA.md).
 *
 * How: a block takes tiles blockIdx.x, blockIdx.x + gridDim.x, ... of its
 * group (grid: the blocks that are resident at once) and walks one flat
 * sequence of steps (tile, matrix, round). A step is one round (16 Q8_0
 * blocks) of the tile's 16 rows: 8 KB of weights (each row's 512 bytes a
 * contiguous run, copied by 32 neighbouring threads), the rows' scales,
 * the activation's fragment words and token scales, copied by cp.async
 * into a ring of ST stages ST - 1 steps ahead of the one computed (one
 * block barrier a step). So loads cross round, matrix and tile
 * boundaries, and a tile's reduction runs while the next steps arrive.
 * The weights are constants: the first stages' weight copies go out
 * before the programmatic-launch wait, the activation's after it.
 * (A first form gave each warp its own ring of its two blocks' 16 rows x
 * 32 bytes: 32-byte pieces 1-8 KB apart; it took q_b, o_a and o_b in
 * 26.7, 22.3 and 22.2 us against the round-by-round kernel's 30.4, 25.7
 * and 25.5, ncu, nineteenth session.)
 *
 * The arithmetic is the round-by-round kernel's (qm_pair_add, qm_to_smem,
 * qm_from_smem of cuda_q8m.cuh) in the same order, so the results are the
 * same bits; test_cuda_kernels' q8 mma tests hold them to each token's
 * one-token product. DS4_CUDA_Q8M_STREAM=0 keeps the round-by-round kernel
 * (read once).
 */
#include "backend/cuda/cuda_blocks.cuh"
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_mmvq.cuh"
#include "backend/cuda/cuda_mq_device.cuh"
#include "backend/cuda/cuda_q8m.cuh"

#include <stdlib.h>

/* A stage: one round (16 Q8_0 blocks of 32 columns) of the tile's 16
 * rows: the weight bytes (row r's 512 at 512 r, block b's 32 at the
 * swizzled place 32 (b ^ r), so that the 8 rows a fragment load reads
 * fall on different banks), the activation's 16 x 512 fragment bytes, its
 * 16 x 16 token scales and the rows' 16 f16 scales each. */
enum { QS_W = 0, QS_X = 8192, QS_XD = 16384, QS_D = 17408, QS_STAGE = 17920 };
#define QS_STAGES 4

__device__ __forceinline__ void qs_cp16(uint32_t sa, const void *gmem)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(gmem) : "memory");
}
__device__ __forceinline__ uint2 qs_lds64(uint32_t a)
{
    uint2 v;
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(a));
    return v;
}

/* A block's position in its steps: the tile's first row in the group, the
 * matrix and the round; stepped by one (no division per step). */
struct qs_step {
    int64_t r0;
    int m, r;
};
__device__ __forceinline__ void qs_next(qs_step &s, int R, int NM)
{
    if (++s.r < R) return;
    s.r = 0;
    if (++s.m < NM) return;
    s.m = 0;
    s.r0 += (int64_t)gridDim.x * QM_ROWS;
}

/* The thread's share of a step's 16-byte copies into stage sb, every
 * piece's source run contiguous across neighbouring threads: the weights
 * (piece i: row i / 32, 16 bytes i % 32 of the round's 512) and scales
 * (WX: the constants, which may be copied before the programmatic-launch
 * wait), or the activation and its token scales (!WX). */
template <int NT, bool WX>
__device__ __forceinline__ void qs_issue(const ds4_q8m_params &P, const qs_step &s, int64_t grp, int nblk, int tid,
                                         uint32_t sb)
{
    if constexpr (WX) {
        const uint8_t *qs = s.m ? P.qs[1] : P.qs[0];
        const uint16_t *d = s.m ? P.d[1] : P.d[0];
        const int64_t row0 = grp * P.rows + s.r0;
        for (int i = tid; i < 512 + 32; i += NT) {
            if (i < 512) {
                const int rr = i >> 5, c = i & 31;
                qs_cp16(sb + QS_W + 512 * rr + 32 * ((c >> 1) ^ rr) + 16 * (c & 1),
                        qs + (row0 + rr) * P.cols + 512 * (int64_t)s.r + 16 * c);
            } else {
                const int rr = (i - 512) >> 1, h = (i - 512) & 1;
                qs_cp16(sb + QS_D + 32 * rr + 16 * h, d + (row0 + rr) * nblk + QM_PAIRS * s.r + 8 * h);
            }
        }
    } else {
        const int64_t blk0 = grp * nblk + QM_PAIRS * s.r;
        for (int i = tid; i < 512 + 64; i += NT) {
            if (i < 512) qs_cp16(sb + QS_X + 16 * i, P.xq + blk0 * 32 + i);
            else qs_cp16(sb + QS_XD + 16 * (i - 512), P.xd + blk0 * QM_TOK + 4 * (i - 512));
        }
    }
}

/* Block: W warps, the tiles blockIdx.x + gridDim.x i of group blockIdx.y.
 * Shared memory: s_t (W x 2 KB), then the ring of ST stages. */
template <int W, int EPI, int ST>
__global__ void __launch_bounds__(W * 32, W == 8 ? 2 : 1) ds4_q8m_stream_kernel(const ds4_q8m_params P)
{
    enum { NM = EPI == DS4_Q8S_SWIGLU ? 2 : 1, PW = QM_PAIRS / W, NT = W * 32 };
    extern __shared__ __align__(16) uint8_t qs_smem[];
    float(*s_t)[2][QM_TOK][QM_ROWS] = (float(*)[2][QM_TOK][QM_ROWS])qs_smem;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, q = lane & 3, o = threadIdx.x;
    const int64_t grp = blockIdx.y;
    const int nblk = (int)(P.cols / 32), R = nblk / QM_PAIRS;
    const int64_t tiles = P.rows / QM_ROWS;
    const int64_t my_tiles = tiles > (int64_t)blockIdx.x ? (tiles - 1 - (int64_t)blockIdx.x) / gridDim.x + 1 : 0;
    const int n_steps = (int)(my_tiles * NM * R);
    const uint32_t ring = (uint32_t)__cvta_generic_to_shared(qs_smem + W * 2048);
    const bool lo = q < 2; /* the thread's own 8 bytes are of chunk 0 */

    /* the first ST - 1 steps' weights before the wait, their activation after */
    const qs_step first = {(int64_t)blockIdx.x * QM_ROWS, 0, 0};
    qs_step si = first; /* the next step to copy */
    for (int t = 0; t < ST - 1 && t < n_steps; t++, qs_next(si, R, NM))
        qs_issue<NT, true>(P, si, grp, nblk, o, ring + t * QS_STAGE);
    ds4_pdl_enter();
    si = first;
    for (int t = 0; t < ST - 1; t++, qs_next(si, R, NM)) {
        if (t < n_steps) qs_issue<NT, false>(P, si, grp, nblk, o, ring + t * QS_STAGE);
        ds4_mq_cp_commit();
    }

    float acc[PW][2][8];
#pragma unroll
    for (int j = 0; j < PW; j++)
#pragma unroll
        for (int p = 0; p < 16; p++) acc[j][p >> 3][p & 7] = 0.0f;
    float gate = 0.0f;
    qs_step s = first; /* the step computed */
    int slot = 0, slot_n = ST - 1;
    for (int t = 0; t < n_steps; t++) {
        ds4_mq_cp_wait<ST - 2>(); /* this thread's copies of step t are in */
        __syncthreads();          /* ... every thread's, and step t - 1 is computed */
        if (t + ST - 1 < n_steps) { /* into the stage of step t - 1 */
            const uint32_t sb = ring + (uint32_t)slot_n * QS_STAGE;
            qs_issue<NT, true>(P, si, grp, nblk, o, sb);
            qs_issue<NT, false>(P, si, grp, nblk, o, sb);
            qs_next(si, R, NM);
        }
        slot_n = slot_n == ST - 1 ? 0 : slot_n + 1;
        ds4_mq_cp_commit();
        const uint32_t sb = ring + (uint32_t)slot * QS_STAGE;
        slot = slot == ST - 1 ? 0 : slot + 1;
#pragma unroll
        for (int j = 0; j < PW; j++) {
            const int b = w + W * j; /* this pair's block of the round */
            const uint2 v0 = qs_lds64(sb + QS_W + 512 * g + 32 * (b ^ g) + 8 * q),
                        v1 = qs_lds64(sb + QS_W + 512 * (g + 8) + 32 * (b ^ (g + 8)) + 8 * q);
            const uint4 xv = ds4_lds128(sb + QS_X + 512 * b + 16 * lane);
            const uint2 d0 = qs_lds64(sb + QS_XD + 64 * b + 8 * q), d1 = qs_lds64(sb + QS_XD + 64 * b + 32 + 8 * q);
            const float2 dx0 = make_float2(__uint_as_float(d0.x), __uint_as_float(d0.y)),
                         dx1 = make_float2(__uint_as_float(d1.x), __uint_as_float(d1.y));
            const float fw0 = ds4_f16(ds4_lds_u16(sb + QS_D + 32 * g + 2 * b)),
                        fw1 = ds4_f16(ds4_lds_u16(sb + QS_D + 32 * (g + 8) + 2 * b));
            qm_pair_add(v0, v1, xv, dx0, dx1, fw0, fw1, lo, acc[j]);
        }
        const qs_step done = s;
        qs_next(s, R, NM);
        if (done.r + 1 < R) continue;

        /* the end of a matrix of the tile: its sums, as the round-by-round kernel's */
        qm_to_smem<PW>(acc, s_t, w, g, q);
        __syncthreads();
        const int row = o % QM_ROWS, tok = o / QM_ROWS;
        const float v = tok < P.nt ? qm_from_smem<W>(s_t, tok, row) : 0.0f; /* W >= 8: one output a thread at most */
        if (done.m + 1 < NM) {
            gate = v;
        } else if (tok < P.nt) {
            float *yp = P.y + grp * P.y_grp_stride + (int64_t)tok * P.y_tok_stride + done.r0 + row;
            if (EPI == DS4_Q8S_SWIGLU) *yp = ds4_swiglu_clamped(gate, v, P.clamp);
            else if (EPI == DS4_Q8S_ADD) *yp = P.accumulate ? __fadd_rn(*yp, v) : v;
            else *yp = v;
        }
        __syncthreads(); /* s_t is the next matrix's */
#pragma unroll
        for (int j = 0; j < PW; j++)
#pragma unroll
            for (int p = 0; p < 16; p++) acc[j][p >> 3][p & 7] = 0.0f;
    }
    ds4_mq_cp_wait<0>(); /* no copy outlives the block */
}

static bool qs_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_Q8M_STREAM", &on);
}

template <int W, int EPI>
static bool qs_go(ds4_cuda *cu, const ds4_q8m_params &P, int64_t tiles, int64_t n_group)
{
    const size_t smem = (size_t)W * 2048 + (size_t)QS_STAGES * QS_STAGE;
    static int per_sm = -1; /* blocks an SM, asked once per kernel */
    if (per_sm < 0) {
        int n = 0;
        if (cudaFuncSetAttribute(ds4_q8m_stream_kernel<W, EPI, QS_STAGES>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, ds4_q8m_stream_kernel<W, EPI, QS_STAGES>, W * 32,
                                                          smem) != cudaSuccess)
            n = 0;
        cudaGetLastError();
        per_sm = n;
    }
    if (per_sm < 1) return false;
    /* the resident blocks, shared among the groups; never more than the tiles */
    int64_t gx = ((int64_t)per_sm * cu->n_sm + n_group - 1) / n_group;
    if (gx > tiles) gx = tiles;
    if (gx < 1) gx = 1;
    ds4_launch(ds4_q8m_stream_kernel<W, EPI, QS_STAGES>, dim3((unsigned)gx, (unsigned)n_group), W * 32, smem,
               cu->stream, P);
    return true;
}

bool ds4_q8m_stream_launch(ds4_cuda *cu, const ds4_q8m_params &P, int epi, int64_t tiles, int64_t n_group)
{
    if (!qs_on() || cu->cc_major < 8) return false;
    switch (epi) {
    case DS4_Q8S_STORE: return qs_go<8, DS4_Q8S_STORE>(cu, P, tiles, n_group);
    case DS4_Q8S_ADD: return qs_go<8, DS4_Q8S_ADD>(cu, P, tiles, n_group);
    default: return qs_go<8, DS4_Q8S_SWIGLU>(cu, P, tiles, n_group);
    }
}

/*
 * cuda_q8split_mma_stream.cu - the tensor-core product of 9-16 tokens on a
 * split-layout Q8_0 matrix (cuda_q8split_mma.cu) with its weights streamed
 * through a cp.async ring, for the matrices whose kernel time is DRAM
 * round trips: q_b, o_b and the LM head of a 16-session step.
 *
 * Why: the round-by-round kernel gives a warp two 16-row blocks of 32
 * columns (1 KB) in flight and then waits for them; a block owns one
 * 16-row tile and ends after it. For q_b (tiles of 16 rows x 1024 columns:
 * two rounds a warp) and o_b (one tile a block, 16 rounds) that is a DRAM
 * round trip per round with nothing behind it: the eighteenth session
 * measured ~40 us for each 35.7 MB matrix (~0.9 TB/s) where one token's
 * kernel reads it in 11-15 us.
 *
 * How: a block takes tiles blockIdx.x, blockIdx.x + gridDim.x, ... of its
 * group (grid: the blocks that are resident at once), and each warp walks
 * one flat sequence of steps (tile, matrix, round). A step is the warp's
 * PW Q8_0 blocks of the tile's 16 rows: their weight bytes, the rows'
 * scales, the activation's fragment words and token scales, copied by
 * cp.async into the warp's own ring of ST stages, ST - 1 steps ahead of
 * the one it computes. So loads cross round, matrix and tile boundaries,
 * and a tile's reduction (block barriers) runs while the next tile's
 * first steps arrive. The weights are constants: the first stages' weight
 * copies go out before the programmatic-launch wait, the activation's
 * after it.
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

/* One pair's bytes in a stage: the 16 rows' 32 weight bytes (row r at
 * 32 r), the activation's 32 x 16 fragment bytes, its 16 token scales and
 * the rows' scale words (row r at 4 r: the f16 scales of blocks B & ~1
 * and B | 1, a 4-byte copy being the smallest). */
enum { QS_W = 0, QS_X = 512, QS_XD = 1024, QS_D = 1088, QS_PAIR = 1152 };
#define QS_STAGES 4

__device__ __forceinline__ void qs_cp4(uint32_t sa, const void *gmem)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(sa), "l"(gmem) : "memory");
}
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

/* A warp's position in its steps: the tile's first row in the group, the
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

/* Lane's share of a step's weight copies into stage base sb: lane l takes
 * half l & 1 of row l / 2, lanes 0..15 the scale word of row l. */
template <int W, int PW>
__device__ __forceinline__ void qs_issue_w(const ds4_q8m_params &P, const qs_step &s, int64_t grp, int nblk, int w,
                                           int lane, uint32_t sb)
{
#pragma unroll
    for (int j = 0; j < PW; j++) {
        const int B = w + QM_PAIRS * s.r + W * j;
        const int64_t row = grp * P.rows + s.r0 + (lane >> 1);
        qs_cp16(sb + j * QS_PAIR + QS_W + 16 * lane, (s.m ? P.qs[1] : P.qs[0]) + row * P.cols + 32 * (int64_t)B + 16 * (lane & 1));
        if (lane < QM_ROWS)
            qs_cp4(sb + j * QS_PAIR + QS_D + 4 * lane,
                   (s.m ? P.d[1] : P.d[0]) + (grp * P.rows + s.r0 + lane) * nblk + (B & ~1));
    }
}

/* ... and of its activation copies (the fragment words, the token scales). */
template <int W, int PW>
__device__ __forceinline__ void qs_issue_x(const ds4_q8m_params &P, const qs_step &s, int64_t grp, int nblk, int w,
                                           int lane, uint32_t sb)
{
#pragma unroll
    for (int j = 0; j < PW; j++) {
        const int64_t blk = grp * nblk + w + QM_PAIRS * s.r + W * j;
        qs_cp16(sb + j * QS_PAIR + QS_X + 16 * lane, P.xq + blk * 32 + lane);
        if (lane < 4) qs_cp16(sb + j * QS_PAIR + QS_XD + 16 * lane, P.xd + blk * QM_TOK + 4 * lane);
    }
}

/* Block: W warps, the tiles blockIdx.x + gridDim.x i of group blockIdx.y.
 * Shared memory: s_t (W x 2 KB), then each warp's ring (ST x PW pairs). */
template <int W, int EPI, int ST>
__global__ void __launch_bounds__(W * 32, W == 8 ? 2 : 1) ds4_q8m_stream_kernel(const ds4_q8m_params P)
{
    enum { NM = EPI == DS4_Q8S_SWIGLU ? 2 : 1, PW = QM_PAIRS / W };
    extern __shared__ __align__(16) uint8_t qs_smem[];
    float(*s_t)[2][QM_TOK][QM_ROWS] = (float(*)[2][QM_TOK][QM_ROWS])qs_smem;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, q = lane & 3, o = threadIdx.x;
    const int64_t grp = blockIdx.y;
    const int nblk = (int)(P.cols / 32), R = nblk / QM_PAIRS;
    const int64_t tiles = P.rows / QM_ROWS;
    const int64_t my_tiles = tiles > (int64_t)blockIdx.x ? (tiles - 1 - (int64_t)blockIdx.x) / gridDim.x + 1 : 0;
    const int n_steps = (int)(my_tiles * NM * R);
    const uint32_t ring = (uint32_t)__cvta_generic_to_shared(qs_smem + W * 2048 + w * ST * PW * QS_PAIR);
    const bool lo = q < 2; /* the thread's own 8 bytes are of chunk 0 */

    /* the first ST - 1 steps' weights before the wait, their activation after */
    const qs_step first = {(int64_t)blockIdx.x * QM_ROWS, 0, 0};
    qs_step si = first; /* the next step to copy */
    for (int t = 0; t < ST - 1 && t < n_steps; t++, qs_next(si, R, NM))
        qs_issue_w<W, PW>(P, si, grp, nblk, w, lane, ring + t * PW * QS_PAIR);
    ds4_pdl_enter();
    si = first;
    for (int t = 0; t < ST - 1; t++, qs_next(si, R, NM)) {
        if (t < n_steps) qs_issue_x<W, PW>(P, si, grp, nblk, w, lane, ring + t * PW * QS_PAIR);
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
        if (t + ST - 1 < n_steps) {
            const uint32_t sb = ring + (uint32_t)slot_n * PW * QS_PAIR;
            qs_issue_w<W, PW>(P, si, grp, nblk, w, lane, sb);
            qs_issue_x<W, PW>(P, si, grp, nblk, w, lane, sb);
            qs_next(si, R, NM);
        }
        slot_n = slot_n == ST - 1 ? 0 : slot_n + 1;
        ds4_mq_cp_commit();
        ds4_mq_cp_wait<ST - 1>(); /* this lane's copies of step t are in */
        __syncwarp();             /* ... and every lane's */
        const uint32_t sb = ring + (uint32_t)slot * PW * QS_PAIR;
        slot = slot == ST - 1 ? 0 : slot + 1;
#pragma unroll
        for (int j = 0; j < PW; j++) {
            const uint32_t pb = sb + j * QS_PAIR;
            const int B = w + QM_PAIRS * s.r + W * j;
            const uint2 v0 = qs_lds64(pb + QS_W + 32 * g + 8 * q), v1 = qs_lds64(pb + QS_W + 256 + 32 * g + 8 * q);
            const uint4 xv = ds4_lds128(pb + QS_X + 16 * lane);
            const uint2 d0 = qs_lds64(pb + QS_XD + 8 * q), d1 = qs_lds64(pb + QS_XD + 32 + 8 * q);
            const float2 dx0 = make_float2(__uint_as_float(d0.x), __uint_as_float(d0.y)),
                         dx1 = make_float2(__uint_as_float(d1.x), __uint_as_float(d1.y));
            const uint32_t sh = 16 * (B & 1);
            const float fw0 = ds4_f16((ds4_lds32(pb + QS_D + 4 * g) >> sh) & 0xffffu),
                        fw1 = ds4_f16((ds4_lds32(pb + QS_D + 4 * (g + 8)) >> sh) & 0xffffu);
            qm_pair_add(v0, v1, xv, dx0, dx1, fw0, fw1, lo, acc[j]);
        }
        __syncwarp(); /* the next step's copies reuse this stage */
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
    enum { PW = QM_PAIRS / W };
    const size_t smem = (size_t)W * 2048 + (size_t)W * QS_STAGES * PW * QS_PAIR;
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

bool ds4_q8m_stream_launch(ds4_cuda *cu, const ds4_q8m_params &P, int epi, int warps, int64_t tiles, int64_t n_group)
{
    if (!qs_on() || cu->cc_major < 8) return false;
    switch (epi) {
    case DS4_Q8S_STORE: return warps == 8 ? qs_go<8, DS4_Q8S_STORE>(cu, P, tiles, n_group)
                                          : qs_go<16, DS4_Q8S_STORE>(cu, P, tiles, n_group);
    case DS4_Q8S_ADD: return warps == 8 ? qs_go<8, DS4_Q8S_ADD>(cu, P, tiles, n_group)
                                        : qs_go<16, DS4_Q8S_ADD>(cu, P, tiles, n_group);
    default: return warps == 8 ? qs_go<8, DS4_Q8S_SWIGLU>(cu, P, tiles, n_group)
                               : qs_go<16, DS4_Q8S_SWIGLU>(cu, P, tiles, n_group);
    }
}

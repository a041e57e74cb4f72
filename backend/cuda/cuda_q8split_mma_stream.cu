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
/* With TM tiles a step (DS4_CUDA_Q8M_TILE2=1: TM = 2, 32 rows): the
 * weights of TM x 16 rows, the activation once, the rows' scales; a row's
 * swizzle is its row within its tile's 16. Three stages, so that two
 * blocks of 8 warps still fit an SM with their TM x 16 KB of s_t. */
template <int TM> struct qs_lay {
    enum {
        W = 0,
        X = 8192 * TM,
        XD = X + 8192,
        D = XD + 1024,
        STAGE = D + 512 * TM,
        STAGES = TM == 1 ? QS_STAGES : 3,
    };
};

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
template <int TM = 1> __device__ __forceinline__ void qs_next(qs_step &s, int R, int NM)
{
    if (++s.r < R) return;
    s.r = 0;
    if (++s.m < NM) return;
    s.m = 0;
    s.r0 += (int64_t)gridDim.x * QM_ROWS * TM;
}

/* The thread's share of a step's 16-byte copies into stage sb, every
 * piece's source run contiguous across neighbouring threads: the weights
 * (piece i: row i / 32, 16 bytes i % 32 of the round's 512) and scales
 * (WX: the constants, which may be copied before the programmatic-launch
 * wait), or the activation and its token scales (!WX). */
template <int NT, bool WX, int TM = 1>
__device__ __forceinline__ void qs_issue(const ds4_q8m_params &P, const qs_step &s, int64_t grp, int nblk, int tid,
                                         uint32_t sb)
{
    typedef qs_lay<TM> L;
    if constexpr (WX) {
        const uint8_t *qs = s.m ? P.qs[1] : P.qs[0];
        const uint16_t *d = s.m ? P.d[1] : P.d[0];
        const int64_t row0 = grp * P.rows + s.r0;
        for (int i = tid; i < (512 + 32) * TM; i += NT) {
            if (i < 512 * TM) {
                const int rr = i >> 5, c = i & 31;
                qs_cp16(sb + L::W + 512 * rr + 32 * ((c >> 1) ^ (rr & 15)) + 16 * (c & 1),
                        qs + (row0 + rr) * P.cols + 512 * (int64_t)s.r + 16 * c);
            } else {
                const int rr = (i - 512 * TM) >> 1, h = (i - 512 * TM) & 1;
                qs_cp16(sb + L::D + 32 * rr + 16 * h, d + (row0 + rr) * nblk + QM_PAIRS * s.r + 8 * h);
            }
        }
    } else {
        const int64_t blk0 = grp * nblk + QM_PAIRS * s.r;
        for (int i = tid; i < 512 + 64; i += NT) {
            if (i < 512) qs_cp16(sb + L::X + 16 * i, P.xq + blk0 * 32 + i);
            else qs_cp16(sb + L::XD + 16 * (i - 512), P.xd + blk0 * QM_TOK + 4 * (i - 512));
        }
    }
}

/* Block: W warps, the tiles blockIdx.x + gridDim.x i of group blockIdx.y
 * (TM = 2: pairs of tiles). Shared memory: s_t (TM x W x 2 KB), then the
 * ring of ST stages. With TM = 2 each warp adds the same blocks of both
 * tiles, one activation fragment for the two; each output's terms, trees
 * and order are those of TM = 1, so the same bits. */
template <int W, int EPI, int ST, int TM>
__global__ void __launch_bounds__(W * 32, W == 8 ? 2 : 1) ds4_q8m_stream_kernel(const ds4_q8m_params P)
{
    typedef qs_lay<TM> L;
    enum { NM = EPI == DS4_Q8S_SWIGLU ? 2 : 1, PW = QM_PAIRS / W, NT = W * 32 };
    extern __shared__ __align__(16) uint8_t qs_smem[];
    float(*s_t)[2][QM_TOK][QM_ROWS] = (float(*)[2][QM_TOK][QM_ROWS])qs_smem; /* tile m's: s_t + W m */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, q = lane & 3, o = threadIdx.x;
    const int64_t grp = blockIdx.y;
    const int nblk = (int)(P.cols / 32), R = nblk / QM_PAIRS;
    const int64_t tiles = P.rows / (QM_ROWS * TM);
    const int64_t my_tiles = tiles > (int64_t)blockIdx.x ? (tiles - 1 - (int64_t)blockIdx.x) / gridDim.x + 1 : 0;
    const int n_steps = (int)(my_tiles * NM * R);
    const uint32_t ring = (uint32_t)__cvta_generic_to_shared(qs_smem + TM * W * 2048);
    const bool lo = q < 2; /* the thread's own 8 bytes are of chunk 0 */

    /* the first ST - 1 steps' weights before the wait, their activation after */
    const qs_step first = {(int64_t)blockIdx.x * QM_ROWS * TM, 0, 0};
    qs_step si = first; /* the next step to copy */
    for (int t = 0; t < ST - 1 && t < n_steps; t++, qs_next<TM>(si, R, NM))
        qs_issue<NT, true, TM>(P, si, grp, nblk, o, ring + t * L::STAGE);
    ds4_pdl_enter();
    si = first;
    for (int t = 0; t < ST - 1; t++, qs_next<TM>(si, R, NM)) {
        if (t < n_steps) qs_issue<NT, false, TM>(P, si, grp, nblk, o, ring + t * L::STAGE);
        ds4_mq_cp_commit();
    }

    float acc[TM][PW][2][8];
#pragma unroll
    for (int m = 0; m < TM; m++)
#pragma unroll
        for (int j = 0; j < PW; j++)
#pragma unroll
            for (int p = 0; p < 16; p++) acc[m][j][p >> 3][p & 7] = 0.0f;
    float gate[TM];
#pragma unroll
    for (int m = 0; m < TM; m++) gate[m] = 0.0f;
    qs_step s = first; /* the step computed */
    int slot = 0, slot_n = ST - 1;
    for (int t = 0; t < n_steps; t++) {
        ds4_mq_cp_wait<ST - 2>(); /* this thread's copies of step t are in */
        __syncthreads();          /* ... every thread's, and step t - 1 is computed */
        if (t + ST - 1 < n_steps) { /* into the stage of step t - 1 */
            const uint32_t sb = ring + (uint32_t)slot_n * L::STAGE;
            qs_issue<NT, true, TM>(P, si, grp, nblk, o, sb);
            qs_issue<NT, false, TM>(P, si, grp, nblk, o, sb);
            qs_next<TM>(si, R, NM);
        }
        slot_n = slot_n == ST - 1 ? 0 : slot_n + 1;
        ds4_mq_cp_commit();
        const uint32_t sb = ring + (uint32_t)slot * L::STAGE;
        slot = slot == ST - 1 ? 0 : slot + 1;
#pragma unroll
        for (int j = 0; j < PW; j++) {
            const int b = w + W * j; /* this pair's block of the round */
            uint2 v0[TM], v1[TM]; /* tile m's rows g and g + 8 */
#pragma unroll
            for (int m = 0; m < TM; m++) {
                v0[m] = qs_lds64(sb + L::W + 512 * (16 * m + g) + 32 * (b ^ g) + 8 * q);
                v1[m] = qs_lds64(sb + L::W + 512 * (16 * m + g + 8) + 32 * (b ^ (g + 8)) + 8 * q);
            }
            const uint4 xv = ds4_lds128(sb + L::X + 512 * b + 16 * lane);
            const uint2 d0 = qs_lds64(sb + L::XD + 64 * b + 8 * q), d1 = qs_lds64(sb + L::XD + 64 * b + 32 + 8 * q);
            const float2 dx0 = make_float2(__uint_as_float(d0.x), __uint_as_float(d0.y)),
                         dx1 = make_float2(__uint_as_float(d1.x), __uint_as_float(d1.y));
#pragma unroll
            for (int m = 0; m < TM; m++) {
                const float fw0 = ds4_f16(ds4_lds_u16(sb + L::D + 32 * (16 * m + g) + 2 * b)),
                            fw1 = ds4_f16(ds4_lds_u16(sb + L::D + 32 * (16 * m + g + 8) + 2 * b));
                qm_pair_add(v0[m], v1[m], xv, dx0, dx1, fw0, fw1, lo, acc[m][j]);
            }
        }
        const qs_step done = s;
        qs_next<TM>(s, R, NM);
        if (done.r + 1 < R) continue;

        /* the end of a matrix of the tiles: their sums, as the round-by-round kernel's */
#pragma unroll
        for (int m = 0; m < TM; m++) qm_to_smem<PW>(acc[m], s_t + W * m, w, g, q);
        __syncthreads();
        const int row = o % QM_ROWS, tok = o / QM_ROWS;
#pragma unroll
        for (int m = 0; m < TM; m++) {
            const float v = tok < P.nt ? qm_from_smem<W>(s_t + W * m, tok, row) : 0.0f; /* W >= 8: one output a thread a tile */
            if (done.m + 1 < NM) {
                gate[m] = v;
            } else if (tok < P.nt) {
                float *yp = P.y + grp * P.y_grp_stride + (int64_t)tok * P.y_tok_stride + done.r0 + 16 * m + row;
                if (EPI == DS4_Q8S_SWIGLU) *yp = ds4_swiglu_clamped(gate[m], v, P.clamp);
                else if (EPI == DS4_Q8S_ADD) *yp = P.accumulate ? __fadd_rn(*yp, v) : v;
                else *yp = v;
            }
        }
        __syncthreads(); /* s_t is the next matrix's */
#pragma unroll
        for (int m = 0; m < TM; m++)
#pragma unroll
            for (int j = 0; j < PW; j++)
#pragma unroll
                for (int p = 0; p < 16; p++) acc[m][j][p >> 3][p & 7] = 0.0f;
    }
    ds4_mq_cp_wait<0>(); /* no copy outlives the block */
}

static bool qs_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_Q8M_STREAM", &on);
}

/* DS4_CUDA_Q8M_TILE2=1 (opt-in, written without a GPU run): two 16-row
 * tiles a step where the rows allow, so that a step's activation (16
 * tokens x 512 bytes, as many bytes as one tile's weights) and its barrier
 * serve 32 rows. Why: ncu put this kernel at 1.0-1.6 TB/s (q_b, o_a, o_b:
 * 36 us each in a 16-session step of the 8-layer model, thirty-first
 * session; at ~55% issue and 25% occupancy, twenty-first) against one
 * token's kernel at 2.3-3.2 TB/s on the same matrices: per 16-row step it
 * copies, waits for and reads as many activation bytes as weight bytes and
 * pays a block barrier; two tiles a step halve both per weight byte. Read
 * once; tiles in pairs only where their count is even. */
static bool qs_tile2_on(void)
{
    static int on = -1;
    return ds4_env_flag_on("DS4_CUDA_Q8M_TILE2", &on);
}

template <int W, int EPI, int TM>
static bool qs_go(ds4_cuda *cu, const ds4_q8m_params &P, int64_t tiles, int64_t n_group)
{
    typedef qs_lay<TM> L;
    const size_t smem = (size_t)TM * W * 2048 + (size_t)L::STAGES * L::STAGE;
    static int per_sm = -1; /* blocks an SM, asked once per kernel */
    if (per_sm < 0) {
        int n = 0;
        if (cudaFuncSetAttribute(ds4_q8m_stream_kernel<W, EPI, L::STAGES, TM>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, ds4_q8m_stream_kernel<W, EPI, L::STAGES, TM>, W * 32,
                                                          smem) != cudaSuccess)
            n = 0;
        cudaGetLastError();
        per_sm = n;
    }
    if (per_sm < 1) return false;
    /* the resident blocks, shared among the groups; never more than the tiles (pairs) */
    const int64_t units = tiles / TM;
    int64_t gx = ((int64_t)per_sm * cu->n_sm + n_group - 1) / n_group;
    if (gx > units) gx = units;
    if (gx < 1) gx = 1;
    ds4_launch(ds4_q8m_stream_kernel<W, EPI, L::STAGES, TM>, dim3((unsigned)gx, (unsigned)n_group), W * 32, smem,
               cu->stream, P);
    return true;
}

template <int EPI>
static bool qs_pick(ds4_cuda *cu, const ds4_q8m_params &P, int64_t tiles, int64_t n_group)
{
    if (qs_tile2_on() && tiles % 2 == 0 && qs_go<8, EPI, 2>(cu, P, tiles, n_group)) return true;
    return qs_go<8, EPI, 1>(cu, P, tiles, n_group);
}

bool ds4_q8m_stream_launch(ds4_cuda *cu, const ds4_q8m_params &P, int epi, int64_t tiles, int64_t n_group)
{
    if (!qs_on() || cu->cc_major < 8) return false;
    switch (epi) {
    case DS4_Q8S_STORE: return qs_pick<DS4_Q8S_STORE>(cu, P, tiles, n_group);
    case DS4_Q8S_ADD: return qs_pick<DS4_Q8S_ADD>(cu, P, tiles, n_group);
    default: return qs_pick<DS4_Q8S_SWIGLU>(cu, P, tiles, n_group);
    }
}

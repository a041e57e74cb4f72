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
 * that, not the copy pattern, was what was left (docs/CUDA.md); tiles of
 * 32 rows halve it (a 16-session step +2.1%, H100, thirty-ninth session).
 *
 * How: a block takes tiles blockIdx.x, blockIdx.x + gridDim.x, ... of its
 * group (grid: the blocks that are resident at once) and walks one flat
 * sequence of steps (tile, matrix, round). A tile is 32 rows (two groups
 * of 16, the mma's M, sharing each step's activation) where each SM still
 * gets one, else 16 (qs_pick). A step is one round (16 Q8_0 blocks) of
 * the tile's rows: 8 KB of weights a 16 rows (each row's 512 bytes a
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

/* A stage: one round (16 Q8_0 blocks of 32 columns) of the tile's 16 RT
 * rows: the weight bytes (row r's 512 at 512 r, block b's 32 at the
 * swizzled place 32 (b ^ (r mod 16)), so that the 8 rows a fragment load
 * reads fall on different banks), the activation's 16 x 512 fragment
 * bytes, its 16 x 16 token scales and the rows' 16 f16 scales each. RT
 * row groups of 16 share the activation's bytes: with RT = 2 a step moves
 * 16 KB of weights for its 9 KB of activation, where RT = 1 moved 8 KB
 * for the same 9 (the activation read from L2 once per tile). */
template <int RT> struct qs_lay {
    enum { W = 0, X = 8192 * RT, XD = X + 8192, D = XD + 1024, STAGE = D + 512 * RT };
};
/* ring stages: RT = 1 four (two blocks an SM), RT = 2 three (the
 * 26 KB stages and the 32 KB of sums keep two blocks an SM) */
template <int RT> constexpr int qs_stages() { return RT == 1 ? 4 : 3; }

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
__device__ __forceinline__ void qs_next(qs_step &s, int R, int NM, int tile_rows)
{
    if (++s.r < R) return;
    s.r = 0;
    if (++s.m < NM) return;
    s.m = 0;
    s.r0 += (int64_t)gridDim.x * tile_rows;
}

/* The thread's share of a step's 16-byte copies into stage sb, every
 * piece's source run contiguous across neighbouring threads: the weights
 * (piece i: row i / 32, 16 bytes i % 32 of the round's 512) and scales
 * (WX: the constants, which may be copied before the programmatic-launch
 * wait), or the activation and its token scales (!WX). */
template <int NT, bool WX, int RT>
__device__ __forceinline__ void qs_issue(const ds4_q8m_params &P, const qs_step &s, int64_t grp, int nblk, int tid,
                                         uint32_t sb)
{
    typedef qs_lay<RT> L;
    if constexpr (WX) {
        const uint8_t *qs = s.m ? P.qs[1] : P.qs[0];
        const uint16_t *d = s.m ? P.d[1] : P.d[0];
        const int64_t row0 = grp * P.rows + s.r0;
        for (int i = tid; i < (512 + 32) * RT; i += NT) {
            if (i < 512 * RT) {
                const int rr = i >> 5, c = i & 31;
                qs_cp16(sb + L::W + 512 * rr + 32 * ((c >> 1) ^ (rr & 15)) + 16 * (c & 1),
                        qs + (row0 + rr) * P.cols + 512 * (int64_t)s.r + 16 * c);
            } else {
                const int rr = (i - 512 * RT) >> 1, h = (i - 512 * RT) & 1;
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

/* Block: W warps, the tiles blockIdx.x + gridDim.x i of group blockIdx.y,
 * a tile RT groups of 16 rows. Shared memory: s_t (RT x W x 2 KB), then
 * the ring of ST stages. A row group's terms, sums and reduction are the
 * RT = 1 kernel's, so each row's result is the same bits with either RT. */
template <int W, int EPI, int ST, int RT>
__global__ void __launch_bounds__(W * 32, W == 8 ? 2 : 1) ds4_q8m_stream_kernel(const ds4_q8m_params P)
{
    typedef qs_lay<RT> L;
    enum { NM = EPI == DS4_Q8S_SWIGLU ? 2 : 1, PW = QM_PAIRS / W, NT = W * 32, TR = QM_ROWS * RT };
    extern __shared__ __align__(16) uint8_t qs_smem[];
    float(*s_t)[2][QM_TOK][QM_ROWS] = (float(*)[2][QM_TOK][QM_ROWS])qs_smem;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, q = lane & 3, o = threadIdx.x;
    const int64_t grp = blockIdx.y;
    const int nblk = (int)(P.cols / 32), R = nblk / QM_PAIRS;
    const int64_t tiles = P.rows / TR;
    const int64_t my_tiles = tiles > (int64_t)blockIdx.x ? (tiles - 1 - (int64_t)blockIdx.x) / gridDim.x + 1 : 0;
    const int n_steps = (int)(my_tiles * NM * R);
    const uint32_t ring = (uint32_t)__cvta_generic_to_shared(qs_smem + RT * W * 2048);
    const bool lo = q < 2; /* the thread's own 8 bytes are of chunk 0 */

    /* the first ST - 1 steps' weights before the wait, their activation after */
    const qs_step first = {(int64_t)blockIdx.x * TR, 0, 0};
    qs_step si = first; /* the next step to copy */
    for (int t = 0; t < ST - 1 && t < n_steps; t++, qs_next(si, R, NM, TR))
        qs_issue<NT, true, RT>(P, si, grp, nblk, o, ring + t * L::STAGE);
    ds4_pdl_enter();
    si = first;
    for (int t = 0; t < ST - 1; t++, qs_next(si, R, NM, TR)) {
        if (t < n_steps) qs_issue<NT, false, RT>(P, si, grp, nblk, o, ring + t * L::STAGE);
        ds4_mq_cp_commit();
    }

    float acc[RT][PW][2][8];
#pragma unroll
    for (int k = 0; k < RT; k++)
#pragma unroll
        for (int j = 0; j < PW; j++)
#pragma unroll
            for (int p = 0; p < 16; p++) acc[k][j][p >> 3][p & 7] = 0.0f;
    float gate[RT];
#pragma unroll
    for (int k = 0; k < RT; k++) gate[k] = 0.0f;
    qs_step s = first; /* the step computed */
    int slot = 0, slot_n = ST - 1;
    for (int t = 0; t < n_steps; t++) {
        ds4_mq_cp_wait<ST - 2>(); /* this thread's copies of step t are in */
        __syncthreads();          /* ... every thread's, and step t - 1 is computed */
        if (t + ST - 1 < n_steps) { /* into the stage of step t - 1 */
            const uint32_t sb = ring + (uint32_t)slot_n * L::STAGE;
            qs_issue<NT, true, RT>(P, si, grp, nblk, o, sb);
            qs_issue<NT, false, RT>(P, si, grp, nblk, o, sb);
            qs_next(si, R, NM, TR);
        }
        slot_n = slot_n == ST - 1 ? 0 : slot_n + 1;
        ds4_mq_cp_commit();
        const uint32_t sb = ring + (uint32_t)slot * L::STAGE;
        slot = slot == ST - 1 ? 0 : slot + 1;
#pragma unroll
        for (int j = 0; j < PW; j++) {
            const int b = w + W * j; /* this pair's block of the round */
            const uint4 xv = ds4_lds128(sb + L::X + 512 * b + 16 * lane);
            const uint2 d0 = qs_lds64(sb + L::XD + 64 * b + 8 * q), d1 = qs_lds64(sb + L::XD + 64 * b + 32 + 8 * q);
            const float2 dx0 = make_float2(__uint_as_float(d0.x), __uint_as_float(d0.y)),
                         dx1 = make_float2(__uint_as_float(d1.x), __uint_as_float(d1.y));
#pragma unroll
            for (int k = 0; k < RT; k++) { /* row group k: rows 16 k .. 16 k + 15 of the tile */
                const uint32_t wk = sb + L::W + 8192 * k, dk = sb + L::D + 512 * k;
                const uint2 v0 = qs_lds64(wk + 512 * g + 32 * (b ^ g) + 8 * q),
                            v1 = qs_lds64(wk + 512 * (g + 8) + 32 * (b ^ (g + 8)) + 8 * q);
                const float fw0 = ds4_f16(ds4_lds_u16(dk + 32 * g + 2 * b)),
                            fw1 = ds4_f16(ds4_lds_u16(dk + 32 * (g + 8) + 2 * b));
                qm_pair_add(v0, v1, xv, dx0, dx1, fw0, fw1, lo, acc[k][j]);
            }
        }
        const qs_step done = s;
        qs_next(s, R, NM, TR);
        if (done.r + 1 < R) continue;

        /* the end of a matrix of the tile: its sums, as the round-by-round kernel's */
#pragma unroll
        for (int k = 0; k < RT; k++) qm_to_smem<PW>(acc[k], s_t + W * k, w, g, q);
        __syncthreads();
        const int row = o % QM_ROWS, tok = o / QM_ROWS;
        float vk[RT];
#pragma unroll
        for (int k = 0; k < RT; k++) {
            /* W >= 8: one output of each row group a thread at most */
            const float v = tok < P.nt ? qm_from_smem<W>(s_t + W * k, tok, row) : 0.0f;
            vk[k] = v;
            if (done.m + 1 < NM) {
                gate[k] = v;
            } else if (tok < P.nt) {
                float *yp = P.y + grp * P.y_grp_stride + (int64_t)tok * P.y_tok_stride + done.r0 + QM_ROWS * k + row;
                if (EPI == DS4_Q8S_SWIGLU) *yp = ds4_swiglu_clamped(gate[k], v, P.clamp);
                else if (EPI == DS4_Q8S_ADD) *yp = P.accumulate ? __fadd_rn(*yp, v) : v;
                else *yp = v;
            }
        }
        if constexpr (EPI == DS4_Q8S_STORE && RT == 2 && W == 8) {
            /* the tile's 32 rows of a token are one Q8_0 block of the next
             * product's input, held by the 16 threads of the token's
             * half-warp (rows row and 16 + row): qm_quant_put's amax,
             * values and scale (cuda_q8m.cuh) */
            if (P.qo) {
                float amax = fmaxf(fabsf(vk[0]), fabsf(vk[1]));
#pragma unroll
                for (int m = 1; m < 16; m <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
                if (tok < P.nt) {
                    const float id = ds4_mmvq_q8_0_id(amax);
                    const int64_t blk = (grp * P.y_grp_stride + done.r0) >> 5;
                    P.qo[qm_frag_at(tok, blk, row)] = (uint8_t)ds4_mmvq_q8_0_q(vk[0], id);
                    P.qo[qm_frag_at(tok, blk, 16 + row)] = (uint8_t)ds4_mmvq_q8_0_q(vk[1], id);
                    if (row == 0) P.qod[blk * QM_TOK + tok] = ds4_mmvq_q8_0_d(amax);
                }
            }
        }
        __syncthreads(); /* s_t is the next matrix's */
#pragma unroll
        for (int k = 0; k < RT; k++)
#pragma unroll
            for (int j = 0; j < PW; j++)
#pragma unroll
                for (int p = 0; p < 16; p++) acc[k][j][p >> 3][p & 7] = 0.0f;
    }
    ds4_mq_cp_wait<0>(); /* no copy outlives the block */
}

static bool qs_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_Q8M_STREAM", &on);
}

/* The tile height (DS4_CUDA_Q8M_RT): 2 (the default), tiles of 32 rows
 * where each SM still gets one (the activation's L2 reads halved for the
 * same weight bytes: a 16-session step +2.1%, H100, thirty-ninth session,
 * docs/BENCHMARKS.md); 1, tiles of 16 rows; 3, tiles of 32 rows wherever
 * the rows split into them (o_b's 128 on a 132-SM card too), for A/B. */
static int qs_rt_mode(void)
{
    static int mode = -1;
    return ds4_env_choice("DS4_CUDA_Q8M_RT", &mode, 2, "13");
}

template <int W, int EPI, int RT>
static bool qs_go(ds4_cuda *cu, const ds4_q8m_params &P, int64_t tiles, int64_t n_group)
{
    enum { ST = qs_stages<RT>() };
    const size_t smem = (size_t)RT * W * 2048 + (size_t)ST * qs_lay<RT>::STAGE;
    static int per_sm = -1; /* blocks an SM, asked once per kernel */
    if (per_sm < 0) {
        int n = 0;
        if (cudaFuncSetAttribute(ds4_q8m_stream_kernel<W, EPI, ST, RT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem) != cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, ds4_q8m_stream_kernel<W, EPI, ST, RT>, W * 32, smem) !=
                cudaSuccess)
            n = 0;
        cudaGetLastError();
        per_sm = n;
    }
    if (per_sm < 1) return false;
    /* the resident blocks, shared among the groups; never more than the tiles */
    int64_t gx = ((int64_t)per_sm * cu->n_sm + n_group - 1) / n_group;
    if (gx > tiles) gx = tiles;
    if (gx < 1) gx = 1;
    ds4_launch(ds4_q8m_stream_kernel<W, EPI, ST, RT>, dim3((unsigned)gx, (unsigned)n_group), W * 32, smem,
               cu->stream, P);
    return true;
}

template <int EPI>
static bool qs_pick(ds4_cuda *cu, const ds4_q8m_params &P, int64_t tiles, int64_t n_group, bool *qo_stored)
{
    /* 32-row tiles where the rows split into them (and, by default, each SM
     * still gets one); only they store the outputs' blocks */
    const int mode = qs_rt_mode();
    *qo_stored = false;
    if (mode > 1 && tiles % 2 == 0 && (mode == 3 || (tiles / 2) * n_group >= cu->n_sm) &&
        qs_go<8, EPI, 2>(cu, P, tiles / 2, n_group)) {
        *qo_stored = EPI == DS4_Q8S_STORE && P.qo != NULL;
        return true;
    }
    ds4_q8m_params Q = P;
    Q.qo = NULL;
    Q.qod = NULL;
    return qs_go<8, EPI, 1>(cu, Q, tiles, n_group);
}

bool ds4_q8m_stream_launch(ds4_cuda *cu, const ds4_q8m_params &P, int epi, int64_t tiles, int64_t n_group,
                           bool *qo_stored)
{
    *qo_stored = false;
    if (!qs_on() || cu->cc_major < 8) return false;
    switch (epi) {
    case DS4_Q8S_STORE: return qs_pick<DS4_Q8S_STORE>(cu, P, tiles, n_group, qo_stored);
    case DS4_Q8S_ADD: return qs_pick<DS4_Q8S_ADD>(cu, P, tiles, n_group, qo_stored);
    default: return qs_pick<DS4_Q8S_SWIGLU>(cu, P, tiles, n_group, qo_stored);
    }
}

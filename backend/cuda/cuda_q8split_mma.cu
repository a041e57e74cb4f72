/*
 * cuda_q8split_mma.cu - 9 to 16 tokens (batched decode of 9-16 sessions)
 * times a split-layout Q8_0 matrix (cuda_q8split.cu) on the int8 tensor
 * cores, each token's numbers those of its own one-token product: the plain
 * product, the shared expert's gate/up pair with its SwiGLU, the
 * accumulating down product and the block-diagonal o_a.
 *
 * Why: the split-layout kernel takes 8 tokens a weight pass with dp4a, so
 * 16 sessions read every dense matrix twice and spend ~10 instructions a
 * weight byte. Here a 16-row tile is read once for all tokens, and
 * mma.sync.m16n8k16 gives the integer sums of 16 rows x 8 tokens over one
 * 16-byte chunk at a time.
 *
 * Exactness: the one-token kernels give lane l of a warp the chunks l,
 * l + 32, ... of a row; each chunk adds (d_w * d_x) * (its integer dot) to
 * the lane's float sum, in chunk order, and the 32 lane sums meet in the
 * warp's xor tree (16, 8, 4, 2, 1). The mma gives the same integers, and
 * the integer becomes a float without the conversion instruction
 * (qm_float), to the same bits. Lanes 2P and 2P + 1 read the two chunks of
 * Q8_0 block P of each round of 32 chunks ("pair" P, 0..15). Warp w of the
 * W of a block stands for the pairs P = w + W j (j < 16 / W): it adds each
 * chunk's term to lane 2P + ch's sum in the same order with the same
 * expression (the product d_w * d_x computed once for both chunks of the
 * block, the same float). The xor steps 16 .. 2 pair P with P ^ 8 .. P ^ 1
 * (lanes of one parity), step 1 the two parities: so the warp sums its
 * pairs j per parity (qm_tree), shared memory takes those over the warps
 * (qm_tree again), and the two parities' sums are added last. Float
 * addition is commutative, so every pair's sum is the tree's, bit for bit.
 *
 * Memory: a block's 16 x 32 weight bytes are two 8-byte loads a thread
 * (one 32-byte sector a row), the two chunks then dealt over the 4 threads
 * of a quad with one shuffle, the k order a permutation that the
 * activation shares (an integer dot does not depend on k's order): the
 * kernel quantizes the activation itself (qm_quant_kernel: the quantizer's
 * per-value functions, the same bytes) into that fragment order, so a
 * block's activation is one 16-byte load a thread and its scales two 8-byte
 * loads.
 *
 * On by default since its first GPU run (2026-12-03, twelfth session: 16
 * sessions 280.6 -> 292.3 tokens/s at full size); this form, every dense
 * shape of the step (2026-12-04, eighteenth session): the 8-layer model's
 * 16-session step 1353 -> 1509 tokens/s against DS4_CUDA_Q8S_MMA=0 in one
 * run, q_a and kv 4 x 23 -> 2 x 8.8 us a layer, the shared expert 2 x 21.6
 * + 2 x 21.5 -> 16.2 + 9.6 us. DS4_CUDA_Q8S_MMA=0 keeps the two 8-token
 * passes (and o_a's one-token kernel over all slots).
 * test_cuda_kernels holds 9, 13 and 16 different tokens to each one's
 * one-token product, bit for bit, for every form.
 */
#include "backend/cuda/cuda_blocks.cuh"
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_mmvq.cuh"
#include "backend/cuda/cuda_q8m.cuh"

/* 8 weight bytes past L1 (each sector is read by one warp, once). */
__device__ __forceinline__ uint2 qm_ld_stream8(const uint8_t *p)
{
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

/* One warp a (token slot, group, block of 32 values), as
 * ds4_mq_quant_q8_0_kernel: the same value, amax, int8 and scale (the
 * per-value functions of cuda_mmvq.cuh), only stored elsewhere: byte e of
 * token t's block goes to the fragment slot 2 ch + t / 8 of quad thread
 * qm_quad(ch, k) in row t % 8 (ch = e / 16, k = e / 4 % 4). Slots t >= nt
 * get zeros. */
__global__ void ds4_q8m_quant_kernel(const float *x, int64_t x_ld, int n_group, int nt, int nblk, uint8_t *xq,
                                     float *xd)
{
    ds4_pdl_enter();
    const int lane = threadIdx.x & 31;
    const int64_t wid = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (wid >= (int64_t)QM_TOK * n_group * nblk) return; /* whole warps leave together */
    const int B = (int)(wid % nblk);
    const int64_t tg = wid / nblk;
    const int g = (int)(tg % n_group), t = (int)(tg / n_group);
    const float v = t < nt ? x[((int64_t)t * n_group + g) * x_ld + 32 * B + lane] : 0.0f;
    qm_quant_put(v, t, (int64_t)g * nblk + B, lane, xq, xd);
}

/* Matrix m's tile sums reduced over the warps (qm_to_smem, qm_from_smem)
 * and finished: the gate's (m < NM - 1) kept in `gate` for the up's, the
 * last matrix's stored by EPI; thread o finishes row o % 16 of token o / 16
 * (W >= 8: one output a thread at most). Every thread calls it (barriers). */
template <int W, int EPI, int PW>
__device__ __forceinline__ void q8m_finish(const ds4_q8m_params &P, float (&acc)[PW][2][8],
                                           float (*s_t)[2][QM_TOK][QM_ROWS], int m, int64_t grp, int64_t r0,
                                           float &gate)
{
    enum { NM = EPI == DS4_Q8S_SWIGLU ? 2 : 1 };
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, o = threadIdx.x;
    qm_to_smem<PW>(acc, s_t, w, lane >> 2, lane & 3);
    __syncthreads();
    const int row = o % QM_ROWS, tok = o / QM_ROWS;
    const float v = tok < P.nt ? qm_from_smem<W>(s_t, tok, row) : 0.0f;
    if (m + 1 < NM) { /* the gate: s_t is the up's next */
        gate = v;
        __syncthreads();
        return;
    }
    if (tok >= P.nt) return;
    float *yp = P.y + grp * P.y_grp_stride + (int64_t)tok * P.y_tok_stride + r0 + row;
    if (EPI == DS4_Q8S_SWIGLU) *yp = ds4_swiglu_clamped(gate, v, P.clamp);
    else if (EPI == DS4_Q8S_ADD) *yp = P.accumulate ? __fadd_rn(*yp, v) : v;
    else *yp = v;
}

/* Block (blockIdx.x, group blockIdx.y): rows r0 .. r0 + 15 of the group,
 * every token; warp w the pairs w + W j. Thread (g, q) = (lane / 4, lane %
 * 4) holds the sums of rows g and g + 8 for tokens 2q, 2q + 1 (tile h = 0)
 * and 8 + 2q, 9 + 2q (h = 1): result p = 4 h + 2 (row g + 8) + (odd token).
 * EPI as ds4_q8s_kernel's: STORE, ADD ((+)= into y) or SWIGLU (two
 * matrices; thread o finishes row o % 16 of token o / 16 and keeps the
 * gate's sum in a register for the up's). The bound says one block of 16
 * warps, two of 8 an SM (ptxas left alone capped the SwiGLU's 16 warps at
 * 64 registers on sm_86 and spilled).
 * U: rounds whose loads a warp has out at once. U = 0, the first form: the
 * matrices one after the other, each's rounds two at a time as the unroll
 * lets ptxas schedule them. U > 0 (q8m_ahead, 16 warps): U
 * rounds' weight, scale and activation loads of every matrix issued before
 * any of their sums (the SwiGLU's gate and up rows of a round share the
 * activation's loads). Why: a batched step's q_a / kv pair and the shared
 * expert's gate and up (96 and 128 tiles of 16 warps) read 6.7 and 17.8
 * MB at ~0.7 and ~1.05 TB/s (ncu, forty-fifth session), about what 2
 * blocks of 16 rows in flight a warp deliver. Each matrix's pairs are
 * added in the same order (rounds ascending, pair j into acc[j]) and the
 * reduction is the same, so U changes no bit. */
template <int W, int EPI, int U = 0>
__device__ __forceinline__ void q8m_tile(const ds4_q8m_params &P, int64_t tile, int64_t grp)
{
    enum { NM = EPI == DS4_Q8S_SWIGLU ? 2 : 1, PW = QM_PAIRS / W, /* pairs a warp */
           UR = PW < 2 ? 2 : 1 /* rounds unrolled: two blocks a warp in flight */ };
    __shared__ float s_t[W][2][QM_TOK][QM_ROWS];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int64_t r0 = tile * QM_ROWS;
    const int nblk = (int)(P.cols / 32);
    const bool lo = q < 2; /* the thread's own 8 bytes are of chunk 0 */
    const uint4 *xq = P.xq + grp * nblk * 32 + lane;
    const float *xd = P.xd + grp * nblk * QM_TOK + 2 * q;
    const int64_t row0 = grp * P.rows + r0 + g;
    float gate = 0.0f;
    if constexpr (U > 0) {
        float acc[NM][PW][2][8];
#pragma unroll
        for (int m = 0; m < NM; m++)
#pragma unroll
            for (int j = 0; j < PW; j++)
#pragma unroll
                for (int p = 0; p < 16; p++) acc[m][j][p >> 3][p & 7] = 0.0f;
        for (int b0 = w; b0 < nblk; b0 += QM_PAIRS * U) {
            uint2 v0[U][NM][PW], v1[U][NM][PW];
            uint4 xv[U][PW];
            float2 dx0[U][PW], dx1[U][PW];
            uint16_t d0[U][NM][PW], d1[U][NM][PW];
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (b0 + QM_PAIRS * u >= nblk) break;
#pragma unroll
                for (int j = 0; j < PW; j++) {
                    const int B = b0 + QM_PAIRS * u + W * j;
#pragma unroll
                    for (int m = 0; m < NM; m++) {
                        const uint8_t *wg = P.qs[m] + row0 * P.cols + 8 * q;
                        const uint16_t *dg = P.d[m] + row0 * nblk;
                        v0[u][m][j] = qm_ld_stream8(wg + 32 * (int64_t)B);
                        v1[u][m][j] = qm_ld_stream8(wg + 8 * P.cols + 32 * (int64_t)B);
                        d0[u][m][j] = __ldg(dg + B);
                        d1[u][m][j] = __ldg(dg + 8 * nblk + B);
                    }
                    xv[u][j] = __ldg(xq + 32 * (int64_t)B);
                    dx0[u][j] = __ldg((const float2 *)(xd + QM_TOK * (int64_t)B));
                    dx1[u][j] = __ldg((const float2 *)(xd + QM_TOK * (int64_t)B + 8));
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (b0 + QM_PAIRS * u >= nblk) break;
#pragma unroll
                for (int j = 0; j < PW; j++)
#pragma unroll
                    for (int m = 0; m < NM; m++)
                        qm_pair_add(v0[u][m][j], v1[u][m][j], xv[u][j], dx0[u][j], dx1[u][j], ds4_f16(d0[u][m][j]),
                                    ds4_f16(d1[u][m][j]), lo, acc[m][j]);
            }
        }
#pragma unroll
        for (int m = 0; m < NM; m++) q8m_finish<W, EPI>(P, acc[m], s_t, m, grp, r0, gate);
    } else {
#pragma unroll
        for (int m = 0; m < NM; m++) {
            const uint8_t *wg = P.qs[m] + row0 * P.cols + 8 * q;
            const uint16_t *dg = P.d[m] + row0 * nblk;
            float acc[PW][2][8];
#pragma unroll
            for (int j = 0; j < PW; j++)
#pragma unroll
                for (int p = 0; p < 16; p++) acc[j][p >> 3][p & 7] = 0.0f;
#pragma unroll UR
            for (int b0 = w; b0 < nblk; b0 += QM_PAIRS) {
#pragma unroll
                for (int j = 0; j < PW; j++) {
                    const int B = b0 + W * j; /* pair w + W j's block of this round */
                    const uint2 v0 = qm_ld_stream8(wg + 32 * (int64_t)B),
                                v1 = qm_ld_stream8(wg + 8 * P.cols + 32 * (int64_t)B);
                    const uint4 xv = __ldg(xq + 32 * (int64_t)B);
                    const float2 dx0 = __ldg((const float2 *)(xd + QM_TOK * (int64_t)B)),
                                 dx1 = __ldg((const float2 *)(xd + QM_TOK * (int64_t)B + 8));
                    const float fw0 = ds4_f16(__ldg(dg + B)), fw1 = ds4_f16(__ldg(dg + 8 * nblk + B));
                    qm_pair_add(v0, v1, xv, dx0, dx1, fw0, fw1, lo, acc[j]);
                }
            }
            q8m_finish<W, EPI>(P, acc, s_t, m, grp, r0, gate);
        }
    }
}

template <int W, int EPI, int U = 0>
__global__ void __launch_bounds__(W * 32, W == 8 ? 2 : 1) ds4_q8m_kernel(const ds4_q8m_params P)
{
    ds4_pdl_enter();
    q8m_tile<W, EPI, U>(P, blockIdx.x, blockIdx.y);
}

/* Two plain products of one activation in one launch (a batched step's
 * q_a and kv: 64 and 32 tiles of 16 warps, which as two launches left 68
 * and then 100 of an H100's 132 SMs idle, one after the other): blocks
 * below tiles0 take P0's tiles, the rest P1's, each tile exactly as its
 * own launch computes it. */
template <int U = 0>
__global__ void __launch_bounds__(16 * 32, 1) ds4_q8m_pair_kernel(const ds4_q8m_params P0, const ds4_q8m_params P1,
                                                                   unsigned tiles0)
{
    ds4_pdl_enter();
    if (blockIdx.x < tiles0) q8m_tile<16, DS4_Q8S_STORE, U>(P0, blockIdx.x, 0);
    else q8m_tile<16, DS4_Q8S_STORE, U>(P1, blockIdx.x - tiles0, 0);
}

/* The 16-warp round-by-round kernel with N blocks of 16 rows' loads out at
 * once a warp (q8m_tile's U rounds: N, the SwiGLU's N / 2 of two
 * matrices): 4 by default (ncu, 8 layers, 16 sessions, H100, forty-sixth
 * session: the shared gate+up 16.38 -> 14.15 us, the q_a / kv pair 9.70 ->
 * 9.29); DS4_CUDA_Q8M_AHEAD=0 the first form, =2 two (read once). */
static int q8m_ahead(void)
{
    static int n = -1;
    return ds4_env_choice("DS4_CUDA_Q8M_AHEAD", &n, 4, "024");
}

static bool q8m_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_Q8S_MMA", &on);
}

/* Warps a block: 8 (two pairs each) when there are tiles for ~12 warps an
 * SM, else 16 (q_a: 64 tiles, kv: 32, the gate/up pair: 128), where 4 warps
 * a block left q_a and kv to the 8-token kernel. DS4_CUDA_Q8M_WARPS=8 or 16
 * forces one (read once, for tuning on the GPU). */
static int q8m_warps(const ds4_cuda *cu, int64_t tiles)
{
    static int forced = -1;
    if (forced < 0) {
        const char *e = getenv("DS4_CUDA_Q8M_WARPS");
        const int v = e ? atoi(e) : 0;
        forced = v == 8 || v == 16 ? v : 0;
    }
    if (forced) return forced;
    return tiles * 8 >= 12 * (int64_t)cu->n_sm ? 8 : 16;
}

/* True where the launch also stored the outputs' blocks (P.qo) */
template <int EPI>
static bool q8m_launch(ds4_cuda *cu, const ds4_q8m_params &P, int64_t tiles, int64_t n_group)
{
    const int warps = q8m_warps(cu, tiles * n_group);
    /* the streaming form for the products with tiles for every SM (q_b,
     * o_a, o_b, the LM head: 26.2 / 22.6 / 22.0 / ~297 against 30.4 /
     * 25.7 / 25.5 / ~350 us, ncu, nineteenth session); with few tiles (16
     * warps a tile: q_a, kv, the gate/up pair) it measured slower (9.5 /
     * 9.4 / 17.4 against 8.7 / 8.5 / 16.0 us) */
    bool stored = false;
    if (warps == 8 && ds4_q8m_stream_launch(cu, P, EPI, tiles, n_group, &stored)) return stored;
    const dim3 grid((unsigned)tiles, (unsigned)n_group);
    /* N blocks of 16 rows a warp in flight: the SwiGLU's rounds hold two
     * (its U = 4 spilled: 128 registers) */
    const int ahead = q8m_ahead(), u = EPI == DS4_Q8S_SWIGLU ? ahead / 2 : ahead;
    if (warps == 8) ds4_launch(ds4_q8m_kernel<8, EPI>, grid, 8 * 32, 0, cu->stream, P);
    else if (u == 4) /* not the SwiGLU's (below its 4 rounds' spill is not compiled) */
        ds4_launch(ds4_q8m_kernel<16, EPI, EPI == DS4_Q8S_SWIGLU ? 2 : 4>, grid, 16 * 32, 0, cu->stream, P);
    else if (u == 2) ds4_launch(ds4_q8m_kernel<16, EPI, 2>, grid, 16 * 32, 0, cu->stream, P);
    else if (u == 1) ds4_launch(ds4_q8m_kernel<16, EPI, 1>, grid, 16 * 32, 0, cu->stream, P);
    else ds4_launch(ds4_q8m_kernel<16, EPI>, grid, 16 * 32, 0, cu->stream, P);
    return false;
}

/* mode: Q8M_CHECK only whether covered, Q8M_RUN quantize x (or take a
 * maker's blocks of it) and launch, Q8M_REUSE launch on the activation
 * blocks of *same, a product of the same x, x_ld, nt and cols just
 * prepared (ds4_q8split_mma_pair). */
enum { Q8M_CHECK, Q8M_RUN, Q8M_REUSE };

/* Whether an offer of fragment-order blocks (ds4_cuda's q8m, q8ms) is of
 * this product's x: the same buffer, rows of all its groups, tokens */
static bool q8m_offer_fits(const ds4_q8_handoff *h, const ds4_q8m_args *a, int64_t n_group)
{
    return h->y && a->x == h->y && a->x_ld == a->cols && n_group * a->cols == h->n && a->nt == h->nt;
}
/* The product's parameters in *P (its tiles a group in *tiles, its groups
 * in *n_group), the activation quantized first (Q8M_RUN); 0 where the
 * tensor-core product does not cover it. */
static int q8m_prepare(ds4_cuda *cu, const ds4_q8m_args *a, int epi, int mode, const ds4_q8m_params *same,
                       ds4_q8m_params *Pout, int64_t *tiles_out, int64_t *n_group_out)
{
    if (!q8m_on() || cu->cc_major < 8 || a->nt < 9 || a->nt > QM_TOK) return 0;
    if (epi != DS4_Q8S_STORE && epi != DS4_Q8S_ADD && epi != DS4_Q8S_SWIGLU) return 0;
    const int64_t n_group = a->n_group > 1 ? a->n_group : 1;
    /* whole 16-row tiles, whole rounds of 32 chunks */
    if (n_group > 65535 || a->rows < QM_ROWS || a->rows % QM_ROWS != 0 || a->cols % 512 != 0 ||
        ((uintptr_t)a->x & 3u) != 0)
        return 0;
    ds4_q8m_params P;
    const int nmat = epi == DS4_Q8S_SWIGLU ? 2 : 1;
    for (int m = 0; m < 2; m++) {
        int64_t total_rows = 0;
        const uint8_t *split = ds4_q8split_find(cu->device, a->w[m < nmat ? m : 0], a->rows * n_group, a->cols,
                                                &total_rows);
        if (!split) return 0;
        if (mode == Q8M_CHECK) continue;
        P.qs[m] = split;
        P.d[m] = (const uint16_t *)(split + total_rows * a->cols); /* the scale run follows the values */
    }
    if (mode == Q8M_CHECK) return 1;
    const int64_t nblk = a->cols / 32, blocks = n_group * nblk;
    /* a maker's copy of x (ds4_cuda's q8m), offered to the next product
     * only; or the sublayer input's, made by its site (q8ms, the main
     * context's for a side context's product), until the sublayer ends */
    const ds4_q8_handoff *h = &cu->q8m[cu->q8m_cur], *hs = &(cu->parent ? cu->parent : cu)->q8ms;
    bool offered = mode == Q8M_RUN && q8m_offer_fits(h, a, n_group) && h->seq == ds4_launch_seq;
    if (mode == Q8M_RUN) cu->q8m[0].y = cu->q8m[1].y = NULL;
    if (mode == Q8M_RUN && !offered && q8m_offer_fits(hs, a, n_group)) h = hs, offered = true;
    uint8_t *buf = NULL;
    if (mode == Q8M_REUSE) {
        P.xq = same->xq;
        P.xd = same->xd;
    } else if (offered) {
        P.xq = (const uint4 *)h->q;
        P.xd = h->d;
    } else {
        if (ds4_mq_act_reserve(cu, (size_t)blocks * (32 * 16 + QM_TOK * 4), &buf) != DS4_OK) return 0;
        P.xq = (const uint4 *)buf;
        P.xd = (const float *)(buf + blocks * 32 * 16);
    }
    P.rows = a->rows;
    P.cols = a->cols;
    P.y = a->y;
    P.y_tok_stride = a->y_tok_stride;
    P.y_grp_stride = a->y_grp_stride;
    P.nt = a->nt;
    P.clamp = a->clamp;
    P.accumulate = a->accumulate;
    P.qo = NULL;
    P.qod = NULL;
    const int64_t warps = QM_TOK * blocks; /* the quantizer's: 8 a block of 256 threads */
    if (mode == Q8M_RUN && !offered)
        ds4_launch(ds4_q8m_quant_kernel, (unsigned)((warps + 7) / 8), 256, 0, cu->stream, a->x, a->x_ld,
                   (int)n_group, a->nt, (int)nblk, buf, (float *)(buf + blocks * 32 * 16));
    *Pout = P;
    *tiles_out = a->rows / QM_ROWS;
    *n_group_out = n_group;
    return 1;
}

static int q8m_run(ds4_cuda *cu, const ds4_q8m_args *a, int epi, int mode, const ds4_q8m_params *same = NULL)
{
    ds4_q8m_params P;
    int64_t tiles = 0, n_group = 0;
    if (!q8m_prepare(cu, a, epi, mode, same, &P, &tiles, &n_group)) return 0;
    if (mode == Q8M_CHECK) return 1;
    /* o_a of a batched step (q8m_want, matmul_grouped_chain): its outputs'
     * blocks for o_b, where y is the tokens' rows of all groups */
    const int64_t width = n_group * a->rows;
    ds4_q8_handoff *h = NULL;
    if (cu->q8m_want && epi == DS4_Q8S_STORE && mode == Q8M_RUN && a->rows % 32 == 0 &&
        a->y_tok_stride == width && (n_group == 1 || a->y_grp_stride == a->rows) && (h = ds4_q8m_maker(cu, width))) {
        P.qo = (uint8_t *)h->q;
        P.qod = h->d;
        if (q8m_launch<DS4_Q8S_STORE>(cu, P, tiles, n_group)) ds4_q8m_offer(cu, h, a->y, width, a->nt);
        return 1;
    }
    switch (epi) {
    case DS4_Q8S_STORE: q8m_launch<DS4_Q8S_STORE>(cu, P, tiles, n_group); break;
    case DS4_Q8S_ADD: q8m_launch<DS4_Q8S_ADD>(cu, P, tiles, n_group); break;
    default: q8m_launch<DS4_Q8S_SWIGLU>(cu, P, tiles, n_group); break;
    }
    return 1;
}

int ds4_q8split_mma_run(ds4_cuda *cu, const ds4_q8m_args *a, int epi) { return q8m_run(cu, a, epi, Q8M_RUN); }

/* Where this file's products take nt tokens of n columns (as one row or
 * in groups of a multiple of 512 columns) */
static bool q8m_takes(const ds4_cuda *cu, int64_t nt, int64_t n)
{
    return q8m_on() && cu->cc_major >= 8 && nt >= 9 && nt <= QM_TOK && n % 512 == 0;
}

/* The q_a norm's rows in the fragment order for q_b (on unless
 * DS4_CUDA_Q8M_NORM=0, for A/B runs) */
bool ds4_q8m_norm_takes(const ds4_cuda *cu, int64_t nt, int64_t n)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_Q8M_NORM", &on) && q8m_takes(cu, nt, n);
}

ds4_q8_handoff *ds4_q8m_maker(ds4_cuda *cu, int64_t n)
{
    ds4_q8_handoff *h = &cu->q8m[cu->q8m_cur ^ 1];
    return ds4_q8_handoff_reserve(cu, h, QM_TOK * n) ? h : NULL;
}

void ds4_q8m_offer(ds4_cuda *cu, ds4_q8_handoff *h, const float *y, int64_t n, int nt)
{
    cu->q8m[0].y = cu->q8m[1].y = NULL;
    h->y = y;
    h->n = n;
    h->nt = nt;
    h->seq = ds4_launch_seq; /* right after the maker's launch */
    cu->q8m_cur = (int)(h - cu->q8m);
}

/* o_a's outputs in the fragment order for o_b (on unless
 * DS4_CUDA_Q8M_OA=0, for A/B runs) */
bool ds4_q8m_oa_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_Q8M_OA", &on);
}

/* A batched step's sites store the sublayer input's blocks for its
 * products (on unless DS4_CUDA_Q8M_SITE=0, for A/B runs) */
bool ds4_q8m_site_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_Q8M_SITE", &on);
}

/* The attention combine's outputs in the fragment order for o_a (on
 * unless DS4_CUDA_Q8M_COMB=0, for A/B runs) */
bool ds4_q8m_comb_takes(const ds4_cuda *cu, int64_t nt, int64_t n)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_Q8M_COMB", &on) && q8m_takes(cu, nt, n);
}

int ds4_q8split_mma_pair(ds4_cuda *cu, const ds4_q8m_args *a1, const ds4_q8m_args *a2, int launch)
{
    /* one activation for both: the same input and shape, no groups; a2's
     * buffer request is a1's, so the buffer neither moves nor grows */
    if (a1->x != a2->x || a1->x_ld != a2->x_ld || a1->nt != a2->nt || a1->cols != a2->cols || a1->n_group > 1 ||
        a2->n_group > 1 || !q8m_run(cu, a1, DS4_Q8S_STORE, Q8M_CHECK) || !q8m_run(cu, a2, DS4_Q8S_STORE, Q8M_CHECK))
        return 0;
    if (!launch) return 1;
    ds4_q8m_params P1, P2;
    int64_t t1 = 0, t2 = 0, g1 = 0, g2 = 0;
    /* a1 quantizes x or takes a maker's blocks of it; a2 reads a1's */
    if (!q8m_prepare(cu, a1, DS4_Q8S_STORE, Q8M_RUN, NULL, &P1, &t1, &g1)) return 0;
    /* both on the 16-warp kernel (the round-by-round form with few tiles):
     * one launch (ds4_q8m_pair_kernel); DS4_CUDA_Q8M_ONE=0 keeps two */
    static int one = -1;
    if (ds4_env_switch_on("DS4_CUDA_Q8M_ONE", &one) && q8m_warps(cu, a1->rows / QM_ROWS) == 16 &&
        q8m_warps(cu, a2->rows / QM_ROWS) == 16) {
        if (!q8m_prepare(cu, a2, DS4_Q8S_STORE, Q8M_REUSE, &P1, &P2, &t2, &g2)) return 0;
        const int ahead = q8m_ahead();
        ds4_launch(ahead == 4   ? ds4_q8m_pair_kernel<4>
                   : ahead == 2 ? ds4_q8m_pair_kernel<2>
                                : ds4_q8m_pair_kernel<0>,
                   (unsigned)(t1 + t2), 16 * 32, 0, cu->stream, P1, P2, (unsigned)t1);
        return 1;
    }
    q8m_launch<DS4_Q8S_STORE>(cu, P1, t1, g1);
    return q8m_run(cu, a2, DS4_Q8S_STORE, Q8M_REUSE, &P1);
}

/*
 * cuda_moe_mma.cu - the routed experts of a prefill chunk on the int8
 * tensor cores (mma.sync m16n8k32, sm_80 and later): IQ2_XXS gate + up +
 * clamped SwiGLU, and the Q2_K down, for groups of up to 16 of an
 * expert's tokens (cuda_moe_grouped.cu sorts the chunk's slots by expert
 * and calls these in place of the dp4a group kernels).
 *
 * Why: the dp4a group kernels decode every weight once per 4 tokens, and
 * the IQ2_XXS decode is most of their instructions, so a 512-token chunk
 * of Flash (~12 tokens an expert) spent half of a prefill's GPU time
 * there. Here a warp decodes 16 rows of one 32-value group straight into
 * the mma's A fragment once per 16 tokens, and one instruction multiplies
 * them by 8 tokens; a group is two such tiles.
 *
 * Exactness: each token gets the decode kernels' numbers bit for bit
 * (cuda_mmvq.cu). Those give lane l of a warp the tasks l, l + 32, ... of a
 * row (IQ2_XXS: a 32-value group, Q2_K: a quarter block), sum each task's
 * integers exactly, turn them into a float term with the block scales and
 * add the terms in that order; the 32 lane sums then meet in the xor tree
 * of ds4_mq_warp_sum (pairs 16 apart first, then 8, 4, 2, 1). An mma gives
 * the same integers (the Q2_K sub-block scales are folded into the A bytes:
 * 3 * 15 fits a byte, and the sum of sc * q * x is the same integer), and
 * the thread holding a (row, token) result visits the lanes' task lists
 * in bit-reversed lane order (0, 16, 8, 24, 4, ...), so a stack of
 * partial sums merges them in the tree's own pairs (a binary counter).
 * Float addition is commutative, so each pair's sum is the tree's.
 *
 * The tree's top two levels pair its four 8-leaf subtrees as (S0 + S1) +
 * (S2 + S3); subtree q is the lanes l with l mod 4 = bitrev2(q), whose
 * tasks are the parts p with p mod 4 = bitrev2(q) (IQ2_XXS) of every
 * block. So four warps share one 16-row tile, each walks one subtree's
 * tasks, and one warp adds the four in the tree's pairs.
 *
 * Layout: the gate/up block is 8 warps (gate's four subtrees, up's four)
 * on 16 rows, the down block 4 warps on 16 rows. A block copies its tiles
 * and the group's 16 activation rows into shared memory (cp.async; rows
 * padded to an odd number of 16-byte units, so the 8 rows one load
 * touches sit in 8 different bank groups): 112 KiB, two gate/up blocks an
 * SM; 52 KiB, four down blocks. The tokens past a group's count compute
 * on whatever rows follow (the scratch has 15 spare rows) and are not
 * stored.
 */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_mq_device.cuh"
#include "backend/cuda/cuda_tables.cuh"

#define MMA_ROWS 16 /* rows a tile */
#define MMA_NT 2    /* 8-token tiles a group */

struct ds4_mma_params {
    const uint8_t *w[2]; /* gate and up, or the down in w[0] */
    int64_t expert_bytes, row_bytes, rows, cols;
    int rs; /* a row's stride in shared memory */
    int abytes, ars; /* an activation row's bytes staged (int8, scales, sums) and their stride in shared memory */
    const uint8_t *act; /* Q8_K rows in the expert-sorted slot order */
    int64_t act_ld;
    float *y; /* rows in that order */
    int64_t y_ld;
    const ds4_mq_group *groups;
    const int32_t *n_groups;
    float clamp;
};

/* c += a (16 x 32, rows) * b (32 x 8, columns), int8 in, int32 out. */
__device__ __forceinline__ void ds4_mma_s8(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap(); /* the host launches these kernels on sm_80 and later only */
#endif
}

/* Leaf ilo (0..7) of a subtree's lane sums into the stack: the binary
 * counter's merges, which are the tree's pairs; the eighth leaf leaves
 * the subtree's value in st[3]. Every stack index is a constant, whether
 * or not ilo is one, so the stack stays in registers. */
template <int N>
__device__ __forceinline__ void ds4_mma_push(float (&st)[4][N], float (&v)[N], int ilo)
{
#define DS4_MMA_EACH(stmt)                                                                                             \
    _Pragma("unroll") for (int n = 0; n < N; n++) stmt
    if (!(ilo & 1)) {
        DS4_MMA_EACH(st[0][n] = v[n]);
        return;
    }
    DS4_MMA_EACH(v[n] = st[0][n] + v[n]);
    if (!(ilo & 2)) {
        DS4_MMA_EACH(st[1][n] = v[n]);
        return;
    }
    DS4_MMA_EACH(v[n] = st[1][n] + v[n]);
    if (!(ilo & 4)) {
        DS4_MMA_EACH(st[2][n] = v[n]);
        return;
    }
    DS4_MMA_EACH(st[3][n] = st[2][n] + v[n]);
#undef DS4_MMA_EACH
}

/* The lane whose task list is leaf i = 8 ihi + ilo: bitrev5(i). */
__device__ __forceinline__ int ds4_mma_leaf_lane(int ilo, int ihi)
{
    const int r3 = ((ilo & 1) << 2) | (ilo & 2) | ((ilo >> 2) & 1);
    return (r3 << 2) | ((ihi & 1) << 1) | ((ihi >> 1) & 1);
}

/* One A byte word of IQ2_XXS: grid row e (0..3) of the group, the half
 * (values 4h .. 4h+3) the shared tables were offset to, signs applied.
 * gsm / ssm: 32-bit shared addresses of the grid and sign-mask words. */
__device__ __forceinline__ uint32_t ds4_mma_iq2_word(uint32_t qa, uint32_t qb, int e, uint32_t gsm, uint32_t ssm)
{
    const uint32_t g = ds4_lds32(gsm + 8u * ((qa >> (8 * e)) & 255u));
    const uint32_t m = ds4_lds32(ssm + 8u * ((qb >> (7 * e)) & 127u));
    return (g ^ m) + (m & 0x01010101u); /* grid bytes are 8..43: ~g + 1 never carries */
}

/* The group's two words (grid indices, signs + scale) at a 2-aligned
 * shared address. */
__device__ __forceinline__ void ds4_mma_iq2_qw(uint32_t a, uint32_t *qa, uint32_t *qb)
{
    const uint32_t a4 = a & ~3u, sh = (a & 3u) * 8u;
    const uint32_t q0 = ds4_lds32(a4), q1 = ds4_lds32(a4 + 4), q2 = ds4_lds32(a4 + 8);
    *qa = __funnelshift_r(q0, q1, sh);
    *qb = __funnelshift_r(q1, q2, sh);
}

/* Subtree q's 8 leaves: leaf lane l's tasks l, l + 32, ... (TPL of them),
 * each added into the leaf's sums by task(t, v) in that order, the leaves
 * merged in the tree's pairs; res = the subtree's value. */
template <int N, int TPL, typename Task>
__device__ __forceinline__ void ds4_mma_subtree(int q, const Task &task, float (&res)[N])
{
    float st[4][N];
#pragma unroll
    for (int n = 0; n < N; n++) st[0][n] = st[1][n] = st[2][n] = st[3][n] = 0.0f;
#pragma unroll
    for (int ilo = 0; ilo < 8; ilo++) {
        const int l = ds4_mma_leaf_lane(ilo, q);
        float v[N];
#pragma unroll
        for (int n = 0; n < N; n++) v[n] = 0.0f;
#pragma unroll 1
        for (int j = 0; j < TPL; j++) task(l + 32 * j, v);
        ds4_mma_push(st, v, ilo);
    }
#pragma unroll
    for (int n = 0; n < N; n++) res[n] = st[3][n];
}

/* Subtree q of the warp's 16 IQ2_XXS rows times the staged tokens. */
template <int NT, int TPL>
__device__ __forceinline__ void ds4_mma_iq2_quarter(const ds4_mma_params &P, uint32_t tile, uint32_t act, int q,
                                                    uint32_t gsm, uint32_t ssm, float (&res)[4 * NT])
{
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3, e0 = c >> 1;
    const uint32_t rA = tile + (uint32_t)(g * P.rs), rB = rA + (uint32_t)(8 * P.rs);
    const uint32_t ald = (uint32_t)P.ars;
    const uint32_t xb = act + g * ald + 4u * c, dxa = act + 2u * c * ald + (uint32_t)P.cols, dxb = dxa + ald;
    ds4_mma_subtree<4 * NT, TPL>(q, [&](int t, float (&v)[4 * NT]) {
            const int b = t >> 3, p = t & 7;
            const uint32_t o = (uint32_t)(b * 66);
            uint32_t qa0, qb0, qa1, qb1;
            ds4_mma_iq2_qw(rA + o + 2u + 8u * (uint32_t)p, &qa0, &qb0);
            ds4_mma_iq2_qw(rB + o + 2u + 8u * (uint32_t)p, &qa1, &qb1);
            const float d0 = ds4_f16(ds4_lds_u16(rA + o)), d1 = ds4_f16(ds4_lds_u16(rB + o));
            const uint32_t a[4] = {ds4_mma_iq2_word(qa0, qb0, e0, gsm, ssm), ds4_mma_iq2_word(qa1, qb1, e0, gsm, ssm),
                                   ds4_mma_iq2_word(qa0, qb0, e0 + 2, gsm, ssm),
                                   ds4_mma_iq2_word(qa1, qb1, e0 + 2, gsm, ssm)};
            const int ls0 = 2 * (int)(qb0 >> 28) + 1, ls1 = 2 * (int)(qb1 >> 28) + 1;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const uint32_t x = xb + nt * 8u * ald + (uint32_t)(b * 256 + 32 * p);
                int C[4] = {0, 0, 0, 0};
                ds4_mma_s8(C, a, ds4_lds32(x), ds4_lds32(x + 16));
                const float x0 = ds4_lds_f32(dxa + nt * 8u * ald + 4u * b), x1 = ds4_lds_f32(dxb + nt * 8u * ald + 4u * b);
                v[4 * nt + 0] += d0 * x0 * (float)(C[0] * ls0);
                v[4 * nt + 1] += d0 * x1 * (float)(C[1] * ls0);
                v[4 * nt + 2] += d1 * x0 * (float)(C[2] * ls1);
                v[4 * nt + 3] += d1 * x1 * (float)(C[3] * ls1);
            }
        }, res);
}

/* Copies rows [0, n) of `bytes` bytes, src_ld apart, to dst, dst_ld apart,
 * by threads [t0, t0 + nthr) of the block (16-byte units). */
__device__ __forceinline__ void ds4_mma_copy_rows(uint8_t *dst, int dst_ld, const uint8_t *src, int64_t src_ld,
                                                  int n, int bytes, int t0, int nthr)
{
    const int n16 = bytes / 16;
    for (int k = (int)threadIdx.x - t0; k < n * n16; k += nthr) {
        const int r = k / n16, o = k - r * n16;
        ds4_mq_cp16(dst + r * dst_ld + 16 * o, src + r * src_ld + 16 * o);
    }
}

/* The group and first row of block blockIdx.x (P.rows / 16 blocks a
 * group); false past the chunk's groups (the grid is sized for the most a
 * chunk can have), for the whole block, so no barrier is left waiting. */
__device__ __forceinline__ bool ds4_mma_block_of(const ds4_mma_params &P, ds4_mq_group *G, int64_t *row0)
{
    const uint32_t rbs = (uint32_t)(P.rows / 16);
    const uint32_t gi = blockIdx.x / rbs, rb = blockIdx.x - gi * rbs;
    if ((int)gi >= *P.n_groups) return false;
    *G = P.groups[gi];
    *row0 = (int64_t)rb * 16;
    return true;
}

/* h rows = clamped SwiGLU(gate, up) for one group, 16 rows a block: warps
 * 0-3 the gate's subtrees, 4-7 the up's. */
template <int NT, int TPL>
__global__ void __launch_bounds__(256, 2) ds4_mma_iq2_swiglu_kernel(const ds4_mma_params P)
{
    extern __shared__ __align__(16) uint8_t sm[];
    uint32_t *grid32 = (uint32_t *)sm;
    uint32_t *sign32 = grid32 + 512;
    float *xch = (float *)(sign32 + 256); /* [8 warps][4 NT][32] */
    uint8_t *act = (uint8_t *)(xch + 8 * 4 * NT * 32);
    uint8_t *tiles = act + 8 * NT * P.ars;
    ds4_pdl_enter();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    ds4_mq_group G;
    int64_t row0;
    if (!ds4_mma_block_of(P, &G, &row0)) return;
    const int m = warp >> 2, q = warp & 3;
    uint8_t *tile = tiles + m * MMA_ROWS * P.rs;
    ds4_mma_copy_rows(tile, P.rs, (m ? P.w[1] : P.w[0]) + (int64_t)G.expert * P.expert_bytes + row0 * P.row_bytes,
                      P.row_bytes, MMA_ROWS, (int)P.row_bytes, 128 * m, 128);
    ds4_mma_copy_rows(act, P.ars, P.act + (int64_t)G.first * P.act_ld, P.act_ld, 8 * NT, P.abytes, 0, 256);
    ds4_mq_cp_commit();
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
        const uint64_t v = ds4_iq2xxs_grid_dev[i];
        grid32[2 * i] = (uint32_t)v, grid32[2 * i + 1] = (uint32_t)(v >> 32);
    }
    for (int i = threadIdx.x; i < 128; i += blockDim.x) {
        const uint64_t v = ds4_mmvq_sign_masks((uint32_t)i);
        sign32[2 * i] = (uint32_t)v, sign32[2 * i + 1] = (uint32_t)(v >> 32);
    }
    ds4_mq_cp_wait<0>();
    __syncthreads();
    const int c = lane & 3, g = lane >> 2;
    const uint32_t half = 4u * (uint32_t)(c & 1);
    float res[4 * NT];
    ds4_mma_iq2_quarter<NT, TPL>(P, (uint32_t)__cvta_generic_to_shared(tile), (uint32_t)__cvta_generic_to_shared(act),
                                 q, (uint32_t)__cvta_generic_to_shared(grid32) + half,
                                 (uint32_t)__cvta_generic_to_shared(sign32) + half, res);
#pragma unroll
    for (int n = 0; n < 4 * NT; n++) xch[(warp * 4 * NT + n) * 32 + lane] = res[n];
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int n = 0; n < 4 * NT; n++) {
        const float *x = xch + n * 32 + lane;
        const int s = 4 * NT * 32; /* one warp's part */
        const float gv = ((x[0] + x[s]) + (x[2 * s] + x[3 * s])) * 0.125f;
        const float uv = ((x[4 * s] + x[5 * s]) + (x[6 * s] + x[7 * s])) * 0.125f;
        const int tok = 8 * (n >> 2) + 2 * c + (n & 1);
        const int64_t row = row0 + g + 8 * ((n >> 1) & 1);
        if (tok < G.n) P.y[(int64_t)(G.first + tok) * P.y_ld + row] = ds4_swiglu_clamped(gv, uv, P.clamp);
    }
}

/* Subtree q of the warp's 16 Q2_K rows times the staged tokens. */
template <int NT, int TPL>
__device__ __forceinline__ void ds4_mma_q2k_quarter(const ds4_mma_params &P, uint32_t tile, uint32_t act, int q,
                                                    float (&res)[4 * NT])
{
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const uint32_t rA = tile + (uint32_t)(g * P.rs), rB = rA + (uint32_t)(8 * P.rs);
    const int nblk = (int)(P.cols / 256);
    const uint32_t ald = (uint32_t)P.ars;
    const uint32_t xb = act + g * ald + 4u * c;
    const uint32_t t0 = act + 2u * c * ald + (uint32_t)P.cols, t1 = t0 + ald; /* dx, then the bsums */
    ds4_mma_subtree<4 * NT, TPL>(q, [&](int t, float (&v)[4 * NT]) {
            const int b = t >> 2, part = t & 3, h = part >> 1, hh = part & 1;
            const uint32_t oA = rA + (uint32_t)(b * 84), oB = rB + (uint32_t)(b * 84);
            const uint32_t qA = ds4_lds32(oA + 16u + 32u * h + 16u * hh + 4u * c);
            const uint32_t qB = ds4_lds32(oB + 16u + 32u * h + 16u * hh + 4u * c);
            const uint32_t sel = hh ? 0x7531u : 0x6420u;
            const uint32_t scA = __byte_perm(ds4_lds32(oA + 8u * h), ds4_lds32(oA + 8u * h + 4u), sel);
            const uint32_t scB = __byte_perm(ds4_lds32(oB + 8u * h), ds4_lds32(oB + 8u * h + 4u), sel);
            const float dA = ds4_f16(ds4_lds_u16(oA + 80)), mA = ds4_f16(ds4_lds_u16(oA + 82));
            const float dB = ds4_f16(ds4_lds_u16(oB + 80)), mB = ds4_f16(ds4_lds_u16(oB + 82));
            uint32_t a[2][4];
#pragma unroll
            for (int jj = 0; jj < 2; jj++) {
                const int j0 = 2 * jj;
                a[jj][0] = ((qA >> (2 * j0)) & 0x03030303u) * ((scA >> (8 * j0)) & 15u);
                a[jj][1] = ((qB >> (2 * j0)) & 0x03030303u) * ((scB >> (8 * j0)) & 15u);
                a[jj][2] = ((qA >> (2 * j0 + 2)) & 0x03030303u) * ((scA >> (8 * j0 + 8)) & 15u);
                a[jj][3] = ((qB >> (2 * j0 + 2)) & 0x03030303u) * ((scB >> (8 * j0 + 8)) & 15u);
            }
            const int sb0 = 8 * h + hh;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const uint32_t x = xb + nt * 8u * ald + (uint32_t)(b * 256 + 16 * sb0);
                int C[4] = {0, 0, 0, 0};
                ds4_mma_s8(C, a[0], ds4_lds32(x), ds4_lds32(x + 32));
                ds4_mma_s8(C, a[1], ds4_lds32(x + 64), ds4_lds32(x + 96));
                const uint32_t u0 = t0 + nt * 8u * ald, u1 = t1 + nt * 8u * ald;
                const float x0 = ds4_lds_f32(u0 + 4u * b), x1 = ds4_lds_f32(u1 + 4u * b);
                const uint32_t bs0 = u0 + 4u * nblk + 2u * (b * 16 + sb0), bs1 = u1 + 4u * nblk + 2u * (b * 16 + sb0);
                int m00 = 0, m01 = 0, m10 = 0, m11 = 0;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const int s0 = ds4_lds_s16(bs0 + 4u * k), s1 = ds4_lds_s16(bs1 + 4u * k);
                    const int mjA = (int)((scA >> (8 * k + 4)) & 15u), mjB = (int)((scB >> (8 * k + 4)) & 15u);
                    m00 += mjA * s0, m01 += mjA * s1, m10 += mjB * s0, m11 += mjB * s1;
                }
                v[4 * nt + 0] += x0 * dA * (float)C[0] - x0 * mA * (float)m00;
                v[4 * nt + 1] += x1 * dA * (float)C[1] - x1 * mA * (float)m01;
                v[4 * nt + 2] += x0 * dB * (float)C[2] - x0 * mB * (float)m10;
                v[4 * nt + 3] += x1 * dB * (float)C[3] - x1 * mB * (float)m11;
            }
        }, res);
}

/* y rows = down(h) for one group, 16 rows a block, warp q: subtree q. */
template <int NT, int TPL>
__global__ void __launch_bounds__(128, 4) ds4_mma_q2k_store_kernel(const ds4_mma_params P)
{
    extern __shared__ __align__(16) uint8_t sm[];
    float *xch = (float *)sm; /* [4 warps][4 NT][32] */
    uint8_t *act = (uint8_t *)(xch + 4 * 4 * NT * 32);
    uint8_t *tile = act + 8 * NT * P.ars;
    ds4_pdl_enter();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    ds4_mq_group G;
    int64_t row0;
    if (!ds4_mma_block_of(P, &G, &row0)) return;
    ds4_mma_copy_rows(tile, P.rs, P.w[0] + (int64_t)G.expert * P.expert_bytes + row0 * P.row_bytes, P.row_bytes,
                      MMA_ROWS, (int)P.row_bytes, 0, 128);
    ds4_mma_copy_rows(act, P.ars, P.act + (int64_t)G.first * P.act_ld, P.act_ld, 8 * NT, P.abytes, 0, 128);
    ds4_mq_cp_commit();
    ds4_mq_cp_wait<0>();
    __syncthreads();
    float res[4 * NT];
    ds4_mma_q2k_quarter<NT, TPL>(P, (uint32_t)__cvta_generic_to_shared(tile), (uint32_t)__cvta_generic_to_shared(act),
                                 warp, res);
#pragma unroll
    for (int n = 0; n < 4 * NT; n++) xch[(warp * 4 * NT + n) * 32 + lane] = res[n];
    __syncthreads();
    if (warp != 0) return;
    const int c = lane & 3, g = lane >> 2;
#pragma unroll
    for (int n = 0; n < 4 * NT; n++) {
        const float *x = xch + n * 32 + lane;
        const int s = 4 * NT * 32;
        const int tok = 8 * (n >> 2) + 2 * c + (n & 1);
        const int64_t row = row0 + g + 8 * ((n >> 1) & 1);
        if (tok < G.n) P.y[(int64_t)(G.first + tok) * P.y_ld + row] = (x[0] + x[s]) + (x[2 * s] + x[3 * s]);
    }
}

/* A row's shared stride: whole 16-byte units, an odd number of them. */
static int ds4_mma_rs(int64_t row_bytes)
{
    const int64_t u = (row_bytes + 15) / 16;
    return (int)(16 * (u % 2 ? u : u + 1));
}

/* Shared memory of a block: gate/up: the tables, the 8 warps' subtree
 * results, 16 activation rows, two 16-row tiles; down: the 4 warps'
 * results, 16 activation rows, one tile. */
static size_t ds4_mma_gu_smem(int rs, int ars) { return 4 * (512 + 256 + 8 * 8 * 32) + (size_t)16 * ars + 2 * 16 * (size_t)rs; }
static size_t ds4_mma_down_smem(int rs, int ars) { return 4 * (4 * 8 * 32) + (size_t)16 * ars + 16 * (size_t)rs; }

extern "C" int ds4_cuda_moe_mma_group_tokens(void) { return 16; }

/* Tasks a lane (IQ2_XXS: 8 a block, Q2_K: 4) when the kernels have a form for it. */
static int ds4_mma_tpl(int64_t tasks) { return tasks == 32 || tasks == 64 || tasks == 128 ? (int)(tasks / 32) : 0; }

extern "C" bool ds4_cuda_moe_mma_covers(ds4_cuda *cu, ds4_type gu_type, ds4_type down_type, int64_t D, int64_t F)
{
    static int on = -1;
    if (!ds4_env_switch_on("DS4_CUDA_MOE_MMA", &on) || cu->cc_major < 8) return false;
    if (gu_type != DS4_TYPE_IQ2_XXS || down_type != DS4_TYPE_Q2_K) return false;
    /* rows whole in 16-byte units (cp.async), 1, 2 or 4 tasks a lane (the
     * decode kernels' lane order is defined over one chunk of at most 32
     * blocks), 16-row tiles, two gate/up blocks and four down blocks an SM */
    const int64_t nd = D / 256, nf = F / 256;
    if (D % 256 || F % 256 || nd % 8 || nf % 4 || !ds4_mma_tpl(8 * nd) || !ds4_mma_tpl(4 * nf) || F % 16 || D % 16)
        return false;
    return ds4_mma_gu_smem(ds4_mma_rs(66 * nd), ds4_mma_rs(260 * nd)) <= 112 * 1024 &&
           ds4_mma_down_smem(ds4_mma_rs(84 * nf), ds4_mma_rs(292 * nf)) <= 56 * 1024;
}

template <typename K>
static ds4_status ds4_mma_launch(ds4_cuda *cu, K kernel, const ds4_mma_params &P, int64_t max_groups, int threads,
                                 size_t smem)
{
    DS4_CUDA_CHECK(cudaFuncSetAttribute((const void *)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const int64_t blocks = max_groups * (P.rows / 16);
    if (blocks >= INT32_MAX) return ds4_fail(DS4_ERR_INVALID, "cuda moe mma: %lld blocks", (long long)blocks);
    ds4_launch(kernel, (unsigned)blocks, threads, smem, cu->stream, P);
    DS4_CUDA_CHECK(cudaGetLastError());
    return DS4_OK;
}

extern "C" ds4_status ds4_cuda_moe_mma_swiglu(ds4_cuda *cu, const void *d_gate, const void *d_up, int64_t F,
                                              int64_t D, const ds4_mq_group *d_groups, const int32_t *d_n_groups,
                                              int64_t max_groups, const void *d_act, int64_t act_ld, float *d_h,
                                              float clamp)
{
    ds4_mma_params P = {};
    P.w[0] = (const uint8_t *)d_gate, P.w[1] = (const uint8_t *)d_up;
    P.row_bytes = 66 * (D / 256), P.rows = F, P.cols = D, P.expert_bytes = F * P.row_bytes;
    P.rs = ds4_mma_rs(P.row_bytes);
    P.abytes = (int)(D + 4 * (D / 256)), P.ars = ds4_mma_rs(P.abytes); /* int8 and scales */
    P.act = (const uint8_t *)d_act, P.act_ld = act_ld, P.y = d_h, P.y_ld = F;
    P.groups = d_groups, P.n_groups = d_n_groups, P.clamp = clamp;
    const size_t smem = ds4_mma_gu_smem(P.rs, P.ars);
    switch (ds4_mma_tpl(8 * (D / 256))) {
    case 1: return ds4_mma_launch(cu, ds4_mma_iq2_swiglu_kernel<MMA_NT, 1>, P, max_groups, 256, smem);
    case 2: return ds4_mma_launch(cu, ds4_mma_iq2_swiglu_kernel<MMA_NT, 2>, P, max_groups, 256, smem);
    case 4: return ds4_mma_launch(cu, ds4_mma_iq2_swiglu_kernel<MMA_NT, 4>, P, max_groups, 256, smem);
    default: return ds4_fail(DS4_ERR_UNSUPPORTED, "cuda moe mma: gate/up width %lld", (long long)D);
    }
}

extern "C" ds4_status ds4_cuda_moe_mma_down(ds4_cuda *cu, const void *d_down, int64_t D, int64_t F,
                                            const ds4_mq_group *d_groups, const int32_t *d_n_groups,
                                            int64_t max_groups, const void *d_act, int64_t act_ld, float *d_y)
{
    ds4_mma_params P = {};
    P.w[0] = (const uint8_t *)d_down;
    P.row_bytes = 84 * (F / 256), P.rows = D, P.cols = F, P.expert_bytes = D * P.row_bytes;
    P.rs = ds4_mma_rs(P.row_bytes);
    P.abytes = (int)(F + 4 * (F / 256) + 2 * (F / 16)), P.ars = ds4_mma_rs(P.abytes); /* int8, scales, sums */
    P.act = (const uint8_t *)d_act, P.act_ld = act_ld, P.y = d_y, P.y_ld = D;
    P.groups = d_groups, P.n_groups = d_n_groups;
    const size_t smem = ds4_mma_down_smem(P.rs, P.ars);
    switch (ds4_mma_tpl(4 * (F / 256))) {
    case 1: return ds4_mma_launch(cu, ds4_mma_q2k_store_kernel<MMA_NT, 1>, P, max_groups, 128, smem);
    case 2: return ds4_mma_launch(cu, ds4_mma_q2k_store_kernel<MMA_NT, 2>, P, max_groups, 128, smem);
    case 4: return ds4_mma_launch(cu, ds4_mma_q2k_store_kernel<MMA_NT, 4>, P, max_groups, 128, smem);
    default: return ds4_fail(DS4_ERR_UNSUPPORTED, "cuda moe mma: down width %lld", (long long)F);
    }
}

/*
 * cuda_q8split_mma.cu - 9 to 16 tokens (batched decode of 9-16 sessions)
 * times a split-layout Q8_0 matrix (cuda_q8split.cu) on the int8 tensor
 * cores, each token's numbers those of its own one-token product.
 *
 * Why: the split-layout kernel takes 8 tokens a weight pass with dp4a, so
 * 16 sessions read every dense matrix twice and spend ~10 instructions a
 * weight byte; a batched step of 16 sessions (8-layer model, ncu) was 32%
 * dense products at ~1 TB/s, compute-bound (docs/BENCHMARKS.md, eleventh
 * session). Here a 16-row tile is read once for all tokens, and
 * mma.sync.m16n8k16 gives the integer sums of 16 rows x 8 tokens over one
 * 16-byte chunk at a time.
 *
 * Exactness: the one-token kernels give lane l of a warp the chunks l,
 * l + 32, ... of a row; each chunk adds (d_w * d_x) * (its integer dot) to
 * the lane's float sum, in chunk order, and the 32 lane sums meet in the
 * warp's xor tree (16, 8, 4, 2, 1). The mma gives the same integers. Warp
 * j of a block keeps the sums of the lanes l = j + 4 i (i = 0..7) for the
 * (row, token) results it holds, adding each chunk's term in the same
 * order with the same expression; those eight lanes are one subtree of the
 * xor tree (pairs i, i + 4, then i, i + 2, then i, i + 1), and the four
 * subtrees meet as (T0 + T2) + (T1 + T3). Float addition is commutative,
 * so every pair's sum is the tree's, bit for bit. The integer becomes a
 * float without the conversion instruction (qm_float), to the same bits.
 *
 * The plain product only (q_b, o_b and the other single matrices); the
 * shared expert's SwiGLU pair and the accumulating form keep the 8-token
 * kernel. On by default since its first GPU run (2026-12-03, twelfth
 * session: 16 sessions 280.6 -> 292.3 tokens/s at full size);
 * DS4_CUDA_Q8S_MMA=0 keeps the two 8-token passes. test_cuda_kernels holds
 * 13 and 16 different tokens to each one's one-token product, bit for bit.
 */
#include "backend/cuda/cuda_blocks.cuh"
#include "backend/cuda/cuda_internal.cuh"

#define QM_WARPS 4  /* the four subtrees */
#define QM_ROWS 16  /* rows a block (the mma's M) */
#define QM_TOK 16   /* tokens at most (two 8-token tiles) */
#define QM_LEAVES 8 /* lanes of the one-token kernel a warp stands for */

struct ds4_q8m_params {
    const uint8_t *qs;   /* the value run */
    const uint16_t *d;   /* the scale run */
    int64_t rows, cols;
    const uint8_t *act; /* nt quantized rows, act_ld apart: cols int8, then cols / 32 float scales */
    int64_t act_ld;
    float *y;
    int64_t y_tok_stride;
    int nt;
};

__device__ __forceinline__ uint32_t qm_ld32(const uint8_t *p) { return __ldg((const uint32_t *)p); }

/* The integer-to-float conversion without I2F (a quarter-rate instruction
 * on sm_90, 8 a thread a chunk, where the rest is full rate): the mma adds
 * its integer n to the bits of 1.5 * 2^23 (QM_MAGIC), and |n| <= 16 * 128 *
 * 127 < 2^22 keeps the sum within that float's binade, where the mantissa
 * counts units: the float is 12582912 + n exactly, and subtracting
 * 12582912 (qm_float) gives n exactly, so the same float as (float)n, bit
 * for bit (n = 0 gives +0, as the conversion does). */
#define QM_MAGIC 0x4B400000
__device__ __forceinline__ float qm_float(int c) { return __int_as_float(c) - 12582912.0f; }

/* c[0..3] = QM_MAGIC + A (16 x 16 s8, rows g and g + 8 in a0 / a1) x B (16 x 8) */
__device__ __forceinline__ void qm_mma(uint32_t a0, uint32_t a1, uint32_t b, int (&c)[4])
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b), "r"(QM_MAGIC));
#else
    c[0] = c[1] = c[2] = c[3] = QM_MAGIC;
#endif
}

/* Block: rows r0 .. r0 + 15, warp j the lanes j + 4 i. Thread (g, q) =
 * (lane / 4, lane % 4) holds the results of rows g and g + 8 for tokens
 * 2q, 2q + 1 (tile 0) and 8 + 2q, 9 + 2q (tile 1): pair p = 4 tile + 2
 * (row g + 8) + (odd token). */
__global__ void __launch_bounds__(QM_WARPS * 32) ds4_q8m_kernel(const ds4_q8m_params P)
{
    ds4_pdl_enter();
    __shared__ float s_t[QM_WARPS][QM_ROWS][QM_TOK];
    const int lane = threadIdx.x & 31, j = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int64_t r0 = (int64_t)blockIdx.x * QM_ROWS;
    const int nch = (int)(P.cols / 16), nblk = (int)(P.cols / 32);
    const int tk[4] = {2 * q, 2 * q + 1, 8 + 2 * q, 9 + 2 * q}; /* the tokens of the thread's results */
    const uint8_t *xb[2] = {P.act + (int64_t)g * P.act_ld, P.act + (int64_t)(g + 8) * P.act_ld};
    float acc[QM_LEAVES][8];
#pragma unroll
    for (int i = 0; i < QM_LEAVES; i++)
#pragma unroll
        for (int p = 0; p < 8; p++) acc[i][p] = 0.0f;
    const uint8_t *wg = P.qs + (r0 + g) * P.cols + 4 * q;
    const uint16_t *dg = P.d + (r0 + g) * nblk;
    for (int c0 = 0; c0 < nch; c0 += 32) {
#pragma unroll
        for (int i = 0; i < QM_LEAVES; i++) {
            const int c = c0 + j + 4 * i; /* lane j + 4 i's chunk of this round */
            uint32_t b[2];
#pragma unroll
            for (int h = 0; h < 2; h++) b[h] = g + 8 * h < P.nt ? qm_ld32(xb[h] + 16 * c + 4 * q) : 0u;
            float dx[4];
#pragma unroll
            for (int u = 0; u < 4; u++)
                dx[u] = tk[u] < P.nt ? __ldg((const float *)(P.act + (int64_t)tk[u] * P.act_ld + P.cols) + (c >> 1))
                                     : 0.0f;
            const uint32_t a0 = qm_ld32(wg + 16 * c), a1 = qm_ld32(wg + 8 * P.cols + 16 * c);
            const float fw[2] = {ds4_f16(__ldg(dg + (c >> 1))), ds4_f16(__ldg(dg + 8 * nblk + (c >> 1)))};
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int is[4];
                qm_mma(a0, a1, b[h], is);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    /* the one-token kernel's expression: (fw * dx) * is added to the lane's sum */
                    const float fwr = fw[e >> 1], dxt = dx[2 * h + (e & 1)];
                    acc[i][4 * h + e] += fwr * dxt * qm_float(is[e]);
                }
            }
        }
    }
    /* subtree j: (i, i + 4), then (i, i + 2), then (i, i + 1) */
#pragma unroll
    for (int p = 0; p < 8; p++) {
        const float t = ((acc[0][p] + acc[4][p]) + (acc[2][p] + acc[6][p])) +
                        ((acc[1][p] + acc[5][p]) + (acc[3][p] + acc[7][p]));
        const int row = g + 8 * ((p >> 1) & 1), tok = tk[2 * (p >> 2) + (p & 1)];
        s_t[j][row][tok] = t;
    }
    __syncthreads();
    for (int o = threadIdx.x; o < QM_ROWS * P.nt; o += QM_WARPS * 32) {
        const int row = o % QM_ROWS, tok = o / QM_ROWS;
        P.y[(int64_t)tok * P.y_tok_stride + r0 + row] =
            (s_t[0][row][tok] + s_t[2][row][tok]) + (s_t[1][row][tok] + s_t[3][row][tok]);
    }
}

static bool q8m_on(void)
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("DS4_CUDA_Q8S_MMA");
        on = !(e && e[0] == '0');
    }
    return on == 1;
}

int ds4_q8split_mma_run(ds4_cuda *cu, const ds4_q8s_args *a, int nt, int epi)
{
    /* the plain product only: the SwiGLU pair and the accumulating form
     * keep the 8-token kernel until they have a test of their own */
    if (!q8m_on() || cu->cc_major < 8 || nt < 9 || nt > QM_TOK || a->n_slots != 1 || a->n_group > 1 ||
        epi != DS4_Q8S_STORE)
        return 0;
    /* whole 16-row tiles, whole rounds of 32 chunks, enough tiles for the SMs */
    if (a->rows % QM_ROWS != 0 || a->cols % 512 != 0 || 2 * (a->rows / QM_ROWS) < cu->n_sm || a->act_ld % 16 != 0 ||
        ((uintptr_t)a->act & 15u) != 0)
        return 0;
    ds4_q8m_params P;
    int64_t total_rows = 0;
    const uint8_t *split = ds4_q8split_find(cu->device, a->w[0], a->rows, a->cols, &total_rows);
    if (!split) return 0;
    P.qs = split;
    P.d = (const uint16_t *)(split + total_rows * a->cols); /* the scale run follows the values */
    P.rows = a->rows;
    P.cols = a->cols;
    P.act = a->act;
    P.act_ld = a->act_ld;
    P.y = a->y;
    P.y_tok_stride = a->y_tok_stride;
    P.nt = nt;
    ds4_launch(ds4_q8m_kernel, (unsigned)(a->rows / QM_ROWS), QM_WARPS * 32, 0, cu->stream, P);
    return 1;
}

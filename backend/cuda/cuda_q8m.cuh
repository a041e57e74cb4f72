/*
 * cuda_q8m.cuh - the device pieces of the int8 tensor-core products of
 * 9-16 tokens on split-layout Q8_0 matrices: the round-by-round kernel
 * (cuda_q8split_mma.cu) and the streaming one (cuda_q8split_mma_stream.cu).
 * Both add a block's terms with qm_pair_add and reduce a tile with
 * qm_to_smem / qm_from_smem, so they give the same bits (and those of each
 * token's one-token product: cuda_q8split_mma.cu says why).
 */
#ifndef DS4_CUDA_Q8M_CUH
#define DS4_CUDA_Q8M_CUH

#include "backend/cuda/cuda_blocks.cuh"
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_mmvq.cuh"

#define QM_ROWS 16  /* rows a tile (the mma's M) */
#define QM_TOK 16   /* tokens at most (two 8-token tiles) */
#define QM_PAIRS 16 /* Q8_0 blocks (chunk pairs) a round of 32 chunks */

/* The k order: for chunk ch (0, 1) of a block, quad thread q holds word
 * 2 (q & 1) + ((q >> 1) ^ ch) of its 16 bytes, so word k is held by
 * qm_quad(ch, k). Thread q loads bytes 8q .. 8q + 7 of the block, words
 * 2 (q & 1) and 2 (q & 1) + 1 of chunk q >> 1, and gets word 2 (q & 1) + 1
 * of the other chunk from thread q ^ 2. */
__device__ __forceinline__ int qm_quad(int ch, int k) { return 2 * ((k & 1) ^ ch) + (k >> 1); }

/* Value `lane` of token t's Q8_0 block blk (a whole warp calls it, one
 * block of 32 values: v is the lane's value), quantized as
 * ds4_mq_quant_q8_0_kernel does (the per-value functions of
 * cuda_mmvq.cuh: the same amax, int8 and scale) and stored in the
 * products' fragment order: byte e of the block goes to the fragment slot
 * 2 ch + t / 8 of quad thread qm_quad(ch, k) in row t % 8 (ch = e / 16,
 * k = e / 4 % 4). The quantizer kernel (cuda_q8split_mma.cu) and the
 * kernels that store their outputs this way for the next product
 * (cb_rmsnorm_q8m_kernel) call it, and the attention combine
 * (cuda_attn_split.cu) the same functions on its 4 values a thread, so
 * they store the same bytes. */
/* The byte of value e of token t's block blk in that order (e, e + 1, e +
 * 2, e + 3 for e a multiple of 4 are consecutive bytes). */
__device__ __forceinline__ int64_t qm_frag_at(int t, int64_t blk, int e)
{
    const int ch = e >> 4, k = (e >> 2) & 3;
    const int dst = 4 * (t & 7) + qm_quad(ch, k), slot = 2 * ch + (t >> 3);
    return (blk * 32 + dst) * 16 + 4 * slot + (e & 3);
}

__device__ __forceinline__ void qm_quant_put(float v, int t, int64_t blk, int lane, uint8_t *xq, float *xd)
{
    float amax = fabsf(v);
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const int8_t qv = ds4_mmvq_q8_0_q(v, ds4_mmvq_q8_0_id(amax));
    xq[qm_frag_at(t, blk, lane)] = (uint8_t)qv;
    if (lane == 0) xd[blk * QM_TOK + t] = ds4_mmvq_q8_0_d(amax);
}

struct ds4_q8m_params {
    const uint8_t *qs[2]; /* value runs (gate, up for the SwiGLU) */
    const uint16_t *d[2]; /* their scale runs */
    int64_t rows, cols;   /* of one group */
    const uint4 *xq;      /* group g's block B: xq[(g * nblk + B) * 32 + lane] (qm_quant_kernel) */
    const float *xd;      /* its scale for token t: xd[(g * nblk + B) * 16 + t] */
    float *y;             /* token t, group g, row r: y[g * y_grp_stride + t * y_tok_stride + r] */
    int64_t y_tok_stride, y_grp_stride;
    int nt;
    float clamp;
    int accumulate;
    /* the outputs' Q8_0 blocks in the fragment order (qm_frag_at) for the
     * next product, scales in qod: only the streaming kernel's STORE with
     * tiles of 32 rows, one block a token's tile (NULL: none) */
    uint8_t *qo;
    float *qod;
};

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
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(b), "r"(QM_MAGIC));
#else
    c[0] = c[1] = c[2] = c[3] = QM_MAGIC;
#endif
}

/* The sums of the halving tree over v[0..n): pairs (k, k + n/2) first, then
 * (k, k + n/4), ..., into v[0]: the xor steps over the pairs P = w + W j,
 * first over j in a warp, then over w. */
template <int N, int H = N / 2> __device__ __forceinline__ void qm_tree(float (&v)[N])
{
    /* one level per instantiation: a loop over the levels was left rolled
     * (in local memory) inside the streaming kernel's step loop */
    if constexpr (H >= 1) {
#pragma unroll
        for (int k = 0; k < H; k++) v[k] += v[k + H];
        qm_tree<N, H / 2>(v);
    }
}

/* One Q8_0 block (32 columns) of the tile's 16 rows into the thread's sums.
 * Thread (g, q) = (lane / 4, lane % 4) holds bytes 8q .. 8q + 7 of the
 * block in row g (v0) and row g + 8 (v1), the activation's fragment words
 * (xv), the token scales 2q, 2q + 1 (dx0) and 8 + 2q, 9 + 2q (dx1) and the
 * rows' weight scales (fw0, fw1). The two chunks are dealt over the quad
 * with one shuffle (the k order the activation shares); acc[ch][p]: chunk
 * ch's sum of result p = 4 h + 2 (row g + 8) + (odd token). */
__device__ __forceinline__ void qm_pair_add(uint2 v0, uint2 v1, uint4 xv, float2 dx0, float2 dx1, float fw0,
                                            float fw1, bool lo, float (&acc)[2][8])
{
    const uint32_t o0 = __shfl_xor_sync(0xffffffffu, v0.y, 2), o1 = __shfl_xor_sync(0xffffffffu, v1.y, 2);
    /* a[ch][rows g / g + 8], b[ch][h]: the fragments of chunk ch */
    const uint32_t a[2][2] = {{lo ? v0.x : o0, lo ? v1.x : o1}, {lo ? o0 : v0.x, lo ? o1 : v1.x}};
    const uint32_t b[2][2] = {{xv.x, xv.y}, {xv.z, xv.w}};
    /* the one-token kernel's d_w * d_x, once for both chunks */
    const float s[8] = {fw0 * dx0.x, fw0 * dx0.y, fw1 * dx0.x, fw1 * dx0.y,
                        fw0 * dx1.x, fw0 * dx1.y, fw1 * dx1.x, fw1 * dx1.y};
#pragma unroll
    for (int ch = 0; ch < 2; ch++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int is[4];
            qm_mma(a[ch][0], a[ch][1], b[ch][h], is);
#pragma unroll
            for (int e = 0; e < 4; e++) /* the one-token kernel's (d_w * d_x) * is added to the lane's sum */
                acc[ch][4 * h + e] += s[4 * h + e] * qm_float(is[e]);
        }
}

/* A warp's sums of its PW pairs, folded by qm_tree, into its slice of
 * s_t[W][2][QM_TOK][QM_ROWS] (chunk, token, row). */
template <int PW>
__device__ __forceinline__ void qm_to_smem(float (&acc)[PW][2][8], float (*s_t)[2][QM_TOK][QM_ROWS], int w, int g,
                                           int q)
{
#pragma unroll
    for (int ch = 0; ch < 2; ch++)
#pragma unroll
        for (int p = 0; p < 8; p++) {
            float t[PW];
#pragma unroll
            for (int j = 0; j < PW; j++) t[j] = acc[j][ch][p];
            qm_tree(t);
            s_t[w][ch][8 * (p >> 2) + 2 * q + (p & 1)][g + 8 * ((p >> 1) & 1)] = t[0];
        }
}

/* Output (tok, row) from the W warps' slices (after a block barrier): each
 * parity's tree over the warps, then the two parities (xor step 1). */
template <int W>
__device__ __forceinline__ float qm_from_smem(const float (*s_t)[2][QM_TOK][QM_ROWS], int tok, int row)
{
    float par[2];
#pragma unroll
    for (int ch = 0; ch < 2; ch++) {
        float u[W];
#pragma unroll
        for (int k = 0; k < W; k++) u[k] = s_t[k][ch][tok][row];
        qm_tree(u);
        par[ch] = u[0];
    }
    return par[0] + par[1];
}

/* The streaming kernel's launch with 8 warps a tile
 * (cuda_q8split_mma_stream.cu): false when it is switched off
 * (DS4_CUDA_Q8M_STREAM=0) or cannot be configured. */
bool ds4_q8m_stream_launch(ds4_cuda *cu, const ds4_q8m_params &P, int epi, int64_t tiles, int64_t n_group,
                           bool *qo_stored);

#endif

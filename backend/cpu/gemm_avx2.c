/*
 * gemm_avx2.c - AVX2 prefill GEMM: packers and microkernels (the path is
 * described in cpu_matmul_kernels.h, driven by cpu_gemm.c).
 *
 * The layout of gemm_avx512.c at half the width: groups of 256 values =
 * 8 int32 lanes x 32 values, lane j = sub-block j, 4 bytes per step, 8
 * steps per group:
 *
 *   weight group: q[8][32] int8 | ws[8] f32 | mw[nmin][8] f32
 *   token group:  q[8][32] int8 | xs[8] f32 | mx[nmin][8] f32
 *
 * Without VNNI the byte products go through vpmaddubsw (unsigned x signed,
 * int16 sums of pairs, saturating): a signed weight enters as |w| and its
 * sign moves onto the activation (vpsignb), which keeps every pair sum
 * within 2 * 128 * 127, and vpmaddwd by ones widens to the int32 lane. So
 * the activations stay signed here and there is no offset correction. The
 * lanes hold what they hold in gemm_avx512.c; a Q2_K group is one
 * super-block (its unsigned weights enter vpmaddubsw as they are, step c is
 * its chunk c, so its packed token is the Q8_K row itself), and its 16
 * mins take nmin = 2 vectors of 8.
 */
#include "backend/cpu/simd_avx2.h"

#include <string.h>

#define GROUP 256
#define WREC(nmin) (256 + 32 + 32 * (nmin))
#define XREC(nmin) (256 + 32 + 32 * (nmin))

/* Register blocks (16 ymm registers: int32 sums, f32 sums, operands). */
#define MR 2
#define NTQ 2
#define MRF 2
#define NTF 4

static int64_t n_groups(int64_t cols)
{
    return (cols + GROUP - 1) / GROUP;
}

/* In: v[k] = the 8 dwords of sub-block k. Out: v[s] lane j = dword s of
 * sub-block j (the classic 8x8 transpose: 32-bit and 64-bit unpacks, then
 * 128-bit lane swaps). */
INLINE void transpose_8x8(__m256i v[8])
{
    __m256i t[8], u[8];
    UNROLL for (int k = 0; k < 8; k += 2) {
        t[k] = _mm256_unpacklo_epi32(v[k], v[k + 1]);
        t[k + 1] = _mm256_unpackhi_epi32(v[k], v[k + 1]);
    }
    UNROLL for (int k = 0; k < 8; k += 4) {
        u[k] = _mm256_unpacklo_epi64(t[k], t[k + 2]);
        u[k + 1] = _mm256_unpackhi_epi64(t[k], t[k + 2]);
        u[k + 2] = _mm256_unpacklo_epi64(t[k + 1], t[k + 3]);
        u[k + 3] = _mm256_unpackhi_epi64(t[k + 1], t[k + 3]);
    }
    UNROLL for (int k = 0; k < 4; k++) {
        v[k] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x20);
        v[k + 4] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x31);
    }
}

/* ---- token side --------------------------------------------------------- */

/* The 8 value-order vectors of a token's group, `left` values valid (rows
 * are whole 32-value blocks, so a vector is all in or all out). */
INLINE void x_group(const int8_t *q, int64_t left, __m256i v[8])
{
    UNROLL for (int k = 0; k < 8; k++)
        v[k] = 32 * k < left ? _mm256_loadu_si256((const __m256i *)(q + 32 * k)) : _mm256_setzero_si256();
}

INLINE __m256 xs_q8_0(const float *d, int64_t nb, int64_t g)
{
    float s[8];
    UNROLL for (int k = 0; k < 8; k++) s[k] = 8 * g + k < nb ? d[8 * g + k] : 0.0f;
    return _mm256_loadu_ps(s);
}

/* mx[h]: Q8_K scale * bsum of sub-blocks 8h..8h+7 of block g. */
INLINE __m256 mx_q8_K(const float *d, const int16_t *bsums, int64_t g, int h)
{
    __m256i bs = _mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i *)(bsums + 16 * g + 8 * h)));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(bs), _mm256_set1_ps(d[g]));
}

static size_t wbytes_n0(int64_t cols) { return (size_t)n_groups(cols) * WREC(0); }
static size_t wbytes_n2(int64_t cols) { return (size_t)n_groups(cols) * WREC(2); }
static size_t xbytes_n0(int64_t cols) { return (size_t)n_groups(cols) * XREC(0); }
static size_t xbytes_n2(int64_t cols) { return (size_t)n_groups(cols) * XREC(2); }

/* Q2K: natural order (see the header), with the mins terms. */
INLINE void pack_x_body(int64_t cols, const void *a, void *out, const int Q8K, const int NMIN)
{
    const int8_t *qs = ds4_act_qs(a);
    const float *d = ds4_act_d(a, cols);
    const int16_t *bsums = Q8K ? ds4_act_bsums(a, cols) : NULL;
    const int64_t nb = cols / QK8_0;
    uint8_t *o = out;
    for (int64_t g = 0; g < n_groups(cols); g++, o += XREC(NMIN)) {
        __m256i v[8];
        x_group(qs + GROUP * g, cols - GROUP * g, v);
        if (!NMIN) transpose_8x8(v);
        UNROLL for (int s = 0; s < 8; s++) _mm256_storeu_si256((__m256i *)(o + 32 * s), v[s]);
        _mm256_storeu_ps((float *)(o + 256), Q8K ? _mm256_set1_ps(d[g]) : xs_q8_0(d, nb, g));
        UNROLL for (int h = 0; h < NMIN; h++) _mm256_storeu_ps((float *)(o + 288 + 32 * h), mx_q8_K(d, bsums, g, h));
    }
}

static void pack_x_q8_0(int64_t cols, const void *a, void *out) { pack_x_body(cols, a, out, 0, 0); }
static void pack_x_q8_K_n0(int64_t cols, const void *a, void *out) { pack_x_body(cols, a, out, 1, 0); }
static void pack_x_q8_K_n2(int64_t cols, const void *a, void *out) { pack_x_body(cols, a, out, 1, 2); }

/* ---- weight decoders: a group's step vectors ----------------------------
 * (v[s] = step s, zero past the row; ws the lane scales; mw the mins
 * vectors of Q2_K), shared by the packer and the fused kernels. */

INLINE void dec_q8_0(const void *row, int64_t cols, int64_t g, __m256i v[8], __m256 *ws, __m256 *mw)
{
    (void)mw;
    const block_q8_0 *b = (const block_q8_0 *)row + 8 * g;
    const int64_t nb = cols / QK8_0 - 8 * g;
    UNROLL for (int k = 0; k < 8; k++)
        v[k] = k < nb ? _mm256_loadu_si256((const __m256i *)b[k].qs) : _mm256_setzero_si256();
    /* scales built in registers (scalar stores read back as one vector
     * cannot be store-forwarded) but for a row's last, partial group */
    if (nb >= 8) {
        *ws = _mm256_set_ps(f16(b[7].d), f16(b[6].d), f16(b[5].d), f16(b[4].d), f16(b[3].d), f16(b[2].d),
                            f16(b[1].d), f16(b[0].d));
    } else {
        float s[8];
        UNROLL for (int k = 0; k < 8; k++) s[k] = k < nb ? f16(b[k].d) : 0.0f;
        *ws = _mm256_loadu_ps(s);
    }
    transpose_8x8(v);
}

INLINE void dec_mxfp4(const void *row, int64_t cols, int64_t g, __m256i v[8], __m256 *ws, __m256 *mw)
{
    (void)mw;
    const block_mxfp4 *b = (const block_mxfp4 *)row + 8 * g;
    const int64_t nb = cols / QK_MXFP4 - 8 * g;
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)ds4_kvalues_mxfp4));
    float s[8];
    UNROLL for (int k = 0; k < 8; k++) {
        v[k] = _mm256_setzero_si256();
        s[k] = 0.0f;
        if (k >= nb) continue;
        __m128i q = _mm_loadu_si128((const __m128i *)b[k].qs);
        __m256i codes = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(15));
        v[k] = _mm256_shuffle_epi8(table, codes);
        s[k] = ds4_k_e8m0_half(b[k].e);
    }
    if (nb >= 8) { /* 2^(e-128) as ds4_k_e8m0_half, in registers (see dec_q8_0) */
        __m256i e = _mm256_set_epi32(b[7].e, b[6].e, b[5].e, b[4].e, b[3].e, b[2].e, b[1].e, b[0].e);
        __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
        __m256i nrm = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
        __m256i small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
        *ws = _mm256_castsi256_ps(_mm256_blendv_epi8(nrm, sub, small));
    } else {
        *ws = _mm256_loadu_ps(s);
    }
    transpose_8x8(v);
}

/* IQ2_XXS: steps 2l and 2l+1 (lane j = group j) are the two dword halves
 * of grid row l (values 8l..8l+7) of the 8 groups: built from the grid
 * rows of groups 0-3 and 4-7 (with their signs) with four permutes, no
 * transpose. */
INLINE void dec_iq2_xxs(const void *row, int64_t cols, int64_t g, __m256i v[8], __m256 *ws, __m256 *mw)
{
    (void)cols, (void)mw;
    const block_iq2_xxs *b = (const block_iq2_xxs *)row + g;
    const uint8_t *p = (const uint8_t *)b->qs; /* qword j: group j's index word, sign word */
    const long long *grid = (const long long *)ds4_iq2xxs_grid;
    /* sign bytes 4j + l -> per 128-bit lane the dwords of rows 0..3 */
    const __m256i by_row = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                            0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    uint32_t sr[8];
    _mm256_storeu_si256((__m256i *)sr, _mm256_shuffle_epi8(iq2_sign_words(p), by_row));
    /* ws = d / 8 * (2 ls + 1), ls = the top 4 bits of the sign words (the
     * odd dwords), in registers (see dec_q8_0) */
    const __m256i odd = _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7);
    __m256i sw = _mm256_blend_epi32(_mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)p), odd),
                                    _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)(p + 32)), odd), 0xf0);
    __m256i ls1 = _mm256_add_epi32(_mm256_slli_epi32(_mm256_srli_epi32(sw, 28), 1), _mm256_set1_epi32(1));
    *ws = _mm256_mul_ps(_mm256_set1_ps(0.125f * f16(b->d)), _mm256_cvtepi32_ps(ls1));
    const __m256i halves = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    UNROLL for (int l = 0; l < 4; l++) {
        __m256i lo = _mm256_set_epi64x(grid[p[24 + l]], grid[p[16 + l]], grid[p[8 + l]], grid[p[l]]);
        __m256i hi = _mm256_set_epi64x(grid[p[56 + l]], grid[p[48 + l]], grid[p[40 + l]], grid[p[32 + l]]);
        lo = _mm256_permutevar8x32_epi32(_mm256_sign_epi8(lo, iq2_sign_vector(sr[l])), halves);
        hi = _mm256_permutevar8x32_epi32(_mm256_sign_epi8(hi, iq2_sign_vector(sr[4 + l])), halves);
        v[2 * l] = _mm256_permute2x128_si256(lo, hi, 0x20);
        v[2 * l + 1] = _mm256_permute2x128_si256(lo, hi, 0x31);
        /* one row's grid loads at a time (gcc would hoist and spill them) */
        __asm__ volatile("" ::: "memory");
    }
}

/* vpshufb controls making int16 scale vectors of the 16 scale nibbles (both
 * lanes): sub-block 2k in the low lane, 2k+1 in the high one. */
static const int8_t q2k_pair_ctrl[8][32] = {
#define Z -128
#define PAIR(a, b) {a, Z, a, Z, a, Z, a, Z, a, Z, a, Z, a, Z, a, Z, b, Z, b, Z, b, Z, b, Z, b, Z, b, Z, b, Z, b, Z}
    PAIR(0, 1), PAIR(2, 3), PAIR(4, 5), PAIR(6, 7), PAIR(8, 9), PAIR(10, 11), PAIR(12, 13), PAIR(14, 15),
#undef PAIR
#undef Z
};

INLINE void dec_q2_K(const void *row, int64_t cols, int64_t g, __m256i v[8], __m256 *ws, __m256 *mw)
{
    (void)cols;
    const block_q2_K *b = (const block_q2_K *)row + g;
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m256i sc4 = _mm256_and_si256(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)b->scales)),
                                         _mm256_set1_epi8(15));
    /* values 32k..32k+31: qs half k/4 at shift 2(k%4), sub-blocks 2k and
     * 2k+1 (one per 128-bit lane); (q + 256 q') * sc keeps the bytes apart
     * (q * sc <= 45) */
    UNROLL for (int k = 0; k < 8; k++) {
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * (k >> 2)));
        __m256i q = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * (k & 3)), m3);
        __m256i sc = _mm256_shuffle_epi8(sc4, _mm256_loadu_si256((const __m256i *)q2k_pair_ctrl[k]));
        v[k] = _mm256_mullo_epi16(q, sc);
    }
    *ws = _mm256_set1_ps(f16(b->d));
    __m128i mins = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)b->scales), 4), _mm_set1_epi8(15));
    __m256 dmin = _mm256_set1_ps(f16(b->dmin));
    mw[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mins)), dmin);
    mw[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(mins, 8))), dmin);
}

#define PACK_W(NAME, DEC, NMIN)                                                         \
    static void NAME(int64_t cols, const void *w, void *out)                            \
    {                                                                                   \
        uint8_t *o = out;                                                               \
        for (int64_t g = 0; g < n_groups(cols); g++, o += WREC(NMIN)) {                 \
            __m256i v[8];                                                               \
            __m256 ws, mw[2];                                                           \
            DEC(w, cols, g, v, &ws, mw);                                                \
            UNROLL for (int s = 0; s < 8; s++) _mm256_storeu_si256((__m256i *)(o + 32 * s), v[s]); \
            _mm256_storeu_ps((float *)(o + 256), ws);                                   \
            UNROLL for (int m = 0; m < NMIN; m++) _mm256_storeu_ps((float *)(o + 288 + 32 * m), mw[m]); \
        }                                                                               \
    }

PACK_W(pack_w_q8_0, dec_q8_0, 0)
PACK_W(pack_w_mxfp4, dec_mxfp4, 0)
PACK_W(pack_w_iq2_xxs, dec_iq2_xxs, 0)
PACK_W(pack_w_q2_K, dec_q2_K, 2)

/* One step of a lane sum: |w| x (+-x), or (UW) unsigned w x x. */
INLINE __m256i step(__m256i is, __m256i x, __m256i w, __m256i wa, const int UW)
{
    __m256i p = UW ? _mm256_maddubs_epi16(w, x) : _mm256_maddubs_epi16(wa, _mm256_sign_epi8(x, w));
    return _mm256_add_epi32(is, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

/* ---- quantized microkernel --------------------------------------------- */

INLINE void gemm_i8_body(int64_t cols, const void *w, size_t wst, int nr, const void *x, size_t xst,
                         const int NT, float *y, size_t ldy, const int NMIN, const int UW)
{
    const uint8_t *wr[MR], *xt[NTQ];
    UNROLL for (int r = 0; r < MR; r++) wr[r] = (const uint8_t *)w + (size_t)(r < nr ? r : nr - 1) * wst;
    UNROLL for (int t = 0; t < NT; t++) xt[t] = (const uint8_t *)x + (size_t)t * xst;
    __m256 acc[MR][NTQ];
    UNROLL for (int r = 0; r < MR; r++)
        UNROLL for (int t = 0; t < NT; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t g = 0, ng = n_groups(cols); g < ng; g++) {
        __m256i is[MR][NTQ];
        UNROLL for (int r = 0; r < MR; r++)
            UNROLL for (int t = 0; t < NT; t++) is[r][t] = _mm256_setzero_si256();
        UNROLL for (int s = 0; s < 8; s++) {
            __m256i xv[NTQ];
            UNROLL for (int t = 0; t < NT; t++) xv[t] = _mm256_loadu_si256((const __m256i *)(xt[t] + 32 * s));
            UNROLL for (int r = 0; r < MR; r++) {
                __m256i wv = _mm256_loadu_si256((const __m256i *)(wr[r] + 32 * s));
                __m256i wa = UW ? wv : _mm256_abs_epi8(wv);
                UNROLL for (int t = 0; t < NT; t++) is[r][t] = step(is[r][t], xv[t], wv, wa, UW);
            }
        }
        UNROLL for (int r = 0; r < MR; r++) {
            __m256 wsv = _mm256_loadu_ps((const float *)(wr[r] + 256));
            UNROLL for (int t = 0; t < NT; t++)
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[r][t]),
                                            _mm256_mul_ps(wsv, _mm256_loadu_ps((const float *)(xt[t] + 256))), acc[r][t]);
            UNROLL for (int m = 0; m < NMIN; m++) {
                __m256 mwv = _mm256_loadu_ps((const float *)(wr[r] + 288 + 32 * m));
                UNROLL for (int t = 0; t < NT; t++)
                    acc[r][t] = _mm256_fnmadd_ps(mwv, _mm256_loadu_ps((const float *)(xt[t] + 288 + 32 * m)), acc[r][t]);
            }
        }
        UNROLL for (int r = 0; r < MR; r++) wr[r] += WREC(NMIN);
        UNROLL for (int t = 0; t < NT; t++) xt[t] += XREC(NMIN);
    }
    UNROLL for (int r = 0; r < MR; r++)
        UNROLL for (int t = 0; t < NT; t++)
            if (r < nr) y[(size_t)t * ldy + r] = hsum8(acc[r][t]);
}

_Static_assert(NTQ == 2, "gemm_i8 instantiates 1..2 tokens");
#define GEMM_I8(NAME, NMIN, UW)                                                                     \
    static void NAME(int64_t cols, const void *w, size_t wst, int nr, const void *x, size_t xst,   \
                     int nt, float *y, size_t ldy)                                                 \
    {                                                                                              \
        if (nt == 1) gemm_i8_body(cols, w, wst, nr, x, xst, 1, y, ldy, NMIN, UW);                  \
        else gemm_i8_body(cols, w, wst, nr, x, xst, 2, y, ldy, NMIN, UW);                          \
    }
GEMM_I8(gemm_i8_signed, 0, 0)
GEMM_I8(gemm_i8_q2, 2, 1)

/* ---- fused kernels: few tokens, no panel (see gemm_avx512.c) ----------- */
#define FUSED(NAME, DEC, NMIN, UW)                                                                 \
    INLINE void NAME##_body(int64_t cols, const void *w, const void *x, size_t xst, const int NT,  \
                            float *y, size_t ldy)                                                  \
    {                                                                                              \
        const uint8_t *xt[4];                                                                      \
        __m256 acc[4];                                                                             \
        UNROLL for (int t = 0; t < NT; t++) {                                                      \
            xt[t] = (const uint8_t *)x + (size_t)t * xst;                                          \
            acc[t] = _mm256_setzero_ps();                                                          \
        }                                                                                          \
        for (int64_t g = 0, ng = n_groups(cols); g < ng; g++) {                                    \
            __m256i v[8], wa[8];                                                                   \
            __m256 ws, mw[2];                                                                      \
            DEC(w, cols, g, v, &ws, mw);                                                           \
            UNROLL for (int s = 0; s < 8; s++) wa[s] = UW ? v[s] : _mm256_abs_epi8(v[s]);          \
            UNROLL for (int t = 0; t < NT; t++) {                                                  \
                __m256i is = _mm256_setzero_si256();                                               \
                UNROLL for (int s = 0; s < 8; s++)                                                 \
                    is = step(is, _mm256_loadu_si256((const __m256i *)(xt[t] + 32 * s)), v[s], wa[s], UW); \
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is),                                   \
                                         _mm256_mul_ps(ws, _mm256_loadu_ps((const float *)(xt[t] + 256))), acc[t]); \
                UNROLL for (int m = 0; m < NMIN; m++)                                              \
                    acc[t] = _mm256_fnmadd_ps(mw[m], _mm256_loadu_ps((const float *)(xt[t] + 288 + 32 * m)), acc[t]); \
                xt[t] += XREC(NMIN);                                                               \
            }                                                                                      \
        }                                                                                          \
        UNROLL for (int t = 0; t < NT; t++) y[(size_t)t * ldy] = hsum8(acc[t]);                    \
    }                                                                                              \
    DS4_NT_DISPATCH(NAME, )

FUSED(fused_q8_0, dec_q8_0, 0, 0)
FUSED(fused_mxfp4, dec_mxfp4, 0, 0)
FUSED(fused_iq2_xxs, dec_iq2_xxs, 0, 0)
FUSED(fused_q2_K, dec_q2_K, 2, 1)

/* ---- float microkernels ------------------------------------------------- */

INLINE __m256 ld_f32(const void *p, int64_t i) { return _mm256_loadu_ps((const float *)p + i); }
INLINE __m256 ld_f16(const void *p, int64_t i)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
}
INLINE __m256 ld_bf16(const void *p, int64_t i)
{
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
#define SC_F32(p, k) (((const float *)(p))[k])
#define SC_F16(p, k) (f16(((const uint16_t *)(p))[k]))
#define SC_BF16(p, k) (ds4_k_bf16_to_f32(((const uint16_t *)(p))[k]))

/* MRF rows x NT tokens of 8-lane f32 FMA chains, one per (row, token), and
 * the tail in scalar: the same per (row, token) whatever the block, so no
 * result depends on n_tok. The rows are read as stored, for any n_tok. */
#define GEMM_FLOAT(NAME, LD, SCALAR)                                                                \
    INLINE void NAME##_body(int64_t cols, const void *w, size_t wst, int nr, const void *x,         \
                            size_t xst, const int NT, float *y, size_t ldy)          \
    {                                                                                              \
        const char *wr[MRF];                                                                       \
        const float *xt[NTF];                                                                      \
        UNROLL for (int r = 0; r < MRF; r++) wr[r] = (const char *)w + (size_t)(r < nr ? r : nr - 1) * wst; \
        UNROLL for (int t = 0; t < NT; t++) xt[t] = (const float *)((const char *)x + (size_t)t * xst); \
        __m256 acc[MRF][NTF];                                                                      \
        UNROLL for (int r = 0; r < MRF; r++)                                                       \
            UNROLL for (int t = 0; t < NT; t++) acc[r][t] = _mm256_setzero_ps();                   \
        int64_t i = 0;                                                                             \
        for (; i + 8 <= cols; i += 8) {                                                            \
            __m256 wv[MRF];                                                                        \
            UNROLL for (int r = 0; r < MRF; r++) wv[r] = LD(wr[r], i);                             \
            UNROLL for (int t = 0; t < NT; t++) {                                                  \
                __m256 xv = _mm256_loadu_ps(xt[t] + i);                                            \
                UNROLL for (int r = 0; r < MRF; r++) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]); \
            }                                                                                      \
        }                                                                                          \
        UNROLL for (int r = 0; r < MRF; r++)                                                       \
            UNROLL for (int t = 0; t < NT; t++) {                                                  \
                if (r >= nr) continue;                                                             \
                float s = hsum8(acc[r][t]);                                                        \
                for (int64_t k = i; k < cols; k++) s += SCALAR(wr[r], k) * xt[t][k];               \
                y[(size_t)t * ldy + r] = s;                                                        \
            }                                                                                      \
    }                                                                                              \
    static void NAME(int64_t cols, const void *w, size_t wst, int nr, const void *x, size_t xst,   \
                     int nt, float *y, size_t ldy)                                                 \
    {                                                                                              \
        switch (nt) {                                                                              \
        case 1: NAME##_body(cols, w, wst, nr, x, xst, 1, y, ldy); break;                      \
        case 2: NAME##_body(cols, w, wst, nr, x, xst, 2, y, ldy); break;                      \
        case 3: NAME##_body(cols, w, wst, nr, x, xst, 3, y, ldy); break;                      \
        default: NAME##_body(cols, w, wst, nr, x, xst, 4, y, ldy); break;                     \
        }                                                                                          \
    }

_Static_assert(NTF == 4 && DS4_TILE_TOK == 4, "the float kernels instantiate 1..4 tokens");
GEMM_FLOAT(gemm_f32, ld_f32, SC_F32)
GEMM_FLOAT(gemm_f16, ld_f16, SC_F16)
GEMM_FLOAT(gemm_bf16, ld_bf16, SC_BF16)

/* ---- table -------------------------------------------------------------- */

#define OPS_Q(NAME, PW, PX, K, GEMM, FUSED) \
    static const ds4_gemm_ops NAME = {MR, NTQ, wbytes_##K, PW, xbytes_##K, PX, GEMM, FUSED, 1, 4, NULL, NULL, NULL, 0}
OPS_Q(ops_q8_0, pack_w_q8_0, pack_x_q8_0, n0, gemm_i8_signed, fused_q8_0);
OPS_Q(ops_mxfp4, pack_w_mxfp4, pack_x_q8_0, n0, gemm_i8_signed, fused_mxfp4);
OPS_Q(ops_iq2_xxs, pack_w_iq2_xxs, pack_x_q8_K_n0, n0, gemm_i8_signed, fused_iq2_xxs);
OPS_Q(ops_q2_K, pack_w_q2_K, pack_x_q8_K_n2, n2, gemm_i8_q2, fused_q2_K);
static const ds4_gemm_ops ops_f32 = {MRF, NTF, NULL, NULL, NULL, NULL, gemm_f32, gemm_f32, MRF, NTF, NULL, NULL, NULL, 0};
static const ds4_gemm_ops ops_f16 = {MRF, NTF, NULL, NULL, NULL, NULL, gemm_f16, gemm_f16, MRF, NTF, NULL, NULL, NULL, 0};
static const ds4_gemm_ops ops_bf16 = {MRF, NTF, NULL, NULL, NULL, NULL, gemm_bf16, gemm_bf16, MRF, NTF, NULL, NULL, NULL, 0};

const ds4_gemm_ops *ds4_cpu_gemm_avx2(ds4_type type)
{
    switch (type) {
    case DS4_TYPE_Q8_0: return &ops_q8_0;
    case DS4_TYPE_MXFP4: return &ops_mxfp4;
    case DS4_TYPE_IQ2_XXS: return &ops_iq2_xxs;
    case DS4_TYPE_Q2_K: return &ops_q2_K;
    case DS4_TYPE_F32: return &ops_f32;
    case DS4_TYPE_F16: return &ops_f16;
    case DS4_TYPE_BF16: return &ops_bf16;
    default: return NULL;
    }
}

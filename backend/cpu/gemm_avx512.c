/*
 * gemm_avx512.c - AVX-512 (VNNI) GEMM: packers and microkernels (the path
 * is described in cpu_matmul_kernels.h, driven by cpu_gemm.c).
 *
 * Quantized types. A packed row is a sequence of groups of 512 values =
 * 16 int32 lanes x 32 values; vpdpbusd adds 4 byte products per lane and
 * step, 8 steps per group, and each lane's 32 values share one float scale,
 * so a group costs one vpdpbusd per step and row x token, and once per
 * group a convert and two float operations with the product of the lane
 * scales ws * xs:
 *
 *   weight group: q[8][64] int8 | corr[16] int32 | ws[16] f32 | mw[nmin][16] f32
 *   token group:  q[8][64] int8 | xs[16] f32 | mx[nmin][16] f32
 *
 * Signed weights (Q8_0, MXFP4, IQ2_XXS): vpdpbusd multiplies unsigned by
 * signed bytes, so the activations are stored offset by 128 (x ^ 0x80) and
 * each weight lane starts its sum at corr = -128 * (sum of its weights):
 * the int32 sums are exactly those of x * w. Lane j is sub-block j (32
 * values) and step s holds its values 4s..4s+3, a transpose of the value
 * order:
 *   Q8_0    one block per lane; ws = d, xs = the Q8_0 activation scale
 *   MXFP4   the same, values from the E2M1 table, ws = 2^(e-128)
 *   IQ2_XXS one 32-value group per lane: +-grid bytes (|v| <= 43),
 *           ws = d * (2 ls + 1) / 8 (exact in f32), xs = the Q8_K scale
 * Q2_K: the weights q * scale (<= 45, the 16-value sub-block scales folded
 * in) are unsigned, so they are vpdpbusd's unsigned side and the
 * activations stay as they are (no corr). With the scales folded in, a lane
 * may hold any 32 values of one super-block (ws = d): step c is simply the
 * 32-value chunk c of each of the group's two super-blocks, no transpose.
 * The mins are nmin = 2 extra vectors: mw = dmin * m per sub-block, mx =
 * Q8_K scale * bsum, subtracted (mw . mx).
 * Rows and tokens past the end of the row are zero (weights 0, x 0).
 *
 * The decoders give a group's step vectors, used by the packer (GEMM with
 * many tokens) and by the fused kernels (a few tokens, decode: no panel),
 * which compute the same numbers in the same order.
 *
 * Float types are not packed: rows x tokens of f32 FMAs on the stored rows
 * (F16/BF16 widened as loaded) and the f32 activations.
 */
#include "backend/cpu/simd_avx512.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define GROUP 512
#define WREC(nmin) (512 + 64 + 64 + 64 * (nmin))
#define XREC(nmin) (512 + 64 + 64 * (nmin))

/* Register blocks: rows x tokens. 4 x 4 quantized (16 int32 + 16 f32 sums:
 * a few f32 sums live on the stack, touched once per group) measured ~12%
 * faster than 4 x 3, 5 x 3 or 3 x 4 on Zen 4, and 4 x 5, 5 x 4, 4 x 6, 8 x 2
 * were no better. */
#define MR 4
#define NTQ 4
#define MRF 4
#define NTF 4

static int64_t n_groups(int64_t cols)
{
    return (cols + GROUP - 1) / GROUP;
}

/* ---- the lane-per-sub-block transpose ----------------------------------
 *
 * In: v[k] = sub-blocks 2k (lanes 0-7) and 2k+1 (lanes 8-15), 8 dwords
 * each, in value order. Out: v[s] lane j = dword s of sub-block j. Element
 * (j, s) sits in register j>>1 at lane (j&1)*8 + s; three vpermt2d stages
 * each swap one register-index bit with one lane bit (j1<->s0, j2<->s1,
 * j3<->s2), the last one also putting the lanes in the order j. */
#define L16(F) F(0), F(1), F(2), F(3), F(4), F(5), F(6), F(7), F(8), F(9), F(10), F(11), F(12), F(13), F(14), F(15)
#define TA(L) ((((L) & 1) << 4) | ((L) & 14))
#define TB(L) (((((L) >> 1) & 1) << 4) | ((L) & 13))
#define TC(L) (((((L) >> 3) & 1) << 4) | (((L) & 1) << 3) | ((((L) >> 2) & 1) << 1) | (((L) >> 1) & 1))
static const int32_t tr_a[16] = {L16(TA)}, tr_b[16] = {L16(TB)}, tr_c[16] = {L16(TC)};

INLINE void transpose_16x8(__m512i v[8])
{
    const __m512i a0 = _mm512_loadu_si512(tr_a), a1 = _mm512_or_si512(a0, _mm512_set1_epi32(1));
    const __m512i b0 = _mm512_loadu_si512(tr_b), b1 = _mm512_or_si512(b0, _mm512_set1_epi32(2));
    const __m512i c0 = _mm512_loadu_si512(tr_c), c1 = _mm512_or_si512(c0, _mm512_set1_epi32(4));
    __m512i a[8], b[8];
    UNROLL for (int m = 0; m < 4; m++) {
        a[2 * m] = _mm512_permutex2var_epi32(v[2 * m], a0, v[2 * m + 1]);
        a[2 * m + 1] = _mm512_permutex2var_epi32(v[2 * m], a1, v[2 * m + 1]);
    }
    UNROLL for (int q = 0; q < 4; q++) {
        int k = (q & 1) | ((q & 2) << 1); /* 0, 1, 4, 5 */
        b[k] = _mm512_permutex2var_epi32(a[k], b0, a[k + 2]);
        b[k + 2] = _mm512_permutex2var_epi32(a[k], b1, a[k + 2]);
    }
    UNROLL for (int k = 0; k < 4; k++) {
        v[k] = _mm512_permutex2var_epi32(b[k], c0, b[k + 4]);
        v[k + 4] = _mm512_permutex2var_epi32(b[k], c1, b[k + 4]);
    }
}

/* corr = -128 * the sum of each lane's weights (over the 8 steps). */
INLINE __m512i lane_corr(const __m512i v[8])
{
    const __m512i k128 = _mm512_set1_epi8((char)0x80);
    __m512i c[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    UNROLL for (int s = 0; s < 8; s++) c[s & 1] = _mm512_dpbusd_epi32(c[s & 1], k128, v[s]);
    return _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_add_epi32(c[0], c[1]));
}

/* 64 bytes at q, `left` of them valid (zero past them). */
INLINE __m512i load_left(const int8_t *q, int64_t left)
{
    __mmask64 m = left >= 64 ? ~(__mmask64)0 : left <= 0 ? 0 : (((__mmask64)1 << left) - 1);
    return _mm512_maskz_loadu_epi8(m, q);
}

INLINE __m512 set2x8(float a, float b)
{
    return _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1);
}

static size_t wbytes_n0(int64_t cols) { return (size_t)n_groups(cols) * WREC(0); }
static size_t wbytes_n2(int64_t cols) { return (size_t)n_groups(cols) * WREC(2); }
static size_t xbytes_n0(int64_t cols) { return (size_t)n_groups(cols) * XREC(0); }
static size_t xbytes_n2(int64_t cols) { return (size_t)n_groups(cols) * XREC(2); }

/* ---- token packers ------------------------------------------------------ */

/* Transposed, offset to u8 (signed-weight types); xs per Q8_0 block or per
 * Q8_K block (8 lanes each). */
INLINE void pack_x_t(int64_t cols, const void *a, void *out, const int Q8K)
{
    const int8_t *qs = ds4_act_qs(a);
    const float *d = ds4_act_d(a, cols);
    const int64_t nb = Q8K ? cols / QK_K : cols / QK8_0;
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    uint8_t *o = out;
    for (int64_t g = 0; g < n_groups(cols); g++, o += XREC(0)) {
        __m512i v[8];
        UNROLL for (int k = 0; k < 8; k++)
            v[k] = _mm512_xor_si512(load_left(qs + GROUP * g + 64 * k, cols - GROUP * g - 64 * k), flip);
        transpose_16x8(v);
        UNROLL for (int s = 0; s < 8; s++) _mm512_storeu_si512(o + 64 * s, v[s]);
        __m512 xs;
        if (Q8K) {
            xs = set2x8(d[2 * g], 2 * g + 1 < nb ? d[2 * g + 1] : 0.0f);
        } else {
            int64_t left = nb - 16 * g;
            xs = _mm512_maskz_loadu_ps(left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1), d + 16 * g);
        }
        _mm512_storeu_ps(o + 512, xs);
    }
}

static void pack_x_q8_0(int64_t cols, const void *a, void *out) { pack_x_t(cols, a, out, 0); }
static void pack_x_q8_K_t(int64_t cols, const void *a, void *out) { pack_x_t(cols, a, out, 1); }

/* Q2_K's layout: step c = chunk c (32 values) of super-blocks 2g and
 * 2g+1, as they are; xs; mx = Q8_K scale * bsum of each 16-value
 * sub-block. */
static void pack_x_q8_K_q2(int64_t cols, const void *a, void *out)
{
    const int8_t *qs = ds4_act_qs(a);
    const float *d = ds4_act_d(a, cols);
    const int16_t *bsums = ds4_act_bsums(a, cols);
    const int64_t nsb = cols / QK_K;
    uint8_t *o = out;
    for (int64_t g = 0; g < n_groups(cols); g++, o += XREC(2)) {
        int two = 2 * g + 1 < nsb;
        const int8_t *q0 = qs + GROUP * g, *q1 = q0 + QK_K;
        UNROLL for (int c = 0; c < 8; c++) {
            __m256i hi = two ? _mm256_loadu_si256((const __m256i *)(q1 + 32 * c)) : _mm256_setzero_si256();
            _mm512_storeu_si512(o + 64 * c, _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(q0 + 32 * c))), hi, 1));
        }
        float d0 = d[2 * g], d1 = two ? d[2 * g + 1] : 0.0f;
        _mm512_storeu_ps(o + 512, set2x8(d0, d1));
        UNROLL for (int h = 0; h < 2; h++) {
            __m512 mx = _mm512_setzero_ps();
            if (h == 0 || two) {
                __m256i bs = _mm256_loadu_si256((const __m256i *)(bsums + 16 * (2 * g + h)));
                mx = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(bs)), _mm512_set1_ps(h ? d1 : d0));
            }
            _mm512_storeu_ps(o + 576 + 64 * h, mx);
        }
    }
}

/* ---- weight decoders: a group's step vectors ----------------------------
 *
 * dec_TYPE(row, cols, g, v, &corr, &ws, mw): v = the 8 step vectors of
 * group g of the row, corr/ws/mw as in the packed record. Shared by the
 * packer and the fused kernels, so both see the same numbers. */

INLINE void dec_q8_0(const void *row, int64_t cols, int64_t g, __m512i v[8], __m512i *corr, __m512 *ws, __m512 *mw)
{
    (void)mw;
    const block_q8_0 *b = (const block_q8_0 *)row + 16 * g;
    const int64_t nb = cols / QK8_0 - 16 * g;
    uint16_t h[16];
    /* (scales built in registers: 16 scalar stores read back as a vector
     * cannot be store-forwarded, and that stall cost ~15% of decode) */
    UNROLL for (int k = 0; k < 8; k++) {
        __m256i lo = 2 * k < nb ? _mm256_loadu_si256((const __m256i *)b[2 * k].qs) : _mm256_setzero_si256();
        __m256i hi = 2 * k + 1 < nb ? _mm256_loadu_si256((const __m256i *)b[2 * k + 1].qs) : _mm256_setzero_si256();
        v[k] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    }
    if (nb >= 16) {
        *ws = _mm512_cvtph_ps(_mm256_set_epi16((short)b[15].d, (short)b[14].d, (short)b[13].d, (short)b[12].d,
                                               (short)b[11].d, (short)b[10].d, (short)b[9].d, (short)b[8].d,
                                               (short)b[7].d, (short)b[6].d, (short)b[5].d, (short)b[4].d,
                                               (short)b[3].d, (short)b[2].d, (short)b[1].d, (short)b[0].d));
    } else { /* the last group of a row: some blocks past its end */
        UNROLL for (int j = 0; j < 16; j++) h[j] = j < nb ? b[j].d : 0;
        *ws = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
    }
    transpose_16x8(v);
    *corr = lane_corr(v);
}

/* 32 MXFP4 values of a block, as int8 in value order. */
INLINE __m256i mxfp4_values(const uint8_t *qs, __m256i table)
{
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    __m256i codes = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(15));
    return _mm256_shuffle_epi8(table, codes);
}

INLINE void dec_mxfp4(const void *row, int64_t cols, int64_t g, __m512i v[8], __m512i *corr, __m512 *ws, __m512 *mw)
{
    (void)mw;
    const block_mxfp4 *b = (const block_mxfp4 *)row + 16 * g;
    const int64_t nb = cols / QK_MXFP4 - 16 * g;
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)ds4_kvalues_mxfp4));
    float s[16];
    UNROLL for (int k = 0; k < 8; k++) {
        __m256i lo = 2 * k < nb ? mxfp4_values(b[2 * k].qs, table) : _mm256_setzero_si256();
        __m256i hi = 2 * k + 1 < nb ? mxfp4_values(b[2 * k + 1].qs, table) : _mm256_setzero_si256();
        v[k] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    }
    if (nb >= 16) { /* 2^(e-128), as ds4_k_e8m0_half, 16 at a time */
        __m512i e = _mm512_set_epi32(b[15].e, b[14].e, b[13].e, b[12].e, b[11].e, b[10].e, b[9].e, b[8].e,
                                     b[7].e, b[6].e, b[5].e, b[4].e, b[3].e, b[2].e, b[1].e, b[0].e);
        __m512i sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
        __m512i nrm = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
        *ws = _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2)), nrm, sub));
    } else {
        UNROLL for (int j = 0; j < 16; j++) s[j] = j < nb ? ds4_k_e8m0_half(b[j].e) : 0.0f;
        *ws = _mm512_loadu_ps(s);
    }
    transpose_16x8(v);
    *corr = lane_corr(v);
}

/* IQ2_XXS: grid row l (values 8l..8l+7) of the 16 groups of the two
 * super-blocks is two vectors of 8 qwords (groups 0-7, 8-15); their even
 * dwords are step 2l, the odd ones step 2l+1: the transposed layout, built
 * from the grid rows with one vpermt2d per step. The sign bits of a
 * super-block, regrouped so that qword l holds row l's 8 sign bytes of its
 * 8 groups, are applied to the grid rows first. */
static const int32_t iq2_even[16] = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};

INLINE __m256i iq2_signs_by_row(__m512i q)
{
    /* byte 4 * group + l -> row-major: per 128-bit lane (groups 0-3, 4-7)
     * the dwords of rows 0..3, then the two lanes' dwords paired per row */
    const __m256i by_row = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                            0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    __m256i s = _mm256_shuffle_epi8(iq2_signs_block(q), by_row);
    return _mm256_permutevar8x32_epi32(s, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static const uint8_t zero_block[64];

INLINE void dec_iq2_xxs(const void *row, int64_t cols, int64_t g, __m512i v[8], __m512i *corr, __m512 *ws, __m512 *mw)
{
    (void)mw;
    const block_iq2_xxs *b = (const block_iq2_xxs *)row + 2 * g;
    const int two = cols / QK_K - 2 * g > 1;
    const long long *grid = (const long long *)ds4_iq2xxs_grid;
    const __m512i even = _mm512_loadu_si512(iq2_even), odd = _mm512_or_si512(even, _mm512_set1_epi32(1));
    /* qword j of a block's qs: group j's index word (byte l: row l's grid
     * index), then its sign word (7-bit fields, the 4-bit scale on top) */
    const uint8_t *ix[2] = {(const uint8_t *)b[0].qs, two ? (const uint8_t *)b[1].qs : zero_block};
    __m512i q[2] = {_mm512_loadu_si512(ix[0]), _mm512_loadu_si512(ix[1])};
    uint64_t signs[2][4];
    UNROLL for (int sb = 0; sb < 2; sb++) _mm256_storeu_si256((__m256i *)signs[sb], iq2_signs_by_row(q[sb]));
    /* ws = d / 8 * (2 ls + 1), ls = the top 4 bits of the sign words */
    __m512i ls = _mm512_permutex2var_epi32(_mm512_srli_epi64(q[0], 60), even, _mm512_srli_epi64(q[1], 60));
    __m512 ls1 = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(ls, 1), _mm512_set1_epi32(1)));
    *ws = _mm512_mul_ps(set2x8(0.125f * f16(b[0].d), two ? 0.125f * f16(b[1].d) : 0.0f), ls1);
    UNROLL for (int l = 0; l < 4; l++) {
        __m512i r[2];
        UNROLL for (int sb = 0; sb < 2; sb++) {
            const uint8_t *p = ix[sb];
            __m512i gv = _mm512_set_epi64(grid[p[56 + l]], grid[p[48 + l]], grid[p[40 + l]], grid[p[32 + l]],
                                          grid[p[24 + l]], grid[p[16 + l]], grid[p[8 + l]], grid[p[l]]);
            r[sb] = _mm512_mask_sub_epi8(gv, _cvtu64_mask64(signs[sb][l]), _mm512_setzero_si512(), gv);
        }
        if (!two) r[1] = _mm512_setzero_si512();
        v[2 * l] = _mm512_permutex2var_epi32(r[0], even, r[1]);
        v[2 * l + 1] = _mm512_permutex2var_epi32(r[0], odd, r[1]);
        /* one row's 16 grid loads at a time: gcc would otherwise issue all
         * 64 first and spill them to the stack */
        __asm__ volatile("" ::: "memory");
    }
    *corr = lane_corr(v);
}

/* vpermw indices spreading the 32 scale words of two Q2_K blocks (0-15,
 * 16-31) over step c: its 128-bit lanes are sub-blocks 2c, 2c+1 of the
 * first block, then of the second. */
static const int16_t q2k_sc_idx[8][32] = {
#define R(a) a, a, a, a, a, a, a, a
#define C(c) {R(2 * (c)), R(2 * (c) + 1), R(16 + 2 * (c)), R(17 + 2 * (c))}
    C(0), C(1), C(2), C(3), C(4), C(5), C(6), C(7),
#undef C
#undef R
};

INLINE void dec_q2_K(const void *row, int64_t cols, int64_t g, __m512i v[8], __m512i *corr, __m512 *ws, __m512 *mw)
{
    const block_q2_K *b = (const block_q2_K *)row + 2 * g;
    const int two = cols / QK_K - 2 * g > 1;
    const __m512i m3 = _mm512_set1_epi8(3);
    __m128i sc1 = two ? _mm_loadu_si128((const __m128i *)b[1].scales) : _mm_setzero_si128();
    __m256i sc = _mm256_set_m128i(sc1, _mm_loadu_si128((const __m128i *)b[0].scales));
    __m512i scw = _mm512_cvtepu8_epi16(_mm256_and_si256(sc, _mm256_set1_epi8(15)));
    __m256i mins = _mm256_and_si256(_mm256_srli_epi16(sc, 4), _mm256_set1_epi8(15));
    float dmin1 = two ? f16(b[1].dmin) : 0.0f, d1 = two ? f16(b[1].d) : 0.0f;
    mw[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(mins))), _mm512_set1_ps(f16(b[0].dmin)));
    mw[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(mins, 1))), _mm512_set1_ps(dmin1));
    *ws = set2x8(f16(b[0].d), d1);
    /* chunk c = values 32c..32c+31: qs half c/4 at shift 2(c%4); (q + 256
     * q') * sc keeps both bytes apart (q * sc <= 45) */
    UNROLL for (int h = 0; h < 2; h++) {
        __m256i hi = two ? _mm256_loadu_si256((const __m256i *)(b[1].qs + 32 * h)) : _mm256_setzero_si256();
        __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b[0].qs + 32 * h))), hi, 1);
        UNROLL for (int s = 0; s < 4; s++) {
            int c = 4 * h + s;
            __m512i x = _mm512_and_si512(_mm512_srli_epi16(q, 2 * s), m3);
            v[c] = _mm512_mullo_epi16(x, _mm512_permutexvar_epi16(_mm512_loadu_si512(q2k_sc_idx[c]), scw));
        }
    }
    *corr = _mm512_setzero_si512();
}

/* Packed weight row: per group the step vectors, corr, ws, mw. */
#define PACK_W(NAME, DEC, NMIN)                                                       \
    static void NAME(int64_t cols, const void *w, void *out)                          \
    {                                                                                 \
        uint8_t *o = out;                                                             \
        for (int64_t g = 0; g < n_groups(cols); g++, o += WREC(NMIN)) {               \
            __m512i v[8], corr;                                                       \
            __m512 ws, mw[2];                                                         \
            DEC(w, cols, g, v, &corr, &ws, mw);                                       \
            UNROLL for (int s = 0; s < 8; s++) _mm512_storeu_si512(o + 64 * s, v[s]); \
            _mm512_storeu_si512(o + 512, corr);                                       \
            _mm512_storeu_ps(o + 576, ws);                                            \
            UNROLL for (int m = 0; m < NMIN; m++) _mm512_storeu_ps(o + 640 + 64 * m, mw[m]); \
        }                                                                             \
    }

PACK_W(pack_w_q8_0, dec_q8_0, 0)
PACK_W(pack_w_mxfp4, dec_mxfp4, 0)
PACK_W(pack_w_iq2_xxs, dec_iq2_xxs, 0)
PACK_W(pack_w_q2_K, dec_q2_K, 2)

/* One step of a lane sum: signed weights against offset activations, or
 * (UW) unsigned weights against the activations as they are. */
INLINE __m512i step(__m512i is, __m512i x, __m512i w, const int UW)
{
    return UW ? _mm512_dpbusd_epi32(is, w, x) : _mm512_dpbusd_epi32(is, x, w);
}

/* ---- quantized microkernel --------------------------------------------- */

INLINE void gemm_i8_body(int64_t cols, const void *w, size_t wst, int nr, const void *x, size_t xst,
                         const int NT, float *y, size_t ldy, const int NMIN, const int UW)
{
    const uint8_t *wr[MR], *xt[NTQ];
    UNROLL for (int r = 0; r < MR; r++) wr[r] = (const uint8_t *)w + (size_t)(r < nr ? r : nr - 1) * wst;
    UNROLL for (int t = 0; t < NT; t++) xt[t] = (const uint8_t *)x + (size_t)t * xst;
    __m512 acc[MR][NTQ];
    UNROLL for (int r = 0; r < MR; r++)
        UNROLL for (int t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t g = 0, ng = n_groups(cols); g < ng; g++) {
        __m512i is[MR][NTQ];
        UNROLL for (int r = 0; r < MR; r++) {
            __m512i c = UW ? _mm512_setzero_si512() : _mm512_loadu_si512(wr[r] + 512);
            UNROLL for (int t = 0; t < NT; t++) is[r][t] = c;
        }
        UNROLL for (int s = 0; s < 8; s++) {
            __m512i xv[NTQ];
            UNROLL for (int t = 0; t < NT; t++) xv[t] = _mm512_loadu_si512(xt[t] + 64 * s);
            UNROLL for (int r = 0; r < MR; r++) {
                __m512i wv = _mm512_loadu_si512(wr[r] + 64 * s);
                /* one load per step, not one per token: gcc would fold
                 * the load into each vpdpbusd (load-port bound) */
                __asm__("" : "+v"(wv));
                UNROLL for (int t = 0; t < NT; t++) is[r][t] = step(is[r][t], xv[t], wv, UW);
            }
        }
        UNROLL for (int r = 0; r < MR; r++) {
            __m512 wsv = _mm512_loadu_ps(wr[r] + 576);
            UNROLL for (int t = 0; t < NT; t++)
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[r][t]),
                                            _mm512_mul_ps(wsv, _mm512_loadu_ps(xt[t] + 512)), acc[r][t]);
            UNROLL for (int m = 0; m < NMIN; m++) {
                __m512 mwv = _mm512_loadu_ps(wr[r] + 640 + 64 * m);
                UNROLL for (int t = 0; t < NT; t++)
                    acc[r][t] = _mm512_fnmadd_ps(mwv, _mm512_loadu_ps(xt[t] + 576 + 64 * m), acc[r][t]);
            }
        }
        UNROLL for (int r = 0; r < MR; r++) wr[r] += WREC(NMIN);
        UNROLL for (int t = 0; t < NT; t++) xt[t] += XREC(NMIN);
    }
    UNROLL for (int r = 0; r < MR; r++)
        UNROLL for (int t = 0; t < NT; t++)
            if (r < nr) y[(size_t)t * ldy + r] = hsum16(acc[r][t]);
}

_Static_assert(NTQ == 4, "gemm_i8 instantiates 1..4 tokens");
#define GEMM_I8(NAME, NMIN, UW)                                                                     \
    static void NAME(int64_t cols, const void *w, size_t wst, int nr, const void *x, size_t xst,   \
                     int nt, float *y, size_t ldy)                                                 \
    {                                                                                              \
        switch (nt) {                                                                              \
        case 1: gemm_i8_body(cols, w, wst, nr, x, xst, 1, y, ldy, NMIN, UW); break;                \
        case 2: gemm_i8_body(cols, w, wst, nr, x, xst, 2, y, ldy, NMIN, UW); break;                \
        case 3: gemm_i8_body(cols, w, wst, nr, x, xst, 3, y, ldy, NMIN, UW); break;                \
        default: gemm_i8_body(cols, w, wst, nr, x, xst, 4, y, ldy, NMIN, UW); break;               \
        }                                                                                          \
    }
GEMM_I8(gemm_i8_signed, 0, 0)
GEMM_I8(gemm_i8_q2, 2, 1)

/* ---- fused kernels: few tokens, no panel ---------------------------------
 *
 * One weight row x up to 4 packed tokens, the row's groups decoded in
 * registers instead of read from a panel: for decode and calls of a few
 * tokens, where packing the rows would cost more than it saves. The
 * operations per (row, token) are the microkernel's on the same numbers,
 * so a result has the same bits whether its call had 1 token or 100: a
 * prefill does not depend on how it was cut into chunks, nor on how many
 * of a chunk's tokens the router sent to an expert. */
#define FUSED(NAME, DEC, NMIN, UW)                                                                 \
    INLINE void NAME##_body(int64_t cols, const void *w, const void *x, size_t xst, const int NT,  \
                            float *y, size_t ldy)                                                  \
    {                                                                                              \
        const uint8_t *xt[4];                                                                      \
        __m512 acc[4];                                                                             \
        UNROLL for (int t = 0; t < NT; t++) {                                                      \
            xt[t] = (const uint8_t *)x + (size_t)t * xst;                                          \
            acc[t] = _mm512_setzero_ps();                                                          \
        }                                                                                          \
        for (int64_t g = 0, ng = n_groups(cols); g < ng; g++) {                                    \
            __m512i v[8], corr;                                                                    \
            __m512 ws, mw[2];                                                                      \
            DEC(w, cols, g, v, &corr, &ws, mw);                                                    \
            UNROLL for (int t = 0; t < NT; t++) {                                                  \
                /* two dependency chains (one token has no other work to      \
                 * overlap); integer sums, so the same result */              \
                __m512i is[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};                  \
                UNROLL for (int s = 0; s < 8; s++)                                                 \
                    is[s & 1] = step(is[s & 1], _mm512_loadu_si512(xt[t] + 64 * s), v[s], UW);     \
                __m512i sum = _mm512_add_epi32(_mm512_add_epi32(is[0], is[1]), corr);              \
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(ws, _mm512_loadu_ps(xt[t] + 512)), \
                                         acc[t]);                                                  \
                UNROLL for (int m = 0; m < NMIN; m++)                                              \
                    acc[t] = _mm512_fnmadd_ps(mw[m], _mm512_loadu_ps(xt[t] + 576 + 64 * m), acc[t]); \
                xt[t] += XREC(NMIN);                                                               \
            }                                                                                      \
        }                                                                                          \
        UNROLL for (int t = 0; t < NT; t++) y[(size_t)t * ldy] = hsum16(acc[t]);                   \
    }                                                                                              \
    DS4_NT_DISPATCH(NAME, )

FUSED(fused_q8_0, dec_q8_0, 0, 0)
FUSED(fused_mxfp4, dec_mxfp4, 0, 0)
FUSED(fused_iq2_xxs, dec_iq2_xxs, 0, 0)
FUSED(fused_q2_K, dec_q2_K, 2, 1)

/* ---- float microkernels ------------------------------------------------- */

INLINE __m512 ld_f32(const void *p, int64_t i) { return _mm512_loadu_ps((const float *)p + i); }
INLINE __m512 ld_f16(const void *p, int64_t i)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
}
INLINE __m512 ld_bf16(const void *p, int64_t i)
{
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}
INLINE __m512 ldm_f32(const void *p, int64_t i, __mmask16 m) { return _mm512_maskz_loadu_ps(m, (const float *)p + i); }
INLINE __m512 ldm_f16(const void *p, int64_t i, __mmask16 m)
{
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i));
}
INLINE __m512 ldm_bf16(const void *p, int64_t i, __mmask16 m)
{
    __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

/* MRF rows x NT tokens of 16-lane f32 FMA chains, one per (row, token):
 * the same chain whatever the block, so no result depends on n_tok. The
 * rows are read as stored, for any n_tok (decode too). */
#define GEMM_FLOAT(NAME, LD, LDM)                                                                   \
    INLINE void NAME##_body(int64_t cols, const void *w, size_t wst, int nr, const void *x,         \
                            size_t xst, const int NT, float *y, size_t ldy)          \
    {                                                                                              \
        const char *wr[MRF];                                                                       \
        const float *xt[NTF];                                                                      \
        UNROLL for (int r = 0; r < MRF; r++) wr[r] = (const char *)w + (size_t)(r < nr ? r : nr - 1) * wst; \
        UNROLL for (int t = 0; t < NT; t++) xt[t] = (const float *)((const char *)x + (size_t)t * xst); \
        __m512 acc[MRF][NTF];                                                                      \
        UNROLL for (int r = 0; r < MRF; r++)                                                       \
            UNROLL for (int t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_ps();                   \
        int64_t i = 0;                                                                             \
        for (; i + 16 <= cols; i += 16) {                                                          \
            __m512 wv[MRF];                                                                        \
            UNROLL for (int r = 0; r < MRF; r++) wv[r] = LD(wr[r], i);                             \
            UNROLL for (int t = 0; t < NT; t++) {                                                  \
                __m512 xv = _mm512_loadu_ps(xt[t] + i);                                            \
                UNROLL for (int r = 0; r < MRF; r++) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]); \
            }                                                                                      \
        }                                                                                          \
        if (i < cols) {                                                                            \
            __mmask16 m = (__mmask16)((1u << (cols - i)) - 1);                                     \
            __m512 wv[MRF];                                                                        \
            UNROLL for (int r = 0; r < MRF; r++) wv[r] = LDM(wr[r], i, m);                         \
            UNROLL for (int t = 0; t < NT; t++) {                                                  \
                __m512 xv = _mm512_maskz_loadu_ps(m, xt[t] + i);                                   \
                UNROLL for (int r = 0; r < MRF; r++) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]); \
            }                                                                                      \
        }                                                                                          \
        UNROLL for (int r = 0; r < MRF; r++)                                                       \
            UNROLL for (int t = 0; t < NT; t++)                                                    \
                if (r < nr) y[(size_t)t * ldy + r] = hsum16(acc[r][t]);                            \
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
GEMM_FLOAT(gemm_f32, ld_f32, ldm_f32)
GEMM_FLOAT(gemm_f16, ld_f16, ldm_f16)
GEMM_FLOAT(gemm_bf16, ld_bf16, ldm_bf16)

/* ---- table -------------------------------------------------------------- */

#define OPS_Q(NAME, PW, PX, K, GEMM, FUSED) \
    static const ds4_gemm_ops NAME = {MR, NTQ, wbytes_##K, PW, xbytes_##K, PX, GEMM, FUSED, 1, 4, NULL, NULL, NULL, 0}
OPS_Q(ops_q8_0, pack_w_q8_0, pack_x_q8_0, n0, gemm_i8_signed, fused_q8_0);
OPS_Q(ops_mxfp4, pack_w_mxfp4, pack_x_q8_0, n0, gemm_i8_signed, fused_mxfp4);
OPS_Q(ops_iq2_xxs, pack_w_iq2_xxs, pack_x_q8_K_t, n0, gemm_i8_signed, fused_iq2_xxs);
OPS_Q(ops_q2_K, pack_w_q2_K, pack_x_q8_K_q2, n2, gemm_i8_q2, fused_q2_K);
static const ds4_gemm_ops ops_f32 = {MRF, NTF, NULL, NULL, NULL, NULL, gemm_f32, gemm_f32, MRF, NTF, NULL, NULL, NULL, 0};
static const ds4_gemm_ops ops_f16 = {MRF, NTF, NULL, NULL, NULL, NULL, gemm_f16, gemm_f16, MRF, NTF, NULL, NULL, NULL, 0};
static const ds4_gemm_ops ops_bf16 = {MRF, NTF, NULL, NULL, NULL, NULL, gemm_bf16, gemm_bf16, MRF, NTF, NULL, NULL, NULL, 0};

/* Q8_0, IQ2_XXS and Q2_K with the few-token kernels of gemv_avx512.c (the
 * same numbers, cheaper); DS4_CPU_GEMV=0 in the environment keeps the
 * fused kernels above (A/B comparisons). */
static ds4_gemm_ops ops_gemv[3];
static const ds4_gemm_ops *ops_gemv_for[3];
static pthread_once_t gemv_once = PTHREAD_ONCE_INIT;

static void gemv_init(void)
{
    const char *e = getenv("DS4_CPU_GEMV");
    const ds4_type ty[3] = {DS4_TYPE_Q8_0, DS4_TYPE_IQ2_XXS, DS4_TYPE_Q2_K};
    const ds4_gemm_ops *base[3] = {&ops_q8_0, &ops_iq2_xxs, &ops_q2_K};
    for (int i = 0; i < 3; i++) {
        ds4_gemv_fns f;
        ops_gemv_for[i] = base[i];
        if ((e && !strcmp(e, "0")) || !ds4_gemv_avx512(ty[i], &f)) continue;
        ops_gemv[i] = *base[i];
        ops_gemv[i].fused_own = f.fused;
        ops_gemv[i].fused_own_nt = f.max_nt;
        /* no packer of its own (Q2_K): the GEMM's token format */
        ops_gemv[i].fused_x_bytes = f.pack_x ? f.x_bytes : base[i]->x_bytes;
        ops_gemv[i].fused_pack_x = f.pack_x ? f.pack_x : base[i]->pack_x;
        ops_gemv_for[i] = &ops_gemv[i];
    }
}

const ds4_gemm_ops *ds4_cpu_gemm_avx512(ds4_type type)
{
    switch (type) {
    case DS4_TYPE_Q8_0:
        pthread_once(&gemv_once, gemv_init);
        return ops_gemv_for[0];
    case DS4_TYPE_IQ2_XXS:
        pthread_once(&gemv_once, gemv_init);
        return ops_gemv_for[1];
    case DS4_TYPE_Q2_K:
        pthread_once(&gemv_once, gemv_init);
        return ops_gemv_for[2];
    case DS4_TYPE_MXFP4: return &ops_mxfp4;
    case DS4_TYPE_F32: return &ops_f32;
    case DS4_TYPE_F16: return &ops_f16;
    case DS4_TYPE_BF16: return &ops_bf16;
    default: return NULL;
    }
}

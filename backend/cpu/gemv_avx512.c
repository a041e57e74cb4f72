/*
 * gemv_avx512.c - the few-token (decode) kernels of the AVX-512 GEMM for
 * Q8_0, IQ2_XXS and Q2_K: the fused kernels' numbers (gemm_avx512.c), bit
 * for bit, at a lower cost per weight byte.
 *
 * What defines the numbers (gemm_avx512.c): per group of 512 values and
 * token, lane j (of 16) holds the exact integer dot product of sub-block j
 * (32 values under one weight scale), and the lane's float sum takes
 *     acc[j] = fma(float(isum[j]), ws[j] * xs[j], acc[j])
 * once per group, the 16 lanes being added by hsum16 at the end. The
 * integer sums are exact, so they may be computed in any way; only the
 * float operations per lane and their order are fixed (Q2_K adds two
 * fnmadds of its mins terms after the fma). For Q8_0 and IQ2_XXS the GEMM
 * gets isum[j] by transposing the weights (24 cross-lane permutes per group) and
 * correcting an offset with 8 more vpdpbusd; here instead:
 *  - Q8_0: weights and activations stay in value order, so vpdpbusd
 *    leaves each sub-block's sum in 8 lanes, and a tree of in-lane
 *    unpacks + adds (plus two 128-bit shuffles) reduces 8 such vectors to
 *    one lane per sub-block (14 shuffles, 12 of them single-cycle in-lane
 *    ones). The tree leaves sub-block b(l) = 8 (l >> 3) + 2 (l & 3) +
 *    ((l >> 2) & 1) in lane l: a fixed permutation, so the scales are
 *    built in that order too, each lane does exactly the float operations
 *    of lane b(l), and the accumulator is put back in order once per row
 *    before hsum16. The signed weights enter vpdpbusd as w ^ 0x80 = w + 128
 *    (unsigned), against the activations as they are; the extra
 *    128 * sum(x) of each block is a property of the token, computed once
 *    when the token is packed (no per-row correction);
 *  - IQ2_XXS (needs AVX-512 VBMI and BITALG) makes its weight bytes from
 *    lookups anyway, so it makes them directly in the transposed order
 *    and needs neither transpose nor reduction tree: the token is packed
 *    once per call with step k's dword lane j = values 4k..4k+3 of
 *    sub-block j, so 8 vpdpbusd leave sub-block j's whole sum in lane j,
 *    and the lanes are in order. The weights: every grid byte is one of 3
 *    values, so a grid row is a 16-bit code (2 bits per value) and the 256
 *    codes are two 256-byte tables (low and high byte), read for the
 *    group's 64 indices at once with vpermt2b; then for each step one
 *    vpmultishiftqb takes every byte's 2-bit field out of the codes (a
 *    qword of codes holds the 8 rows of 2 sub-blocks, and the bit offset
 *    of a field within it is the same for every qword) and vpermb maps the
 *    fields to the values. The sign bytes of the rows come from the
 *    128-entry sign table the same way, and one vpshufbitqmb per step
 *    gathers the step's 64 sign bits from them into a mask (again the same
 *    bit offsets in every qword), which negates the token's bytes
 *    (docs/BENCHMARKS.md, issue 20: 1.4-1.5x the value-order kernel with
 *    its reduction tree, for one token in L2);
 *  - Q2_K (needs VBMI and GFNI) keeps the GEMM's own token format and
 *    lanes, which are already in the weights' value order (lane j of step
 *    c: qs bytes 4j..4j+3 mod 32 of one half of one super-block), and also
 *    its mins terms (mw = dmin * min, two fnmadds after the fma). What
 *    changes is how the step vectors q * scale are made: the GEMM's decoder
 *    spends a shift, a mask, a scale-word permute and a 16-bit multiply per
 *    step; here gf2p8affineqb moves the step's 2-bit field to bits 0-1 with
 *    the step number s in bits 2-3, and vpshufb looks that up in a table of
 *    q * scale per 128-bit lane (one table per half of the group, lane L:
 *    super-block L / 2, byte 4 s + q = q * scale of its sub-block
 *    8 h + 2 s + L % 2), the tables made once per group by a vpermt2b of
 *    the scale bytes and a 16-bit multiply. The bytes are the GEMM's, so
 *    vpdpbusd leaves its integers in its lanes, and the float operations
 *    are copied from its fused kernel (docs/BENCHMARKS.md: 1.18-1.40x
 *    the fused kernel for one token in cache; the rest of a group's cost
 *    is the token's loads and vpdpbusd and the float scale work, the same
 *    in both).
 *
 * Q8_0's token record (per group of 512 values), made once per call:
 *   q[512] int8 (value order, zero past the row) | xs[16] f32 | cx[16] i32
 * xs and cx in the lane order b(l); cx = 128 * the sum of the block's
 * activations. IQ2_XXS's (XREC_T below): q[8][64] in step order | xs[16].
 * Q2_K uses the GEMM's record instead (pack_x_q8_K_q2): q[8][64] | xs[16]
 * | mx[2][16].
 */
#include "backend/cpu/simd_avx512.h"

#include <stdatomic.h>
#include <string.h>

#define GROUP 512
#define XREC 640
/* the GEMM's Q2_K token record, q[8][64] | xs[16] | mx[2][16]: its
 * XREC(2) (gemm_avx512.c, pack_x_q8_K_q2) */
#define Q2_XREC 704

static int64_t n_groups(int64_t cols) { return (cols + GROUP - 1) / GROUP; }

/* b(l): the sub-block the reduction tree leaves in lane l; inv: its
 * inverse (lane of sub-block j). */
#define BL(l) (8 * ((l) >> 3) + 2 * ((l) & 3) + (((l) >> 2) & 1))
#define L16(F) F(0), F(1), F(2), F(3), F(4), F(5), F(6), F(7), F(8), F(9), F(10), F(11), F(12), F(13), F(14), F(15)
static const int32_t lane_block[16] = {L16(BL)};
/* lane of sub-block j: j = 8h + 2m + o  ->  l = 8h + 4o + m */
#define INV(j) (8 * ((j) >> 3) + 4 * ((j) & 1) + (((j) >> 1) & 3))
static const int32_t block_lane[16] = {L16(INV)};

/* 8 vectors of 16 dword partial sums, vector k holding sub-blocks 2k (lanes
 * 0-7) and 2k+1 (lanes 8-15) -> one vector, sub-block b(l) in lane l. */
INLINE __m512i red4(__m512i a, __m512i b, __m512i c, __m512i d)
{
    __m512i e1 = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    __m512i e2 = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
    /* 128-bit lane L: (sum of a's lane L, b's, c's, d's) */
    return _mm512_add_epi32(_mm512_unpacklo_epi64(e1, e2), _mm512_unpackhi_epi64(e1, e2));
}

INLINE __m512i red8(const __m512i p[8])
{
    __m512i r0 = red4(p[0], p[1], p[2], p[3]), r1 = red4(p[4], p[5], p[6], p[7]);
    /* lanes 0+1 of each vector are its first sub-block, 2+3 its second */
    return _mm512_add_epi32(_mm512_shuffle_i32x4(r0, r1, 0x88), _mm512_shuffle_i32x4(r0, r1, 0xdd));
}

/* 64 bytes at q, `left` of them valid (zero past them). */
INLINE __m512i load_left(const int8_t *q, int64_t left)
{
    __mmask64 m = left >= 64 ? ~(__mmask64)0 : left <= 0 ? 0 : (((__mmask64)1 << left) - 1);
    return _mm512_maskz_loadu_epi8(m, q);
}

/* ---- token packers ------------------------------------------------------ */

static size_t xbytes(int64_t cols) { return (size_t)n_groups(cols) * XREC; }

static void pack_x_q8_0(int64_t cols, const void *a, void *out)
{
    const int8_t *qs = ds4_act_qs(a);
    const float *d = ds4_act_d(a, cols);
    const __m512i lanes = _mm512_loadu_si512(lane_block), k128 = _mm512_set1_epi8((char)0x80);
    uint8_t *o = out;
    for (int64_t g = 0; g < n_groups(cols); g++, o += XREC) {
        __m512i v[8], s[8];
        UNROLL for (int k = 0; k < 8; k++) {
            v[k] = load_left(qs + GROUP * g + 64 * k, cols - GROUP * g - 64 * k);
            _mm512_storeu_si512(o + 64 * k, v[k]);
            s[k] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), k128, v[k]);
        }
        int64_t left = cols / QK8_0 - 16 * g; /* blocks of this group */
        __mmask16 m = _mm512_cmplt_epi32_mask(lanes, _mm512_set1_epi32(left >= 16 ? 16 : (int)left));
        _mm512_storeu_ps(o + 512, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, lanes, d + 16 * g, 4));
        _mm512_storeu_si512(o + 576, red8(s));
    }
}

/* ---- Q8_0 ---------------------------------------------------------------- */

INLINE void gemv_q8_0_body(int64_t cols, const void *w, const void *x, size_t xst, const int NT, float *y,
                           size_t ldy)
{
    const block_q8_0 *b = w;
    const __m512i k128 = _mm512_set1_epi8((char)0x80);
    const uint8_t *xt[4];
    __m512 acc[4];
    UNROLL for (int t = 0; t < NT; t++) {
        xt[t] = (const uint8_t *)x + (size_t)t * xst;
        acc[t] = _mm512_setzero_ps();
    }
    const int64_t nbr = cols / QK8_0;
    for (int64_t g = 0, ng = n_groups(cols); g < ng; g++, b += 16) {
        const int64_t nb = nbr - 16 * g;
        __m512i v[8];
        __m512 ws;
        if (nb >= 16) {
            UNROLL for (int k = 0; k < 8; k++) {
                /* blocks 2k, 2k+1: the second's qs sit 34 bytes after the
                 * first's, i.e. 2 bytes past a 32-byte stride */
                __m512i lo = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)b[2 * k].qs));
                v[k] = _mm512_xor_si512(_mm512_mask_loadu_epi8(lo, 0xffffffff00000000ull, b[2 * k].qs + 2), k128);
            }
#define D(l) (short)b[BL(l)].d
            ws = _mm512_cvtph_ps(_mm256_set_epi16(D(15), D(14), D(13), D(12), D(11), D(10), D(9), D(8), D(7), D(6),
                                                  D(5), D(4), D(3), D(2), D(1), D(0)));
#undef D
        } else { /* the last group of a row: blocks past its end are 0 */
            uint16_t h[16];
            UNROLL for (int k = 0; k < 8; k++) {
                __m256i lo = 2 * k < nb ? _mm256_loadu_si256((const __m256i *)b[2 * k].qs) : _mm256_setzero_si256();
                __m256i hi = 2 * k + 1 < nb ? _mm256_loadu_si256((const __m256i *)b[2 * k + 1].qs) : _mm256_setzero_si256();
                v[k] = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), k128);
            }
            for (int l = 0; l < 16; l++) h[l] = lane_block[l] < nb ? b[lane_block[l]].d : 0;
            ws = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
        }
        UNROLL for (int t = 0; t < NT; t++) {
            __m512i p[8];
            UNROLL for (int k = 0; k < 8; k++)
                p[k] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), v[k], _mm512_loadu_si512(xt[t] + 64 * k));
            __m512i sum = _mm512_sub_epi32(red8(p), _mm512_loadu_si512(xt[t] + 576));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(ws, _mm512_loadu_ps(xt[t] + 512)), acc[t]);
            xt[t] += XREC;
        }
    }
    const __m512i back = _mm512_loadu_si512(block_lane);
    UNROLL for (int t = 0; t < NT; t++) y[(size_t)t * ldy] = hsum16(_mm512_permutexvar_ps(back, acc[t]));
}

DS4_NT_DISPATCH(gemv_q8_0, )

/* ---- IQ2_XXS (VBMI, BITALG) ---------------------------------------------- */

#define VBMI __attribute__((target("avx512vbmi,avx512bitalg")))

/* Codes of the grid rows: row i's byte j = vals[(code_lo[i] | code_hi[i] << 8) >> 2j & 3]. */
static uint8_t code_lo[256] __attribute__((aligned(64))), code_hi[256] __attribute__((aligned(64)));
static uint8_t code_vals[64] __attribute__((aligned(64)));
static atomic_int codes_state; /* 0 not built, 1 usable, -1 the grid has other values */

static int build_codes(void)
{
    int s = atomic_load(&codes_state);
    if (s) return s > 0;
    static const uint8_t vals[3] = {0x08, 0x19, 0x2b};
    int ok = 1;
    for (int i = 0; i < 256; i++) {
        unsigned code = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t v = (uint8_t)(ds4_iq2xxs_grid[i] >> (8 * j));
            int c = v == vals[0] ? 0 : v == vals[1] ? 1 : v == vals[2] ? 2 : -1;
            if (c < 0) ok = 0;
            else code |= (unsigned)c << (2 * j);
        }
        code_lo[i] = (uint8_t)code;
        code_hi[i] = (uint8_t)(code >> 8);
    }
    for (int i = 0; i < 64; i++) code_vals[i] = (i & 3) < 3 ? vals[i & 3] : 0;
    atomic_store(&codes_state, ok ? 1 : -1);
    return ok;
}

/* The IQ2_XXS token record (per group of 512 values), sub-block order:
 *   q[8][64] int8 | xs[16] f32
 * step k, dword lane j = values 32 j + 4 k .. 32 j + 4 k + 3 (sub-block
 * j's k-th 4 values), so that 8 vpdpbusd leave sub-block j's whole sum in
 * lane j; xs[j] = the scale of sub-block j's super-block. */
#define XREC_T 576

static size_t xbytes_t(int64_t cols) { return (size_t)n_groups(cols) * XREC_T; }

#define TX(j, k) (8 * (j) + (k))
#define TX16(k) TX(0, k), TX(1, k), TX(2, k), TX(3, k), TX(4, k), TX(5, k), TX(6, k), TX(7, k), \
                TX(8, k), TX(9, k), TX(10, k), TX(11, k), TX(12, k), TX(13, k), TX(14, k), TX(15, k)
/* dword of the group (in value order) that step k's lane j takes */
static const int32_t tx_idx[8][16] = {{TX16(0)}, {TX16(1)}, {TX16(2)}, {TX16(3)},
                                      {TX16(4)}, {TX16(5)}, {TX16(6)}, {TX16(7)}};

static void pack_x_q8_K_t(int64_t cols, const void *a, void *out)
{
    const int8_t *qs = ds4_act_qs(a);
    const float *d = ds4_act_d(a, cols);
    const int64_t nsb = cols / QK_K;
    uint8_t *o = out;
    for (int64_t g = 0; g < n_groups(cols); g++, o += XREC_T) {
        int32_t nat[GROUP / 4] __attribute__((aligned(64)));
        UNROLL for (int k = 0; k < 8; k++)
            _mm512_store_si512(nat + 16 * k, load_left(qs + GROUP * g + 64 * k, cols - GROUP * g - 64 * k));
        UNROLL for (int k = 0; k < 8; k++)
            _mm512_storeu_si512(o + 64 * k, _mm512_i32gather_epi32(_mm512_loadu_si512(tx_idx[k]), nat, 4));
        __m512 xs = _mm512_insertf32x8(_mm512_set1_ps(d[2 * g]), _mm256_set1_ps(2 * g + 1 < nsb ? d[2 * g + 1] : 0.0f), 1);
        _mm512_storeu_ps(o + 512, xs);
    }
}

/* Byte r (row r = 4 j + l of the group: super-block r / 32, group j % 8,
 * row l) of a group's index or sign-field vector: byte 8 j + l of the
 * super-block's qs (of the multishifted qs for the signs). */
#define CI(r) (char)(64 * ((r) >> 5) + 8 * (((r) >> 2) & 7) + ((r) & 3))
#define C8(b) CI(b), CI(b + 1), CI(b + 2), CI(b + 3), CI(b + 4), CI(b + 5), CI(b + 6), CI(b + 7)
static const int8_t compact_idx[64] = {C8(0), C8(8), C8(16), C8(24), C8(32), C8(40), C8(48), C8(56)};
/* Qword q of a 64-byte vector of per-row bytes (row order) holds rows
 * 8q..8q+7: sub-blocks 2q and 2q+1. Byte p = 8 q + 4 h + b of step k
 * (sub-block 2q + h, value 4 k + b of it = value 4 (k & 1) + b of row
 * 4 h + k / 2 of the qword) is then found at a bit offset within its own
 * qword that does not depend on q:
 *  - its 2-bit grid field: offset 8 (4 h + k / 2) + 2 b in the codes'
 *    low (k even) or high (k odd) bytes, taken by vpmultishiftqb;
 *  - its sign: bit 8 (4 h + k / 2) + 4 (k & 1) + b of the sign bytes,
 *    taken by vpshufbitqmb. */
#define GS(m, p) (char)(8 * (4 * (((p) >> 2) & 1) + (m)) + 2 * ((p) & 3))
#define SB(k, p) (char)(8 * (4 * (((p) >> 2) & 1) + ((k) >> 1)) + 4 * ((k) & 1) + ((p) & 3))
#define P8(F, a) F(a, 0), F(a, 1), F(a, 2), F(a, 3), F(a, 4), F(a, 5), F(a, 6), F(a, 7)
#define P64(F, a) P8(F, a), P8(F, a), P8(F, a), P8(F, a), P8(F, a), P8(F, a), P8(F, a), P8(F, a)
static const int8_t field_sel[4][64] = {{P64(GS, 0)}, {P64(GS, 1)}, {P64(GS, 2)}, {P64(GS, 3)}};
static const int8_t sign_sel[8][64] = {{P64(SB, 0)}, {P64(SB, 1)}, {P64(SB, 2)}, {P64(SB, 3)},
                                       {P64(SB, 4)}, {P64(SB, 5)}, {P64(SB, 6)}, {P64(SB, 7)}};
/* dword of the shifted qs (two super-blocks) holding sub-block j's scale */
#define LS(j) ((j) < 8 ? 2 * (j) : 16 + 2 * ((j) - 8))
static const int32_t ls_idx[16] = {L16(LS)};

static const uint8_t zero_block[64];

/* Software prefetch distance of the IQ2_XXS kernel, in bytes (~4 rows of
 * 4096 values): from DRAM at Flash's gate/up shape (2048 x 4096, two
 * threads) 1.07-1.11x over none in 3 of 3 rounds, in L2 no change
 * (docs/BENCHMARKS.md, issue 20's IQ2_XXS kernel). */
#define IQ2_PF 4096

INLINE VBMI void gemv_iq2_xxs_body(int64_t cols, const void *w, const void *x, size_t xst, const int NT, float *y,
                                   size_t ldy)
{
    const block_iq2_xxs *b = w;
    const int64_t nsb = cols / QK_K;
    const __m512i cidx = _mm512_loadu_si512(compact_idx);
    const __m512i lo0 = _mm512_load_si512(code_lo), lo1 = _mm512_load_si512(code_lo + 64);
    const __m512i lo2 = _mm512_load_si512(code_lo + 128), lo3 = _mm512_load_si512(code_lo + 192);
    const __m512i hi0 = _mm512_load_si512(code_hi), hi1 = _mm512_load_si512(code_hi + 64);
    const __m512i hi2 = _mm512_load_si512(code_hi + 128), hi3 = _mm512_load_si512(code_hi + 192);
    const __m512i ks0 = _mm512_loadu_si512(ds4_ksigns_iq2xs), ks1 = _mm512_loadu_si512(ds4_ksigns_iq2xs + 64);
    const __m512i vals = _mm512_load_si512(code_vals);
    /* sign fields of a group (its 4 rows): bits 32, 39, 46, 53 of its qword */
    const __m512i fsh = _mm512_set1_epi64(0x352e2720352e2720ll);
    const __m512i lsi = _mm512_loadu_si512(ls_idx);
    const uint8_t *xt[4];
    __m512 acc[4];
    UNROLL for (int t = 0; t < NT; t++) {
        xt[t] = (const uint8_t *)x + (size_t)t * xst;
        acc[t] = _mm512_setzero_ps();
    }
    for (int64_t g = 0, ng = n_groups(cols); g < ng; g++, b += 2) {
        const int two = nsb - 2 * g > 1;
        _mm_prefetch((const char *)b + IQ2_PF, _MM_HINT_T0);
        _mm_prefetch((const char *)b + IQ2_PF + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)b + IQ2_PF + 128, _MM_HINT_T0);
        __m512i q0 = _mm512_loadu_si512(b[0].qs);
        __m512i q1 = _mm512_loadu_si512(two ? (const void *)b[1].qs : (const void *)zero_block);
        /* sign bytes of the 64 rows: the 7-bit fields, row order, through
         * the sign table */
        __m512i sf = _mm512_permutex2var_epi8(_mm512_multishift_epi64_epi8(fsh, q0), cidx,
                                              _mm512_multishift_epi64_epi8(fsh, q1));
        __m512i sg = _mm512_permutex2var_epi8(ks0, sf, ks1);
        /* grid codes of the 64 rows */
        __m512i ix = _mm512_permutex2var_epi8(q0, cidx, q1);
        __mmask64 top = _mm512_movepi8_mask(ix);
        __m512i clo = _mm512_mask_blend_epi8(top, _mm512_permutex2var_epi8(lo0, ix, lo1), _mm512_permutex2var_epi8(lo2, ix, lo3));
        __m512i chi = _mm512_mask_blend_epi8(top, _mm512_permutex2var_epi8(hi0, ix, hi1), _mm512_permutex2var_epi8(hi2, ix, hi3));
        /* step k's grid values and sign mask, in the token's order */
        __m512i gv[8];
        __mmask64 sm[8];
        UNROLL for (int k = 0; k < 8; k++) {
            __m512i f = _mm512_multishift_epi64_epi8(_mm512_loadu_si512(field_sel[k >> 1]), k & 1 ? chi : clo);
            gv[k] = _mm512_permutexvar_epi8(f, vals);
            sm[k] = _mm512_bitshuffle_epi64_mask(sg, _mm512_loadu_si512(sign_sel[k]));
        }
        /* ws = d / 8 * (2 ls + 1), as the GEMM's decoder */
        __m512i ls = _mm512_permutex2var_epi32(_mm512_srli_epi64(q0, 60), lsi, _mm512_srli_epi64(q1, 60));
        __m512 ls1 = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(ls, 1), _mm512_set1_epi32(1)));
        __m512 ws = _mm512_mul_ps(_mm512_insertf32x8(_mm512_set1_ps(0.125f * f16(b[0].d)),
                                                     _mm256_set1_ps(two ? 0.125f * f16(b[1].d) : 0.0f), 1),
                                  ls1);
        UNROLL for (int t = 0; t < NT; t++) {
            /* two chains of 4 vpdpbusd (the sums are exact integers) */
            __m512i is[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
            UNROLL for (int k = 0; k < 8; k++) {
                __m512i xv = _mm512_loadu_si512(xt[t] + 64 * k);
                __m512i ys = _mm512_mask_sub_epi8(xv, sm[k], _mm512_setzero_si512(), xv);
                is[k & 1] = _mm512_dpbusd_epi32(is[k & 1], gv[k], ys);
            }
            __m512i sum = _mm512_add_epi32(is[0], is[1]);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(ws, _mm512_loadu_ps(xt[t] + 512)), acc[t]);
            xt[t] += XREC_T;
        }
    }
    UNROLL for (int t = 0; t < NT; t++) y[(size_t)t * ldy] = hsum16(acc[t]);
}

DS4_NT_DISPATCH(gemv_iq2_xxs, VBMI)

/* ---- Q2_K (VBMI, GFNI) --------------------------------------------------- */

#define Q2T __attribute__((target("avx512vbmi,gfni")))

/* Sources of the scale tables (vpermt2b over the two super-blocks' first
 * 64 bytes each, the second at 64): byte 4 s + q of lane L, half h = scale
 * byte 8 h + 2 s + L % 2 of super-block L / 2. */
#define TS(h, L, i) (char)(64 * ((L) >> 1) + 8 * (h) + 2 * ((i) >> 2) + ((L) & 1))
#define TS16(h, L)                                                                                           \
    TS(h, L, 0), TS(h, L, 1), TS(h, L, 2), TS(h, L, 3), TS(h, L, 4), TS(h, L, 5), TS(h, L, 6), TS(h, L, 7), \
        TS(h, L, 8), TS(h, L, 9), TS(h, L, 10), TS(h, L, 11), TS(h, L, 12), TS(h, L, 13), TS(h, L, 14), TS(h, L, 15)
static const int8_t q2_tab_idx[2][64] = {{TS16(0, 0), TS16(0, 1), TS16(0, 2), TS16(0, 3)},
                                         {TS16(1, 0), TS16(1, 1), TS16(1, 2), TS16(1, 3)}};
static const block_q2_K zero_q2;

/* gf2p8affineqb matrix taking bits 2s, 2s + 1 of each byte to bits 0, 1
 * (result bit i = parity of x & matrix byte 7 - i); its imm8 4 s sets bits
 * 2-3 to s. */
#define Q2_FIELD(s) _mm512_set1_epi64((long long)((1ull << (2 * (s))) << 56 | (1ull << (2 * (s) + 1)) << 48))

static inline int32_t ld32(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

INLINE Q2T void gemv_q2_K_body(int64_t cols, const void *w, const void *x, size_t xst, const int NT, float *y,
                               size_t ldy)
{
    const block_q2_K *b = w;
    const int64_t nsb = cols / QK_K;
    const __m512i m15 = _mm512_set1_epi8(15), m3 = _mm512_set1_epi8(3);
    /* a word of two equal bytes sc times 2k + 256: bytes 2k sc, (2k + 1) sc */
    const __m512i qmul = _mm512_set1_epi32(0x01020100);
    const __m512i tix0 = _mm512_loadu_si512(q2_tab_idx[0]), tix1 = _mm512_loadu_si512(q2_tab_idx[1]);
    const __m512i ws_idx = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);
    const uint8_t *xt[4];
    __m512 acc[4];
    UNROLL for (int t = 0; t < NT; t++) {
        xt[t] = (const uint8_t *)x + (size_t)t * xst;
        acc[t] = _mm512_setzero_ps();
    }
    for (int64_t g = 0, ng = n_groups(cols); g < ng; g++) {
        /* a lone last super-block: the GEMM's zeros for the second */
        const block_q2_K *b0 = b + 2 * g, *b1 = nsb - 2 * g > 1 ? b0 + 1 : &zero_q2;
        __m128i s0 = _mm_loadu_si128((const __m128i *)b0->scales), s1 = _mm_loadu_si128((const __m128i *)b1->scales);
        /* the two halves' tables (bytes past the scales are never indexed) */
        __m512i tab0 = _mm512_mullo_epi16(
            _mm512_and_si512(_mm512_permutex2var_epi8(_mm512_castsi128_si512(s0), tix0, _mm512_castsi128_si512(s1)),
                             m15),
            qmul);
        __m512i tab1 = _mm512_mullo_epi16(
            _mm512_and_si512(_mm512_permutex2var_epi8(_mm512_castsi128_si512(s0), tix1, _mm512_castsi128_si512(s1)),
                             m15),
            qmul);
        __m512i q0 = load2x256(b0->qs, b1->qs), q1 = load2x256(b0->qs + 32, b1->qs + 32);
        /* step c = 4 h + s: table h at the index of field s (at shift 0
         * a mask does, s being 0) */
        __m512i v[8];
        v[0] = _mm512_shuffle_epi8(tab0, _mm512_and_si512(q0, m3));
        v[1] = _mm512_shuffle_epi8(tab0, _mm512_gf2p8affine_epi64_epi8(q0, Q2_FIELD(1), 4));
        v[2] = _mm512_shuffle_epi8(tab0, _mm512_gf2p8affine_epi64_epi8(q0, Q2_FIELD(2), 8));
        v[3] = _mm512_shuffle_epi8(tab0, _mm512_gf2p8affine_epi64_epi8(q0, Q2_FIELD(3), 12));
        v[4] = _mm512_shuffle_epi8(tab1, _mm512_and_si512(q1, m3));
        v[5] = _mm512_shuffle_epi8(tab1, _mm512_gf2p8affine_epi64_epi8(q1, Q2_FIELD(1), 4));
        v[6] = _mm512_shuffle_epi8(tab1, _mm512_gf2p8affine_epi64_epi8(q1, Q2_FIELD(2), 8));
        v[7] = _mm512_shuffle_epi8(tab1, _mm512_gf2p8affine_epi64_epi8(q1, Q2_FIELD(3), 12));
        /* ws and mw as dec_q2_K makes them: d0 dmin0 d1 dmin1 converted
         * at once, then spread over the lanes */
        __m512 df = _mm512_castps128_ps512(
            _mm_cvtph_ps(_mm_insert_epi32(_mm_cvtsi32_si128(ld32(&b0->d)), ld32(&b1->d), 1)));
        __m512 ws = _mm512_permutexvar_ps(ws_idx, df);
        __m512 mw0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(_mm512_cvtepu8_epi32(s0), 4)),
                                   _mm512_permutexvar_ps(_mm512_set1_epi32(1), df));
        __m512 mw1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(_mm512_cvtepu8_epi32(s1), 4)),
                                   _mm512_permutexvar_ps(_mm512_set1_epi32(3), df));
        /* the fused kernel's operations, in its order */
        UNROLL for (int t = 0; t < NT; t++) {
            __m512i is[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
            UNROLL for (int c = 0; c < 8; c++)
                is[c & 1] = _mm512_dpbusd_epi32(is[c & 1], v[c], _mm512_loadu_si512(xt[t] + 64 * c));
            __m512i sum = _mm512_add_epi32(is[0], is[1]);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(ws, _mm512_loadu_ps(xt[t] + 512)), acc[t]);
            acc[t] = _mm512_fnmadd_ps(mw0, _mm512_loadu_ps(xt[t] + 576), acc[t]);
            acc[t] = _mm512_fnmadd_ps(mw1, _mm512_loadu_ps(xt[t] + 640), acc[t]);
            xt[t] += Q2_XREC;
        }
    }
    UNROLL for (int t = 0; t < NT; t++) y[(size_t)t * ldy] = hsum16(acc[t]);
}

DS4_NT_DISPATCH(gemv_q2_K, Q2T)

/* ---- the table ----------------------------------------------------------- */

int ds4_gemv_avx512(ds4_type type, ds4_gemv_fns *out)
{
    switch (type) {
    case DS4_TYPE_Q8_0:
        *out = (ds4_gemv_fns){xbytes, pack_x_q8_0, gemv_q8_0, 1};
        return 1;
    case DS4_TYPE_IQ2_XXS:
        if (!__builtin_cpu_supports("avx512vbmi") || !__builtin_cpu_supports("avx512bitalg") || !build_codes())
            return 0;
        *out = (ds4_gemv_fns){xbytes_t, pack_x_q8_K_t, gemv_iq2_xxs, 4};
        return 1;
    case DS4_TYPE_Q2_K: /* the GEMM's token format */
        if (!__builtin_cpu_supports("avx512vbmi") || !__builtin_cpu_supports("gfni")) return 0;
        *out = (ds4_gemv_fns){NULL, NULL, gemv_q2_K, 4};
        return 1;
    default: return 0;
    }
}

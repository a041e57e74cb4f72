/*
 * quantize_iq2.c - the IQ2_XXS quantizer (importance matrix required).
 *
 * IQ2_XXS stores each group of 8 values as one of 256 grid points (8
 * magnitudes, each 8, 25 or 43) plus 8 signs with an even number of minus
 * signs, scaled per 32 values by d * (0.5 + ls) * 0.25 (4-bit ls, f16 d per
 * 256). Quantizing is a search:
 *  - signs: take each value's own sign; when a group has an odd number of
 *    negatives, the least important value (smallest w * x^2) gets the wrong
 *    sign, i.e. its magnitude target becomes -|x|;
 *  - grid point for a given scale s: round each |x|/s to the nearest of the
 *    three magnitudes (a pattern out of 3^8 = 6561), then try the grid
 *    points listed for that pattern (those in its three nearest distance
 *    shells, precomputed once: ~8.5 per pattern on average) and keep the
 *    one with the least weighted error;
 *  - scale per 32: a sweep of candidate scales around amax / 43; for each,
 *    the best grid points, then the least-squares scale for those points;
 *    keep the best;
 *  - d per 256 and the 4-bit ls: a few candidate d, each ls rounded and
 *    then the grid points searched again with the exact scale the
 *    dequantizer computes; keep the least total error.
 * The neighbour table (about 56 KB) is built once under pthread_once and is
 * read-only afterwards; per-row work allocates nothing.
 */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/quant_tables.h"
#include "quant/quantize_impl.h"

#define N_PATTERNS 6561 /* 3^8 */
#define NB_CAP 65536

static const float k_mag[3] = {8.f, 25.f, 43.f};
static uint8_t g_level[256][8];          /* grid point -> level 0..2 per value */
static uint16_t g_nb_off[N_PATTERNS + 1]; /* pattern -> range in g_nb */
static uint8_t g_nb[NB_CAP];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void build_tables(void)
{
    for (int k = 0; k < 256; k++)
        for (int j = 0; j < 8; j++) {
            int b = (int)((ds4_iq2xxs_grid[k] >> (8 * j)) & 0xFF);
            g_level[k][j] = (uint8_t)(b == 8 ? 0 : b == 25 ? 1 : 2);
        }
    int n = 0;
    for (int p = 0; p < N_PATTERNS; p++) {
        int lv[8], v = p;
        for (int j = 0; j < 8; j++, v /= 3) lv[j] = v % 3;
        float dist[256], shell[3] = {INFINITY, INFINITY, INFINITY};
        for (int k = 0; k < 256; k++) {
            float d = 0.f;
            for (int j = 0; j < 8; j++) {
                float e = k_mag[lv[j]] - k_mag[g_level[k][j]];
                d += e * e;
            }
            dist[k] = d;
            /* keep the three smallest distinct distances */
            if (d < shell[0]) {
                shell[2] = shell[1];
                shell[1] = shell[0];
                shell[0] = d;
            } else if (d > shell[0] && d < shell[1]) {
                shell[2] = shell[1];
                shell[1] = d;
            } else if (d > shell[1] && d < shell[2]) {
                shell[2] = d;
            }
        }
        g_nb_off[p] = (uint16_t)n;
        for (int k = 0; k < 256 && n < NB_CAP; k++)
            if (dist[k] <= shell[2]) g_nb[n++] = (uint8_t)k;
    }
    g_nb_off[N_PATTERNS] = (uint16_t)(n < NB_CAP ? n : NB_CAP - 1);
}

/* Best grid point for magnitude targets t[8] (weights w) at scale s. */
static int best_grid(const float *t, const float *w, float s)
{
    float e[8][3];
    int p = 0, mul = 1;
    const float lo = 16.5f * s, hi = 34.f * s;
    for (int j = 0; j < 8; j++, mul *= 3) {
        for (int l = 0; l < 3; l++) {
            float diff = t[j] - s * k_mag[l];
            e[j][l] = w[j] * diff * diff;
        }
        p += mul * (t[j] < lo ? 0 : t[j] < hi ? 1 : 2);
    }
    int best = g_nb[g_nb_off[p]];
    float berr = INFINITY;
    for (int c = g_nb_off[p]; c < g_nb_off[p + 1]; c++) {
        const uint8_t *lv = g_level[g_nb[c]];
        float err = e[0][lv[0]] + e[1][lv[1]] + e[2][lv[2]] + e[3][lv[3]] + e[4][lv[4]] +
                    e[5][lv[5]] + e[6][lv[6]] + e[7][lv[7]];
        if (err < berr) {
            berr = err;
            best = g_nb[c];
        }
    }
    return best;
}

/* sum w*t*g and sum w*g*g of the 8 values of group `t` on grid point k */
static void grid_sums(const float *t, const float *w, int k, float *wtg, float *wgg)
{
    for (int j = 0; j < 8; j++) {
        float g = k_mag[g_level[k][j]];
        *wtg += w[j] * t[j] * g;
        *wgg += w[j] * g * g;
    }
}

typedef struct {
    float t[32], w[32]; /* magnitude targets (signed, see top) and weights */
    uint8_t sign_idx[4];
    float scale;  /* best real scale */
    uint8_t grid[4];
} sub32;

/* Signs of one 32-block: targets t, 7-bit sign indices. */
static void prepare_signs(const float *x, const float *w, sub32 *b)
{
    for (int g = 0; g < 4; g++) {
        uint8_t bits = 0;
        int least = 0;
        float lw = INFINITY;
        for (int j = 0; j < 8; j++) {
            int i = 8 * g + j;
            b->t[i] = fabsf(x[i]);
            b->w[i] = w[i];
            if (x[i] < 0.f) bits |= (uint8_t)(1u << j);
            float imp = w[i] * x[i] * x[i];
            if (imp < lw) {
                lw = imp;
                least = j;
            }
        }
        if (__builtin_popcount(bits) & 1) {
            bits ^= (uint8_t)(1u << least);
            b->t[8 * g + least] = -b->t[8 * g + least];
        }
        b->sign_idx[g] = bits & 127; /* bit 7 is implied by parity */
    }
}

/* Scale sweep for one 32-block: sets b->scale and b->grid. */
static void search_scale(sub32 *b)
{
    float amax = 0.f;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, b->t[i]);
    b->scale = 0.f;
    memset(b->grid, 0, sizeof b->grid);
    if (amax <= 0.f) return;
    float best = -1.f;
    /* amax near the top magnitude 43 (9 spacings), plus amax on 25 and on
     * 8 for flat blocks (e.g. all values equal: the all-8 grid point) */
    for (int k = 0; k <= 10; k++) {
        const float s = k == 9 ? amax / 25.f : k == 10 ? amax / 8.f
                                : amax / (43.f * (0.6f + 0.09f * (float)k));
        uint8_t gr[4];
        float wtg = 0.f, wgg = 0.f;
        for (int g = 0; g < 4; g++) {
            gr[g] = (uint8_t)best_grid(b->t + 8 * g, b->w + 8 * g, s);
            grid_sums(b->t + 8 * g, b->w + 8 * g, gr[g], &wtg, &wgg);
        }
        /* least squares scale wtg/wgg reduces the error by wtg^2/wgg */
        if (wtg > 0.f && wgg > 0.f && wtg * wtg / wgg > best) {
            best = wtg * wtg / wgg;
            b->scale = wtg / wgg;
            memcpy(b->grid, gr, sizeof gr);
        }
    }
}

/* Error of a 32-block at the exact scale s with freshly searched grid. */
static float requantize(const sub32 *b, float s, uint8_t *grid)
{
    float err = 0.f;
    for (int g = 0; g < 4; g++) {
        const float *t = b->t + 8 * g, *w = b->w + 8 * g;
        int k = best_grid(t, w, s);
        grid[g] = (uint8_t)k;
        for (int j = 0; j < 8; j++) {
            float diff = t[j] - s * k_mag[g_level[k][j]];
            err += w[j] * diff * diff;
        }
    }
    return err;
}

static void quantize_block(const float *x, const float *imw, block_iq2_xxs *y)
{
    float w[QK_K];
    ds4_importance_weights(imw, w, QK_K);
    sub32 b[8];
    float smax = 0.f;
    for (int ib = 0; ib < 8; ib++) {
        prepare_signs(x + 32 * ib, w + 32 * ib, &b[ib]);
        search_scale(&b[ib]);
        smax = fmaxf(smax, b[ib].scale);
    }
    memset(y, 0, sizeof *y);
    if (smax <= 0.f) return;
    /* largest scale at ls = 15: d * 15.5 * 0.25 = smax */
    static const float kd[] = {1.0f, 0.96f};
    float best = INFINITY;
    uint16_t best_d = 0;
    uint8_t best_ls[8] = {0}, best_grid_idx[8][4] = {{0}};
    for (size_t c = 0; c < sizeof kd / sizeof kd[0]; c++) {
        const uint16_t d16 = ds4_f32_to_f16(fminf(smax / 3.875f * kd[c], 65504.f));
        const float d = ds4_f16_to_f32(d16);
        if (d <= 0.f) continue;
        float total = 0.f;
        uint8_t ls[8], gr[8][4];
        for (int ib = 0; ib < 8; ib++) {
            int l = ds4_nearest_int(b[ib].scale * 4.f / d - 0.5f);
            l = l < 0 ? 0 : l > 15 ? 15 : l;
            ls[ib] = (uint8_t)l;
            const float s = d * (0.5f + (float)l) * 0.25f;
            total += requantize(&b[ib], s, gr[ib]);
        }
        if (total < best) {
            best = total;
            best_d = d16;
            memcpy(best_ls, ls, sizeof ls);
            memcpy(best_grid_idx, gr, sizeof gr);
        }
    }
    float zero_err = 0.f; /* an all-zero block, if that is better */
    for (int i = 0; i < QK_K; i++) zero_err += w[i] * x[i] * x[i];
    if (!(best < zero_err)) return;
    y->d = best_d;
    for (int ib = 0; ib < 8; ib++) {
        uint32_t aux[2] = {0, (uint32_t)best_ls[ib] << 28};
        for (int g = 0; g < 4; g++) {
            aux[0] |= (uint32_t)best_grid_idx[ib][g] << (8 * g);
            aux[1] |= (uint32_t)b[ib].sign_idx[g] << (7 * g);
        }
        memcpy(y->qs + 4 * ib, aux, sizeof aux);
    }
}

void ds4_quantize_row_iq2_xxs(const float *x, void *dst, int64_t n, const float *imatrix)
{
    pthread_once(&g_once, build_tables);
    block_iq2_xxs *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++)
        quantize_block(x + i * QK_K, imatrix ? imatrix + i * QK_K : NULL, &y[i]);
}

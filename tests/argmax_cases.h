/*
 * argmax_cases.h - test-only: rows of logits that probe the greedy pick's
 * rule (ds4_argmax_excluding: the largest value, the lowest index on ties,
 * -0 == +0, NaN and -inf never chosen, one id excluded, -1 when nothing is
 * left), for the implementations of ops.h argmax_rows: the CPU's
 * (tests/test_decode_pick.c) and the CUDA kernel and op
 * (tests/test_cuda_kernels.c).
 * The expected answers are not stored here: the tests ask
 * ds4_argmax_excluding for each row. Header-only (static).
 *
 * Each case is `rows` rows of `n` values back to back, so that with n not
 * a multiple of 4 the later rows start off a 16-byte boundary (the CUDA
 * kernel's odd first and last values).
 */
#ifndef DS4_TESTS_ARGMAX_CASES_H
#define DS4_TESTS_ARGMAX_CASES_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    char what[96];
    int n, rows;
    int32_t excluded;
    float *x; /* rows x n */
} am_case;

static inline uint64_t am_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Quarters in [-8, 8): a row of thousands of them ties at its maximum
 * many times over, so random rows test the lowest-index rule too. */
static inline float am_quarter(uint64_t *s) { return (float)((int)(am_next(s) % 64) - 32) * 0.25f; }

/* Any float in about [-30, 30). */
static inline float am_float(uint64_t *s) { return ((float)(am_next(s) >> 40) / (float)(1 << 24) - 0.5f) * 60.0f; }

typedef enum { AM_QUARTERS, AM_FLOATS, AM_NAN, AM_NEG_INF } am_fill;

static inline void am_fill_row(float *r, int n, am_fill f, uint64_t *s)
{
    for (int i = 0; i < n; i++)
        r[i] = f == AM_QUARTERS ? am_quarter(s) : f == AM_FLOATS ? am_float(s) : f == AM_NAN ? NAN : -INFINITY;
}

/* A new case of rows x n (every row AM_QUARTERS unless changed); NULL when
 * memory is short. */
static inline am_case *am_add(am_case *c, int *k, const char *what, int n, int rows, int32_t excluded, uint64_t *s)
{
    am_case *e = &c[(*k)++];
    snprintf(e->what, sizeof e->what, "%s (n %d, %d rows, excluded %d)", what, n, rows, (int)excluded);
    e->n = n;
    e->rows = rows;
    e->excluded = excluded;
    e->x = malloc(((size_t)n * (size_t)rows + 1) * sizeof(float));
    if (!e->x) return NULL;
    for (int r = 0; r < rows; r++) am_fill_row(e->x + (size_t)r * n, n, AM_QUARTERS, s);
    return e;
}

static inline void am_cases_free(am_case *c, int n)
{
    for (int i = 0; c && i < n; i++) free(c[i].x);
    free(c);
}

/* The cases; *n_cases of them (NULL when memory is short). */
static inline am_case *am_cases(int *n_cases)
{
    enum { CAP = 64 };
    am_case *c = calloc(CAP, sizeof *c);
    uint64_t s = 0x2545f4914f6cdd1dull;
    int k = 0;
    am_case *e;
    if (!c) return NULL;
#define AM_ADD(...)                                   \
    do {                                              \
        if (!(e = am_add(c, &k, __VA_ARGS__, &s))) { \
            am_cases_free(c, k);                      \
            return NULL;                              \
        }                                             \
    } while (0)
#define AT(r, i) e->x[(size_t)(r) * e->n + (i)]
    /* the largest value at several indices: the lowest wins, and with it
     * excluded the next one */
    for (int ex = -1; ex <= 17; ex += 18) {
        AM_ADD("ties at several indices", 1000, 2, ex);
        AT(0, 17) = AT(0, 400) = AT(0, 999) = 9.0f;
        AT(1, 0) = AT(1, 999) = 9.0f;
    }
    AM_ADD("the maximum at the excluded id", 777, 1, 123);
    AT(0, 123) = 9.0f;
    AM_ADD("NaN everywhere but one", 5000, 3, -1);
    for (int r = 0; r < 3; r++) am_fill_row(e->x + (size_t)r * e->n, e->n, AM_NAN, &s);
    AT(0, 4321) = 3.0f;
    AT(1, 0) = -1e30f;
    AT(2, 4999) = -0.0f;
    AM_ADD("NaN everywhere but the excluded id", 64, 1, 40);
    am_fill_row(e->x, 64, AM_NAN, &s);
    AT(0, 40) = 1.0f;
    AM_ADD("all -inf, or -inf and NaN", 300, 3, -1);
    am_fill_row(e->x, 300, AM_NEG_INF, &s);
    for (int i = 0; i < 300; i++) AT(1, i) = i % 3 ? -INFINITY : NAN;
    am_fill_row(e->x + 2 * 300, 300, AM_NEG_INF, &s);
    AT(2, 299) = NAN;
    AM_ADD("-0 and +0 tie", 128, 3, -1);
    for (int r = 0; r < 3; r++) am_fill_row(e->x + (size_t)r * e->n, e->n, AM_NEG_INF, &s);
    AT(0, 50) = -0.0f, AT(0, 10) = 0.0f;
    AT(1, 60) = 0.0f, AT(1, 20) = -0.0f;
    for (int i = 0; i < 128; i++) AT(2, i) = i == 90 ? -0.0f : i == 91 ? 0.0f : -1.0f - (float)i;
    AM_ADD("+inf ties, NaN beside", 1000, 1, -1);
    AT(0, 700) = AT(0, 200) = INFINITY;
    AT(0, 100) = AT(0, 199) = AT(0, 201) = NAN;
    AM_ADD("excluded beyond the row", 10, 1, 15);
    AM_ADD("excluded negative", 10, 1, -7);
    AM_ADD("the maximum first and last", 4096, 2, -1);
    AT(0, 0) = 20.0f;
    AT(1, 4095) = 20.0f;
    /* Flash's vocabulary: quarters (thousands of ties at the maximum),
     * any floats, floats with NaN and -inf strewn in, and EOS-like ids
     * excluded */
    for (int ex = -1; ex <= 1; ex += 2) {
        AM_ADD("vocabulary rows", 129280, 4, ex);
        am_fill_row(e->x + 2 * (size_t)e->n, e->n, AM_FLOATS, &s);
        am_fill_row(e->x + 3 * (size_t)e->n, e->n, AM_FLOATS, &s);
        for (int i = 0; i < e->n; i += 97) AT(3, i) = i % 2 ? NAN : -INFINITY;
        AT(1, 1) = 8.0f;
    }
    /* widths that are no multiple of a block, a warp or a 16-byte load:
     * the maximum just after a row's start and at its end */
    static const int odd[] = {1, 2, 3, 5, 31, 33, 1023, 1025, 4097, 129281};
    for (size_t j = 0; j < sizeof odd / sizeof odd[0]; j++) {
        const int n = odd[j];
        AM_ADD("odd width", n, 3, -1);
        am_fill_row(e->x + (size_t)n, n, AM_FLOATS, &s);
        AT(1, n > 1 ? 1 : 0) = 40.0f;
        AT(2, n - 1) = 40.0f;
    }
    AM_ADD("empty rows", 0, 2, -1);
#undef AT
#undef AM_ADD
    *n_cases = k;
    return c;
}

#endif

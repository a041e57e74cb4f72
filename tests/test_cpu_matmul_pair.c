/*
 * test_cpu_matmul_pair.c - the CPU backend's matmul_pair op (two products
 * of one token's input in one pool run, backend/cpu/ops_cpu_dense.c)
 * against two matmul calls: the same bits, for the pairs the model makes
 * (q_a with kv: Q8_0; the compressor's and the indexer's kv with gate:
 * float weights; also two different types), with row counts that are not
 * multiples of the task chunk, on pools of 1 and 2 threads; and with 3
 * tokens, where the op is the two matmuls. Likewise matmul_grouped (the
 * block-diagonal o_a; one token: all groups in one pool run) against one
 * matmul per group.
 */
#include "backend/cpu/cpu_matmul_kernels.h"
#include "backend/cpu/ops_cpu.h"
#include "quant/quant.h"
#include "tests/test.h"

#include <stdlib.h>
#include <string.h>

static uint32_t rng = 4242u;
static float rnd(void)
{
    rng = rng * 1664525u + 1013904223u;
    return (float)((int)(rng >> 9) % 2001 - 1000) * 1e-3f;
}

static void *quant(ds4_type t, int64_t rows, int64_t cols)
{
    float *src = malloc(sizeof(float) * (size_t)(rows * cols)), *im = malloc(sizeof(float) * (size_t)cols);
    void *dst = malloc((size_t)(ds4_row_bytes(t, cols) * rows));
    if (!src || !im || !dst) abort();
    for (int64_t i = 0; i < rows * cols; i++) src[i] = rnd() * 0.05f;
    for (int64_t i = 0; i < cols; i++) im[i] = 1.0f;
    if (ds4_quantize_rows(t, src, dst, rows, cols, im) != DS4_OK) abort();
    free(src), free(im);
    return dst;
}

static ds4_weight wt(ds4_type t, int64_t cols, int64_t rows, const void *data)
{
    ds4_weight w = {"w", t, 2, {cols, rows, 1, 1}, data, 0};
    w.nbytes = (uint64_t)(ds4_row_bytes(t, cols) * rows);
    return w;
}

static int same(const float *a, const float *b, int64_t n)
{
    return !memcmp(a, b, sizeof(float) * (size_t)n);
}

static void check_pair(ds4_type t1, int64_t r1, ds4_type t2, int64_t r2, int64_t cols)
{
    void *d1 = quant(t1, r1, cols), *d2 = quant(t2, r2, cols);
    ds4_weight w1 = wt(t1, cols, r1, d1), w2 = wt(t2, cols, r2, d2);
    const int T = 3;
    float *x = malloc(sizeof(float) * (size_t)(T * cols));
    float *a1 = malloc(sizeof(float) * (size_t)(T * r1)), *a2 = malloc(sizeof(float) * (size_t)(T * r2));
    float *b1 = malloc(sizeof(float) * (size_t)(T * r1)), *b2 = malloc(sizeof(float) * (size_t)(T * r2));
    if (!x || !a1 || !a2 || !b1 || !b2) abort();
    for (int64_t i = 0; i < T * cols; i++) x[i] = rnd() * 2.0f;
    for (int threads = 1; threads <= 2; threads++) {
        ds4_backend *be = ds4_backend_cpu_create(threads);
        REQUIRE(be != NULL && be->matmul_pair != NULL);
        for (int n = 1; n <= T; n += T - 1) { /* 1 token (one region), 3 (the two matmuls) */
            be->matmul(be, &w1, x, n, a1);
            be->matmul(be, &w2, x, n, a2);
            memset(b1, 0xff, sizeof(float) * (size_t)(n * r1));
            memset(b2, 0xff, sizeof(float) * (size_t)(n * r2));
            uint64_t calls = cpu_of(be)->pair_calls;
            be->matmul_pair(be, &w1, &w2, x, n, b1, b2);
            EXPECT_MSG(same(a1, b1, n * r1) && same(a2, b2, n * r2), "%s x %s, %d tokens, %d threads: other bits",
                       ds4_type_name(t1), ds4_type_name(t2), n, threads);
            int ran = cpu_of(be)->pair_calls == calls + 1;
            if (n > 1) EXPECT_MSG(!ran, "%d tokens took the one-token path", n);
            else if (ds4_cpu_mv_bytes(t1, cols) && ds4_cpu_mv_bytes(t2, cols))
                EXPECT_MSG(ran, "%s x %s: the one-region path did not run", ds4_type_name(t1), ds4_type_name(t2));
            else
                printf("  (%s x %s: no one-token kernels at this SIMD level; the two matmuls ran)\n",
                       ds4_type_name(t1), ds4_type_name(t2));
        }
        be->destroy(be);
    }
    free(d1), free(d2), free(x), free(a1), free(a2), free(b1), free(b2);
}

static void test_matmul_pair_same_bits(void)
{
    check_pair(DS4_TYPE_Q8_0, 1000, DS4_TYPE_Q8_0, 130, 1056); /* q_a + kv shape, smaller; a tail group */
    check_pair(DS4_TYPE_F16, 257, DS4_TYPE_F32, 65, 300);     /* float pairs */
    check_pair(DS4_TYPE_IQ2_XXS, 200, DS4_TYPE_Q8_0, 70, 768); /* two formats of the token */
}

/* matmul_grouped against a matmul per group on that group's slice of each
 * token's input */
static void check_grouped(ds4_type t, int groups, int64_t rows, int64_t cols)
{
    void *d = quant(t, (int64_t)groups * rows, cols);
    ds4_weight w = wt(t, cols, (int64_t)groups * rows, d);
    const int T = 3;
    const size_t rb = (size_t)ds4_row_bytes(t, cols);
    float *x = malloc(sizeof(float) * (size_t)(T * groups * cols)), *xg = malloc(sizeof(float) * (size_t)(T * cols));
    float *a = malloc(sizeof(float) * (size_t)(T * groups * rows)), *yg = malloc(sizeof(float) * (size_t)(T * rows));
    float *b = malloc(sizeof(float) * (size_t)(T * groups * rows));
    if (!x || !xg || !a || !yg || !b) abort();
    for (int64_t i = 0; i < T * groups * cols; i++) x[i] = rnd() * 2.0f;
    for (int threads = 1; threads <= 2; threads++) {
        ds4_backend *be = ds4_backend_cpu_create(threads);
        REQUIRE(be != NULL);
        for (int n = 1; n <= T; n += T - 1) {
            for (int g = 0; g < groups; g++) {
                ds4_weight wg = wt(t, cols, rows, (const char *)d + (size_t)g * (size_t)rows * rb);
                for (int tk = 0; tk < n; tk++)
                    memcpy(xg + (size_t)tk * cols, x + ((size_t)tk * groups + g) * cols, sizeof(float) * (size_t)cols);
                be->matmul(be, &wg, xg, n, yg);
                for (int tk = 0; tk < n; tk++)
                    memcpy(a + ((size_t)tk * groups + g) * rows, yg + (size_t)tk * rows, sizeof(float) * (size_t)rows);
            }
            memset(b, 0xff, sizeof(float) * (size_t)(n * groups * rows));
            uint64_t calls = cpu_of(be)->grouped_calls;
            be->matmul_grouped(be, &w, groups, x, n, b);
            EXPECT_MSG(same(a, b, (int64_t)n * groups * rows), "grouped %s, %d groups, %d tokens, %d threads: other bits",
                       ds4_type_name(t), groups, n, threads);
            int ran = cpu_of(be)->grouped_calls == calls + 1;
            if (n > 1) EXPECT_MSG(!ran, "%d tokens took the one-token grouped path", n);
            else if (ds4_cpu_mv_bytes(t, cols)) EXPECT_MSG(ran, "grouped %s: the one-region path did not run", ds4_type_name(t));
        }
        be->destroy(be);
    }
    free(d), free(x), free(xg), free(a), free(yg), free(b);
}

static void test_matmul_grouped_same_bits(void)
{
    check_grouped(DS4_TYPE_Q8_0, 8, 130, 1024); /* o_a's shape, smaller; rows not a multiple of the chunk */
    check_grouped(DS4_TYPE_F16, 3, 65, 96);
}

int main(void)
{
    RUN(test_matmul_pair_same_bits);
    RUN(test_matmul_grouped_same_bits);
    return test_finish();
}

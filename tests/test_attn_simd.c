/*
 * test_attn_simd.c - the AVX2 / AVX-512 attention loops (attn_simd.h) give
 * the same bits as the definition: a dot product as 16 partial sums (lane
 * k: elements i = k mod 16 of the whole 16-blocks, multiply then add),
 * added in lane order, then the tail; an axpy element by element. Written
 * here from that definition, on random values, every length from 1 to 80
 * and the head sizes (64, 128, 512); and the several-heads dots
 * (ds4_attn_dots_*) head by head. A level the CPU lacks is skipped.
 */
#include "backend/cpu/attn_simd.h"
#include "backend/cpu/cpu_matmul_kernels.h"
#include "tests/test.h"

#include <stdlib.h>
#include <string.h>

static float def_dot(const float *a, const float *b, int n)
{
    float lane[16] = {0};
    int full = n / 16 * 16;
    for (int i = 0; i < full; i++) {
        float p = a[i] * b[i];
        lane[i % 16] = lane[i % 16] + p;
    }
    float s = 0;
    for (int k = 0; k < 16; k++) s = s + lane[k];
    for (int i = full; i < n; i++) {
        float p = a[i] * b[i];
        s = s + p;
    }
    return s;
}

static float rnd(unsigned *st)
{
    *st = *st * 1103515245u + 12345u;
    return ((float)((*st >> 8) & 0xffff) / 32768.0f - 1.0f) * (float)(1 + (*st >> 28));
}

static void check(const char *name, ds4_attn_dot_fn dot, ds4_attn_axpy_fn axpy)
{
    enum { N = 520 };
    static float a[N], b[N], o1[N], o2[N];
    unsigned st = 7;
    int lens[90], nl = 0;
    for (int n = 1; n <= 80; n++) lens[nl++] = n;
    lens[nl++] = 128, lens[nl++] = 512, lens[nl++] = 513, lens[nl++] = 64;
    int bad = 0;
    for (int li = 0; li < nl; li++) {
        int n = lens[li];
        for (int rep = 0; rep < 4; rep++) {
            for (int i = 0; i < n; i++) a[i] = rnd(&st), b[i] = rnd(&st), o1[i] = o2[i] = rnd(&st);
            float want = def_dot(a, b, n), got = dot(a, b, n);
            if (memcmp(&want, &got, sizeof got)) {
                if (bad++ < 5) fprintf(stderr, "  %s dot n=%d: %.9g != %.9g\n", name, n, got, want);
            }
            float w = rnd(&st);
            for (int i = 0; i < n; i++) {
                float p = w * b[i];
                o1[i] = o1[i] + p;
            }
            axpy(o2, w, b, n);
            if (memcmp(o1, o2, (size_t)n * sizeof(float))) {
                if (bad++ < 5) fprintf(stderr, "  %s axpy n=%d differs\n", name, n);
            }
        }
    }
    EXPECT_MSG(bad == 0, "%s: %d mismatches", name, bad);
}

/* Several heads against one key from the transposed layout: each head's
 * dot has the definition's bits, for every head count of a group and the
 * lengths above; the transposed layout is zero past the heads. */
static void check_dots(const char *name, ds4_attn_dots_fn dots)
{
    enum { N = 520, H = DS4_ATTN_HEADS };
    static float q[H * N], qt[N * H], k[N];
    unsigned st = 11;
    int bad = 0;
    const int lens[] = {1, 7, 15, 16, 17, 31, 33, 64, 72, 128, 512, 513};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        int n = lens[li];
        for (int nh = 1; nh <= H; nh += (nh < 4 ? 1 : 3)) {
            for (int i = 0; i < H * N; i++) q[i] = rnd(&st);
            for (int i = 0; i < n; i++) k[i] = rnd(&st);
            ds4_attn_transpose(q, N, nh, n, qt);
            for (int i = 0; i < n; i++)
                for (int h = nh; h < H; h++)
                    if (qt[i * H + h] != 0) bad++;
            float out[H];
            for (int h = 0; h < H; h++) out[h] = -1;
            dots(qt, nh, k, n, out);
            for (int h = 0; h < H; h++) {
                float want = h < nh ? def_dot(q + (size_t)h * N, k, n) : -1;
                if (memcmp(&want, &out[h], sizeof want)) {
                    if (bad++ < 5) fprintf(stderr, "  %s dots n=%d nh=%d head %d: %.9g != %.9g\n", name, n, nh, h, out[h], want);
                }
            }
        }
    }
    EXPECT_MSG(bad == 0, "%s dots: %d mismatches", name, bad);
}

static void test_scalar(void)
{
    check("scalar", ds4_attn_dot_scalar, ds4_attn_axpy_scalar);
    check_dots("scalar", ds4_attn_dots_scalar);
}

static void test_avx2(void)
{
    if (!ds4_cpu_simd_supported(DS4_SIMD_AVX2)) {
        test_skip("this CPU has no AVX2");
        return;
    }
    check("avx2", ds4_attn_dot_avx2, ds4_attn_axpy_avx2);
    check_dots("avx2", ds4_attn_dots_avx2);
}

static void test_avx512(void)
{
    if (!ds4_cpu_simd_supported(DS4_SIMD_AVX512)) {
        test_skip("this CPU has no AVX-512");
        return;
    }
    check("avx512", ds4_attn_dot_avx512, ds4_attn_axpy_avx512);
    check_dots("avx512", ds4_attn_dots_avx512);
}

int main(void)
{
    RUN(test_scalar);
    RUN(test_avx2);
    RUN(test_avx512);
    return test_finish();
}

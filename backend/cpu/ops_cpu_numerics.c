/*
 * ops_cpu_numerics.c - row-level FP8 / FP4 / Hadamard / f16 simulations
 * (see ops_cpu_numerics.h; math: dsv4-model.md §4.1 D1-D3).
 */
#include "backend/cpu/ops_cpu_numerics.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Round v onto a minifloat grid with `mbits` mantissa bits, smallest normal
 * exponent emin (subnormals below), saturating at maxv; ties to even. */
static float round_minifloat(float v, int mbits, int emin, float maxv)
{
    float a = fabsf(v);
    if (a == 0.0f || a != a) return v;
    int e;
    frexpf(a, &e); /* a = f * 2^e, f in [0.5, 1) -> floor(log2 a) = e - 1 */
    int ex = e - 1 < emin ? emin : e - 1;
    float step = ldexpf(1.0f, ex - mbits);
    float r = rintf(a / step) * step;
    if (r > maxv) r = maxv;
    return v < 0 ? -r : r;
}

static void block_roundtrip(float *x, int n, int block, float qmax, int mbits, int emin)
{
    for (int b = 0; b < n; b += block) {
        int len = n - b < block ? n - b : block;
        float amax = 0;
        for (int i = 0; i < len; i++) amax = fabsf(x[b + i]) > amax ? fabsf(x[b + i]) : amax;
        if (amax < 1e-4f) amax = 1e-4f;
        float scale = exp2f(ceilf(log2f(amax / qmax)));
        for (int i = 0; i < len; i++) {
            float v = x[b + i] / scale;
            if (v > qmax) v = qmax;
            if (v < -qmax) v = -qmax;
            x[b + i] = round_minifloat(v, mbits, emin, qmax) * scale;
        }
    }
}

void cpu_fp8_kv_roundtrip(float *x, int n) { block_roundtrip(x, n, 64, 448.0f, 3, -6); }

void cpu_fp4_roundtrip(float *x, int n) { block_roundtrip(x, n, 32, 6.0f, 1, 0); }

void cpu_hadamard(float *x, int n)
{
    if (n <= 0 || (n & (n - 1))) return;
    for (int len = 1; len < n; len <<= 1)
        for (int i = 0; i < n; i += 2 * len)
            for (int j = i; j < i + len; j++) {
                float a = x[j], b = x[j + len];
                x[j] = a + b;
                x[j + len] = a - b;
            }
    float s = 1.0f / sqrtf((float)n);
    for (int i = 0; i < n; i++) x[i] *= s;
}

void cpu_indexer_qat_row(float *x, int n)
{
    cpu_hadamard(x, n);
    cpu_fp4_roundtrip(x, n);
}

static float f16_round1(float f)
{
    /* round to nearest even at 10 mantissa bits within the f16 range;
     * below 2^-14 the step is 2^-24 (subnormals); overflow -> inf */
    float a = fabsf(f);
    if (a != a || a == 0.0f || isinf(a)) return f;
    if (a >= 65520.0f) return f < 0 ? -INFINITY : INFINITY;
    int e;
    frexpf(a, &e);
    int ex = e - 1 < -14 ? -14 : e - 1;
    float step = ldexpf(1.0f, ex - 10);
    float r = rintf(a / step) * step;
    return f < 0 ? -r : r;
}

void cpu_f16_round(float *x, int n)
{
    for (int i = 0; i < n; i++) x[i] = f16_round1(x[i]);
}

/*
 * test_quant_half.c - f16 and bf16 conversions, exhaustively.
 *
 * Expected values come from the IEEE definitions computed here in double
 * (value = (-1)^s * 2^(e-bias) * (1 + m/2^k), subnormals without the 1),
 * not from quant/half.h. For f32 -> half rounding, every pair of adjacent
 * finite halves gives three probes: the exact midpoint (ties to even) and
 * the f32 neighbours on each side of it.
 */
#include "tests/test.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "quant/half.h"

static double f16_value(uint16_t h) /* finite only */
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e ? ldexp(1.0 + m / 1024.0, e - 15) : ldexp(m / 1024.0, -14);
    return s ? -v : v;
}

static double bf16_value(uint16_t h) /* finite only */
{
    int s = h >> 15, e = (h >> 7) & 255, m = h & 127;
    double v = e ? ldexp(1.0 + m / 128.0, e - 127) : ldexp(m / 128.0, -126);
    return s ? -v : v;
}

static void test_f16_decode_all(void)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ds4_f16_to_f32((uint16_t)h);
        int e = (h >> 10) & 31;
        if (e == 31) {
            if (h & 1023) EXPECT_MSG(isnan(f), "0x%04x not NaN", h);
            else EXPECT_MSG(isinf(f) && (f < 0) == (h >> 15), "0x%04x not Inf", h);
            /* NaN and Inf survive the way back (NaN quiet, sign kept) */
            uint16_t back = ds4_f32_to_f16(f);
            EXPECT_MSG((h & 1023) ? (back & 0x7e00) == 0x7e00 && (back >> 15) == (h >> 15)
                                  : back == h, "0x%04x -> 0x%04x", h, back);
            continue;
        }
        EXPECT_MSG((double)f == f16_value((uint16_t)h), "0x%04x -> %g", h, f);
        EXPECT_MSG((signbit(f) != 0) == ((h >> 15) != 0), "0x%04x sign", h);
        EXPECT_MSG(ds4_f32_to_f16(f) == h, "round trip 0x%04x", h);
    }
}

static void expect_f16(float f, uint16_t want)
{
    uint16_t got = ds4_f32_to_f16(f);
    EXPECT_MSG(got == want, "f16(%.10g) = 0x%04x, want 0x%04x", f, got, want);
}

static void test_f16_rounding_boundaries(void)
{
    for (uint16_t h = 0; h < 0x7bff; h++) { /* positive finite pairs h, h+1 */
        double mid = (f16_value(h) + f16_value((uint16_t)(h + 1))) / 2;
        float m = (float)mid;
        REQUIRE((double)m == mid); /* 12 significant bits fit in f32 */
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : h;
        expect_f16(m, even);
        expect_f16(-m, (uint16_t)(even | 0x8000));
        expect_f16(nextafterf(m, 0.f), h);
        expect_f16(nextafterf(m, INFINITY), (uint16_t)(h + 1));
    }
    expect_f16(65504.f, 0x7bff);
    expect_f16(nextafterf(65520.f, 0.f), 0x7bff);
    expect_f16(65520.f, 0x7c00); /* the tie above the largest half: to Inf */
    expect_f16(1e30f, 0x7c00);
    expect_f16(-1e30f, 0xfc00);
    expect_f16(0x1p-25f, 0x0000); /* half the smallest subnormal: tie to 0 */
    expect_f16(nextafterf(0x1p-25f, 1.f), 0x0001);
    expect_f16(0x1p-26f, 0x0000);
    expect_f16(-0.f, 0x8000);
    expect_f16(1e-45f, 0x0000);
}

static void expect_bf16(float f, uint16_t want)
{
    uint16_t got = ds4_f32_to_bf16(f);
    EXPECT_MSG(got == want, "bf16(%.10g) = 0x%04x, want 0x%04x", f, got, want);
}

static void test_bf16_all(void)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ds4_bf16_to_f32((uint16_t)h);
        int e = (h >> 7) & 255;
        if (e == 255) {
            EXPECT((h & 127) ? isnan(f) : isinf(f));
            uint16_t back = ds4_f32_to_bf16(f);
            EXPECT_MSG((h & 127) ? (back & 0x7fc0) == 0x7fc0 : back == h, "0x%04x", h);
            continue;
        }
        EXPECT_MSG((double)f == bf16_value((uint16_t)h), "0x%04x -> %g", h, f);
        EXPECT(ds4_f32_to_bf16(f) == h);
    }
    for (uint16_t h = 0; h < 0x7f7f; h++) {
        double mid = (bf16_value(h) + bf16_value((uint16_t)(h + 1))) / 2;
        float m = (float)mid;
        REQUIRE((double)m == mid);
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : h;
        expect_bf16(m, even);
        expect_bf16(-m, (uint16_t)(even | 0x8000));
        expect_bf16(nextafterf(m, 0.f), h);
        expect_bf16(nextafterf(m, INFINITY), (uint16_t)(h + 1));
    }
    expect_bf16(3.4028235e38f, 0x7f80); /* FLT_MAX is past the last tie */
    expect_bf16(nextafterf(ds4_bf16_to_f32(0x7f7f), INFINITY), 0x7f7f);
}

int main(void)
{
    RUN(test_f16_decode_all);
    RUN(test_f16_rounding_boundaries);
    RUN(test_bf16_all);
    return test_finish();
}

/*
 * test_quant_types.c - the type table: sizes against GGML's published block
 * sizes (ggml-common.h), names, row sizes and their errors.
 */
#include "tests/test.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "quant/quant.h"

static void test_block_sizes(void)
{
    /* id, name, elements, bytes: ggml's type traits */
    static const struct { int id; const char *name; int64_t be, bb; } k[] = {
        {0, "f32", 1, 4},        {1, "f16", 1, 2},       {8, "q8_0", 32, 34},
        {10, "q2_K", 256, 84},   {12, "q4_K", 256, 144}, {15, "q8_K", 256, 292},
        {16, "iq2_xxs", 256, 66}, {26, "i32", 1, 4},     {30, "bf16", 1, 2},
        {39, "mxfp4", 32, 17},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        const ds4_type_info *t = ds4_type_get((ds4_type)k[i].id);
        REQUIRE(t);
        EXPECT_MSG(strcmp(t->name, k[i].name) == 0, "id %d name %s", k[i].id, t->name);
        EXPECT(t->block_elems == k[i].be);
        EXPECT(t->block_bytes == k[i].bb);
        EXPECT(ds4_row_bytes((ds4_type)k[i].id, 4096) == 4096 / k[i].be * k[i].bb);
        ds4_type got;
        EXPECT(ds4_type_from_name(k[i].name, &got) == DS4_OK && (int)got == k[i].id);
    }
}

static void test_unknown_types_rejected(void)
{
    static const int bad[] = {2, 3, 6, 7, 9, 11, 13, 14, 17, 20, 23, 24, 25, 27, 40, 1000, -1};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        EXPECT(ds4_type_get((ds4_type)bad[i]) == NULL);
        EXPECT(strstr(ds4_last_error(), "not supported") != NULL);
        EXPECT(ds4_row_bytes((ds4_type)bad[i], 256) == -1);
        EXPECT(strcmp(ds4_type_name((ds4_type)bad[i]), "unknown") == 0);
        float y[256];
        uint8_t q[1024] = {0};
        EXPECT(ds4_dequantize_row((ds4_type)bad[i], q, y, 256) == DS4_ERR_UNSUPPORTED);
    }
}

static void test_names_case_insensitive(void)
{
    ds4_type t;
    EXPECT(ds4_type_from_name("Q2_K", &t) == DS4_OK && t == DS4_TYPE_Q2_K);
    EXPECT(ds4_type_from_name("IQ2_XXS", &t) == DS4_OK && t == DS4_TYPE_IQ2_XXS);
    EXPECT(ds4_type_from_name("q4_0", &t) == DS4_ERR_NOT_FOUND);
    EXPECT(strstr(ds4_last_error(), "q4_0") != NULL);
    EXPECT(ds4_type_from_name("", &t) == DS4_ERR_NOT_FOUND);
    EXPECT(ds4_type_from_name(NULL, &t) == DS4_ERR_NOT_FOUND);
}

static void test_row_bytes_errors(void)
{
    EXPECT(ds4_row_bytes(DS4_TYPE_Q2_K, 255) == -1);
    EXPECT(strstr(ds4_last_error(), "255") != NULL);
    EXPECT(ds4_row_bytes(DS4_TYPE_Q8_0, -32) == -1);
    EXPECT(ds4_row_bytes(DS4_TYPE_Q8_0, 0) == 0);
    EXPECT(ds4_row_bytes(DS4_TYPE_F32, INT64_MAX / 2) == -1); /* overflows */
    EXPECT(ds4_row_bytes(DS4_TYPE_F16, 3) == 6);
    float y[64];
    uint8_t q[64] = {0};
    EXPECT(ds4_dequantize_row(DS4_TYPE_Q8_0, q, y, 33) == DS4_ERR_INVALID);
    EXPECT(ds4_dequantize_row(DS4_TYPE_I32, q, y, 4) == DS4_ERR_UNSUPPORTED);
}

static void test_quantize_errors(void)
{
    float x[256] = {0}, im[256] = {0};
    uint8_t q[2048];
    EXPECT(ds4_quantize_rows(DS4_TYPE_IQ2_XXS, x, q, 1, 256, NULL) == DS4_ERR_INVALID);
    EXPECT(strstr(ds4_last_error(), "importance") != NULL);
    EXPECT(ds4_quantize_rows(DS4_TYPE_I32, x, q, 1, 256, NULL) == DS4_ERR_UNSUPPORTED);
    EXPECT(ds4_quantize_rows(DS4_TYPE_Q8_0, x, q, 1, 250, NULL) == DS4_ERR_INVALID);
    im[7] = -1.f;
    EXPECT(ds4_quantize_rows(DS4_TYPE_Q8_0, x, q, 1, 256, im) == DS4_ERR_INVALID);
    EXPECT(strstr(ds4_last_error(), "imatrix[7]") != NULL);
    x[9] = 1.f / 0.f;
    EXPECT(ds4_quantize_rows(DS4_TYPE_Q8_0, x, q, 1, 256, NULL) == DS4_ERR_INVALID);
    EXPECT(strstr(ds4_last_error(), "column 9") != NULL);
    /* the float types carry Inf through exactly */
    EXPECT(ds4_quantize_rows(DS4_TYPE_F16, x, q, 1, 256, NULL) == DS4_OK);
    EXPECT(q[18] == 0x00 && q[19] == 0x7c);
    x[9] = 0.f;
    /* an all-zero row quantizes to zeros for every block type */
    static const ds4_type types[] = {DS4_TYPE_Q8_0, DS4_TYPE_Q8_K, DS4_TYPE_MXFP4,
                                     DS4_TYPE_Q4_K, DS4_TYPE_Q2_K};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        if (!ds4_type_get(types[i])->can_quantize) continue;
        float y[256];
        EXPECT(ds4_quantize_rows(types[i], x, q, 1, 256, NULL) == DS4_OK);
        EXPECT(ds4_dequantize_row(types[i], q, y, 256) == DS4_OK);
        for (int j = 0; j < 256; j++) EXPECT(y[j] == 0.f);
    }
}

/* Awkward rows: every block type must accept them, dequantize to finite
 * values, and keep the error within a loose bound relative to the row's
 * RMS (constant rows must come out nearly exact). */
static void test_quantize_edge_rows(void)
{
    enum { N = 512 };
    static const struct { ds4_type t; double tol; } k[] = {
        {DS4_TYPE_Q8_0, 0.02}, {DS4_TYPE_Q8_K, 0.02}, {DS4_TYPE_Q4_K, 0.15},
        {DS4_TYPE_Q2_K, 0.6},  {DS4_TYPE_MXFP4, 0.35}, {DS4_TYPE_IQ2_XXS, 0.7},
    };
    static float x[N], y[N], im[N];
    static uint8_t q[4 * N];
    for (int kind = 0; kind < 7; kind++) {
        for (int i = 0; i < N; i++) {
            double u = sin(i * 12.9898) * 43758.5453;
            u -= floor(u); /* deterministic noise in [0, 1) */
            switch (kind) {
            case 0: x[i] = 1.f; break;                       /* constant */
            case 1: x[i] = -3.5f; break;                     /* constant negative */
            case 2: x[i] = i == 78 ? 100.f : 0.f; break;     /* one spike */
            case 3: x[i] = (float)((u - 0.5) * 1e-6); break; /* tiny */
            case 4: x[i] = (float)((u - 0.5) * 1e5); break;  /* large (within every limit) */
            case 5: x[i] = (float)(u - 0.3); break;          /* shifted */
            default: x[i] = (float)((i & 1 ? 1 : -1) * (0.5 + u)); break; /* alternating */
            }
            im[i] = (i % 7 == 0) ? 0.f : (float)(1 + u * 10); /* some zero importance */
        }
        double rms = 0;
        for (int i = 0; i < N; i++) rms += (double)x[i] * x[i];
        rms = sqrt(rms / N);
        for (size_t t = 0; t < sizeof k / sizeof k[0]; t++) {
            for (int with_im = 0; with_im < 2; with_im++) {
                if (!with_im && k[t].t == DS4_TYPE_IQ2_XXS) continue;
                REQUIRE(ds4_quantize_rows(k[t].t, x, q, 1, N, with_im ? im : NULL) == DS4_OK);
                REQUIRE(ds4_dequantize_row(k[t].t, q, y, N) == DS4_OK);
                double err = 0;
                int finite = 1;
                for (int i = 0; i < N; i++) {
                    finite &= isfinite(y[i]) != 0;
                    err += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
                }
                err = sqrt(err / N);
                /* constants are exact where the grid has them (not 3.5 in
                 * mxfp4); tiny rows fall below the f16 scales of all but
                 * q8_K, where zero (rel. error 1) is the best there is */
                double tol = k[t].tol;
                if (kind <= 1 && k[t].t != DS4_TYPE_MXFP4) tol = 2e-3;
                if (kind == 2) /* iq2_xxs has no zero: the spike's zeros cost */
                    tol = k[t].t == DS4_TYPE_IQ2_XXS ? 0.8 : 0.5;
                if (kind == 3 && k[t].t != DS4_TYPE_Q8_K) tol = 1.0;
                EXPECT_MSG(finite && err <= tol * rms, "%s kind %d imatrix %d: rel rmse %.4g",
                           ds4_type_name(k[t].t), kind, with_im, err / rms);
            }
        }
    }
    /* beyond the format's range: refused, not Inf/NaN blocks */
    x[3] = 1e8f;
    EXPECT(ds4_quantize_rows(DS4_TYPE_Q8_0, x, q, 1, N, NULL) == DS4_ERR_INVALID);
    EXPECT(strstr(ds4_last_error(), "column 3") != NULL);
    EXPECT(ds4_quantize_rows(DS4_TYPE_Q8_K, x, q, 1, N, NULL) == DS4_OK);
    /* zero rows are fine */
    EXPECT(ds4_quantize_rows(DS4_TYPE_Q4_K, x, q, 0, N, NULL) == DS4_OK);
}

int main(void)
{
    RUN(test_block_sizes);
    RUN(test_unknown_types_rejected);
    RUN(test_names_case_insensitive);
    RUN(test_row_bytes_errors);
    RUN(test_quantize_errors);
    RUN(test_quantize_edge_rows);
    return test_finish();
}

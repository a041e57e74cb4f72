/*
 * test_quant_fixtures.c - GGML block formats against ggml's own output.
 *
 * Every file of tests/data/quants (made by ggml, see its README.md) holds
 * input rows x, ggml's quantized bytes q and ggml's dequantization deq.
 * 1. ds4_dequantize_row(q) must equal deq bit for bit (memcmp).
 * 2. ds4_quantize_rows(x[, imatrix]) then dequantize must have an RMSE no
 *    worse than 1.05 x ggml's (imatrix-weighted where the file used an
 *    imatrix). ggml's RMSE is recomputed from the file's deq and compared
 *    with manifest.json, so the reference number itself is checked.
 * The ratio per file is printed (the report table comes from this output).
 */
#include "tests/test.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"
#include "util/error.h"

typedef struct {
    uint8_t *buf;
    size_t len;
    uint32_t type, n, rows, row_bytes, has_im;
    const float *x, *im, *deq;
    const uint8_t *q;
} fixture;

static uint32_t rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Parse one QFX1 file; returns 0 on success. */
static int load_fixture(const char *name, fixture *f)
{
    memset(f, 0, sizeof *f);
    f->buf = test_read_file(test_data(name), &f->len);
    if (!f->buf || f->len < 28 || memcmp(f->buf, "QFX1", 4) != 0) return -1;
    f->type = rd32(f->buf + 4);
    f->n = rd32(f->buf + 8);
    f->rows = rd32(f->buf + 12);
    f->row_bytes = rd32(f->buf + 16);
    f->has_im = rd32(f->buf + 20);
    size_t off = 28, nx = (size_t)f->rows * f->n;
    size_t need = off + 4 * nx + (f->has_im ? 4 * (size_t)f->n : 0) +
                  (size_t)f->rows * f->row_bytes + 4 * nx;
    if (f->len < need) return -1;
    f->x = (const float *)(f->buf + off);
    off += 4 * nx;
    if (f->has_im) {
        f->im = (const float *)(f->buf + off);
        off += 4 * (size_t)f->n;
    }
    f->q = f->buf + off;
    off += (size_t)f->rows * f->row_bytes;
    f->deq = (const float *)(f->buf + off);
    return 0;
}

/* sum (w * (a - b)^2) / sum(w) over all rows, in double; w = 1 if NULL. */
static double rmse(const float *a, const float *b, const float *w, size_t rows, size_t n)
{
    double num = 0, den = 0;
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < n; j++) {
            double d = (double)a[r * n + j] - b[r * n + j], ww = w ? w[j] : 1.0;
            num += ww * d * d;
            den += ww;
        }
    return sqrt(num / den);
}

static json_t *g_manifest;

static void check_file(json_t *e)
{
    const char *name = json_string_value(json_object_get(e, "file"));
    fixture f;
    char rel[256];
    snprintf(rel, sizeof rel, "quants/%s", name ? name : "");
    if (!name || load_fixture(rel, &f) != 0) {
        EXPECT_MSG(0, "cannot load fixture %s", name ? name : "?");
        return;
    }
    ds4_type type = (ds4_type)f.type;
    EXPECT_MSG(ds4_row_bytes(type, f.n) == (int64_t)f.row_bytes,
               "%s: row bytes %lld, file says %u", name,
               (long long)ds4_row_bytes(type, f.n), f.row_bytes);
    size_t nx = (size_t)f.rows * f.n;
    float *out = malloc(nx * sizeof(float));
    float *deq2 = malloc(nx * sizeof(float));
    uint8_t *q2 = malloc((size_t)f.rows * f.row_bytes);
    if (!out || !deq2 || !q2) goto done;

    /* 1. dequantization, bit for bit */
    int mismatches = 0;
    for (uint32_t r = 0; r < f.rows; r++) {
        ds4_status st = ds4_dequantize_row(type, f.q + (size_t)r * f.row_bytes,
                                           out + (size_t)r * f.n, f.n);
        EXPECT_MSG(st == DS4_OK, "%s: dequantize: %s", name, ds4_last_error());
    }
    for (size_t i = 0; i < nx; i++)
        if (memcmp(&out[i], &f.deq[i], 4) != 0 && mismatches++ < 3)
            printf("  %s: deq[%zu] = %.9g, ggml %.9g\n", name, i, out[i], f.deq[i]);
    EXPECT_MSG(memcmp(out, f.deq, nx * 4) == 0, "%s: %d dequantized values differ",
               name, mismatches);

    /* 2. quantizer error against ggml's */
    const ds4_type_info *ti = ds4_type_get(type);
    if (!ti || !ti->can_quantize) {
        printf("  %s: no quantizer yet\n", name);
        goto done;
    }
    const float *w = f.has_im ? f.im : NULL;
    double ggml_rmse = rmse(f.deq, f.x, w, f.rows, f.n);
    double manifest = json_real_value(json_object_get(e, w ? "imatrix_weighted_rmse" : "rmse"));
    EXPECT_MSG(fabs(ggml_rmse - manifest) <= 1e-4 * manifest + 1e-9,
               "%s: ggml rmse recomputed %.6g, manifest %.6g", name, ggml_rmse, manifest);
    ds4_status st = ds4_quantize_rows(type, f.x, q2, f.rows, f.n, f.im);
    EXPECT_MSG(st == DS4_OK, "%s: quantize: %s", name, ds4_last_error());
    if (st != DS4_OK) goto done;
    for (uint32_t r = 0; r < f.rows; r++)
        ds4_dequantize_row(type, q2 + (size_t)r * f.row_bytes, deq2 + (size_t)r * f.n, f.n);
    double ours = rmse(deq2, f.x, w, f.rows, f.n);
    double ratio = ours / ggml_rmse;
    printf("  ratio %-26s %-8s %s rmse %.6g ggml %.6g ratio %.4f\n", name, ti->name,
           w ? "imatrix-weighted" : "plain", ours, ggml_rmse, ratio);
    EXPECT_MSG(ratio <= 1.05, "%s: rmse ratio %.4f > 1.05", name, ratio);
done:
    free(out);
    free(deq2);
    free(q2);
    free(f.buf);
}

static void test_fixture_files(void)
{
    size_t len;
    char *text = test_read_file(test_data("quants/manifest.json"), &len);
    REQUIRE(text);
    json_error_t err;
    g_manifest = json_loads(text, 0, &err);
    free(text);
    REQUIRE(g_manifest && json_is_array(g_manifest));
    EXPECT(json_array_size(g_manifest) >= 20);
    size_t i;
    json_t *e;
    json_array_foreach(g_manifest, i, e) check_file(e);
    json_decref(g_manifest);
}

int main(void)
{
    RUN(test_fixture_files);
    return test_finish();
}

/*
 * convert_imatrix.c - read/write the legacy imatrix.dat layout (see
 * convert_imatrix.h). Counts are bounded by the bytes left in the file
 * before anything is allocated.
 */
#include "tools/convert_imatrix.h"

#include "util/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *name;
    float *values;
    int32_t n;
} entry;

struct convert_imatrix {
    entry *e;
    int64_t n;
};

int64_t convert_imatrix_count(const convert_imatrix *im) { return im ? im->n : 0; }

void convert_imatrix_free(convert_imatrix *im)
{
    if (!im) return;
    for (int64_t i = 0; i < im->n; i++) {
        free(im->e[i].name);
        free(im->e[i].values);
    }
    free(im->e);
    free(im);
}

static int read_i32(FILE *f, int32_t *v) { return fread(v, 4, 1, f) == 1; }

convert_imatrix *convert_imatrix_load(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        ds4_fail(DS4_ERR_IO, "imatrix: cannot open %s", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    convert_imatrix *im = calloc(1, sizeof *im);
    int32_t n = 0;
    const char *err = NULL;
    long at = 0;
    if (!im) err = "out of memory";
    else if (!read_i32(f, &n) || n < 1 || (long)n > size / 16) err = "bad entry count";
    else if (!(im->e = calloc((size_t)n, sizeof *im->e))) err = "out of memory";
    for (int32_t i = 0; !err && i < n; i++) {
        at = ftell(f);
        int32_t len, ncall, nval;
        if (!read_i32(f, &len) || len < 1 || len > 4096 || len > size - ftell(f)) {
            err = "bad name length";
            break;
        }
        entry *e = &im->e[im->n];
        e->name = calloc(1, (size_t)len + 1);
        if (!e->name || fread(e->name, 1, (size_t)len, f) != (size_t)len) {
            free(e->name);
            err = "truncated name";
            break;
        }
        if (!read_i32(f, &ncall) || !read_i32(f, &nval) || nval < 1 || (long)nval > (size - ftell(f)) / 4) {
            free(e->name);
            err = "bad value count";
            break;
        }
        e->values = malloc((size_t)nval * 4);
        if (!e->values || fread(e->values, 4, (size_t)nval, f) != (size_t)nval) {
            free(e->name);
            free(e->values);
            err = "truncated values";
            break;
        }
        e->n = nval;
        im->n++;
        for (int32_t j = 0; j < nval; j++) {
            if (ncall > 0) e->values[j] /= (float)ncall;
            if (!isfinite(e->values[j]) || e->values[j] < 0) {
                err = "negative or non-finite value";
                break;
            }
        }
    }
    fclose(f);
    if (err) {
        ds4_fail(DS4_ERR_FORMAT, "imatrix: %s: %s (entry %lld, offset %ld)", path, err,
                 (long long)(im ? im->n : 0), at);
        convert_imatrix_free(im);
        return NULL;
    }
    return im;
}

const float *convert_imatrix_find(const convert_imatrix *im, const char *tensor, uint64_t ne0,
                                  uint64_t slab, uint64_t n_slabs, ds4_status *st)
{
    if (!im) return NULL;
    for (int64_t i = 0; i < im->n; i++) {
        const entry *e = &im->e[i];
        if (strcmp(e->name, tensor) != 0) continue;
        if ((uint64_t)e->n == ne0) return e->values;
        if (n_slabs > 1 && (uint64_t)e->n == ne0 * n_slabs) return e->values + slab * ne0;
        *st = ds4_fail(DS4_ERR_FORMAT, "imatrix: entry %s has %d values, expected %llu (or %llu for all experts)",
                       tensor, e->n, (unsigned long long)ne0, (unsigned long long)(ne0 * n_slabs));
        return NULL;
    }
    return NULL;
}

ds4_status convert_imatrix_write(const char *path, int n, const char *const *names,
                                 const float *const *values, const int32_t *nval)
{
    FILE *f = fopen(path, "wb");
    if (!f) return ds4_fail(DS4_ERR_IO, "imatrix: cannot create %s", path);
    int32_t v = n, one = 1;
    int ok = fwrite(&v, 4, 1, f) == 1;
    for (int i = 0; ok && i < n; i++) {
        int32_t len = (int32_t)strlen(names[i]);
        ok = fwrite(&len, 4, 1, f) == 1 && fwrite(names[i], 1, (size_t)len, f) == (size_t)len &&
             fwrite(&one, 4, 1, f) == 1 && fwrite(&nval[i], 4, 1, f) == 1 &&
             fwrite(values[i], 4, (size_t)nval[i], f) == (size_t)nval[i];
    }
    if (fclose(f) != 0 || !ok) return ds4_fail(DS4_ERR_IO, "imatrix: write %s failed", path);
    return DS4_OK;
}

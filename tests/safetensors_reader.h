/*
 * safetensors_reader.h - a tiny safetensors reader of the tests' own, for
 * the converter tests (test_convert.c, test_convert_official.c): the
 * fixtures' values are read without the converter's parser, so nothing the
 * converter computes is used to check the converter. Header-only: each
 * test binary is one .c file.
 */
#ifndef DS4_TEST_SAFETENSORS_READER_H
#define DS4_TEST_SAFETENSORS_READER_H

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tests/test.h"

typedef struct {
    uint8_t *buf;
    size_t len;
    json_t *hdr;
    size_t data;
} stfile;

static inline int st_load(stfile *s, const char *path)
{
    s->buf = test_read_file(path, &s->len);
    if (!s->buf || s->len < 8) return 0;
    uint64_t n;
    memcpy(&n, s->buf, 8);
    s->hdr = json_loadb((const char *)s->buf + 8, n, 0, NULL);
    s->data = 8 + n;
    return s->hdr != NULL;
}

static inline void st_unload(stfile *s)
{
    json_decref(s->hdr);
    free(s->buf);
}

/* A tensor's dtype, shape (nd entries) and first byte; 0 when absent. */
static inline int st_get(const stfile *s, const char *name, const char **dtype, int64_t *shape, int *nd,
                         const uint8_t **data)
{
    json_t *e = json_object_get(s->hdr, name);
    if (!e) return 0;
    *dtype = json_string_value(json_object_get(e, "dtype"));
    json_t *sh = json_object_get(e, "shape");
    *nd = (int)json_array_size(sh);
    for (int i = 0; i < *nd; i++) shape[i] = json_integer_value(json_array_get(sh, (size_t)i));
    *data = s->buf + s->data + json_integer_value(json_array_get(json_object_get(e, "data_offsets"), 0));
    return 1;
}

/* Element i of a tensor as float (BF16, F32) or int (I32, I64). */
static inline double st_val(const char *dtype, const uint8_t *d, uint64_t i)
{
    if (strcmp(dtype, "BF16") == 0) {
        uint16_t h;
        memcpy(&h, d + 2 * i, 2);
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    if (strcmp(dtype, "F32") == 0) {
        float f;
        memcpy(&f, d + 4 * i, 4);
        return f;
    }
    if (strcmp(dtype, "I64") == 0) {
        int64_t v;
        memcpy(&v, d + 8 * i, 8);
        return (double)v;
    }
    int32_t v;
    memcpy(&v, d + 4 * i, 4);
    return v;
}

#endif

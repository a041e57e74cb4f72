/*
 * quality_werr.c - `ds4-quality weight-error REF.gguf Q.gguf [--imatrix F]`
 * (see quality_tools.h): how far the routed experts of Q are from REF's,
 * as the squared error of the dequantized weights summed over every
 * expert tensor, plain and (with --imatrix) weighted by the importance of
 * each input column, the quantity an imatrix-aware quantizer minimises.
 * This separates "the quantizer used the imatrix" (weighted error drops)
 * from "the model got better" (what `score` measures). Like ds4-quantize,
 * it reads the GGUF and block formats directly (a format tool).
 */
#include "tools/quality_tools.h"

#include "gguf/gguf.h"
#include "quant/quant.h"
#include "tools/convert_imatrix.h"
#include "util/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool is_expert(const ds4_gguf_tensor *t)
{
    const char *suf = "_exps.weight";
    size_t n = strlen(t->name), m = strlen(suf);
    return t->n_dims == 3 && n > m && strcmp(t->name + n - m, suf) == 0;
}

/* Adds plain and weighted squared errors of one expert tensor. */
static ds4_status tensor_error(const ds4_gguf_tensor *r, const ds4_gguf_tensor *q, const convert_imatrix *im,
                               double *plain, double *weighted)
{
    const int64_t ne0 = (int64_t)r->ne[0], rows = (int64_t)r->ne[1], slabs = (int64_t)r->ne[2];
    int64_t rb = 0, qb = 0;
    ds4_status st = ds4_row_bytes_checked((ds4_type)r->type, ne0, &rb);
    if (!st) st = ds4_row_bytes_checked((ds4_type)q->type, ne0, &qb);
    float *a = malloc((size_t)ne0 * sizeof *a), *b = malloc((size_t)ne0 * sizeof *b);
    if (!st && (!a || !b)) st = ds4_fail(DS4_ERR_NOMEM, "out of memory");
    for (int64_t s = 0; !st && s < slabs; s++) {
        const float *w = convert_imatrix_find(im, r->name, (uint64_t)ne0, (uint64_t)s, (uint64_t)slabs, &st);
        for (int64_t i = 0; !st && i < rows; i++) {
            st = ds4_dequantize_row((ds4_type)r->type, (const char *)r->data + (size_t)(s * rows + i) * (size_t)rb, a, ne0);
            if (!st)
                st = ds4_dequantize_row((ds4_type)q->type, (const char *)q->data + (size_t)(s * rows + i) * (size_t)qb, b,
                                        ne0);
            for (int64_t c = 0; !st && c < ne0; c++) {
                double d = (double)a[c] - (double)b[c];
                *plain += d * d;
                if (w) *weighted += (double)w[c] * d * d;
            }
        }
    }
    free(a);
    free(b);
    return st;
}

int quality_weight_error(const char *ref_path, const char *q_path, const char *imatrix)
{
    ds4_gguf *r = ds4_gguf_open(ref_path), *q = r ? ds4_gguf_open(q_path) : NULL;
    convert_imatrix *im = NULL;
    ds4_status st = r && q ? DS4_OK : DS4_ERR_IO;
    if (!st && imatrix && !(im = convert_imatrix_load(imatrix))) st = DS4_ERR_FORMAT;
    double plain = 0, weighted = 0;
    int n = 0, n_weighted = 0;
    for (int64_t i = 0; !st && i < ds4_gguf_n_tensors(r); i++) {
        const ds4_gguf_tensor *t = ds4_gguf_tensor_at(r, i);
        if (!is_expert(t)) continue;
        const ds4_gguf_tensor *u = ds4_gguf_get_tensor(q, t->name);
        if (!u || u->n_dims != t->n_dims || memcmp(u->ne, t->ne, sizeof t->ne) != 0) {
            st = ds4_fail(DS4_ERR_FORMAT, "%s: tensor %s is missing or has another shape than in %s", q_path, t->name,
                          ref_path);
            break;
        }
        ds4_status fst = DS4_OK;
        n_weighted += convert_imatrix_find(im, t->name, t->ne[0], 0, t->ne[2], &fst) != NULL;
        st = fst ? fst : tensor_error(t, u, im, &plain, &weighted);
        if (st) ds4_error_prefix("tensor %s: ", t->name);
        n++;
    }
    if (!st && n == 0) st = ds4_fail(DS4_ERR_FORMAT, "%s has no routed-expert tensors (*_exps.weight)", ref_path);
    if (!st && im && n_weighted == 0)
        st = ds4_fail(DS4_ERR_FORMAT, "imatrix %s has no entry for the expert tensors of %s", imatrix, ref_path);
    if (!st) {
        printf("expert tensors %d: squared error %.9g", n, plain);
        if (im) printf(", imatrix-weighted %.9g (%d tensors weighted)", weighted, n_weighted);
        printf("\n");
    } else {
        fprintf(stderr, "ds4-quality: %s\n", ds4_last_error());
    }
    convert_imatrix_free(im);
    ds4_gguf_close(q);
    ds4_gguf_close(r);
    return st ? 1 : 0;
}

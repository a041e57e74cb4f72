/*
 * convert_requant.c - `ds4-quantize --gguf IN.gguf --out OUT.gguf
 * --experts E [--imatrix F]`: a GGUF whose routed experts (the 3-D
 * ffn_{gate,up,down}_exps tensors) are dequantized and quantized again to
 * E, with the importance matrix when one is given; every other tensor and
 * every metadata key is copied byte for byte.
 *
 * This is how a model that only exists as a GGUF (the demo model) gets its
 * q2/mxfp4 variants, with and without an imatrix, for docs/QUALITY.md. The
 * experts are requantized from what IN stores, so IN should be the most
 * precise file there is (f32/q8_0 experts). Each requantized tensor is
 * held in memory until the file is written: meant for small models; a
 * full-size model goes through --hf from its checkpoint.
 */
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "tools/convert_imatrix.h"
#include "tools/convert_run.h"
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

static ds4_status requant_tensor(const ds4_gguf_tensor *t, ds4_type to, const convert_imatrix *im, void **out,
                                 uint64_t *out_bytes)
{
    const uint64_t ne0 = t->ne[0], rows = t->ne[1], slabs = t->ne[2];
    int64_t src_row = 0, dst_row = 0;
    ds4_status st = ds4_row_bytes_checked((ds4_type)t->type, (int64_t)ne0, &src_row);
    if (!st) st = ds4_row_bytes_checked(to, (int64_t)ne0, &dst_row);
    if (st) {
        ds4_error_prefix("requant: tensor %s (row length %llu): ", t->name, (unsigned long long)ne0);
        return st;
    }
    float *x = malloc((size_t)(rows * ne0) * sizeof *x);
    char *dst = malloc((size_t)(slabs * rows) * (size_t)dst_row);
    float *uniform = NULL;
    if (!x || !dst) st = ds4_fail(DS4_ERR_NOMEM, "requant: tensor %s: out of memory", t->name);
    for (uint64_t s = 0; !st && s < slabs; s++) {
        const char *src = (const char *)t->data + (size_t)(s * rows) * (size_t)src_row;
        for (uint64_t r = 0; !st && r < rows; r++)
            st = ds4_dequantize_row((ds4_type)t->type, src + (size_t)r * (size_t)src_row, x + r * ne0, (int64_t)ne0);
        const float *w = st ? NULL : convert_imatrix_find(im, t->name, ne0, s, slabs, &st);
        if (!st && !w && ds4_type_get(to)->needs_imatrix) {
            if (!uniform && !(uniform = malloc((size_t)ne0 * sizeof *uniform))) {
                st = ds4_fail(DS4_ERR_NOMEM, "requant: out of memory");
                break;
            }
            for (uint64_t c = 0; c < ne0; c++) uniform[c] = 1.0f;
            w = uniform;
        }
        if (!st) st = ds4_quantize_rows(to, x, dst + (size_t)(s * rows) * (size_t)dst_row, (int64_t)rows, (int64_t)ne0, w);
        if (st) ds4_error_prefix("requant: tensor %s expert %llu: ", t->name, (unsigned long long)s);
    }
    free(x);
    free(uniform);
    if (st) {
        free(dst);
        return st;
    }
    *out = dst;
    *out_bytes = (uint64_t)(slabs * rows) * (uint64_t)dst_row;
    return DS4_OK;
}

ds4_status convert_requant(const char *in, const convert_options *opt)
{
    ds4_gguf *g = ds4_gguf_open(in);
    if (!g) return DS4_ERR_FORMAT;
    convert_imatrix *im = NULL;
    ds4_status st = DS4_OK;
    if (opt->imatrix && !(im = convert_imatrix_load(opt->imatrix))) st = DS4_ERR_FORMAT;
    ds4_gguf_writer *w = st ? NULL : ds4_gguf_writer_new();
    if (!st && !w) st = ds4_fail(DS4_ERR_NOMEM, "requant: out of memory");
    const int64_t nt = ds4_gguf_n_tensors(g);
    void **bufs = calloc((size_t)nt + 1, sizeof *bufs);
    if (!st && !bufs) st = ds4_fail(DS4_ERR_NOMEM, "requant: out of memory");
    for (int64_t i = 0; !st && i < ds4_gguf_n_kv(g); i++) st = ds4_gguf_writer_copy_kv(w, g, i);
    /* antirez/ds4's files lack llama.cpp's router key; add it (4 =
     * sqrt(softplus), DeepSeek V4's only one) so the output loads there */
    if (!st && ds4_gguf_find_key(g, "deepseek4.expert_gating_func") < 0)
        st = ds4_gguf_writer_add_u32(w, "deepseek4.expert_gating_func", 4);
    int n_req = 0, n_im = 0;
    for (int64_t i = 0; !st && i < nt; i++) {
        const ds4_gguf_tensor *t = ds4_gguf_tensor_at(g, i);
        const void *data = t->data;
        uint32_t type = t->type;
        if (is_expert(t)) {
            const bool down = strstr(t->name, "ffn_down_exps") != NULL;
            const ds4_type to = down ? opt->exp_down : opt->exp_gate_up;
            uint64_t nb;
            ds4_status fst = DS4_OK;
            n_im += convert_imatrix_find(im, t->name, t->ne[0], 0, t->ne[2], &fst) != NULL;
            st = fst ? fst : requant_tensor(t, to, im, &bufs[i], &nb);
            if (st) break;
            data = bufs[i];
            type = (uint32_t)to;
            n_req++;
            if (!opt->quiet)
                fprintf(stderr, "ds4-quantize: %s %s -> %s%s\n", t->name, ds4_gguf_type_name(t->type),
                        ds4_gguf_type_name(type), im && n_im ? " (imatrix)" : "");
        }
        st = ds4_gguf_writer_add_tensor(w, t->name, type, t->n_dims, t->ne, data);
    }
    if (!st && n_req == 0) st = ds4_fail(DS4_ERR_FORMAT, "requant: %s has no routed-expert tensors (*_exps.weight)", in);
    if (!st && im && n_im == 0)
        st = ds4_fail(DS4_ERR_FORMAT, "requant: imatrix %s has no entry for any expert tensor of %s (another model?)",
                      opt->imatrix, in);
    if (!st) st = ds4_gguf_writer_write(w, opt->out);
    for (int64_t i = 0; bufs && i < nt; i++) free(bufs[i]);
    free(bufs);
    ds4_gguf_writer_free(w);
    convert_imatrix_free(im);
    ds4_gguf_close(g);
    return st;
}

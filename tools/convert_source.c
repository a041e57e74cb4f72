/*
 * convert_source.c - resolve and decode checkpoint tensors (see
 * convert_source.h). FP8-E4M3 tiles and packed FP4-E2M1 blocks are
 * decoded by the checkpoint codecs of quant/fp8.h; official FP4 experts
 * with UE8M0 scales are repacked losslessly when the target is MXFP4.
 */
#include "tools/convert_source.h"

#include "quant/fp8.h"
#include "quant/half.h"
#include "util/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool is_float_dtype(st_dtype d)
{
    return d == ST_F32 || d == ST_F64 || d == ST_F16 || d == ST_BF16 || d == ST_F8_E4M3;
}

static bool is_scale_dtype(st_dtype d)
{
    return d == ST_F8_E8M0 || d == ST_F32 || d == ST_BF16;
}

static const st_tensor *find_scale(const st_archive *a, const char *wname)
{
    char buf[512];
    size_t n = strlen(wname);
    const char *suffixes[] = {".scale", ".weight_scale_inv", ".scale_inv"};
    if (n < 7 || strcmp(wname + n - 7, ".weight") != 0 || n > 400) return NULL;
    for (size_t i = 0; i < 3; i++) {
        snprintf(buf, sizeof buf, "%.*s%s", (int)(n - 7), wname, suffixes[i]);
        const st_tensor *s = st_find(a, buf);
        if (s) return s;
    }
    return NULL;
}

static void shape_str(const int64_t *s, int n, char *buf, size_t cap)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < n && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)s[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

/* Check `w` against the expected PyTorch shape and fill a part (rows x cols
 * matrix view, last axis = cols). Handles FP8 (+block scale) and packed FP4
 * (+per-32 scale). */
static ds4_status make_part(const st_archive *a, const plan_tensor *t, const st_tensor *w,
                            const int64_t *want, int nd, convert_part *p)
{
    char ws[128], gs[128];
    memset(p, 0, sizeof *p);
    p->w = w;
    bool packed = (w->dtype == ST_I8 || w->dtype == ST_U8) && t->cls != CLS_I32;
    int64_t got[ST_MAX_DIMS];
    memcpy(got, w->shape, sizeof got);
    if (packed && w->n_dims >= 1) got[w->n_dims - 1] *= 2; /* two FP4 values per byte */
    bool scalar_ok = nd == 1 && want[0] == 1 && w->n_dims == 0;
    bool same = w->n_dims == nd;
    for (int i = 0; same && i < nd; i++) same = got[i] == want[i];
    if (!same && !scalar_ok) {
        shape_str(w->shape, w->n_dims, gs, sizeof gs);
        shape_str(want, nd, ws, sizeof ws);
        return ds4_fail(DS4_ERR_FORMAT, "convert: tensor %s (for %s): shape %s%s, expected %s", w->name,
                        t->name, gs, packed ? " (packed FP4)" : "", ws);
    }
    p->cols = (uint64_t)(nd ? want[nd - 1] : 1);
    p->rows = 1;
    for (int i = 0; i + 1 < nd; i++) p->rows *= (uint64_t)want[i];
    if (t->cls == CLS_I32) {
        if (w->dtype != ST_I32 && w->dtype != ST_I64)
            return ds4_fail(DS4_ERR_FORMAT, "convert: tensor %s (for %s): dtype %s, expected I32 or I64",
                            w->name, t->name, w->dtype_name);
        return DS4_OK;
    }
    if (!is_float_dtype(w->dtype) && !packed)
        return ds4_fail(DS4_ERR_UNSUPPORTED,
                        "convert: tensor %s (for %s): unsupported dtype %s (F32, F16, BF16, F8_E4M3 + "
                        "scale, packed FP4 I8 + scale)", w->name, t->name, w->dtype_name);
    if (w->dtype != ST_F8_E4M3 && !packed) return DS4_OK;
    const st_tensor *s = find_scale(a, w->name);
    if (!s)
        return ds4_fail(DS4_ERR_NOT_FOUND, "convert: tensor %s (for %s): %s weight without its scale "
                        "tensor (%.*s.scale)", w->name, t->name, packed ? "FP4" : "FP8",
                        (int)(strlen(w->name) - 7), w->name);
    if (!is_scale_dtype(s->dtype) || s->n_dims != 2)
        return ds4_fail(DS4_ERR_FORMAT, "convert: scale tensor %s: dtype %s with %d dims, expected a 2-D "
                        "F8_E8M0, F32 or BF16 tensor", s->name, s->dtype_name, s->n_dims);
    int64_t wr = (int64_t)p->rows, wc = (int64_t)p->cols;
    int64_t want_s[2];
    if (packed) {
        if (wc % 32) return ds4_fail(DS4_ERR_FORMAT, "convert: tensor %s: FP4 row length %lld is not a multiple of 32", w->name, (long long)wc);
        want_s[0] = wr;
        want_s[1] = wc / 32;
    } else {
        want_s[0] = (wr + 127) / 128;
        want_s[1] = (wc + 127) / 128;
    }
    if (s->shape[0] != want_s[0] || s->shape[1] != want_s[1]) {
        shape_str(s->shape, s->n_dims, gs, sizeof gs);
        shape_str(want_s, 2, ws, sizeof ws);
        return ds4_fail(DS4_ERR_FORMAT, "convert: scale tensor %s: shape %s, expected %s", s->name, gs, ws);
    }
    p->scale = s;
    p->fp4 = packed;
    return DS4_OK;
}

ds4_status convert_src_resolve(const st_archive *a, convert_scheme s, const plan_tensor *t, convert_src *out)
{
    memset(out, 0, sizeof *out);
    out->t = t;
    if (t->mtp) s = SCHEME_OFFICIAL; /* mtp.* keeps DeepSeek's names in every release */
    char name[512];
    int64_t want[3];
    int nd = (int)t->n_dims;
    for (int i = 0; i < nd; i++) want[i] = (int64_t)t->ne[nd - 1 - i];
    bool exps = t->role == R_GATE_EXPS || t->role == R_UP_EXPS || t->role == R_DOWN_EXPS;
    if (exps && s == SCHEME_OFFICIAL) {
        out->kind = SRC_PER_EXPERT;
        uint64_t ne = plan_slabs(t);
        out->experts = calloc(ne, sizeof *out->experts);
        if (!out->experts) return ds4_fail(DS4_ERR_NOMEM, "convert: out of memory");
        for (uint64_t e = 0; e < ne; e++) {
            convert_source_name(s, t, (int)e, 0, name, sizeof name);
            const st_tensor *w = st_find(a, name);
            ds4_status st = w ? make_part(a, t, w, want + 1, 2, &out->experts[e])
                              : ds4_fail(DS4_ERR_NOT_FOUND, "convert: missing tensor %s (for %s)", name, t->name);
            if (st) {
                convert_src_free(out);
                return st;
            }
        }
        return DS4_OK;
    }
    convert_source_name(s, t, 0, 0, name, sizeof name);
    const st_tensor *w = st_find(a, name);
    for (int alt = 1; !w && convert_source_name(s, t, 0, alt, name, sizeof name); alt++) w = st_find(a, name);
    if (!w) {
        convert_source_name(s, t, 0, 0, name, sizeof name);
        return ds4_fail(DS4_ERR_NOT_FOUND, "convert: missing tensor %s (for %s)", name, t->name);
    }
    if (exps && t->role != R_DOWN_EXPS) { /* fused [E, 2F, D] */
        out->kind = t->role == R_GATE_EXPS ? SRC_FUSED_GATE : SRC_FUSED_UP;
        int64_t fused[3] = {want[0], want[1] * 2, want[2]};
        ds4_status st = make_part(a, t, w, fused, 3, &out->whole);
        if (!st && w->dtype == ST_F8_E4M3)
            st = ds4_fail(DS4_ERR_UNSUPPORTED, "convert: tensor %s: FP8 fused experts are not supported", w->name);
        return st;
    }
    out->kind = SRC_WHOLE;
    ds4_status st = make_part(a, t, w, want, nd, &out->whole);
    if (!st && out->whole.scale && (nd != 2))
        st = ds4_fail(DS4_ERR_UNSUPPORTED, "convert: tensor %s: scaled weights must be 2-D", w->name);
    return st;
}

void convert_src_free(convert_src *src)
{
    free(src->experts);
    src->experts = NULL;
}

static ds4_scale_format scale_format(const st_tensor *s)
{
    return s->dtype == ST_F8_E8M0 ? DS4_SCALE_E8M0 : s->dtype == ST_BF16 ? DS4_SCALE_BF16 : DS4_SCALE_F32;
}

/* Row r of a part as n = p->cols floats. FP8 and FP4 go through the
 * checkpoint decoders of quant/fp8.h (they reject NaN codes and bad scales,
 * naming the position; we add the tensor name). */
static ds4_status decode_row(const convert_part *p, uint64_t r, float *out)
{
    const uint64_t n = p->cols;
    const uint8_t *base = p->w->data;
    ds4_status st = DS4_OK;
    switch (p->w->dtype) {
    case ST_F32:
        memcpy(out, base + r * n * 4, n * 4);
        break;
    case ST_F64:
        for (uint64_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, base + (r * n + i) * 8, 8);
            out[i] = (float)d;
        }
        break;
    case ST_F16:
    case ST_BF16: {
        const uint8_t *q = base + r * n * 2;
        bool bf = p->w->dtype == ST_BF16;
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h = (uint16_t)(q[2 * i] | q[2 * i + 1] << 8);
            out[i] = bf ? ds4_bf16_to_f32(h) : ds4_f16_to_f32(h);
        }
        break;
    }
    case ST_F8_E4M3:
        st = ds4_dequant_fp8_tiles(base, p->scale->data, scale_format(p->scale), (int64_t)p->rows,
                                   (int64_t)n, (int64_t)r, 1, out);
        break;
    default: /* packed FP4, validated in make_part */
        st = ds4_dequant_fp4_blocks(base, p->scale->data, scale_format(p->scale), (int64_t)p->rows,
                                    (int64_t)n, (int64_t)r, 1, out);
        break;
    }
    if (st) ds4_error_prefix("convert: tensor %s: ", p->w->name);
    return st;
}

static const convert_part *row_part(const convert_src *src, uint64_t slab, uint64_t r, uint64_t *srow)
{
    const uint64_t rows = plan_rows(src->t);
    switch (src->kind) {
    case SRC_WHOLE: *srow = slab * rows + r; return &src->whole;
    case SRC_FUSED_GATE: *srow = slab * 2 * rows + r; return &src->whole;
    case SRC_FUSED_UP: *srow = slab * 2 * rows + rows + r; return &src->whole;
    default: *srow = r; return &src->experts[slab];
    }
}

ds4_status convert_src_rows(const convert_src *src, uint64_t slab, uint64_t row0, uint64_t n, float *out)
{
    const uint64_t ne0 = src->t->ne[0];
    for (uint64_t i = 0; i < n; i++) {
        uint64_t srow;
        const convert_part *p = row_part(src, slab, row0 + i, &srow);
        ds4_status st = decode_row(p, srow, out + i * ne0);
        if (st) return st;
    }
    return DS4_OK;
}

bool convert_src_is_fp4_e8m0(const convert_src *src)
{
    return src->kind == SRC_PER_EXPERT && src->experts[0].fp4 && src->experts[0].scale->dtype == ST_F8_E8M0;
}

ds4_status convert_src_fp4_to_mxfp4(const convert_src *src, uint64_t slab, uint64_t row0, uint64_t n, void *dst)
{
    const convert_part *p = &src->experts[slab];
    const uint64_t cols = p->cols;
    block_mxfp4 *o = dst;
    for (uint64_t i = 0; i < n; i++) {
        const uint64_t r = row0 + i;
        if (p->scale->dtype != ST_F8_E8M0)
            return ds4_fail(DS4_ERR_INVALID, "convert: tensor %s: FP4 scales are not UE8M0", p->w->name);
        ds4_status st = ds4_fp4_row_to_mxfp4(p->w->data + r * (cols / 2), p->scale->data + r * (cols / 32),
                                            (int64_t)cols, o + i * (cols / 32));
        if (st) {
            ds4_error_prefix("convert: tensor %s: ", p->w->name);
            return st;
        }
    }
    return DS4_OK;
}

ds4_status convert_src_i32(const convert_src *src, int32_t *out, int64_t max_value)
{
    const st_tensor *w = src->whole.w;
    const uint64_t n = src->whole.rows * src->whole.cols;
    for (uint64_t i = 0; i < n; i++) {
        int64_t v;
        if (w->dtype == ST_I64) memcpy(&v, w->data + 8 * i, 8);
        else {
            int32_t v32;
            memcpy(&v32, w->data + 4 * i, 4);
            v = v32;
        }
        if (v < 0 || v >= max_value)
            return ds4_fail(DS4_ERR_FORMAT, "convert: tensor %s: value %lld at index %llu is not an expert id "
                            "in [0, %lld)", w->name, (long long)v, (unsigned long long)i, (long long)max_value);
        out[i] = (int32_t)v;
    }
    return DS4_OK;
}

static void mark(const st_tensor *t, const st_archive *a, uint8_t *used)
{
    if (!t) return;
    int64_t i = t - st_at(a, 0);
    if (i >= 0 && i < st_count(a)) used[i] = 1;
}

void convert_src_mark_used(const convert_src *src, const st_archive *a, uint8_t *used)
{
    if (src->kind == SRC_PER_EXPERT) {
        for (uint64_t e = 0; e < plan_slabs(src->t); e++) {
            mark(src->experts[e].w, a, used);
            mark(src->experts[e].scale, a, used);
        }
        return;
    }
    mark(src->whole.w, a, used);
    mark(src->whole.scale, a, used);
}

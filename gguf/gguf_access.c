/*
 * gguf_access.c - getters over the index that gguf_read.c validated.
 *
 * Lookups by name are binary searches over indices sorted at open time.
 * Values are decoded from the mapping with memcpy (the file gives no
 * alignment guarantee for metadata). Getters by key check the exact type
 * and name the key, the stored type and the wanted type on mismatch.
 */
#include "gguf/gguf_internal.h"

#include "util/error.h"

#include <string.h>

uint32_t ds4_gguf_version(const ds4_gguf *g) { return g->version; }
uint32_t ds4_gguf_alignment(const ds4_gguf *g) { return g->alignment; }
uint64_t ds4_gguf_data_offset(const ds4_gguf *g) { return g->data_offset; }
const void *ds4_gguf_base(const ds4_gguf *g) { return g->base; }
uint64_t ds4_gguf_file_size(const ds4_gguf *g) { return g->size; }
const char *ds4_gguf_path(const ds4_gguf *g) { return g->path; }
int64_t ds4_gguf_n_kv(const ds4_gguf *g) { return g->n_kv; }
int64_t ds4_gguf_n_tensors(const ds4_gguf *g) { return g->n_tensors; }

static int kv_ok(const ds4_gguf *g, int64_t kv) { return kv >= 0 && kv < g->n_kv; }

int64_t ds4_gguf_find_key(const ds4_gguf *g, const char *key)
{
    int64_t lo = 0, hi = g->n_kv;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(g->kv[g->kv_sorted[mid]].key, key);
        if (c == 0) return g->kv_sorted[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

const char *ds4_gguf_key(const ds4_gguf *g, int64_t kv) { return kv_ok(g, kv) ? g->kv[kv].key : NULL; }
uint32_t ds4_gguf_kv_type(const ds4_gguf *g, int64_t kv) { return kv_ok(g, kv) ? g->kv[kv].type : UINT32_MAX; }
uint64_t ds4_gguf_kv_offset(const ds4_gguf *g, int64_t kv) { return kv_ok(g, kv) ? g->kv[kv].offset : 0; }

static ds4_gguf_str str_at(const uint8_t *p)
{
    ds4_gguf_str s;
    memcpy(&s.len, p, 8);
    s.ptr = (const char *)p + 8;
    return s;
}

/* Decode one scalar of type `t` at p. */
static void decode(uint32_t t, const uint8_t *p, ds4_gguf_value *out)
{
    memset(out, 0, sizeof *out);
    out->type = t;
    switch (t) {
    case DS4_GGUF_U8: out->v.u = p[0]; break;
    case DS4_GGUF_I8: out->v.i = (int8_t)p[0]; break;
    case DS4_GGUF_U16: { uint16_t x; memcpy(&x, p, 2); out->v.u = x; } break;
    case DS4_GGUF_I16: { int16_t x; memcpy(&x, p, 2); out->v.i = x; } break;
    case DS4_GGUF_U32: { uint32_t x; memcpy(&x, p, 4); out->v.u = x; } break;
    case DS4_GGUF_I32: { int32_t x; memcpy(&x, p, 4); out->v.i = x; } break;
    case DS4_GGUF_U64: memcpy(&out->v.u, p, 8); break;
    case DS4_GGUF_I64: memcpy(&out->v.i, p, 8); break;
    case DS4_GGUF_F32: { float x; memcpy(&x, p, 4); out->v.f = x; } break;
    case DS4_GGUF_F64: memcpy(&out->v.f, p, 8); break;
    case DS4_GGUF_BOOL: out->v.b = p[0] != 0; break;
    case DS4_GGUF_STRING: out->v.s = str_at(p); break;
    default: break;
    }
}

ds4_status ds4_gguf_kv_value(const ds4_gguf *g, int64_t kv, ds4_gguf_value *out)
{
    if (!kv_ok(g, kv)) return ds4_fail(DS4_ERR_INVALID, "gguf: kv index %lld out of range", (long long)kv);
    const ds4_gguf_kv *k = &g->kv[kv];
    if (k->type == DS4_GGUF_ARRAY)
        return ds4_fail(DS4_ERR_INVALID, "gguf: %s: key '%s' is an array", g->path, k->key);
    decode(k->type, k->val, out);
    return DS4_OK;
}

static const ds4_gguf_kv *arr(const ds4_gguf *g, int64_t kv)
{
    return kv_ok(g, kv) && g->kv[kv].type == DS4_GGUF_ARRAY ? &g->kv[kv] : NULL;
}

uint32_t ds4_gguf_arr_type(const ds4_gguf *g, int64_t kv)
{
    const ds4_gguf_kv *k = arr(g, kv);
    return k ? k->arr_type : UINT32_MAX;
}

uint64_t ds4_gguf_arr_len(const ds4_gguf *g, int64_t kv)
{
    const ds4_gguf_kv *k = arr(g, kv);
    return k ? k->arr_len : 0;
}

const void *ds4_gguf_arr_data(const ds4_gguf *g, int64_t kv)
{
    const ds4_gguf_kv *k = arr(g, kv);
    return k && k->arr_type != DS4_GGUF_STRING ? k->val : NULL;
}

ds4_gguf_str ds4_gguf_arr_str(const ds4_gguf *g, int64_t kv, uint64_t i)
{
    const ds4_gguf_kv *k = arr(g, kv);
    if (!k || k->arr_type != DS4_GGUF_STRING || i >= k->arr_len) return (ds4_gguf_str){NULL, 0};
    return str_at(g->base + k->str_offs[i]);
}

ds4_status ds4_gguf_arr_elem(const ds4_gguf *g, int64_t kv, uint64_t i, ds4_gguf_value *out)
{
    const ds4_gguf_kv *k = arr(g, kv);
    if (!k) return ds4_fail(DS4_ERR_INVALID, "gguf: kv %lld is not an array", (long long)kv);
    if (i >= k->arr_len)
        return ds4_fail(DS4_ERR_INVALID, "gguf: %s: index %llu out of range for array '%s' of %llu",
                        g->path, (unsigned long long)i, k->key, (unsigned long long)k->arr_len);
    if (k->arr_type == DS4_GGUF_STRING) {
        memset(out, 0, sizeof *out);
        out->type = DS4_GGUF_STRING;
        out->v.s = ds4_gguf_arr_str(g, kv, i);
    } else {
        decode(k->arr_type, k->val + i * ds4_gguf_vtype_size(k->arr_type), out);
    }
    return DS4_OK;
}

static ds4_status lookup(const ds4_gguf *g, const char *key, uint32_t want, ds4_gguf_value *v)
{
    int64_t i = ds4_gguf_find_key(g, key);
    if (i < 0) return ds4_fail(DS4_ERR_NOT_FOUND, "gguf: %s: key '%s' not found", g->path, key);
    const ds4_gguf_kv *k = &g->kv[i];
    if (k->type != want)
        return ds4_fail(DS4_ERR_FORMAT, "gguf: %s: key '%s' has type %s, want %s (kv at offset %llu)",
                        g->path, key, ds4_gguf_vtype_name(k->type), ds4_gguf_vtype_name(want),
                        (unsigned long long)k->offset);
    decode(k->type, k->val, v);
    return DS4_OK;
}

#define GETTER(fn, T, VT, member)                                             \
    ds4_status fn(const ds4_gguf *g, const char *key, T *out)                 \
    {                                                                         \
        ds4_gguf_value v;                                                     \
        ds4_status st = lookup(g, key, VT, &v);                               \
        if (st == DS4_OK) *out = (T)v.v.member;                               \
        return st;                                                            \
    }
GETTER(ds4_gguf_get_u8, uint8_t, DS4_GGUF_U8, u)
GETTER(ds4_gguf_get_i8, int8_t, DS4_GGUF_I8, i)
GETTER(ds4_gguf_get_u16, uint16_t, DS4_GGUF_U16, u)
GETTER(ds4_gguf_get_i16, int16_t, DS4_GGUF_I16, i)
GETTER(ds4_gguf_get_u32, uint32_t, DS4_GGUF_U32, u)
GETTER(ds4_gguf_get_i32, int32_t, DS4_GGUF_I32, i)
GETTER(ds4_gguf_get_u64, uint64_t, DS4_GGUF_U64, u)
GETTER(ds4_gguf_get_i64, int64_t, DS4_GGUF_I64, i)
GETTER(ds4_gguf_get_f32, float, DS4_GGUF_F32, f)
GETTER(ds4_gguf_get_f64, double, DS4_GGUF_F64, f)
GETTER(ds4_gguf_get_bool, bool, DS4_GGUF_BOOL, b)
GETTER(ds4_gguf_get_str, ds4_gguf_str, DS4_GGUF_STRING, s)

ds4_status ds4_gguf_get_uint(const ds4_gguf *g, const char *key, uint64_t *out)
{
    int64_t i = ds4_gguf_find_key(g, key);
    if (i < 0) return ds4_fail(DS4_ERR_NOT_FOUND, "gguf: %s: key '%s' not found", g->path, key);
    const ds4_gguf_kv *k = &g->kv[i];
    ds4_gguf_value v;
    switch (k->type) {
    case DS4_GGUF_U8: case DS4_GGUF_U16: case DS4_GGUF_U32: case DS4_GGUF_U64:
        decode(k->type, k->val, &v);
        *out = v.v.u;
        return DS4_OK;
    case DS4_GGUF_I8: case DS4_GGUF_I16: case DS4_GGUF_I32: case DS4_GGUF_I64:
        decode(k->type, k->val, &v);
        if (v.v.i < 0)
            return ds4_fail(DS4_ERR_FORMAT, "gguf: %s: key '%s' is negative (%lld) (kv at offset %llu)",
                            g->path, key, (long long)v.v.i, (unsigned long long)k->offset);
        *out = (uint64_t)v.v.i;
        return DS4_OK;
    default:
        return ds4_fail(DS4_ERR_FORMAT, "gguf: %s: key '%s' has type %s, want an integer (kv at offset %llu)",
                        g->path, key, ds4_gguf_vtype_name(k->type), (unsigned long long)k->offset);
    }
}

ds4_status ds4_gguf_get_arr(const ds4_gguf *g, const char *key, uint32_t elem_type, int64_t *kv,
                            uint64_t *len)
{
    int64_t i = ds4_gguf_find_key(g, key);
    if (i < 0) return ds4_fail(DS4_ERR_NOT_FOUND, "gguf: %s: key '%s' not found", g->path, key);
    const ds4_gguf_kv *k = &g->kv[i];
    if (k->type != DS4_GGUF_ARRAY || k->arr_type != elem_type)
        return ds4_fail(DS4_ERR_FORMAT, "gguf: %s: key '%s' has type %s%s%s%s, want arr[%s] (kv at offset %llu)",
                        g->path, key, ds4_gguf_vtype_name(k->type),
                        k->type == DS4_GGUF_ARRAY ? "[" : "",
                        k->type == DS4_GGUF_ARRAY ? ds4_gguf_vtype_name(k->arr_type) : "",
                        k->type == DS4_GGUF_ARRAY ? "]" : "", ds4_gguf_vtype_name(elem_type),
                        (unsigned long long)k->offset);
    if (kv) *kv = i;
    if (len) *len = k->arr_len;
    return DS4_OK;
}

const ds4_gguf_tensor *ds4_gguf_tensor_at(const ds4_gguf *g, int64_t i)
{
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

int64_t ds4_gguf_find_tensor(const ds4_gguf *g, const char *name)
{
    int64_t lo = 0, hi = g->n_tensors;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(g->tensors[g->t_sorted[mid]].name, name);
        if (c == 0) return g->t_sorted[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

const ds4_gguf_tensor *ds4_gguf_get_tensor(const ds4_gguf *g, const char *name)
{
    int64_t i = ds4_gguf_find_tensor(g, name);
    if (i < 0) {
        ds4_fail(DS4_ERR_NOT_FOUND, "gguf: %s: tensor '%s' not found", g->path, name);
        return NULL;
    }
    return &g->tensors[i];
}

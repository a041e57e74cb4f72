/*
 * gguf_write.c - producing GGUF v3 files.
 *
 * Each KV is serialized into its own buffer when it is added (key string,
 * type id, value), so writing the metadata is concatenation and a KV copied
 * from a reader keeps its exact bytes. Tensors are only described (name,
 * type, shape, where the bytes come from); offsets are assigned in
 * insertion order, each tensor padded with zeros to the alignment, the
 * layout ggml writes. Output goes through a stdio stream: a temporary file
 * renamed into place by finish() (so a failed conversion never leaves a
 * plausible-looking file), or an open_memstream buffer.
 */
#include "gguf/gguf.h"

#include "util/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <utf8proc.h>

typedef unsigned long long ull;

#define FILL_CHUNK (16u << 20)

typedef struct {
    char *key;
    uint32_t type;
    uint8_t *rec; /* the whole serialized record: key, type, value */
    size_t rec_len;
    size_t val_at; /* offset of the value bytes inside rec */
} wkv;

typedef struct {
    char *name;
    uint32_t type, n_dims;
    uint64_t ne[DS4_GGUF_MAX_DIMS];
    uint64_t size, offset;
    const void *data;
    ds4_gguf_fill_fn fill;
    void *ctx;
} wtensor;

struct ds4_gguf_writer {
    wkv *kv;
    size_t n_kv, cap_kv;
    wtensor *t;
    size_t n_t, cap_t;
    /* streaming state */
    FILE *f;
    char *path, *tmp;   /* file output (tmp renamed to path on finish) */
    char *mem;          /* memstream output */
    size_t mem_len;
    uint64_t written;   /* bytes written so far */
    size_t cur;         /* tensor being appended */
    uint64_t cur_done;  /* its bytes written so far */
    uint32_t alignment;
    int failed;
};

ds4_gguf_writer *ds4_gguf_writer_new(void)
{
    ds4_gguf_writer *w = calloc(1, sizeof *w);
    if (!w) ds4_fail(DS4_ERR_NOMEM, "gguf writer: out of memory");
    return w;
}

void ds4_gguf_writer_abort(ds4_gguf_writer *w)
{
    if (!w) return;
    if (w->f) fclose(w->f);
    w->f = NULL;
    if (w->tmp) unlink(w->tmp);
    free(w->tmp);
    free(w->path);
    free(w->mem);
    w->tmp = w->path = w->mem = NULL;
    w->written = 0;
}

void ds4_gguf_writer_free(ds4_gguf_writer *w)
{
    if (!w) return;
    ds4_gguf_writer_abort(w);
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].rec);
    }
    for (size_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->kv);
    free(w->t);
    free(w);
}

static ds4_status check_name(const char *name, const char *what)
{
    if (!name || !name[0]) return ds4_fail(DS4_ERR_INVALID, "gguf writer: empty %s", what);
    size_t len = strlen(name);
    if (len > 65535) return ds4_fail(DS4_ERR_INVALID, "gguf writer: %s of %zu bytes exceeds 65535", what, len);
    for (size_t i = 0; i < len;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t n = utf8proc_iterate((const utf8proc_uint8_t *)name + i,
                                              (utf8proc_ssize_t)(len - i), &cp);
        if (n <= 0)
            return ds4_fail(DS4_ERR_INVALID, "gguf writer: %s '%s' is not valid UTF-8 at byte %zu", what,
                            name, i);
        i += (size_t)n;
    }
    return DS4_OK;
}

static int building(ds4_gguf_writer *w)
{
    if (w->f || w->failed) {
        ds4_fail(DS4_ERR_INVALID, "gguf writer: cannot add after begin()");
        return 0;
    }
    return 1;
}

/* Append a KV whose value bytes (everything after the u32 type) are `val`. */
static ds4_status add_raw(ds4_gguf_writer *w, const char *key, uint32_t type, const void *val,
                          uint64_t val_len)
{
    if (!building(w)) return DS4_ERR_INVALID;
    ds4_status st = check_name(key, "key");
    if (st) return st;
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, key) == 0)
            return ds4_fail(DS4_ERR_INVALID, "gguf writer: duplicate key '%s'", key);
    if (strcmp(key, DS4_GGUF_KEY_ALIGNMENT) == 0) {
        uint32_t a = 0;
        if (type == DS4_GGUF_U32) memcpy(&a, val, 4);
        if (type != DS4_GGUF_U32 || a == 0 || (a & (a - 1)))
            return ds4_fail(DS4_ERR_INVALID, "gguf writer: %s must be a u32 power of two",
                            DS4_GGUF_KEY_ALIGNMENT);
    }
    uint64_t klen = strlen(key);
    if (val_len > SIZE_MAX - 12 - klen)
        return ds4_fail(DS4_ERR_INVALID, "gguf writer: value of key '%s' too large", key);
    size_t n = (size_t)(8 + klen + 4 + val_len);
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? w->cap_kv * 2 : 16;
        wkv *nk = realloc(w->kv, cap * sizeof *nk);
        if (!nk) return ds4_fail(DS4_ERR_NOMEM, "gguf writer: out of memory");
        w->kv = nk;
        w->cap_kv = cap;
    }
    uint8_t *rec = malloc(n);
    char *k = strdup(key);
    if (!rec || !k) {
        free(rec);
        free(k);
        return ds4_fail(DS4_ERR_NOMEM, "gguf writer: out of memory for key '%s' (%zu bytes)", key, n);
    }
    memcpy(rec, &klen, 8);
    memcpy(rec + 8, key, klen);
    memcpy(rec + 8 + klen, &type, 4);
    if (val_len) memcpy(rec + 12 + klen, val, val_len);
    w->kv[w->n_kv++] = (wkv){k, type, rec, n, (size_t)(12 + klen)};
    return DS4_OK;
}

#define ADDER(fn, T, VT)                                                      \
    ds4_status fn(ds4_gguf_writer *w, const char *key, T v)                   \
    {                                                                         \
        return add_raw(w, key, VT, &v, sizeof v);                             \
    }
ADDER(ds4_gguf_writer_add_u8, uint8_t, DS4_GGUF_U8)
ADDER(ds4_gguf_writer_add_i8, int8_t, DS4_GGUF_I8)
ADDER(ds4_gguf_writer_add_u16, uint16_t, DS4_GGUF_U16)
ADDER(ds4_gguf_writer_add_i16, int16_t, DS4_GGUF_I16)
ADDER(ds4_gguf_writer_add_u32, uint32_t, DS4_GGUF_U32)
ADDER(ds4_gguf_writer_add_i32, int32_t, DS4_GGUF_I32)
ADDER(ds4_gguf_writer_add_u64, uint64_t, DS4_GGUF_U64)
ADDER(ds4_gguf_writer_add_i64, int64_t, DS4_GGUF_I64)
ADDER(ds4_gguf_writer_add_f32, float, DS4_GGUF_F32)
ADDER(ds4_gguf_writer_add_f64, double, DS4_GGUF_F64)

ds4_status ds4_gguf_writer_add_bool(ds4_gguf_writer *w, const char *key, bool v)
{
    uint8_t b = v ? 1 : 0;
    return add_raw(w, key, DS4_GGUF_BOOL, &b, 1);
}

ds4_status ds4_gguf_writer_add_strn(ds4_gguf_writer *w, const char *key, const char *s, uint64_t len)
{
    if (len > SIZE_MAX - 64) return ds4_fail(DS4_ERR_INVALID, "gguf writer: string of key '%s' too large", key);
    uint8_t *buf = malloc((size_t)(8 + len));
    if (!buf) return ds4_fail(DS4_ERR_NOMEM, "gguf writer: out of memory for key '%s'", key);
    memcpy(buf, &len, 8);
    if (len) memcpy(buf + 8, s, (size_t)len);
    ds4_status st = add_raw(w, key, DS4_GGUF_STRING, buf, 8 + len);
    free(buf);
    return st;
}

ds4_status ds4_gguf_writer_add_str(ds4_gguf_writer *w, const char *key, const char *s)
{
    return ds4_gguf_writer_add_strn(w, key, s, strlen(s));
}

ds4_status ds4_gguf_writer_add_arr(ds4_gguf_writer *w, const char *key, uint32_t elem_type,
                                   const void *data, uint64_t n)
{
    size_t esz = ds4_gguf_vtype_size(elem_type);
    if (esz == 0)
        return ds4_fail(DS4_ERR_INVALID, "gguf writer: key '%s': element type %u is not numeric/bool", key,
                        elem_type);
    if (n > (SIZE_MAX - 64) / esz) return ds4_fail(DS4_ERR_INVALID, "gguf writer: array '%s' too large", key);
    if (elem_type == DS4_GGUF_BOOL)
        for (uint64_t i = 0; i < n; i++)
            if (((const uint8_t *)data)[i] > 1)
                return ds4_fail(DS4_ERR_INVALID, "gguf writer: bool array '%s' element %llu is not 0/1", key,
                                (ull)i);
    size_t len = (size_t)(12 + n * esz);
    uint8_t *buf = malloc(len);
    if (!buf) return ds4_fail(DS4_ERR_NOMEM, "gguf writer: out of memory for array '%s'", key);
    memcpy(buf, &elem_type, 4);
    memcpy(buf + 4, &n, 8);
    if (n) memcpy(buf + 12, data, (size_t)(n * esz));
    ds4_status st = add_raw(w, key, DS4_GGUF_ARRAY, buf, len);
    free(buf);
    return st;
}

ds4_status ds4_gguf_writer_add_arr_str(ds4_gguf_writer *w, const char *key, const char *const *strs,
                                       const uint64_t *lens, uint64_t n)
{
    uint64_t total = 12;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t l = lens ? lens[i] : strlen(strs[i]);
        if (l > SIZE_MAX / 2 - total - 8)
            return ds4_fail(DS4_ERR_INVALID, "gguf writer: string array '%s' too large", key);
        total += 8 + l;
    }
    uint8_t *buf = malloc((size_t)total);
    if (!buf) return ds4_fail(DS4_ERR_NOMEM, "gguf writer: out of memory for array '%s'", key);
    uint32_t et = DS4_GGUF_STRING;
    memcpy(buf, &et, 4);
    memcpy(buf + 4, &n, 8);
    size_t p = 12;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t l = lens ? lens[i] : strlen(strs[i]);
        memcpy(buf + p, &l, 8);
        if (l) memcpy(buf + p + 8, strs[i], (size_t)l);
        p += 8 + (size_t)l;
    }
    ds4_status st = add_raw(w, key, DS4_GGUF_ARRAY, buf, total);
    free(buf);
    return st;
}

ds4_status ds4_gguf_writer_copy_kv(ds4_gguf_writer *w, const ds4_gguf *g, int64_t kv)
{
    uint32_t type = ds4_gguf_kv_type(g, kv);
    const char *key = ds4_gguf_key(g, kv);
    if (!key) return ds4_fail(DS4_ERR_INVALID, "gguf writer: kv index %lld out of range", (long long)kv);
    if (type != DS4_GGUF_ARRAY) {
        ds4_gguf_value v;
        ds4_gguf_kv_value(g, kv, &v);
        if (type == DS4_GGUF_STRING) return ds4_gguf_writer_add_strn(w, key, v.v.s.ptr, v.v.s.len);
        /* Scalars: the file bytes, found past the key and type id. */
        const uint8_t *p = (const uint8_t *)ds4_gguf_base(g) + ds4_gguf_kv_offset(g, kv) + 8 + strlen(key) + 4;
        return add_raw(w, key, type, p, ds4_gguf_vtype_size(type));
    }
    uint32_t et = ds4_gguf_arr_type(g, kv);
    uint64_t n = ds4_gguf_arr_len(g, kv);
    if (et != DS4_GGUF_STRING) return ds4_gguf_writer_add_arr(w, key, et, ds4_gguf_arr_data(g, kv), n);
    /* String array: the elements are contiguous in the file, from the first
     * length prefix to the end of the last string. */
    const uint8_t *first = (const uint8_t *)ds4_gguf_base(g) + ds4_gguf_kv_offset(g, kv) + 8 + strlen(key) + 4 + 12;
    const uint8_t *end = first;
    if (n) {
        ds4_gguf_str last = ds4_gguf_arr_str(g, kv, n - 1);
        end = (const uint8_t *)last.ptr + last.len;
    }
    uint64_t len = (uint64_t)(end - first);
    uint8_t *buf = malloc((size_t)(12 + len));
    if (!buf) return ds4_fail(DS4_ERR_NOMEM, "gguf writer: out of memory for array '%s'", key);
    memcpy(buf, &et, 4);
    memcpy(buf + 4, &n, 8);
    memcpy(buf + 12, first, (size_t)len);
    ds4_status st = add_raw(w, key, DS4_GGUF_ARRAY, buf, 12 + len);
    free(buf);
    return st;
}

static ds4_status add_tensor(ds4_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                             const uint64_t *ne, const void *data, ds4_gguf_fill_fn fill, void *ctx)
{
    if (!building(w)) return DS4_ERR_INVALID;
    ds4_status st = check_name(name, "tensor name");
    if (st) return st;
    if (strlen(name) > DS4_GGUF_MAX_TENSOR_NAME)
        return ds4_fail(DS4_ERR_INVALID, "gguf writer: tensor name '%s' is %zu bytes, ggml allows %d",
                        name, strlen(name), DS4_GGUF_MAX_TENSOR_NAME);
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return ds4_fail(DS4_ERR_INVALID, "gguf writer: duplicate tensor name '%s'", name);
    wtensor t = {0};
    if (n_dims < 1 || n_dims > DS4_GGUF_MAX_DIMS)
        return ds4_fail(DS4_ERR_INVALID, "gguf writer: tensor '%s': n_dims %u not in 1..4", name, n_dims);
    if ((st = ds4_gguf_tensor_nbytes(type, n_dims, ne, &t.size))) {
        ds4_error_prefix("gguf writer: tensor '%s': ", name);
        return DS4_ERR_INVALID;
    }
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? w->cap_t * 2 : 64;
        wtensor *nt = realloc(w->t, cap * sizeof *nt);
        if (!nt) return ds4_fail(DS4_ERR_NOMEM, "gguf writer: out of memory");
        w->t = nt;
        w->cap_t = cap;
    }
    if (!(t.name = strdup(name))) return ds4_fail(DS4_ERR_NOMEM, "gguf writer: out of memory");
    t.type = type;
    t.n_dims = n_dims;
    for (int d = 0; d < DS4_GGUF_MAX_DIMS; d++) t.ne[d] = (uint32_t)d < n_dims ? ne[d] : 1;
    t.data = data;
    t.fill = fill;
    t.ctx = ctx;
    w->t[w->n_t++] = t;
    return DS4_OK;
}

ds4_status ds4_gguf_writer_add_tensor(ds4_gguf_writer *w, const char *name, uint32_t type,
                                      uint32_t n_dims, const uint64_t *ne, const void *data)
{
    return add_tensor(w, name, type, n_dims, ne, data, NULL, NULL);
}

ds4_status ds4_gguf_writer_add_tensor_fill(ds4_gguf_writer *w, const char *name, uint32_t type,
                                           uint32_t n_dims, const uint64_t *ne, ds4_gguf_fill_fn fill,
                                           void *ctx)
{
    return add_tensor(w, name, type, n_dims, ne, NULL, fill, ctx);
}

/* ---- layout ---- */

static uint32_t alignment_of(const ds4_gguf_writer *w)
{
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, DS4_GGUF_KEY_ALIGNMENT) == 0) {
            uint32_t a;
            memcpy(&a, w->kv[i].rec + w->kv[i].val_at, 4);
            return a;
        }
    return DS4_GGUF_DEFAULT_ALIGNMENT;
}

static uint64_t pad_to(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

uint64_t ds4_gguf_writer_data_offset(const ds4_gguf_writer *w)
{
    uint64_t n = 24;
    for (size_t i = 0; i < w->n_kv; i++) n += w->kv[i].rec_len;
    for (size_t i = 0; i < w->n_t; i++) n += 8 + strlen(w->t[i].name) + 4 + 8ull * w->t[i].n_dims + 4 + 8;
    return pad_to(n, alignment_of(w));
}

uint64_t ds4_gguf_writer_file_size(const ds4_gguf_writer *w)
{
    uint64_t n = ds4_gguf_writer_data_offset(w), a = alignment_of(w);
    for (size_t i = 0; i < w->n_t; i++) n += pad_to(w->t[i].size, a);
    return n;
}

/* ---- output ---- */

static ds4_status put(ds4_gguf_writer *w, const void *p, size_t n)
{
    if (n && fwrite(p, 1, n, w->f) != n) {
        w->failed = 1;
        return ds4_fail(DS4_ERR_IO, "gguf writer: %s: write of %zu bytes at offset %llu failed",
                        w->path ? w->path : "<memory>", n, (ull)w->written);
    }
    w->written += n;
    return DS4_OK;
}

static ds4_status put_zeros(ds4_gguf_writer *w, uint64_t n)
{
    static const uint8_t zeros[256];
    while (n) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        ds4_status st = put(w, zeros, k);
        if (st) return st;
        n -= k;
    }
    return DS4_OK;
}

static ds4_status write_head(ds4_gguf_writer *w)
{
    w->alignment = alignment_of(w);
    uint32_t version = DS4_GGUF_VERSION;
    uint64_t nt = w->n_t, nkv = w->n_kv;
    ds4_status st;
    if ((st = put(w, DS4_GGUF_MAGIC, 4)) || (st = put(w, &version, 4)) || (st = put(w, &nt, 8)) ||
        (st = put(w, &nkv, 8)))
        return st;
    for (size_t i = 0; i < w->n_kv; i++)
        if ((st = put(w, w->kv[i].rec, w->kv[i].rec_len))) return st;
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        wtensor *t = &w->t[i];
        t->offset = off;
        off += pad_to(t->size, w->alignment);
        uint64_t len = strlen(t->name);
        if ((st = put(w, &len, 8)) || (st = put(w, t->name, len)) || (st = put(w, &t->n_dims, 4)) ||
            (st = put(w, t->ne, 8ull * t->n_dims)) || (st = put(w, &t->type, 4)) ||
            (st = put(w, &t->offset, 8)))
            return st;
    }
    st = put_zeros(w, pad_to(w->written, w->alignment) - w->written);
    w->cur = 0;
    w->cur_done = 0;
    return st;
}

static ds4_status begin_stream(ds4_gguf_writer *w)
{
    ds4_status st = write_head(w);
    if (st) ds4_gguf_writer_abort(w);
    return st;
}

ds4_status ds4_gguf_writer_begin(ds4_gguf_writer *w, const char *path)
{
    if (!building(w)) return DS4_ERR_INVALID;
    size_t n = strlen(path);
    w->path = strdup(path);
    w->tmp = malloc(n + 5);
    if (!w->path || !w->tmp) {
        ds4_gguf_writer_abort(w);
        return ds4_fail(DS4_ERR_NOMEM, "gguf writer: out of memory");
    }
    memcpy(w->tmp, path, n);
    memcpy(w->tmp + n, ".tmp", 5);
    w->f = fopen(w->tmp, "wb");
    if (!w->f) {
        ds4_status st = ds4_fail(DS4_ERR_IO, "gguf writer: cannot create %s", w->tmp);
        free(w->tmp);
        w->tmp = NULL;
        ds4_gguf_writer_abort(w);
        return st;
    }
    return begin_stream(w);
}

ds4_status ds4_gguf_writer_append(ds4_gguf_writer *w, const void *data, size_t len)
{
    if (!w->f) return ds4_fail(DS4_ERR_INVALID, "gguf writer: append() without begin()");
    const uint8_t *p = data;
    while (len) {
        if (w->cur >= w->n_t)
            return ds4_fail(DS4_ERR_INVALID, "gguf writer: %zu bytes appended past the last tensor", len);
        wtensor *t = &w->t[w->cur];
        uint64_t want = t->size - w->cur_done;
        size_t k = len < want ? len : (size_t)want;
        ds4_status st = put(w, p, k);
        if (st) return st;
        p += k;
        len -= k;
        w->cur_done += k;
        if (w->cur_done == t->size) {
            if ((st = put_zeros(w, pad_to(t->size, w->alignment) - t->size))) return st;
            w->cur++;
            w->cur_done = 0;
        }
    }
    return DS4_OK;
}

static ds4_status check_complete(ds4_gguf_writer *w)
{
    if (w->cur < w->n_t)
        return ds4_fail(DS4_ERR_INVALID, "gguf writer: tensor '%s' got %llu of %llu bytes",
                        w->t[w->cur].name, (ull)w->cur_done, (ull)w->t[w->cur].size);
    return DS4_OK;
}

ds4_status ds4_gguf_writer_finish(ds4_gguf_writer *w)
{
    if (!w->f || !w->tmp) return ds4_fail(DS4_ERR_INVALID, "gguf writer: finish() without begin()");
    ds4_status st = check_complete(w);
    if (!st && (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0))
        st = ds4_fail(DS4_ERR_IO, "gguf writer: %s: flush failed", w->tmp);
    if (!st) {
        int rc = fclose(w->f);
        w->f = NULL;
        if (rc != 0) st = ds4_fail(DS4_ERR_IO, "gguf writer: %s: close failed", w->tmp);
        else if (rename(w->tmp, w->path) != 0)
            st = ds4_fail(DS4_ERR_IO, "gguf writer: cannot rename %s to %s", w->tmp, w->path);
    }
    if (st) {
        ds4_gguf_writer_abort(w);
        return st;
    }
    free(w->tmp);
    free(w->path);
    w->tmp = w->path = NULL;
    return DS4_OK;
}

/* Emit every tensor's bytes from its pointer or fill callback. */
static ds4_status emit_tensors(ds4_gguf_writer *w)
{
    uint8_t *chunk = NULL;
    ds4_status st = DS4_OK;
    for (size_t i = 0; i < w->n_t && !st; i++) {
        wtensor *t = &w->t[i];
        if (t->data) {
            st = ds4_gguf_writer_append(w, t->data, (size_t)t->size);
        } else if (t->fill) {
            if (!chunk && !(chunk = malloc(FILL_CHUNK))) {
                st = ds4_fail(DS4_ERR_NOMEM, "gguf writer: out of memory for the fill buffer");
                break;
            }
            for (uint64_t off = 0; off < t->size && !st;) {
                size_t k = t->size - off < FILL_CHUNK ? (size_t)(t->size - off) : FILL_CHUNK;
                st = t->fill(t->ctx, off, chunk, k);
                if (st) ds4_error_prefix("gguf writer: tensor '%s' at byte %llu: ", t->name, (ull)off);
                else st = ds4_gguf_writer_append(w, chunk, k);
                off += k;
            }
        } else {
            st = ds4_fail(DS4_ERR_INVALID, "gguf writer: tensor '%s' has neither data nor a fill callback",
                          t->name);
        }
    }
    free(chunk);
    return st;
}

ds4_status ds4_gguf_writer_write(ds4_gguf_writer *w, const char *path)
{
    ds4_status st = ds4_gguf_writer_begin(w, path);
    if (st) return st;
    if ((st = emit_tensors(w))) {
        ds4_gguf_writer_abort(w);
        return st;
    }
    return ds4_gguf_writer_finish(w);
}

ds4_status ds4_gguf_writer_write_memory(ds4_gguf_writer *w, void **out, size_t *len)
{
    if (!building(w)) return DS4_ERR_INVALID;
    w->f = open_memstream(&w->mem, &w->mem_len);
    if (!w->f) return ds4_fail(DS4_ERR_NOMEM, "gguf writer: open_memstream failed");
    ds4_status st = begin_stream(w);
    if (!st) st = emit_tensors(w);
    if (!st) st = check_complete(w);
    if (st) {
        ds4_gguf_writer_abort(w);
        return st;
    }
    if (fclose(w->f) != 0) {
        w->f = NULL;
        ds4_gguf_writer_abort(w);
        return ds4_fail(DS4_ERR_NOMEM, "gguf writer: memory stream failed");
    }
    w->f = NULL;
    *out = w->mem;
    *len = w->mem_len;
    w->mem = NULL;
    w->written = 0;
    return DS4_OK;
}

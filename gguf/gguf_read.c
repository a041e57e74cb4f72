/*
 * gguf_read.c - opening a GGUF file: map it, parse it, validate all of it.
 *
 * The file is untrusted. Every read goes through a cursor that checks the
 * bytes left first, every count is bounded by the bytes left (times the
 * smallest encoding of one item) before anything is allocated, and the
 * whole structure (keys, values, tensor directory, data ranges) is checked
 * once here so that the getters in gguf_access.c never have to fail on
 * content. Every error message names the cause and the byte offset; the
 * file name is prefixed by the caller-facing open functions.
 */
#include "gguf/gguf_internal.h"

#include "util/error.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utf8proc.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader assumes a little-endian host"
#endif

#define MAX_NAME_LEN 65535u /* GGUF spec: keys are at most 65535 bytes */
/* Smallest encodings, to bound counts by the bytes left. */
#define MIN_KV_BYTES 14u     /* u64 len + 1 key byte + u32 type + 1 value byte */
#define MIN_TINFO_BYTES 33u  /* u64 len + 1 + u32 n_dims + u64 ne + u32 + u64 */

typedef unsigned long long ull;

typedef struct {
    const uint8_t *b;
    uint64_t size;
    uint64_t pos;
} cursor;

static uint64_t left(const cursor *c) { return c->size - c->pos; }

static ds4_status need(const cursor *c, uint64_t n, const char *what)
{
    if (n > left(c))
        return ds4_fail(DS4_ERR_FORMAT,
                        "truncated: %s needs %llu bytes at offset %llu, file has %llu",
                        what, (ull)n, (ull)c->pos, (ull)c->size);
    return DS4_OK;
}

static ds4_status rd(cursor *c, void *out, uint64_t n, const char *what)
{
    ds4_status st = need(c, n, what);
    if (st) return st;
    memcpy(out, c->b + c->pos, n);
    c->pos += n;
    return DS4_OK;
}

static ds4_status rd_u32(cursor *c, uint32_t *v, const char *what) { return rd(c, v, 4, what); }
static ds4_status rd_u64(cursor *c, uint64_t *v, const char *what) { return rd(c, v, 8, what); }

/* A key or tensor name: non-empty, <= 65535 bytes, UTF-8, no NUL.
 * Returns a malloc'd NUL-terminated copy. */
static ds4_status rd_name(cursor *c, const char *what, char **out)
{
    uint64_t at = c->pos, len;
    ds4_status st = rd_u64(c, &len, what);
    if (st) return st;
    if (len == 0) return ds4_fail(DS4_ERR_FORMAT, "empty %s at offset %llu", what, (ull)at);
    if (len > MAX_NAME_LEN)
        return ds4_fail(DS4_ERR_FORMAT, "%s length %llu exceeds %u at offset %llu", what,
                        (ull)len, MAX_NAME_LEN, (ull)at);
    if ((st = need(c, len, what))) return st;
    const uint8_t *s = c->b + c->pos;
    for (uint64_t i = 0; i < len;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t n = utf8proc_iterate(s + i, (utf8proc_ssize_t)(len - i), &cp);
        if (n <= 0)
            return ds4_fail(DS4_ERR_FORMAT, "%s is not valid UTF-8 (byte 0x%02x at offset %llu)",
                            what, s[i], (ull)(c->pos + i));
        if (cp == 0)
            return ds4_fail(DS4_ERR_FORMAT, "%s contains a NUL byte at offset %llu", what,
                            (ull)(c->pos + i));
        i += (uint64_t)n;
    }
    char *copy = malloc(len + 1);
    if (!copy) return ds4_fail(DS4_ERR_NOMEM, "out of memory for a %llu-byte %s", (ull)len, what);
    memcpy(copy, s, len);
    copy[len] = '\0';
    c->pos += len;
    *out = copy;
    return DS4_OK;
}

/* A string value: u64 length + bytes, any content. */
static ds4_status skip_string(cursor *c, const char *key)
{
    uint64_t at = c->pos, len;
    if (need(c, 8, "string length"))
        return ds4_fail(DS4_ERR_FORMAT,
                        "truncated: string length of key '%s' needs 8 bytes at offset %llu, file has %llu",
                        key, (ull)at, (ull)c->size);
    memcpy(&len, c->b + c->pos, 8);
    c->pos += 8;
    if (len > left(c))
        return ds4_fail(DS4_ERR_FORMAT,
                        "truncated: string of key '%s' has length %llu at offset %llu but only %llu bytes follow",
                        key, (ull)len, (ull)at, (ull)left(c));
    c->pos += len;
    return DS4_OK;
}

static ds4_status check_bools(const cursor *c, const uint8_t *p, uint64_t n, const char *key)
{
    for (uint64_t i = 0; i < n; i++)
        if (p[i] > 1)
            return ds4_fail(DS4_ERR_FORMAT, "bool value %u of key '%s' is not 0 or 1 at offset %llu",
                            p[i], key, (ull)(p + i - c->b));
    return DS4_OK;
}

static ds4_status parse_value(cursor *c, ds4_gguf_kv *kv)
{
    const char *key = kv->key;
    uint64_t at = c->pos;
    ds4_status st = rd_u32(c, &kv->type, "value type");
    if (st) return st;
    if (kv->type >= DS4_GGUF_VTYPE_COUNT)
        return ds4_fail(DS4_ERR_FORMAT, "bad value type id %u for key '%s' at offset %llu",
                        kv->type, key, (ull)at);
    kv->val = c->b + c->pos;
    if (kv->type == DS4_GGUF_STRING) return skip_string(c, key);
    if (kv->type != DS4_GGUF_ARRAY) {
        size_t sz = ds4_gguf_vtype_size(kv->type);
        if (sz > left(c))
            return ds4_fail(DS4_ERR_FORMAT,
                            "truncated: %s value of key '%s' needs %zu bytes at offset %llu, file has %llu",
                            ds4_gguf_vtype_name(kv->type), key, sz, (ull)c->pos, (ull)c->size);
        if (kv->type == DS4_GGUF_BOOL && (st = check_bools(c, kv->val, 1, key))) return st;
        c->pos += sz;
        return DS4_OK;
    }
    at = c->pos;
    if ((st = rd_u32(c, &kv->arr_type, "array element type"))) return st;
    if (kv->arr_type == DS4_GGUF_ARRAY)
        return ds4_fail(DS4_ERR_UNSUPPORTED, "nested array in key '%s' at offset %llu", key, (ull)at);
    if (kv->arr_type >= DS4_GGUF_VTYPE_COUNT)
        return ds4_fail(DS4_ERR_FORMAT, "bad array element type id %u for key '%s' at offset %llu",
                        kv->arr_type, key, (ull)at);
    at = c->pos;
    if ((st = rd_u64(c, &kv->arr_len, "array length"))) return st;
    kv->val = c->b + c->pos;
    size_t esz = kv->arr_type == DS4_GGUF_STRING ? 8 : ds4_gguf_vtype_size(kv->arr_type);
    if (kv->arr_len > left(c) / esz)
        return ds4_fail(DS4_ERR_FORMAT,
                        "truncated: array of key '%s' has %llu %s elements (length at offset %llu) "
                        "but only %llu bytes follow",
                        key, (ull)kv->arr_len, ds4_gguf_vtype_name(kv->arr_type), (ull)at, (ull)left(c));
    if (kv->arr_type != DS4_GGUF_STRING) {
        if (kv->arr_type == DS4_GGUF_BOOL && (st = check_bools(c, kv->val, kv->arr_len, key)))
            return st;
        c->pos += kv->arr_len * esz;
        return DS4_OK;
    }
    /* Bounded above: arr_len <= bytes left / 8. */
    kv->str_offs = malloc((kv->arr_len ? kv->arr_len : 1) * sizeof *kv->str_offs);
    if (!kv->str_offs)
        return ds4_fail(DS4_ERR_NOMEM, "out of memory for %llu strings of key '%s'",
                        (ull)kv->arr_len, key);
    for (uint64_t i = 0; i < kv->arr_len; i++) {
        kv->str_offs[i] = c->pos;
        if ((st = skip_string(c, key))) {
            ds4_error_prefix("element %llu: ", (ull)i);
            return st;
        }
    }
    return DS4_OK;
}

static int cmp_kv_g_qsort_key(const void *a, const void *b, void *ctx)
{
    const ds4_gguf *g = ctx;
    return strcmp(g->kv[*(const int64_t *)a].key, g->kv[*(const int64_t *)b].key);
}

static int cmp_t_name(const void *a, const void *b, void *ctx)
{
    const ds4_gguf *g = ctx;
    return strcmp(g->tensors[*(const int64_t *)a].name, g->tensors[*(const int64_t *)b].name);
}

static int cmp_t_offset(const void *a, const void *b, void *ctx)
{
    const ds4_gguf *g = ctx;
    uint64_t x = g->tensors[*(const int64_t *)a].offset, y = g->tensors[*(const int64_t *)b].offset;
    return x < y ? -1 : x > y;
}

static int64_t *sorted_index(ds4_gguf *g, int64_t n,
                             int (*cmp)(const void *, const void *, void *))
{
    int64_t *ix = malloc((n ? (size_t)n : 1) * sizeof *ix);
    if (!ix) return NULL;
    for (int64_t i = 0; i < n; i++) ix[i] = i;
    qsort_r(ix, (size_t)n, sizeof *ix, cmp, g);
    return ix;
}

static ds4_status parse_kvs(cursor *c, ds4_gguf *g)
{
    for (int64_t i = 0; i < g->n_kv; i++) {
        ds4_gguf_kv *kv = &g->kv[i];
        kv->offset = c->pos;
        char *key = NULL;
        ds4_status st = rd_name(c, "key", &key);
        if (st) {
            ds4_error_prefix("kv %lld: ", (long long)i);
            return st;
        }
        kv->key = key;
        if ((st = parse_value(c, kv))) return st;
    }
    g->kv_sorted = sorted_index(g, g->n_kv, cmp_kv_g_qsort_key);
    if (!g->kv_sorted) return ds4_fail(DS4_ERR_NOMEM, "out of memory for the key index");
    for (int64_t i = 1; i < g->n_kv; i++) {
        const ds4_gguf_kv *a = &g->kv[g->kv_sorted[i - 1]], *b = &g->kv[g->kv_sorted[i]];
        if (strcmp(a->key, b->key) == 0) {
            const ds4_gguf_kv *first = a->offset < b->offset ? a : b;
            const ds4_gguf_kv *dup = a->offset < b->offset ? b : a;
            return ds4_fail(DS4_ERR_FORMAT, "duplicate key '%s' at offset %llu (first at offset %llu)",
                            dup->key, (ull)dup->offset, (ull)first->offset);
        }
    }
    return DS4_OK;
}

static ds4_status parse_alignment(ds4_gguf *g)
{
    g->alignment = DS4_GGUF_DEFAULT_ALIGNMENT;
    int64_t i = ds4_gguf_find_key(g, DS4_GGUF_KEY_ALIGNMENT);
    if (i < 0) return DS4_OK;
    const ds4_gguf_kv *kv = &g->kv[i];
    if (kv->type != DS4_GGUF_U32)
        return ds4_fail(DS4_ERR_FORMAT, "key '%s' has type %s, want u32 (kv at offset %llu)",
                        kv->key, ds4_gguf_vtype_name(kv->type), (ull)kv->offset);
    uint32_t a;
    memcpy(&a, kv->val, 4);
    if (a == 0 || (a & (a - 1)) != 0)
        return ds4_fail(DS4_ERR_FORMAT, "alignment %u is not a power of two (kv at offset %llu)", a,
                        (ull)kv->offset);
    g->alignment = a;
    return DS4_OK;
}

static ds4_status parse_tensor_info(cursor *c, ds4_gguf_tensor *t)
{
    t->info_offset = c->pos;
    char *name = NULL;
    ds4_status st = rd_name(c, "tensor name", &name);
    if (st) return st;
    t->name = name;
    uint64_t at = c->pos;
    if ((st = rd_u32(c, &t->n_dims, "tensor n_dims"))) return st;
    if (t->n_dims == 0 || t->n_dims > DS4_GGUF_MAX_DIMS)
        return ds4_fail(DS4_ERR_FORMAT, "tensor '%s': n_dims %u not in 1..%d at offset %llu", name,
                        t->n_dims, DS4_GGUF_MAX_DIMS, (ull)at);
    for (int d = 0; d < DS4_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    at = c->pos;
    for (uint32_t d = 0; d < t->n_dims; d++)
        if ((st = rd_u64(c, &t->ne[d], "tensor shape"))) return st;
    uint64_t type_at = c->pos;
    if ((st = rd_u32(c, &t->type, "tensor type"))) return st;
    if (!ds4_gguf_type_info_of(t->type))
        return ds4_fail(DS4_ERR_FORMAT, "tensor '%s': bad ggml type id %u at offset %llu", name,
                        t->type, (ull)type_at);
    if ((st = ds4_gguf_tensor_nbytes(t->type, t->n_dims, t->ne, &t->size))) {
        ds4_error_prefix("tensor '%s': shape at offset %llu: ", name, (ull)at);
        return st;
    }
    return rd_u64(c, &t->offset, "tensor offset");
}

static ds4_status parse_tensors(cursor *c, ds4_gguf *g)
{
    ds4_status st;
    for (int64_t i = 0; i < g->n_tensors; i++)
        if ((st = parse_tensor_info(c, &g->tensors[i]))) return st;

    g->t_sorted = sorted_index(g, g->n_tensors, cmp_t_name);
    if (!g->t_sorted) return ds4_fail(DS4_ERR_NOMEM, "out of memory for the tensor index");
    for (int64_t i = 1; i < g->n_tensors; i++) {
        const ds4_gguf_tensor *a = &g->tensors[g->t_sorted[i - 1]], *b = &g->tensors[g->t_sorted[i]];
        if (strcmp(a->name, b->name) == 0) {
            const ds4_gguf_tensor *first = a->info_offset < b->info_offset ? a : b;
            const ds4_gguf_tensor *dup = a->info_offset < b->info_offset ? b : a;
            return ds4_fail(DS4_ERR_FORMAT,
                            "duplicate tensor name '%s' at offset %llu (first at offset %llu)",
                            dup->name, (ull)dup->info_offset, (ull)first->info_offset);
        }
    }

    uint64_t a = g->alignment;
    uint64_t pad = (a - c->pos % a) % a;
    g->data_offset = c->pos + pad;
    if (g->data_offset > g->size) {
        if (g->n_tensors > 0)
            return ds4_fail(DS4_ERR_FORMAT,
                            "truncated: data section would start at offset %llu, file has %llu",
                            (ull)g->data_offset, (ull)g->size);
        g->data_offset = g->size; /* metadata-only file without trailing padding */
    }
    uint64_t data_size = g->size - g->data_offset;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        ds4_gguf_tensor *t = &g->tensors[i];
        if (t->offset % a != 0)
            return ds4_fail(DS4_ERR_FORMAT,
                            "misaligned: tensor '%s' offset %llu is not a multiple of the alignment %u "
                            "(info at offset %llu)",
                            t->name, (ull)t->offset, g->alignment, (ull)t->info_offset);
        if (t->offset > data_size || t->size > data_size - t->offset)
            return ds4_fail(DS4_ERR_FORMAT,
                            "out of range: tensor '%s' needs bytes [%llu, +%llu) of the data section at "
                            "offset %llu, which has %llu bytes (info at offset %llu)",
                            t->name, (ull)t->offset, (ull)t->size, (ull)g->data_offset, (ull)data_size,
                            (ull)t->info_offset);
        t->data = g->base + g->data_offset + t->offset;
    }
    int64_t *by_off = sorted_index(g, g->n_tensors, cmp_t_offset);
    if (!by_off) return ds4_fail(DS4_ERR_NOMEM, "out of memory for the tensor offsets");
    st = DS4_OK;
    for (int64_t i = 1; i < g->n_tensors && !st; i++) {
        const ds4_gguf_tensor *p = &g->tensors[by_off[i - 1]], *q = &g->tensors[by_off[i]];
        if (p->offset + p->size > q->offset)
            st = ds4_fail(DS4_ERR_FORMAT,
                          "overlap: tensor '%s' [%llu, %llu) and tensor '%s' [%llu, %llu) share bytes "
                          "of the data section at offset %llu",
                          p->name, (ull)p->offset, (ull)(p->offset + p->size), q->name, (ull)q->offset,
                          (ull)(q->offset + q->size), (ull)g->data_offset);
    }
    free(by_off);
    return st;
}

static ds4_status parse(ds4_gguf *g)
{
    cursor c = {g->base, g->size, 0};
    char magic[4];
    ds4_status st = rd(&c, magic, 4, "magic");
    if (st) return st;
    if (memcmp(magic, DS4_GGUF_MAGIC, 4) != 0)
        return ds4_fail(DS4_ERR_FORMAT,
                        "bad magic %02x %02x %02x %02x at offset 0 (not a GGUF file)",
                        (uint8_t)magic[0], (uint8_t)magic[1], (uint8_t)magic[2], (uint8_t)magic[3]);
    if ((st = rd_u32(&c, &g->version, "version"))) return st;
    if (g->version != DS4_GGUF_VERSION)
        return ds4_fail(DS4_ERR_UNSUPPORTED,
                        "GGUF version %u at offset 4 not supported (want 3, little-endian)",
                        g->version);
    uint64_t nt, nkv;
    if ((st = rd_u64(&c, &nt, "tensor count"))) return st;
    if ((st = rd_u64(&c, &nkv, "kv count"))) return st;
    if (nkv > left(&c) / MIN_KV_BYTES)
        return ds4_fail(DS4_ERR_FORMAT,
                        "kv count %llu at offset 16 is too large: only %llu bytes follow", (ull)nkv,
                        (ull)left(&c));
    if (nt > left(&c) / MIN_TINFO_BYTES || nkv * MIN_KV_BYTES + nt * MIN_TINFO_BYTES > left(&c))
        return ds4_fail(DS4_ERR_FORMAT,
                        "tensor count %llu at offset 8 is too large: only %llu bytes follow", (ull)nt,
                        (ull)left(&c));
    g->n_kv = (int64_t)nkv;
    g->n_tensors = (int64_t)nt;
    g->kv = calloc(nkv ? nkv : 1, sizeof *g->kv);
    g->tensors = calloc(nt ? nt : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors)
        return ds4_fail(DS4_ERR_NOMEM, "out of memory for %llu kvs and %llu tensors", (ull)nkv,
                        (ull)nt);
    if ((st = parse_kvs(&c, g))) return st;
    if ((st = parse_alignment(g))) return st;
    return parse_tensors(&c, g);
}

void ds4_gguf_close(ds4_gguf *g)
{
    if (!g) return;
    if (g->kv)
        for (int64_t i = 0; i < g->n_kv; i++) {
            free((char *)g->kv[i].key);
            free(g->kv[i].str_offs);
        }
    if (g->tensors)
        for (int64_t i = 0; i < g->n_tensors; i++) free((char *)g->tensors[i].name);
    free(g->kv);
    free(g->kv_sorted);
    free(g->tensors);
    free(g->t_sorted);
    if (g->mapped) munmap((void *)g->base, g->size);
    free(g->path);
    free(g);
}

static ds4_gguf *open_buffer(const void *data, uint64_t size, const char *path, int mapped)
{
    ds4_gguf *g = calloc(1, sizeof *g);
    char *p = strdup(path);
    if (!g || !p) {
        free(g);
        free(p);
        if (mapped) munmap((void *)data, size);
        ds4_fail(DS4_ERR_NOMEM, "gguf: %s: out of memory", path);
        return NULL;
    }
    g->path = p;
    g->base = data;
    g->size = size;
    g->mapped = mapped;
    if (parse(g) != DS4_OK) {
        ds4_error_prefix("gguf: %s: ", path);
        ds4_gguf_close(g);
        return NULL;
    }
    return g;
}

ds4_gguf *ds4_gguf_open_memory(const void *data, size_t size)
{
    static const uint8_t empty[1];
    return open_buffer(size ? data : empty, size, "<memory>", 0);
}

ds4_gguf *ds4_gguf_open(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        ds4_fail(errno == ENOENT ? DS4_ERR_NOT_FOUND : DS4_ERR_IO, "gguf: %s: cannot open: %s", path,
                 strerror(errno));
        return NULL;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        ds4_fail(DS4_ERR_IO, "gguf: %s: not a regular file", path);
        close(fd);
        return NULL;
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size == 0) { /* mmap cannot map 0 bytes; the parser reports "truncated" */
        static const uint8_t empty[1];
        close(fd);
        return open_buffer(empty, 0, path, 0);
    }
    void *m = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (m == MAP_FAILED) {
        ds4_fail(DS4_ERR_IO, "gguf: %s: mmap of %llu bytes failed: %s", path, (ull)size,
                 strerror(err));
        return NULL;
    }
    /* Weights are streamed once per token: in 2 MiB pages a matvec takes a
       TLB miss per 2 MiB, not per 4 KiB. Where transparent huge pages are
       "madvise" and the filesystem caches files in large folios, this is
       what lets the kernel map them whole; elsewhere it is refused or a
       no-op, and the mapping works the same (ds4-bench reports the share,
       ds4_model_weight_huge_bytes). */
    (void)madvise(m, size, MADV_HUGEPAGE);
    return open_buffer(m, size, path, 1);
}

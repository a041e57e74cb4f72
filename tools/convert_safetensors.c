/*
 * convert_safetensors.c - mmap + validate the shards of a checkpoint
 * (see convert_safetensors.h for the shape of the API).
 *
 * Everything untrusted is checked before it is used as a size: the header
 * length against the file size, each tensor's offsets against the data
 * section, the element count against overflow. The JSON is parsed by
 * jansson; tensor names are copied out so the JSON can be freed.
 */
#include "tools/convert_safetensors.h"

#include "util/error.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The safetensors format caps its header at 100 MB; an index of the
 * official checkpoint (~100k names) is a few MB. */
#define ST_MAX_HEADER (100u << 20)
#define ST_MAX_INDEX (256u << 20)

typedef struct {
    char *path;
    uint8_t *map;
    uint64_t size;
} st_shard;

struct st_archive {
    st_shard *shards;
    int n_shards;
    st_tensor *tensors;
    int64_t n_tensors, cap_tensors;
};

static const struct {
    const char *name;
    st_dtype dt;
    int size;
} dtype_table[] = {
    {"F64", ST_F64, 8},         {"F32", ST_F32, 4},  {"F16", ST_F16, 2},
    {"BF16", ST_BF16, 2},       {"F8_E4M3", ST_F8_E4M3, 1},
    {"F8_E8M0", ST_F8_E8M0, 1}, {"I64", ST_I64, 8},  {"I32", ST_I32, 4},
    {"I16", ST_I16, 2},         {"I8", ST_I8, 1},    {"U8", ST_U8, 1},
    {"BOOL", ST_BOOL, 1},
};

int st_dtype_size(st_dtype dt)
{
    for (size_t i = 0; i < sizeof dtype_table / sizeof dtype_table[0]; i++)
        if (dtype_table[i].dt == dt) return dtype_table[i].size;
    return 0;
}

const char *st_dtype_str(st_dtype dt)
{
    for (size_t i = 0; i < sizeof dtype_table / sizeof dtype_table[0]; i++)
        if (dtype_table[i].dt == dt) return dtype_table[i].name;
    return "unknown";
}

static st_dtype dtype_parse(const char *s)
{
    for (size_t i = 0; i < sizeof dtype_table / sizeof dtype_table[0]; i++)
        if (strcmp(dtype_table[i].name, s) == 0) return dtype_table[i].dt;
    return ST_UNKNOWN;
}

int64_t st_nelements(const st_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->n_dims; i++) n *= t->shape[i];
    return n;
}

int64_t st_count(const st_archive *a) { return a->n_tensors; }

const st_tensor *st_at(const st_archive *a, int64_t i)
{
    return i >= 0 && i < a->n_tensors ? &a->tensors[i] : NULL;
}

static int cmp_tensor(const void *x, const void *y)
{
    return strcmp(((const st_tensor *)x)->name, ((const st_tensor *)y)->name);
}

const st_tensor *st_find(const st_archive *a, const char *name)
{
    st_tensor key = {.name = name};
    return bsearch(&key, a->tensors, (size_t)a->n_tensors, sizeof key, cmp_tensor);
}

void st_close(st_archive *a)
{
    if (!a) return;
    for (int i = 0; i < a->n_shards; i++) {
        if (a->shards[i].map) munmap(a->shards[i].map, a->shards[i].size);
        free(a->shards[i].path);
    }
    for (int64_t i = 0; i < a->n_tensors; i++) {
        free((char *)a->tensors[i].name);
        free((char *)a->tensors[i].dtype_name);
    }
    free(a->shards);
    free(a->tensors);
    free(a);
}

static char *path_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static ds4_status map_file(const char *path, uint8_t **map, uint64_t *size)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return ds4_fail(DS4_ERR_IO, "safetensors: open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return ds4_fail(DS4_ERR_IO, "safetensors: stat %s: %s", path, strerror(errno));
    }
    *size = (uint64_t)st.st_size;
    *map = NULL;
    if (st.st_size > 0) {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            close(fd);
            return ds4_fail(DS4_ERR_IO, "safetensors: mmap %s: %s", path, strerror(errno));
        }
        *map = m;
    }
    close(fd);
    return DS4_OK;
}

static ds4_status push_tensor(st_archive *a, const st_tensor *t)
{
    if (a->n_tensors == a->cap_tensors) {
        int64_t cap = a->cap_tensors ? a->cap_tensors * 2 : 256;
        st_tensor *n = realloc(a->tensors, (size_t)cap * sizeof *n);
        if (!n) return ds4_fail(DS4_ERR_NOMEM, "safetensors: out of memory");
        a->tensors = n;
        a->cap_tensors = cap;
    }
    a->tensors[a->n_tensors++] = *t;
    return DS4_OK;
}

/* One header entry {dtype, shape, data_offsets} -> st_tensor. */
static ds4_status parse_entry(const st_shard *sh, uint64_t data_base, const char *name,
                              json_t *v, st_tensor *t)
{
    const char *file = sh->path;
    if (!json_is_object(v))
        return ds4_fail(DS4_ERR_FORMAT, "safetensors: %s: tensor %s: entry is not an object", file, name);
    json_t *dtype = json_object_get(v, "dtype");
    json_t *shape = json_object_get(v, "shape");
    json_t *offs = json_object_get(v, "data_offsets");
    if (!json_is_string(dtype) || !json_is_array(shape) || !json_is_array(offs) ||
        json_array_size(offs) != 2)
        return ds4_fail(DS4_ERR_FORMAT,
                        "safetensors: %s: tensor %s: needs string dtype, array shape and "
                        "data_offsets [begin, end]", file, name);
    memset(t, 0, sizeof *t);
    t->file = file;
    t->dtype = dtype_parse(json_string_value(dtype));
    size_t nd = json_array_size(shape);
    if (nd > ST_MAX_DIMS)
        return ds4_fail(DS4_ERR_FORMAT, "safetensors: %s: tensor %s: %zu dimensions (max %d)",
                        file, name, nd, ST_MAX_DIMS);
    t->n_dims = (int)nd;
    uint64_t nel = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(shape, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return ds4_fail(DS4_ERR_FORMAT, "safetensors: %s: tensor %s: bad shape entry %zu",
                            file, name, i);
        t->shape[i] = json_integer_value(d);
        if (__builtin_mul_overflow(nel, (uint64_t)t->shape[i], &nel))
            return ds4_fail(DS4_ERR_FORMAT, "safetensors: %s: tensor %s: shape overflows", file, name);
    }
    json_t *b = json_array_get(offs, 0), *e = json_array_get(offs, 1);
    if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 ||
        json_integer_value(e) < json_integer_value(b))
        return ds4_fail(DS4_ERR_FORMAT, "safetensors: %s: tensor %s: bad data_offsets", file, name);
    uint64_t begin = (uint64_t)json_integer_value(b), end = (uint64_t)json_integer_value(e);
    uint64_t data_len = sh->size - data_base;
    if (end > data_len)
        return ds4_fail(DS4_ERR_FORMAT,
                        "safetensors: %s: tensor %s: data_offsets end %llu past the data section "
                        "(%llu bytes)", file, name, (unsigned long long)end,
                        (unsigned long long)data_len);
    t->nbytes = end - begin;
    t->data = sh->map + data_base + begin;
    int es = st_dtype_size(t->dtype);
    uint64_t want;
    if (es && (__builtin_mul_overflow(nel, (uint64_t)es, &want) || want != t->nbytes))
        return ds4_fail(DS4_ERR_FORMAT,
                        "safetensors: %s: tensor %s: %llu bytes for %llu elements of %s",
                        file, name, (unsigned long long)t->nbytes, (unsigned long long)nel,
                        json_string_value(dtype));
    t->name = strdup(name);
    t->dtype_name = strdup(json_string_value(dtype));
    if (!t->name || !t->dtype_name) {
        free((char *)t->name);
        free((char *)t->dtype_name);
        return ds4_fail(DS4_ERR_NOMEM, "safetensors: out of memory");
    }
    return DS4_OK;
}

static ds4_status load_shard(st_archive *a, const char *path)
{
    st_shard sh = {.path = strdup(path)};
    if (!sh.path) return ds4_fail(DS4_ERR_NOMEM, "safetensors: out of memory");
    ds4_status st = map_file(path, &sh.map, &sh.size);
    if (st) {
        free(sh.path);
        return st;
    }
    st_shard *ns = realloc(a->shards, (size_t)(a->n_shards + 1) * sizeof *ns);
    if (!ns) {
        if (sh.map) munmap(sh.map, sh.size);
        free(sh.path);
        return ds4_fail(DS4_ERR_NOMEM, "safetensors: out of memory");
    }
    a->shards = ns;
    a->shards[a->n_shards++] = sh;

    if (sh.size < 8)
        return ds4_fail(DS4_ERR_FORMAT, "safetensors: %s: %llu bytes, too short for a header",
                        path, (unsigned long long)sh.size);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)sh.map[i] << (8 * i);
    if (hlen > sh.size - 8 || hlen > ST_MAX_HEADER)
        return ds4_fail(DS4_ERR_FORMAT,
                        "safetensors: %s: header length %llu does not fit the file (%llu bytes)",
                        path, (unsigned long long)hlen, (unsigned long long)sh.size);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)sh.map + 8, (size_t)hlen, 0, &jerr);
    if (!root)
        return ds4_fail(DS4_ERR_FORMAT, "safetensors: %s: bad header JSON at byte %d: %s", path,
                        jerr.position + 8, jerr.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return ds4_fail(DS4_ERR_FORMAT, "safetensors: %s: header is not a JSON object", path);
    }
    const char *key;
    json_t *v;
    st = DS4_OK;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) continue;
        st_tensor t;
        st = parse_entry(&a->shards[a->n_shards - 1], 8 + hlen, key, v, &t);
        if (!st) {
            st = push_tensor(a, &t);
            if (st) {
                free((char *)t.name);
                free((char *)t.dtype_name);
            }
        }
        if (st) break;
    }
    json_decref(root);
    return st;
}

static int cmp_str(const void *x, const void *y)
{
    return strcmp(*(char *const *)x, *(char *const *)y);
}

static bool ends_with(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

/* Shard list from model.safetensors.index.json (unique file names). */
static ds4_status index_shards(const char *dir, const char *index_path, char ***out, int *n_out,
                               json_t **weight_map_out, json_t **root_out)
{
    json_error_t jerr;
    json_t *root = json_load_file(index_path, 0, &jerr);
    if (!root)
        return ds4_fail(DS4_ERR_FORMAT, "safetensors: %s: bad JSON at line %d: %s", index_path,
                        jerr.line, jerr.text);
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm)) {
        json_decref(root);
        return ds4_fail(DS4_ERR_FORMAT, "safetensors: %s: no \"weight_map\" object", index_path);
    }
    size_t cap = json_object_size(wm) + 1;
    char **files = calloc(cap, sizeof *files);
    if (!files) {
        json_decref(root);
        return ds4_fail(DS4_ERR_NOMEM, "safetensors: out of memory");
    }
    int n = 0;
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        if (!json_is_string(v) || strstr(json_string_value(v), "..")) {
            for (int i = 0; i < n; i++) free(files[i]);
            free(files);
            json_decref(root);
            return ds4_fail(DS4_ERR_FORMAT, "safetensors: %s: tensor %s: bad shard file name",
                            index_path, key);
        }
        files[n++] = path_join(dir, json_string_value(v));
    }
    qsort(files, (size_t)n, sizeof *files, cmp_str);
    int u = 0;
    for (int i = 0; i < n; i++) {
        if (u > 0 && strcmp(files[u - 1], files[i]) == 0) {
            free(files[i]);
            continue;
        }
        files[u++] = files[i];
    }
    *out = files;
    *n_out = u;
    *weight_map_out = wm;
    *root_out = root;
    return DS4_OK;
}

static ds4_status dir_shards(const char *dir, char ***out, int *n_out)
{
    DIR *d = opendir(dir);
    if (!d) return ds4_fail(DS4_ERR_IO, "safetensors: open directory %s: %s", dir, strerror(errno));
    char **files = NULL;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!ends_with(e->d_name, ".safetensors")) continue;
        char **nf = realloc(files, (size_t)(n + 1) * sizeof *nf);
        if (!nf) break;
        files = nf;
        files[n++] = path_join(dir, e->d_name);
    }
    closedir(d);
    if (n == 0) {
        free(files);
        return ds4_fail(DS4_ERR_NOT_FOUND,
                        "safetensors: %s: no model.safetensors.index.json and no *.safetensors file",
                        dir);
    }
    qsort(files, (size_t)n, sizeof *files, cmp_str);
    *out = files;
    *n_out = n;
    return DS4_OK;
}

st_archive *st_open(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        ds4_fail(DS4_ERR_IO, "safetensors: %s: %s", path, strerror(errno));
        return NULL;
    }
    st_archive *a = calloc(1, sizeof *a);
    if (!a) {
        ds4_fail(DS4_ERR_NOMEM, "safetensors: out of memory");
        return NULL;
    }
    char **files = NULL;
    int n_files = 0;
    json_t *index_root = NULL, *weight_map = NULL;
    ds4_status st;
    if (S_ISDIR(sb.st_mode)) {
        char *index_path = path_join(path, "model.safetensors.index.json");
        if (index_path && access(index_path, F_OK) == 0)
            st = index_shards(path, index_path, &files, &n_files, &weight_map, &index_root);
        else
            st = dir_shards(path, &files, &n_files);
        free(index_path);
    } else {
        files = malloc(sizeof *files);
        st = files && (files[0] = strdup(path)) ? DS4_OK
                                                : ds4_fail(DS4_ERR_NOMEM, "safetensors: out of memory");
        n_files = st ? 0 : 1;
    }
    for (int i = 0; !st && i < n_files; i++) st = load_shard(a, files[i]);
    for (int i = 0; i < n_files; i++) free(files[i]);
    free(files);
    if (!st) {
        qsort(a->tensors, (size_t)a->n_tensors, sizeof *a->tensors, cmp_tensor);
        for (int64_t i = 1; !st && i < a->n_tensors; i++)
            if (strcmp(a->tensors[i - 1].name, a->tensors[i].name) == 0)
                st = ds4_fail(DS4_ERR_FORMAT, "safetensors: tensor %s appears twice (%s and %s)",
                              a->tensors[i].name, a->tensors[i - 1].file, a->tensors[i].file);
    }
    if (!st && weight_map) {
        const char *key;
        json_t *v;
        json_object_foreach(weight_map, key, v) {
            if (!st_find(a, key)) {
                st = ds4_fail(DS4_ERR_FORMAT,
                              "safetensors: tensor %s is in the index but not in its shard %s", key,
                              json_string_value(v));
                break;
            }
        }
    }
    json_decref(index_root);
    if (st) {
        st_close(a);
        return NULL;
    }
    return a;
}

/*
 * gguf.h - reading and writing GGUF v3 (little-endian) files.
 *
 * GGUF layout (all integers little-endian):
 *   "GGUF"  u32 version (3)  u64 n_tensors  u64 n_kv
 *   n_kv x      { string key, u32 value_type, value }
 *   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type,
 *                 u64 offset (relative to the data section) }
 *   zero padding up to `general.alignment` (u32, default 32)
 *   data section: tensor bytes, each tensor at an aligned offset
 * where string = u64 length + bytes (no NUL) and an array value is
 * u32 element_type + u64 count + elements.
 *
 * Reader. ds4_gguf_open() maps the file read-only and validates ALL of it
 * up front (every count bounded by the bytes left before anything is
 * allocated, value/tensor type ids, UTF-8 keys and names, duplicate keys and
 * names, shapes, alignment, tensor ranges and overlap); after a successful
 * open every accessor is a cheap lookup that cannot fail on the file's
 * content. Errors name the cause and the byte offset, e.g.
 *   "gguf: x.gguf: truncated: key 5 needs 8 bytes at offset 1234, file
 *    has 1236"
 * Strings inside the mapping are NOT NUL-terminated; keys and tensor names
 * are copied and ARE NUL-terminated. Pointers into the mapping (string
 * values, array data, tensor data) live until ds4_gguf_close(); numeric
 * array data may be unaligned, so read it with memcpy or the element
 * getters.
 *
 * Writer. Accumulate KVs (insertion order is kept) and tensor infos, then
 * write: header, KVs, tensor infos, padding, and each tensor's bytes
 * followed by zero padding to the alignment (what ggml writes; so a file
 * read and written back is byte-identical). Tensor offsets are assigned in
 * insertion order. Tensor bytes come from a pointer, from a fill callback,
 * or are streamed by the caller between ds4_gguf_writer_begin() and
 * ds4_gguf_writer_finish() so that an 80 GB file never sits in memory.
 * The alignment is the writer's `general.alignment` KV if present (must be
 * u32, a power of two), else 32.
 *
 * Tensor types are ggml type ids (ds4_type from quant/blocks.h names the
 * ones the engine computes with); the reader accepts every id ggml defines
 * with a known block layout (see ds4_gguf_type_info()).
 */
#ifndef DS4_GGUF_GGUF_H
#define DS4_GGUF_GGUF_H

#include "include/ds4.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DS4_GGUF_MAGIC "GGUF"
#define DS4_GGUF_VERSION 3u
#define DS4_GGUF_DEFAULT_ALIGNMENT 32u
#define DS4_GGUF_MAX_DIMS 4
#define DS4_GGUF_KEY_ALIGNMENT "general.alignment"
/* ggml loaders keep tensor names in a 64-byte buffer; the writer refuses
 * longer names so that every file it writes loads there too. (The reader
 * accepts up to 65535 bytes.) */
#define DS4_GGUF_MAX_TENSOR_NAME 63

/* Metadata value types (GGUF ids). */
typedef enum {
    DS4_GGUF_U8 = 0,
    DS4_GGUF_I8 = 1,
    DS4_GGUF_U16 = 2,
    DS4_GGUF_I16 = 3,
    DS4_GGUF_U32 = 4,
    DS4_GGUF_I32 = 5,
    DS4_GGUF_F32 = 6,
    DS4_GGUF_BOOL = 7,
    DS4_GGUF_STRING = 8,
    DS4_GGUF_ARRAY = 9,
    DS4_GGUF_U64 = 10,
    DS4_GGUF_I64 = 11,
    DS4_GGUF_F64 = 12,
} ds4_gguf_vtype;
#define DS4_GGUF_VTYPE_COUNT 13

/* "u8", "str", "arr", ... ; "?" for an unknown id. */
const char *ds4_gguf_vtype_name(uint32_t vtype);
/* Bytes of one scalar of that type (0 for STRING/ARRAY/unknown). */
size_t ds4_gguf_vtype_size(uint32_t vtype);

/* A string inside the file: NOT NUL-terminated. */
typedef struct {
    const char *ptr;
    uint64_t len;
} ds4_gguf_str;

/* One decoded scalar (or array element). Exactly one member is meaningful,
 * chosen by `type`: u for U8/U16/U32/U64, i for I8/I16/I32/I64, f for
 * F32/F64 (F32 widened exactly), b for BOOL, s for STRING. */
typedef struct {
    uint32_t type;
    union {
        uint64_t u;
        int64_t i;
        double f;
        bool b;
        ds4_gguf_str s;
    } v;
} ds4_gguf_value;

/* ---- ggml tensor types ------------------------------------------------ */

typedef struct {
    const char *name;     /* "F32", "Q8_0", "IQ2_XXS", ... */
    uint32_t block_elems; /* values per block (1 for plain types) */
    uint32_t block_bytes; /* bytes per block */
} ds4_gguf_type_info;

/* Layout of a ggml type id; NULL when the id is unknown or removed. */
const ds4_gguf_type_info *ds4_gguf_type_info_of(uint32_t ggml_type);
/* Name of a ggml type id, or "?" */
const char *ds4_gguf_type_name(uint32_t ggml_type);
/* Bytes of a row-major tensor of `n_dims` dims `ne` (ne[0] fastest) of that
 * type. DS4_ERR_FORMAT/UNSUPPORTED with a message if the type is unknown,
 * ne[0] is not a multiple of the block size, a dim is 0 or the size
 * overflows. */
ds4_status ds4_gguf_tensor_nbytes(uint32_t ggml_type, uint32_t n_dims,
                                  const uint64_t *ne, uint64_t *out);

/* ---- reader ----------------------------------------------------------- */

typedef struct ds4_gguf ds4_gguf;

typedef struct {
    const char *name;     /* NUL-terminated copy */
    uint32_t n_dims;      /* 1..4, as stored */
    uint64_t ne[DS4_GGUF_MAX_DIMS]; /* GGUF order, ne[0] fastest; unused = 1 */
    uint32_t type;        /* ggml type id (see ds4_type in quant/blocks.h) */
    uint64_t offset;      /* relative to the data section */
    uint64_t size;        /* bytes */
    const void *data;     /* into the mapping (aligned to the file alignment
                             relative to the mapping start) */
    uint64_t info_offset; /* file offset of this tensor's info record */
} ds4_gguf_tensor;

/* Open and validate a file (mmap). NULL + ds4_last_error() on failure. */
ds4_gguf *ds4_gguf_open(const char *path);
/* Parse a buffer the caller keeps alive until ds4_gguf_close() (not copied). */
ds4_gguf *ds4_gguf_open_memory(const void *data, size_t size);
void ds4_gguf_close(ds4_gguf *g);

uint32_t ds4_gguf_version(const ds4_gguf *g);
uint32_t ds4_gguf_alignment(const ds4_gguf *g);
/* File offset of the data section (aligned). */
uint64_t ds4_gguf_data_offset(const ds4_gguf *g);
/* The whole mapping (file bytes) and its size. */
const void *ds4_gguf_base(const ds4_gguf *g);
uint64_t ds4_gguf_file_size(const ds4_gguf *g);
/* Path given to open ("<memory>" for open_memory). */
const char *ds4_gguf_path(const ds4_gguf *g);

/* Metadata, by index 0..n_kv-1 in file order. */
int64_t ds4_gguf_n_kv(const ds4_gguf *g);
/* Index of a key, or -1. */
int64_t ds4_gguf_find_key(const ds4_gguf *g, const char *key);
const char *ds4_gguf_key(const ds4_gguf *g, int64_t kv);
uint32_t ds4_gguf_kv_type(const ds4_gguf *g, int64_t kv); /* ds4_gguf_vtype */
/* File offset where the KV record starts (for messages). */
uint64_t ds4_gguf_kv_offset(const ds4_gguf *g, int64_t kv);
/* Value of a non-array KV. DS4_ERR_INVALID if it is an array. */
ds4_status ds4_gguf_kv_value(const ds4_gguf *g, int64_t kv, ds4_gguf_value *out);

/* Arrays (kv_type == DS4_GGUF_ARRAY). Element type, count, raw element
 * bytes (numeric/bool arrays only; NULL for string arrays) and one element
 * decoded. */
uint32_t ds4_gguf_arr_type(const ds4_gguf *g, int64_t kv);
uint64_t ds4_gguf_arr_len(const ds4_gguf *g, int64_t kv);
const void *ds4_gguf_arr_data(const ds4_gguf *g, int64_t kv);
ds4_status ds4_gguf_arr_elem(const ds4_gguf *g, int64_t kv, uint64_t i,
                             ds4_gguf_value *out);
/* String element i of a string array (O(1)). {NULL,0} if out of range. */
ds4_gguf_str ds4_gguf_arr_str(const ds4_gguf *g, int64_t kv, uint64_t i);

/* Convenience getters by key. DS4_ERR_NOT_FOUND if the key is absent,
 * DS4_ERR_FORMAT if it has another type (message names key, found and
 * wanted type). Exact type match, no conversion. */
ds4_status ds4_gguf_get_u8(const ds4_gguf *g, const char *key, uint8_t *out);
ds4_status ds4_gguf_get_i8(const ds4_gguf *g, const char *key, int8_t *out);
ds4_status ds4_gguf_get_u16(const ds4_gguf *g, const char *key, uint16_t *out);
ds4_status ds4_gguf_get_i16(const ds4_gguf *g, const char *key, int16_t *out);
ds4_status ds4_gguf_get_u32(const ds4_gguf *g, const char *key, uint32_t *out);
ds4_status ds4_gguf_get_i32(const ds4_gguf *g, const char *key, int32_t *out);
ds4_status ds4_gguf_get_u64(const ds4_gguf *g, const char *key, uint64_t *out);
ds4_status ds4_gguf_get_i64(const ds4_gguf *g, const char *key, int64_t *out);
ds4_status ds4_gguf_get_f32(const ds4_gguf *g, const char *key, float *out);
ds4_status ds4_gguf_get_f64(const ds4_gguf *g, const char *key, double *out);
ds4_status ds4_gguf_get_bool(const ds4_gguf *g, const char *key, bool *out);
ds4_status ds4_gguf_get_str(const ds4_gguf *g, const char *key, ds4_gguf_str *out);
/* Any unsigned or non-negative signed integer type, widened to u64 (model
 * hyper-parameters are written as u32 by some converters, u64 by others). */
ds4_status ds4_gguf_get_uint(const ds4_gguf *g, const char *key, uint64_t *out);
/* An array KV of element type `elem_type`: its index (for the arr_*
 * accessors) and length. */
ds4_status ds4_gguf_get_arr(const ds4_gguf *g, const char *key,
                            uint32_t elem_type, int64_t *kv, uint64_t *len);

/* Tensors, by index 0..n_tensors-1 in file order. */
int64_t ds4_gguf_n_tensors(const ds4_gguf *g);
const ds4_gguf_tensor *ds4_gguf_tensor_at(const ds4_gguf *g, int64_t i);
/* Index of a tensor, or -1. */
int64_t ds4_gguf_find_tensor(const ds4_gguf *g, const char *name);
/* The tensor or NULL + DS4_ERR_NOT_FOUND message. */
const ds4_gguf_tensor *ds4_gguf_get_tensor(const ds4_gguf *g, const char *name);

/* ---- writer ----------------------------------------------------------- */

typedef struct ds4_gguf_writer ds4_gguf_writer;

/* Fills buf with `len` bytes of the tensor starting at byte `offset` within
 * the tensor; called in increasing offset order, chunk by chunk. */
typedef ds4_status (*ds4_gguf_fill_fn)(void *ctx, uint64_t offset, void *buf,
                                       size_t len);

ds4_gguf_writer *ds4_gguf_writer_new(void);
void ds4_gguf_writer_free(ds4_gguf_writer *w);

/* KVs: keys must be non-empty valid UTF-8 and unique (DS4_ERR_INVALID
 * otherwise). Values are copied. */
ds4_status ds4_gguf_writer_add_u8(ds4_gguf_writer *w, const char *key, uint8_t v);
ds4_status ds4_gguf_writer_add_i8(ds4_gguf_writer *w, const char *key, int8_t v);
ds4_status ds4_gguf_writer_add_u16(ds4_gguf_writer *w, const char *key, uint16_t v);
ds4_status ds4_gguf_writer_add_i16(ds4_gguf_writer *w, const char *key, int16_t v);
ds4_status ds4_gguf_writer_add_u32(ds4_gguf_writer *w, const char *key, uint32_t v);
ds4_status ds4_gguf_writer_add_i32(ds4_gguf_writer *w, const char *key, int32_t v);
ds4_status ds4_gguf_writer_add_u64(ds4_gguf_writer *w, const char *key, uint64_t v);
ds4_status ds4_gguf_writer_add_i64(ds4_gguf_writer *w, const char *key, int64_t v);
ds4_status ds4_gguf_writer_add_f32(ds4_gguf_writer *w, const char *key, float v);
ds4_status ds4_gguf_writer_add_f64(ds4_gguf_writer *w, const char *key, double v);
ds4_status ds4_gguf_writer_add_bool(ds4_gguf_writer *w, const char *key, bool v);
ds4_status ds4_gguf_writer_add_str(ds4_gguf_writer *w, const char *key, const char *s);
ds4_status ds4_gguf_writer_add_strn(ds4_gguf_writer *w, const char *key,
                                    const char *s, uint64_t len);
/* Numeric/bool array: `n` elements of `elem_type`, little-endian bytes. */
ds4_status ds4_gguf_writer_add_arr(ds4_gguf_writer *w, const char *key,
                                   uint32_t elem_type, const void *data, uint64_t n);
/* String array; lens may be NULL (then strlen is used). */
ds4_status ds4_gguf_writer_add_arr_str(ds4_gguf_writer *w, const char *key,
                                       const char *const *strs,
                                       const uint64_t *lens, uint64_t n);
/* Copy KV `kv` of an open reader (any type, arrays included). */
ds4_status ds4_gguf_writer_copy_kv(ds4_gguf_writer *w, const ds4_gguf *g, int64_t kv);

/* Tensors: names unique, non-empty, valid UTF-8, at most 63 bytes; 1..4
 * dims, all > 0;
 * ne[0] a multiple of the type's block size. `data` (may be NULL when the
 * bytes are streamed or filled) is NOT copied: it must stay valid until the
 * file is written. */
ds4_status ds4_gguf_writer_add_tensor(ds4_gguf_writer *w, const char *name,
                                      uint32_t ggml_type, uint32_t n_dims,
                                      const uint64_t *ne, const void *data);
ds4_status ds4_gguf_writer_add_tensor_fill(ds4_gguf_writer *w, const char *name,
                                           uint32_t ggml_type, uint32_t n_dims,
                                           const uint64_t *ne,
                                           ds4_gguf_fill_fn fill, void *ctx);

/* Whole file at once: every tensor needs data or a fill callback. The file
 * is written to "<path>.tmp" and renamed on success. */
ds4_status ds4_gguf_writer_write(ds4_gguf_writer *w, const char *path);
/* Same into a malloc'd buffer (*out, *len; free() it). */
ds4_status ds4_gguf_writer_write_memory(ds4_gguf_writer *w, void **out, size_t *len);

/* Streaming: begin() writes header, KVs, tensor infos and padding; then
 * append() the tensors' bytes in insertion order, in any chunking (the
 * writer inserts the padding between tensors); finish() checks that every
 * byte came, pads, closes and renames. After begin() no KV or tensor may be
 * added. abort() (or free()) drops a partial file. */
ds4_status ds4_gguf_writer_begin(ds4_gguf_writer *w, const char *path);
ds4_status ds4_gguf_writer_append(ds4_gguf_writer *w, const void *data, size_t len);
ds4_status ds4_gguf_writer_finish(ds4_gguf_writer *w);
void ds4_gguf_writer_abort(ds4_gguf_writer *w);

/* Size in bytes of the file the writer would produce, and the offset of
 * its data section (valid any time; for progress and preallocation). */
uint64_t ds4_gguf_writer_file_size(const ds4_gguf_writer *w);
uint64_t ds4_gguf_writer_data_offset(const ds4_gguf_writer *w);

#endif

/*
 * gguf_internal.h - the reader's in-memory index, shared by gguf_read.c
 * (which builds and validates it) and gguf_access.c (the getters).
 *
 * Nothing here is decoded lazily from untrusted bytes in a way that could
 * fail: the parser checks everything once, and the index then holds file
 * offsets that are known to be in range.
 */
#ifndef DS4_GGUF_INTERNAL_H
#define DS4_GGUF_INTERNAL_H

#include "gguf/gguf.h"

typedef struct {
    const char *key;       /* NUL-terminated, in g->names */
    uint64_t offset;       /* file offset of the KV record */
    uint32_t type;         /* ds4_gguf_vtype */
    uint32_t arr_type;     /* element type when type == ARRAY */
    uint64_t arr_len;      /* element count when type == ARRAY */
    const uint8_t *val;    /* value bytes (for arrays: first element) */
    uint64_t *str_offs;    /* string arrays: file offset of each element's
                              length prefix (NULL otherwise) */
} ds4_gguf_kv;

struct ds4_gguf {
    char *path;
    const uint8_t *base;   /* whole file */
    uint64_t size;
    int mapped;            /* base came from mmap (unmap on close) */
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset;

    int64_t n_kv;
    ds4_gguf_kv *kv;
    int64_t *kv_sorted;    /* kv indices sorted by key (binary search) */

    int64_t n_tensors;
    ds4_gguf_tensor *tensors;
    int64_t *t_sorted;     /* tensor indices sorted by name */

    char *names;           /* arena of NUL-terminated keys and names */
};

#endif

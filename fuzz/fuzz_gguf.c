/*
 * fuzz_gguf.c - libFuzzer target for the GGUF reader.
 *
 * Opens the input with ds4_gguf_open_memory() from an exact-size copy (so
 * ASan catches any read past the end) and, when the reader accepts it,
 * touches everything it exposes: every key, value, array element, string
 * byte and tensor byte, and every lookup by name. A rejected input must
 * come with a message. Seeds: fuzz/corpus/gguf/ (tiny files made by the
 * writer; tests/test_gguf_corpus.c makes them and checks them).
 */
#include "gguf/gguf.h"

#include <stdlib.h>
#include <string.h>

static volatile uint64_t g_sink;

static uint64_t walk_value(const ds4_gguf_value *v)
{
    uint64_t h = v->type;
    if (v->type == DS4_GGUF_STRING)
        for (uint64_t k = 0; k < v->v.s.len; k++) h = h * 31 + (uint8_t)v->v.s.ptr[k];
    else
        h += v->v.u;
    return h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);
    ds4_gguf *g = ds4_gguf_open_memory(copy, size);
    if (!g) {
        if (ds4_last_error()[0] == '\0') abort(); /* rejected without a cause */
        free(copy);
        return 0;
    }
    uint64_t h = ds4_gguf_alignment(g) + ds4_gguf_data_offset(g);
    ds4_gguf_value v;
    for (int64_t i = 0; i < ds4_gguf_n_kv(g); i++) {
        const char *key = ds4_gguf_key(g, i);
        if (ds4_gguf_find_key(g, key) != i) abort(); /* keys are unique */
        if (ds4_gguf_kv_type(g, i) != DS4_GGUF_ARRAY) {
            if (ds4_gguf_kv_value(g, i, &v) != DS4_OK) abort();
            h += walk_value(&v);
            continue;
        }
        uint64_t n = ds4_gguf_arr_len(g, i);
        for (uint64_t j = 0; j < n; j++) {
            if (ds4_gguf_arr_elem(g, i, j, &v) != DS4_OK) abort();
            h += walk_value(&v);
        }
        uint64_t u;
        (void)ds4_gguf_get_uint(g, key, &u);
    }
    for (int64_t i = 0; i < ds4_gguf_n_tensors(g); i++) {
        const ds4_gguf_tensor *t = ds4_gguf_tensor_at(g, i);
        if (ds4_gguf_find_tensor(g, t->name) != i) abort();
        const uint8_t *p = t->data;
        for (uint64_t j = 0; j < t->size; j++) h += p[j];
    }
    g_sink = h;
    ds4_gguf_close(g);
    free(copy);
    return 0;
}

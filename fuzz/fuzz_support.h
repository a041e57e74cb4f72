/*
 * fuzz_support.h - what the fuzz targets share (header-only, static):
 *   - fuzz_mem_path: bytes as a file path (a memfd, /proc/self/fd/N), for
 *     the loaders that take a path;
 *   - fuzz_micro_shape: the smallest DeepSeek V4 the model code accepts (two
 *     layers: sliding, CSA with an indexer; a hash-routed first layer), so
 *     a whole load + prefill runs in milliseconds;
 *   - fuzz_write_mini_vocab: a byte-level vocabulary GGUF with the 7 chat
 *     special tokens, 256 byte tokens and a few merges.
 * fuzz/make_seeds.c writes the seed corpora from the same definitions.
 */
#ifndef DS4_FUZZ_SUPPORT_H
#define DS4_FUZZ_SUPPORT_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "include/ds4_chat.h"
#include "tests/model_synth.h"
#include "text/byte_unicode.h"

/* n_layer, n_embd, n_vocab, n_head, head_dim, n_rot, q_lora, o_lora,
 * o_groups, n_expert, n_used, n_ff, n_hash, window, idx_heads, idx_dim,
 * idx_topk, ratios */
static const synth_shape fuzz_micro_shape = {2, 32, 64, 2, 16, 8, 16, 8, 1, 4, 2, 16, 1, 4, 1, 16, 2, {0, 4}};

/* A path that reads as data[0..size); *fd to close afterwards. NULL on failure. */
static inline const char *fuzz_mem_path(const void *data, size_t size, int *fd, char path[64])
{
    *fd = memfd_create("ds4-fuzz", 0);
    if (*fd < 0) return NULL;
    size_t off = 0;
    while (off < size) {
        ssize_t w = write(*fd, (const char *)data + off, size - off);
        if (w <= 0) { close(*fd); return NULL; }
        off += (size_t)w;
    }
    snprintf(path, 64, "/proc/self/fd/%d", *fd);
    return path;
}

static inline int fuzz_write_mini_vocab(const char *path)
{
    static const char *const specials[7] = {DS4_TEXT_BOS, DS4_TEXT_EOS, DS4_TEXT_USER, DS4_TEXT_ASSISTANT,
                                            DS4_TEXT_THINK, DS4_TEXT_THINK_END, DS4_TEXT_DSML};
    static const char *const merged[][2] = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"\xC4\xA0", "t"}};
    enum { N_MERGE = 4, N = 7 + 256 + N_MERGE };
    char *toks[N];
    int32_t types[N];
    int k = 0;
    for (int i = 0; i < 7; i++) { toks[k] = strdup(specials[i]); types[k++] = 3; /* CONTROL */ }
    for (int b = 0; b < 256; b++) {
        char buf[8];
        uint8_t byte = (uint8_t)b;
        size_t n = ds4_byte_level_encode(&byte, 1, buf);
        buf[n] = 0;
        toks[k] = strdup(buf);
        types[k++] = 1; /* NORMAL */
    }
    char *merges[N_MERGE];
    for (int i = 0; i < N_MERGE; i++) {
        size_t la = strlen(merged[i][0]), lb = strlen(merged[i][1]);
        toks[k] = malloc(la + lb + 1);
        memcpy(toks[k], merged[i][0], la);
        memcpy(toks[k] + la, merged[i][1], lb + 1);
        types[k++] = 1;
        merges[i] = malloc(la + lb + 2);
        snprintf(merges[i], la + lb + 2, "%s %s", merged[i][0], merged[i][1]);
    }
    ds4_gguf_writer *w = ds4_gguf_writer_new();
    int ok = w && ds4_gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2") == DS4_OK &&
             ds4_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, NULL, N) == DS4_OK &&
             ds4_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", DS4_GGUF_I32, types, N) == DS4_OK &&
             ds4_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges, NULL, N_MERGE) ==
                 DS4_OK &&
             ds4_gguf_writer_write(w, path) == DS4_OK;
    ds4_gguf_writer_free(w);
    for (int i = 0; i < N; i++) free(toks[i]);
    for (int i = 0; i < N_MERGE; i++) free(merges[i]);
    return ok;
}

#endif

/*
 * fuzz_tokenizer_gguf.c - libFuzzer target: the tokenizer built from a
 * GGUF's tokenizer.ggml.* metadata, then used.
 *
 * The input is the whole file. A tokenizer that loads encodes a fixed set
 * of texts (markers, invalid UTF-8, long runs) with every added token
 * special, with none, and with template spans, and each encoding must
 * decode back to exactly its text (encoding is total: every byte has a
 * token, so a failed round trip is a bug; it traps). Seeds:
 * fuzz/corpus/tokenizer_gguf/ (fuzz/make_seeds.c).
 */
#include <stddef.h>
#include <stdint.h>

#include "fuzz/fuzz_support.h"
#include "include/ds4_tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void round_trip(const ds4_tokenizer *tok, const char *text, size_t len, int how)
{
    ds4_tokens t = {0};
    ds4_spans sp = {0};
    ds4_spans_add(&sp, 0, len / 2); /* the first half is "template" */
    ds4_status st = how == 0 ? ds4_tokenize(tok, text, len, 0, &t)
                    : how == 1 ? ds4_tokenize(tok, text, len, DS4_TOKENIZE_SPECIAL, &t)
                               : ds4_tokenize_spans(tok, text, len, &sp, 0, &t);
    if (st == DS4_OK) {
        char *out = NULL;
        size_t n = 0;
        if (ds4_detokenize(tok, t.ids, t.n, &out, &n) == DS4_OK && (n != len || memcmp(out, text, len)))
            __builtin_trap();
        free(out);
        ds4_utf8_stream us = {0};
        char b[4096];
        for (size_t i = 0; i < t.n; i++) ds4_utf8_stream_token(&us, tok, t.ids[i], b, sizeof b);
    }
    ds4_tokens_free(&t);
    ds4_spans_free(&sp);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd;
    char buf[64];
    const char *path = fuzz_mem_path(data, size, &fd, buf);
    if (!path) return 0;
    ds4_tokenizer *tok = ds4_tokenizer_load(path);
    close(fd);
    if (!tok) return 0;
    static const char *const texts[] = {
        "hello world, hello\n\n",
        DS4_TEXT_BOS DS4_TEXT_USER "hi" DS4_TEXT_EOS DS4_TEXT_ASSISTANT DS4_TEXT_THINK "x" DS4_TEXT_THINK_END,
        ("<\xEF\xBD\x9C" "DSML\xEF\xBD\x9C invoke name=\"f\">\xff\xfe\x80 caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD 12345"),
        "                                                                            tail",
    };
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
        for (int how = 0; how < 3; how++) round_trip(tok, texts[i], strlen(texts[i]), how);
    for (int32_t id = -1; id < 8; id++) {
        size_t n;
        ds4_token_bytes(tok, id, &n);
    }
    ds4_tokenizer_free(tok);
    return 0;
}

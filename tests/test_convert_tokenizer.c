/*
 * test_convert_tokenizer.c - the tokenizer.ggml.* keys the converter writes.
 *
 *   - From the reconstructed DeepSeek V4 tokenizer.json, every tokenizer.*
 *     key (tokens, token types, merges, special ids, flags, model, pre)
 *     equals the one in tests/data/tokenizer/dsv4-vocab.gguf, element by
 *     element, with the same GGUF value types, and no other tokenizer key
 *     is written.
 *   - A small hand-made tokenizer.json: [a, b] merges, special/non-special
 *     added tokens, an id nobody names, tokenizer_config.json special
 *     tokens; and its errors (id past vocab_size, bad merges).
 *   - --tokenizer VOCAB.gguf copies the keys, and refuses a vocabulary of
 *     another size.
 */
#include "gguf/gguf.h"
#include "tests/test.h"
#include "tools/convert_tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static ds4_gguf *build(const char *path, uint32_t n_vocab, ds4_status *st, void **mem)
{
    convert_config cfg = {.n_vocab = n_vocab, .bos_id = 0, .eos_id = 1};
    ds4_gguf_writer *w = ds4_gguf_writer_new();
    size_t len = 0;
    *mem = NULL;
    *st = convert_tokenizer_add(w, path, &cfg);
    if (!*st) *st = ds4_gguf_writer_write_memory(w, mem, &len);
    ds4_gguf_writer_free(w);
    return *st ? NULL : ds4_gguf_open_memory(*mem, len);
}

/* Every tokenizer.* key of ref is in got with the same type and value. */
static void compare_tokenizer_keys(const ds4_gguf *ref, const ds4_gguf *got)
{
    int n_ref = 0, n_got = 0;
    for (int64_t k = 0; k < ds4_gguf_n_kv(got); k++) n_got += strncmp(ds4_gguf_key(got, k), "tokenizer.", 10) == 0;
    for (int64_t k = 0; k < ds4_gguf_n_kv(ref); k++) {
        const char *key = ds4_gguf_key(ref, k);
        if (strncmp(key, "tokenizer.", 10) != 0) continue;
        n_ref++;
        int64_t g = ds4_gguf_find_key(got, key);
        EXPECT_MSG(g >= 0, "missing %s", key);
        if (g < 0) continue;
        uint32_t t = ds4_gguf_kv_type(ref, k);
        EXPECT_MSG(ds4_gguf_kv_type(got, g) == t, "%s: type %s, want %s", key, ds4_gguf_vtype_name(ds4_gguf_kv_type(got, g)),
                   ds4_gguf_vtype_name(t));
        if (ds4_gguf_kv_type(got, g) != t) continue;
        if (t == DS4_GGUF_ARRAY) {
            uint64_t n = ds4_gguf_arr_len(ref, k);
            EXPECT_MSG(ds4_gguf_arr_len(got, g) == n && ds4_gguf_arr_type(got, g) == ds4_gguf_arr_type(ref, k),
                       "%s: %llu elements, want %llu", key, (unsigned long long)ds4_gguf_arr_len(got, g),
                       (unsigned long long)n);
            if (ds4_gguf_arr_len(got, g) != n) continue;
            uint64_t diff = 0, first = n;
            for (uint64_t i = 0; i < n; i++) {
                ds4_gguf_value a, b;
                ds4_gguf_arr_elem(ref, k, i, &a);
                ds4_gguf_arr_elem(got, g, i, &b);
                int same = a.type == DS4_GGUF_STRING
                               ? a.v.s.len == b.v.s.len && memcmp(a.v.s.ptr, b.v.s.ptr, a.v.s.len) == 0
                               : a.v.u == b.v.u;
                if (!same && first == n) first = i;
                diff += !same;
            }
            EXPECT_MSG(diff == 0, "%s: %llu elements differ (first at %llu)", key, (unsigned long long)diff,
                       (unsigned long long)first);
        } else {
            ds4_gguf_value a, b;
            ds4_gguf_kv_value(ref, k, &a);
            ds4_gguf_kv_value(got, g, &b);
            if (t == DS4_GGUF_STRING)
                EXPECT_MSG(a.v.s.len == b.v.s.len && memcmp(a.v.s.ptr, b.v.s.ptr, a.v.s.len) == 0, "%s differs", key);
            else if (t == DS4_GGUF_BOOL)
                EXPECT_MSG(a.v.b == b.v.b, "%s differs", key);
            else
                EXPECT_MSG(a.v.u == b.v.u, "%s: %llu, want %llu", key, (unsigned long long)b.v.u,
                           (unsigned long long)a.v.u);
        }
    }
    EXPECT_MSG(n_ref == n_got, "%d tokenizer keys written, reference has %d", n_got, n_ref);
    EXPECT(n_ref >= 10);
}

static void test_dsv4_tokenizer_json_matches_vocab_gguf(void)
{
    const char *json = test_data("tokenizer/dsv4-tokenizer.json");
    if (access(json, R_OK) != 0) {
        test_skip("%s not present", json);
        return;
    }
    ds4_gguf *ref = ds4_gguf_open(test_data("tokenizer/dsv4-vocab.gguf"));
    REQUIRE(ref);
    uint32_t nv = 0;
    REQUIRE(ds4_gguf_get_u32(ref, "deepseek4.vocab_size", &nv) == DS4_OK);
    ds4_status st;
    void *mem;
    ds4_gguf *got = build(test_data("tokenizer/dsv4-tokenizer.json"), nv, &st, &mem);
    EXPECT_MSG(got, "%s", ds4_last_error());
    if (got) compare_tokenizer_keys(ref, got);
    ds4_gguf_close(got);
    free(mem);
    /* copying from the vocab GGUF gives the same keys; another vocab size is refused */
    got = build(test_data("tokenizer/dsv4-vocab.gguf"), nv, &st, &mem);
    EXPECT(got);
    if (got) compare_tokenizer_keys(ref, got);
    ds4_gguf_close(got);
    free(mem);
    got = build(test_data("tokenizer/dsv4-vocab.gguf"), 1024, &st, &mem);
    EXPECT(!got && strstr(ds4_last_error(), "1024"));
    free(mem);
    ds4_gguf_close(ref);
}

static char dir[64];

static const char *write_tmp(const char *name, const char *text)
{
    static char path[4][160];
    static int k;
    k = (k + 1) % 4;
    snprintf(path[k], sizeof path[k], "%s/%s", dir, name);
    FILE *f = fopen(path[k], "wb");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    return path[k];
}

static void test_small_tokenizer(void)
{
    snprintf(dir, sizeof dir, "/tmp/ds4-test-tok-XXXXXX");
    REQUIRE(mkdtemp(dir));
    const char *tj = write_tmp("tokenizer.json",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"\\u0120c\": 3},"
        " \"merges\": [[\"a\", \"b\"], \"\\u0120 c\"]},"
        " \"added_tokens\": [{\"id\": 5, \"content\": \"<think>\", \"special\": false},"
        "                    {\"id\": 6, \"content\": \"<\\uff5cUser\\uff5c>\", \"special\": false},"
        "                    {\"id\": 7, \"content\": \"<s>\", \"special\": true}]}");
    write_tmp("tokenizer_config.json",
              "{\"bos_token\": {\"content\": \"<s>\"}, \"eos_token\": \"<think>\", \"add_bos_token\": true}");
    ds4_status st;
    void *mem;
    ds4_gguf *g = build(tj, 8, &st, &mem);
    EXPECT_MSG(g, "%s", ds4_last_error());
    if (g) {
        int64_t kv;
        uint64_t n;
        REQUIRE(ds4_gguf_get_arr(g, "tokenizer.ggml.tokens", DS4_GGUF_STRING, &kv, &n) == DS4_OK && n == 8);
        const char *want[8] = {"a", "b", "ab", "\xc4\xa0" "c", "[PAD4]", "<think>", "<\xef\xbd\x9cUser\xef\xbd\x9c>", "<s>"};
        for (uint64_t i = 0; i < 8; i++) {
            ds4_gguf_str s = ds4_gguf_arr_str(g, kv, i);
            EXPECT_MSG(s.len == strlen(want[i]) && memcmp(s.ptr, want[i], s.len) == 0, "token %llu", (unsigned long long)i);
        }
        REQUIRE(ds4_gguf_get_arr(g, "tokenizer.ggml.token_type", DS4_GGUF_I32, &kv, &n) == DS4_OK && n == 8);
        const int64_t types[8] = {1, 1, 1, 1, 5, 4, 3, 3};
        for (uint64_t i = 0; i < 8; i++) {
            ds4_gguf_value v;
            ds4_gguf_arr_elem(g, kv, i, &v);
            EXPECT_MSG(v.v.i == types[i], "type of token %llu: %lld, want %lld", (unsigned long long)i, (long long)v.v.i,
                       (long long)types[i]);
        }
        REQUIRE(ds4_gguf_get_arr(g, "tokenizer.ggml.merges", DS4_GGUF_STRING, &kv, &n) == DS4_OK && n == 2);
        ds4_gguf_str m0 = ds4_gguf_arr_str(g, kv, 0), m1 = ds4_gguf_arr_str(g, kv, 1);
        EXPECT(m0.len == 3 && memcmp(m0.ptr, "a b", 3) == 0);
        EXPECT(m1.len == 4 && memcmp(m1.ptr, "\xc4\xa0 c", 4) == 0);
        uint32_t bos = 9, eos = 9, pad = 9;
        bool add_bos = false;
        EXPECT(ds4_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &bos) == DS4_OK && bos == 7);
        EXPECT(ds4_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &eos) == DS4_OK && eos == 5);
        EXPECT(ds4_gguf_get_u32(g, "tokenizer.ggml.padding_token_id", &pad) == DS4_OK && pad == 5);
        EXPECT(ds4_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos) == DS4_OK && add_bos);
    }
    ds4_gguf_close(g);
    free(mem);
    /* vocab larger than the model */
    g = build(tj, 6, &st, &mem);
    EXPECT_MSG(!g && strstr(ds4_last_error(), "User") && strstr(ds4_last_error(), "vocab_size 6"), "%s", ds4_last_error());
    free(mem);
    tj = write_tmp("tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [[\"a\"]]}}");
    g = build(tj, 4, &st, &mem);
    EXPECT(!g && strstr(ds4_last_error(), "merges[0]"));
    free(mem);
    tj = write_tmp("tokenizer.json", "{\"model\": {\"type\": \"Unigram\"}}");
    g = build(tj, 4, &st, &mem);
    EXPECT(!g && strstr(ds4_last_error(), "BPE"));
    free(mem);
    test_remove_dir(dir);
}

int main(void)
{
    RUN(test_dsv4_tokenizer_json_matches_vocab_gguf);
    RUN(test_small_tokenizer);
    return test_finish();
}

/*
 * test_gguf.c - GGUF reader and writer on valid files.
 *
 * Expected values come from outside the code under test: the vocab
 * fixture's documented metadata (tests/data/tokenizer/README.md), a file
 * laid out byte by byte here from the GGUF spec, and values the test
 * itself chose for a synthetic file. Writing back what was read must give
 * the original bytes.
 */
#include "gguf/gguf.h"
#include "quant/blocks.h"
#include "tests/test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define VOCAB "tokenizer/dsv4-vocab.gguf"

static int str_eq(ds4_gguf_str s, const char *want)
{
    return s.ptr && s.len == strlen(want) && memcmp(s.ptr, want, s.len) == 0;
}

static void test_vocab_metadata(void)
{
    ds4_gguf *g = ds4_gguf_open(test_data(VOCAB));
    EXPECT_MSG(g != NULL, "open: %s", ds4_last_error());
    if (!g) return;
    EXPECT(ds4_gguf_version(g) == 3);
    EXPECT(ds4_gguf_n_kv(g) == 14);
    EXPECT(ds4_gguf_n_tensors(g) == 0);
    EXPECT(ds4_gguf_alignment(g) == 32);
    EXPECT(ds4_gguf_data_offset(g) == ds4_gguf_file_size(g));

    ds4_gguf_str s;
    EXPECT(ds4_gguf_get_str(g, "general.architecture", &s) == DS4_OK && str_eq(s, "deepseek4"));
    EXPECT(ds4_gguf_get_str(g, "tokenizer.ggml.model", &s) == DS4_OK && str_eq(s, "gpt2"));
    EXPECT(ds4_gguf_get_str(g, "tokenizer.ggml.pre", &s) == DS4_OK && str_eq(s, "joyai-llm"));
    uint32_t u = 0;
    EXPECT(ds4_gguf_get_u32(g, "deepseek4.vocab_size", &u) == DS4_OK && u == 129280);
    EXPECT(ds4_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &u) == DS4_OK && u == 1);
    uint64_t u64 = 0;
    EXPECT(ds4_gguf_get_uint(g, "deepseek4.vocab_size", &u64) == DS4_OK && u64 == 129280);
    bool b = true;
    EXPECT(ds4_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) == DS4_OK && !b);

    /* Type mismatch and absence are distinct, named errors. */
    EXPECT(ds4_gguf_get_i32(g, "deepseek4.vocab_size", (int32_t *)&u) == DS4_ERR_FORMAT);
    EXPECT(strstr(ds4_last_error(), "deepseek4.vocab_size") && strstr(ds4_last_error(), "u32"));
    EXPECT(ds4_gguf_get_u32(g, "no.such.key", &u) == DS4_ERR_NOT_FOUND);
    EXPECT(strstr(ds4_last_error(), "no.such.key") != NULL);

    int64_t kv = -1;
    uint64_t n = 0;
    EXPECT(ds4_gguf_get_arr(g, "tokenizer.ggml.tokens", DS4_GGUF_STRING, &kv, &n) == DS4_OK);
    EXPECT(n == 129280);
    EXPECT(str_eq(ds4_gguf_arr_str(g, kv, 0), "<｜begin▁of▁sentence｜>"));
    EXPECT(str_eq(ds4_gguf_arr_str(g, kv, 128803), "<｜User｜>"));
    EXPECT(str_eq(ds4_gguf_arr_str(g, kv, 128821), "<think>"));
    EXPECT(str_eq(ds4_gguf_arr_str(g, kv, 129279), "<｜image｜>"));
    EXPECT(ds4_gguf_arr_str(g, kv, 129280).ptr == NULL);
    EXPECT(ds4_gguf_arr_data(g, kv) == NULL);
    ds4_gguf_value v;
    EXPECT(ds4_gguf_arr_elem(g, kv, 1, &v) == DS4_OK && v.type == DS4_GGUF_STRING &&
           str_eq(v.v.s, "<｜end▁of▁sentence｜>"));

    EXPECT(ds4_gguf_get_arr(g, "tokenizer.ggml.token_type", DS4_GGUF_I32, &kv, &n) == DS4_OK);
    EXPECT(n == 129280);
    /* base tokens NORMAL (1), chat tokens CONTROL (3), <think> USER_DEFINED (4) */
    EXPECT(ds4_gguf_arr_elem(g, kv, 1000, &v) == DS4_OK && v.type == DS4_GGUF_I32 && v.v.i == 1);
    EXPECT(ds4_gguf_arr_elem(g, kv, 128803, &v) == DS4_OK && v.v.i == 3);
    EXPECT(ds4_gguf_arr_elem(g, kv, 128821, &v) == DS4_OK && v.v.i == 4);
    EXPECT(ds4_gguf_arr_elem(g, kv, 129280, &v) == DS4_ERR_INVALID);
    EXPECT(ds4_gguf_get_arr(g, "tokenizer.ggml.merges", DS4_GGUF_STRING, &kv, &n) == DS4_OK);
    EXPECT(n == 127741);
    EXPECT(ds4_gguf_get_arr(g, "tokenizer.ggml.merges", DS4_GGUF_I32, &kv, &n) == DS4_ERR_FORMAT);
    ds4_gguf_close(g);
}

static void test_vocab_round_trip(void)
{
    size_t len = 0;
    void *orig = test_read_file(test_data(VOCAB), &len);
    REQUIRE(orig != NULL);
    ds4_gguf *g = ds4_gguf_open_memory(orig, len);
    REQUIRE(g != NULL);
    ds4_gguf_writer *w = ds4_gguf_writer_new();
    for (int64_t i = 0; i < ds4_gguf_n_kv(g); i++)
        EXPECT(ds4_gguf_writer_copy_kv(w, g, i) == DS4_OK);
    EXPECT(ds4_gguf_writer_file_size(w) == len);
    void *out = NULL;
    size_t out_len = 0;
    EXPECT(ds4_gguf_writer_write_memory(w, &out, &out_len) == DS4_OK);
    EXPECT_MSG(out_len == len && memcmp(out, orig, len) == 0, "round trip differs (%zu vs %zu bytes)",
               out_len, len);
    free(out);
    ds4_gguf_writer_free(w);
    ds4_gguf_close(g);
    free(orig);
}

/* A file spelled out from the spec: one u32 KV, one F32 tensor [2]. */
static void test_writer_matches_spec_layout(void)
{
    uint8_t want[128] = {0};
    size_t p = 0;
#define PUT(v, n) do { uint64_t x_ = (v); memcpy(want + p, &x_, n); p += n; } while (0)
    memcpy(want, "GGUF", 4); p = 4;
    PUT(3, 4); PUT(1, 8); PUT(1, 8);          /* version, n_tensors, n_kv */
    PUT(1, 8); want[p++] = 'a'; PUT(4, 4); PUT(7, 4); /* "a": u32 7 */
    PUT(1, 8); want[p++] = 't'; PUT(1, 4); PUT(2, 8); PUT(0, 4); PUT(0, 8);
    EXPECT(p == 74);
    float data[2] = {1.0f, 2.0f};
    memcpy(want + 96, data, 8);
#undef PUT
    ds4_gguf_writer *w = ds4_gguf_writer_new();
    EXPECT(ds4_gguf_writer_add_u32(w, "a", 7) == DS4_OK);
    EXPECT(ds4_gguf_writer_add_tensor(w, "t", DS4_TYPE_F32, 1, (uint64_t[]){2}, data) == DS4_OK);
    EXPECT(ds4_gguf_writer_data_offset(w) == 96);
    EXPECT(ds4_gguf_writer_file_size(w) == 128);
    void *out = NULL;
    size_t n = 0;
    EXPECT(ds4_gguf_writer_write_memory(w, &out, &n) == DS4_OK);
    EXPECT(n == sizeof want && memcmp(out, want, sizeof want) == 0);
    ds4_gguf *g = ds4_gguf_open_memory(want, sizeof want);
    EXPECT_MSG(g != NULL, "%s", ds4_last_error());
    if (g) {
        const ds4_gguf_tensor *t = ds4_gguf_get_tensor(g, "t");
        EXPECT(t && t->n_dims == 1 && t->ne[0] == 2 && t->ne[1] == 1 && t->size == 8 && t->offset == 0);
        EXPECT(t && t->data == want + 96);
        EXPECT(ds4_gguf_get_tensor(g, "u") == NULL && strstr(ds4_last_error(), "'u'"));
        ds4_gguf_close(g);
    }
    free(out);
    ds4_gguf_writer_free(w);
}

/* ---- synthetic file with every KV type and several tensor types ---- */

typedef struct {
    uint32_t type, n_dims;
    uint64_t ne[4];
    uint64_t bytes; /* from the format's block sizes, computed by hand */
} tspec;

static const tspec k_tensors[] = {
    {DS4_TYPE_F32, 2, {3, 5}, 3 * 5 * 4},
    {DS4_TYPE_F16, 1, {7}, 14},
    {DS4_TYPE_BF16, 3, {2, 3, 4}, 48},
    {DS4_TYPE_Q8_0, 2, {64, 3}, 2 * 3 * 34},
    {DS4_TYPE_Q2_K, 2, {256, 2}, 2 * 84},
    {DS4_TYPE_Q4_K, 4, {512, 1, 1, 2}, 4 * 144},
    {DS4_TYPE_IQ2_XXS, 2, {256, 3}, 3 * 66},
    {DS4_TYPE_MXFP4, 3, {32, 2, 2}, 4 * 17},
    {DS4_TYPE_I32, 1, {5}, 20},
    {14 /* Q6_K, not a ds4_type */, 1, {256}, 210},
};
#define N_T (sizeof k_tensors / sizeof k_tensors[0])

static ds4_status fill_pattern(void *ctx, uint64_t off, void *buf, size_t len)
{
    uint8_t seed = (uint8_t)(uintptr_t)ctx;
    for (size_t i = 0; i < len; i++) ((uint8_t *)buf)[i] = (uint8_t)(seed + 7 * (off + i));
    return DS4_OK;
}

static uint8_t *pattern(size_t i)
{
    uint8_t *p = malloc(k_tensors[i].bytes);
    fill_pattern((void *)(uintptr_t)i, 0, p, k_tensors[i].bytes);
    return p;
}

static const char *k_strs[] = {"", "a", "héllo", "<｜User｜>", "x y"};

static void add_all_kvs(ds4_gguf_writer *w)
{
    EXPECT(ds4_gguf_writer_add_u32(w, "general.alignment", 64) == DS4_OK);
    EXPECT(ds4_gguf_writer_add_u8(w, "k.u8", 200) == DS4_OK);
    EXPECT(ds4_gguf_writer_add_i8(w, "k.i8", -100) == DS4_OK);
    EXPECT(ds4_gguf_writer_add_u16(w, "k.u16", 65000) == DS4_OK);
    EXPECT(ds4_gguf_writer_add_i16(w, "k.i16", -30000) == DS4_OK);
    EXPECT(ds4_gguf_writer_add_u32(w, "k.u32", 4000000000u) == DS4_OK);
    EXPECT(ds4_gguf_writer_add_i32(w, "k.i32", -2000000000) == DS4_OK);
    EXPECT(ds4_gguf_writer_add_u64(w, "k.u64", 18000000000000000000ull) == DS4_OK);
    EXPECT(ds4_gguf_writer_add_i64(w, "k.i64", -9000000000000000000ll) == DS4_OK);
    EXPECT(ds4_gguf_writer_add_f32(w, "k.f32", 0.1f) == DS4_OK);
    EXPECT(ds4_gguf_writer_add_f64(w, "k.f64", -1e300) == DS4_OK);
    EXPECT(ds4_gguf_writer_add_bool(w, "k.bool", true) == DS4_OK);
    EXPECT(ds4_gguf_writer_add_str(w, "k.str", "DwarfStar ✓") == DS4_OK);
    EXPECT(ds4_gguf_writer_add_strn(w, "k.empty", "", 0) == DS4_OK);
    int16_t a16[3] = {-1, 0, 32767};
    EXPECT(ds4_gguf_writer_add_arr(w, "a.i16", DS4_GGUF_I16, a16, 3) == DS4_OK);
    float af[4] = {1.5f, -2.25f, 0.0f, 1e-20f};
    EXPECT(ds4_gguf_writer_add_arr(w, "a.f32", DS4_GGUF_F32, af, 4) == DS4_OK);
    uint8_t ab[3] = {1, 0, 1};
    EXPECT(ds4_gguf_writer_add_arr(w, "a.bool", DS4_GGUF_BOOL, ab, 3) == DS4_OK);
    EXPECT(ds4_gguf_writer_add_arr(w, "a.u64.empty", DS4_GGUF_U64, NULL, 0) == DS4_OK);
    EXPECT(ds4_gguf_writer_add_arr_str(w, "a.str", k_strs, NULL, 5) == DS4_OK);
    EXPECT(ds4_gguf_writer_add_arr_str(w, "a.str.empty", NULL, NULL, 0) == DS4_OK);
}

static void check_all_kvs(const ds4_gguf *g)
{
    EXPECT(ds4_gguf_n_kv(g) == 20);
    EXPECT(ds4_gguf_alignment(g) == 64);
    EXPECT(ds4_gguf_data_offset(g) % 64 == 0);
    uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32;
    uint64_t u64; int64_t i64; float f32; double f64; bool b; ds4_gguf_str s;
    EXPECT(ds4_gguf_get_u8(g, "k.u8", &u8) == DS4_OK && u8 == 200);
    EXPECT(ds4_gguf_get_i8(g, "k.i8", &i8) == DS4_OK && i8 == -100);
    EXPECT(ds4_gguf_get_u16(g, "k.u16", &u16) == DS4_OK && u16 == 65000);
    EXPECT(ds4_gguf_get_i16(g, "k.i16", &i16) == DS4_OK && i16 == -30000);
    EXPECT(ds4_gguf_get_u32(g, "k.u32", &u32) == DS4_OK && u32 == 4000000000u);
    EXPECT(ds4_gguf_get_i32(g, "k.i32", &i32) == DS4_OK && i32 == -2000000000);
    EXPECT(ds4_gguf_get_u64(g, "k.u64", &u64) == DS4_OK && u64 == 18000000000000000000ull);
    EXPECT(ds4_gguf_get_i64(g, "k.i64", &i64) == DS4_OK && i64 == -9000000000000000000ll);
    EXPECT(ds4_gguf_get_f32(g, "k.f32", &f32) == DS4_OK && f32 == 0.1f);
    EXPECT(ds4_gguf_get_f64(g, "k.f64", &f64) == DS4_OK && f64 == -1e300);
    EXPECT(ds4_gguf_get_bool(g, "k.bool", &b) == DS4_OK && b);
    EXPECT(ds4_gguf_get_str(g, "k.str", &s) == DS4_OK && str_eq(s, "DwarfStar ✓"));
    EXPECT(ds4_gguf_get_str(g, "k.empty", &s) == DS4_OK && s.len == 0);
    EXPECT(ds4_gguf_get_uint(g, "k.i8", &u64) == DS4_ERR_FORMAT); /* negative */
    EXPECT(ds4_gguf_get_uint(g, "k.u16", &u64) == DS4_OK && u64 == 65000);
    EXPECT(ds4_gguf_get_uint(g, "k.str", &u64) == DS4_ERR_FORMAT);

    int64_t kv; uint64_t n; ds4_gguf_value v;
    EXPECT(ds4_gguf_get_arr(g, "a.i16", DS4_GGUF_I16, &kv, &n) == DS4_OK && n == 3);
    EXPECT(ds4_gguf_arr_elem(g, kv, 0, &v) == DS4_OK && v.v.i == -1);
    EXPECT(ds4_gguf_arr_elem(g, kv, 2, &v) == DS4_OK && v.v.i == 32767);
    EXPECT(ds4_gguf_get_arr(g, "a.f32", DS4_GGUF_F32, &kv, &n) == DS4_OK && n == 4);
    float af[4];
    memcpy(af, ds4_gguf_arr_data(g, kv), sizeof af);
    EXPECT(af[0] == 1.5f && af[1] == -2.25f && af[2] == 0.0f && af[3] == 1e-20f);
    EXPECT(ds4_gguf_arr_elem(g, kv, 1, &v) == DS4_OK && v.v.f == -2.25);
    EXPECT(ds4_gguf_get_arr(g, "a.bool", DS4_GGUF_BOOL, &kv, &n) == DS4_OK && n == 3);
    EXPECT(ds4_gguf_arr_elem(g, kv, 1, &v) == DS4_OK && !v.v.b);
    EXPECT(ds4_gguf_get_arr(g, "a.u64.empty", DS4_GGUF_U64, &kv, &n) == DS4_OK && n == 0);
    EXPECT(ds4_gguf_get_arr(g, "a.str", DS4_GGUF_STRING, &kv, &n) == DS4_OK && n == 5);
    for (uint64_t i = 0; i < 5; i++) EXPECT(str_eq(ds4_gguf_arr_str(g, kv, i), k_strs[i]));
    EXPECT(ds4_gguf_get_arr(g, "a.str.empty", DS4_GGUF_STRING, &kv, &n) == DS4_OK && n == 0);
    EXPECT(ds4_gguf_kv_value(g, kv, &v) == DS4_ERR_INVALID);
    EXPECT(strcmp(ds4_gguf_key(g, 1), "k.u8") == 0); /* file order kept */
    EXPECT(ds4_gguf_find_key(g, "k.u8") == 1);
}

static void check_tensors(const ds4_gguf *g)
{
    REQUIRE(ds4_gguf_n_tensors(g) == (int64_t)N_T);
    uint64_t expect_off = 0;
    for (size_t i = 0; i < N_T; i++) {
        const ds4_gguf_tensor *t = ds4_gguf_tensor_at(g, (int64_t)i);
        char name[32];
        snprintf(name, sizeof name, "blk.%zu.weight", i);
        EXPECT(strcmp(t->name, name) == 0);
        EXPECT(ds4_gguf_find_tensor(g, name) == (int64_t)i);
        EXPECT(t->type == k_tensors[i].type && t->n_dims == k_tensors[i].n_dims);
        for (uint32_t d = 0; d < 4; d++)
            EXPECT(t->ne[d] == (d < t->n_dims ? k_tensors[i].ne[d] : 1));
        EXPECT_MSG(t->size == k_tensors[i].bytes, "%s: size %llu", name, (unsigned long long)t->size);
        EXPECT(t->offset == expect_off);
        expect_off += (k_tensors[i].bytes + 63) / 64 * 64;
        uint8_t *want = pattern(i);
        EXPECT(memcmp(t->data, want, t->size) == 0);
        free(want);
    }
    EXPECT(ds4_gguf_data_offset(g) + expect_off == ds4_gguf_file_size(g));
}

static void test_synthetic_round_trip(void)
{
    uint8_t *data[N_T];
    ds4_gguf_writer *w = ds4_gguf_writer_new();
    add_all_kvs(w);
    for (size_t i = 0; i < N_T; i++) {
        char name[32];
        snprintf(name, sizeof name, "blk.%zu.weight", i);
        data[i] = pattern(i);
        /* odd tensors through the fill callback, even ones by pointer */
        if (i % 2)
            EXPECT(ds4_gguf_writer_add_tensor_fill(w, name, k_tensors[i].type, k_tensors[i].n_dims,
                                                   k_tensors[i].ne, fill_pattern, (void *)(uintptr_t)i) == DS4_OK);
        else
            EXPECT(ds4_gguf_writer_add_tensor(w, name, k_tensors[i].type, k_tensors[i].n_dims,
                                              k_tensors[i].ne, data[i]) == DS4_OK);
    }
    void *buf = NULL;
    size_t len = 0;
    EXPECT(ds4_gguf_writer_write_memory(w, &buf, &len) == DS4_OK);
    EXPECT(len == ds4_gguf_writer_file_size(w));
    ds4_gguf *g = ds4_gguf_open_memory(buf, len);
    EXPECT_MSG(g != NULL, "%s", ds4_last_error());
    if (g) {
        check_all_kvs(g);
        check_tensors(g);
        /* Copy everything through a second writer, to a real file, streamed. */
        ds4_gguf_writer *w2 = ds4_gguf_writer_new();
        for (int64_t i = 0; i < ds4_gguf_n_kv(g); i++) EXPECT(ds4_gguf_writer_copy_kv(w2, g, i) == DS4_OK);
        for (int64_t i = 0; i < ds4_gguf_n_tensors(g); i++) {
            const ds4_gguf_tensor *t = ds4_gguf_tensor_at(g, i);
            EXPECT(ds4_gguf_writer_add_tensor(w2, t->name, t->type, t->n_dims, t->ne, NULL) == DS4_OK);
        }
        char path[] = "/tmp/ds4_test_gguf_XXXXXX";
        int fd = mkstemp(path);
        REQUIRE(fd >= 0);
        close(fd);
        EXPECT(ds4_gguf_writer_begin(w2, path) == DS4_OK);
        EXPECT(ds4_gguf_writer_add_u8(w2, "late", 1) == DS4_ERR_INVALID);
        for (int64_t i = 0; i < ds4_gguf_n_tensors(g); i++) {
            const ds4_gguf_tensor *t = ds4_gguf_tensor_at(g, i);
            /* in odd-sized chunks, to cross tensor boundaries */
            for (uint64_t off = 0; off < t->size; off += 5) {
                size_t k = t->size - off < 5 ? (size_t)(t->size - off) : 5;
                EXPECT(ds4_gguf_writer_append(w2, (const uint8_t *)t->data + off, k) == DS4_OK);
            }
        }
        EXPECT(ds4_gguf_writer_append(w2, "x", 1) == DS4_ERR_INVALID);
        EXPECT(ds4_gguf_writer_finish(w2) == DS4_OK);
        size_t len2 = 0;
        void *file = test_read_file(path, &len2);
        EXPECT(file && len2 == len && memcmp(file, buf, len) == 0);
        free(file);
        ds4_gguf *g2 = ds4_gguf_open(path);
        EXPECT_MSG(g2 != NULL, "%s", ds4_last_error());
        if (g2) {
            check_all_kvs(g2);
            check_tensors(g2);
            ds4_gguf_close(g2);
        }
        unlink(path);
        ds4_gguf_writer_free(w2);
        ds4_gguf_close(g);
    }
    free(buf);
    for (size_t i = 0; i < N_T; i++) free(data[i]);
    ds4_gguf_writer_free(w);
}

static void test_writer_rejects_bad_input(void)
{
    ds4_gguf_writer *w = ds4_gguf_writer_new();
    EXPECT(ds4_gguf_writer_add_u32(w, "x", 1) == DS4_OK);
    EXPECT(ds4_gguf_writer_add_u32(w, "x", 2) == DS4_ERR_INVALID);
    EXPECT(strstr(ds4_last_error(), "duplicate key 'x'") != NULL);
    EXPECT(ds4_gguf_writer_add_u32(w, "", 2) == DS4_ERR_INVALID);
    EXPECT(ds4_gguf_writer_add_u32(w, "bad\xff", 2) == DS4_ERR_INVALID);
    EXPECT(ds4_gguf_writer_add_u32(w, "general.alignment", 48) == DS4_ERR_INVALID);
    EXPECT(ds4_gguf_writer_add_u64(w, "general.alignment", 64) == DS4_ERR_INVALID);
    uint8_t two = 2;
    EXPECT(ds4_gguf_writer_add_arr(w, "b", DS4_GGUF_BOOL, &two, 1) == DS4_ERR_INVALID);
    EXPECT(ds4_gguf_writer_add_arr(w, "s", DS4_GGUF_STRING, &two, 1) == DS4_ERR_INVALID);
    uint64_t ne[2] = {33, 1};
    EXPECT(ds4_gguf_writer_add_tensor(w, "q", DS4_TYPE_Q8_0, 2, ne, NULL) == DS4_ERR_INVALID);
    EXPECT(strstr(ds4_last_error(), "block size") != NULL);
    EXPECT(ds4_gguf_writer_add_tensor(w, "q", 4, 2, ne, NULL) == DS4_ERR_INVALID); /* removed id */
    EXPECT(ds4_gguf_writer_add_tensor(w, "q", DS4_TYPE_F32, 0, ne, NULL) == DS4_ERR_INVALID);
    EXPECT(ds4_gguf_writer_add_tensor(w, "q", DS4_TYPE_F32, 5, ne, NULL) == DS4_ERR_INVALID);
    ne[1] = 0;
    EXPECT(ds4_gguf_writer_add_tensor(w, "q", DS4_TYPE_F32, 2, ne, NULL) == DS4_ERR_INVALID);
    ne[1] = 1;
    EXPECT(ds4_gguf_writer_add_tensor(w, "q", DS4_TYPE_F32, 2, ne, NULL) == DS4_OK);
    char long_name[65];
    memset(long_name, 'n', 64);
    long_name[64] = '\0';
    EXPECT(ds4_gguf_writer_add_tensor(w, long_name, DS4_TYPE_F32, 2, ne, NULL) == DS4_ERR_INVALID);
    long_name[63] = '\0';
    EXPECT(ds4_gguf_writer_add_tensor(w, long_name, DS4_TYPE_F32, 2, ne, NULL) == DS4_OK);
    EXPECT(ds4_gguf_writer_add_tensor(w, "q", DS4_TYPE_F32, 2, ne, NULL) == DS4_ERR_INVALID);
    /* no data and no callback: writing fails, and leaves no file behind */
    EXPECT(ds4_gguf_writer_write(w, "/tmp/ds4_test_gguf_nodata.gguf") == DS4_ERR_INVALID);
    EXPECT(access("/tmp/ds4_test_gguf_nodata.gguf", F_OK) != 0);
    EXPECT(access("/tmp/ds4_test_gguf_nodata.gguf.tmp", F_OK) != 0);
    ds4_gguf_writer_free(w);
}

static void test_open_errors(void)
{
    EXPECT(ds4_gguf_open("tests/data/no-such-file.gguf") == NULL);
    EXPECT(strstr(ds4_last_error(), "no-such-file.gguf") && strstr(ds4_last_error(), "cannot open"));
    EXPECT(ds4_gguf_open("tests/data") == NULL);
    EXPECT(strstr(ds4_last_error(), "not a regular file") != NULL);
    EXPECT(ds4_gguf_open_memory(NULL, 0) == NULL);
    EXPECT(strstr(ds4_last_error(), "<memory>") && strstr(ds4_last_error(), "truncated"));
}

static void test_type_table(void)
{
    /* Block layouts of the types the engine uses, from quant/blocks.h. */
    EXPECT(ds4_gguf_type_info_of(DS4_TYPE_Q8_0)->block_bytes == sizeof(block_q8_0));
    EXPECT(ds4_gguf_type_info_of(DS4_TYPE_Q2_K)->block_bytes == sizeof(block_q2_K));
    EXPECT(ds4_gguf_type_info_of(DS4_TYPE_Q4_K)->block_bytes == sizeof(block_q4_K));
    EXPECT(ds4_gguf_type_info_of(DS4_TYPE_Q8_K)->block_bytes == sizeof(block_q8_K));
    EXPECT(ds4_gguf_type_info_of(DS4_TYPE_IQ2_XXS)->block_bytes == sizeof(block_iq2_xxs));
    EXPECT(ds4_gguf_type_info_of(DS4_TYPE_MXFP4)->block_bytes == sizeof(block_mxfp4));
    EXPECT(ds4_gguf_type_info_of(DS4_TYPE_Q2_K)->block_elems == QK_K);
    EXPECT(strcmp(ds4_gguf_type_name(DS4_TYPE_IQ2_XXS), "IQ2_XXS") == 0);
    EXPECT(ds4_gguf_type_info_of(4) == NULL && ds4_gguf_type_info_of(31) == NULL);
    EXPECT(ds4_gguf_type_info_of(1000) == NULL);
    uint64_t n, ne[2] = {1ull << 62, 4};
    EXPECT(ds4_gguf_tensor_nbytes(DS4_TYPE_F32, 2, ne, &n) == DS4_ERR_FORMAT);
    EXPECT(strstr(ds4_last_error(), "overflow") != NULL);
}

int main(void)
{
    RUN(test_vocab_metadata);
    RUN(test_vocab_round_trip);
    RUN(test_writer_matches_spec_layout);
    RUN(test_synthetic_round_trip);
    RUN(test_writer_rejects_bad_input);
    RUN(test_open_errors);
    RUN(test_type_table);
    return test_finish();
}

/*
 * test_gguf_malformed.c - the GGUF reader on broken input.
 *
 * Two halves. Crafted cases: files built byte by byte here (not with the
 * writer, so they can break any rule), each one broken in one way, must be
 * refused with a message naming the cause and a byte offset. Mutations: a
 * small valid file truncated at every length (each must be refused), then
 * a few hundred deterministic corruptions (bit flips, 0x00/0xFF bytes,
 * huge lengths written over fields) that must never crash; whatever the
 * reader accepts is walked completely (every value, array element and
 * tensor byte) so ASan would see an out-of-bounds read.
 */
#include "gguf/gguf.h"
#include "quant/blocks.h"
#include "tests/test.h"

#include <stdlib.h>
#include <string.h>

/* ---- a raw byte builder ---- */

typedef struct {
    uint8_t p[4096];
    size_t n;
} bb;

static void b_raw(bb *b, const void *p, size_t n)
{
    if (b->n + n > sizeof b->p) abort(); /* test bug, not reader bug */
    memcpy(b->p + b->n, p, n);
    b->n += n;
}
static void b_u32(bb *b, uint32_t v) { b_raw(b, &v, 4); }
static void b_u64(bb *b, uint64_t v) { b_raw(b, &v, 8); }
static void b_str(bb *b, const char *s) { b_u64(b, strlen(s)); b_raw(b, s, strlen(s)); }
static void b_pad(bb *b, size_t a) { while (b->n % a) b->p[b->n++] = 0; }
static void b_head(bb *b, uint64_t nt, uint64_t nkv)
{
    b->n = 0;
    b_raw(b, "GGUF", 4);
    b_u32(b, 3);
    b_u64(b, nt);
    b_u64(b, nkv);
}
static void b_kv_u32(bb *b, const char *k, uint32_t v) { b_str(b, k); b_u32(b, DS4_GGUF_U32); b_u32(b, v); }
static void b_tinfo(bb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t off)
{
    b_str(b, name);
    b_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) b_u64(b, ne[d]);
    b_u32(b, type);
    b_u64(b, off);
}
/* Pad to 32 and append `n` data bytes. */
static void b_data(bb *b, size_t n)
{
    b_pad(b, 32);
    for (size_t i = 0; i < n; i++) b->p[b->n++] = (uint8_t)i;
}

static int g_cases;

#define EXPECT_REJECT(b, ...) expect_reject(__LINE__, (b), (const char *[]){__VA_ARGS__, NULL})

static void expect_reject(int line, const bb *b, const char **wants)
{
    g_cases++;
    ds4_gguf *g = ds4_gguf_open_memory(b->p, b->n);
    if (g) {
        test_fail_at(__FILE__, line, "malformed file accepted");
        ds4_gguf_close(g);
        return;
    }
    const char *msg = ds4_last_error();
    if (!strstr(msg, "offset")) test_fail_at(__FILE__, line, "no offset in: %s", msg);
    for (const char **w = wants; *w; w++)
        if (!strstr(msg, *w)) test_fail_at(__FILE__, line, "'%s' not in: %s", *w, msg);
}

static void test_header_errors(void)
{
    bb b;
    b.n = 0;
    EXPECT_REJECT(&b, "truncated", "magic", "offset 0");
    b_raw(&b, "GGU", 3);
    EXPECT_REJECT(&b, "truncated", "magic");
    b.n = 0;
    b_raw(&b, "GGML", 4);
    b_u32(&b, 3);
    EXPECT_REJECT(&b, "bad magic", "not a GGUF file");
    b_head(&b, 0, 0);
    b.n = 8;
    EXPECT_REJECT(&b, "truncated", "tensor count", "offset 8");
    b.p[4] = 2;
    EXPECT_REJECT(&b, "version 2", "offset 4");
    b.p[4] = 0;
    b.p[7] = 3; /* a big-endian writer's 3 */
    EXPECT_REJECT(&b, "version 50331648");
    b_head(&b, 0, 1000000);
    EXPECT_REJECT(&b, "kv count 1000000", "too large", "offset 16");
    b_head(&b, UINT64_MAX, 0);
    EXPECT_REJECT(&b, "tensor count 18446744073709551615", "too large");
    b_head(&b, 0, UINT64_MAX);
    EXPECT_REJECT(&b, "kv count", "too large");
    b_head(&b, 1u << 20, 1u << 20);
    for (int i = 0; i < 100; i++) b_u64(&b, 0);
    EXPECT_REJECT(&b, "too large");
}

static void test_key_errors(void)
{
    bb b;
    b_head(&b, 0, 1);
    b_u64(&b, UINT64_MAX);
    b_u32(&b, 4);
    b_u32(&b, 1);
    EXPECT_REJECT(&b, "key length 18446744073709551615", "offset 24");
    b_head(&b, 0, 1);
    b_u64(&b, 100); /* key longer than the file */
    b_raw(&b, "abcdef", 6);
    EXPECT_REJECT(&b, "truncated", "key", "offset 32");
    b_head(&b, 0, 1);
    b_kv_u32(&b, "", 1);
    EXPECT_REJECT(&b, "empty key", "offset 24");
    b_head(&b, 0, 1);
    b_kv_u32(&b, "bad\xc3\x28key", 1);
    EXPECT_REJECT(&b, "UTF-8", "offset 35");
    b_head(&b, 0, 1);
    b_kv_u32(&b, "overlong\xc0\xafkey", 1);
    EXPECT_REJECT(&b, "UTF-8");
    b_head(&b, 0, 1);
    b_u64(&b, 3);
    b_raw(&b, "a\0b", 3);
    b_u32(&b, 4);
    b_u32(&b, 1);
    EXPECT_REJECT(&b, "NUL", "offset 33");
    b_head(&b, 0, 2);
    b_kv_u32(&b, "same", 1);
    b_kv_u32(&b, "same", 2);
    EXPECT_REJECT(&b, "duplicate key 'same'", "offset 44", "first at offset 24");
}

static void test_value_errors(void)
{
    bb b;
    b_head(&b, 0, 1);
    b_str(&b, "k");
    b_u32(&b, 13);
    b_u32(&b, 0);
    EXPECT_REJECT(&b, "bad value type id 13", "'k'", "offset 33");
    b_head(&b, 0, 1);
    b_str(&b, "k");
    b_u32(&b, 0xffffffffu);
    b_u32(&b, 0);
    EXPECT_REJECT(&b, "bad value type id 4294967295");
    b_head(&b, 0, 1);
    b_str(&b, "k");
    b_u32(&b, DS4_GGUF_U64);
    b_u32(&b, 7); /* 4 of the 8 bytes */
    EXPECT_REJECT(&b, "truncated", "u64", "'k'", "offset 37");
    b_head(&b, 0, 1);
    b_str(&b, "k");
    b_u32(&b, DS4_GGUF_BOOL);
    b_raw(&b, "\x02", 1);
    EXPECT_REJECT(&b, "bool", "not 0 or 1", "offset 37");
    b_head(&b, 0, 1);
    b_str(&b, "k");
    b_u32(&b, DS4_GGUF_STRING);
    b_u64(&b, 1ull << 40);
    b_raw(&b, "abc", 3);
    EXPECT_REJECT(&b, "truncated", "string", "length 1099511627776", "offset 37");
    b_head(&b, 0, 1);
    b_str(&b, "k");
    b_u32(&b, DS4_GGUF_ARRAY);
    b_u32(&b, 99);
    b_u64(&b, 0);
    EXPECT_REJECT(&b, "bad array element type id 99", "offset 37");
    b_head(&b, 0, 1);
    b_str(&b, "k");
    b_u32(&b, DS4_GGUF_ARRAY);
    b_u32(&b, DS4_GGUF_ARRAY);
    b_u64(&b, 0);
    EXPECT_REJECT(&b, "nested array", "offset 37");
    b_head(&b, 0, 1);
    b_str(&b, "k");
    b_u32(&b, DS4_GGUF_ARRAY);
    b_u32(&b, DS4_GGUF_U32);
    b_u64(&b, UINT64_MAX / 2);
    b_u32(&b, 1);
    EXPECT_REJECT(&b, "truncated", "array", "9223372036854775807", "offset 41");
    b_head(&b, 0, 1);
    b_str(&b, "k");
    b_u32(&b, DS4_GGUF_ARRAY);
    b_u32(&b, DS4_GGUF_STRING);
    b_u64(&b, 3);
    b_str(&b, "x");
    b_u64(&b, 5000); /* second string runs past the end */
    b_str(&b, "zz");
    EXPECT_REJECT(&b, "element 1", "truncated", "string", "offset 58");
    b_head(&b, 0, 1);
    b_str(&b, "k");
    b_u32(&b, DS4_GGUF_ARRAY);
    b_u32(&b, DS4_GGUF_BOOL);
    b_u64(&b, 3);
    b_raw(&b, "\x01\x00\xff", 3);
    EXPECT_REJECT(&b, "bool value 255", "offset 51");
}

static void test_alignment_errors(void)
{
    bb b;
    b_head(&b, 0, 1);
    b_kv_u32(&b, "general.alignment", 48);
    EXPECT_REJECT(&b, "alignment 48", "power of two", "offset 24");
    b_head(&b, 0, 1);
    b_kv_u32(&b, "general.alignment", 0);
    EXPECT_REJECT(&b, "alignment 0", "power of two");
    b_head(&b, 0, 1);
    b_str(&b, "general.alignment");
    b_u32(&b, DS4_GGUF_U64);
    b_u64(&b, 32);
    EXPECT_REJECT(&b, "general.alignment", "u64", "want u32");
}

static void test_tensor_errors(void)
{
    bb b;
    uint64_t ne[4] = {8, 2, 1, 1};
    b_head(&b, 1, 0);
    b_tinfo(&b, "t", 0, ne, DS4_TYPE_F32, 0);
    b_data(&b, 64);
    EXPECT_REJECT(&b, "tensor 't'", "n_dims 0", "offset 33");
    b_head(&b, 1, 0);
    b_tinfo(&b, "t", 5, (uint64_t[]){1, 1, 1, 1, 1}, DS4_TYPE_F32, 0);
    b_data(&b, 64);
    EXPECT_REJECT(&b, "n_dims 5");
    b_head(&b, 1, 0);
    b_tinfo(&b, "t", 2, (uint64_t[]){8, 0}, DS4_TYPE_F32, 0);
    b_data(&b, 64);
    EXPECT_REJECT(&b, "tensor 't'", "dim 1 is 0", "offset 37");
    b_head(&b, 1, 0);
    b_tinfo(&b, "t", 3, (uint64_t[]){1ull << 32, 1ull << 32, 4}, DS4_TYPE_F32, 0);
    b_data(&b, 64);
    EXPECT_REJECT(&b, "tensor 't'", "overflow");
    b_head(&b, 1, 0);
    b_tinfo(&b, "t", 2, (uint64_t[]){1ull << 61, 2}, 28 /* F64 */, 0);
    b_data(&b, 64);
    EXPECT_REJECT(&b, "tensor 't'", "overflow");
    b_head(&b, 1, 0);
    b_tinfo(&b, "t", 1, (uint64_t[]){40}, DS4_TYPE_Q8_0, 0);
    b_data(&b, 64);
    EXPECT_REJECT(&b, "tensor 't'", "ne[0] = 40", "block size 32");
    b_head(&b, 1, 0);
    b_tinfo(&b, "t", 2, ne, 4 /* Q4_2, removed */, 0);
    b_data(&b, 64);
    EXPECT_REJECT(&b, "tensor 't'", "bad ggml type id 4", "offset 53");
    b_head(&b, 1, 0);
    b_tinfo(&b, "t", 2, ne, 1000, 0);
    b_data(&b, 64);
    EXPECT_REJECT(&b, "bad ggml type id 1000");
    b_head(&b, 1, 0);
    b_tinfo(&b, "t", 2, ne, DS4_TYPE_F32, 16);
    b_data(&b, 128);
    EXPECT_REJECT(&b, "misaligned", "tensor 't'", "offset 16", "alignment 32", "offset 24");
    b_head(&b, 1, 0);
    b_tinfo(&b, "t", 2, ne, DS4_TYPE_F32, 32);
    b_data(&b, 64); /* 64-byte tensor at 32 needs 96 */
    EXPECT_REJECT(&b, "out of range", "tensor 't'", "[32, +64)", "offset 96", "has 64 bytes");
    b_head(&b, 1, 0);
    b_tinfo(&b, "t", 2, ne, DS4_TYPE_F32, UINT64_MAX - 31);
    b_data(&b, 64);
    EXPECT_REJECT(&b, "out of range", "tensor 't'");
    b_head(&b, 2, 0);
    b_tinfo(&b, "a", 2, ne, DS4_TYPE_F32, 0);
    b_tinfo(&b, "b", 2, ne, DS4_TYPE_F32, 32); /* a is 64 bytes */
    b_data(&b, 128);
    EXPECT_REJECT(&b, "overlap", "'a' [0, 64)", "'b' [32, 96)");
    b_head(&b, 2, 0);
    b_tinfo(&b, "a", 2, ne, DS4_TYPE_F32, 0);
    b_tinfo(&b, "a", 2, ne, DS4_TYPE_F32, 64);
    b_data(&b, 128);
    EXPECT_REJECT(&b, "duplicate tensor name 'a'", "offset 65", "first at offset 24");
    b_head(&b, 1, 0);
    b_tinfo(&b, "\xff", 2, ne, DS4_TYPE_F32, 0);
    b_data(&b, 64);
    EXPECT_REJECT(&b, "tensor name", "UTF-8", "offset 32");
    b_head(&b, 1, 0);
    b_tinfo(&b, "t", 2, ne, DS4_TYPE_F32, 0);
    EXPECT_REJECT(&b, "truncated", "data section", "offset 96"); /* no padding, no data */
    b_head(&b, 1, 0);
    b_tinfo(&b, "t", 2, ne, DS4_TYPE_F32, 0);
    b.n -= 3;
    EXPECT_REJECT(&b, "truncated", "tensor offset", "offset 57");
}

/* A valid file of the same shape, accepted: guards the crafted cases
 * against being rejected for a reason other than the one named. */
static void test_crafted_valid(void)
{
    bb b;
    uint64_t ne[2] = {8, 2};
    b_head(&b, 2, 2);
    b_kv_u32(&b, "general.alignment", 32);
    b_str(&b, "s");
    b_u32(&b, DS4_GGUF_ARRAY);
    b_u32(&b, DS4_GGUF_STRING);
    b_u64(&b, 2);
    b_str(&b, "x");
    b_str(&b, "");
    b_tinfo(&b, "b", 2, ne, DS4_TYPE_F32, 64); /* out of order: fine */
    b_tinfo(&b, "a", 2, ne, DS4_TYPE_F32, 0);
    b_data(&b, 128);
    ds4_gguf *g = ds4_gguf_open_memory(b.p, b.n);
    EXPECT_MSG(g != NULL, "%s", ds4_last_error());
    if (!g) return;
    EXPECT(ds4_gguf_find_tensor(g, "a") == 1 && ds4_gguf_find_tensor(g, "b") == 0);
    EXPECT(ds4_gguf_get_tensor(g, "a")->data == b.p + ds4_gguf_data_offset(g));
    ds4_gguf_close(g);
}

/* ---- mutations ---- */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

/* Touch everything an accepted file exposes. */
static uint64_t walk(const ds4_gguf *g)
{
    uint64_t h = 0;
    ds4_gguf_value v;
    for (int64_t i = 0; i < ds4_gguf_n_kv(g); i++) {
        h += strlen(ds4_gguf_key(g, i));
        if (ds4_gguf_kv_type(g, i) != DS4_GGUF_ARRAY) {
            if (ds4_gguf_kv_value(g, i, &v) == DS4_OK && v.type == DS4_GGUF_STRING)
                for (uint64_t j = 0; j < v.v.s.len; j++) h += (uint8_t)v.v.s.ptr[j];
            continue;
        }
        for (uint64_t j = 0; j < ds4_gguf_arr_len(g, i); j++) {
            if (ds4_gguf_arr_elem(g, i, j, &v) != DS4_OK) continue;
            if (v.type == DS4_GGUF_STRING)
                for (uint64_t k = 0; k < v.v.s.len; k++) h += (uint8_t)v.v.s.ptr[k];
            else
                h += v.v.u;
        }
    }
    for (int64_t i = 0; i < ds4_gguf_n_tensors(g); i++) {
        const ds4_gguf_tensor *t = ds4_gguf_tensor_at(g, i);
        for (uint64_t j = 0; j < t->size; j++) h += ((const uint8_t *)t->data)[j];
        h += (uint64_t)ds4_gguf_find_tensor(g, t->name);
    }
    return h;
}

/* A small valid file from the writer; the last tensor's size is a multiple
 * of the alignment so that every truncation removes needed bytes. */
static void *base_file(size_t *len)
{
    static float f[2 * 8];
    static block_q8_0 q[2];
    static float last[8];
    ds4_gguf_writer *w = ds4_gguf_writer_new();
    const char *toks[] = {"a", "bc", "<｜User｜>"};
    int32_t tt[3] = {1, 3, 4};
    ds4_gguf_writer_add_str(w, "general.architecture", "deepseek4");
    ds4_gguf_writer_add_u32(w, "general.alignment", 32);
    ds4_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 3);
    ds4_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", DS4_GGUF_I32, tt, 3);
    ds4_gguf_writer_add_bool(w, "b", true);
    ds4_gguf_writer_add_f64(w, "d", 2.5);
    ds4_gguf_writer_add_tensor(w, "f", DS4_TYPE_F32, 2, (uint64_t[]){8, 2}, f);
    ds4_gguf_writer_add_tensor(w, "q", DS4_TYPE_Q8_0, 2, (uint64_t[]){32, 2}, q);
    ds4_gguf_writer_add_tensor(w, "z", DS4_TYPE_F32, 1, (uint64_t[]){8}, last);
    void *out = NULL;
    if (ds4_gguf_writer_write_memory(w, &out, len) != DS4_OK) out = NULL;
    ds4_gguf_writer_free(w);
    return out;
}

static void test_truncation_at_every_length(void)
{
    size_t len;
    uint8_t *full = base_file(&len);
    REQUIRE(full != NULL);
    ds4_gguf *g = ds4_gguf_open_memory(full, len);
    REQUIRE(g != NULL);
    ds4_gguf_close(g);
    int bad = 0;
    for (size_t n = 0; n < len; n++) {
        uint8_t *cut = malloc(n ? n : 1); /* exact size: ASan sees any overread */
        memcpy(cut, full, n);
        g = ds4_gguf_open_memory(cut, n);
        if (g) {
            if (bad++ < 3) test_fail_at(__FILE__, __LINE__, "truncated to %zu of %zu bytes accepted", n, len);
            ds4_gguf_close(g);
        } else if (!strstr(ds4_last_error(), "truncated") && !strstr(ds4_last_error(), "out of range") &&
                   !strstr(ds4_last_error(), "too large")) {
            if (bad++ < 3) test_fail_at(__FILE__, __LINE__, "cut at %zu: %s", n, ds4_last_error());
        }
        free(cut);
    }
    EXPECT(len > 300);
    free(full);
}

static void mutate_and_open(const uint8_t *full, size_t len, int kind, uint64_t *accepted)
{
    uint8_t *m = malloc(len);
    memcpy(m, full, len);
    /* the metadata area is where the reader's decisions are made */
    size_t span = len / 2;
    switch (kind) {
    case 0: /* 1..4 bit flips */
        for (int k = (int)(rnd() % 4); k >= 0; k--) m[rnd() % span] ^= (uint8_t)(1u << (rnd() % 8));
        break;
    case 1: /* 0xFF or 0x00 bytes */
        for (int k = (int)(rnd() % 3); k >= 0; k--) m[rnd() % span] = (rnd() & 1) ? 0xff : 0x00;
        break;
    default: { /* a huge or boundary length over any 8 bytes */
        static const uint64_t big[] = {UINT64_MAX, 1ull << 63, 1ull << 40, 0x7fffffffull, 0xffffffffull,
                                       65536, 4096, 1};
        uint64_t v = big[rnd() % (sizeof big / sizeof big[0])];
        size_t at = (size_t)(rnd() % (span - 8));
        memcpy(m + at, &v, 8);
        break;
    }
    }
    ds4_gguf *g = ds4_gguf_open_memory(m, len);
    if (g) {
        (*accepted)++;
        walk(g);
        ds4_gguf_close(g);
    } else {
        EXPECT_MSG(ds4_last_error()[0] != '\0', "rejected without a message");
    }
    free(m);
}

static void test_mutations(void)
{
    size_t len;
    uint8_t *full = base_file(&len);
    REQUIRE(full != NULL);
    uint64_t accepted = 0;
    int n = 0;
    for (int kind = 0; kind < 3; kind++)
        for (int i = 0; i < 200; i++, n++) mutate_and_open(full, len, kind, &accepted);
    /* 0xFF at every metadata byte, one at a time */
    uint64_t data_off;
    {
        ds4_gguf *g = ds4_gguf_open_memory(full, len);
        REQUIRE(g != NULL);
        data_off = ds4_gguf_data_offset(g);
        ds4_gguf_close(g);
    }
    for (size_t at = 0; at < data_off; at++, n++) {
        uint8_t *m = malloc(len);
        memcpy(m, full, len);
        m[at] = 0xff;
        ds4_gguf *g = ds4_gguf_open_memory(m, len);
        if (g) {
            accepted++;
            walk(g);
            ds4_gguf_close(g);
        }
        free(m);
    }
    printf("  %d mutated files, %llu accepted (and walked), %d crafted cases\n", n,
           (unsigned long long)accepted, g_cases);
    EXPECT(n >= 600);
    free(full);
}

int main(void)
{
    RUN(test_header_errors);
    RUN(test_key_errors);
    RUN(test_value_errors);
    RUN(test_alignment_errors);
    RUN(test_tensor_errors);
    RUN(test_crafted_valid);
    RUN(test_truncation_at_every_length);
    RUN(test_mutations);
    return test_finish();
}

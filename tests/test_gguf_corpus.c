/*
 * test_gguf_corpus.c - the fuzzer's seed files (fuzz/corpus/gguf/).
 *
 * The seeds are tiny valid GGUF files made here with the writer, each
 * covering part of the format (empty file, every scalar type, arrays,
 * tensors of several types and alignments). The test makes them, checks
 * that the reader accepts each, and that the committed copies are exactly
 * these bytes. DS4_WRITE_CORPUS=DIR writes them to DIR (how the committed
 * copies were made).
 */
#include "gguf/gguf.h"
#include "quant/blocks.h"
#include "tests/test.h"

#include <stdlib.h>
#include <string.h>

typedef void (*seed_fn)(ds4_gguf_writer *w);

static void seed_empty(ds4_gguf_writer *w) { (void)w; }

static void seed_scalars(ds4_gguf_writer *w)
{
    ds4_gguf_writer_add_u8(w, "u8", 1);
    ds4_gguf_writer_add_i8(w, "i8", -1);
    ds4_gguf_writer_add_u16(w, "u16", 2);
    ds4_gguf_writer_add_i16(w, "i16", -2);
    ds4_gguf_writer_add_u32(w, "u32", 3);
    ds4_gguf_writer_add_i32(w, "i32", -3);
    ds4_gguf_writer_add_u64(w, "u64", 4);
    ds4_gguf_writer_add_i64(w, "i64", -4);
    ds4_gguf_writer_add_f32(w, "f32", 0.5f);
    ds4_gguf_writer_add_f64(w, "f64", 0.25);
    ds4_gguf_writer_add_bool(w, "bool", true);
    ds4_gguf_writer_add_str(w, "str", "héllo");
}

static void seed_arrays(ds4_gguf_writer *w)
{
    const char *s[] = {"a", "", "<｜User｜>", "Ġthe"};
    int32_t i[3] = {1, 3, 4};
    float f[2] = {0.5f, -1.0f};
    uint8_t b[2] = {0, 1};
    ds4_gguf_writer_add_str(w, "general.architecture", "deepseek4");
    ds4_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", s, NULL, 4);
    ds4_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", DS4_GGUF_I32, i, 3);
    ds4_gguf_writer_add_arr(w, "f", DS4_GGUF_F32, f, 2);
    ds4_gguf_writer_add_arr(w, "b", DS4_GGUF_BOOL, b, 2);
    ds4_gguf_writer_add_arr(w, "e", DS4_GGUF_U64, NULL, 0);
}

static uint8_t g_bytes[4096];

static void seed_tensors(ds4_gguf_writer *w)
{
    ds4_gguf_writer_add_u32(w, "general.alignment", 32);
    ds4_gguf_writer_add_tensor(w, "f32", DS4_TYPE_F32, 2, (uint64_t[]){4, 2}, g_bytes);
    ds4_gguf_writer_add_tensor(w, "q8", DS4_TYPE_Q8_0, 1, (uint64_t[]){32}, g_bytes);
    ds4_gguf_writer_add_tensor(w, "bf16", DS4_TYPE_BF16, 3, (uint64_t[]){2, 1, 3}, g_bytes);
}

static void seed_quant_tensors(ds4_gguf_writer *w)
{
    ds4_gguf_writer_add_u32(w, "general.alignment", 64);
    ds4_gguf_writer_add_str(w, "general.name", "seed");
    ds4_gguf_writer_add_tensor(w, "blk.0.q2k", DS4_TYPE_Q2_K, 2, (uint64_t[]){256, 1}, g_bytes);
    ds4_gguf_writer_add_tensor(w, "blk.0.iq2", DS4_TYPE_IQ2_XXS, 1, (uint64_t[]){256}, g_bytes);
    ds4_gguf_writer_add_tensor(w, "blk.0.mx", DS4_TYPE_MXFP4, 4, (uint64_t[]){32, 1, 1, 2}, g_bytes);
    ds4_gguf_writer_add_tensor(w, "blk.0.i32", DS4_TYPE_I32, 1, (uint64_t[]){3}, g_bytes);
}

static const struct {
    const char *name;
    seed_fn fn;
} k_seeds[] = {
    {"empty.gguf", seed_empty},
    {"scalars.gguf", seed_scalars},
    {"arrays.gguf", seed_arrays},
    {"tensors.gguf", seed_tensors},
    {"quant_tensors.gguf", seed_quant_tensors},
};
#define N_SEEDS (sizeof k_seeds / sizeof k_seeds[0])

static void *make_seed(size_t i, size_t *len)
{
    for (size_t k = 0; k < sizeof g_bytes; k++) g_bytes[k] = (uint8_t)(k * 13 + 1);
    ds4_gguf_writer *w = ds4_gguf_writer_new();
    k_seeds[i].fn(w);
    void *out = NULL;
    if (ds4_gguf_writer_write_memory(w, &out, len) != DS4_OK) out = NULL;
    ds4_gguf_writer_free(w);
    return out;
}

static void test_seeds_valid_and_committed(void)
{
    const char *dir = getenv("DS4_WRITE_CORPUS");
    for (size_t i = 0; i < N_SEEDS; i++) {
        size_t len = 0;
        void *p = make_seed(i, &len);
        EXPECT_MSG(p != NULL, "%s: %s", k_seeds[i].name, ds4_last_error());
        if (!p) continue;
        EXPECT(len <= 4096);
        ds4_gguf *g = ds4_gguf_open_memory(p, len);
        EXPECT_MSG(g != NULL, "%s: %s", k_seeds[i].name, ds4_last_error());
        ds4_gguf_close(g);
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir ? dir : "fuzz/corpus/gguf", k_seeds[i].name);
        if (dir) {
            FILE *f = fopen(path, "wb");
            EXPECT(f && fwrite(p, 1, len, f) == len);
            if (f) fclose(f);
        } else {
            size_t flen = 0;
            void *committed = test_read_file(path, &flen);
            EXPECT_MSG(committed && flen == len && memcmp(committed, p, len) == 0,
                       "%s differs from the generated seed", path);
            free(committed);
        }
        free(p);
    }
}

int main(void)
{
    RUN(test_seeds_valid_and_committed);
    return test_finish();
}

/*
 * test_model_load.c - loading a DeepSeek V4 GGUF: every tensor and key is
 * validated against the configuration, and each kind of mismatch is an
 * error that names the tensor (or key) and the found and expected
 * type/shape/value (dsv4-model.md §1.2, §2). The files are the tiny-a
 * fixture written as GGUF with exactly one thing changed.
 */
#include "include/ds4.h"
#include "engine/model_access.h"
#include "model/dsv4_model.h"
#include "tests/model_fixture.h"
#include "tests/test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define GOOD "build/tests/load-good.gguf"
#define BAD "build/tests/load-bad.gguf"

typedef struct {
    const char *drop_key, *drop_tensor;   /* leave out */
    const char *tensor;                   /* replace this tensor ... */
    uint32_t type, nd;                    /* ... with type/shape */
    uint64_t ne[4];
    const char *arr_key;                  /* replace this u32/i32 array key by ... */
    int32_t arr[8];                       /* ... these 6 i32 values */
    const char *u32_key;                  /* replace this key by a u32 */
    uint32_t u32;
    const char *add_u32_key;              /* add this key (a u32 of value add_u32) */
    uint32_t add_u32;
    int fill;                             /* replaced tensor's bytes: 0 zeros, else this byte */
} edit;

/* Copy GOOD into BAD with one edit; 1 on success. */
static int write_edited(const edit *e)
{
    ds4_gguf *g = ds4_gguf_open(GOOD);
    if (!g) return 0;
    ds4_gguf_writer *w = ds4_gguf_writer_new();
    int ok = 1;
    static uint8_t zeros[1 << 20], filled[1 << 20];
    memset(filled, e->fill, sizeof filled);
    for (int64_t k = 0; k < ds4_gguf_n_kv(g) && ok; k++) {
        const char *key = ds4_gguf_key(g, k);
        if (e->drop_key && !strcmp(key, e->drop_key)) continue;
        if (e->arr_key && !strcmp(key, e->arr_key)) ok = ds4_gguf_writer_add_arr(w, key, DS4_GGUF_I32, e->arr, 6) == DS4_OK;
        else if (e->u32_key && !strcmp(key, e->u32_key)) ok = ds4_gguf_writer_add_u32(w, key, e->u32) == DS4_OK;
        else ok = ds4_gguf_writer_copy_kv(w, g, k) == DS4_OK;
    }
    if (ok && e->add_u32_key) ok = ds4_gguf_writer_add_u32(w, e->add_u32_key, e->add_u32) == DS4_OK;
    for (int64_t i = 0; i < ds4_gguf_n_tensors(g) && ok; i++) {
        const ds4_gguf_tensor *t = ds4_gguf_tensor_at(g, i);
        if (e->drop_tensor && !strcmp(t->name, e->drop_tensor)) continue;
        if (e->tensor && !strcmp(t->name, e->tensor))
            ok = ds4_gguf_writer_add_tensor(w, t->name, e->type, e->nd, e->ne, e->fill ? filled : zeros) == DS4_OK;
        else
            ok = ds4_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data) == DS4_OK;
    }
    if (ok) ok = ds4_gguf_writer_write(w, BAD) == DS4_OK;
    if (!ok) fprintf(stderr, "edit: %s\n", ds4_last_error());
    ds4_gguf_writer_free(w);
    ds4_gguf_close(g);
    return ok;
}

/* Loading BAD fails and the message contains every one of `want`. */
static void expect_error(const edit *e, const char *const *want, int n)
{
    REQUIRE(write_edited(e));
    ds4_model *m = ds4_model_open(BAD, NULL);
    EXPECT(m == NULL);
    ds4_model_close(m);
    const char *msg = ds4_last_error();
    for (int i = 0; i < n; i++) EXPECT_MSG(strstr(msg, want[i]) != NULL, "message \"%s\" lacks \"%s\"", msg, want[i]);
    printf("    %s\n", msg);
}

static void test_good_file_loads(void)
{
    ds4_model *m = ds4_model_open(GOOD, NULL);
    EXPECT_MSG(m != NULL, "%s", ds4_last_error());
    if (!m) return;
    EXPECT(ds4_model_n_vocab(m) == 1024 && ds4_model_n_layer(m) == 6);
    ds4_model_close(m);
}

static void test_wrong_shape_names_tensor(void)
{
    edit e = {0};
    e.tensor = "blk.2.attn_q_b.weight"; /* q_lora 64 -> 4 heads x 64 */
    e.type = DS4_TYPE_F32;
    e.nd = 2;
    e.ne[0] = 64;
    e.ne[1] = 128;
    const char *want[] = {"blk.2.attn_q_b.weight", "[64, 128]", "expected [64, 256]"};
    expect_error(&e, want, 3);
}

static void test_wrong_type_names_tensor(void)
{
    edit e = {0};
    e.tensor = "blk.4.attn_norm.weight";
    e.type = DS4_TYPE_I32;
    e.nd = 1;
    e.ne[0] = 128;
    const char *want[] = {"blk.4.attn_norm.weight", "type I32", "F32"};
    expect_error(&e, want, 3);
}

static void test_missing_tensor(void)
{
    edit e = {0};
    e.drop_tensor = "blk.3.attn_compressor_kv.weight";
    const char *want[] = {"blk.3.attn_compressor_kv.weight", "missing"};
    expect_error(&e, want, 2);
}

static void test_indexer_tensor_required_on_csa_layer(void)
{
    edit e = {0};
    e.drop_tensor = "blk.4.indexer.proj.weight";
    const char *want[] = {"blk.4.indexer.proj.weight", "missing"};
    expect_error(&e, want, 2);
}

static void test_missing_key(void)
{
    edit e = {0};
    e.drop_key = "deepseek4.expert_count";
    const char *want[] = {"deepseek4.expert_count"};
    expect_error(&e, want, 1);
}

static void test_bad_compress_ratio(void)
{
    edit e = {0};
    e.arr_key = "deepseek4.attention.compress_ratios";
    int32_t v[6] = {0, 0, 4, 1, 4, 128};
    memcpy(e.arr, v, sizeof v);
    const char *want[] = {"compress_ratios[3]", "= 1"};
    expect_error(&e, want, 2);
}

/* a layer kind change moves the tensors a layer must have */
static void test_layer_kind_from_ratios(void)
{
    edit e = {0};
    e.arr_key = "deepseek4.attention.compress_ratios";
    int32_t v[6] = {0, 4, 4, 128, 4, 128}; /* layer 1 now CSA: needs a compressor */
    memcpy(e.arr, v, sizeof v);
    const char *want[] = {"blk.1.attn_compressor_ape.weight", "missing"};
    expect_error(&e, want, 2);
}

static void test_kv_heads_must_be_one(void)
{
    edit e = {0};
    e.u32_key = "deepseek4.attention.head_count_kv";
    e.u32 = 2;
    const char *want[] = {"head_count_kv", "= 2"};
    expect_error(&e, want, 2);
}

/* llama.cpp's router key: the fixture is written without it (antirez/ds4's
 * layout) and loads (test_good_file_loads); with llama.cpp's value for
 * sqrt(softplus), 4 (its llama-hparams.h enum), it loads too; with another
 * function (1 = softmax there) it is refused, naming key and value. */
static void test_expert_gating_func(void)
{
    edit e = {0};
    e.add_u32_key = "deepseek4.expert_gating_func";
    e.add_u32 = 4;
    REQUIRE(write_edited(&e));
    ds4_model *m = ds4_model_open(BAD, NULL);
    EXPECT_MSG(m != NULL, "%s", ds4_last_error());
    ds4_model_close(m);
    e.add_u32 = 1;
    const char *want[] = {"expert_gating_func", "= 1"};
    expect_error(&e, want, 2);
}

/* Issue 13 item 8: values that size memory are bounded by the family's
 * published range; a forged 2^20 used to cost gigabytes. */
static void test_metadata_bounds(void)
{
    edit e = {0};
    e.u32_key = "deepseek4.attention.sliding_window";
    e.u32 = 1u << 20;
    const char *want[] = {"attention.sliding_window", "1048576", "[1, 128]", "published range"};
    expect_error(&e, want, 4);
    e.u32_key = "deepseek4.attention.indexer.top_k";
    const char *want2[] = {"indexer.top_k", "1048576", "[1, 1024]"};
    expect_error(&e, want2, 3);
    e.u32_key = "deepseek4.embedding_length";
    e.u32 = 1u << 16;
    const char *want3[] = {"embedding_length", "65536", "[1, 7168]"};
    expect_error(&e, want3, 3);
}

/* A NaN in a small tensor loads (the file may be inspected) but is counted
 * and warned about, naming the tensor. */
static void test_nonfinite_small_tensor_warned(void)
{
    ds4_gguf *g = ds4_gguf_open(GOOD);
    REQUIRE(g);
    const ds4_gguf_tensor *t = ds4_gguf_tensor_at(g, ds4_gguf_find_tensor(g, "output_norm.weight"));
    REQUIRE(t && t->type == DS4_TYPE_F32);
    edit e = {0};
    e.tensor = "output_norm.weight";
    e.type = DS4_TYPE_F32;
    e.nd = t->n_dims;
    for (int i = 0; i < 4; i++) e.ne[i] = t->ne[i];
    e.fill = 0xff; /* 0xffffffff is a NaN */
    ds4_gguf_close(g);
    REQUIRE(write_edited(&e));
    ds4_model *m = ds4_model_open(BAD, NULL);
    EXPECT_MSG(m != NULL, "load: %s", ds4_last_error());
    if (m) EXPECT(ds4_model_dsv4(m)->n_nonfinite_tensors == 1);
    ds4_model_close(m);
    m = ds4_model_open(GOOD, NULL);
    REQUIRE(m);
    EXPECT(ds4_model_dsv4(m)->n_nonfinite_tensors == 0);
    ds4_model_close(m);
}

static void test_tid2eid_out_of_range(void)
{
    edit e = {0}; /* every entry 0x01010101: far past the 8 experts */
    e.tensor = "blk.1.ffn_gate_tid2eid.weight";
    e.type = DS4_TYPE_I32;
    e.nd = 2;
    e.ne[0] = 2;
    e.ne[1] = 1024;
    e.fill = 1;
    const char *want[] = {"blk.1.ffn_gate_tid2eid.weight", "16843009", "[0, 8)"};
    expect_error(&e, want, 3);
}

static void test_tid2eid_wrong_shape(void)
{
    edit e = {0};
    e.tensor = "blk.1.ffn_gate_tid2eid.weight";
    e.type = DS4_TYPE_I32;
    e.nd = 2;
    e.ne[0] = 3;
    e.ne[1] = 1024;
    const char *want[] = {"blk.1.ffn_gate_tid2eid.weight", "expected [2, 1024]"};
    expect_error(&e, want, 2);
}

static void test_truncated_file(void)
{
    size_t len;
    uint8_t *b = test_read_file(GOOD, &len);
    REQUIRE(b);
    FILE *f = fopen(BAD, "wb");
    REQUIRE(f);
    fwrite(b, 1, len / 2, f);
    fclose(f);
    free(b);
    ds4_model *m = ds4_model_open(BAD, NULL);
    EXPECT(m == NULL);
    EXPECT(strstr(ds4_last_error(), BAD) != NULL);
    ds4_model_close(m);
    EXPECT(ds4_model_open("build/tests/no-such-model.gguf", NULL) == NULL);
}

int main(void)
{
    mkdir("build", 0755);
    mkdir("build/tests", 0755);
    if (!fixture_write_gguf("tests/data/dsv4-tiny-a", GOOD, 0)) {
        fprintf(stderr, "cannot write %s\n", GOOD);
        return 1;
    }
    RUN(test_good_file_loads);
    RUN(test_wrong_shape_names_tensor);
    RUN(test_wrong_type_names_tensor);
    RUN(test_missing_tensor);
    RUN(test_indexer_tensor_required_on_csa_layer);
    RUN(test_missing_key);
    RUN(test_bad_compress_ratio);
    RUN(test_layer_kind_from_ratios);
    RUN(test_kv_heads_must_be_one);
    RUN(test_metadata_bounds);
    RUN(test_expert_gating_func);
    RUN(test_nonfinite_small_tensor_warned);
    RUN(test_tid2eid_out_of_range);
    RUN(test_tid2eid_wrong_shape);
    RUN(test_truncated_file);
    return test_finish();
}

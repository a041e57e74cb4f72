/*
 * test_convert_synthetic.c - ds4-quantize --synthetic and the full-size
 * layout.
 *
 *   - The Flash plan (nothing written) has the census of the published q2
 *     file from dsv4-model.md §1.2: 1328 tensors = F32 492, F16 359,
 *     Q8_0 345, I32 3, IQ2_XXS 86, Q2_K 43, and tensor bytes of 80.76 GiB
 *     (q2) / 153.32 GiB (q4, §2.1).
 *   - A small synthetic model (hidden 256 so the K-quants apply, 16
 *     experts) with --experts q2 and q4: the published types, the
 *     metadata of its config, every block dequantizing to finite values of
 *     the intended magnitude (matrices RMS ~ 1/sqrt(fan-in), norms ~ 1),
 *     tid2eid rows of distinct expert ids in range; the same bytes for any
 *     thread count, different bytes for another seed; with --expert-share
 *     the routed experts' blocks shared with expert 0 at that rate and
 *     every other byte the same.
 */
#include "gguf/gguf.h"
#include "quant/half.h"
#include "quant/quant.h"
#include "tests/test.h"
#include "tools/convert_plan.h"
#include "tools/convert_run.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void test_flash_census(void)
{
    convert_config c;
    REQUIRE(convert_config_preset("flash", &c) == DS4_OK);
    convert_plan p;
    REQUIRE(convert_plan_build(&c, &p) == DS4_OK);
    REQUIRE(convert_plan_set_types(&p, DS4_TYPE_Q8_0, DS4_TYPE_IQ2_XXS, DS4_TYPE_Q2_K) == DS4_OK);
    int n[64] = {0};
    double bytes = 0;
    for (int i = 0; i < p.n; i++) {
        n[p.t[i].type]++;
        bytes += (double)ds4_row_bytes(p.t[i].type, (int64_t)p.t[i].ne[0]) * (double)(p.t[i].ne[1] * p.t[i].ne[2]);
    }
    EXPECT_MSG(p.n == 1328, "%d tensors", p.n);
    EXPECT_MSG(n[DS4_TYPE_F32] == 492 && n[DS4_TYPE_F16] == 359 && n[DS4_TYPE_Q8_0] == 345 && n[DS4_TYPE_I32] == 3 &&
                   n[DS4_TYPE_IQ2_XXS] == 86 && n[DS4_TYPE_Q2_K] == 43,
               "census F32 %d F16 %d Q8_0 %d I32 %d IQ2_XXS %d Q2_K %d", n[DS4_TYPE_F32], n[DS4_TYPE_F16],
               n[DS4_TYPE_Q8_0], n[DS4_TYPE_I32], n[DS4_TYPE_IQ2_XXS], n[DS4_TYPE_Q2_K]);
    EXPECT_MSG(fabs(bytes / (1u << 30) - 80.76) < 0.01, "q2 tensor bytes %.3f GiB", bytes / (1u << 30));
    REQUIRE(convert_plan_set_types(&p, DS4_TYPE_Q8_0, DS4_TYPE_Q4_K, DS4_TYPE_Q4_K) == DS4_OK);
    bytes = 0;
    for (int i = 0; i < p.n; i++)
        bytes += (double)ds4_row_bytes(p.t[i].type, (int64_t)p.t[i].ne[0]) * (double)(p.t[i].ne[1] * p.t[i].ne[2]);
    EXPECT_MSG(fabs(bytes / (1u << 30) - 153.32) < 0.01, "q4 tensor bytes %.3f GiB", bytes / (1u << 30));
    convert_plan_free(&p);
    /* Pro preset: 61 layers, 384 experts, [128,128,4,128,...] */
    REQUIRE(convert_config_preset("pro", &c) == DS4_OK);
    EXPECT(c.n_layer == 61 && c.n_expert == 384 && c.n_embd == 7168 && c.compress_ratio[0] == 128 &&
           c.compress_ratio[2] == 4 && c.compress_ratio[3] == 128 && c.idx_topk == 1024);
    /* --layers / --n-experts */
    REQUIRE(convert_config_preset("flash", &c) == DS4_OK);
    REQUIRE(convert_config_truncate(&c, 2, 16) == DS4_OK);
    EXPECT(c.n_layer == 2 && c.n_expert == 16 && c.n_hash_layer == 2);
    EXPECT(convert_config_truncate(&c, 0, 4) != DS4_OK); /* fewer experts than used per token */
}

static char dir[64];
static const char *config_json =
    "{\"model_type\": \"deepseek_v4\", \"vocab_size\": 512, \"hidden_size\": 256, \"num_hidden_layers\": 4,"
    " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 128, \"qk_rope_head_dim\": 32,"
    " \"q_lora_rank\": 128, \"o_lora_rank\": 64, \"o_groups\": 2, \"n_routed_experts\": 16,"
    " \"num_experts_per_tok\": 3, \"moe_intermediate_size\": 256, \"n_shared_experts\": 1,"
    " \"sliding_window\": 16, \"index_n_heads\": 2, \"index_head_dim\": 64, \"index_topk\": 8,"
    " \"compress_ratios\": [0, 4, 16, 4, 0], \"num_hash_layers\": 2, \"routed_scaling_factor\": 2.5,"
    " \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 8, \"original_max_position_embeddings\": 4096,"
    " \"beta_fast\": 32, \"beta_slow\": 1}}";

static ds4_status synth(const char *out, const char *experts, uint64_t seed, int threads)
{
    char cfg[128];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    convert_options o = {.out = out, .dense = DS4_TYPE_Q8_0, .seed = seed, .threads = threads, .quiet = true};
    ds4_status st = convert_parse_experts(experts, &o.exp_gate_up, &o.exp_down);
    return st ? st : convert_synthetic(cfg, &o);
}

static int role_is_norm(const char *name)
{
    return strstr(name, "norm.weight") != NULL;
}

static void check_synthetic(const char *path, uint32_t gu, uint32_t down)
{
    ds4_gguf *g = ds4_gguf_open(path);
    REQUIRE(g);
    uint32_t v;
    EXPECT(ds4_gguf_get_u32(g, "deepseek4.block_count", &v) == DS4_OK && v == 4);
    EXPECT(ds4_gguf_get_u32(g, "deepseek4.expert_count", &v) == DS4_OK && v == 16);
    EXPECT(ds4_gguf_get_u32(g, "deepseek4.hash_layer_count", &v) == DS4_OK && v == 2);
    EXPECT(ds4_gguf_get_u32(g, "deepseek4.rope.scaling.original_context_length", &v) == DS4_OK && v == 4096);
    /* mainline llama.cpp needs its router key: 4 = sqrt(softplus) in its enum */
    EXPECT(ds4_gguf_get_u32(g, "deepseek4.expert_gating_func", &v) == DS4_OK && v == 4);
    float f;
    EXPECT(ds4_gguf_get_f32(g, "deepseek4.expert_weights_scale", &f) == DS4_OK && f == 2.5f);
    int64_t kv;
    uint64_t n;
    REQUIRE(ds4_gguf_get_arr(g, "deepseek4.attention.compress_ratios", DS4_GGUF_I32, &kv, &n) == DS4_OK && n == 4);
    const int32_t *ratios = ds4_gguf_arr_data(g, kv);
    int32_t r[4];
    memcpy(r, ratios, sizeof r);
    EXPECT(r[0] == 0 && r[1] == 4 && r[2] == 16 && r[3] == 4);

    int bad = 0, checked = 0;
    float *row = malloc(sizeof(float) * 4096);
    for (int64_t i = 0; i < ds4_gguf_n_tensors(g); i++) {
        const ds4_gguf_tensor *t = ds4_gguf_tensor_at(g, i);
        uint64_t rows = t->size / (uint64_t)ds4_row_bytes(t->type, (int64_t)t->ne[0]);
        if (strstr(t->name, "_exps.weight")) {
            uint32_t want = strstr(t->name, "down") ? down : gu;
            EXPECT_MSG(t->type == want, "%s: %s", t->name, ds4_gguf_type_name(t->type));
        }
        if (t->type == DS4_TYPE_I32) {
            const int32_t *ids = t->data;
            for (uint64_t rr = 0; rr < t->ne[1]; rr++)
                for (uint64_t a = 0; a < t->ne[0]; a++) {
                    int32_t x = ids[rr * t->ne[0] + a];
                    bad += x < 0 || x >= 16;
                    for (uint64_t b = 0; b < a; b++) bad += ids[rr * t->ne[0] + b] == x;
                }
            continue;
        }
        double sum = 0, sum2 = 0;
        uint64_t cnt = 0;
        for (uint64_t rr = 0; rr < rows; rr++) {
            ds4_dequantize_row(t->type, (const uint8_t *)t->data + rr * (uint64_t)ds4_row_bytes(t->type, (int64_t)t->ne[0]),
                               row, (int64_t)t->ne[0]);
            for (uint64_t k = 0; k < t->ne[0]; k++) {
                bad += !isfinite(row[k]);
                sum += row[k], sum2 += (double)row[k] * row[k], cnt++;
            }
        }
        double mean = sum / (double)cnt, rms = sqrt(sum2 / (double)cnt);
        if (role_is_norm(t->name)) {
            EXPECT_MSG(fabs(mean - 1.0) < 0.1, "%s: mean %.3f", t->name, mean);
        } else if (t->n_dims >= 2 && !strstr(t->name, "_ape.")) {
            double want = 1.0 / sqrt((double)t->ne[0]);
            EXPECT_MSG(rms > want / 3 && rms < want * 3, "%s (%s): rms %.4f, want ~%.4f", t->name,
                       ds4_gguf_type_name(t->type), rms, want);
            checked++;
        }
    }
    free(row);
    EXPECT_MSG(bad == 0, "%d bad values", bad);
    EXPECT(checked > 40);
    ds4_gguf_close(g);
}

/* The fraction of expert e's quantized blocks of routed-expert tensor t
 * that equal expert 0's block at the same place. */
static double shared_fraction(const ds4_gguf_tensor *t, uint64_t e)
{
    const ds4_type_info *info = ds4_type_get(t->type);
    if (!info) return -1;
    const uint64_t bb = (uint64_t)info->block_bytes;
    const uint64_t slab = t->size / t->ne[2], nb = slab / bb;
    const uint8_t *p0 = t->data, *pe = (const uint8_t *)t->data + e * slab;
    uint64_t same = 0;
    for (uint64_t i = 0; i < nb; i++) same += memcmp(p0 + i * bb, pe + i * bb, bb) == 0;
    return (double)same / (double)nb;
}

/* A variant of `plain` (seed 7, Q8_0, q2 experts) into dir_/name with
 * --expert-share and --branch-scale as given (0: off); false on failure. */
static bool write_variant(const char *dir_, const char *name, double share, double branch, char *out, size_t n)
{
    char cfg[128];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir_);
    snprintf(out, n, "%s/%s", dir_, name);
    convert_options o = {.out = out, .dense = DS4_TYPE_Q8_0, .seed = 7, .threads = 2, .quiet = true,
                         .expert_share = share, .branch_scale = branch};
    return convert_parse_experts("q2", &o.exp_gate_up, &o.exp_down) == DS4_OK && convert_synthetic(cfg, &o) == DS4_OK;
}

/* --expert-share 0.75 (seed 7, as `plain`): every routed expert past
 * expert 0 shares ~3/4 of its blocks with expert 0, while the default file
 * shares none; every other tensor is byte for byte the default's, and the
 * share is in the metadata. */
static void check_expert_share(const char *dir_, const char *plain)
{
    char out[128];
    REQUIRE(write_variant(dir_, "share.gguf", 0.75, 0, out, sizeof out));
    ds4_gguf *g = ds4_gguf_open(out), *p = ds4_gguf_open(plain);
    REQUIRE(g && p);
    float f = 0;
    EXPECT(ds4_gguf_get_f32(g, "ds4.synthetic_expert_share", &f) == DS4_OK && f == 0.75f);
    EXPECT(ds4_gguf_get_f32(p, "ds4.synthetic_expert_share", &f) != DS4_OK);
    int n_exps = 0, other_diff = 0;
    double lo = 1, hi = 0, plain_hi = 0;
    for (int64_t i = 0; i < ds4_gguf_n_tensors(g); i++) {
        const ds4_gguf_tensor *t = ds4_gguf_tensor_at(g, i), *u = ds4_gguf_tensor_at(p, i);
        REQUIRE(!strcmp(t->name, u->name) && t->size == u->size);
        if (!strstr(t->name, "_exps.weight")) {
            other_diff += memcmp(t->data, u->data, t->size) != 0;
            continue;
        }
        n_exps++;
        EXPECT_MSG(memcmp(t->data, u->data, t->size / t->ne[2]) == 0, "%s: expert 0 changed", t->name);
        for (uint64_t e = 1; e < t->ne[2]; e++) {
            const double fr = shared_fraction(t, e), fp = shared_fraction(u, e);
            lo = fr < lo ? fr : lo, hi = fr > hi ? fr : hi, plain_hi = fp > plain_hi ? fp : plain_hi;
        }
    }
    EXPECT_MSG(n_exps == 12, "%d routed expert tensors", n_exps);
    EXPECT_MSG(lo > 0.6 && hi < 0.9, "experts share %.3f .. %.3f of their blocks with expert 0 (want ~0.75)", lo, hi);
    EXPECT_MSG(plain_hi < 0.01, "without --expert-share experts share up to %.3f of their blocks", plain_hi);
    EXPECT_MSG(other_diff == 0, "%d other tensors differ from the default file's", other_diff);
    ds4_gguf_close(g);
    ds4_gguf_close(p);
}

/* --branch-scale 0.5 (seed 7, as `plain`): o_b's and the experts' down
 * products have each block's scales halved (f16 halving is exact here)
 * and their codes unchanged; every other tensor is byte for byte the
 * default's; the scale is in the metadata. */
static void check_branch_scale(const char *dir_, const char *plain)
{
    char out[128];
    REQUIRE(write_variant(dir_, "branch.gguf", 0, 0.5, out, sizeof out));
    ds4_gguf *g = ds4_gguf_open(out), *p = ds4_gguf_open(plain);
    REQUIRE(g && p);
    float f = 0;
    EXPECT(ds4_gguf_get_f32(g, "ds4.synthetic_branch_scale", &f) == DS4_OK && f == 0.5f);
    int n_branch = 0, other_diff = 0, bad = 0;
    for (int64_t i = 0; i < ds4_gguf_n_tensors(g); i++) {
        const ds4_gguf_tensor *t = ds4_gguf_tensor_at(g, i), *u = ds4_gguf_tensor_at(p, i);
        REQUIRE(!strcmp(t->name, u->name) && t->size == u->size && t->type == u->type);
        const bool branch = strstr(t->name, "attn_output_b.weight") || strstr(t->name, "ffn_down_exps.weight") ||
                            strstr(t->name, "ffn_down_shexp.weight");
        if (!branch) {
            other_diff += memcmp(t->data, u->data, t->size) != 0;
            continue;
        }
        n_branch++;
        if (t->type == DS4_TYPE_Q8_0) {
            const block_q8_0 *a = t->data, *b = u->data;
            for (size_t k = 0; k < t->size / sizeof *a; k++)
                bad += ds4_f16_to_f32(a[k].d) != 0.5f * ds4_f16_to_f32(b[k].d) || memcmp(a[k].qs, b[k].qs, sizeof a[k].qs);
        } else if (t->type == DS4_TYPE_Q2_K) {
            const block_q2_K *a = t->data, *b = u->data;
            for (size_t k = 0; k < t->size / sizeof *a; k++)
                bad += ds4_f16_to_f32(a[k].d) != 0.5f * ds4_f16_to_f32(b[k].d) ||
                       ds4_f16_to_f32(a[k].dmin) != 0.5f * ds4_f16_to_f32(b[k].dmin) ||
                       memcmp(a[k].scales, b[k].scales, sizeof a[k].scales) || memcmp(a[k].qs, b[k].qs, sizeof a[k].qs);
        } else {
            bad++;
        }
    }
    EXPECT_MSG(n_branch >= 3, "%d branch products found (o_b, routed and shared down: 3 a layer)", n_branch);
    EXPECT_MSG(bad == 0, "%d blocks of the branch products not the default's at half scale", bad);
    EXPECT_MSG(other_diff == 0, "%d other tensors differ from the default file", other_diff);
    ds4_gguf_close(g);
    ds4_gguf_close(p);
}

static void test_synthetic_small(void)
{
    snprintf(dir, sizeof dir, "/tmp/ds4-test-syn-XXXXXX");
    REQUIRE(mkdtemp(dir));
    char cfg[128], a[128], b[128], c[128], d[128];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    FILE *fp = fopen(cfg, "wb");
    REQUIRE(fp);
    fputs(config_json, fp);
    fclose(fp);
    snprintf(a, sizeof a, "%s/a.gguf", dir);
    snprintf(b, sizeof b, "%s/b.gguf", dir);
    snprintf(c, sizeof c, "%s/c.gguf", dir);
    snprintf(d, sizeof d, "%s/d.gguf", dir);
    ds4_status st = synth(a, "q2", 7, 2);
    EXPECT_MSG(st == DS4_OK, "%s", ds4_last_error());
    REQUIRE(st == DS4_OK);
    check_synthetic(a, DS4_TYPE_IQ2_XXS, DS4_TYPE_Q2_K);
    REQUIRE(synth(b, "q2", 7, 1) == DS4_OK);
    REQUIRE(synth(c, "q2", 8, 2) == DS4_OK);
    size_t na, nb, nc;
    char *fa = test_read_file(a, &na), *fb = test_read_file(b, &nb), *fc = test_read_file(c, &nc);
    EXPECT_MSG(fa && fb && na == nb && memcmp(fa, fb, na) == 0, "thread count changed the bytes");
    EXPECT_MSG(fa && fc && na == nc && memcmp(fa, fc, na) != 0, "seed did not change the bytes");
    free(fa);
    free(fb);
    free(fc);
    REQUIRE(synth(d, "q4", 7, 2) == DS4_OK);
    check_synthetic(d, DS4_TYPE_Q4_K, DS4_TYPE_Q4_K);
    /* a tokenizer of another vocabulary size is refused */
    convert_options o = {.out = d, .dense = DS4_TYPE_Q8_0, .exp_gate_up = DS4_TYPE_Q4_K, .exp_down = DS4_TYPE_Q4_K,
                         .quiet = true, .tokenizer = test_data("tokenizer/dsv4-vocab.gguf")};
    EXPECT(convert_synthetic(cfg, &o) != DS4_OK && strstr(ds4_last_error(), "vocab_size is 512"));
    /* --mtp: the random MTP block the engine loads with --mtp auto */
    convert_options om = {.out = d, .dense = DS4_TYPE_Q8_0, .exp_gate_up = DS4_TYPE_Q8_0, .exp_down = DS4_TYPE_Q8_0,
                          .quiet = true, .mtp = 1, .seed = 3};
    REQUIRE(convert_synthetic(cfg, &om) == DS4_OK);
    ds4_gguf *g = ds4_gguf_open(d);
    REQUIRE(g);
    int n_mtp = 0;
    for (int64_t i = 0; i < ds4_gguf_n_tensors(g); i++) n_mtp += !strncmp(ds4_gguf_tensor_at(g, i)->name, "mtp.0.", 6);
    /* a block of ratio 0 (no compressor, no indexer): 24 tensors with exp_probs_b, plus 8 of its own */
    EXPECT_MSG(n_mtp == 32, "%d mtp.0.* tensors", n_mtp);
    ds4_gguf_close(g);
    ds4_model *m = ds4_model_open(d, NULL);
    REQUIRE(m);
    EXPECT_MSG(ds4_model_load_mtp(m, "auto") == DS4_OK, "%s", ds4_last_error());
    ds4_model_close(m);
    check_expert_share(dir, a);
    check_branch_scale(dir, a);
    test_remove_dir(dir);
}

int main(void)
{
    RUN(test_flash_census);
    RUN(test_synthetic_small);
    return test_finish();
}

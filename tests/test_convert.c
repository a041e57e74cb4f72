/*
 * test_convert.c - ds4-quantize on the tiny golden checkpoints.
 *
 * The expected tensor table is written here from dsv4-model.md §2 (names,
 * GGUF shapes, published type classes, transformers source names), with the
 * sizes read from the fixture's config.json by this test's own JSON code,
 * and the values are compared with the safetensors bytes read by this
 * test's own parser - so nothing the converter computes is used to check
 * the converter. Cases:
 *   - tiny-a and tiny-c, --type f32 --experts f32: every tensor present with
 *     the spec name/shape/type, nothing else; every value equal to the bf16
 *     source; every §1.2 metadata key with the config's value and type;
 *   - --type q8_0 --experts q8_0: Q8_0 tensors within Q8_0 rounding of the
 *     source, F16 tensors equal to f16(source), F32 ones exact; the bytes do
 *     not depend on the thread count;
 *   - bad input: missing tensor, wrong shape, unknown dtype, bad header
 *     JSON, bad config.json, FP8 weight without scale - each an error that
 *     names the tensor (or file), and no output file left behind.
 */
#include "gguf/gguf.h"
#include "quant/half.h"
#include "quant/quant.h"
#include "tests/safetensors_reader.h"
#include "tests/test.h"
#include "tools/convert_imatrix.h"
#include "tools/convert_run.h"
#include "tools/convert_safetensors.h"
#include "tools/convert_st_write.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the spec table (dsv4-model.md §2.2, §2.3) -------------------------- */

enum { C_F32, C_F16, C_DENSE, C_I32, C_EXP };
enum { P_WHOLE, P_GATE, P_UP };

typedef struct {
    char name[64];
    int nd;
    uint64_t ne[3];
    int cls;
    char src[128];
    int part;
} spec_t;

typedef struct {
    uint64_t V, E, L, H, D, R, QL, G, OL, NE, F, K, IH, ID, TOPK, HC, W, nhash;
    uint32_t ratio[64];
    double swiglu, scale;
} cfgv;

static uint64_t ju(json_t *o, const char *k) { return (uint64_t)json_integer_value(json_object_get(o, k)); }

static int read_cfg(const char *path, cfgv *c)
{
    json_t *j = json_load_file(path, 0, NULL);
    if (!j) return 0;
    memset(c, 0, sizeof *c);
    c->V = ju(j, "vocab_size"), c->E = ju(j, "hidden_size"), c->L = ju(j, "num_hidden_layers");
    c->H = ju(j, "num_attention_heads"), c->D = ju(j, "head_dim"), c->R = ju(j, "qk_rope_head_dim");
    c->QL = ju(j, "q_lora_rank"), c->G = ju(j, "o_groups"), c->OL = ju(j, "o_lora_rank");
    c->NE = ju(j, "n_routed_experts"), c->F = ju(j, "moe_intermediate_size");
    c->K = ju(j, "num_experts_per_tok"), c->IH = ju(j, "index_n_heads"), c->ID = ju(j, "index_head_dim");
    c->TOPK = ju(j, "index_topk"), c->HC = ju(j, "hc_mult"), c->W = ju(j, "sliding_window");
    c->swiglu = json_number_value(json_object_get(j, "swiglu_limit"));
    c->scale = json_number_value(json_object_get(j, "routed_scaling_factor"));
    json_t *rates = json_object_get(j, "compress_rates");
    for (uint64_t i = 0; i < c->L; i++) {
        const char *t = json_string_value(json_array_get(json_object_get(j, "layer_types"), i));
        const char *m = json_string_value(json_array_get(json_object_get(j, "mlp_layer_types"), i));
        c->ratio[i] = strcmp(t, "sliding_attention") == 0 ? 0 : (uint32_t)ju(rates, t);
        if (strcmp(m, "hash_moe") == 0) c->nhash++;
    }
    json_decref(j);
    return 1;
}

static int nspec;
static spec_t specs[512];

static void S(int layer, const char *suffix, int cls, int nd, uint64_t a, uint64_t b, uint64_t c, const char *src,
              int part)
{
    spec_t *s = &specs[nspec++];
    memset(s, 0, sizeof *s);
    if (layer < 0) snprintf(s->name, sizeof s->name, "%s", suffix), snprintf(s->src, sizeof s->src, "%s", src);
    else {
        snprintf(s->name, sizeof s->name, "blk.%d.%s", layer, suffix);
        snprintf(s->src, sizeof s->src, "model.layers.%d.%s", layer, src);
    }
    s->cls = cls, s->nd = nd, s->ne[0] = a, s->ne[1] = b, s->ne[2] = c, s->part = part;
}

static void build_spec(const cfgv *c)
{
    nspec = 0;
    const uint64_t MIX = (2 + c->HC) * c->HC;
    S(-1, "token_embd.weight", C_F16, 2, c->E, c->V, 0, "model.embed_tokens.weight", 0);
    S(-1, "output_hc_fn.weight", C_F16, 2, c->HC * c->E, c->HC, 0, "model.hc_head.hc_fn", 0);
    S(-1, "output_hc_base.weight", C_F32, 1, c->HC, 0, 0, "model.hc_head.hc_base", 0);
    S(-1, "output_hc_scale.weight", C_F32, 1, 1, 0, 0, "model.hc_head.hc_scale", 0);
    S(-1, "output_norm.weight", C_F32, 1, c->E, 0, 0, "model.norm.weight", 0);
    S(-1, "output.weight", C_DENSE, 2, c->E, c->V, 0, "lm_head.weight", 0);
    for (int i = 0; i < (int)c->L; i++) {
        uint64_t r = c->ratio[i], cf = r == 4 ? 2 : 1;
        S(i, "hc_attn_fn.weight", C_F16, 2, c->HC * c->E, MIX, 0, "attn_hc.fn", 0);
        S(i, "hc_attn_scale.weight", C_F32, 1, 3, 0, 0, "attn_hc.scale", 0);
        S(i, "hc_attn_base.weight", C_F32, 1, MIX, 0, 0, "attn_hc.base", 0);
        S(i, "attn_norm.weight", C_F32, 1, c->E, 0, 0, "input_layernorm.weight", 0);
        S(i, "attn_q_a.weight", C_DENSE, 2, c->E, c->QL, 0, "self_attn.q_a_proj.weight", 0);
        S(i, "attn_q_a_norm.weight", C_F32, 1, c->QL, 0, 0, "self_attn.q_a_norm.weight", 0);
        S(i, "attn_q_b.weight", C_DENSE, 2, c->QL, c->H * c->D, 0, "self_attn.q_b_proj.weight", 0);
        S(i, "attn_kv.weight", C_DENSE, 2, c->E, c->D, 0, "self_attn.kv_proj.weight", 0);
        S(i, "attn_kv_a_norm.weight", C_F32, 1, c->D, 0, 0, "self_attn.kv_norm.weight", 0);
        S(i, "attn_sinks.weight", C_F32, 1, c->H, 0, 0, "self_attn.sinks", 0);
        S(i, "attn_output_a.weight", C_DENSE, 2, c->H * c->D / c->G, c->G * c->OL, 0, "self_attn.o_a_proj.weight", 0);
        S(i, "attn_output_b.weight", C_DENSE, 2, c->G * c->OL, c->E, 0, "self_attn.o_b_proj.weight", 0);
        if (r) {
            S(i, "attn_compressor_ape.weight", C_F16, 2, cf * c->D, r, 0, "self_attn.compressor.position_bias", 0);
            S(i, "attn_compressor_kv.weight", C_F16, 2, c->E, cf * c->D, 0, "self_attn.compressor.kv_proj.weight", 0);
            S(i, "attn_compressor_gate.weight", C_F16, 2, c->E, cf * c->D, 0, "self_attn.compressor.gate_proj.weight", 0);
            S(i, "attn_compressor_norm.weight", C_F32, 1, c->D, 0, 0, "self_attn.compressor.kv_norm.weight", 0);
        }
        if (r == 4) {
            S(i, "indexer.attn_q_b.weight", C_F16, 2, c->QL, c->IH * c->ID, 0,
              "self_attn.compressor.indexer.q_b_proj.weight", 0);
            S(i, "indexer.proj.weight", C_F16, 2, c->E, c->IH, 0,
              "self_attn.compressor.indexer.scorer.weights_proj.weight", 0);
            S(i, "indexer_compressor_ape.weight", C_F16, 2, 2 * c->ID, 4, 0,
              "self_attn.compressor.indexer.position_bias", 0);
            S(i, "indexer_compressor_kv.weight", C_F16, 2, c->E, 2 * c->ID, 0,
              "self_attn.compressor.indexer.kv_proj.weight", 0);
            S(i, "indexer_compressor_gate.weight", C_F16, 2, c->E, 2 * c->ID, 0,
              "self_attn.compressor.indexer.gate_proj.weight", 0);
            S(i, "indexer_compressor_norm.weight", C_F32, 1, c->ID, 0, 0,
              "self_attn.compressor.indexer.kv_norm.weight", 0);
        }
        S(i, "hc_ffn_fn.weight", C_F16, 2, c->HC * c->E, MIX, 0, "ffn_hc.fn", 0);
        S(i, "hc_ffn_scale.weight", C_F32, 1, 3, 0, 0, "ffn_hc.scale", 0);
        S(i, "hc_ffn_base.weight", C_F32, 1, MIX, 0, 0, "ffn_hc.base", 0);
        S(i, "ffn_norm.weight", C_F32, 1, c->E, 0, 0, "post_attention_layernorm.weight", 0);
        S(i, "ffn_gate_inp.weight", C_F16, 2, c->E, c->NE, 0, "mlp.gate.weight", 0);
        if ((uint64_t)i >= c->nhash) S(i, "exp_probs_b.bias", C_F32, 1, c->NE, 0, 0, "mlp.gate.e_score_correction_bias", 0);
        else S(i, "ffn_gate_tid2eid.weight", C_I32, 2, c->K, c->V, 0, "mlp.gate.tid2eid", 0);
        S(i, "ffn_gate_exps.weight", C_EXP, 3, c->E, c->F, c->NE, "mlp.experts.gate_up_proj", P_GATE);
        S(i, "ffn_up_exps.weight", C_EXP, 3, c->E, c->F, c->NE, "mlp.experts.gate_up_proj", P_UP);
        S(i, "ffn_down_exps.weight", C_EXP, 3, c->F, c->E, c->NE, "mlp.experts.down_proj", 0);
        S(i, "ffn_gate_shexp.weight", C_DENSE, 2, c->E, c->F, 0, "mlp.shared_experts.gate_proj.weight", 0);
        S(i, "ffn_up_shexp.weight", C_DENSE, 2, c->E, c->F, 0, "mlp.shared_experts.up_proj.weight", 0);
        S(i, "ffn_down_shexp.weight", C_DENSE, 2, c->F, c->E, 0, "mlp.shared_experts.down_proj.weight", 0);
    }
}

/* Source value feeding element (slab, row, col) of a spec tensor. */
static double src_value(const spec_t *s, const char *dtype, const uint8_t *d, uint64_t slab, uint64_t row, uint64_t col)
{
    uint64_t rows = s->nd > 1 ? s->ne[1] : 1, ne0 = s->ne[0];
    uint64_t srow = s->part == P_WHOLE ? slab * rows + row : slab * 2 * rows + (s->part == P_UP ? rows : 0) + row;
    return st_val(dtype, d, srow * ne0 + col);
}

/* ---- helpers ------------------------------------------------------------ */

static char tmpdir[64];

static void make_tmpdir(void)
{
    if (!tmpdir[0]) {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/ds4-test-convert-XXXXXX");
        if (!mkdtemp(tmpdir)) tmpdir[0] = 0;
    }
}

static const char *tmp(const char *name)
{
    static char buf[4][256];
    static int k;
    make_tmpdir();
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

static ds4_status convert(const char *dir, const char *out, const char *type, const char *experts, int threads)
{
    convert_options o = {.out = out, .threads = threads, .quiet = true};
    ds4_status st = convert_parse_dense_type(type, &o.dense);
    if (!st) st = convert_parse_experts(experts, &o.exp_gate_up, &o.exp_down);
    if (!st) st = convert_checkpoint(dir, &o);
    return st;
}

static int file_exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0;
}

static const ds4_gguf_tensor *tensor(const ds4_gguf *g, const char *name)
{
    int64_t i = ds4_gguf_find_tensor(g, name);
    return i < 0 ? NULL : ds4_gguf_tensor_at(g, i);
}

/* ---- f32 conversion: table, metadata, values ---------------------------- */

static void check_metadata(const ds4_gguf *g, const cfgv *c)
{
    const struct {
        const char *k;
        uint64_t v;
    } u[] = {
        {"deepseek4.block_count", c->L}, {"deepseek4.embedding_length", c->E}, {"deepseek4.vocab_size", c->V},
        {"deepseek4.attention.head_count", c->H}, {"deepseek4.attention.head_count_kv", 1},
        {"deepseek4.attention.key_length", c->D}, {"deepseek4.attention.value_length", c->D},
        {"deepseek4.rope.dimension_count", c->R}, {"deepseek4.attention.q_lora_rank", c->QL},
        {"deepseek4.attention.output_lora_rank", c->OL}, {"deepseek4.attention.output_group_count", c->G},
        {"deepseek4.expert_count", c->NE}, {"deepseek4.expert_used_count", c->K},
        {"deepseek4.expert_feed_forward_length", c->F}, {"deepseek4.expert_shared_count", 1},
        {"deepseek4.hash_layer_count", c->nhash}, {"deepseek4.attention.sliding_window", c->W},
        {"deepseek4.attention.indexer.head_count", c->IH}, {"deepseek4.attention.indexer.key_length", c->ID},
        {"deepseek4.attention.indexer.top_k", c->TOPK}, {"deepseek4.hyper_connection.count", c->HC},
        {"deepseek4.hyper_connection.sinkhorn_iterations", 20},
        {"deepseek4.rope.scaling.original_context_length", 65536},
    };
    for (size_t i = 0; i < sizeof u / sizeof u[0]; i++) {
        uint32_t v = 0;
        ds4_status st = ds4_gguf_get_u32(g, u[i].k, &v);
        EXPECT_MSG(!st && v == u[i].v, "%s: %s, got %u want %llu", u[i].k, st ? ds4_last_error() : "ok", v,
                   (unsigned long long)u[i].v);
    }
    const struct {
        const char *k;
        double v;
    } f[] = {
        {"deepseek4.rope.freq_base", 10000}, {"deepseek4.rope.scaling.factor", 16},
        {"deepseek4.rope.scaling.yarn_beta_fast", 32}, {"deepseek4.rope.scaling.yarn_beta_slow", 1},
        {"deepseek4.attention.compress_rope_freq_base", 160000}, {"deepseek4.expert_weights_scale", c->scale},
        {"deepseek4.attention.layer_norm_rms_epsilon", 1e-6}, {"deepseek4.hyper_connection.epsilon", 1e-6},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        float v = 0;
        ds4_status st = ds4_gguf_get_f32(g, f[i].k, &v);
        EXPECT_MSG(!st && fabs(v - f[i].v) <= 1e-6 * fmax(fabs(f[i].v), 1), "%s: got %g want %g", f[i].k, v, f[i].v);
    }
    bool b = false;
    EXPECT(ds4_gguf_get_bool(g, "deepseek4.expert_weights_norm", &b) == DS4_OK && b);
    ds4_gguf_str arch = {0};
    EXPECT(ds4_gguf_get_str(g, "general.architecture", &arch) == DS4_OK && arch.len == 9 &&
           memcmp(arch.ptr, "deepseek4", 9) == 0);
    int64_t kv;
    uint64_t n = 0;
    REQUIRE(ds4_gguf_get_arr(g, "deepseek4.attention.compress_ratios", DS4_GGUF_I32, &kv, &n) == DS4_OK);
    EXPECT(n == c->L);
    for (uint64_t i = 0; i < n && i < c->L; i++) {
        ds4_gguf_value v;
        ds4_gguf_arr_elem(g, kv, i, &v);
        EXPECT_MSG(v.v.i == (int64_t)c->ratio[i], "compress_ratios[%llu] = %lld, want %u", (unsigned long long)i,
                   (long long)v.v.i, c->ratio[i]);
    }
    REQUIRE(ds4_gguf_get_arr(g, "deepseek4.swiglu_clamp_exp", DS4_GGUF_F32, &kv, &n) == DS4_OK);
    EXPECT(n == c->L);
    for (uint64_t i = 0; i < n; i++) {
        ds4_gguf_value v;
        ds4_gguf_arr_elem(g, kv, i, &v);
        EXPECT(fabs(v.v.f - c->swiglu) < 1e-6);
    }
}

/* Compare every tensor of a converted file with the spec table and the
 * source. mode 'f': --type f32 (all float tensors F32, values exact);
 * 'q': --type q8_0 --experts q8_0 (published types; Q8_0 within rounding). */
static void check_file(const char *fixture, const char *gguf_path, char mode)
{
    char p[256];
    cfgv c;
    snprintf(p, sizeof p, "%s/config.json", fixture);
    REQUIRE(read_cfg(test_data(p), &c));
    build_spec(&c);
    stfile sf = {0};
    snprintf(p, sizeof p, "%s/model.safetensors", fixture);
    REQUIRE(st_load(&sf, test_data(p)));
    ds4_gguf *g = ds4_gguf_open(gguf_path);
    REQUIRE(g);
    check_metadata(g, &c);
    EXPECT_MSG(ds4_gguf_n_tensors(g) == nspec, "%lld tensors, spec has %d", (long long)ds4_gguf_n_tensors(g), nspec);
    int bad_values = 0;
    double worst_q8 = 0;
    float *row = malloc(1 << 20);
    for (int i = 0; i < nspec; i++) {
        const spec_t *s = &specs[i];
        const ds4_gguf_tensor *t = tensor(g, s->name);
        EXPECT_MSG(t, "missing tensor %s", s->name);
        if (!t) continue;
        uint32_t want_type = s->cls == C_I32 ? DS4_TYPE_I32
                             : mode == 'f'   ? DS4_TYPE_F32
                             : s->cls == C_F32 ? DS4_TYPE_F32
                             : s->cls == C_F16 ? DS4_TYPE_F16
                                               : DS4_TYPE_Q8_0;
        EXPECT_MSG(t->type == want_type, "%s: type %s, want %s", s->name, ds4_gguf_type_name(t->type),
                   ds4_gguf_type_name(want_type));
        EXPECT_MSG(t->n_dims == (uint32_t)s->nd, "%s: %u dims, want %d", s->name, t->n_dims, s->nd);
        for (int d = 0; d < s->nd; d++)
            EXPECT_MSG(t->ne[d] == s->ne[d], "%s: ne[%d] = %llu, want %llu", s->name, d,
                       (unsigned long long)t->ne[d], (unsigned long long)s->ne[d]);
        const char *dtype;
        int64_t shape[8];
        int nd;
        const uint8_t *data;
        EXPECT_MSG(st_get(&sf, s->src, &dtype, shape, &nd, &data), "fixture lacks %s", s->src);
        if (t->type != want_type || !st_get(&sf, s->src, &dtype, shape, &nd, &data)) continue;
        uint64_t slabs = s->nd == 3 ? s->ne[2] : 1, rows = s->nd > 1 ? s->ne[1] : 1, ne0 = s->ne[0];
        int64_t rb = ds4_row_bytes(t->type, (int64_t)ne0);
        for (uint64_t e = 0; e < slabs; e++)
            for (uint64_t r = 0; r < rows; r++) {
                const uint8_t *q = (const uint8_t *)t->data + (e * rows + r) * (uint64_t)rb;
                if (t->type == DS4_TYPE_I32) {
                    for (uint64_t k = 0; k < ne0; k++) {
                        int32_t v;
                        memcpy(&v, q + 4 * k, 4);
                        bad_values += v != (int32_t)src_value(s, dtype, data, e, r, k);
                    }
                    continue;
                }
                ds4_dequantize_row(t->type, q, row, (int64_t)ne0);
                double amax[64] = {0};
                for (uint64_t k = 0; k < ne0 && t->type == DS4_TYPE_Q8_0; k++)
                    amax[k / 32] = fmax(amax[k / 32], fabs(src_value(s, dtype, data, e, r, k)));
                for (uint64_t k = 0; k < ne0; k++) {
                    double x = src_value(s, dtype, data, e, r, k);
                    if (t->type == DS4_TYPE_F32) bad_values += (float)x != row[k];
                    else if (t->type == DS4_TYPE_F16) bad_values += ds4_f16_to_f32(ds4_f32_to_f16((float)x)) != row[k];
                    else {
                        /* Q8_0: |x - d q| <= d/2 with d = amax/127, plus f16 rounding of d */
                        double err = fabs(row[k] - x), lim = amax[k / 32] / 127.0 * 0.6 + 1e-12;
                        worst_q8 = fmax(worst_q8, err / lim);
                        bad_values += err > lim;
                    }
                }
            }
    }
    free(row);
    EXPECT_MSG(bad_values == 0, "%d values differ from the source beyond their type's rounding", bad_values);
    if (mode == 'q') EXPECT_MSG(worst_q8 > 0.3, "Q8_0 error suspiciously small (%.3f of the bound)", worst_q8);
    ds4_gguf_close(g);
    st_unload(&sf);
}

static void test_tiny_a_f32(void)
{
    const char *out = tmp("a-f32.gguf");
    ds4_status st = convert(test_data("dsv4-tiny-a"), out, "f32", "f32", 2);
    REQUIRE(st == DS4_OK || (fprintf(stderr, "%s\n", ds4_last_error()), 0));
    check_file("dsv4-tiny-a", out, 'f');
    unlink(out);
}

static void test_tiny_c_f32(void)
{
    const char *out = tmp("c-f32.gguf");
    ds4_status st = convert(test_data("dsv4-tiny-c"), out, "f32", "f32", 2);
    REQUIRE(st == DS4_OK || (fprintf(stderr, "%s\n", ds4_last_error()), 0));
    check_file("dsv4-tiny-c", out, 'f');
    unlink(out);
}

static void test_tiny_a_q8_0(void)
{
    const char *out = tmp("a-q8.gguf"), *out1 = tmp("a-q8-t1.gguf");
    REQUIRE(convert(test_data("dsv4-tiny-a"), out, "q8_0", "q8_0", 2) == DS4_OK);
    check_file("dsv4-tiny-a", out, 'q');
    /* same bytes whatever the number of threads */
    REQUIRE(convert(test_data("dsv4-tiny-a"), out1, "q8_0", "q8_0", 1) == DS4_OK);
    size_t n0, n1;
    char *a = test_read_file(out, &n0), *b = test_read_file(out1, &n1);
    EXPECT(a && b && n0 == n1 && memcmp(a, b, n0) == 0);
    free(a);
    free(b);
    unlink(out);
    unlink(out1);
}

/* K-quants need rows that are multiples of 256: tiny-a's are 128 and 64. */
static void test_kquant_rows_rejected(void)
{
    const char *out = tmp("a-q2.gguf");
    ds4_status st = convert(test_data("dsv4-tiny-a"), out, "q8_0", "q2", 1);
    EXPECT(st != DS4_OK);
    EXPECT_MSG(strstr(ds4_last_error(), "blk.0.ffn_gate_exps.weight") && strstr(ds4_last_error(), "256"),
               "message: %s", ds4_last_error());
    EXPECT(!file_exists(out));
}

/* ---- bad input ---------------------------------------------------------- */

typedef enum { MUT_DROP, MUT_SHAPE, MUT_DTYPE, MUT_FP8_NO_SCALE } mutation;

/* Copy tiny-a into dir, rewriting its safetensors with one tensor changed. */
static int make_mutant(const char *dir, const char *victim, mutation m)
{
    stfile sf = {0};
    if (!st_load(&sf, test_data("dsv4-tiny-a/model.safetensors"))) return 0;
    mkdir(dir, 0755);
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", dir);
    size_t cl;
    char *cfg = test_read_file(test_data("dsv4-tiny-a/config.json"), &cl);
    FILE *f = fopen(p, "wb");
    if (!f || !cfg) return 0;
    fwrite(cfg, 1, cl, f);
    fclose(f);
    free(cfg);
    int n = (int)json_object_size(sf.hdr), k = 0;
    st_write_tensor *t = calloc((size_t)n, sizeof *t);
    const char *key;
    json_t *v;
    json_object_foreach(sf.hdr, key, v) {
        if (strcmp(key, "__metadata__") == 0) continue;
        st_write_tensor *w = &t[k];
        json_t *sh = json_object_get(v, "shape"), *off = json_object_get(v, "data_offsets");
        w->name = key;
        w->dtype = json_string_value(json_object_get(v, "dtype"));
        w->n_dims = (int)json_array_size(sh);
        for (int d = 0; d < w->n_dims; d++) w->shape[d] = json_integer_value(json_array_get(sh, (size_t)d));
        w->data = sf.buf + sf.data + json_integer_value(json_array_get(off, 0));
        w->nbytes = (size_t)(json_integer_value(json_array_get(off, 1)) - json_integer_value(json_array_get(off, 0)));
        if (strcmp(key, victim) == 0) {
            if (m == MUT_DROP) continue;
            if (m == MUT_SHAPE) { /* one row fewer */
                w->nbytes -= w->nbytes / (size_t)w->shape[0];
                w->shape[0] -= 1;
            }
            if (m == MUT_DTYPE) w->dtype = "F8_E5M2", w->nbytes /= 2;
            if (m == MUT_FP8_NO_SCALE) w->dtype = "F8_E4M3", w->nbytes /= 2;
        }
        k++;
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    ds4_status st = st_write_file(p, t, k);
    free(t);
    st_unload(&sf);
    return st == DS4_OK;
}

static void expect_failure(const char *dir, const char *must_name, const char *what)
{
    const char *out = tmp("bad.gguf");
    char tmpout[300];
    snprintf(tmpout, sizeof tmpout, "%s.tmp", out);
    ds4_status st = convert(dir, out, "f32", "f32", 1);
    EXPECT_MSG(st != DS4_OK, "%s: conversion succeeded", what);
    EXPECT_MSG(strstr(ds4_last_error(), must_name), "%s: message does not name %s: %s", what, must_name,
               ds4_last_error());
    EXPECT_MSG(!file_exists(out) && !file_exists(tmpout), "%s: output left behind", what);
}

static void test_bad_inputs(void)
{
    const char *victim = "model.layers.3.self_attn.q_b_proj.weight";
    REQUIRE(make_mutant(tmp("drop"), victim, MUT_DROP));
    expect_failure(tmp("drop"), victim, "missing tensor");
    REQUIRE(make_mutant(tmp("shape"), "model.layers.1.mlp.experts.down_proj", MUT_SHAPE));
    expect_failure(tmp("shape"), "model.layers.1.mlp.experts.down_proj", "wrong shape");
    REQUIRE(make_mutant(tmp("dtype"), "model.norm.weight", MUT_DTYPE));
    expect_failure(tmp("dtype"), "model.norm.weight", "unknown dtype");
    REQUIRE(make_mutant(tmp("fp8"), victim, MUT_FP8_NO_SCALE));
    expect_failure(tmp("fp8"), victim, "FP8 without scale");

    /* header JSON cut short */
    REQUIRE(make_mutant(tmp("json"), victim, MUT_SHAPE));
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors", tmp("json"));
    FILE *f = fopen(p, "r+b");
    REQUIRE(f);
    fseek(f, 8, SEEK_SET); /* the header's opening brace */
    fputc('x', f);
    fclose(f);
    expect_failure(tmp("json"), "JSON", "bad safetensors header");

    /* bad config.json */
    REQUIRE(make_mutant(tmp("cfg"), victim, MUT_SHAPE));
    snprintf(p, sizeof p, "%s/config.json", tmp("cfg"));
    f = fopen(p, "wb");
    REQUIRE(f);
    fputs("{\"vocab_size\": 1024, \"hidden_size\": ", f);
    fclose(f);
    expect_failure(tmp("cfg"), "config.json", "bad config JSON");

    /* config missing a shape key */
    f = fopen(p, "wb");
    REQUIRE(f);
    fputs("{\"vocab_size\": 1024, \"layer_types\": []}", f);
    fclose(f);
    expect_failure(tmp("cfg"), "hidden_size", "config without hidden_size");

    /* no checkpoint at all */
    expect_failure(tmp("nonexistent"), "nonexistent", "missing directory");
}

/* --imatrix: the legacy imatrix.dat layout; per-tensor and per-expert
 * entries, values / ncall; wrong lengths and broken files are errors. */
static void test_imatrix(void)
{
    float shared[128], per_expert[128 * 8];
    for (int i = 0; i < 128; i++) shared[i] = 1.0f + (float)i;
    for (int i = 0; i < 128 * 8; i++) per_expert[i] = (float)(i / 128) + 0.5f;
    const char *names[2] = {"blk.3.ffn_gate_exps.weight", "blk.3.ffn_up_exps.weight"};
    const float *vals[2] = {shared, per_expert};
    int32_t nval[2] = {128, 128 * 8};
    const char *path = tmp("im.dat");
    REQUIRE(convert_imatrix_write(path, 2, names, vals, nval) == DS4_OK);
    convert_imatrix *im = convert_imatrix_load(path);
    REQUIRE(im);
    ds4_status st = DS4_OK;
    const float *v = convert_imatrix_find(im, "blk.3.ffn_gate_exps.weight", 128, 5, 8, &st);
    EXPECT(v && v[0] == 1.0f && v[127] == 128.0f && !st);
    v = convert_imatrix_find(im, "blk.3.ffn_up_exps.weight", 128, 5, 8, &st);
    EXPECT(v && v[0] == 5.5f && !st); /* expert 5's vector */
    EXPECT(!convert_imatrix_find(im, "blk.3.ffn_down_exps.weight", 64, 0, 8, &st) && !st);
    v = convert_imatrix_find(im, "blk.3.ffn_gate_exps.weight", 64, 0, 8, &st);
    EXPECT(!v && st && strstr(ds4_last_error(), "blk.3.ffn_gate_exps.weight"));
    convert_imatrix_free(im);

    /* a conversion that uses it (MXFP4 weights its error by the imatrix) */
    convert_options o = {.out = tmp("im.gguf"), .dense = DS4_TYPE_Q8_0, .exp_gate_up = DS4_TYPE_MXFP4,
                         .exp_down = DS4_TYPE_MXFP4, .imatrix = path, .threads = 2, .quiet = true};
    EXPECT_MSG(convert_checkpoint(test_data("dsv4-tiny-a"), &o) == DS4_OK, "%s", ds4_last_error());
    unlink(o.out);

    /* an entry of the wrong length fails the conversion, naming it */
    nval[0] = 100;
    REQUIRE(convert_imatrix_write(path, 1, names, vals, nval) == DS4_OK);
    EXPECT(convert_checkpoint(test_data("dsv4-tiny-a"), &o) != DS4_OK &&
           strstr(ds4_last_error(), "blk.3.ffn_gate_exps.weight"));
    EXPECT(!file_exists(o.out));

    /* truncated file */
    REQUIRE(convert_imatrix_write(path, 2, names, vals, (int32_t[]){128, 1024}) == DS4_OK);
    REQUIRE(truncate(path, 200) == 0);
    EXPECT(!convert_imatrix_load(path) && strstr(ds4_last_error(), "imatrix"));
    unlink(path);
}

/* The reader on damaged files: random byte flips in the header and random
 * truncations either open to a consistent archive (every tensor's bytes
 * inside the file) or fail with a message; never crash (run under ASan by
 * `make asan`). */
static void test_safetensors_damage(void)
{
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[4] = {1, 2, 3, 4};
    st_write_tensor t[3] = {
        {.name = "a", .dtype = "F32", .n_dims = 2, .shape = {2, 3}, .data = a, .nbytes = sizeof a},
        {.name = "b.weight", .dtype = "BF16", .n_dims = 1, .shape = {4}, .data = b, .nbytes = sizeof b},
        {.name = "c", .dtype = "F8_E4M3", .n_dims = 0, .data = b, .nbytes = 1},
    };
    const char *path = tmp("damage.safetensors");
    REQUIRE(st_write_file(path, t, 3) == DS4_OK);
    size_t len;
    uint8_t *orig = test_read_file(path, &len);
    REQUIRE(orig && len > 40);
    st_archive *ok = st_open(path);
    REQUIRE(ok);
    EXPECT(st_count(ok) == 3 && st_find(ok, "b.weight") && st_find(ok, "b.weight")->nbytes == 8 &&
           st_nelements(st_find(ok, "c")) == 1);
    st_close(ok);
    uint64_t hl;
    memcpy(&hl, orig, 8);
    uint8_t *buf = malloc(len);
    unsigned seed = 12345;
    int opened = 0, failed = 0;
    for (int k = 0; k < 400; k++) {
        memcpy(buf, orig, len);
        size_t n = len;
        seed = seed * 1103515245u + 12345u;
        if (k % 4 == 3) n = (seed >> 8) % len; /* truncation */
        else
            for (int f = 0; f < 1 + k % 3; f++) { /* flips in the length or the header */
                seed = seed * 1103515245u + 12345u;
                size_t at = (seed >> 8) % (8 + hl);
                buf[at] ^= (uint8_t)(1u << ((seed >> 4) % 8));
            }
        FILE *fp = fopen(path, "wb");
        REQUIRE(fp);
        fwrite(buf, 1, n, fp);
        fclose(fp);
        st_archive *s = st_open(path);
        if (!s) {
            failed++;
            EXPECT(ds4_last_error()[0] != 0);
            continue;
        }
        opened++;
        volatile uint8_t sink = 0;
        for (int64_t i = 0; i < st_count(s); i++) {
            const st_tensor *x = st_at(s, i);
            if (x->nbytes) sink ^= x->data[x->nbytes - 1];
        }
        (void)sink;
        st_close(s);
    }
    EXPECT(opened > 0 && failed > 0);
    free(buf);
    free(orig);
    unlink(path);
}

int main(void)
{
    RUN(test_tiny_a_f32);
    RUN(test_tiny_c_f32);
    RUN(test_tiny_a_q8_0);
    RUN(test_kquant_rows_rejected);
    RUN(test_bad_inputs);
    RUN(test_imatrix);
    RUN(test_safetensors_damage);
    if (tmpdir[0]) test_remove_dir(tmpdir);
    return test_finish();
}

/*
 * model_fixture.h - test-only: write a DeepSeek V4 GGUF from a golden
 * fixture directory (transformers-named safetensors + config.json) with the
 * GGUF writer, so the model tests do not depend on the converter
 * (tools/ds4-quantize is tested against the same fixtures separately, in
 * tests/test_model_convert.sh).
 *
 * Tensor names and metadata keys follow shared/docs/dsv4-model.md §1.2 and
 * §2. `quant`: every tensor the published files store as Q8_0 (attention
 * projections, shared and routed experts, LM head) becomes Q8_0 and every
 * published F16 tensor (embedding, HC fns, compressors, indexer, router)
 * becomes F16 (quant = 1); quant = 2 writes F32 tensors holding exactly the
 * values those types decode to (to check the quantized matmuls exactly);
 * quant = 0 writes the fixture's values as F32. Header-only (static), for
 * tests/test_model*.c.
 */
#ifndef DS4_TESTS_MODEL_FIXTURE_H
#define DS4_TESTS_MODEL_FIXTURE_H

#include "gguf/gguf.h"
#include "model/dsv4_model.h"
#include "model/dsv4_state.h"
#include "quant/half.h"
#include "quant/quant.h"
#include "tests/test.h"
#include "util/error.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    char name[128];
    uint32_t type;
    uint32_t nd;
    uint64_t ne[4];
    void *data;
} fx_tensor;

typedef struct {
    uint8_t *file;
    size_t file_len;
    json_t *hdr;
    size_t base;
    json_t *cfg;
    fx_tensor t[512];
    int n;
    int ok;
    int roundtrip;
} fx_ctx;

/* values of safetensors tensor `hf` as f32 (or raw i32), shape reversed */
static float *fx_load(fx_ctx *c, const char *hf, uint64_t *ne, uint32_t *nd, int *is_int)
{
    json_t *e = json_object_get(c->hdr, hf);
    if (!e) {
        fprintf(stderr, "fixture: missing %s\n", hf);
        c->ok = 0;
        return NULL;
    }
    const char *dt = json_string_value(json_object_get(e, "dtype"));
    json_t *sh = json_object_get(e, "shape"), *off = json_object_get(e, "data_offsets");
    size_t n = 1, k = json_array_size(sh);
    for (size_t i = 0; i < k; i++) {
        ne[k - 1 - i] = (uint64_t)json_integer_value(json_array_get(sh, i));
        n *= ne[k - 1 - i];
    }
    *nd = (uint32_t)k;
    const uint8_t *src = c->file + c->base + (size_t)json_integer_value(json_array_get(off, 0));
    float *out = malloc(n * 4);
    *is_int = 0;
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(dt, "BF16")) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            out[i] = ds4_bf16_to_f32(h);
        } else if (!strcmp(dt, "F32")) {
            memcpy(&out[i], src + 4 * i, 4);
        } else if (!strcmp(dt, "I32")) {
            memcpy(&out[i], src + 4 * i, 4);
            *is_int = 1;
        } else if (!strcmp(dt, "I64")) {
            int64_t v;
            memcpy(&v, src + 8 * i, 8);
            int32_t w = (int32_t)v;
            memcpy(&out[i], &w, 4);
            *is_int = 1;
        }
    }
    return out;
}

/* Add GGUF tensor `name` from values (f32 [ne]) as `type`. Takes `v`. */
static void fx_put(fx_ctx *c, const char *name, float *v, uint32_t nd, const uint64_t *ne, uint32_t type)
{
    if (!v) return;
    fx_tensor *t = &c->t[c->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->nd = nd;
    uint64_t n = 1;
    for (uint32_t i = 0; i < nd; i++) n *= (t->ne[i] = ne[i]);
    t->type = type;
    if (type == DS4_TYPE_F32 || type == DS4_TYPE_I32) {
        t->data = v;
        return;
    }
    if (c->roundtrip) { /* F32 holding exactly the values the quantized type decodes to */
        int64_t rb = ds4_row_bytes((ds4_type)type, (int64_t)ne[0]), rows = (int64_t)(n / ne[0]);
        void *q = malloc((size_t)(rb * rows));
        if (type == DS4_TYPE_F16) {
            for (uint64_t i = 0; i < n; i++) v[i] = ds4_f16_to_f32(ds4_f32_to_f16(v[i]));
        } else if (ds4_quantize_rows((ds4_type)type, v, q, rows, (int64_t)ne[0], NULL) != DS4_OK) {
            c->ok = 0;
        } else {
            for (int64_t r = 0; r < rows; r++)
                ds4_dequantize_row((ds4_type)type, (char *)q + r * rb, v + r * (int64_t)ne[0], (int64_t)ne[0]);
        }
        free(q);
        t->type = DS4_TYPE_F32;
        t->data = v;
        return;
    }
    if (type == DS4_TYPE_F16) {
        uint16_t *h = malloc(n * 2);
        for (uint64_t i = 0; i < n; i++) h[i] = ds4_f32_to_f16(v[i]);
        t->data = h;
    } else {
        int64_t rb = ds4_row_bytes((ds4_type)type, (int64_t)ne[0]);
        t->data = malloc((size_t)(rb * (int64_t)(n / ne[0])));
        if (ds4_quantize_rows((ds4_type)type, v, t->data, (int64_t)(n / ne[0]), (int64_t)ne[0], NULL) != DS4_OK) {
            fprintf(stderr, "fixture: quantize %s: %s\n", name, ds4_last_error());
            c->ok = 0;
        }
    }
    free(v);
}

static void fx_map(fx_ctx *c, const char *gguf, const char *hf, uint32_t type)
{
    uint64_t ne[4];
    uint32_t nd;
    int is_int;
    float *v = fx_load(c, hf, ne, &nd, &is_int);
    fx_put(c, gguf, v, nd, ne, is_int ? DS4_TYPE_I32 : type);
}

static int fx_cfg_int(fx_ctx *c, const char *k) { return (int)json_integer_value(json_object_get(c->cfg, k)); }

/* Write the GGUF; 1 on success. */
static inline int fixture_write_gguf(const char *dir, const char *out, int quant)
{
    fx_ctx *c = calloc(1, sizeof *c);
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    c->file = test_read_file(path, &c->file_len);
    snprintf(path, sizeof path, "%s/config.json", dir);
    c->cfg = json_load_file(path, 0, NULL);
    if (!c->file || !c->cfg) {
        fprintf(stderr, "fixture: cannot read %s\n", dir);
        free(c);
        return 0;
    }
    uint64_t hl;
    memcpy(&hl, c->file, 8);
    c->hdr = json_loadb((const char *)c->file + 8, (size_t)hl, 0, NULL);
    c->base = 8 + (size_t)hl;
    c->ok = c->hdr != NULL;
    c->roundtrip = quant == 2;
    uint32_t F32 = DS4_TYPE_F32, Q = quant ? DS4_TYPE_Q8_0 : F32, H = quant ? DS4_TYPE_F16 : F32;
    int L = fx_cfg_int(c, "num_hidden_layers");
    json_t *lt = json_object_get(c->cfg, "layer_types"), *mt = json_object_get(c->cfg, "mlp_layer_types");
    json_t *rates = json_object_get(c->cfg, "compress_rates");
    int32_t ratio[64];
    float clamp[64];
    int n_hash = 0;
    for (int i = 0; i < L; i++) {
        const char *s = json_string_value(json_array_get(lt, (size_t)i));
        ratio[i] = !strcmp(s, "sliding_attention") ? 0 : (int32_t)json_integer_value(json_object_get(rates, s));
        clamp[i] = (float)json_number_value(json_object_get(c->cfg, "swiglu_limit"));
        n_hash += !strcmp(json_string_value(json_array_get(mt, (size_t)i)), "hash_moe");
    }
    if (c->ok) {
        fx_map(c, "token_embd.weight", "model.embed_tokens.weight", H);
        fx_map(c, "output_hc_fn.weight", "model.hc_head.hc_fn", H);
        fx_map(c, "output_hc_base.weight", "model.hc_head.hc_base", F32);
        fx_map(c, "output_hc_scale.weight", "model.hc_head.hc_scale", F32);
        fx_map(c, "output_norm.weight", "model.norm.weight", F32);
        fx_map(c, "output.weight", "lm_head.weight", Q);
    }
    static const struct {
        const char *gguf, *hf;
        int kind; /* 0 F32, 1 Q8_0-published, 2 F16-published */
        int cond; /* 0 all, 1 compressed, 2 CSA, 3 hash, 4 non-hash */
    } map[] = {
        {"hc_attn_fn.weight", "attn_hc.fn", 2, 0},
        {"hc_attn_scale.weight", "attn_hc.scale", 0, 0},
        {"hc_attn_base.weight", "attn_hc.base", 0, 0},
        {"attn_norm.weight", "input_layernorm.weight", 0, 0},
        {"attn_q_a.weight", "self_attn.q_a_proj.weight", 1, 0},
        {"attn_q_a_norm.weight", "self_attn.q_a_norm.weight", 0, 0},
        {"attn_q_b.weight", "self_attn.q_b_proj.weight", 1, 0},
        {"attn_kv.weight", "self_attn.kv_proj.weight", 1, 0},
        {"attn_kv_a_norm.weight", "self_attn.kv_norm.weight", 0, 0},
        {"attn_sinks.weight", "self_attn.sinks", 0, 0},
        {"attn_output_a.weight", "self_attn.o_a_proj.weight", 1, 0},
        {"attn_output_b.weight", "self_attn.o_b_proj.weight", 1, 0},
        {"attn_compressor_ape.weight", "self_attn.compressor.position_bias", 2, 1},
        {"attn_compressor_kv.weight", "self_attn.compressor.kv_proj.weight", 2, 1},
        {"attn_compressor_gate.weight", "self_attn.compressor.gate_proj.weight", 2, 1},
        {"attn_compressor_norm.weight", "self_attn.compressor.kv_norm.weight", 0, 1},
        {"indexer.attn_q_b.weight", "self_attn.compressor.indexer.q_b_proj.weight", 2, 2},
        {"indexer.proj.weight", "self_attn.compressor.indexer.scorer.weights_proj.weight", 2, 2},
        {"indexer_compressor_ape.weight", "self_attn.compressor.indexer.position_bias", 2, 2},
        {"indexer_compressor_kv.weight", "self_attn.compressor.indexer.kv_proj.weight", 2, 2},
        {"indexer_compressor_gate.weight", "self_attn.compressor.indexer.gate_proj.weight", 2, 2},
        {"indexer_compressor_norm.weight", "self_attn.compressor.indexer.kv_norm.weight", 0, 2},
        {"hc_ffn_fn.weight", "ffn_hc.fn", 2, 0},
        {"hc_ffn_scale.weight", "ffn_hc.scale", 0, 0},
        {"hc_ffn_base.weight", "ffn_hc.base", 0, 0},
        {"ffn_norm.weight", "post_attention_layernorm.weight", 0, 0},
        {"ffn_gate_inp.weight", "mlp.gate.weight", 2, 0},
        {"exp_probs_b.bias", "mlp.gate.e_score_correction_bias", 0, 4},
        {"ffn_gate_tid2eid.weight", "mlp.gate.tid2eid", 0, 3},
        {"ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight", 1, 0},
        {"ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight", 1, 0},
        {"ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight", 1, 0},
    };
    for (int i = 0; i < L && c->ok; i++) {
        int hash = i < n_hash;
        for (size_t k = 0; k < sizeof map / sizeof *map; k++) {
            int cd = map[k].cond;
            if ((cd == 1 && !ratio[i]) || (cd == 2 && ratio[i] != 4) || (cd == 3 && !hash) || (cd == 4 && hash)) continue;
            char g[128], h[160];
            snprintf(g, sizeof g, "blk.%d.%s", i, map[k].gguf);
            snprintf(h, sizeof h, "model.layers.%d.%s", i, map[k].hf);
            fx_map(c, g, h, map[k].kind == 1 ? Q : map[k].kind == 2 ? H : F32);
        }
        /* fused gate_up [E, 2F, D] -> gate [D, F, E] and up [D, F, E] */
        char h[160], g[128];
        uint64_t ne[4];
        uint32_t nd;
        int is_int;
        snprintf(h, sizeof h, "model.layers.%d.mlp.experts.gate_up_proj", i);
        float *gu = fx_load(c, h, ne, &nd, &is_int);
        if (!gu) break;
        uint64_t D = ne[0], F2 = ne[1], E = ne[2], F = F2 / 2;
        float *gt = malloc(D * F * E * 4), *up = malloc(D * F * E * 4);
        for (uint64_t e = 0; e < E; e++) {
            memcpy(gt + e * F * D, gu + e * F2 * D, F * D * 4);
            memcpy(up + e * F * D, gu + e * F2 * D + F * D, F * D * 4);
        }
        free(gu);
        uint64_t gne[3] = {D, F, E};
        snprintf(g, sizeof g, "blk.%d.ffn_gate_exps.weight", i);
        fx_put(c, g, gt, 3, gne, Q);
        snprintf(g, sizeof g, "blk.%d.ffn_up_exps.weight", i);
        fx_put(c, g, up, 3, gne, Q);
        snprintf(g, sizeof g, "blk.%d.ffn_down_exps.weight", i);
        snprintf(h, sizeof h, "model.layers.%d.mlp.experts.down_proj", i);
        fx_map(c, g, h, Q);
    }

    ds4_gguf_writer *w = ds4_gguf_writer_new();
    json_t *rp = json_object_get(json_object_get(c->cfg, "rope_parameters"), "compress");
#define A "deepseek4."
#define U32(k, v) ds4_gguf_writer_add_u32(w, A k, (uint32_t)(v))
#define F32V(k, v) ds4_gguf_writer_add_f32(w, A k, (float)(v))
    ds4_gguf_writer_add_str(w, "general.architecture", "deepseek4");
    U32("block_count", L);
    U32("embedding_length", fx_cfg_int(c, "hidden_size"));
    U32("vocab_size", fx_cfg_int(c, "vocab_size"));
    U32("attention.head_count", fx_cfg_int(c, "num_attention_heads"));
    U32("attention.head_count_kv", 1);
    U32("attention.key_length", fx_cfg_int(c, "head_dim"));
    U32("attention.value_length", fx_cfg_int(c, "head_dim"));
    U32("rope.dimension_count", fx_cfg_int(c, "qk_rope_head_dim"));
    U32("attention.q_lora_rank", fx_cfg_int(c, "q_lora_rank"));
    U32("attention.output_lora_rank", fx_cfg_int(c, "o_lora_rank"));
    U32("attention.output_group_count", fx_cfg_int(c, "o_groups"));
    U32("expert_count", fx_cfg_int(c, "n_routed_experts"));
    U32("expert_used_count", fx_cfg_int(c, "num_experts_per_tok"));
    U32("expert_feed_forward_length", fx_cfg_int(c, "moe_intermediate_size"));
    U32("expert_shared_count", 1);
    U32("hash_layer_count", n_hash);
    U32("attention.sliding_window", fx_cfg_int(c, "sliding_window"));
    U32("attention.indexer.head_count", fx_cfg_int(c, "index_n_heads"));
    U32("attention.indexer.key_length", fx_cfg_int(c, "index_head_dim"));
    U32("attention.indexer.top_k", fx_cfg_int(c, "index_topk"));
    U32("hyper_connection.count", fx_cfg_int(c, "hc_mult"));
    U32("hyper_connection.sinkhorn_iterations", fx_cfg_int(c, "hc_sinkhorn_iters"));
    U32("rope.scaling.original_context_length", json_integer_value(json_object_get(rp, "original_max_position_embeddings")));
    F32V("rope.freq_base", json_number_value(json_object_get(c->cfg, "rope_theta")));
    F32V("rope.scaling.factor", json_number_value(json_object_get(rp, "factor")));
    F32V("rope.scaling.yarn_beta_fast", json_number_value(json_object_get(rp, "beta_fast")));
    F32V("rope.scaling.yarn_beta_slow", json_number_value(json_object_get(rp, "beta_slow")));
    F32V("attention.compress_rope_freq_base", json_number_value(json_object_get(c->cfg, "compress_rope_theta")));
    F32V("expert_weights_scale", json_number_value(json_object_get(c->cfg, "routed_scaling_factor")));
    F32V("attention.layer_norm_rms_epsilon", json_number_value(json_object_get(c->cfg, "rms_norm_eps")));
    F32V("hyper_connection.epsilon", json_number_value(json_object_get(c->cfg, "hc_eps")));
    ds4_gguf_writer_add_bool(w, A "expert_weights_norm", true);
    ds4_gguf_writer_add_arr(w, A "attention.compress_ratios", DS4_GGUF_I32, ratio, (uint64_t)L);
    ds4_gguf_writer_add_arr(w, A "swiglu_clamp_exp", DS4_GGUF_F32, clamp, (uint64_t)L);
#undef A
#undef U32
#undef F32V
    for (int i = 0; i < c->n; i++)
        if (ds4_gguf_writer_add_tensor(w, c->t[i].name, c->t[i].type, c->t[i].nd, c->t[i].ne, c->t[i].data) != DS4_OK) {
            fprintf(stderr, "fixture: %s\n", ds4_last_error());
            c->ok = 0;
        }
    if (c->ok && ds4_gguf_writer_write(w, out) != DS4_OK) {
        fprintf(stderr, "fixture: write %s: %s\n", out, ds4_last_error());
        c->ok = 0;
    }
    int ok = c->ok;
    ds4_gguf_writer_free(w);
    for (int i = 0; i < c->n; i++) free(c->t[i].data);
    json_decref(c->hdr);
    json_decref(c->cfg);
    free(c->file);
    free(c);
    return ok;
}

/* Token ids and golden logits of sequence `seq` of a fixture manifest. */
static inline int fixture_sequence(const char *dir, int seq, int32_t **tokens, int64_t *n, float **logits, int *vocab)
{
    char path[512];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    json_t *m = json_load_file(path, 0, NULL);
    json_t *s = m ? json_array_get(json_object_get(m, "sequences"), (size_t)seq) : NULL;
    if (!s) {
        json_decref(m);
        return 0;
    }
    json_t *toks = json_object_get(s, "tokens");
    *n = (int64_t)json_array_size(toks);
    *tokens = malloc((size_t)*n * 4);
    for (int64_t i = 0; i < *n; i++) (*tokens)[i] = (int32_t)json_integer_value(json_array_get(toks, (size_t)i));
    *vocab = (int)json_integer_value(json_array_get(json_object_get(s, "shape"), 1));
    snprintf(path, sizeof path, "%s/%s", dir, json_string_value(json_object_get(s, "logits")));
    size_t len;
    *logits = test_read_file(path, &len);
    json_decref(m);
    return *logits && len == (size_t)*n * (size_t)*vocab * 4;
}

/* A fixture's model, its GGUF written to gguf (under build/tests, made
 * here) and loaded, and its sequence 0's tokens: the model or NULL where
 * it could not be built (ds4_last_error says why); *n is 0 where the
 * tokens could not be read. */
static inline dsv4_model *fixture_model_tokens(const char *dir, const char *gguf, int32_t **tokens, int64_t *n)
{
    mkdir("build", 0755);
    mkdir("build/tests", 0755);
    dsv4_model *m = fixture_write_gguf(dir, gguf, 0) ? dsv4_model_load(gguf) : NULL;
    float *gold = NULL;
    int vocab = 0;
    *tokens = NULL;
    *n = 0;
    if (m && !fixture_sequence(dir, 0, tokens, n, &gold, &vocab)) *n = 0;
    free(gold);
    return m;
}

/* Prefill `pre` of tok in chunks of 50, then `dec` decode steps, with one
 * state on backend a and one on b; true when every forward's logits are
 * the same bytes. *forwards: the forwards run. */
static inline bool fixture_same_logits(const dsv4_model *m, const int32_t *tok, ds4_backend *a, ds4_backend *b,
                                       int pre, int dec, int *forwards)
{
    dsv4_state *sa = NULL, *sb = NULL;
    const int V = m->cfg.n_vocab;
    float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V);
    bool same = a && b && la && lb && dsv4_state_create(m, a, pre + dec, 64, NULL, &sa) == DS4_OK &&
                dsv4_state_create(m, b, pre + dec, 64, NULL, &sb) == DS4_OK;
    *forwards = 0;
    for (int i = 0; same && i < pre + dec; (*forwards)++) {
        const int n = i < pre ? 50 : 1;
        same = dsv4_forward(sa, tok + i, n, false, la) == DS4_OK && dsv4_forward(sb, tok + i, n, false, lb) == DS4_OK &&
               memcmp(la, lb, sizeof(float) * V) == 0;
        i += n;
    }
    if (sa) dsv4_state_free(sa);
    if (sb) dsv4_state_free(sb);
    free(la), free(lb);
    return same;
}

/* fixture_same_logits, then both backends destroyed (either may be NULL:
 * a backend that could not be made is not the same) */
static inline bool fixture_same_logits_free(const dsv4_model *m, const int32_t *tok, ds4_backend *a, ds4_backend *b,
                                            int pre, int dec, int *forwards)
{
    const bool same = fixture_same_logits(m, tok, a, b, pre, dec, forwards);
    if (b) b->destroy(b);
    if (a) a->destroy(a);
    return same;
}

/* The tiny fixture model and at least 120 of its tokens are there, or a
 * skip that says why. */
static inline bool fixture_ready(const dsv4_model *m, int64_t n_tok)
{
    if (m && n_tok >= 120) return true;
    test_skip("tiny-a fixture model could not be built: %s", ds4_last_error());
    return false;
}

#endif

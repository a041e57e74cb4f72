/*
 * convert_config.c - config.json (transformers or official style) and the
 * flash/pro presets -> convert_config (see convert_config.h).
 *
 * Keys that define a shape are required (an error names the key); keys with
 * a value fixed by the architecture (hc_mult, eps, swiglu_limit, ...) fall
 * back to the Flash value of dsv4-model.md §1.1 when absent.
 */
#include "tools/convert_config.h"

#include "util/error.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define DIM_MAX (1u << 20) /* any single dimension; keeps products in 64 bits */

typedef struct {
    json_t *root;
    const char *what;
    ds4_status st;
} reader;

static json_t *get_path(json_t *obj, const char *key)
{
    return json_is_object(obj) ? json_object_get(obj, key) : NULL;
}

static uint32_t get_u32_in(reader *r, json_t *obj, const char *key, bool required, uint32_t def)
{
    json_t *v = get_path(obj, key);
    if (!v || json_is_null(v)) {
        if (required && !r->st)
            r->st = ds4_fail(DS4_ERR_FORMAT, "config: %s: missing key \"%s\"", r->what, key);
        return def;
    }
    double d = json_number_value(v);
    if (!json_is_number(v) || d < 0 || d > 4294967295.0 || d != floor(d)) {
        if (!r->st)
            r->st = ds4_fail(DS4_ERR_FORMAT, "config: %s: \"%s\" is not a non-negative integer",
                             r->what, key);
        return def;
    }
    return (uint32_t)d;
}

static uint32_t get_u32(reader *r, const char *key, bool required, uint32_t def)
{
    return get_u32_in(r, r->root, key, required, def);
}

static float get_f32_in(reader *r, json_t *obj, const char *key, bool required, float def)
{
    json_t *v = get_path(obj, key);
    if (!v || json_is_null(v)) {
        if (required && !r->st)
            r->st = ds4_fail(DS4_ERR_FORMAT, "config: %s: missing key \"%s\"", r->what, key);
        return def;
    }
    if (!json_is_number(v) || !isfinite(json_number_value(v))) {
        if (!r->st)
            r->st = ds4_fail(DS4_ERR_FORMAT, "config: %s: \"%s\" is not a number", r->what, key);
        return def;
    }
    return (float)json_number_value(v);
}

static float get_f32(reader *r, const char *key, bool required, float def)
{
    return get_f32_in(r, r->root, key, required, def);
}

static ds4_status ratio_from_layer_type(reader *r, const char *t, uint32_t i, uint32_t csa,
                                        uint32_t hca, uint32_t *out)
{
    if (strcmp(t, "sliding_attention") == 0) *out = 0;
    else if (strcmp(t, "compressed_sparse_attention") == 0) *out = csa;
    else if (strcmp(t, "heavily_compressed_attention") == 0) *out = hca;
    else
        return ds4_fail(DS4_ERR_FORMAT, "config: %s: layer_types[%u] = \"%s\" is not a known layer type",
                        r->what, i, t);
    return DS4_OK;
}

/* transformers style: layer_types, compress_rates, mlp_layer_types, rope_parameters */
static void parse_transformers(reader *r, convert_config *c)
{
    json_t *lt = json_object_get(r->root, "layer_types");
    json_t *rates = json_object_get(r->root, "compress_rates");
    uint32_t csa = get_u32_in(r, rates, "compressed_sparse_attention", false,
                              get_u32(r, "compress_rate_csa", false, 4));
    uint32_t hca = get_u32_in(r, rates, "heavily_compressed_attention", false,
                              get_u32(r, "compress_rate_hca", false, 128));
    if (!r->st && json_array_size(lt) < c->n_layer)
        r->st = ds4_fail(DS4_ERR_FORMAT, "config: %s: layer_types has %zu entries for %u layers",
                         r->what, json_array_size(lt), c->n_layer);
    for (uint32_t i = 0; !r->st && i < c->n_layer; i++) {
        json_t *e = json_array_get(lt, i);
        if (!json_is_string(e))
            r->st = ds4_fail(DS4_ERR_FORMAT, "config: %s: layer_types[%u] is not a string", r->what, i);
        else
            r->st = ratio_from_layer_type(r, json_string_value(e), i, csa, hca, &c->compress_ratio[i]);
    }
    json_t *mlt = json_object_get(r->root, "mlp_layer_types");
    if (json_is_array(mlt)) {
        uint32_t n_hash = 0;
        bool seen_moe = false;
        for (size_t i = 0; !r->st && i < json_array_size(mlt) && i < c->n_layer; i++) {
            const char *s = json_string_value(json_array_get(mlt, i));
            if (s && strcmp(s, "hash_moe") == 0) {
                if (seen_moe)
                    r->st = ds4_fail(DS4_ERR_FORMAT,
                                     "config: %s: mlp_layer_types[%zu] is hash_moe after a moe layer "
                                     "(hash layers must come first)", r->what, i);
                n_hash++;
            } else if (s && strcmp(s, "moe") == 0) {
                seen_moe = true;
            } else {
                r->st = ds4_fail(DS4_ERR_FORMAT, "config: %s: mlp_layer_types[%zu] is not \"moe\" or \"hash_moe\"",
                                 r->what, i);
            }
        }
        c->n_hash_layer = n_hash;
    } else {
        c->n_hash_layer = get_u32(r, "num_hash_layers", true, 0);
    }
    json_t *rp = json_object_get(r->root, "rope_parameters");
    json_t *main = get_path(rp, "main"), *comp = get_path(rp, "compress");
    c->rope_base = get_f32_in(r, main, "rope_theta", false, get_f32(r, "rope_theta", false, 10000.0f));
    c->compress_rope_base = get_f32_in(r, comp, "rope_theta", false,
                                       get_f32(r, "compress_rope_theta", false, 160000.0f));
    float prf = get_f32(r, "partial_rotary_factor", false,
                        get_f32_in(r, main, "partial_rotary_factor", false, 0.0f));
    c->n_rot = get_u32(r, "qk_rope_head_dim", false, (uint32_t)lroundf(prf * (float)c->head_dim));
    json_t *scaling = comp ? comp : json_object_get(r->root, "rope_scaling");
    const char *type = json_string_value(get_path(scaling, "rope_type"));
    if (!type) type = json_string_value(get_path(scaling, "type"));
    if (type && strcmp(type, "yarn") == 0) {
        c->rope_factor = get_f32_in(r, scaling, "factor", true, 1.0f);
        c->rope_orig_ctx = get_u32_in(r, scaling, "original_max_position_embeddings", true, 65536);
        c->beta_fast = get_f32_in(r, scaling, "beta_fast", false, 32.0f);
        c->beta_slow = get_f32_in(r, scaling, "beta_slow", false, 1.0f);
    }
}

/* official style: compress_ratios, num_hash_layers, qk_rope_head_dim, rope_scaling */
static void parse_official(reader *r, convert_config *c)
{
    json_t *cr = json_object_get(r->root, "compress_ratios");
    if (json_array_size(cr) < c->n_layer)
        r->st = ds4_fail(DS4_ERR_FORMAT, "config: %s: compress_ratios has %zu entries for %u layers",
                         r->what, json_array_size(cr), c->n_layer);
    for (uint32_t i = 0; !r->st && i < c->n_layer; i++) {
        json_t *e = json_array_get(cr, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > 1 << 20)
            r->st = ds4_fail(DS4_ERR_FORMAT, "config: %s: compress_ratios[%u] is not a valid ratio",
                             r->what, i);
        else
            c->compress_ratio[i] = (uint32_t)json_integer_value(e);
    }
    c->n_hash_layer = get_u32(r, "num_hash_layers", true, 0);
    c->n_rot = get_u32(r, "qk_rope_head_dim", true, 0);
    c->rope_base = get_f32(r, "rope_theta", false, 10000.0f);
    c->compress_rope_base = get_f32(r, "compress_rope_theta", false, 160000.0f);
    json_t *scaling = json_object_get(r->root, "rope_scaling");
    const char *type = json_string_value(get_path(scaling, "type"));
    if (!type) type = json_string_value(get_path(scaling, "rope_type"));
    if (type && strcmp(type, "yarn") == 0) {
        c->rope_factor = get_f32_in(r, scaling, "factor", true, 1.0f);
        c->rope_orig_ctx = get_u32_in(r, scaling, "original_max_position_embeddings", true, 65536);
        c->beta_fast = get_f32_in(r, scaling, "beta_fast", false, 32.0f);
        c->beta_slow = get_f32_in(r, scaling, "beta_slow", false, 1.0f);
    }
}

ds4_status convert_config_parse(const char *text, const char *what, convert_config *c)
{
    memset(c, 0, sizeof *c);
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    if (!root)
        return ds4_fail(DS4_ERR_FORMAT, "config: %s: bad JSON at line %d column %d: %s", what,
                        jerr.line, jerr.column, jerr.text);
    reader r = {.root = root, .what = what};
    if (!json_is_object(root)) {
        json_decref(root);
        return ds4_fail(DS4_ERR_FORMAT, "config: %s: not a JSON object", what);
    }
    const char *mt = json_string_value(json_object_get(root, "model_type"));
    if (mt && strcmp(mt, "deepseek_v4") != 0) {
        json_decref(root);
        return ds4_fail(DS4_ERR_UNSUPPORTED, "config: %s: model_type \"%s\" is not deepseek_v4", what, mt);
    }
    snprintf(c->name, sizeof c->name, "DeepSeek-V4");
    c->n_vocab = get_u32(&r, "vocab_size", true, 0);
    c->n_embd = get_u32(&r, "hidden_size", true, 0);
    c->n_layer = get_u32(&r, "num_hidden_layers", true, 0);
    c->n_head = get_u32(&r, "num_attention_heads", true, 0);
    c->n_head_kv = get_u32(&r, "num_key_value_heads", false, 1);
    c->head_dim = get_u32(&r, "head_dim", true, 0);
    c->q_lora = get_u32(&r, "q_lora_rank", true, 0);
    c->o_lora = get_u32(&r, "o_lora_rank", true, 0);
    c->o_groups = get_u32(&r, "o_groups", true, 0);
    c->n_expert = get_u32(&r, "n_routed_experts", true, 0);
    c->n_expert_used = get_u32(&r, "num_experts_per_tok", true, 0);
    c->n_ff_exp = get_u32(&r, "moe_intermediate_size", true, 0);
    c->n_expert_shared = get_u32(&r, "n_shared_experts", false, 1);
    c->n_expert_groups = get_u32(&r, "n_group", false, 0);
    c->n_expert_groups_used = get_u32(&r, "topk_group", false, 0);
    if (c->n_expert_groups == 1 && c->n_expert_groups_used <= 1) /* one group = no grouping */
        c->n_expert_groups = c->n_expert_groups_used = 0;
    c->sliding_window = get_u32(&r, "sliding_window", true, 0);
    c->idx_heads = get_u32(&r, "index_n_heads", true, 0);
    c->idx_head_dim = get_u32(&r, "index_head_dim", true, 0);
    c->idx_topk = get_u32(&r, "index_topk", true, 0);
    c->hc_mult = get_u32(&r, "hc_mult", false, 4);
    c->hc_iters = get_u32(&r, "hc_sinkhorn_iters", false, 20);
    c->hc_eps = get_f32(&r, "hc_eps", false, 1e-6f);
    c->rms_eps = get_f32(&r, "rms_norm_eps", false, 1e-6f);
    c->swiglu_limit = get_f32(&r, "swiglu_limit", false, 10.0f);
    c->expert_weights_scale = get_f32(&r, "routed_scaling_factor", false, 1.5f);
    json_t *ntp = json_object_get(root, "norm_topk_prob");
    c->expert_weights_norm = ntp ? json_is_true(ntp) : true;
    c->ctx_len = get_u32(&r, "max_position_embeddings", false, 1048576);
    c->n_mtp = get_u32(&r, "num_nextn_predict_layers", false, 0);
    c->bos_id = get_u32(&r, "bos_token_id", false, 0);
    c->eos_id = get_u32(&r, "eos_token_id", false, 1);
    c->rope_factor = 1.0f; /* no YaRN unless the config says so */
    c->rope_orig_ctx = 65536;
    c->beta_fast = 32.0f;
    c->beta_slow = 1.0f;
    const char *sf = json_string_value(json_object_get(root, "scoring_func"));
    if (!r.st && sf && strcmp(sf, "sqrtsoftplus") != 0)
        r.st = ds4_fail(DS4_ERR_UNSUPPORTED, "config: %s: scoring_func \"%s\" (only sqrtsoftplus)", what, sf);
    if (!r.st && c->n_layer > CONVERT_MAX_LAYERS)
        r.st = ds4_fail(DS4_ERR_FORMAT, "config: %s: num_hidden_layers %u (max %d)", what, c->n_layer,
                        CONVERT_MAX_LAYERS);
    if (!r.st) {
        if (json_object_get(root, "layer_types")) parse_transformers(&r, c);
        else if (json_object_get(root, "compress_ratios")) parse_official(&r, c);
        else
            r.st = ds4_fail(DS4_ERR_FORMAT,
                            "config: %s: neither \"layer_types\" (transformers) nor \"compress_ratios\" "
                            "(official) is present", what);
    }
    json_decref(root);
    if (r.st) return r.st;
    return convert_config_validate(c);
}

ds4_status convert_config_load(const char *path, convert_config *cfg)
{
    FILE *f = fopen(path, "rb");
    if (!f) return ds4_fail(DS4_ERR_IO, "config: cannot open %s", path);
    char buf[1 << 16];
    size_t cap = 0, len = 0;
    char *text = NULL;
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        if (len + n + 1 > cap) {
            cap = (len + n + 1) * 2;
            if (cap > (64u << 20)) {
                free(text);
                fclose(f);
                return ds4_fail(DS4_ERR_FORMAT, "config: %s: larger than 64 MiB", path);
            }
            char *t = realloc(text, cap);
            if (!t) {
                free(text);
                fclose(f);
                return ds4_fail(DS4_ERR_NOMEM, "config: out of memory");
            }
            text = t;
        }
        memcpy(text + len, buf, n);
        len += n;
    }
    fclose(f);
    if (!text) return ds4_fail(DS4_ERR_FORMAT, "config: %s: empty file", path);
    text[len] = '\0';
    ds4_status st = convert_config_parse(text, path, cfg);
    free(text);
    return st;
}

ds4_status convert_config_preset(const char *name, convert_config *c)
{
    bool pro = strcmp(name, "pro") == 0;
    if (!pro && strcmp(name, "flash") != 0)
        return ds4_fail(DS4_ERR_INVALID, "config: unknown preset \"%s\" (flash or pro)", name);
    *c = (convert_config){
        .n_vocab = 129280, .n_embd = pro ? 7168 : 4096, .n_layer = pro ? 61 : 43,
        .n_head = pro ? 128 : 64, .n_head_kv = 1, .head_dim = 512, .n_rot = 64,
        .q_lora = pro ? 1536 : 1024, .o_lora = 1024, .o_groups = pro ? 16 : 8,
        .n_expert = pro ? 384 : 256, .n_expert_used = 6, .n_ff_exp = pro ? 3072 : 2048,
        .n_expert_shared = 1, .n_hash_layer = 3, .sliding_window = 128,
        .idx_heads = 64, .idx_head_dim = 128, .idx_topk = pro ? 1024 : 512,
        .hc_mult = 4, .hc_iters = 20, .rope_orig_ctx = 65536, .ctx_len = 1048576, .n_mtp = 1,
        .bos_id = 0, .eos_id = 1, .rope_base = 10000.0f, .rope_factor = 16.0f,
        .beta_fast = 32.0f, .beta_slow = 1.0f, .compress_rope_base = 160000.0f,
        .expert_weights_scale = pro ? 2.5f : 1.5f, .rms_eps = 1e-6f, .hc_eps = 1e-6f,
        .swiglu_limit = 10.0f, .expert_weights_norm = true,
    };
    snprintf(c->name, sizeof c->name, "DeepSeek-V4-%s", pro ? "Pro" : "Flash");
    for (uint32_t i = 0; i < c->n_layer; i++)
        c->compress_ratio[i] = i < 2 ? (pro ? 128 : 0) : (i % 2 == 0 ? 4 : 128);
    return DS4_OK;
}

ds4_status convert_config_truncate(convert_config *c, uint32_t n_layer, uint32_t n_expert)
{
    if (n_layer) {
        if (n_layer > c->n_layer)
            return ds4_fail(DS4_ERR_INVALID, "config: --layers %u exceeds the model's %u layers", n_layer,
                            c->n_layer);
        c->n_layer = n_layer;
        if (c->n_hash_layer > n_layer) c->n_hash_layer = n_layer;
    }
    if (n_expert) {
        if (n_expert < c->n_expert_used)
            return ds4_fail(DS4_ERR_INVALID, "config: --n-experts %u is below experts per token %u",
                            n_expert, c->n_expert_used);
        c->n_expert = n_expert;
    }
    return convert_config_validate(c);
}

#define CHECK(cond, ...)                                                 \
    do {                                                                 \
        if (!(cond)) return ds4_fail(DS4_ERR_FORMAT, "config: " __VA_ARGS__); \
    } while (0)

ds4_status convert_config_validate(const convert_config *c)
{
    const struct {
        const char *name;
        uint32_t v;
    } dims[] = {
        {"vocab_size", c->n_vocab},       {"hidden_size", c->n_embd},
        {"num_hidden_layers", c->n_layer}, {"num_attention_heads", c->n_head},
        {"head_dim", c->head_dim},        {"q_lora_rank", c->q_lora},
        {"o_lora_rank", c->o_lora},       {"o_groups", c->o_groups},
        {"n_routed_experts", c->n_expert}, {"num_experts_per_tok", c->n_expert_used},
        {"moe_intermediate_size", c->n_ff_exp}, {"index_n_heads", c->idx_heads},
        {"index_head_dim", c->idx_head_dim}, {"hc_mult", c->hc_mult},
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        CHECK(dims[i].v >= 1 && dims[i].v <= DIM_MAX, "%s = %u is out of range [1, %u]", dims[i].name,
              dims[i].v, DIM_MAX);
    CHECK(c->n_vocab <= (1u << 24), "vocab_size = %u is too large", c->n_vocab);
    CHECK(c->n_layer <= CONVERT_MAX_LAYERS, "num_hidden_layers = %u (max %d)", c->n_layer, CONVERT_MAX_LAYERS);
    CHECK(c->n_expert <= 4096, "n_routed_experts = %u is too large", c->n_expert);
    CHECK(c->hc_mult <= 64, "hc_mult = %u is too large", c->hc_mult);
    CHECK(c->n_head_kv == 1, "num_key_value_heads = %u (DeepSeek V4 has one shared K=V head)", c->n_head_kv);
    CHECK(c->n_rot % 2 == 0 && c->n_rot >= 2 && c->n_rot <= c->head_dim,
          "rope dimension %u must be even and in [2, head_dim %u]", c->n_rot, c->head_dim);
    CHECK(c->n_head % c->o_groups == 0, "num_attention_heads %u is not a multiple of o_groups %u",
          c->n_head, c->o_groups);
    CHECK(c->n_expert_used <= c->n_expert, "num_experts_per_tok %u > n_routed_experts %u",
          c->n_expert_used, c->n_expert);
    CHECK(c->n_hash_layer <= c->n_layer, "%u hash layers for %u layers", c->n_hash_layer, c->n_layer);
    CHECK(c->n_expert_shared == 1, "n_shared_experts = %u (the format has exactly one)", c->n_expert_shared);
    bool any_csa = false;
    for (uint32_t i = 0; i < c->n_layer; i++) {
        CHECK(c->compress_ratio[i] != 1, "layer %u has compression ratio 1", i);
        if (c->compress_ratio[i] == 4) any_csa = true;
    }
    if (any_csa)
        CHECK(c->n_rot <= c->idx_head_dim, "rope dimension %u > index_head_dim %u", c->n_rot, c->idx_head_dim);
    CHECK(c->rope_factor > 0 && c->rope_base > 0 && c->compress_rope_base > 0,
          "rope bases and factor must be positive");
    return DS4_OK;
}

/*
 * dsv4_config.c - DeepSeek V4 configuration from GGUF metadata
 * (dsv4-model.md §1.2; key names and accepted types as listed there).
 * Values are bounded before anything is sized from them: a malformed file
 * gets an error naming the key and the value, never a huge allocation.
 */
#include "model/dsv4_config.h"

#include "gguf/gguf.h"
#include "util/error.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define ARCH "deepseek4."

/* Re-raise the current message (a GGUF getter's) under "model config: ". */
static ds4_status relay(ds4_status st)
{
    char msg[512];
    snprintf(msg, sizeof msg, "%s", ds4_last_error());
    return ds4_fail(st, "model config: %s", msg);
}

static ds4_status get_u(const ds4_gguf *g, const char *key, int lo, int hi, int *out)
{
    uint64_t v;
    ds4_status st = ds4_gguf_get_uint(g, key, &v);
    if (st != DS4_OK) return relay(st);
    if (v < (uint64_t)lo || v > (uint64_t)hi)
        return ds4_fail(DS4_ERR_FORMAT,
                        "model config: %s = %llu out of range [%d, %d] (the DeepSeek V4 family's published range)",
                        key, (unsigned long long)v, lo, hi);
    *out = (int)v;
    return DS4_OK;
}

static ds4_status get_u_opt(const ds4_gguf *g, const char *key, int lo, int hi, int def, int *out)
{
    if (ds4_gguf_find_key(g, key) < 0) {
        *out = def;
        return DS4_OK;
    }
    return get_u(g, key, lo, hi, out);
}

/* A number stored as f32, f64, u32 or i32 (§1.2). */
static ds4_status value_as_double(const ds4_gguf_value *v, double *out)
{
    switch (v->type) {
    case DS4_GGUF_F32:
    case DS4_GGUF_F64: *out = v->v.f; return DS4_OK;
    case DS4_GGUF_U32:
    case DS4_GGUF_U64: *out = (double)v->v.u; return DS4_OK;
    case DS4_GGUF_I32:
    case DS4_GGUF_I64: *out = (double)v->v.i; return DS4_OK;
    default: return DS4_ERR_FORMAT;
    }
}

static ds4_status get_f(const ds4_gguf *g, const char *key, float *out)
{
    int64_t kv = ds4_gguf_find_key(g, key);
    if (kv < 0) return ds4_fail(DS4_ERR_NOT_FOUND, "model config: missing key %s", key);
    ds4_gguf_value v;
    double d;
    if (ds4_gguf_kv_value(g, kv, &v) != DS4_OK || value_as_double(&v, &d) != DS4_OK || !isfinite(d))
        return ds4_fail(DS4_ERR_FORMAT, "model config: %s has type %s, expected a finite number", key,
                        ds4_gguf_vtype_name(ds4_gguf_kv_type(g, kv)));
    *out = (float)d;
    return DS4_OK;
}

/* Numeric array key: element i as double; the array must hold >= n. */
static ds4_status get_arr(const ds4_gguf *g, const char *key, int n, double *out)
{
    int64_t kv = ds4_gguf_find_key(g, key);
    if (kv < 0) return ds4_fail(DS4_ERR_NOT_FOUND, "model config: missing key %s", key);
    if (ds4_gguf_kv_type(g, kv) != DS4_GGUF_ARRAY)
        return ds4_fail(DS4_ERR_FORMAT, "model config: %s has type %s, expected an array", key,
                        ds4_gguf_vtype_name(ds4_gguf_kv_type(g, kv)));
    uint64_t len = ds4_gguf_arr_len(g, kv);
    if (len < (uint64_t)n)
        return ds4_fail(DS4_ERR_FORMAT, "model config: %s has %llu entries, need %d (block_count)", key,
                        (unsigned long long)len, n);
    for (int i = 0; i < n; i++) {
        ds4_gguf_value v;
        if (ds4_gguf_arr_elem(g, kv, (uint64_t)i, &v) != DS4_OK || value_as_double(&v, &out[i]) != DS4_OK)
            return ds4_fail(DS4_ERR_FORMAT, "model config: %s[%d] has type %s, expected a number", key, i,
                            ds4_gguf_vtype_name(ds4_gguf_arr_type(g, kv)));
    }
    return DS4_OK;
}

#define TRY(x)                                 \
    do {                                       \
        ds4_status st_ = (x);                  \
        if (st_ != DS4_OK) return st_;         \
    } while (0)

ds4_status dsv4_config_load(const ds4_gguf *g, dsv4_config *c)
{
    memset(c, 0, sizeof *c);
    /* Every value that sizes memory is bounded by the largest the DeepSeek
     * V4 family publishes (Flash and Pro, shared/docs/dsv4-model.md §1.1):
     * a forged file cannot make a 19 MB model allocate gigabytes (a
     * sliding window of 2^20 rows, an indexer top-k of 2^20). */
    int n_kv, key_len, val_len, grp = 0;
    TRY(get_u(g, ARCH "block_count", 1, 61, &c->n_layer));
    TRY(get_u(g, ARCH "embedding_length", 1, 7168, &c->n_embd));
    TRY(get_u(g, ARCH "vocab_size", 2, 129280, &c->n_vocab));
    TRY(get_u(g, ARCH "attention.head_count", 1, 128, &c->n_head));
    TRY(get_u(g, ARCH "attention.head_count_kv", 1, 1, &n_kv));
    TRY(get_u(g, ARCH "attention.key_length", 2, 512, &key_len));
    TRY(get_u(g, ARCH "attention.value_length", 2, 512, &val_len));
    TRY(get_u(g, ARCH "rope.dimension_count", 2, 64, &c->n_rot));
    TRY(get_u(g, ARCH "attention.q_lora_rank", 1, 1536, &c->q_lora));
    TRY(get_u(g, ARCH "attention.output_lora_rank", 1, 1024, &c->o_lora));
    TRY(get_u(g, ARCH "attention.output_group_count", 1, 16, &c->o_groups));
    TRY(get_u(g, ARCH "expert_count", 1, 384, &c->n_expert));
    TRY(get_u(g, ARCH "expert_used_count", 1, 6, &c->n_expert_used));
    TRY(get_u(g, ARCH "expert_feed_forward_length", 1, 3072, &c->n_ff_exp));
    TRY(get_u(g, ARCH "expert_shared_count", 1, 1, &c->n_expert_shared));
    TRY(get_u(g, ARCH "hash_layer_count", 0, DSV4_MAX_LAYERS, &c->n_hash_layer));
    TRY(get_u_opt(g, ARCH "expert_group_count", 0, 0, 0, &grp));
    TRY(get_u_opt(g, ARCH "expert_group_used_count", 0, 0, 0, &grp));
    TRY(get_u(g, ARCH "attention.sliding_window", 1, 128, &c->window));
    TRY(get_u(g, ARCH "attention.indexer.head_count", 1, 64, &c->idx_heads));
    TRY(get_u(g, ARCH "attention.indexer.key_length", 2, 128, &c->idx_dim));
    TRY(get_u(g, ARCH "attention.indexer.top_k", 1, 1024, &c->idx_topk));
    TRY(get_u(g, ARCH "hyper_connection.count", 1, 4, &c->n_hc));
    TRY(get_u(g, ARCH "hyper_connection.sinkhorn_iterations", 1, 1000, &c->sinkhorn_iters));
    uint64_t orig;
    if (ds4_gguf_get_uint(g, ARCH "rope.scaling.original_context_length", &orig) != DS4_OK)
        return relay(DS4_ERR_FORMAT);
    c->yarn_orig_ctx = orig;
    TRY(get_f(g, ARCH "rope.freq_base", &c->rope_base));
    TRY(get_f(g, ARCH "rope.scaling.factor", &c->yarn_factor));
    TRY(get_f(g, ARCH "rope.scaling.yarn_beta_fast", &c->yarn_beta_fast));
    TRY(get_f(g, ARCH "rope.scaling.yarn_beta_slow", &c->yarn_beta_slow));
    TRY(get_f(g, ARCH "attention.compress_rope_freq_base", &c->rope_base_compress));
    TRY(get_f(g, ARCH "expert_weights_scale", &c->expert_weight_scale));
    TRY(get_f(g, ARCH "attention.layer_norm_rms_epsilon", &c->rms_eps));
    TRY(get_f(g, ARCH "hyper_connection.epsilon", &c->hc_eps));
    /* llama.cpp's key for the router's score function; absent from
     * antirez/ds4's files, so absent means the one V4 has. */
    if (ds4_gguf_find_key(g, ARCH "expert_gating_func") >= 0) {
        uint64_t gating;
        if (ds4_gguf_get_uint(g, ARCH "expert_gating_func", &gating) != DS4_OK) return relay(DS4_ERR_FORMAT);
        if (gating != DSV4_GATING_SQRT_SOFTPLUS)
            return ds4_fail(DS4_ERR_UNSUPPORTED,
                            "model config: " ARCH "expert_gating_func = %llu (DeepSeek V4 scores experts with "
                            "sqrt(softplus), %d in llama.cpp's numbering)",
                            (unsigned long long)gating, DSV4_GATING_SQRT_SOFTPLUS);
    }
    bool norm;
    if (ds4_gguf_get_bool(g, ARCH "expert_weights_norm", &norm) != DS4_OK)
        return relay(DS4_ERR_FORMAT);
    if (!norm)
        return ds4_fail(DS4_ERR_UNSUPPORTED, "model config: " ARCH "expert_weights_norm = false (only true is DeepSeek V4)");

    double arr[DSV4_MAX_LAYERS];
    TRY(get_arr(g, ARCH "attention.compress_ratios", c->n_layer, arr));
    for (int i = 0; i < c->n_layer; i++) {
        if (arr[i] < 0 || arr[i] > 128 || arr[i] != floor(arr[i]) || arr[i] == 1)
            return ds4_fail(DS4_ERR_FORMAT, "model config: " ARCH "attention.compress_ratios[%d] = %g (expected 0, 4 or an HCA ratio in [2, 128])", i, arr[i]);
        c->compress_ratio[i] = (int)arr[i];
    }
    TRY(get_arr(g, ARCH "swiglu_clamp_exp", c->n_layer, arr));
    for (int i = 0; i < c->n_layer; i++) {
        if (!(arr[i] > 0) || !isfinite(arr[i]))
            return ds4_fail(DS4_ERR_FORMAT, "model config: " ARCH "swiglu_clamp_exp[%d] = %g (expected > 0)", i, arr[i]);
        c->swiglu_clamp[i] = (float)arr[i];
    }

    /* relationships the architecture needs (§7.1) */
    c->head_dim = key_len;
    if (val_len != key_len)
        return ds4_fail(DS4_ERR_FORMAT, "model config: value_length %d != key_length %d (DeepSeek V4 has K = V)", val_len, key_len);
    if (c->n_rot % 2 || c->n_rot > c->head_dim)
        return ds4_fail(DS4_ERR_FORMAT, "model config: rope.dimension_count %d must be even and <= key_length %d", c->n_rot, c->head_dim);
    bool any_csa = false;
    for (int i = 0; i < c->n_layer; i++) any_csa |= dsv4_layer_is_csa(c, i);
    if (any_csa && c->n_rot > c->idx_dim)
        return ds4_fail(DS4_ERR_FORMAT, "model config: rope.dimension_count %d > indexer.key_length %d", c->n_rot, c->idx_dim);
    if (c->n_head % c->o_groups)
        return ds4_fail(DS4_ERR_FORMAT, "model config: head_count %d not a multiple of output_group_count %d", c->n_head, c->o_groups);
    if (c->n_expert_used > c->n_expert)
        return ds4_fail(DS4_ERR_FORMAT, "model config: expert_used_count %d > expert_count %d", c->n_expert_used, c->n_expert);
    if (c->n_hash_layer > c->n_layer)
        return ds4_fail(DS4_ERR_FORMAT, "model config: hash_layer_count %d > block_count %d", c->n_hash_layer, c->n_layer);
    if (!(c->rms_eps >= 0) || !(c->hc_eps >= 0) || !(c->rope_base > 1) || !(c->rope_base_compress > 1) ||
        !(c->yarn_factor >= 1) || c->yarn_orig_ctx < 1)
        return ds4_fail(DS4_ERR_FORMAT, "model config: bad eps/rope values (eps %g, hc_eps %g, freq_base %g, compress base %g, yarn factor %g)",
                        c->rms_eps, c->hc_eps, c->rope_base, c->rope_base_compress, c->yarn_factor);
    return DS4_OK;
}

void dsv4_rope_omega(const dsv4_config *c, bool compressed, float *omega)
{
    int R = c->n_rot;
    double base = compressed ? c->rope_base_compress : c->rope_base;
    double low = 0, high = 0;
    if (compressed) {
        /* YaRN correction range (§3.4): c(beta) = R ln(orig / (2 pi beta)) / (2 ln base) */
        double orig = (double)c->yarn_orig_ctx;
        double cf = R * log(orig / (2 * M_PI * c->yarn_beta_fast)) / (2 * log(base));
        double cs = R * log(orig / (2 * M_PI * c->yarn_beta_slow)) / (2 * log(base));
        low = floor(cf) < 0 ? 0 : floor(cf);
        high = ceil(cs) > R - 1 ? R - 1 : ceil(cs);
        if (low == high) high += 0.001;
    }
    for (int i = 0; i < R / 2; i++) {
        double w = pow(base, -2.0 * i / R);
        if (compressed) {
            double rho = (i - low) / (high - low);
            rho = rho < 0 ? 0 : (rho > 1 ? 1 : rho);
            w = w * ((1 - rho) + rho / c->yarn_factor);
        }
        omega[i] = (float)w;
    }
}

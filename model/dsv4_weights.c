/*
 * dsv4_weights.c - binding the GGUF tensors of a DeepSeek V4 model to the
 * dsv4_layer / dsv4_model fields, validating each against the
 * configuration (dsv4-model.md §2.2, §2.3): name present, type allowed for
 * its role, shape exactly as expected. Errors name the tensor and the found
 * and expected type or shape.
 */
#include "model/dsv4_model.h"
#include "model/dsv4_mtp.h"

#include "gguf/gguf.h"
#include "quant/half.h"
#include "util/error.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

/* How a tensor is used, which decides the types it may have. */
typedef enum {
    ROLE_SMALL,  /* widened to f32 at load: F32, F16, BF16 */
    ROLE_MATMUL, /* multiplied: float or quantized block types */
    ROLE_INDEX,  /* I32 table */
} role;

static bool type_ok(role r, uint32_t t)
{
    switch (r) {
    case ROLE_SMALL: return t == DS4_TYPE_F32 || t == DS4_TYPE_F16 || t == DS4_TYPE_BF16;
    case ROLE_INDEX: return t == DS4_TYPE_I32;
    case ROLE_MATMUL:
        return t == DS4_TYPE_F32 || t == DS4_TYPE_F16 || t == DS4_TYPE_BF16 || t == DS4_TYPE_Q8_0 ||
               t == DS4_TYPE_Q2_K || t == DS4_TYPE_Q4_K || t == DS4_TYPE_IQ2_XXS || t == DS4_TYPE_MXFP4;
    }
    return false;
}

static const char *role_types(role r)
{
    switch (r) {
    case ROLE_SMALL: return "F32, F16 or BF16";
    case ROLE_INDEX: return "I32";
    default: return "F32, F16, BF16, Q8_0, Q2_K, Q4_K, IQ2_XXS or MXFP4";
    }
}

static void fmt_shape(char *buf, size_t n, int nd, const int64_t *ne)
{
    size_t at = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < nd && at < n; i++) at += (size_t)snprintf(buf + at, n - at, i ? ", %lld" : "%lld", (long long)ne[i]);
    if (at < n) snprintf(buf + at, n - at, "]");
}

static float *own(dsv4_model *m, size_t n)
{
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? 2 * m->cap_owned : 256;
        float **p = realloc(m->owned, (size_t)cap * sizeof *p);
        if (!p) return NULL;
        m->owned = p;
        m->cap_owned = cap;
    }
    float *f = calloc(n ? n : 1, sizeof(float));
    if (f) m->owned[m->n_owned++] = f;
    return f;
}

/* Bind tensor `name` with the expected shape ne[0..nd) into *w. optional:
 * absent is fine (w->data stays NULL). */
static ds4_status bind(dsv4_model *m, ds4_weight *w, const char *name, role r, bool optional,
                       int nd, int64_t ne0, int64_t ne1, int64_t ne2)
{
    const ds4_gguf_tensor *t = NULL;
    int64_t idx = ds4_gguf_find_tensor(m->gguf, name);
    if (idx >= 0) t = ds4_gguf_tensor_at(m->gguf, idx);
    if (!t) {
        if (optional) return DS4_OK;
        return ds4_fail(DS4_ERR_NOT_FOUND, "model: tensor %s is missing", name);
    }
    int64_t want[4] = {ne0, ne1, ne2, 1};
    int64_t got[4] = {1, 1, 1, 1};
    int tnd = (int)t->n_dims;
    for (int i = 0; i < tnd && i < 4; i++) got[i] = (int64_t)t->ne[i];
    bool same = true;
    for (int i = 0; i < 4; i++) same &= got[i] == want[i];
    if (!same) {
        char a[128], b[128];
        fmt_shape(a, sizeof a, tnd, got);
        fmt_shape(b, sizeof b, nd, want);
        return ds4_fail(DS4_ERR_FORMAT, "model: tensor %s has shape %s, expected %s", name, a, b);
    }
    if (!type_ok(r, t->type))
        return ds4_fail(DS4_ERR_FORMAT, "model: tensor %s has type %s, expected %s", name,
                        ds4_gguf_type_name(t->type), role_types(r));
    w->name = t->name;
    w->type = (ds4_type)t->type;
    w->n_dims = nd;
    for (int i = 0; i < 4; i++) w->ne[i] = want[i];
    w->data = t->data;
    w->nbytes = t->size;
    if (r == ROLE_SMALL && t->type != DS4_TYPE_F32) {
        size_t n = (size_t)(ne0 * ne1 * ne2);
        float *f = own(m, n);
        if (!f) return ds4_fail(DS4_ERR_NOMEM, "model: out of memory widening %s", name);
        const uint16_t *h = t->data;
        for (size_t i = 0; i < n; i++) {
            uint16_t v;
            memcpy(&v, h + i, 2);
            f[i] = t->type == DS4_TYPE_BF16 ? ds4_bf16_to_f32(v) : ds4_f16_to_f32(v);
        }
        w->data = f;
        w->type = DS4_TYPE_F32;
        w->nbytes = n * 4;
    } else if (r == ROLE_SMALL) {
        /* the mapping may not be 4-aligned for an odd alignment; copy */
        size_t n = (size_t)(ne0 * ne1 * ne2);
        float *f = own(m, n);
        if (!f) return ds4_fail(DS4_ERR_NOMEM, "model: out of memory copying %s", name);
        memcpy(f, t->data, n * 4);
        w->data = f;
    }
    if (r == ROLE_SMALL) {
        /* A non-finite value here poisons every forward pass (NaN logits,
         * "no usable logit"); loading goes on (a file may be inspected or
         * converted) but says so, naming the tensor. */
        const float *f = w->data;
        size_t n = (size_t)(ne0 * ne1 * ne2), bad = 0, first = 0;
        for (size_t i = 0; i < n; i++)
            if (!isfinite(f[i]) && bad++ == 0) first = i;
        if (bad) {
            m->n_nonfinite_tensors++;
            fprintf(stderr, "ds4: warning: %s: tensor %s has %zu non-finite values (first at index %zu: %g)\n",
                    ds4_gguf_path(m->gguf), name, bad, first, (double)f[first]);
        }
    }
    return DS4_OK;
}

#define TRY(x)                         \
    do {                               \
        ds4_status st_ = (x);          \
        if (st_ != DS4_OK) return st_; \
    } while (0)

/* One decoder block whose tensors are named PREFIX + suffix ("blk.3.",
 * or "mtp.0." for the MTP block): ratio r, hash-routed or not. */
static ds4_status bind_block(dsv4_model *m, dsv4_layer *L, const char *pre, int64_t r, bool hash)
{
    const dsv4_config *c = &m->cfg;
    int64_t E = c->n_embd, HC = c->n_hc, NMIX = (2 + HC) * HC, D = c->head_dim;
    int64_t H = c->n_head, G = c->o_groups, QL = c->q_lora, OL = c->o_lora;
    int64_t NE = c->n_expert, F = c->n_ff_exp;
    char n[160];
#define NAME(suffix) (snprintf(n, sizeof n, "%s" suffix, pre), n)
    TRY(bind(m, &L->hc_attn_fn, NAME("hc_attn_fn.weight"), ROLE_MATMUL, false, 2, HC * E, NMIX, 1));
    TRY(bind(m, &L->hc_attn_scale, NAME("hc_attn_scale.weight"), ROLE_SMALL, false, 1, 3, 1, 1));
    TRY(bind(m, &L->hc_attn_base, NAME("hc_attn_base.weight"), ROLE_SMALL, false, 1, NMIX, 1, 1));
    TRY(bind(m, &L->attn_norm, NAME("attn_norm.weight"), ROLE_SMALL, false, 1, E, 1, 1));
    TRY(bind(m, &L->q_a, NAME("attn_q_a.weight"), ROLE_MATMUL, false, 2, E, QL, 1));
    TRY(bind(m, &L->q_a_norm, NAME("attn_q_a_norm.weight"), ROLE_SMALL, false, 1, QL, 1, 1));
    TRY(bind(m, &L->q_b, NAME("attn_q_b.weight"), ROLE_MATMUL, false, 2, QL, H * D, 1));
    TRY(bind(m, &L->kv, NAME("attn_kv.weight"), ROLE_MATMUL, false, 2, E, D, 1));
    TRY(bind(m, &L->kv_norm, NAME("attn_kv_a_norm.weight"), ROLE_SMALL, false, 1, D, 1, 1));
    TRY(bind(m, &L->sinks, NAME("attn_sinks.weight"), ROLE_SMALL, false, 1, H, 1, 1));
    TRY(bind(m, &L->o_a, NAME("attn_output_a.weight"), ROLE_MATMUL, false, 2, H * D / G, G * OL, 1));
    TRY(bind(m, &L->o_b, NAME("attn_output_b.weight"), ROLE_MATMUL, false, 2, G * OL, E, 1));
    if (r) {
        int64_t cw = (r == DSV4_CSA_RATIO ? 2 : 1) * D;
        TRY(bind(m, &L->comp_ape, NAME("attn_compressor_ape.weight"), ROLE_SMALL, false, 2, cw, r, 1));
        TRY(bind(m, &L->comp_kv, NAME("attn_compressor_kv.weight"), ROLE_MATMUL, false, 2, E, cw, 1));
        TRY(bind(m, &L->comp_gate, NAME("attn_compressor_gate.weight"), ROLE_MATMUL, false, 2, E, cw, 1));
        TRY(bind(m, &L->comp_norm, NAME("attn_compressor_norm.weight"), ROLE_SMALL, false, 1, D, 1, 1));
    }
    if (r == DSV4_CSA_RATIO) {
        int64_t IH = c->idx_heads, ID = c->idx_dim;
        TRY(bind(m, &L->idx_q_b, NAME("indexer.attn_q_b.weight"), ROLE_MATMUL, false, 2, QL, IH * ID, 1));
        TRY(bind(m, &L->idx_proj, NAME("indexer.proj.weight"), ROLE_MATMUL, false, 2, E, IH, 1));
        TRY(bind(m, &L->idx_ape, NAME("indexer_compressor_ape.weight"), ROLE_SMALL, false, 2, 2 * ID, r, 1));
        TRY(bind(m, &L->idx_kv, NAME("indexer_compressor_kv.weight"), ROLE_MATMUL, false, 2, E, 2 * ID, 1));
        TRY(bind(m, &L->idx_gate, NAME("indexer_compressor_gate.weight"), ROLE_MATMUL, false, 2, E, 2 * ID, 1));
        TRY(bind(m, &L->idx_norm, NAME("indexer_compressor_norm.weight"), ROLE_SMALL, false, 1, ID, 1, 1));
    }
    TRY(bind(m, &L->hc_ffn_fn, NAME("hc_ffn_fn.weight"), ROLE_MATMUL, false, 2, HC * E, NMIX, 1));
    TRY(bind(m, &L->hc_ffn_scale, NAME("hc_ffn_scale.weight"), ROLE_SMALL, false, 1, 3, 1, 1));
    TRY(bind(m, &L->hc_ffn_base, NAME("hc_ffn_base.weight"), ROLE_SMALL, false, 1, NMIX, 1, 1));
    TRY(bind(m, &L->ffn_norm, NAME("ffn_norm.weight"), ROLE_SMALL, false, 1, E, 1, 1));
    TRY(bind(m, &L->gate_inp, NAME("ffn_gate_inp.weight"), ROLE_MATMUL, false, 2, E, NE, 1));
    L->is_hash = hash;
    if (L->is_hash) {
        int64_t K = c->n_expert_used;
        TRY(bind(m, &L->tid2eid, NAME("ffn_gate_tid2eid.weight"), ROLE_INDEX, false, 2, K, c->n_vocab, 1));
        const char *tb = L->tid2eid.data;
        for (int64_t i = 0; i < K * c->n_vocab; i++) {
            int32_t e;
            memcpy(&e, tb + 4 * i, 4);
            if (e < 0 || e >= NE)
                return ds4_fail(DS4_ERR_FORMAT, "model: tensor %s: token %lld slot %lld has expert id %d, expected [0, %lld)",
                                n, (long long)(i / K), (long long)(i % K), e, (long long)NE);
        }
    } else {
        TRY(bind(m, &L->exp_probs_b, NAME("exp_probs_b.bias"), ROLE_SMALL, true, 1, NE, 1, 1));
        L->has_bias = L->exp_probs_b.data != NULL;
    }
    TRY(bind(m, &L->gate_exps, NAME("ffn_gate_exps.weight"), ROLE_MATMUL, false, 3, E, F, NE));
    TRY(bind(m, &L->up_exps, NAME("ffn_up_exps.weight"), ROLE_MATMUL, false, 3, E, F, NE));
    TRY(bind(m, &L->down_exps, NAME("ffn_down_exps.weight"), ROLE_MATMUL, false, 3, F, E, NE));
    TRY(bind(m, &L->gate_sh, NAME("ffn_gate_shexp.weight"), ROLE_MATMUL, false, 2, E, F, 1));
    TRY(bind(m, &L->up_sh, NAME("ffn_up_shexp.weight"), ROLE_MATMUL, false, 2, E, F, 1));
    TRY(bind(m, &L->down_sh, NAME("ffn_down_shexp.weight"), ROLE_MATMUL, false, 2, F, E, 1));
#undef NAME
    return DS4_OK;
}

static ds4_status bind_layer(dsv4_model *m, int il)
{
    char pre[32];
    snprintf(pre, sizeof pre, "blk.%d.", il);
    return bind_block(m, &m->layers[il], pre, m->cfg.compress_ratio[il], il < m->cfg.n_hash_layer);
}

ds4_status dsv4_bind_mtp(dsv4_model *v, dsv4_mtp_weights *w)
{
    const dsv4_config *c = &v->cfg;
    int64_t E = c->n_embd, HC = c->n_hc;
    /* one sliding-window block (no compressor, no indexer), top-k routed */
    TRY(bind_block(v, &v->layers[0], "mtp.0.", 0, false));
    if (!v->layers[0].has_bias)
        return ds4_fail(DS4_ERR_NOT_FOUND, "model: tensor mtp.0.exp_probs_b.bias is missing (the MTP block is top-k "
                                           "routed with a bias)");
    TRY(bind(v, &w->e_proj, "mtp.0.e_proj.weight", ROLE_MATMUL, false, 2, E, E, 1));
    TRY(bind(v, &w->h_proj, "mtp.0.h_proj.weight", ROLE_MATMUL, false, 2, E, E, 1));
    TRY(bind(v, &w->enorm, "mtp.0.enorm.weight", ROLE_SMALL, false, 1, E, 1, 1));
    TRY(bind(v, &w->hnorm, "mtp.0.hnorm.weight", ROLE_SMALL, false, 1, E, 1, 1));
    TRY(bind(v, &v->out_norm, "mtp.0.norm.weight", ROLE_SMALL, false, 1, E, 1, 1));
    TRY(bind(v, &v->out_hc_fn, "mtp.0.hc_head_fn.weight", ROLE_MATMUL, false, 2, HC * E, HC, 1));
    TRY(bind(v, &v->out_hc_base, "mtp.0.hc_head_base.weight", ROLE_SMALL, false, 1, HC, 1, 1));
    TRY(bind(v, &v->out_hc_scale, "mtp.0.hc_head_scale.weight", ROLE_SMALL, false, 1, 1, 1, 1));
    return DS4_OK;
}

static ds4_status bind_all(dsv4_model *m)
{
    const dsv4_config *c = &m->cfg;
    int64_t E = c->n_embd, HC = c->n_hc, V = c->n_vocab;
    if (dsv4_model_has_embed(m))
        TRY(bind(m, &m->tok_embd, "token_embd.weight", ROLE_MATMUL, false, 2, E, V, 1));
    if (dsv4_model_has_head(m)) {
        TRY(bind(m, &m->out_hc_fn, "output_hc_fn.weight", ROLE_MATMUL, false, 2, HC * E, HC, 1));
        TRY(bind(m, &m->out_hc_base, "output_hc_base.weight", ROLE_SMALL, false, 1, HC, 1, 1));
        TRY(bind(m, &m->out_hc_scale, "output_hc_scale.weight", ROLE_SMALL, false, 1, 1, 1, 1));
        TRY(bind(m, &m->out_norm, "output_norm.weight", ROLE_SMALL, false, 1, E, 1, 1));
        TRY(bind(m, &m->output, "output.weight", ROLE_MATMUL, false, 2, E, V, 1));
    }
    if (dsv4_model_has_embed(m) && m->tok_embd.type != DS4_TYPE_F32 && m->tok_embd.type != DS4_TYPE_F16 &&
        m->tok_embd.type != DS4_TYPE_BF16 && m->tok_embd.type != DS4_TYPE_Q8_0 &&
        m->tok_embd.type != DS4_TYPE_MXFP4)
        return ds4_fail(DS4_ERR_FORMAT, "model: tensor token_embd.weight has type %s, expected F32, F16, BF16, Q8_0 or MXFP4",
                        ds4_gguf_type_name(m->tok_embd.type));
    for (int il = m->layer_lo; il < m->layer_hi; il++) TRY(bind_layer(m, il));

    int half = c->n_rot / 2;
    float *om = own(m, (size_t)half), *oc = own(m, (size_t)half);
    if (!om || !oc) return ds4_fail(DS4_ERR_NOMEM, "model: out of memory");
    dsv4_rope_omega(c, false, om);
    dsv4_rope_omega(c, true, oc);
    m->omega_main = (ds4_weight){"rope.omega.main", DS4_TYPE_F32, 1, {half, 1, 1, 1}, om, (uint64_t)half * 4};
    m->omega_comp = (ds4_weight){"rope.omega.compress", DS4_TYPE_F32, 1, {half, 1, 1, 1}, oc, (uint64_t)half * 4};
    return DS4_OK;
}

static dsv4_model *from_gguf_range(ds4_gguf *g, int lo, int hi)
{
    dsv4_model *m = calloc(1, sizeof *m);
    if (!m) {
        ds4_gguf_close(g);
        ds4_fail(DS4_ERR_NOMEM, "model: out of memory");
        return NULL;
    }
    m->gguf = g;
    ds4_status st = dsv4_config_load(g, &m->cfg);
    if (st == DS4_OK) {
        m->layer_lo = lo;
        m->layer_hi = hi < 0 ? m->cfg.n_layer : hi;
        if (lo < 0 || m->layer_hi <= lo || m->layer_hi > m->cfg.n_layer)
            st = ds4_fail(DS4_ERR_INVALID, "model: layer range %d:%d is not within the model's %d layers", lo, hi,
                          m->cfg.n_layer);
    }
    if (st == DS4_OK) {
        m->layers = calloc((size_t)m->cfg.n_layer, sizeof *m->layers);
        st = m->layers ? bind_all(m) : ds4_fail(DS4_ERR_NOMEM, "model: out of memory");
    }
    if (st != DS4_OK) {
        ds4_error_prefix("%s: ", ds4_gguf_path(g));
        dsv4_model_free(m);
        return NULL;
    }
    return m;
}

dsv4_model *dsv4_model_from_gguf(ds4_gguf *g) { return from_gguf_range(g, 0, -1); }

dsv4_model *dsv4_model_load_range(const char *path, int lo, int hi)
{
    ds4_gguf *g = ds4_gguf_open(path);
    if (!g) return NULL;
    return from_gguf_range(g, lo, hi);
}

dsv4_model *dsv4_model_load(const char *path) { return dsv4_model_load_range(path, 0, -1); }

void dsv4_model_free(dsv4_model *m)
{
    if (!m) return;
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->layers);
    dsv4_mtp_free(m->mtp);
    if (m->gguf) ds4_gguf_close(m->gguf);
    free(m);
}

void dsv4_model_for_each_weight(const dsv4_model *m, dsv4_weight_fn fn, void *ctx)
{
    const ds4_weight *g[] = {&m->tok_embd, &m->out_hc_fn, &m->out_hc_base, &m->out_hc_scale,
                             &m->out_norm, &m->output, &m->omega_main, &m->omega_comp};
    for (size_t i = 0; i < sizeof g / sizeof *g; i++)
        if (g[i]->data) fn(ctx, g[i]);
    for (int il = m->layer_lo; il < m->layer_hi; il++) {
        const ds4_weight *w = (const ds4_weight *)&m->layers[il];
        size_t n = offsetof(dsv4_layer, has_bias) / sizeof(ds4_weight);
        for (size_t i = 0; i < n; i++)
            if (w[i].data) fn(ctx, &w[i]);
    }
}

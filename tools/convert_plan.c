/*
 * convert_plan.c - DeepSeek V4 tensor table for a configuration
 * (dsv4-model.md §2.2 globals, §2.3 per-layer; see convert_plan.h).
 *
 * Shapes are written in GGUF order exactly as the spec table gives them
 * for Flash, with the Flash constants replaced by the config's values:
 * E hidden, V vocab, H heads, D head_dim, QL q_lora, G o_groups, OL o_lora,
 * NE experts, F expert width, K experts per token, IH/ID indexer heads/dim,
 * hc streams (mix = (2+hc)*hc rows in the HC fn), c = 2 (CSA) or 1 (HCA).
 */
#include "tools/convert_plan.h"

#include "quant/quant.h"
#include "util/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    convert_plan *p;
    int cap;
    ds4_status st;
    int mtp; /* adding the MTP block: names mtp.0.* */
} builder;

static void add(builder *b, int layer, const char *suffix, convert_role role, convert_class cls,
                uint32_t n_dims, uint64_t ne0, uint64_t ne1, uint64_t ne2)
{
    if (b->st) return;
    if (b->p->n == b->cap) {
        int cap = b->cap ? b->cap * 2 : 64;
        plan_tensor *t = realloc(b->p->t, (size_t)cap * sizeof *t);
        if (!t) {
            b->st = ds4_fail(DS4_ERR_NOMEM, "convert: out of memory");
            return;
        }
        b->p->t = t;
        b->cap = cap;
    }
    plan_tensor *t = &b->p->t[b->p->n++];
    memset(t, 0, sizeof *t);
    if (b->mtp) snprintf(t->name, sizeof t->name, "mtp.0.%s", suffix);
    else if (layer < 0) snprintf(t->name, sizeof t->name, "%s", suffix);
    else snprintf(t->name, sizeof t->name, "blk.%d.%s", layer, suffix);
    t->mtp = b->mtp;
    t->role = role;
    t->cls = cls;
    t->layer = layer;
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = n_dims > 1 ? ne1 : 1;
    t->ne[2] = n_dims > 2 ? ne2 : 1;
}

/* One decoder block: layer i of the trunk, or the MTP block (ratio 0, not hashed). */
static void add_block(builder *b, const convert_config *c, int i, uint32_t ratio, bool hash)
{
    const uint64_t E = c->n_embd, V = c->n_vocab, H = c->n_head, D = c->head_dim;
    const uint64_t QL = c->q_lora, G = c->o_groups, OL = c->o_lora, NE = c->n_expert;
    const uint64_t F = c->n_ff_exp, K = c->n_expert_used, IH = c->idx_heads, ID = c->idx_head_dim;
    const uint64_t HC = c->hc_mult, MIX = (2 + HC) * HC;
    const uint64_t cf = convert_coff(ratio);
    add(b, i, "hc_attn_fn.weight", R_HC_ATTN_FN, CLS_F16, 2, HC * E, MIX, 0);
    add(b, i, "hc_attn_scale.weight", R_HC_ATTN_SCALE, CLS_F32, 1, 3, 0, 0);
    add(b, i, "hc_attn_base.weight", R_HC_ATTN_BASE, CLS_F32, 1, MIX, 0, 0);
    add(b, i, "attn_norm.weight", R_ATTN_NORM, CLS_F32, 1, E, 0, 0);
    add(b, i, "attn_q_a.weight", R_Q_A, CLS_DENSE, 2, E, QL, 0);
    add(b, i, "attn_q_a_norm.weight", R_Q_A_NORM, CLS_F32, 1, QL, 0, 0);
    add(b, i, "attn_q_b.weight", R_Q_B, CLS_DENSE, 2, QL, H * D, 0);
    add(b, i, "attn_kv.weight", R_KV, CLS_DENSE, 2, E, D, 0);
    add(b, i, "attn_kv_a_norm.weight", R_KV_NORM, CLS_F32, 1, D, 0, 0);
    add(b, i, "attn_sinks.weight", R_SINKS, CLS_F32, 1, H, 0, 0);
    add(b, i, "attn_output_a.weight", R_O_A, CLS_DENSE, 2, H * D / G, G * OL, 0);
    add(b, i, "attn_output_b.weight", R_O_B, CLS_DENSE, 2, G * OL, E, 0);
    if (ratio != 0) {
        add(b, i, "attn_compressor_ape.weight", R_COMP_APE, CLS_F16, 2, cf * D, ratio, 0);
        add(b, i, "attn_compressor_kv.weight", R_COMP_KV, CLS_F16, 2, E, cf * D, 0);
        add(b, i, "attn_compressor_gate.weight", R_COMP_GATE, CLS_F16, 2, E, cf * D, 0);
        add(b, i, "attn_compressor_norm.weight", R_COMP_NORM, CLS_F32, 1, D, 0, 0);
    }
    if (ratio == 4) {
        add(b, i, "indexer.attn_q_b.weight", R_IDX_Q_B, CLS_F16, 2, QL, IH * ID, 0);
        add(b, i, "indexer.proj.weight", R_IDX_PROJ, CLS_F16, 2, E, IH, 0);
        add(b, i, "indexer_compressor_ape.weight", R_IDX_COMP_APE, CLS_F16, 2, 2 * ID, 4, 0);
        add(b, i, "indexer_compressor_kv.weight", R_IDX_COMP_KV, CLS_F16, 2, E, 2 * ID, 0);
        add(b, i, "indexer_compressor_gate.weight", R_IDX_COMP_GATE, CLS_F16, 2, E, 2 * ID, 0);
        add(b, i, "indexer_compressor_norm.weight", R_IDX_COMP_NORM, CLS_F32, 1, ID, 0, 0);
    }
    add(b, i, "hc_ffn_fn.weight", R_HC_FFN_FN, CLS_F16, 2, HC * E, MIX, 0);
    add(b, i, "hc_ffn_scale.weight", R_HC_FFN_SCALE, CLS_F32, 1, 3, 0, 0);
    add(b, i, "hc_ffn_base.weight", R_HC_FFN_BASE, CLS_F32, 1, MIX, 0, 0);
    add(b, i, "ffn_norm.weight", R_FFN_NORM, CLS_F32, 1, E, 0, 0);
    add(b, i, "ffn_gate_inp.weight", R_GATE_INP, CLS_F16, 2, E, NE, 0);
    if (!hash)
        add(b, i, "exp_probs_b.bias", R_EXP_PROBS_B, CLS_F32, 1, NE, 0, 0);
    else
        add(b, i, "ffn_gate_tid2eid.weight", R_TID2EID, CLS_I32, 2, K, V, 0);
    add(b, i, "ffn_gate_exps.weight", R_GATE_EXPS, CLS_EXP_GU, 3, E, F, NE);
    add(b, i, "ffn_up_exps.weight", R_UP_EXPS, CLS_EXP_GU, 3, E, F, NE);
    add(b, i, "ffn_down_exps.weight", R_DOWN_EXPS, CLS_EXP_DOWN, 3, F, E, NE);
    add(b, i, "ffn_gate_shexp.weight", R_GATE_SHEXP, CLS_DENSE, 2, E, F, 0);
    add(b, i, "ffn_up_shexp.weight", R_UP_SHEXP, CLS_DENSE, 2, E, F, 0);
    add(b, i, "ffn_down_shexp.weight", R_DOWN_SHEXP, CLS_DENSE, 2, F, E, 0);
    (void)V, (void)K;
}

ds4_status convert_plan_build(const convert_config *c, convert_plan *plan)
{
    memset(plan, 0, sizeof *plan);
    builder b = {.p = plan};
    const uint64_t E = c->n_embd, V = c->n_vocab, HC = c->hc_mult;

    add(&b, -1, "token_embd.weight", R_TOKEN_EMBD, CLS_F16, 2, E, V, 0);
    add(&b, -1, "output_hc_fn.weight", R_OUT_HC_FN, CLS_F16, 2, HC * E, HC, 0);
    add(&b, -1, "output_hc_base.weight", R_OUT_HC_BASE, CLS_F32, 1, HC, 0, 0);
    add(&b, -1, "output_hc_scale.weight", R_OUT_HC_SCALE, CLS_F32, 1, 1, 0, 0);
    add(&b, -1, "output_norm.weight", R_OUT_NORM, CLS_F32, 1, E, 0, 0);
    add(&b, -1, "output.weight", R_OUTPUT, CLS_DENSE, 2, E, V, 0);

    for (int i = 0; i < (int)c->n_layer; i++)
        add_block(&b, c, i, c->compress_ratio[i], (uint32_t)i < c->n_hash_layer);
    if (b.st) convert_plan_free(plan);
    return b.st;
}

ds4_status convert_plan_add_mtp(const convert_config *c, convert_plan *plan)
{
    builder b = {.p = plan, .cap = plan->n, .mtp = 1};
    const uint64_t E = c->n_embd, HC = c->hc_mult;
    add_block(&b, c, 0, 0, false);
    add(&b, 0, "e_proj.weight", R_MTP_E_PROJ, CLS_DENSE, 2, E, E, 0);
    add(&b, 0, "h_proj.weight", R_MTP_H_PROJ, CLS_DENSE, 2, E, E, 0);
    add(&b, 0, "enorm.weight", R_MTP_ENORM, CLS_F32, 1, E, 0, 0);
    add(&b, 0, "hnorm.weight", R_MTP_HNORM, CLS_F32, 1, E, 0, 0);
    add(&b, 0, "norm.weight", R_MTP_NORM, CLS_F32, 1, E, 0, 0);
    add(&b, 0, "hc_head_fn.weight", R_MTP_HC_HEAD_FN, CLS_F16, 2, HC * E, HC, 0);
    add(&b, 0, "hc_head_base.weight", R_MTP_HC_HEAD_BASE, CLS_F32, 1, HC, 0, 0);
    add(&b, 0, "hc_head_scale.weight", R_MTP_HC_HEAD_SCALE, CLS_F32, 1, 1, 0, 0);
    return b.st;
}

void convert_plan_free(convert_plan *plan)
{
    free(plan->t);
    memset(plan, 0, sizeof *plan);
}

static ds4_status check_row_fits(const plan_tensor *t)
{
    const ds4_type_info *ti = ds4_type_get(t->type);
    if (!ti) return ds4_fail(DS4_ERR_INVALID, "convert: tensor %s: unknown type %d", t->name, (int)t->type);
    if (t->ne[0] % (uint64_t)ti->block_elems != 0)
        return ds4_fail(DS4_ERR_INVALID,
                        "convert: tensor %s: row length %llu is not a multiple of %lld, the block "
                        "size of %s (choose another --type/--experts)",
                        t->name, (unsigned long long)t->ne[0], (long long)ti->block_elems, ti->name);
    return DS4_OK;
}

ds4_status convert_plan_override_type(convert_plan *plan, const char *name, ds4_type type)
{
    int hits = 0;
    for (int i = 0; i < plan->n; i++) {
        plan_tensor *t = &plan->t[i];
        const char *suffix = NULL;
        if (t->layer >= 0 && !strncmp(t->name, "blk.", 4)) {
            const char *dot = strchr(t->name + 4, '.');
            if (dot) suffix = dot + 1;
        }
        if (strcmp(t->name, name) != 0 && !(suffix && !strcmp(suffix, name))) continue;
        if (t->cls == CLS_I32)
            return ds4_fail(DS4_ERR_INVALID, "convert: tensor %s: an index table keeps type I32", t->name);
        t->type = type;
        ds4_status st = check_row_fits(t);
        if (st) return st;
        hits++;
    }
    if (!hits) return ds4_fail(DS4_ERR_INVALID, "convert: --tensor-type %s: no tensor of this model has that name", name);
    return DS4_OK;
}

ds4_status convert_plan_set_types(convert_plan *plan, ds4_type dense, ds4_type gate_up, ds4_type down)
{
    for (int i = 0; i < plan->n; i++) {
        plan_tensor *t = &plan->t[i];
        switch (t->cls) {
        case CLS_F32: t->type = DS4_TYPE_F32; break;
        case CLS_F16: t->type = dense == DS4_TYPE_F32 ? DS4_TYPE_F32 : DS4_TYPE_F16; break;
        case CLS_DENSE: t->type = dense; break;
        case CLS_I32: t->type = DS4_TYPE_I32; break;
        case CLS_EXP_GU: t->type = gate_up; break;
        case CLS_EXP_DOWN: t->type = down; break;
        }
        ds4_status st = check_row_fits(t);
        if (st) return st;
    }
    return DS4_OK;
}

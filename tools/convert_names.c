/*
 * convert_names.c - the name map of dsv4-model.md §2 (see convert_names.h).
 * One row per role: transformers suffix, official suffix. Layer tensors get
 * the prefix "model.layers.N." / "layers.N."; the routed experts are special
 * cased below (fused vs per-expert).
 */
#include "tools/convert_names.h"

#include "util/error.h"

#include <stdio.h>

static const struct {
    convert_role role;
    const char *hf, *hf_alt, *official;
} names[] = {
    {R_TOKEN_EMBD, "model.embed_tokens.weight", NULL, "embed.weight"},
    {R_OUT_HC_FN, "model.hc_head.hc_fn", NULL, "hc_head_fn"},
    {R_OUT_HC_BASE, "model.hc_head.hc_base", NULL, "hc_head_base"},
    {R_OUT_HC_SCALE, "model.hc_head.hc_scale", NULL, "hc_head_scale"},
    {R_OUT_NORM, "model.norm.weight", NULL, "norm.weight"},
    {R_OUTPUT, "lm_head.weight", NULL, "head.weight"},
    {R_HC_ATTN_FN, "attn_hc.fn", NULL, "hc_attn_fn"},
    {R_HC_ATTN_SCALE, "attn_hc.scale", NULL, "hc_attn_scale"},
    {R_HC_ATTN_BASE, "attn_hc.base", NULL, "hc_attn_base"},
    {R_ATTN_NORM, "input_layernorm.weight", NULL, "attn_norm.weight"},
    {R_Q_A, "self_attn.q_a_proj.weight", NULL, "attn.wq_a.weight"},
    {R_Q_A_NORM, "self_attn.q_a_norm.weight", NULL, "attn.q_norm.weight"},
    {R_Q_B, "self_attn.q_b_proj.weight", NULL, "attn.wq_b.weight"},
    {R_KV, "self_attn.kv_proj.weight", NULL, "attn.wkv.weight"},
    {R_KV_NORM, "self_attn.kv_norm.weight", NULL, "attn.kv_norm.weight"},
    {R_SINKS, "self_attn.sinks", NULL, "attn.attn_sink"},
    {R_O_A, "self_attn.o_a_proj.weight", NULL, "attn.wo_a.weight"},
    {R_O_B, "self_attn.o_b_proj.weight", NULL, "attn.wo_b.weight"},
    {R_COMP_APE, "self_attn.compressor.position_bias", NULL, "attn.compressor.ape"},
    {R_COMP_KV, "self_attn.compressor.kv_proj.weight", NULL, "attn.compressor.wkv.weight"},
    {R_COMP_GATE, "self_attn.compressor.gate_proj.weight", NULL, "attn.compressor.wgate.weight"},
    {R_COMP_NORM, "self_attn.compressor.kv_norm.weight", NULL, "attn.compressor.norm.weight"},
    {R_IDX_Q_B, "self_attn.compressor.indexer.q_b_proj.weight", NULL, "attn.indexer.wq_b.weight"},
    {R_IDX_PROJ, "self_attn.compressor.indexer.scorer.weights_proj.weight",
     "self_attn.compressor.indexer.weights_proj.weight", "attn.indexer.weights_proj.weight"},
    {R_IDX_COMP_APE, "self_attn.compressor.indexer.position_bias", NULL, "attn.indexer.compressor.ape"},
    {R_IDX_COMP_KV, "self_attn.compressor.indexer.kv_proj.weight", NULL,
     "attn.indexer.compressor.wkv.weight"},
    {R_IDX_COMP_GATE, "self_attn.compressor.indexer.gate_proj.weight", NULL,
     "attn.indexer.compressor.wgate.weight"},
    {R_IDX_COMP_NORM, "self_attn.compressor.indexer.kv_norm.weight", NULL,
     "attn.indexer.compressor.norm.weight"},
    {R_HC_FFN_FN, "ffn_hc.fn", NULL, "hc_ffn_fn"},
    {R_HC_FFN_SCALE, "ffn_hc.scale", NULL, "hc_ffn_scale"},
    {R_HC_FFN_BASE, "ffn_hc.base", NULL, "hc_ffn_base"},
    {R_FFN_NORM, "post_attention_layernorm.weight", NULL, "ffn_norm.weight"},
    {R_GATE_INP, "mlp.gate.weight", NULL, "ffn.gate.weight"},
    {R_EXP_PROBS_B, "mlp.gate.e_score_correction_bias", NULL, "ffn.gate.bias"},
    {R_TID2EID, "mlp.gate.tid2eid", NULL, "ffn.gate.tid2eid"},
    {R_GATE_EXPS, "mlp.experts.gate_up_proj", NULL, "w1"},
    {R_UP_EXPS, "mlp.experts.gate_up_proj", NULL, "w3"},
    {R_DOWN_EXPS, "mlp.experts.down_proj", NULL, "w2"},
    {R_GATE_SHEXP, "mlp.shared_experts.gate_proj.weight", NULL, "ffn.shared_experts.w1.weight"},
    {R_UP_SHEXP, "mlp.shared_experts.up_proj.weight", NULL, "ffn.shared_experts.w3.weight"},
    {R_DOWN_SHEXP, "mlp.shared_experts.down_proj.weight", NULL, "ffn.shared_experts.w2.weight"},
    /* the MTP block: official names under mtp.0. in both releases
     * (transformers does not load it and keeps DeepSeek's names) */
    {R_MTP_E_PROJ, "e_proj.weight", NULL, "e_proj.weight"},
    {R_MTP_H_PROJ, "h_proj.weight", NULL, "h_proj.weight"},
    {R_MTP_ENORM, "enorm.weight", NULL, "enorm.weight"},
    {R_MTP_HNORM, "hnorm.weight", NULL, "hnorm.weight"},
    {R_MTP_NORM, "norm.weight", NULL, "norm.weight"},
    {R_MTP_HC_HEAD_FN, "hc_head_fn", NULL, "hc_head_fn"},
    {R_MTP_HC_HEAD_BASE, "hc_head_base", NULL, "hc_head_base"},
    {R_MTP_HC_HEAD_SCALE, "hc_head_scale", NULL, "hc_head_scale"},
};

const char *convert_scheme_name(convert_scheme s)
{
    return s == SCHEME_OFFICIAL ? "official" : "transformers";
}

ds4_status convert_detect_scheme(const st_archive *a, convert_scheme *out)
{
    if (st_find(a, "model.embed_tokens.weight")) *out = SCHEME_TRANSFORMERS;
    else if (st_find(a, "embed.weight")) *out = SCHEME_OFFICIAL;
    else
        return ds4_fail(DS4_ERR_NOT_FOUND,
                        "convert: missing tensor model.embed_tokens.weight (transformers names) or "
                        "embed.weight (official names): cannot tell the naming scheme");
    return DS4_OK;
}

int convert_source_name(convert_scheme s, const plan_tensor *t, int expert, int alt, char *buf, size_t cap)
{
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (names[i].role != t->role) continue;
        const char *suffix = s == SCHEME_OFFICIAL ? names[i].official : names[i].hf;
        if (alt) {
            if (alt > 1 || s == SCHEME_OFFICIAL || !names[i].hf_alt) return 0;
            suffix = names[i].hf_alt;
        }
        bool exps = t->role == R_GATE_EXPS || t->role == R_UP_EXPS || t->role == R_DOWN_EXPS;
        if (t->mtp) {
            if (s != SCHEME_OFFICIAL || alt) return 0; /* resolved with official names only */
            if (exps) snprintf(buf, cap, "mtp.0.ffn.experts.%d.%s.weight", expert, suffix);
            else snprintf(buf, cap, "mtp.0.%s", suffix);
            return 1;
        }
        if (s == SCHEME_OFFICIAL && exps)
            snprintf(buf, cap, "layers.%d.ffn.experts.%d.%s.weight", t->layer, expert, suffix);
        else if (t->layer < 0) snprintf(buf, cap, "%s", suffix);
        else if (s == SCHEME_OFFICIAL) snprintf(buf, cap, "layers.%d.%s", t->layer, suffix);
        else snprintf(buf, cap, "model.layers.%d.%s", t->layer, suffix);
        return 1;
    }
    return 0;
}

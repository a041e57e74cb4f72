/*
 * convert_metadata.c - write the §1.2 metadata table from a convert_config.
 * Order follows the spec table; general.* first, as GGUF files usually do.
 */
#include "tools/convert_metadata.h"

#include <stdlib.h>

/* llama.cpp's enum value for sqrt(softplus) (model/dsv4_config.h checks it) */
#define CONVERT_GATING_SQRT_SOFTPLUS 4u

ds4_status convert_metadata_add(ds4_gguf_writer *w, const convert_config *c)
{
    const struct {
        const char *key;
        uint32_t v;
    } u32s[] = {
        {"deepseek4.context_length", c->ctx_len},
        {"deepseek4.block_count", c->n_layer},
        {"deepseek4.embedding_length", c->n_embd},
        {"deepseek4.vocab_size", c->n_vocab},
        {"deepseek4.attention.head_count", c->n_head},
        {"deepseek4.attention.head_count_kv", c->n_head_kv},
        {"deepseek4.attention.key_length", c->head_dim},
        {"deepseek4.attention.value_length", c->head_dim},
        {"deepseek4.rope.dimension_count", c->n_rot},
        {"deepseek4.attention.q_lora_rank", c->q_lora},
        {"deepseek4.attention.output_lora_rank", c->o_lora},
        {"deepseek4.attention.output_group_count", c->o_groups},
        {"deepseek4.expert_count", c->n_expert},
        {"deepseek4.expert_used_count", c->n_expert_used},
        {"deepseek4.expert_feed_forward_length", c->n_ff_exp},
        {"deepseek4.expert_shared_count", c->n_expert_shared},
        {"deepseek4.hash_layer_count", c->n_hash_layer},
        {"deepseek4.expert_group_count", c->n_expert_groups},
        {"deepseek4.expert_group_used_count", c->n_expert_groups_used},
        {"deepseek4.attention.sliding_window", c->sliding_window},
        {"deepseek4.attention.indexer.head_count", c->idx_heads},
        {"deepseek4.attention.indexer.key_length", c->idx_head_dim},
        {"deepseek4.attention.indexer.top_k", c->idx_topk},
        {"deepseek4.hyper_connection.count", c->hc_mult},
        {"deepseek4.hyper_connection.sinkhorn_iterations", c->hc_iters},
        {"deepseek4.rope.scaling.original_context_length", c->rope_orig_ctx},
        {"deepseek4.nextn_predict_layers", c->n_mtp},
        /* The router's score function, in llama.cpp's numbering (4 =
         * sqrt(softplus)); mainline llama.cpp refuses a DeepSeek V4 file
         * without it. DeepSeek V4 has no other, so ds4 only checks it. */
        {"deepseek4.expert_gating_func", CONVERT_GATING_SQRT_SOFTPLUS},
    };
    const struct {
        const char *key;
        float v;
    } f32s[] = {
        {"deepseek4.rope.freq_base", c->rope_base},
        {"deepseek4.rope.scaling.factor", c->rope_factor},
        {"deepseek4.rope.scaling.yarn_beta_fast", c->beta_fast},
        {"deepseek4.rope.scaling.yarn_beta_slow", c->beta_slow},
        {"deepseek4.attention.compress_rope_freq_base", c->compress_rope_base},
        {"deepseek4.expert_weights_scale", c->expert_weights_scale},
        {"deepseek4.attention.layer_norm_rms_epsilon", c->rms_eps},
        {"deepseek4.hyper_connection.epsilon", c->hc_eps},
    };
    ds4_status st = ds4_gguf_writer_add_str(w, "general.architecture", "deepseek4");
    if (!st) st = ds4_gguf_writer_add_str(w, "general.name", c->name);
    if (!st) st = ds4_gguf_writer_add_u32(w, "general.alignment", 32);
    for (size_t i = 0; !st && i < sizeof u32s / sizeof u32s[0]; i++)
        st = ds4_gguf_writer_add_u32(w, u32s[i].key, u32s[i].v);
    int32_t ratios[CONVERT_MAX_LAYERS];
    float clamp[CONVERT_MAX_LAYERS];
    for (uint32_t i = 0; i < c->n_layer; i++) {
        ratios[i] = (int32_t)c->compress_ratio[i];
        clamp[i] = c->swiglu_limit;
    }
    if (!st) st = ds4_gguf_writer_add_arr(w, "deepseek4.attention.compress_ratios", DS4_GGUF_I32, ratios, c->n_layer);
    if (!st) st = ds4_gguf_writer_add_arr(w, "deepseek4.swiglu_clamp_exp", DS4_GGUF_F32, clamp, c->n_layer);
    for (size_t i = 0; !st && i < sizeof f32s / sizeof f32s[0]; i++)
        st = ds4_gguf_writer_add_f32(w, f32s[i].key, f32s[i].v);
    if (!st) st = ds4_gguf_writer_add_bool(w, "deepseek4.expert_weights_norm", c->expert_weights_norm);
    /* llama.cpp's generic key; ds4 ignores it */
    if (!st) st = ds4_gguf_writer_add_str(w, "deepseek4.rope.scaling.type", c->rope_factor != 1.0f ? "yarn" : "none");
    return st;
}

/*
 * convert_config.h - the DeepSeek V4 hyper-parameters the converter needs,
 * read from a checkpoint's config.json or taken from a built-in preset.
 *
 * config.json comes in two styles (dsv4-model.md §1, §7):
 *   transformers: layer_types + compress_rates, mlp_layer_types ("hash_moe"
 *     prefix = hash layers), partial_rotary_factor, rope_parameters
 *     {main, compress};
 *   official: compress_ratios (one per layer, extra MTP entries ignored),
 *     num_hash_layers, qk_rope_head_dim, rope_scaling {type: yarn, ...},
 *     compress_rope_theta.
 * Both are reduced to this one struct, which is exactly what the GGUF
 * metadata of §1.2 carries. Presets (flash, pro) are the §1.1 values, for
 * the synthetic-weights mode.
 */
#ifndef DS4_TOOLS_CONVERT_CONFIG_H
#define DS4_TOOLS_CONVERT_CONFIG_H

#include "include/ds4.h"

#include <stdbool.h>
#include <stdint.h>

#define CONVERT_MAX_LAYERS 256

typedef struct {
    char name[128];
    uint32_t n_vocab, n_embd, n_layer;
    uint32_t n_head, n_head_kv, head_dim, n_rot;
    uint32_t q_lora, o_lora, o_groups;
    uint32_t n_expert, n_expert_used, n_ff_exp, n_expert_shared;
    uint32_t n_hash_layer, n_expert_groups, n_expert_groups_used;
    uint32_t sliding_window;
    uint32_t idx_heads, idx_head_dim, idx_topk;
    uint32_t hc_mult, hc_iters;
    uint32_t rope_orig_ctx, ctx_len, n_mtp;
    uint32_t bos_id, eos_id;
    float rope_base, rope_factor, beta_fast, beta_slow, compress_rope_base;
    float expert_weights_scale, rms_eps, hc_eps, swiglu_limit;
    bool expert_weights_norm;
    uint32_t compress_ratio[CONVERT_MAX_LAYERS]; /* 0 sliding, 4 CSA, else HCA */
} convert_config;

/* Parse config.json (either style). Errors name the file and key. */
ds4_status convert_config_load(const char *path, convert_config *cfg);
ds4_status convert_config_parse(const char *json_text, const char *what, convert_config *cfg);

/* Built-in shapes: "flash" or "pro" (dsv4-model.md §1.1). */
ds4_status convert_config_preset(const char *name, convert_config *cfg);

/* Check the relationships the engine relies on (§7.1); message names the
 * offending value. */
ds4_status convert_config_validate(const convert_config *cfg);

/* Keep the first n layers (the ratio pattern is kept) / n experts. */
ds4_status convert_config_truncate(convert_config *cfg, uint32_t n_layer, uint32_t n_expert);

/* ratio -> "c" of dsv4-model.md §2.3 (2 for CSA, 1 for HCA, 0 sliding). */
static inline uint32_t convert_coff(uint32_t ratio) { return ratio == 4 ? 2 : ratio ? 1 : 0; }

#endif

/*
 * dsv4_config.h - the DeepSeek V4 hyper-parameters, read from GGUF metadata
 * (dsv4-model.md §1.2). Every shape comes from the file, and the kind of
 * each layer from compress_ratios (0 = sliding only, 4 = CSA with indexer,
 * other = HCA), so the tiny test models, Flash and Pro load with one code.
 */
#ifndef DS4_MODEL_DSV4_CONFIG_H
#define DS4_MODEL_DSV4_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "include/ds4.h"

#define DSV4_MAX_LAYERS 256
#define DSV4_MAX_HC 16
#define DSV4_CSA_RATIO 4
/* deepseek4.expert_gating_func: llama.cpp's number for sqrt(softplus) scoring */
#define DSV4_GATING_SQRT_SOFTPLUS 4

typedef struct ds4_gguf ds4_gguf;

typedef struct {
    int n_layer, n_embd, n_vocab;
    int n_head, head_dim, n_rot;      /* K = V = head_dim; RoPE on the trailing n_rot */
    int q_lora, o_lora, o_groups;
    int n_expert, n_expert_used, n_ff_exp, n_expert_shared, n_hash_layer;
    int window;                        /* sliding window (raw ring rows) */
    int idx_heads, idx_dim, idx_topk;  /* lightning indexer */
    int n_hc, sinkhorn_iters;
    int compress_ratio[DSV4_MAX_LAYERS];
    float swiglu_clamp[DSV4_MAX_LAYERS];
    float rope_base, rope_base_compress;
    float yarn_factor, yarn_beta_fast, yarn_beta_slow;
    uint64_t yarn_orig_ctx;
    float expert_weight_scale, rms_eps, hc_eps;
} dsv4_config;

/* Read and check the configuration; error names the key and value. */
ds4_status dsv4_config_load(const ds4_gguf *g, dsv4_config *cfg);

/* RoPE frequencies omega_i (n_rot/2 values) of §3.4: plain base^(-2i/R)
 * for sliding layers, base_compress with the YaRN ramp for compressed ones. */
void dsv4_rope_omega(const dsv4_config *cfg, bool compressed, float *omega);

static inline bool dsv4_layer_is_csa(const dsv4_config *c, int il)
{
    return c->compress_ratio[il] == DSV4_CSA_RATIO;
}

#endif

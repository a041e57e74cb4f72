/*
 * dsv4_mtp.h - DeepSeek V4's multi-token-prediction (MTP) block, used to
 * draft tokens for speculative decoding (docs/MODEL.md "Multi-token
 * prediction"; engine/spec.c runs the speculation).
 *
 * From DeepSeek's reference MTPBlock: given the main model's final mHC
 * state H_p [n_hc, n_embd] after position p and the next token t,
 *
 *   e      = e_proj . RMSNorm(embed(t), enorm)
 *   Hin[s] = e + h_proj . RMSNorm(H_p[s], hnorm)          s = 0..n_hc-1
 *   Hout   = block(Hin)   one decoder block: sliding-window attention only
 *                         (ratio 0, RoPE base 10000), top-k MoE with bias
 *   logits = output . RMSNorm(hc_head(Hout; mtp hc_head), mtp norm)
 *
 * The embedding and the LM head are the main model's. The block keeps its
 * own raw KV ring (a one-layer session state).
 */
#ifndef DS4_MODEL_DSV4_MTP_H
#define DS4_MODEL_DSV4_MTP_H

#include "model/dsv4_state.h"

typedef struct dsv4_mtp {
    dsv4_model view; /* one layer: cfg of the main model with n_layer 1, ratio 0 */
    dsv4_layer layer;
    dsv4_mtp_weights w;
    ds4_gguf *own; /* a separate MTP file (NULL: tensors from the main file) */
} dsv4_mtp;

/* Bind the MTP block of path (NULL: m's own file) into m->mtp. A file
 * without mtp.0.* tensors: DS4_ERR_NOT_FOUND naming the first missing. */
ds4_status dsv4_mtp_load(dsv4_model *m, const char *path);
void dsv4_mtp_free(struct dsv4_mtp *mt);
/* Every weight of the block (and the shared embedding / head). */
void dsv4_mtp_for_each_weight(const dsv4_mtp *mt, dsv4_weight_fn fn, void *ctx);

/* A session's MTP state: the block's KV ring and activation buffers. */
typedef struct {
    const dsv4_mtp *mt;
    dsv4_state *st;
    float *hb;          /* device [max_chunk * n_hc, n_embd] */
    float *one, *ident; /* device: post = 1, comb = identity (the broadcast add) */
} dsv4_mtp_state;

ds4_status dsv4_mtp_state_create(const dsv4_mtp *mt, ds4_backend *be, int64_t n_ctx, int max_chunk,
                                 const ds4_kv_numerics *nm, dsv4_mtp_state **out);
void dsv4_mtp_state_free(dsv4_mtp_state *ms);

/* T <= max_chunk rows at the state's next positions: row i pairs the main
 * model's state h[i] (host [n_hc, n_embd]) with token tokens[i]. logits
 * (host, n_vocab; NULL: head skipped) and hout (host [n_hc, n_embd]; NULL:
 * not read back) receive the last row's. */
ds4_status dsv4_mtp_forward(dsv4_mtp_state *ms, const float *h, const int32_t *tokens, int T, float *logits,
                            float *hout);

#endif

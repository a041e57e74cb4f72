/*
 * model_stats.h - private: the per-tensor rule behind
 * ds4_model_weight_bytes_per_token (engine/model_stats.c), exposed so that
 * a test can apply it to a tensor plan (the full Flash layout) without
 * writing an 80 GiB file.
 */
#ifndef DS4_ENGINE_MODEL_STATS_H
#define DS4_ENGINE_MODEL_STATS_H

#include <stdint.h>

/* What decoding one token reads of a tensor (dsv4-model.md §6.2), for a
 * GGUF tensor `name` of `bytes` bytes and shape ne (GGUF order): the whole
 * tensor, except
 *   token_embd.weight          one row (bytes / ne[1]);
 *   *.ffn_{gate,up,down}_exps  n_used of its ne[2] experts;
 *   *.ffn_gate_tid2eid         one row (the token's expert ids);
 *   *.indexer.attn_q_b / .indexer.proj
 *                              nothing until a CSA layer holds more than
 *                              idx_topk compressed rows, i.e. until
 *                              floor(n_ctx / 4) > idx_topk (before that
 *                              every row is selected and no score is
 *                              needed: model/dsv4_forward.c skips them).
 * n_ctx counts the tokens in the context including the one decoded. */
uint64_t ds4_tensor_bytes_per_token(const char *name, uint64_t bytes, const uint64_t ne[4], int n_used,
                                    int idx_topk, int64_t n_ctx);

#endif

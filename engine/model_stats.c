/*
 * model_stats.c - figures about a loaded model that benchmarks need:
 * the weight bytes read to decode one token (the input of the bandwidth
 * roofline, dsv4-model.md §6.2).
 *
 * The count is made from the GGUF's tensor table (the bytes as stored in
 * the file, i.e. what a backend that keeps the weights in their file types
 * streams), by a per-tensor rule (engine/model_stats.h), so the same rule
 * applies to a real file and to a converter plan of the full Flash layout.
 * KV/state reads are not included: they depend on the backend's storage
 * and are a few percent of the weights below ~100K context (§6.2).
 */
#include "engine/model_stats.h"

#include "engine/model_access.h"
#include "engine/model_numa.h"
#include "engine/model_warm.h"
#include "gguf/gguf.h"
#include "include/ds4.h"
#include "model/dsv4_config.h"

#include <string.h>

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

uint64_t ds4_tensor_bytes_per_token(const char *name, uint64_t bytes, const uint64_t ne[4], int n_used,
                                    int idx_topk, int64_t n_ctx)
{
    if (strcmp(name, "token_embd.weight") == 0 || ends_with(name, ".ffn_gate_tid2eid.weight"))
        return ne[1] ? bytes / ne[1] : 0;
    if (ends_with(name, ".ffn_gate_exps.weight") || ends_with(name, ".ffn_up_exps.weight") ||
        ends_with(name, ".ffn_down_exps.weight"))
        return ne[2] ? bytes / ne[2] * (uint64_t)(n_used > 0 ? n_used : 0) : 0;
    if (ends_with(name, ".indexer.attn_q_b.weight") || ends_with(name, ".indexer.proj.weight"))
        return n_ctx / DSV4_CSA_RATIO > idx_topk ? bytes : 0;
    return bytes;
}

uint64_t ds4_model_weight_bytes_per_token(const ds4_model *model, int64_t n_ctx)
{
    const dsv4_model *m = ds4_model_dsv4(model);
    uint64_t sum = 0;
    for (int64_t i = 0; i < ds4_gguf_n_tensors(m->gguf); i++) {
        const ds4_gguf_tensor *t = ds4_gguf_tensor_at(m->gguf, i);
        sum += ds4_tensor_bytes_per_token(t->name, t->size, t->ne, m->cfg.n_expert_used, m->cfg.idx_topk, n_ctx);
    }
    return sum;
}

long long ds4_model_weight_huge_bytes(const ds4_model *model)
{
    const dsv4_model *m = ds4_model_dsv4(model);
    return m ? ds4_mapped_huge_bytes(ds4_gguf_base(m->gguf), (size_t)ds4_gguf_file_size(m->gguf)) : -1;
}

int ds4_model_weight_numa(const ds4_model *model, char *buf, size_t len)
{
    const dsv4_model *m = ds4_model_dsv4(model);
    return m ? ds4_numa_report(ds4_gguf_base(m->gguf), (size_t)ds4_gguf_file_size(m->gguf), buf, len) : -1;
}

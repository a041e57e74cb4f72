/*
 * dsv4_model.h - a loaded DeepSeek V4 model: configuration, every weight
 * bound and validated (name, type, shape; dsv4-model.md §2), the RoPE
 * frequency tables, and the forward pass over a session state.
 *
 * Weights are ds4_weight views of the mmapped GGUF; small parameters
 * (norm weights, HC scales/bases, sinks, biases, compressor `ape`) are
 * widened once to f32 arrays the model owns, so ops read them as F32.
 */
#ifndef DS4_MODEL_DSV4_MODEL_H
#define DS4_MODEL_DSV4_MODEL_H

#include "backend/ops.h"
#include "model/dsv4_config.h"

typedef struct {
    /* attention site */
    ds4_weight hc_attn_fn, hc_attn_scale, hc_attn_base, attn_norm;
    ds4_weight q_a, q_a_norm, q_b, kv, kv_norm, sinks, o_a, o_b;
    /* compressor (ratio != 0) */
    ds4_weight comp_ape, comp_kv, comp_gate, comp_norm;
    /* lightning indexer (ratio == 4) */
    ds4_weight idx_q_b, idx_proj, idx_ape, idx_kv, idx_gate, idx_norm;
    /* ffn site */
    ds4_weight hc_ffn_fn, hc_ffn_scale, hc_ffn_base, ffn_norm;
    ds4_weight gate_inp, exp_probs_b, tid2eid;
    ds4_weight gate_exps, up_exps, down_exps, gate_sh, up_sh, down_sh;
    bool has_bias, is_hash;
} dsv4_layer;

typedef struct dsv4_model {
    dsv4_config cfg;
    ds4_gguf *gguf;
    ds4_weight tok_embd, out_hc_fn, out_hc_base, out_hc_scale, out_norm, output;
    dsv4_layer *layers;
    ds4_weight omega_main, omega_comp; /* F32 [n_rot/2] */
    float **owned;                     /* f32 copies to free */
    int n_owned, cap_owned;
    /* small tensors (norms, biases, hyper-connection parameters) holding a
     * NaN or an infinity: a warning at load, counted here for callers */
    int n_nonfinite_tensors;
    /* When not NULL: selections per (layer, expert), [n_layer * n_expert],
     * counted by every forward (expert profile, engine/expert_profile.h);
     * updated atomically, so sessions in several threads may share it. */
    uint64_t *expert_counts;
    /* The layers this model holds: [layer_lo, layer_hi), all of them
     * unless a distributed run gave it a stage (docs/DISTRIBUTED.md). The
     * embedding is bound only with layer 0, the head only with the last
     * layer; the tensors of other layers stay unbound (never touched). */
    int layer_lo, layer_hi;
    /* The multi-token-prediction block when one is loaded (model/dsv4_mtp.h;
     * freed with the model), else NULL. */
    struct dsv4_mtp *mtp;
    /* Tensor parallel (model/dsv4_shard.c, docs/TENSOR-PARALLEL.md): a
     * rank's view of a whole model, its weights slices of the base's
     * (tp_size 0 or 1: not a view; the fields below are then unused).
     * tp_attn: this rank holds heads [rank*H/size, ...) and the matching
     * output groups, and the attention output is all-reduced; tp_shared:
     * the shared expert's hidden units are split likewise; the routed
     * experts [tp_e_lo, tp_e_hi) are this rank's (expert ids of the
     * others are dropped after routing), the MoE output all-reduced;
     * tp_vocab: rows [rank*V/size, ...) of the LM head, the logits
     * all-gathered. What is not split is computed by every rank (or, for
     * the shared expert and the head, by rank 0 alone). */
    int tp_rank, tp_size;
    bool tp_attn, tp_shared, tp_vocab;
    int tp_e_lo, tp_e_hi;
} dsv4_model;

static inline bool dsv4_model_tp(const dsv4_model *m) { return m->tp_size > 1; }
/* Heads and output groups this model (view) attends with. */
static inline int dsv4_model_heads(const dsv4_model *m)
{
    return m->tp_attn ? m->cfg.n_head / m->tp_size : m->cfg.n_head;
}
static inline int dsv4_model_o_groups(const dsv4_model *m)
{
    return m->tp_attn ? m->cfg.o_groups / m->tp_size : m->cfg.o_groups;
}

static inline bool dsv4_model_has_embed(const dsv4_model *m) { return m->layer_lo == 0; }
static inline bool dsv4_model_has_head(const dsv4_model *m) { return m->layer_hi == m->cfg.n_layer; }
static inline bool dsv4_model_is_whole(const dsv4_model *m)
{
    return dsv4_model_has_embed(m) && dsv4_model_has_head(m);
}

/* The MTP block's own tensors besides its decoder block (docs/MODEL.md
 * "Multi-token prediction"). */
typedef struct {
    ds4_weight e_proj, h_proj, enorm, hnorm;
} dsv4_mtp_weights;
/* Bind mtp.0.* of v->gguf into v->layers[0] (a one-layer view of the main
 * model's config), w, and v's head fields out_norm / out_hc_* (the MTP
 * block's own norm and hc_head); v->tok_embd and v->output stay the main
 * model's. Errors name the tensor. */
ds4_status dsv4_bind_mtp(dsv4_model *v, dsv4_mtp_weights *w);

/* Open a GGUF and bind it; NULL + message (naming the tensor, found and
 * expected type/shape) on failure. */
dsv4_model *dsv4_model_load(const char *path);
/* Bind from an already opened GGUF (takes ownership of g, also on error). */
dsv4_model *dsv4_model_from_gguf(ds4_gguf *g);
/* Only layers [lo, hi) (with the embedding when lo is 0, the head when hi
 * is n_layer): a pipeline stage. hi < 0 means n_layer. A range outside
 * 1..n_layer layers is an error naming it. */
dsv4_model *dsv4_model_load_range(const char *path, int lo, int hi);
void dsv4_model_free(dsv4_model *m);

/* Rank `rank` of `size` (2..64) of a tensor-parallel run over whole model
 * m: a view whose weights are m's slices (tp_* fields above), plus copies
 * of the column slices that are not contiguous in m (attention output
 * o_b, shared expert down). m must outlive it; free with
 * dsv4_model_shard_free. The split chosen depends only on m's shapes and
 * types, so every rank makes the same. */
dsv4_model *dsv4_model_shard(const dsv4_model *m, int rank, int size);
void dsv4_model_shard_free(dsv4_model *v);

/* All weights of the model (of its stage), for backend->weight_prepare. */
typedef void (*dsv4_weight_fn)(void *ctx, const ds4_weight *w);
void dsv4_model_for_each_weight(const dsv4_model *m, dsv4_weight_fn fn, void *ctx);

#endif

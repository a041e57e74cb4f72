/*
 * model_synth.h - test-only: write a random DeepSeek V4 GGUF of a chosen
 * shape (the tensor table of dsv4-model.md §2, metadata of §1.2), for
 * shapes no golden fixture has: the "official" numerics need Flash's
 * FP8 block (non-RoPE dims a multiple of 64) and 128-wide indexer heads
 * (§7.1), which the golden tiny models do not have. Every tensor the
 * reference initializes to a constant is random here too (§7.3).
 * Header-only (static), deterministic for a seed.
 */
#ifndef DS4_TESTS_MODEL_SYNTH_H
#define DS4_TESTS_MODEL_SYNTH_H

#include "gguf/gguf.h"
#include "quant/blocks.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int n_layer, n_embd, n_vocab, n_head, head_dim, n_rot, q_lora, o_lora, o_groups;
    int n_expert, n_used, n_ff, n_hash, window, idx_heads, idx_dim, idx_topk;
    int ratio[16];
} synth_shape;

/* hidden 128, 4 layers (sliding, CSA, HCA 16, CSA), head_dim 80 = 64 + 16
 * rope, indexer 2 x 128 top-4, window 16 */
static const synth_shape SYNTH_OFFICIAL = {4, 128, 256, 2, 80, 16, 32, 16, 1, 4, 2, 32, 1, 16, 2, 128, 4,
                                           {0, 4, 16, 4}};

typedef struct {
    uint64_t s;
    ds4_gguf_writer *w;
    void *bufs[1024];
    int n_bufs;
    int ok;
} synth_ctx;

static double synth_u(synth_ctx *c) /* uniform [0, 1) */
{
    c->s = c->s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(c->s >> 11) * 0x1p-53;
}

static double synth_n(synth_ctx *c) /* standard normal */
{
    double u = synth_u(c) + 1e-12, v = synth_u(c);
    return sqrt(-2 * log(u)) * cos(2 * M_PI * v);
}

/* Optional: called on every tensor's f32 values before it is written (a
 * test derives an edited model from the same seed; NULL: none). */
static void (*synth_edit_hook)(const char *name, float *v, const uint64_t *ne, void *ctx);
static void *synth_edit_ctx;
/* Optional: also write a random MTP block (mtp.0.*, docs/MODEL.md). */
static int synth_mtp;

/* kind: 'n' normal * scale, 'u' uniform [0.5, 1.5) */
static void synth_t(synth_ctx *c, const char *name, int nd, uint64_t ne0, uint64_t ne1, uint64_t ne2, char kind,
                    double scale)
{
    uint64_t ne[3] = {ne0, ne1, ne2}, n = ne0 * ne1 * ne2;
    float *v = malloc(n * sizeof *v);
    for (uint64_t i = 0; i < n; i++) v[i] = (float)(kind == 'u' ? 0.5 + synth_u(c) : synth_n(c) * scale);
    if (synth_edit_hook) synth_edit_hook(name, v, ne, synth_edit_ctx);
    c->bufs[c->n_bufs++] = v;
    if (ds4_gguf_writer_add_tensor(c->w, name, DS4_TYPE_F32, (uint32_t)nd, ne, v) != DS4_OK) c->ok = 0;
}

/* The sizes a block's tensors are made of. */
typedef struct {
    uint64_t E, HC, NMIX, D, H, QL, OL, G, NE, F;
} synth_dims;

/* A tensor of the block whose names start with pre ("blk.3.", "mtp.0."). */
static void synth_bt(synth_ctx *c, const char *pre, const char *suffix, int nd, uint64_t ne0, uint64_t ne1,
                     uint64_t ne2, char kind, double scale)
{
    char n[128];
    snprintf(n, sizeof n, "%s%s", pre, suffix);
    synth_t(c, n, nd, ne0, ne1, ne2, kind, scale);
}

/* A block's attention tensors, the same in a layer and the MTP block (a
 * layer's compressor and indexer follow them). */
static void synth_block_attn(synth_ctx *c, const char *pre, const synth_dims *d)
{
    uint64_t E = d->E, HC = d->HC, NMIX = d->NMIX, D = d->D, H = d->H, QL = d->QL, OL = d->OL, G = d->G;
    synth_bt(c, pre, "hc_attn_fn.weight", 2, HC * E, NMIX, 1, 'n', 1.0 / sqrt((double)(HC * E)));
    synth_bt(c, pre, "hc_attn_scale.weight", 1, 3, 1, 1, 'u', 0);
    synth_bt(c, pre, "hc_attn_base.weight", 1, NMIX, 1, 1, 'n', 0.5);
    synth_bt(c, pre, "attn_norm.weight", 1, E, 1, 1, 'u', 0);
    synth_bt(c, pre, "attn_q_a.weight", 2, E, QL, 1, 'n', 1.0 / sqrt((double)E));
    synth_bt(c, pre, "attn_q_a_norm.weight", 1, QL, 1, 1, 'u', 0);
    synth_bt(c, pre, "attn_q_b.weight", 2, QL, H * D, 1, 'n', 1.0 / sqrt((double)QL));
    synth_bt(c, pre, "attn_kv.weight", 2, E, D, 1, 'n', 1.0 / sqrt((double)E));
    synth_bt(c, pre, "attn_kv_a_norm.weight", 1, D, 1, 1, 'u', 0);
    synth_bt(c, pre, "attn_sinks.weight", 1, H, 1, 1, 'n', 1.0);
    synth_bt(c, pre, "attn_output_a.weight", 2, H * D / G, G * OL, 1, 'n', 1.0 / sqrt((double)(H * D / G)));
    synth_bt(c, pre, "attn_output_b.weight", 2, G * OL, E, 1, 'n', 1.0 / sqrt((double)(G * OL)));
}

/* A block's FFN input: its hyper-connection mix, norm and router (the
 * hash table or the routing bias follows). */
static void synth_block_ffn_in(synth_ctx *c, const char *pre, const synth_dims *d)
{
    uint64_t E = d->E, HC = d->HC, NMIX = d->NMIX, NE = d->NE;
    synth_bt(c, pre, "hc_ffn_fn.weight", 2, HC * E, NMIX, 1, 'n', 1.0 / sqrt((double)(HC * E)));
    synth_bt(c, pre, "hc_ffn_scale.weight", 1, 3, 1, 1, 'u', 0);
    synth_bt(c, pre, "hc_ffn_base.weight", 1, NMIX, 1, 1, 'n', 0.5);
    synth_bt(c, pre, "ffn_norm.weight", 1, E, 1, 1, 'u', 0);
    synth_bt(c, pre, "ffn_gate_inp.weight", 2, E, NE, 1, 'n', 1.0 / sqrt((double)E));
}

/* A block's routed and shared experts. */
static void synth_block_experts(synth_ctx *c, const char *pre, const synth_dims *d)
{
    uint64_t E = d->E, NE = d->NE, F = d->F;
    synth_bt(c, pre, "ffn_gate_exps.weight", 3, E, F, NE, 'n', 2.0 / sqrt((double)E));
    synth_bt(c, pre, "ffn_up_exps.weight", 3, E, F, NE, 'n', 2.0 / sqrt((double)E));
    synth_bt(c, pre, "ffn_down_exps.weight", 3, F, E, NE, 'n', 1.0 / sqrt((double)F));
    synth_bt(c, pre, "ffn_gate_shexp.weight", 2, E, F, 1, 'n', 2.0 / sqrt((double)E));
    synth_bt(c, pre, "ffn_up_shexp.weight", 2, E, F, 1, 'n', 2.0 / sqrt((double)E));
    synth_bt(c, pre, "ffn_down_shexp.weight", 2, F, E, 1, 'n', 1.0 / sqrt((double)F));
}

static inline int synth_write_gguf(const synth_shape *h, uint64_t seed, const char *path)
{
    synth_ctx *c = calloc(1, sizeof *c);
    c->s = seed;
    c->ok = 1;
    c->w = ds4_gguf_writer_new();
    uint64_t E = (uint64_t)h->n_embd, HC = 4, NMIX = (2 + HC) * HC, D = (uint64_t)h->head_dim, H = (uint64_t)h->n_head;
    uint64_t QL = (uint64_t)h->q_lora, OL = (uint64_t)h->o_lora, G = (uint64_t)h->o_groups, NE = (uint64_t)h->n_expert;
    uint64_t F = (uint64_t)h->n_ff, V = (uint64_t)h->n_vocab, ID = (uint64_t)h->idx_dim, IH = (uint64_t)h->idx_heads;
    const synth_dims dims = {E, HC, NMIX, D, H, QL, OL, G, NE, F};
    char n[128], pre[32];
#define T(nm, nd, a, b, cc, k, sc) synth_t(c, nm, nd, a, b, cc, k, sc)
#define BLK(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, il), n)
    T("token_embd.weight", 2, E, V, 1, 'n', 1.0);
    T("output_hc_fn.weight", 2, HC * E, HC, 1, 'n', 1.0 / sqrt((double)(HC * E)));
    T("output_hc_base.weight", 1, HC, 1, 1, 'n', 0.5);
    T("output_hc_scale.weight", 1, 1, 1, 1, 'u', 0);
    T("output_norm.weight", 1, E, 1, 1, 'u', 0);
    T("output.weight", 2, E, V, 1, 'n', 1.0 / sqrt((double)E));
    for (int il = 0; il < h->n_layer; il++) {
        uint64_t r = (uint64_t)h->ratio[il], cw = (r == 4 ? 2 : 1) * D;
        snprintf(pre, sizeof pre, "blk.%d.", il);
        synth_block_attn(c, pre, &dims);
        if (r) {
            T(BLK("attn_compressor_ape.weight"), 2, cw, r, 1, 'n', 0.5);
            T(BLK("attn_compressor_kv.weight"), 2, E, cw, 1, 'n', 1.0 / sqrt((double)E));
            T(BLK("attn_compressor_gate.weight"), 2, E, cw, 1, 'n', 1.0 / sqrt((double)E));
            T(BLK("attn_compressor_norm.weight"), 1, D, 1, 1, 'u', 0);
        }
        if (r == 4) {
            T(BLK("indexer.attn_q_b.weight"), 2, QL, IH * ID, 1, 'n', 1.0 / sqrt((double)QL));
            T(BLK("indexer.proj.weight"), 2, E, IH, 1, 'n', 1.0 / sqrt((double)E));
            T(BLK("indexer_compressor_ape.weight"), 2, 2 * ID, r, 1, 'n', 0.5);
            T(BLK("indexer_compressor_kv.weight"), 2, E, 2 * ID, 1, 'n', 1.0 / sqrt((double)E));
            T(BLK("indexer_compressor_gate.weight"), 2, E, 2 * ID, 1, 'n', 1.0 / sqrt((double)E));
            T(BLK("indexer_compressor_norm.weight"), 1, ID, 1, 1, 'u', 0);
        }
        synth_block_ffn_in(c, pre, &dims);
        if (il < h->n_hash) {
            int32_t *tb = malloc(V * (uint64_t)h->n_used * 4);
            for (uint64_t t = 0; t < V; t++)
                for (int j = 0; j < h->n_used; j++) {
                    int32_t e;
                    int dup;
                    do {
                        e = (int32_t)(synth_u(c) * (double)NE);
                        dup = 0;
                        for (int k = 0; k < j; k++) dup |= tb[t * (uint64_t)h->n_used + (uint64_t)k] == e;
                    } while (dup);
                    tb[t * (uint64_t)h->n_used + (uint64_t)j] = e;
                }
            c->bufs[c->n_bufs++] = tb;
            uint64_t ne[2] = {(uint64_t)h->n_used, V};
            if (ds4_gguf_writer_add_tensor(c->w, BLK("ffn_gate_tid2eid.weight"), DS4_TYPE_I32, 2, ne, tb) != DS4_OK) c->ok = 0;
        } else {
            T(BLK("exp_probs_b.bias"), 1, NE, 1, 1, 'n', 0.1);
        }
        synth_block_experts(c, pre, &dims);
    }
    if (synth_mtp) {
        /* one sliding block, top-k routed with a bias, plus its own tensors */
        const char *P = "mtp.0.";
#define M(suffix) (snprintf(n, sizeof n, "%s%s", P, suffix), n)
        synth_block_attn(c, P, &dims);
        synth_block_ffn_in(c, P, &dims);
        T(M("exp_probs_b.bias"), 1, NE, 1, 1, 'n', 0.1);
        synth_block_experts(c, P, &dims);
        T(M("e_proj.weight"), 2, E, E, 1, 'n', 1.0 / sqrt((double)E));
        T(M("h_proj.weight"), 2, E, E, 1, 'n', 1.0 / sqrt((double)E));
        T(M("enorm.weight"), 1, E, 1, 1, 'u', 0);
        T(M("hnorm.weight"), 1, E, 1, 1, 'u', 0);
        T(M("norm.weight"), 1, E, 1, 1, 'u', 0);
        T(M("hc_head_fn.weight"), 2, HC * E, HC, 1, 'n', 1.0 / sqrt((double)(HC * E)));
        T(M("hc_head_base.weight"), 1, HC, 1, 1, 'n', 0.5);
        T(M("hc_head_scale.weight"), 1, 1, 1, 1, 'u', 0);
#undef M
    }
#undef T
#undef BLK
    ds4_gguf_writer *w = c->w;
#define A "deepseek4."
#define U32(k, v) ds4_gguf_writer_add_u32(w, A k, (uint32_t)(v))
#define F32V(k, v) ds4_gguf_writer_add_f32(w, A k, (float)(v))
    ds4_gguf_writer_add_str(w, "general.architecture", "deepseek4");
    U32("block_count", h->n_layer);
    U32("embedding_length", E);
    U32("vocab_size", V);
    U32("attention.head_count", H);
    U32("attention.head_count_kv", 1);
    U32("attention.key_length", D);
    U32("attention.value_length", D);
    U32("rope.dimension_count", h->n_rot);
    U32("attention.q_lora_rank", QL);
    U32("attention.output_lora_rank", OL);
    U32("attention.output_group_count", G);
    U32("expert_count", NE);
    U32("expert_used_count", h->n_used);
    U32("expert_feed_forward_length", F);
    U32("expert_shared_count", 1);
    U32("hash_layer_count", h->n_hash);
    U32("attention.sliding_window", h->window);
    U32("attention.indexer.head_count", IH);
    U32("attention.indexer.key_length", ID);
    U32("attention.indexer.top_k", h->idx_topk);
    U32("hyper_connection.count", HC);
    U32("hyper_connection.sinkhorn_iterations", 20);
    U32("rope.scaling.original_context_length", 65536);
    F32V("rope.freq_base", 10000);
    F32V("rope.scaling.factor", 16);
    F32V("rope.scaling.yarn_beta_fast", 32);
    F32V("rope.scaling.yarn_beta_slow", 1);
    F32V("attention.compress_rope_freq_base", 160000);
    F32V("expert_weights_scale", 1.5);
    F32V("attention.layer_norm_rms_epsilon", 1e-6);
    F32V("hyper_connection.epsilon", 1e-6);
    ds4_gguf_writer_add_bool(w, A "expert_weights_norm", true);
    float clamp[16];
    for (int i = 0; i < 16; i++) clamp[i] = 10.0f;
    ds4_gguf_writer_add_arr(w, A "attention.compress_ratios", DS4_GGUF_I32, h->ratio, (uint64_t)h->n_layer);
    ds4_gguf_writer_add_arr(w, A "swiglu_clamp_exp", DS4_GGUF_F32, clamp, (uint64_t)h->n_layer);
#undef A
#undef U32
#undef F32V
    if (c->ok && ds4_gguf_writer_write(w, path) != DS4_OK) c->ok = 0;
    int ok = c->ok;
    if (!ok) fprintf(stderr, "synth: %s\n", ds4_last_error());
    ds4_gguf_writer_free(w);
    for (int i = 0; i < c->n_bufs; i++) free(c->bufs[i]);
    free(c);
    return ok;
}

#endif

/*
 * dsv4_forward.c - the DeepSeek V4 forward pass, written once against the
 * backend ops (backend/ops.h). One screen per sublayer; every step cites
 * shared/docs/dsv4-model.md.
 *
 * A call processes a chunk of T tokens at positions pos0 .. pos0+T-1 and
 * advances the session state (§3.10): prefill and decode are the same code
 * (decode is T = 1), and the result does not depend on how a sequence is
 * cut into chunks. Per layer (§3.10 "full per-token order"):
 *
 *   X --hc_pre--> attention(attn_norm(y)) --hc_post--> X
 *     --hc_pre--> moe(ffn_norm(y))        --hc_post--> X
 *
 * where X is the 4-stream residual state [T, n_hc, n_embd] (§3.1).
 */
#include "model/dsv4_state.h"

#include "util/error.h"

#include <math.h>

/* §3.4-§3.6: attention sublayer; input s->a = RMSNorm(y, attn_norm),
 * output s->F (n_embd per token). */
static void attention_sublayer(dsv4_state *s, int il, int T)
{
    const dsv4_config *c = &s->m->cfg;
    const dsv4_layer *L = &s->m->layers[il];
    dsv4_layer_state *ls = &s->layers[il];
    ds4_backend *be = s->be;
    int64_t pos0 = s->n_pos;
    int r = c->compress_ratio[il], D = c->head_dim, H = c->n_head;
    /* sliding layers: base 10000 plain; compressed layers: 160000 + YaRN */
    const ds4_weight *omega = r ? &s->m->omega_comp : &s->m->omega_main;

    /* Q path (§3.4): qr = RMSNorm(W_q_a a); q = W_q_b qr; per-head RMSNorm_1 */
    be->matmul(be, &L->q_a, s->a, T, s->qr);
    be->rmsnorm(be, s->qr, &L->q_a_norm, T, c->q_lora, c->rms_eps, s->qr);
    be->matmul(be, &L->q_b, s->qr, T, s->q);
    be->rmsnorm(be, s->q, NULL, (int64_t)T * H, D, c->rms_eps, s->q);
    /* KV path: one shared head, K = V */
    be->matmul(be, &L->kv, s->a, T, s->kv);
    be->rmsnorm(be, s->kv, &L->kv_norm, T, D, c->rms_eps, s->kv);
    /* partial interleaved RoPE on the trailing n_rot dims at position p */
    be->rope(be, s->q, T, H, D, c->n_rot, omega, pos0, false);
    be->rope(be, s->kv, T, 1, D, c->n_rot, omega, pos0, false);
    /* official numerics: FP8 on the non-RoPE dims, f16 storage (§4.1 D1, D3) */
    if (s->nm.fp8_nope || s->nm.f16_store) be->kv_round(be, s->kv, T, D, &s->nm);

    const float *comp_rows = NULL;
    const int32_t *sel = NULL;
    if (r) {
        /* compressor (§3.5): per-token kv/gate from the normed input; windows
         * completed in this chunk are pooled, normed, RoPE'd and appended */
        be->matmul(be, &L->comp_kv, s->a, T, s->c);
        be->matmul(be, &L->comp_gate, s->a, T, s->z);
        be->compressor_push(be, &ls->comp, s->c, s->z, T, pos0, &L->comp_ape, &L->comp_norm,
                            c->rms_eps, omega, c->n_rot, &s->nm, false);
        comp_rows = ls->comp.rows;
    }
    if (r == DSV4_CSA_RATIO) {
        /* lightning indexer (§3.6): its own compressor gives one key per window */
        be->matmul(be, &L->idx_kv, s->a, T, s->ci);
        be->matmul(be, &L->idx_gate, s->a, T, s->zi);
        be->compressor_push(be, &ls->idx, s->ci, s->zi, T, pos0, &L->idx_ape, &L->idx_norm,
                            c->rms_eps, omega, c->n_rot, &s->nm, true);
        /* scoring is needed only once some query sees more than top_k keys */
        if ((pos0 + T) / r > c->idx_topk) {
            be->matmul(be, &L->idx_q_b, s->qr, T, s->qi);
            be->rope(be, s->qi, T, c->idx_heads, c->idx_dim, c->n_rot, omega, pos0, false);
            if (s->nm.indexer_qat) be->indexer_qat(be, s->qi, (int64_t)T * c->idx_heads, c->idx_dim);
            be->matmul(be, &L->idx_proj, s->a, T, s->wi);
        }
        be->indexer_topk(be, s->qi, s->wi, T, c->idx_heads, c->idx_dim, ls->idx.rows, pos0, r,
                         c->idx_topk, s->sel);
        sel = s->sel;
    }

    /* one softmax over raw window rows + visible compressed rows + sink */
    be->attention(be, s->q, T, H, D, s->kv, ls->ring, c->window, pos0, comp_rows, r, sel,
                  c->idx_topk, &L->sinks, s->o);
    be->ring_push(be, ls->ring, c->window, D, s->kv, T, pos0);

    /* V = K carries RoPE: rotate the output back by -theta(p) */
    be->rope(be, s->o, T, H, D, c->n_rot, omega, pos0, true);
    /* grouped output projection: G groups of H/G heads -> o_lora each, then o_b */
    be->matmul_grouped(be, &L->o_a, c->o_groups, s->o, T, s->u);
    be->matmul(be, &L->o_b, s->u, T, s->F);
}

/* §3.7: MoE sublayer; input s->a = RMSNorm(y, ffn_norm), output s->F. */
static void moe_sublayer(dsv4_state *s, int il, int T)
{
    const dsv4_config *c = &s->m->cfg;
    const dsv4_layer *L = &s->m->layers[il];
    ds4_backend *be = s->be;
    int K = c->n_expert_used;

    /* router: sqrt(softplus(W_gate_inp b)); hash layers take tid2eid[token],
     * others top-k of score + bias; weights from unbiased scores x scale */
    be->matmul(be, &L->gate_inp, s->a, T, s->rlogits);
    be->moe_route(be, s->rlogits, T, c->n_expert, K, L->has_bias ? &L->exp_probs_b : NULL,
                  L->is_hash ? &L->tid2eid : NULL, s->tokens, c->expert_weight_scale, s->esel,
                  s->ew);
    /* routed experts + the always-on shared expert, both clamped SwiGLU */
    be->moe_experts(be, &L->gate_exps, &L->up_exps, &L->down_exps, s->a, T, s->esel, s->ew, K,
                    c->swiglu_clamp[il], s->F, false);
    be->ffn_swiglu(be, &L->gate_sh, &L->up_sh, &L->down_sh, s->a, T, c->swiglu_clamp[il], s->F,
                   true);
}

/* One decoder layer (§3.3): two hyper-connection sites around the sublayers. */
static void layer_forward(dsv4_state *s, int il, int T)
{
    const dsv4_config *c = &s->m->cfg;
    const dsv4_layer *L = &s->m->layers[il];
    ds4_backend *be = s->be;
    int E = c->n_embd, HC = c->n_hc;

    be->hc_pre(be, s->X, T, HC, E, &L->hc_attn_fn, &L->hc_attn_scale, &L->hc_attn_base,
               c->sinkhorn_iters, c->rms_eps, c->hc_eps, s->y, s->post, s->comb);
    be->rmsnorm(be, s->y, &L->attn_norm, T, E, c->rms_eps, s->a);
    attention_sublayer(s, il, T);
    be->hc_post(be, s->X, T, HC, E, s->F, s->post, s->comb);

    be->hc_pre(be, s->X, T, HC, E, &L->hc_ffn_fn, &L->hc_ffn_scale, &L->hc_ffn_base,
               c->sinkhorn_iters, c->rms_eps, c->hc_eps, s->y, s->post, s->comb);
    be->rmsnorm(be, s->y, &L->ffn_norm, T, E, c->rms_eps, s->a);
    moe_sublayer(s, il, T);
    be->hc_post(be, s->X, T, HC, E, s->F, s->post, s->comb);
}

ds4_status dsv4_forward(dsv4_state *s, const int32_t *tokens, int T, bool all, float *logits)
{
    const dsv4_model *m = s->m;
    const dsv4_config *c = &m->cfg;
    ds4_backend *be = s->be;
    if (T < 1 || T > s->max_chunk)
        return ds4_fail(DS4_ERR_INVALID, "forward: chunk of %d tokens (1..%d allowed)", T, s->max_chunk);
    if (s->n_pos + T > s->n_ctx)
        return ds4_fail(DS4_ERR_INVALID, "forward: context full: %lld + %d tokens > context length %lld",
                        (long long)s->n_pos, T, (long long)s->n_ctx);
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= c->n_vocab)
            return ds4_fail(DS4_ERR_INVALID, "forward: token id %d at chunk index %d outside vocabulary [0, %d)",
                            tokens[t], t, c->n_vocab);
    be->upload(be, s->tokens, tokens, (size_t)T * sizeof(int32_t));

    /* a decode step may be recorded and replayed by the backend (CUDA
     * graph); it may ask for the step's ops once more (see ops.h) */
    const bool step = T == 1 && be->step_begin && be->step_end;
    if (step) be->step_begin(be, s->n_pos);
    int first = all ? 0 : T - 1, n_out = T - first;
    do {
        /* §3.1: embedding copied into every hyper-connection stream */
        be->embed(be, &m->tok_embd, s->tokens, T, c->n_hc, s->X);
        for (int il = 0; il < c->n_layer; il++) layer_forward(s, il, T);

        /* §3.8: final HC collapse, norm, LM head (all tokens, or the last one) */
        const float *Xo = s->X + (size_t)first * c->n_hc * c->n_embd;
        be->hc_head(be, Xo, n_out, c->n_hc, c->n_embd, &m->out_hc_fn, &m->out_hc_scale, &m->out_hc_base,
                    c->rms_eps, c->hc_eps, s->hy);
        be->rmsnorm(be, s->hy, &m->out_norm, n_out, c->n_embd, c->rms_eps, s->hy);
        be->matmul(be, &m->output, s->hy, n_out, s->logits);
    } while (step && be->step_end(be));
    s->n_pos += T;
    if (logits) be->download(be, logits, s->logits, (size_t)n_out * c->n_vocab * sizeof(float));
    return DS4_OK;
}

/*
 * dsv4_mtp.c - the MTP block: binding (from the main GGUF or a separate
 * one, names mtp.0.* as antirez/ds4's MTP file has them) and its forward
 * over a one-layer state, written against the backend ops like the main
 * forward and reusing its layer and head code (model/dsv4_pass.h).
 */
#include "model/dsv4_mtp.h"

#include "gguf/gguf.h"
#include "model/dsv4_pass.h"
#include "util/error.h"

#include <stdlib.h>
#include <string.h>

ds4_status dsv4_mtp_load(dsv4_model *m, const char *path)
{
    dsv4_mtp *mt = calloc(1, sizeof *mt);
    if (!mt) return ds4_fail(DS4_ERR_NOMEM, "mtp: out of memory");
    dsv4_model *v = &mt->view;
    v->cfg = m->cfg;
    /* the block sits after the last layer: sliding window only, top-k
     * routing; its SwiGLU clamp is the model's (one value in V4 Flash) */
    v->cfg.n_layer = 1;
    v->layer_lo = 0; /* the view holds its one layer (and the head) */
    v->layer_hi = 1;
    v->cfg.compress_ratio[0] = 0;
    v->cfg.n_hash_layer = 0;
    v->cfg.swiglu_clamp[0] = m->cfg.swiglu_clamp[m->cfg.n_layer - 1];
    v->layers = &mt->layer;
    v->tok_embd = m->tok_embd;
    v->output = m->output;
    v->omega_main = m->omega_main;
    v->omega_comp = m->omega_comp;
    if (path) {
        mt->own = ds4_gguf_open(path);
        if (!mt->own) {
            free(mt);
            return ds4_error_prefix("mtp: "), DS4_ERR_IO;
        }
    }
    v->gguf = mt->own ? mt->own : m->gguf;
    ds4_status st = dsv4_bind_mtp(v, &mt->w);
    if (st != DS4_OK) {
        ds4_error_prefix("%s: ", ds4_gguf_path(v->gguf));
        dsv4_mtp_free(mt);
        return st;
    }
    dsv4_mtp_free(m->mtp);
    m->mtp = mt;
    return DS4_OK;
}

void dsv4_mtp_free(dsv4_mtp *mt)
{
    if (!mt) return;
    for (int i = 0; i < mt->view.n_owned; i++) free(mt->view.owned[i]);
    free(mt->view.owned);
    if (mt->own) ds4_gguf_close(mt->own);
    free(mt);
}

void dsv4_mtp_for_each_weight(const dsv4_mtp *mt, dsv4_weight_fn fn, void *ctx)
{
    dsv4_model_for_each_weight(&mt->view, fn, ctx);
    const ds4_weight *w[] = {&mt->w.e_proj, &mt->w.h_proj, &mt->w.enorm, &mt->w.hnorm};
    for (size_t i = 0; i < sizeof w / sizeof *w; i++) fn(ctx, w[i]);
}

ds4_status dsv4_mtp_state_create(const dsv4_mtp *mt, ds4_backend *be, int64_t n_ctx, int max_chunk,
                                 const ds4_kv_numerics *nm, dsv4_mtp_state **out)
{
    *out = NULL;
    dsv4_mtp_state *ms = calloc(1, sizeof *ms);
    if (!ms) return ds4_fail(DS4_ERR_NOMEM, "mtp: out of memory");
    ms->mt = mt;
    ds4_status st = dsv4_state_create(&mt->view, be, n_ctx, max_chunk, nm, &ms->st);
    if (st != DS4_OK) {
        free(ms);
        return st;
    }
    const int HC = mt->view.cfg.n_hc, E = mt->view.cfg.n_embd;
    ms->hb = be->alloc(be, (size_t)max_chunk * HC * E * sizeof(float));
    ms->one = be->alloc(be, (size_t)max_chunk * HC * sizeof(float));
    ms->ident = be->alloc(be, (size_t)max_chunk * HC * HC * sizeof(float));
    float *one = malloc((size_t)max_chunk * HC * sizeof(float)), *id = calloc((size_t)max_chunk * HC * HC, sizeof(float));
    if (!ms->hb || !ms->one || !ms->ident || !one || !id) {
        free(one), free(id);
        dsv4_mtp_state_free(ms);
        return ds4_fail(DS4_ERR_NOMEM, "mtp: out of memory for the state");
    }
    for (int i = 0; i < max_chunk * HC; i++) one[i] = 1.0f;
    for (int t = 0; t < max_chunk; t++)
        for (int i = 0; i < HC; i++) id[((size_t)t * HC + i) * HC + i] = 1.0f;
    be->upload(be, ms->one, one, (size_t)max_chunk * HC * sizeof(float));
    be->upload(be, ms->ident, id, (size_t)max_chunk * HC * HC * sizeof(float));
    free(one), free(id);
    *out = ms;
    return DS4_OK;
}

void dsv4_mtp_state_free(dsv4_mtp_state *ms)
{
    if (!ms) return;
    if (ms->st) {
        ds4_backend *be = ms->st->be;
        if (ms->hb) be->free(be, ms->hb);
        if (ms->one) be->free(be, ms->one);
        if (ms->ident) be->free(be, ms->ident);
        dsv4_state_free(ms->st);
    }
    free(ms);
}

ds4_status dsv4_mtp_forward(dsv4_mtp_state *ms, const float *h, const int32_t *tokens, int T, float *logits,
                            float *hout)
{
    dsv4_state *s = ms->st;
    const dsv4_mtp *mt = ms->mt;
    const dsv4_config *c = &mt->view.cfg;
    ds4_backend *be = s->be;
    const int HC = c->n_hc, E = c->n_embd;
    if (T < 1 || T > s->max_chunk)
        return ds4_fail(DS4_ERR_INVALID, "mtp: chunk of %d rows (1..%d allowed)", T, s->max_chunk);
    if (s->n_pos + T > s->n_ctx)
        return ds4_fail(DS4_ERR_INVALID, "mtp: context full (%lld + %d > %lld)", (long long)s->n_pos, T,
                        (long long)s->n_ctx);
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= c->n_vocab)
            return ds4_fail(DS4_ERR_INVALID, "mtp: token id %d outside vocabulary [0, %d)", tokens[t], c->n_vocab);
    be->upload(be, s->tokens, tokens, (size_t)T * sizeof(int32_t));
    be->upload(be, ms->hb, h, (size_t)T * HC * E * sizeof(float));
    /* h_proj . hnorm(H[s]) for every stream row -> X */
    be->rmsnorm(be, ms->hb, &mt->w.hnorm, (int64_t)T * HC, E, c->rms_eps, ms->hb);
    be->matmul(be, &mt->w.h_proj, ms->hb, T * HC, s->X);
    /* e_proj . enorm(embed(t)) -> F, added to every stream: hc_post with
     * post = 1 and comb = identity is X[j] += F */
    be->embed(be, &mt->view.tok_embd, s->tokens, T, 1, s->a);
    be->rmsnorm(be, s->a, &mt->w.enorm, T, E, c->rms_eps, s->a);
    be->matmul(be, &mt->w.e_proj, s->a, T, s->F);
    be->hc_post(be, s->X, T, HC, E, s->F, ms->one, ms->ident);
    const dsv4_pass_seq seq = {s, s->n_pos, 0, T};
    const dsv4_pass p = {s, T, &seq, 1, NULL};
    dsv4_pass_layer(&p, 0);
    if (logits) {
        dsv4_pass_head(&p, T - 1, 1);
        be->download(be, logits, s->logits, (size_t)c->n_vocab * sizeof(float));
    }
    if (hout) be->download(be, hout, s->X + (size_t)(T - 1) * HC * E, (size_t)HC * E * sizeof(float));
    s->n_pos += T;
    return DS4_OK;
}

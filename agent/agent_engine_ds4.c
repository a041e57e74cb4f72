/*
 * agent_engine_ds4.c - the agent's engine port over the real engine: model
 * and session of include/ds4.h, tokenizer and sampler of the same GGUF.
 *
 * Tokenization recognises an added-token string only inside the template
 * ranges of the rendered prompt (ds4_tokenize_spans), so the chat markers
 * become their ids and user text, files and command output stay text. The
 * session's snapshot carries the logits of the last token, which is what
 * lets a restored session generate without re-feeding anything.
 */
#include "agent/agent_engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "include/ds4.h"
#include "cli/cli_edit_options.h"
#include "include/ds4_sampler.h"

typedef struct {
    agent_engine e;
    ds4_model *model;
    ds4_tokenizer *tok;
    ds4_session *session;
    ds4_sampler *sampler;
    ds4_sampler_params sp;
    ds4_rng spec_rng; /* --mtp with sampling: the acceptance rule's draws */
    int n_vocab;
    /* the last decode step's greedy pick (ds4_session_decode_pick): a greedy
     * sample takes it, so on CUDA the logits row stays on the device;
     * whatever else changes the session's logits clears pick_ok */
    int32_t pick;
    bool pick_ok;
} ds4_port;

static int fail(agent_engine *e, const char *what)
{
    snprintf(e->err, sizeof e->err, "%s: %s", what, ds4_last_error());
    return -1;
}

static int tokenize(agent_engine *e, const char *text, size_t len, const ds4_spans *tpl, ds4_tokens *out)
{
    /* Only the template's own markers become control tokens; the user's
     * task, file contents and command output stay text. */
    if (ds4_tokenize_spans(((ds4_port *)e)->tok, text, len, tpl, 0, out) != DS4_OK)
        return fail(e, "tokenize");
    return 0;
}

static const char *token_bytes(agent_engine *e, int32_t tok, size_t *len)
{
    return ds4_token_bytes(((ds4_port *)e)->tok, tok, len);
}

static int reset(agent_engine *e)
{
    ((ds4_port *)e)->pick_ok = false;
    ds4_session_reset(((ds4_port *)e)->session);
    return 0;
}

static int prefill(agent_engine *e, const int32_t *toks, size_t n)
{
    if (n == 0) return 0;
    ((ds4_port *)e)->pick_ok = false;
    if (ds4_session_prefill(((ds4_port *)e)->session, toks, (int64_t)n, NULL) != DS4_OK) return fail(e, "prefill");
    return 0;
}

static void reseed(agent_engine *e, uint64_t seed)
{
    ds4_port *p = (ds4_port *)e;
    p->sp.seed = seed;
    ds4_sampler_set_params(p->sampler, &p->sp, true);
    ds4_rng_seed(&p->spec_rng, seed ^ 0x5eedULL);
}

static int sample(agent_engine *e, bool greedy, int32_t *tok)
{
    ds4_port *p = (ds4_port *)e;
    /* argmax (no random number drawn): the pick of the step */
    if (p->pick_ok && (greedy || p->sp.temperature <= 0)) {
        *tok = p->pick;
        if (*tok < 0) {
            snprintf(e->err, sizeof e->err, "sample: no usable logit");
            return -1;
        }
        return 0;
    }
    const float *logits = ds4_session_logits(p->session);
    if (!logits) {
        snprintf(e->err, sizeof e->err, "sample: the session has no logits yet");
        return -1;
    }
    *tok = ds4_sampler_sample(p->sampler, logits, p->n_vocab, greedy);
    if (*tok < 0) {
        snprintf(e->err, sizeof e->err, "sample: no usable logit");
        return -1;
    }
    return 0;
}

static int decode(agent_engine *e, int32_t tok)
{
    ds4_port *p = (ds4_port *)e;
    p->pick_ok = false;
    if (ds4_session_decode_pick(p->session, tok, -1, &p->pick) != DS4_OK) return fail(e, "decode");
    p->pick_ok = true;
    return 0;
}

static int decode_spec(agent_engine *e, int32_t tok, bool greedy, int max_out, int32_t *out, int *n)
{
    ds4_port *p = (ds4_port *)e;
    p->pick_ok = false;
    ds4_sampler_params sa = p->sp;
    if (greedy) sa.temperature = 0;
    if (ds4_session_decode_spec(p->session, tok, &sa, &p->spec_rng, e->eos, max_out, out, n) != DS4_OK)
        return fail(e, "decode (mtp)");
    return 0;
}

static int spec_trim(agent_engine *e, int keep)
{
    ((ds4_port *)e)->pick_ok = false;
    if (ds4_session_spec_trim(((ds4_port *)e)->session, keep) != DS4_OK) return fail(e, "decode (mtp trim)");
    return 0;
}

static int64_t n_past(agent_engine *e) { return ds4_session_n_past(((ds4_port *)e)->session); }

static int snapshot(agent_engine *e, void **bytes, size_t *len)
{
    if (ds4_session_snapshot(((ds4_port *)e)->session, bytes, len) != DS4_OK) return fail(e, "snapshot");
    return 0;
}

static int restore(agent_engine *e, const void *bytes, size_t len)
{
    ((ds4_port *)e)->pick_ok = false;
    if (ds4_session_restore(((ds4_port *)e)->session, bytes, len) != DS4_OK) return fail(e, "restore");
    return 0;
}

static void close_(agent_engine *e)
{
    ds4_port *p = (ds4_port *)e;
    ds4_sampler_free(p->sampler);
    ds4_session_free(p->session);
    ds4_model_close(p->model);
    ds4_tokenizer_free(p->tok);
    free(p);
}

agent_engine *agent_engine_ds4_open(const char *path, const agent_engine_params *ap, uint64_t seed, char *err,
                                    size_t es)
{
    ds4_port *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, es, "out of memory");
        return NULL;
    }
    p->e.close = close_;
    p->tok = ds4_tokenizer_load(path);
    if (!p->tok) {
        snprintf(err, es, "%s: tokenizer: %s", path, ds4_last_error());
        close_(&p->e);
        return NULL;
    }
    p->model = ds4_model_open(path, NULL);
    if (!p->model) {
        snprintf(err, es, "%s: %s", path, ds4_last_error());
        close_(&p->e);
        return NULL;
    }
    p->n_vocab = ds4_model_n_vocab(p->model);
    if (p->n_vocab != ds4_tokenizer_n_vocab(p->tok)) {
        snprintf(err, es, "%s: the model has %d logits but the tokenizer %d tokens", path, p->n_vocab,
                 ds4_tokenizer_n_vocab(p->tok));
        close_(&p->e);
        return NULL;
    }
    ds4_session_params sp;
    ds4_session_params_default(&sp);
    sp.n_ctx = ap->ctx;
    if (ap->threads > 0) sp.n_threads = ap->threads;
    sp.backend = (ds4_backend_kind)ap->backend;
    sp.gpu_device = ap->gpu_device;
    p->session = ds4_session_create(p->model, &sp);
    if (!p->session) {
        snprintf(err, es, "cannot create a session (ctx %lld): %s", (long long)ap->ctx, ds4_last_error());
        close_(&p->e);
        return NULL;
    }
    if (ap->edit) { /* steering / --power (the session copies the directions) */
        ds4_cli_edit ed = *ap->edit;
        ed.dirs = NULL;
        ds4_status st = ds4_cli_edit_load(&ed, p->model);
        if (st == DS4_OK) st = ds4_cli_edit_apply(&ed, p->session);
        ds4_cli_edit_free(&ed);
        if (st != DS4_OK) {
            snprintf(err, es, "%s", ds4_last_error());
            close_(&p->e);
            return NULL;
        }
    }
    p->sp = (ds4_sampler_params){ap->temperature, ap->top_k, ap->top_p, ap->min_p, seed};
    p->sampler = ds4_sampler_new(&p->sp, p->n_vocab);
    ds4_rng_seed(&p->spec_rng, seed ^ 0x5eedULL);
    if (!p->sampler) {
        snprintf(err, es, "sampler: %s", ds4_last_error());
        close_(&p->e);
        return NULL;
    }
    p->e.ctx = ap->ctx;
    p->e.eos = ds4_tokenizer_special(p->tok, DS4_TOK_EOS);
    p->e.quant_bits = 2;
    p->e.tokenize = tokenize;
    p->e.token_bytes = token_bytes;
    p->e.reset = reset;
    p->e.prefill = prefill;
    p->e.reseed = reseed;
    p->e.sample = sample;
    p->e.decode = decode;
    if (ap->edit && ap->edit->mtp) {
        p->e.decode_spec = decode_spec;
        p->e.spec_trim = spec_trim;
    }
    p->e.n_past = n_past;
    p->e.snapshot = snapshot;
    p->e.restore = restore;
    return &p->e;
}

/*
 * engine_ds4.c - the srv_engine port over the real engine: the model and
 * session of include/ds4.h, the tokenizer of include/ds4_tokenizer.h (read
 * from the same GGUF) and the sampler of include/ds4_sampler.h.
 *
 * A rendered prompt is tokenized with its template ranges
 * (ds4_tokenize_spans): the template's markers become their special ids,
 * the same marker strings inside request text stay plain text. Text the
 * server writes itself (the forced tool-call opening) recognises every
 * added-token string (DS4_TOKENIZE_SPECIAL). The session keeps the logits of the last
 * token it consumed, and its snapshot carries them, which is what lets a
 * restored disk state generate without re-feeding a token.
 *
 * One ds4_session and one sampler per slot (`--parallel N`), all over the
 * one model; a decode step of several slots is one ds4_session_decode_batch.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <openssl/evp.h>

#include "include/ds4.h"
#include "include/ds4_sampler.h"
#include "include/ds4_tokenizer.h"
#include "server/engine_port.h"
#include "server/server_config.h"

srv_engine *engine_ds4_open(const server_config *cfg, char *err, size_t err_size);

/* The state key of steering (engine_port.h): SHA-256 of the direction
 * matrix and both scales, first 16 bytes in hex; "" when no steering is
 * active (no file, or both scales 0: the logits are then bit-identical to
 * none). The file's content counts, not its name. */
static void steering_key(const ds4_cli_edit *ed, const ds4_model *m, char out[33])
{
    out[0] = 0;
    if (!ed->dirs || (ed->steer_attn == 0 && ed->steer_ffn == 0)) return;
    static const char tag[] = "ds4 steering state v1";
    size_t n = (size_t)ds4_model_n_layer(m) * (size_t)ds4_model_n_embd(m);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int ml = 0;
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (!c) return;
    int ok = EVP_DigestInit_ex(c, EVP_sha256(), NULL) && EVP_DigestUpdate(c, tag, sizeof tag) &&
             EVP_DigestUpdate(c, ed->dirs, n * sizeof(float)) &&
             EVP_DigestUpdate(c, &ed->steer_attn, sizeof ed->steer_attn) &&
             EVP_DigestUpdate(c, &ed->steer_ffn, sizeof ed->steer_ffn) && EVP_DigestFinal_ex(c, md, &ml);
    EVP_MD_CTX_free(c);
    for (unsigned int i = 0; ok && i < 16 && i < ml; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
}

typedef struct {
    srv_engine e;
    ds4_model *model;
    ds4_tokenizer *tok;
    ds4_session **sessions;   /* n_slots */
    ds4_sampler **samplers;   /* n_slots */
    ds4_session **batch;      /* scratch for decode_batch */
    /* Each slot's greedy pick of its last decode step (ds4_session_decode_
     * batch_pick): where the backend picks on its side, a greedy sample
     * takes it and the logits row never leaves the device. pick_ok[slot]
     * is cleared by whatever else changes the slot's logits. */
    int32_t *picks;           /* scratch: the step's picks, in batch order */
    int32_t *pick;            /* n_slots */
    bool *pick_ok;            /* n_slots */
    ds4_rng *spec_rngs;       /* n_slots: --mtp's acceptance draws, reseeded with the sampler */
    int n_vocab;
    float *masked;      /* n_vocab logits with the disallowed ones at -inf */
} ds4_port;

static void set_err(srv_engine *e, const char *what)
{
    snprintf(e->err, sizeof e->err, "%s: %s", what, ds4_last_error());
}

static int tokenize(srv_engine *e, const char *text, size_t len, int32_t **out, size_t *n)
{
    ds4_port *p = (ds4_port *)e;
    ds4_tokens t = {0};
    if (ds4_tokenize(p->tok, text, len, DS4_TOKENIZE_SPECIAL, &t) != DS4_OK) {
        ds4_tokens_free(&t);
        set_err(e, "tokenize");
        return -1;
    }
    if (!t.ids) t.ids = malloc(sizeof(int32_t));
    *out = t.ids;
    *n = t.n;
    return t.ids ? 0 : -1;
}

static int tokenize_prompt(srv_engine *e, const char *text, size_t len, const ds4_spans *tpl, size_t base,
                           int32_t **out, size_t *n)
{
    ds4_port *p = (ds4_port *)e;
    ds4_tokens t = {0};
    if (ds4_tokenize_spans(p->tok, text, len, tpl, base, &t) != DS4_OK) {
        ds4_tokens_free(&t);
        set_err(e, "tokenize");
        return -1;
    }
    if (!t.ids) t.ids = malloc(sizeof(int32_t));
    *out = t.ids;
    *n = t.n;
    return t.ids ? 0 : -1;
}

static bool is_special(srv_engine *e, int32_t tok)
{
    return ds4_tokenizer_is_added(((ds4_port *)e)->tok, tok);
}

static int token_bytes(srv_engine *e, int32_t tok, char *buf, size_t cap)
{
    ds4_port *p = (ds4_port *)e;
    size_t len = 0;
    const char *b = ds4_token_bytes(p->tok, tok, &len);
    if (!b || len > cap) return -1;
    memcpy(buf, b, len);
    return (int)len;
}

static int reset(srv_engine *e, int slot)
{
    ((ds4_port *)e)->pick_ok[slot] = false;
    ds4_session_reset(((ds4_port *)e)->sessions[slot]);
    return 0;
}

static int prefill(srv_engine *e, int slot, const int32_t *toks, size_t n)
{
    if (n == 0) return 0;
    ((ds4_port *)e)->pick_ok[slot] = false;
    if (ds4_session_prefill(((ds4_port *)e)->sessions[slot], toks, (int64_t)n, NULL) != DS4_OK) {
        set_err(e, "prefill");
        return -1;
    }
    return 0;
}

static int sample(srv_engine *e, int slot, const srv_sampling *s, int32_t *tok)
{
    ds4_port *p = (ds4_port *)e;
    ds4_sampler *sampler = p->samplers[slot];
    if (s->reseed) {
        ds4_sampler_params sp = {
            .temperature = (float)s->temperature, .top_k = s->top_k, .top_p = (float)s->top_p,
            .min_p = (float)s->min_p, .seed = s->seed,
        };
        ds4_sampler_set_params(sampler, &sp, true);
        if (p->spec_rngs) ds4_rng_seed(&p->spec_rngs[slot], s->seed ^ 0x5eedULL);
    }
    /* A plain greedy sample (argmax, no mask: ds4_sampler_sample draws no
     * random number then) is the step's pick, the same token by
     * ds4_session_decode_pick's contract; the sampler's temperature is the
     * request's, set at its first sample (reseed). */
    if (!s->allow && p->pick_ok[slot] && (s->greedy || s->temperature <= 0)) {
        *tok = p->pick[slot];
        if (*tok < 0) { snprintf(e->err, sizeof e->err, "sample: no usable logit"); return -1; }
        return 0;
    }
    const float *logits = ds4_session_logits(p->sessions[slot]);
    if (!logits) { snprintf(e->err, sizeof e->err, "sample: the session has no logits yet"); return -1; }
    if (s->allow) {
        /* A handful of tokens per request (a function name): a pass over
         * the vocabulary's bytes costs far less than the step itself. */
        if (!p->masked && !(p->masked = malloc((size_t)p->n_vocab * sizeof *p->masked))) {
            snprintf(e->err, sizeof e->err, "sample: out of memory");
            return -1;
        }
        for (int i = 0; i < p->n_vocab; i++) {
            size_t len = 0;
            const char *b = ds4_token_bytes(p->tok, i, &len);
            p->masked[i] = b && len && s->allow(s->allow_ud, b, len) ? logits[i] : -INFINITY;
        }
        logits = p->masked;
    }
    *tok = ds4_sampler_sample(sampler, logits, p->n_vocab, s->greedy);
    if (*tok < 0) { snprintf(e->err, sizeof e->err, "sample: no usable logit"); return -1; }
    return 0;
}

/* Sessions that speculate step alone through decode_spec or, when the
 * request cannot speculate, through ds4_session_decode, which keeps their
 * MTP block following the main model (the batched forward does not). */
static int decode_batch_mtp(ds4_port *p, const int *slots, const int32_t *toks, int n)
{
    for (int i = 0; i < n; i++)
        p->pick_ok[slots[i]] = false;
    for (int i = 0; i < n; i++)
        if (ds4_session_decode(p->sessions[slots[i]], toks[i]) != DS4_OK) {
            set_err(&p->e, "decode");
            return -1;
        }
    return 0;
}

static int decode_batch(srv_engine *e, const int *slots, const int32_t *toks, int n)
{
    ds4_port *p = (ds4_port *)e;
    if (p->e.decode_spec) return decode_batch_mtp(p, slots, toks, n);
    for (int i = 0; i < n; i++) {
        p->batch[i] = p->sessions[slots[i]];
        p->pick_ok[slots[i]] = false;
    }
    /* the picks cost a launch over the rows where the backend picks (a
     * host argmax a session elsewhere); a sampling slot ignores its pick
     * and reads the logits, which then come to the host */
    if (ds4_session_decode_batch_pick(p->batch, toks, n, -1, p->picks) != DS4_OK) {
        set_err(e, "decode");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        p->pick[slots[i]] = p->picks[i];
        p->pick_ok[slots[i]] = true;
    }
    return 0;
}

/* --mtp: greedy, the engine's own argmax is the server's greedy sampler
 * (ds4_sampler_sample at temperature 0 is ds4_argmax); sampling, the
 * rule's distributions are the sampler's (ds4_sampler_probs with the
 * same parameters). */
static int decode_spec(srv_engine *e, int slot, int32_t tok, const srv_sampling *ss, int max_out, int32_t *fed,
                       int *n_fed, int *n_drafted, int32_t *next)
{
    ds4_port *p = (ds4_port *)e;
    ds4_session *s = p->sessions[slot];
    p->pick_ok[slot] = false;
    int32_t out[17];
    int n = 0;
    ds4_spec_stats a, b;
    ds4_session_spec_stats(s, &a);
    ds4_sampler_params sa = {
        .temperature = ss->greedy ? 0.0f : (float)ss->temperature, .top_k = ss->top_k, .top_p = (float)ss->top_p,
        .min_p = (float)ss->min_p, .seed = ss->seed,
    };
    if (ds4_session_decode_spec(s, tok, &sa, &p->spec_rngs[slot], e->eos, max_out, out, &n) != DS4_OK) {
        set_err(e, "decode (mtp)");
        return -1;
    }
    ds4_session_spec_stats(s, &b);
    /* out[n-1] is the token after the fed ones: not fed, the next sample
     * picks it again from the session's logits */
    for (int i = 0; i + 1 < n; i++) fed[i] = out[i];
    *n_fed = n - 1;
    *next = out[n - 1];
    *n_drafted = (int)(b.drafted - a.drafted);
    return 0;
}

static int spec_trim(srv_engine *e, int slot, int keep)
{
    ((ds4_port *)e)->pick_ok[slot] = false;
    if (ds4_session_spec_trim(((ds4_port *)e)->sessions[slot], keep) != DS4_OK) {
        set_err(e, "decode (mtp trim)");
        return -1;
    }
    return 0;
}

static int snapshot(srv_engine *e, int slot, void **bytes, size_t *len)
{
    if (ds4_session_snapshot(((ds4_port *)e)->sessions[slot], bytes, len) != DS4_OK) {
        set_err(e, "snapshot");
        return -1;
    }
    return 0;
}

static size_t snapshot_size(srv_engine *e, int slot)
{
    return ds4_session_snapshot_size(((ds4_port *)e)->sessions[slot]);
}

static size_t snapshot_max(srv_engine *e)
{
    return ds4_session_snapshot_size_max(((ds4_port *)e)->sessions[0]);
}

static int restore(srv_engine *e, int slot, const void *bytes, size_t len)
{
    ((ds4_port *)e)->pick_ok[slot] = false;
    if (ds4_session_restore(((ds4_port *)e)->sessions[slot], bytes, len) != DS4_OK) {
        set_err(e, "restore");
        return -1;
    }
    return 0;
}

static void close_(srv_engine *e)
{
    ds4_port *p = (ds4_port *)e;
    for (int i = 0; i < p->e.n_slots; i++) {
        if (p->samplers) ds4_sampler_free(p->samplers[i]);
        if (p->sessions) ds4_session_free(p->sessions[i]);
    }
    free(p->samplers);
    free(p->sessions);
    free(p->batch);
    free(p->picks);
    free(p->pick);
    free(p->pick_ok);
    free(p->spec_rngs);
    ds4_tokenizer_free(p->tok);
    ds4_model_close(p->model);
    free(p->masked);
    free(p);
}

srv_engine *engine_ds4_open(const server_config *cfg, char *err, size_t es)
{
    ds4_port *p = calloc(1, sizeof *p);
    if (!p) { snprintf(err, es, "out of memory"); return NULL; }
    p->model = ds4_model_open(cfg->model_path, &cfg->model_opt);
    if (!p->model) { snprintf(err, es, "-m %s: %s", cfg->model_path, ds4_last_error()); free(p); return NULL; }
    p->tok = ds4_tokenizer_load(cfg->model_path);
    if (!p->tok) {
        snprintf(err, es, "-m %s: tokenizer: %s", cfg->model_path, ds4_last_error());
        ds4_model_close(p->model);
        free(p);
        return NULL;
    }
    ds4_session_params sp;
    ds4_session_params_default(&sp);
    sp.n_ctx = cfg->ctx;
    sp.n_threads = cfg->threads;
    if (cfg->backend && !strcmp(cfg->backend, "cpu")) sp.backend = DS4_BACKEND_CPU;
    else if (cfg->backend && !strcmp(cfg->backend, "cuda")) sp.backend = DS4_BACKEND_CUDA;
    else if (cfg->backend && strcmp(cfg->backend, "auto")) {
        snprintf(err, es, "--backend %s: not one of auto, cpu, cuda", cfg->backend);
        close_(&p->e);
        return NULL;
    }
    /* the worker's prefill steps: the sessions' activation buffers hold no
     * more (on CUDA the logits rows alone are ~0.5 MB a token of Flash) */
    ds4_backend_kind kind = ds4_session_params_backend(&sp);
    int chunk = cfg->prefill_chunk > 0          ? cfg->prefill_chunk
                : kind != DS4_BACKEND_CUDA     ? SRV_PREFILL_CHUNK_CPU
                : cfg->parallel > 1            ? SRV_PREFILL_CHUNK_GPU
                                               : SRV_PREFILL_CHUNK_GPU_ALONE;
    if (chunk > cfg->ctx) chunk = cfg->ctx;
    sp.max_chunk = chunk;
    p->n_vocab = ds4_model_n_vocab(p->model);
    int n = cfg->parallel > 0 ? cfg->parallel : 1;
    p->sessions = calloc((size_t)n, sizeof *p->sessions);
    p->samplers = calloc((size_t)n, sizeof *p->samplers);
    p->batch = calloc((size_t)n, sizeof *p->batch);
    p->picks = calloc((size_t)n, sizeof *p->picks);
    p->pick = calloc((size_t)n, sizeof *p->pick);
    p->pick_ok = calloc((size_t)n, sizeof *p->pick_ok);
    if (!p->sessions || !p->samplers || !p->batch || !p->picks || !p->pick || !p->pick_ok) {
        snprintf(err, es, "out of memory");
        close_(&p->e);
        return NULL;
    }
    p->e.n_slots = n;
    ds4_sampler_params def;
    ds4_sampler_params_default(&def);
    ds4_cli_edit edit = cfg->edit;
    edit.dirs = NULL;
    for (int i = 0; i < n; i++) {
        p->sessions[i] = ds4_session_create(p->model, &sp);
        /* steering / --power: the same for every slot (sessions copy the directions) */
        if (p->sessions[i] && (ds4_cli_edit_load(&edit, p->model) != DS4_OK ||
                               ds4_cli_edit_apply(&edit, p->sessions[i]) != DS4_OK)) {
            snprintf(err, es, "%s", ds4_last_error());
            ds4_cli_edit_free(&edit);
            close_(&p->e);
            return NULL;
        }
        p->samplers[i] = p->sessions[i] ? ds4_sampler_new(&def, p->n_vocab) : NULL;
        if (!p->sessions[i] || !p->samplers[i]) {
            snprintf(err, es, "-m %s: session %d of %d: %s", cfg->model_path, i + 1, n, ds4_last_error());
            close_(&p->e);
            return NULL;
        }
    }
    /* --warmup: the slots' one-time costs (on CUDA their first GEMMs and
     * kernel launches) now rather than in their first requests; after all
     * slots exist, so what a first prefill makes on the side (CUDA's bf16
     * weight copies, backend/cuda/cuda_gemm_bf16copy.cu) takes only what
     * the slots left */
    for (int i = 0; i < n && cfg->warmup; i++)
        if (ds4_session_warmup(p->sessions[i], 0) != DS4_OK) {
            snprintf(err, es, "--warmup: session %d of %d: %s", i + 1, n, ds4_last_error());
            ds4_cli_edit_free(&edit);
            close_(&p->e);
            return NULL;
        }
    steering_key(&edit, p->model, p->e.state_key);
    ds4_cli_edit_free(&edit);
    snprintf(p->e.model_id, sizeof p->e.model_id, "deepseek-v4-flash");
    p->e.ctx = cfg->ctx;
    p->e.prefill_chunk = chunk;
    p->e.eos = ds4_tokenizer_special(p->tok, DS4_TOK_EOS);
    p->e.quant_bits = 2;
    p->e.tokenize = tokenize;
    p->e.tokenize_prompt = tokenize_prompt;
    p->e.is_special = is_special;
    p->e.token_bytes = token_bytes;
    p->e.reset = reset;
    p->e.prefill = prefill;
    p->e.sample = sample;
    p->e.decode_batch = decode_batch;
    if (cfg->edit.mtp && !(p->spec_rngs = calloc((size_t)n, sizeof *p->spec_rngs))) {
        snprintf(err, es, "out of memory");
        close_(&p->e);
        return NULL;
    }
    if (cfg->edit.mtp) {
        p->e.decode_spec = decode_spec;
        p->e.spec_trim = spec_trim;
    }
    p->e.snapshot = snapshot;
    p->e.snapshot_size = snapshot_size;
    p->e.restore = restore;
    p->e.snapshot_max = snapshot_max;
    p->e.close = close_;
    /* startup report: the weights are the mapped file; each slot's
     * session takes its KV state for the whole --ctx and one chunk's work
     * buffers at creation (nothing grows later) */
    struct stat st;
    double wmb = stat(cfg->model_path, &st) == 0 ? (double)st.st_size / 1048576.0 : 0;
    uint64_t kv = 0, work = 0;
    ds4_session_memory(p->sessions[0], &kv, &work);
    snprintf(p->e.info, sizeof p->e.info,
             "backend %s, %d layers, weights %.1f MiB (mapped file), KV state %.1f MiB (%llu bytes) per slot at ctx %d, "
             "work buffers %.1f MiB per slot (prefill chunk %d), planned %.1f MiB in all, weights read per token %.1f MiB",
             kind == DS4_BACKEND_CUDA ? "cuda" : "cpu",
             ds4_model_n_layer(p->model), wmb, (double)kv / 1048576.0, (unsigned long long)kv, cfg->ctx,
             (double)work / 1048576.0, chunk, wmb + (double)n * (double)(kv + work) / 1048576.0,
             (double)ds4_model_weight_bytes_per_token(p->model, cfg->ctx) / 1048576.0);
    return &p->e;
}

/*
 * cli_chat.c - the live conversation behind one-shot and interactive
 * `ds4` (see cli_chat.h).
 */
#include "cli/cli_chat.h"

#include "cli/cli_printer.h"
#include "cli/cli_progress.h"
#include "cli/cli_sigint.h"
#include "include/ds4_chat.h"
#include "include/ds4_dsml.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_SYSTEM "You are a helpful assistant"
#define PREFILL_STEP 256       /* tokens per prefill call: progress granularity */
#define PROGRESS_MIN_TOKENS 512 /* shorter prefills draw no bar */

static ds4_session *new_session(ds4_cli_chat *c)
{
    ds4_session_params sp;
    ds4_session_params_default(&sp);
    sp.n_ctx = c->opt.ctx;
    if (c->opt.threads > 0) sp.n_threads = c->opt.threads;
    sp.backend = (ds4_backend_kind)c->opt.backend;
    sp.gpu_device = c->opt.gpu_device;
    ds4_session *s = ds4_session_create(c->model, &sp);
    if (!s) fprintf(stderr, "ds4: cannot create a session (ctx %d): %s\n", c->opt.ctx, ds4_last_error());
    if (s && (ds4_cli_edit_load(&c->opt.edit, c->model) != DS4_OK || ds4_cli_edit_apply(&c->opt.edit, s) != DS4_OK)) {
        fprintf(stderr, "ds4: %s\n", ds4_last_error());
        ds4_session_free(s);
        s = NULL;
    }
    return s;
}

bool ds4_cli_chat_open(ds4_cli_chat *c, const ds4_cli_options *opt)
{
    memset(c, 0, sizeof *c);
    c->opt = *opt;
    c->messages = json_array();
    c->progress = isatty(STDERR_FILENO);
    c->color = isatty(STDOUT_FILENO);
    c->tok = ds4_tokenizer_load(opt->model);
    if (!c->tok) {
        fprintf(stderr, "ds4: %s\n", ds4_last_error());
        return false;
    }
    c->model = ds4_model_open(opt->model, &opt->model_opt);
    ds4_rng_seed(&c->spec_rng, opt->seed ^ 0x5eedULL);
    if (!c->model) {
        fprintf(stderr, "ds4: %s\n", ds4_last_error());
        return false;
    }
    c->n_vocab = ds4_model_n_vocab(c->model);
    if (c->n_vocab != ds4_tokenizer_n_vocab(c->tok)) {
        fprintf(stderr, "ds4: %s: the model has %d logits but the tokenizer %d tokens\n", opt->model, c->n_vocab,
                ds4_tokenizer_n_vocab(c->tok));
        return false;
    }
    ds4_sampler_params sp = {opt->temp, opt->top_k, opt->top_p, opt->min_p, opt->seed};
    if (!opt->seed_set) sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    c->sampler = ds4_sampler_new(&sp, c->n_vocab);
    if (!c->sampler) {
        fprintf(stderr, "ds4: %s\n", ds4_last_error());
        return false;
    }
    c->session = new_session(c);
    return c->session != NULL;
}

void ds4_cli_chat_close(ds4_cli_chat *c)
{
    ds4_session_free(c->session);
    ds4_cli_edit_free(&c->opt.edit);
    ds4_model_close(c->model);
    ds4_sampler_free(c->sampler);
    ds4_tokenizer_free(c->tok);
    ds4_tokens_free(&c->live);
    json_decref(c->messages);
    memset(c, 0, sizeof *c);
}

void ds4_cli_chat_modes(const ds4_cli_chat *c, bool *thinking, bool *think_max)
{
    *thinking = c->opt.think != DS4_CLI_NOTHINK;
    *think_max = c->opt.think == DS4_CLI_THINK_MAX && c->opt.ctx >= DS4_CLI_THINK_MAX_MIN_CTX;
}

bool ds4_cli_chat_prefill(ds4_cli_chat *c, const int32_t *ids, size_t n, double *seconds)
{
    if ((int64_t)(c->live.n + n) > c->opt.ctx) {
        fprintf(stderr, "ds4: the context is full (%zu + %zu tokens > ctx %d); use /ctx N for a larger one\n",
                c->live.n, n, c->opt.ctx);
        return false;
    }
    bool bar = c->progress && n >= PROGRESS_MIN_TOKENS;
    double t0 = ds4_cli_now_s();
    for (size_t i = 0; i < n;) {
        if (ds4_cli_interrupted) {
            if (bar) fputs("\r\x1b[K", stderr);
            fprintf(stderr, "ds4: prefill interrupted after %zu of %zu tokens\n", i, n);
            return false;
        }
        size_t k = n - i < PREFILL_STEP ? n - i : PREFILL_STEP;
        if (ds4_session_prefill(c->session, ids + i, (int64_t)k, NULL) != DS4_OK) {
            fprintf(stderr, "ds4: prefill: %s\n", ds4_last_error());
            return false;
        }
        ds4_tokens_append(&c->live, ids + i, k);
        i += k;
        if (bar) ds4_cli_draw_progress(i, n);
    }
    if (seconds) *seconds = ds4_cli_now_s() - t0;
    return true;
}

/* Sample and stream until EOS, the token limit, the context end or Ctrl-C. */
static bool generate(ds4_cli_chat *c, bool thinking, bool stats, double prefill_s, size_t prefill_n)
{
    ds4_cli_printer pr;
    ds4_cli_printer_init(&pr, stdout, c->color, true);
    ds4_gen_parser *gp = ds4_gen_parser_new(thinking, false, ds4_cli_printer_event, &pr);
    if (!gp) return false;
    int32_t eos = ds4_tokenizer_special(c->tok, DS4_TOK_EOS);
    const char *stop = "length";
    int n_gen = 0;
    bool ok = true;
    double t0 = ds4_cli_now_s();
    /* --mtp: the token after the confirmed drafts comes from the engine
     * (sampled by the speculative rule), not from a fresh draw */
    int32_t pending = -1, spec_out[17];
    /* the last decode step's greedy pick (ds4_session_decode_pick): where a
     * greedy sample takes it, on CUDA the logits row never leaves the device */
    int32_t pick = -1;
    bool pick_ok = false;
    ds4_spec_stats sp0;
    ds4_session_spec_stats(c->session, &sp0);
    while (n_gen < c->opt.n_predict) {
        if (ds4_cli_interrupted) {
            stop = "interrupted";
            break;
        }
        if ((int64_t)c->live.n >= c->opt.ctx) {
            stop = "context full";
            break;
        }
        bool greedy = ds4_gen_parser_structural(gp);
        /* a greedy sample (the parser's structure, or temperature 0) is the
         * argmax, the pick: ds4_sampler_sample draws no random number then */
        bool take_pick = pending < 0 && pick_ok && (greedy || c->opt.temp <= 0);
        const float *logits = pending >= 0 || take_pick ? NULL : ds4_session_logits(c->session);
        int32_t t = pending >= 0 ? pending
                    : take_pick ? pick
                    : logits    ? ds4_sampler_sample(c->sampler, logits, c->n_vocab, greedy)
                                : -1;
        pending = -1;
        pick_ok = false;
        if (t < 0) {
            fprintf(stderr, "ds4: no usable logits\n");
            ok = false;
            break;
        }
        if (t == eos) {
            stop = "eos";
            break;
        }
        size_t len;
        const char *bytes = ds4_token_bytes(c->tok, t, &len);
        ds4_gen_parser_feed(gp, bytes, len);
        if (c->opt.edit.mtp) {
            /* greedy where the parser wants structure or at temperature 0;
             * the drafts were judged under the mode after t, so where the
             * parser's mode changes inside them the step is trimmed there
             * and the next token drawn afresh (agent_loop.c does the same) */
            bool mode = ds4_gen_parser_structural(gp);
            ds4_sampler_params sa = {c->opt.temp, c->opt.top_k, c->opt.top_p, c->opt.min_p, 0};
            if (mode) sa.temperature = 0;
            int k = 0;
            if (ds4_session_decode_spec(c->session, t, &sa, &c->spec_rng, eos, c->opt.n_predict - n_gen, spec_out,
                                        &k) != DS4_OK) {
                fprintf(stderr, "\nds4: decode: %s\n", ds4_last_error());
                ok = false;
                break;
            }
            ds4_tokens_push(&c->live, t);
            n_gen++;
            int kept = 1;
            for (int i = 0; i + 1 < k && ds4_gen_parser_structural(gp) == mode; i++) { /* confirmed drafts: fed */
                bytes = ds4_token_bytes(c->tok, spec_out[i], &len);
                ds4_gen_parser_feed(gp, bytes, len);
                ds4_tokens_push(&c->live, spec_out[i]);
                n_gen++;
                kept++;
            }
            if (kept < k && ds4_session_spec_trim(c->session, kept) != DS4_OK) {
                fprintf(stderr, "\nds4: decode: %s\n", ds4_last_error());
                ok = false;
                break;
            }
            pending = kept == k && ds4_gen_parser_structural(gp) == mode ? spec_out[k - 1] : -1;
            continue;
        }
        if (ds4_session_decode_pick(c->session, t, -1, &pick) != DS4_OK) {
            fprintf(stderr, "\nds4: decode: %s\n", ds4_last_error());
            ok = false;
            break;
        }
        pick_ok = true;
        ds4_tokens_push(&c->live, t);
        n_gen++;
    }
    double gen_s = ds4_cli_now_s() - t0;
    ds4_gen_parser_finish(gp);
    ds4_cli_printer_finish(&pr);
    json_t *msg = ds4_gen_parser_message(gp, NULL);
    if (msg) json_array_append_new(c->messages, msg);
    ds4_gen_parser_free(gp);
    c->pending_eos = true; /* the EOS (sampled or not) is fed with the next turn */
    if (ds4_cli_interrupted) {
        ds4_cli_interrupted = 0;
        fprintf(stderr, "[interrupted]\n");
    }
    if (stats)
        fprintf(stderr, "ds4: prefill %zu tokens in %.2f s (%.1f tok/s), generation %d tokens in %.2f s (%.1f tok/s), stop: %s\n",
                prefill_n, prefill_s, prefill_s > 0 ? prefill_n / prefill_s : 0.0, n_gen, gen_s,
                gen_s > 0 ? n_gen / gen_s : 0.0, stop);
    if (stats && c->opt.edit.mtp) {
        ds4_spec_stats sp1;
        ds4_session_spec_stats(c->session, &sp1);
        uint64_t d = sp1.drafted - sp0.drafted, a = sp1.accepted - sp0.accepted;
        fprintf(stderr, "ds4: mtp: %llu of %llu drafts accepted (%.1f%%), %.2f tokens per step\n",
                (unsigned long long)a, (unsigned long long)d, d ? 100.0 * a / d : 0.0,
                sp1.steps > sp0.steps ? (double)n_gen / (double)(sp1.steps - sp0.steps) : 0.0);
    }
    if (stats && c->opt.model_opt.ssd_streaming) {
        ds4_expert_stream_stats es;
        ds4_model_expert_stream_stats(c->model, &es);
        uint64_t uses = es.hits + es.misses;
        fprintf(stderr, "ds4: expert cache %llu experts (%.2f GiB): hit rate %.1f%%, %.2f GiB read from the file\n",
                (unsigned long long)es.cache_experts, (double)es.cache_bytes / (1 << 30),
                uses ? 100.0 * (double)es.hits / (double)uses : 0.0, (double)es.bytes_read / (1 << 30));
    }
    return ok;
}

/* tpl: the template ranges of a rendered prompt (only they yield special
 * tokens); NULL for --raw-prompt, where every added-token string is one on
 * purpose (the user wrote the template). */
static bool tokenize_text(ds4_cli_chat *c, const char *text, size_t len, const ds4_spans *tpl, ds4_tokens *out)
{
    ds4_status st = tpl ? ds4_tokenize_spans(c->tok, text, len, tpl, 0, out)
                        : ds4_tokenize(c->tok, text, len, DS4_TOKENIZE_SPECIAL, out);
    if (st != DS4_OK) {
        fprintf(stderr, "ds4: %s\n", ds4_last_error());
        return false;
    }
    return true;
}

static bool render(const json_t *msgs, bool thinking, bool think_max, bool bos, ds4_spans *tpl, char **out,
                   size_t *len)
{
    ds4_chat_options o;
    ds4_chat_options_default(&o);
    o.thinking = thinking;
    o.think_max = think_max;
    o.add_bos = bos;
    if (ds4_chat_render_spans(msgs, NULL, &o, tpl, out, len) != DS4_OK) {
        fprintf(stderr, "ds4: %s\n", ds4_last_error());
        return false;
    }
    return true;
}

/* A JSON string of text with bytes that are not UTF-8 replaced by U+FFFD
 * (a file cut mid-character must not make the turn fail). */
static json_t *json_text(const char *text, size_t len)
{
    char *buf = malloc(DS4_UTF8_STREAM_MAX_OUT(len));
    if (!buf) return NULL;
    ds4_utf8_stream us = {0};
    size_t n = ds4_utf8_stream_feed(&us, text, len, buf);
    n += ds4_utf8_stream_flush(&us, buf + n);
    json_t *j = json_stringn(buf, n);
    free(buf);
    return j;
}

bool ds4_cli_chat_turn(ds4_cli_chat *c, const char *text, size_t len, bool stats)
{
    bool thinking, think_max;
    ds4_cli_chat_modes(c, &thinking, &think_max);
    json_t *user = json_pack("{s:s,s:o}", "role", "user", "content", json_text(text, len));
    if (!user) {
        fprintf(stderr, "ds4: out of memory\n");
        return false;
    }
    bool first = c->live.n == 0;
    size_t n_before = json_array_size(c->messages);
    json_t *turn = json_array();
    if (first) {
        const char *sys = c->opt.system ? c->opt.system : DEFAULT_SYSTEM;
        if (*sys) {
            json_t *s = json_pack("{s:s,s:s}", "role", "system", "content", sys);
            json_array_append(c->messages, s);
            json_array_append_new(turn, s);
        }
    }
    json_array_append(c->messages, user);
    json_array_append_new(turn, user);
    char *prompt;
    size_t plen;
    ds4_spans tpl = {0};
    bool ok = render(turn, thinking, first && think_max, first, &tpl, &prompt, &plen);
    json_decref(turn);
    if (!ok) {
        while (json_array_size(c->messages) > n_before) json_array_remove(c->messages, n_before);
        ds4_spans_free(&tpl);
        return false;
    }
    ds4_tokens ids = {0};
    if (c->pending_eos) ds4_tokens_push(&ids, ds4_tokenizer_special(c->tok, DS4_TOK_EOS));
    ok = tokenize_text(c, prompt, plen, &tpl, &ids);
    free(prompt);
    ds4_spans_free(&tpl);
    double ps = 0;
    if (ok) ok = ds4_cli_chat_prefill(c, ids.ids, ids.n, &ps);
    if (ok) {
        c->pending_eos = false;
        ok = generate(c, thinking, stats, ps, ids.n);
    } else {
        ds4_cli_interrupted = 0;
        /* the turn did not happen: forget its messages */
        while (json_array_size(c->messages) > n_before) json_array_remove(c->messages, n_before);
    }
    ds4_tokens_free(&ids);
    return ok;
}

bool ds4_cli_chat_rebuild(ds4_cli_chat *c)
{
    ds4_session_free(c->session);
    c->session = new_session(c);
    c->live.n = 0;
    c->pending_eos = false;
    if (!c->session) return false;
    size_t n = json_array_size(c->messages);
    if (n == 0) return true;
    bool thinking, think_max;
    ds4_cli_chat_modes(c, &thinking, &think_max);
    char *prompt;
    size_t plen;
    ds4_spans tpl = {0};
    if (!render(c->messages, thinking, think_max, true, &tpl, &prompt, &plen)) {
        ds4_spans_free(&tpl);
        return false;
    }
    ds4_tokens ids = {0};
    bool ok = tokenize_text(c, prompt, plen, &tpl, &ids);
    free(prompt);
    ds4_spans_free(&tpl);
    double ps = 0;
    if (ok) ok = ds4_cli_chat_prefill(c, ids.ids, ids.n, &ps);
    const char *last_role = json_string_value(json_object_get(json_array_get(c->messages, n - 1), "role"));
    if (ok && last_role && !strcmp(last_role, "user")) ok = generate(c, thinking, true, ps, ids.n);
    ds4_tokens_free(&ids);
    return ok;
}

char *ds4_cli_chat_first_prompt(ds4_cli_chat *c, const char *text, size_t len, size_t *plen, ds4_spans *tpl)
{
    bool thinking, think_max;
    ds4_cli_chat_modes(c, &thinking, &think_max);
    const char *sys = c->opt.system ? c->opt.system : DEFAULT_SYSTEM;
    json_t *msgs = json_array();
    if (*sys) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", sys));
    json_t *user = json_pack("{s:s,s:o}", "role", "user", "content", json_text(text, len));
    char *out = NULL;
    if (!user) fprintf(stderr, "ds4: out of memory\n");
    else if (json_array_append_new(msgs, user) == 0 && !render(msgs, thinking, think_max, true, tpl, &out, plen)) out = NULL;
    json_decref(msgs);
    return out;
}

bool ds4_cli_chat_raw_turn(ds4_cli_chat *c, const char *text, size_t len, bool stats)
{
    ds4_tokens ids = {0};
    bool ok = tokenize_text(c, text, len, NULL, &ids);
    double ps = 0;
    if (ok) ok = ds4_cli_chat_prefill(c, ids.ids, ids.n, &ps);
    /* A rendered prompt says itself whether the model starts inside its
     * reasoning: generation prompts end in "<think>" (thinking) or
     * "</think>" (chat mode). */
    static const char think_tag[] = "<think>";
    size_t tl = sizeof think_tag - 1;
    bool in_think = len >= tl && memcmp(text + len - tl, think_tag, tl) == 0;
    if (ok) ok = generate(c, in_think, stats, ps, ids.n);
    ds4_tokens_free(&ids);
    return ok;
}

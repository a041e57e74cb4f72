/*
 * agent_loop.c - the agent's turn loop on the live session (see agent.h).
 */
#include "agent/agent.h"

#include <stdlib.h>
#include <string.h>

#include "cli/cli_printer.h"
#include "cli/cli_progress.h"
#include "include/ds4_chat.h"
#include "include/ds4_dsml.h"

#define PREFILL_STEP 256        /* tokens per prefill call: progress and Ctrl-C granularity */
#define PROGRESS_MIN_TOKENS 512 /* shorter prefills draw no bar */
#define SHOW_RESULT_LINES 8     /* lines of a tool result echoed to the user */

void agent_init(agent *a, agent_engine *eng, const agent_tools *tools, json_t *schemas, const agent_settings *s,
                const char *system_prompt)
{
    memset(a, 0, sizeof *a);
    a->eng = eng;
    a->tools = *tools;
    a->schemas = schemas;
    a->s = *s;
    a->stop = tools->stop;
    a->messages = json_array();
    json_array_append_new(a->messages, json_pack("{s:s,s:s}", "role", "system", "content", system_prompt));
}

void agent_free(agent *a)
{
    json_decref(a->messages);
    agent_buf_free(&a->live_text);
    ds4_tokens_free(&a->live);
    memset(a, 0, sizeof *a);
}

void agent_clear(agent *a)
{
    while (json_array_size(a->messages) > 1) json_array_remove(a->messages, json_array_size(a->messages) - 1);
    a->eng->reset(a->eng);
    a->live.n = 0;
    a->live_text.n = 0;
    if (a->live_text.p) a->live_text.p[0] = '\0';
    a->n_in_session = 0;
    a->pending_eos = false;
    a->next_call_id = 0;
}

static void trace(agent *a, const char *what, const char *text, size_t len)
{
    if (!a->s.trace) return;
    fprintf(a->s.trace, "=== %s (%zu bytes)\n", what, len);
    fwrite(text, 1, len, a->s.trace);
    fputs("\n", a->s.trace);
    fflush(a->s.trace);
}

/* Prefill tokens, keeping live/live_text in step with the session. */
static bool prefill(agent *a, const int32_t *ids, size_t n)
{
    if ((int64_t)(a->live.n + n) > a->eng->ctx) {
        fprintf(stderr, "ds4-agent: the context is full (%zu + %zu tokens > ctx %lld)\n", a->live.n, n,
                (long long)a->eng->ctx);
        return false;
    }
    bool bar = a->s.progress && n >= PROGRESS_MIN_TOKENS;
    double t0 = ds4_cli_now_s();
    for (size_t i = 0; i < n;) {
        if (*a->stop) {
            if (bar) fputs("\r\x1b[K", stderr);
            fprintf(stderr, "ds4-agent: prefill interrupted after %zu of %zu tokens\n", i, n);
            return false;
        }
        size_t k = n - i < PREFILL_STEP ? n - i : PREFILL_STEP;
        if (a->eng->prefill(a->eng, ids + i, k) != 0) {
            fprintf(stderr, "ds4-agent: %s\n", a->eng->err);
            return false;
        }
        ds4_tokens_append(&a->live, ids + i, k);
        for (size_t j = i; j < i + k; j++) {
            size_t l;
            const char *b = a->eng->token_bytes(a->eng, ids[j], &l);
            agent_buf_add(&a->live_text, b, l);
        }
        i += k;
        if (bar) ds4_cli_draw_progress(i, n);
    }
    double dt = ds4_cli_now_s() - t0;
    if (a->s.stats && n >= PROGRESS_MIN_TOKENS)
        fprintf(stderr, "ds4-agent: prefill %zu tokens in %.2f s (%.1f tok/s)\n", n, dt, dt > 0 ? n / dt : 0.0);
    return true;
}

bool agent_feed_text(agent *a, const char *text, size_t len, const ds4_spans *tpl)
{
    ds4_tokens ids = {0};
    if (a->pending_eos) ds4_tokens_push(&ids, a->eng->eos);
    /* the one place rendered text becomes tokens (see agent_engine.h):
     * specials only inside the template's ranges */
    if (a->eng->tokenize(a->eng, text, len, tpl, &ids) != 0) {
        fprintf(stderr, "ds4-agent: %s\n", a->eng->err);
        ds4_tokens_free(&ids);
        return false;
    }
    trace(a, "prefill", text, len);
    bool ok = prefill(a, ids.ids, ids.n);
    if (ok) a->pending_eos = false;
    ds4_tokens_free(&ids);
    return ok;
}

bool agent_feed_tokens(agent *a, const int32_t *ids, size_t n)
{
    return prefill(a, ids, n);
}

static bool render(agent *a, const json_t *msgs, bool first, ds4_spans *tpl, char **out, size_t *len)
{
    ds4_chat_options o;
    ds4_chat_options_default(&o);
    o.thinking = a->s.thinking;
    o.think_max = first && a->s.think_max;
    o.add_bos = first;
    o.drop_thinking = false; /* tools are declared: history keeps its reasoning */
    if (ds4_chat_render_spans(msgs, first ? a->schemas : NULL, &o, tpl, out, len) != DS4_OK) {
        fprintf(stderr, "ds4-agent: %s\n", ds4_last_error());
        return false;
    }
    return true;
}

char *agent_render_all(agent *a, size_t *len)
{
    char *out = NULL;
    ds4_spans tpl = {0};
    bool ok = render(a, a->messages, true, &tpl, &out, len);
    ds4_spans_free(&tpl);
    return ok ? out : NULL;
}

bool agent_sync(agent *a)
{
    size_t n = json_array_size(a->messages);
    if (a->n_in_session >= n) return true;
    json_t *tail = json_array();
    for (size_t i = a->n_in_session; i < n; i++) json_array_append(tail, json_array_get(a->messages, i));
    char *text;
    size_t len;
    ds4_spans tpl = {0};
    bool ok = render(a, tail, a->n_in_session == 0, &tpl, &text, &len);
    json_decref(tail);
    if (!ok) {
        ds4_spans_free(&tpl);
        return false;
    }
    if (a->n_in_session == 0 && a->live.n) { /* a rebuilt session starts empty */
        a->eng->reset(a->eng);
        a->live.n = 0;
        a->live_text.n = 0;
        a->pending_eos = false;
    }
    size_t before = a->live.n;
    ok = agent_feed_text(a, text, len, &tpl);
    ds4_spans_free(&tpl);
    free(text);
    if (ok) a->n_in_session = n;
    else if (a->live.n != before) a->n_in_session = 0; /* half a turn went in: rebuild next time */
    return ok;
}

/* Compaction before a step when the session is nearly full: the tail still
 * to prefill is estimated at one token per byte (an upper bound for BPE). */
static bool maybe_compact(agent *a)
{
    size_t n = json_array_size(a->messages), pending = 0;
    for (size_t i = a->n_in_session; i < n; i++) {
        char *s = json_dumps(json_array_get(a->messages, i), 0);
        pending += s ? strlen(s) : 0;
        free(s);
    }
    double limit = a->s.compact_at * (double)a->eng->ctx;
    if ((double)(a->live.n + pending + (size_t)(a->s.n_predict < 512 ? a->s.n_predict : 512)) <= limit) return true;
    if (a->n_in_session == 0) return true; /* nothing consumed yet: nothing to summarise */
    agent_compact(a);
    return true; /* a failed compaction is reported; the step may still fit */
}

static uint64_t mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* --mtp: token t (fed to the parser already) and the drafts the model
 * confirms go in as one step. The step's drafts were judged under one
 * sampling mode: greedy where the parser wants DSML structure (chat-format
 * §6.4), the sampler's otherwise. Each draft is taken as a one-token step
 * would take its token, while the parser's mode stays the step's; where
 * it changes, or the tool calls end, the step is trimmed to the tokens
 * taken and the next token is sampled afresh (a fresh draw at a position
 * the rule did not settle leaves the output distribution unchanged).
 * Returns 1 when the tool calls are done, 0 to go on, -1 on an error. */
static int spec_step(agent *a, ds4_gen_parser *gp, int32_t t, int *n_gen, int32_t *pending)
{
    bool mode = ds4_gen_parser_structural(gp);
    int32_t out[17];
    int k = 0;
    if (a->eng->decode_spec(a->eng, t, mode, a->s.n_predict - *n_gen, out, &k) != 0) return -1;
    size_t len;
    const char *bytes = a->eng->token_bytes(a->eng, t, &len);
    ds4_tokens_push(&a->live, t);
    agent_buf_add(&a->live_text, bytes, len);
    (*n_gen)++;
    bool done = ds4_gen_parser_state(gp) == DS4_GEN_TOOLS_DONE;
    int kept = 1;
    for (int i = 0; i + 1 < k && !done && ds4_gen_parser_structural(gp) == mode; i++) {
        bytes = a->eng->token_bytes(a->eng, out[i], &len);
        ds4_gen_parser_feed(gp, bytes, len);
        ds4_tokens_push(&a->live, out[i]);
        agent_buf_add(&a->live_text, bytes, len);
        (*n_gen)++;
        kept++;
        done = ds4_gen_parser_state(gp) == DS4_GEN_TOOLS_DONE;
    }
    if (kept < k) {
        if (a->eng->spec_trim(a->eng, kept) != 0) return -1;
    } else if (!done && ds4_gen_parser_structural(gp) == mode) {
        *pending = out[k - 1];
    }
    return done ? 1 : 0;
}

json_t *agent_generate(agent *a, bool use_tools, bool quiet, const char **stop_reason)
{
    ds4_cli_printer pr;
    ds4_cli_printer_init(&pr, a->s.out, a->s.color, true);
    ds4_gen_parser *gp = ds4_gen_parser_new(a->s.thinking, use_tools, quiet ? NULL : ds4_cli_printer_event, &pr);
    if (!gp) return NULL;
    /* The seed depends on the session, not on the process: a session
     * resumed from disk samples exactly what the uninterrupted one would. */
    a->eng->reseed(a->eng, mix64(a->s.seed ^ mix64((uint64_t)a->live.n)));
    const char *stop = "length";
    int n_gen = 0;
    bool ok = true;
    size_t text_start = a->live_text.n;
    double t0 = ds4_cli_now_s();
    /* --mtp: the token after a speculative step's fed ones (see below) */
    int32_t pending = -1;
    while (n_gen < a->s.n_predict) {
        if (*a->stop) {
            stop = "interrupted";
            break;
        }
        if ((int64_t)a->live.n >= a->eng->ctx) {
            stop = "context full";
            break;
        }
        int32_t t = pending;
        pending = -1;
        if (t < 0 && a->eng->sample(a->eng, ds4_gen_parser_structural(gp), &t) != 0) {
            fprintf(stderr, "ds4-agent: %s\n", a->eng->err);
            ok = false;
            break;
        }
        if (t == a->eng->eos) {
            stop = "eos";
            break;
        }
        size_t len;
        const char *bytes = a->eng->token_bytes(a->eng, t, &len);
        ds4_gen_parser_feed(gp, bytes, len);
        if (a->eng->decode_spec) {
            int r = spec_step(a, gp, t, &n_gen, &pending);
            if (r < 0) {
                fprintf(stderr, "\nds4-agent: %s\n", a->eng->err);
                ok = false;
                break;
            }
            if (r > 0) {
                stop = "tool calls";
                break;
            }
            continue;
        }
        if (a->eng->decode(a->eng, t) != 0) {
            fprintf(stderr, "\nds4-agent: %s\n", a->eng->err);
            ok = false;
            break;
        }
        ds4_tokens_push(&a->live, t);
        agent_buf_add(&a->live_text, bytes, len);
        n_gen++;
        if (ds4_gen_parser_state(gp) == DS4_GEN_TOOLS_DONE) {
            stop = "tool calls"; /* the EOS that follows is fed with the results */
            break;
        }
    }
    double dt = ds4_cli_now_s() - t0;
    ds4_gen_parser_finish(gp);
    if (!quiet) ds4_cli_printer_finish(&pr);
    trace(a, "generated", a->live_text.p ? a->live_text.p + text_start : "", a->live_text.n - text_start);
    json_t *msg = ok ? ds4_gen_parser_message(gp, NULL) : NULL;
    ds4_gen_parser_free(gp);
    a->pending_eos = true; /* sampled or not, the EOS goes in with the next turn */
    if (a->s.stats && !quiet)
        fprintf(stderr, "ds4-agent: generated %d tokens in %.2f s (%.1f tok/s), stop: %s, context %zu/%lld\n", n_gen,
                dt, dt > 0 ? n_gen / dt : 0.0, stop, a->live.n, (long long)a->eng->ctx);
    if (stop_reason) *stop_reason = stop;
    if (!msg) return NULL;
    /* ids for the calls: tool results name them */
    json_t *calls = json_object_get(msg, "tool_calls");
    for (size_t i = 0; i < json_array_size(calls); i++) {
        char id[32];
        snprintf(id, sizeof id, "call_%ld", a->next_call_id++);
        json_object_set_new(json_array_get(calls, i), "id", json_string(id));
    }
    json_array_append_new(a->messages, msg);
    a->n_in_session = json_array_size(a->messages);
    return msg;
}

/* "name {args}" of a call, shortened for the terminal. */
static void show_call(agent *a, const char *name, const char *args)
{
    size_t al = strlen(args);
    fprintf(a->s.out, "%s> %s %.*s%s%s\n", a->s.color ? "\x1b[36m" : "", name, (int)(al > 300 ? 300 : al), args,
            al > 300 ? " ..." : "", a->s.color ? "\x1b[0m" : "");
    fflush(a->s.out); /* seen before a long command starts */
}

static void show_result(agent *a, const char *r, bool failed)
{
    const char *p = r;
    int lines = 0;
    if (a->s.color) fputs(failed ? "\x1b[31m" : "\x1b[2m", a->s.out);
    while (*p && lines < SHOW_RESULT_LINES) {
        const char *e = strchr(p, '\n');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        fprintf(a->s.out, "  %.*s\n", (int)(l > 200 ? 200 : l), p);
        lines++;
        p += l + (e ? 1 : 0);
    }
    if (*p) fprintf(a->s.out, "  [... %zu more bytes]\n", strlen(p));
    if (a->s.color) fputs("\x1b[0m", a->s.out);
    fflush(a->s.out);
}

/* Run the calls of msg, appending one tool message per call. */
static void run_calls(agent *a, json_t *msg)
{
    json_t *calls = json_object_get(msg, "tool_calls");
    for (size_t i = 0; i < json_array_size(calls); i++) {
        json_t *c = json_array_get(calls, i);
        json_t *fn = json_object_get(c, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        if (!name) name = "";
        if (!args) args = "{}";
        char *r;
        bool failed = false;
        if (*a->stop) {
            r = strdup("error: not run: the user interrupted (Ctrl-C)");
            failed = true;
        } else {
            show_call(a, name, args);
            r = agent_tools_call(&a->tools, name, args, &failed);
        }
        if (!r) r = strdup("error: out of memory");
        show_result(a, r, failed);
        if (a->s.trace) {
            fprintf(a->s.trace, "=== tool %s %s -> %s\n%s\n", name, args, failed ? "error" : "ok", r);
            fflush(a->s.trace);
        }
        /* command output and files may hold any bytes; the transcript is
         * JSON, so bytes that are not UTF-8 become U+FFFD */
        size_t rl = strlen(r);
        char *clean = malloc(DS4_UTF8_STREAM_MAX_OUT(rl));
        size_t cl = 0;
        if (clean) {
            ds4_utf8_stream us = {0};
            cl = ds4_utf8_stream_feed(&us, r, rl, clean);
            cl += ds4_utf8_stream_flush(&us, clean + cl);
        }
        json_t *content = clean ? json_stringn(clean, cl) : NULL;
        free(clean);
        free(r);
        json_array_append_new(a->messages, json_pack("{s:s,s:O,s:o}", "role", "tool", "tool_call_id",
                                                     json_object_get(c, "id"), "content",
                                                     content ? content : json_string("error: out of memory")));
    }
}

agent_outcome agent_task(agent *a, const char *text)
{
    /* user text must be valid UTF-8 for the JSON transcript */
    json_t *content = json_string(text);
    if (!content) {
        fprintf(stderr, "ds4-agent: the task is not valid UTF-8\n");
        return AGENT_FAILED;
    }
    json_array_append_new(a->messages, json_pack("{s:s,s:o}", "role", "user", "content", content));
    for (int step = 0; step < a->s.max_steps; step++) {
        maybe_compact(a);
        if (!agent_sync(a)) {
            if (step == 0) /* the task never reached the model: forget it */
                json_array_remove(a->messages, json_array_size(a->messages) - 1);
            if (a->n_in_session > json_array_size(a->messages)) a->n_in_session = json_array_size(a->messages);
            if (*a->stop) return AGENT_STOPPED;
            return AGENT_FAILED;
        }
        const char *why = "";
        json_t *msg = agent_generate(a, true, false, &why);
        if (!msg) return AGENT_FAILED;
        if (*a->stop) {
            /* calls cut off by Ctrl-C are not run; the next turn is the user's */
            json_object_del(msg, "tool_calls");
            return AGENT_STOPPED;
        }
        if (!json_array_size(json_object_get(msg, "tool_calls"))) {
            if (!strcmp(why, "context full")) {
                fprintf(stderr, "ds4-agent: the context is full (ctx %lld); the answer was cut\n", (long long)a->eng->ctx);
                return AGENT_FAILED;
            }
            return AGENT_DONE;
        }
        run_calls(a, msg);
        if (*a->stop) return AGENT_STOPPED;
    }
    fprintf(stderr, "ds4-agent: stopped after %d model turns without a final answer (--max-steps)\n", a->s.max_steps);
    return AGENT_STEP_LIMIT;
}

/*
 * output_parser.c - the server's view of generated text (see header), over
 * the text layer's incremental DSML parser (include/ds4_dsml.h).
 *
 * ds4_gen_parser does the DeepSeek-specific work: reasoning until </think>,
 * content, the DSML tool block with argument deltas, hold-back of partial
 * markers and UTF-8. This file adds what only the server needs:
 *  - stop sequences on the content (a partial match is held back; a match
 *    ends the generation and cuts the content there);
 *  - unguessable client-visible ids per call (call_… / toolu_…), and the
 *    call name in the start event so an API can open its tool block at once;
 *  - the exact sampled bytes from the end of the visible content through the
 *    closing tag (including whatever whitespace the model put before the
 *    block), which exact replay puts back after the content.
 */
#include "server/output_parser.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "include/ds4_dsml.h"
#include "server/tool_memory.h"

typedef struct { char *p; size_t len, cap; } sbuf;

static void sb_add(sbuf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return; /* keeps the old text; a too-short result beats a crash */
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

struct out_parser {
    ds4_gen_parser *gp;
    char id_prefix[16];
    char *const *stops;
    size_t n_stops;
    out_event_fn fn;
    void *ud;

    sbuf text;         /* everything generated */
    sbuf reasoning;
    sbuf content;      /* content emitted so far */
    sbuf pending;      /* content held back for a possible stop sequence */
    bool saw_reasoning;
    bool stop_seq;
    int stop_idx; /* the stop string that ended the answer (when stop_seq) */
    bool finished;

    out_call *calls;
    size_t n_calls;
    int open_call;     /* index between BEGIN and NAME, -1 otherwise */
    char *raw;         /* exact block bytes (after finish) */
    size_t raw_len;
};

static void emit(out_parser *p, out_event_type type, int index, const char *s, size_t n)
{
    out_event ev = {type, index, s, n, NULL, NULL};
    if (type == OUT_TOOL_START) {
        ev.id = p->calls[index].id;
        ev.name = p->calls[index].name;
    }
    if (p->fn) p->fn(p->ud, &ev);
}

/* Longest suffix of s[0..n) that is a proper prefix of a stop string. */
static size_t stop_partial(const out_parser *p, const char *s, size_t n)
{
    size_t best = 0;
    for (size_t k = 0; k < p->n_stops; k++) {
        size_t t = strlen(p->stops[k]);
        for (size_t m = (t - 1 < n ? t - 1 : n); m > best; m--)
            if (!memcmp(s + n - m, p->stops[k], m)) { best = m; break; }
    }
    return best;
}

static void emit_content(out_parser *p, const char *s, size_t n)
{
    if (!n) return;
    sb_add(&p->content, s, n);
    emit(p, OUT_CONTENT, 0, s, n);
}

/* Content arrives in the parser's pieces; stop sequences are checked on the
 * held-back tail plus the new piece. */
static void on_content(out_parser *p, const char *s, size_t n, bool final)
{
    if (p->stop_seq) return;
    if (!p->n_stops) { emit_content(p, s, n); return; }
    sb_add(&p->pending, s, n);
    const char *buf = p->pending.p ? p->pending.p : "";
    size_t len = p->pending.len, cut = (size_t)-1;
    int hit = -1;
    for (size_t k = 0; k < p->n_stops; k++) {
        const char *f = memmem(buf, len, p->stops[k], strlen(p->stops[k]));
        if (f && (size_t)(f - buf) < cut) cut = (size_t)(f - buf), hit = (int)k;
    }
    if (cut != (size_t)-1) {
        emit_content(p, buf, cut);
        p->stop_seq = true;
        p->stop_idx = hit;
        p->pending.len = 0;
        return;
    }
    size_t keep = final ? 0 : stop_partial(p, buf, len);
    /* never split a UTF-8 sequence: the parser gave whole characters, and a
     * stop string is whole characters, so the cut point is a boundary */
    emit_content(p, buf, len - keep);
    memmove(p->pending.p, buf + len - keep, keep);
    p->pending.len = keep;
}

static void on_gen_event(void *user, const ds4_gen_event *ev)
{
    out_parser *p = user;
    switch (ev->kind) {
    case DS4_GEN_REASONING:
        p->saw_reasoning = true;
        sb_add(&p->reasoning, ev->text, ev->len);
        if (ev->len) emit(p, OUT_REASONING, 0, ev->text, ev->len);
        break;
    case DS4_GEN_CONTENT:
        on_content(p, ev->text, ev->len, false);
        break;
    case DS4_GEN_CALL_BEGIN: {
        if (p->stop_seq) break;
        out_call *c = realloc(p->calls, (p->n_calls + 1) * sizeof *c);
        if (!c) break;
        p->calls = c;
        c = &p->calls[p->n_calls];
        memset(c, 0, sizeof *c);
        char id[64];
        if (tool_id_new(p->id_prefix, id, sizeof id) < 0)
            snprintf(id, sizeof id, "%s%zu", p->id_prefix, p->n_calls);
        c->id = strdup(id);
        p->open_call = (int)p->n_calls++;
        break;
    }
    case DS4_GEN_CALL_NAME:
        if (p->open_call != ev->index || p->open_call < 0) break;
        p->calls[ev->index].name = strndup(ev->text, ev->len);
        emit(p, OUT_TOOL_START, ev->index, NULL, 0);
        p->open_call = -1;
        break;
    case DS4_GEN_CALL_ARGS:
        if ((size_t)ev->index < p->n_calls && p->calls[ev->index].name)
            emit(p, OUT_TOOL_ARGS, ev->index, ev->text, ev->len);
        break;
    case DS4_GEN_CALL_END:
        if ((size_t)ev->index < p->n_calls && p->calls[ev->index].name)
            emit(p, OUT_TOOL_END, ev->index, NULL, 0);
        break;
    case DS4_GEN_ERROR:
        break;
    }
}

out_parser *out_parser_new(bool thinking, bool tools, const char *id_prefix,
                           char *const *stops, size_t n_stops,
                           out_event_fn fn, void *ud)
{
    out_parser *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->gp = ds4_gen_parser_new(thinking, tools, on_gen_event, p);
    if (!p->gp) { free(p); return NULL; }
    snprintf(p->id_prefix, sizeof p->id_prefix, "%s", id_prefix ? id_prefix : "call_");
    p->stops = stops;
    p->n_stops = n_stops;
    p->fn = fn;
    p->ud = ud;
    p->open_call = -1;
    p->saw_reasoning = thinking;
    return p;
}

void out_parser_free(out_parser *p)
{
    if (!p) return;
    ds4_gen_parser_free(p->gp);
    free(p->text.p);
    free(p->reasoning.p);
    free(p->content.p);
    free(p->pending.p);
    for (size_t i = 0; i < p->n_calls; i++) {
        free(p->calls[i].id);
        free(p->calls[i].name);
        free(p->calls[i].arguments);
    }
    free(p->calls);
    free(p->raw);
    free(p);
}

void out_parser_feed(out_parser *p, const char *bytes, size_t len)
{
    if (p->finished || out_parser_done(p)) return;
    sb_add(&p->text, bytes, len);
    ds4_gen_parser_feed(p->gp, bytes, len);
}

bool out_parser_done(const out_parser *p)
{
    return p->stop_seq || ds4_gen_parser_state(p->gp) == DS4_GEN_TOOLS_DONE;
}

bool out_parser_stopped_by_sequence(const out_parser *p) { return p->stop_seq; }

const char *out_parser_stop_sequence(const out_parser *p)
{
    return p->stop_seq && p->stop_idx >= 0 ? p->stops[p->stop_idx] : NULL;
}

bool out_parser_structural(const out_parser *p) { return ds4_gen_parser_structural(p->gp); }

void out_parser_finish(out_parser *p)
{
    if (p->finished) return;
    p->finished = true;
    ds4_gen_parser_finish(p->gp);
    if (p->pending.len && !p->stop_seq) {
        sbuf rest = p->pending;
        p->pending = (sbuf){0};
        on_content(p, rest.p, rest.len, true);
        free(rest.p);
    }
    /* Arguments and the calls that count come from the parser's final
     * message (an unclosed block keeps its closed invokes; a malformed one
     * none); ids stay the ones already streamed, matched by position. */
    json_t *msg = ds4_gen_parser_message(p->gp, NULL);
    json_t *calls = json_object_get(msg, "tool_calls");
    size_t n = p->stop_seq ? 0 : json_array_size(calls);
    if (n > p->n_calls) n = p->n_calls;
    for (size_t i = 0; i < n; i++) {
        json_t *fn = json_object_get(json_array_get(calls, i), "function");
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        const char *name = json_string_value(json_object_get(fn, "name"));
        /* the same text the streamed argument deltas add up to */
        p->calls[i].arguments = strdup(args ? args : "{}");
        if (!p->calls[i].name && name) p->calls[i].name = strdup(name);
    }
    for (size_t i = n; i < p->n_calls; i++) {
        free(p->calls[i].id);
        free(p->calls[i].name);
    }
    p->n_calls = n;
    if (!p->stop_seq && json_is_string(json_object_get(msg, "content"))) {
        /* the parser's final word (a malformed block's text is content) */
        const char *c = json_string_value(json_object_get(msg, "content"));
        p->content.len = 0;
        sb_add(&p->content, c, strlen(c));
    }
    json_decref(msg);
    size_t rl = 0;
    const char *raw = ds4_gen_parser_raw_dsml(p->gp, &rl);
    if (raw && rl && n && p->text.p) {
        /* locate the block in the generated text and take the whitespace
         * before it too: the content the client sees back is trimmed */
        const char *at = NULL;
        for (const char *f = memmem(p->text.p, p->text.len, raw, rl); f;
             f = memmem(f + 1, p->text.len - (size_t)(f + 1 - p->text.p), raw, rl))
            at = f;
        if (at) {
            while (at > p->text.p && strchr(" \t\r\n", at[-1])) at--;
            const char *blk = memmem(at, p->text.len - (size_t)(at - p->text.p), raw, rl);
            size_t end = (size_t)(blk - at) + rl;
            p->raw = malloc(end + 1);
            if (p->raw) {
                memcpy(p->raw, at, end);
                p->raw[end] = 0;
                p->raw_len = end;
            }
        }
    }
    if (!p->content.p) sb_add(&p->content, "", 0);
}

const char *out_parser_reasoning(const out_parser *p)
{
    return p->saw_reasoning ? (p->reasoning.p ? p->reasoning.p : "") : NULL;
}

const char *out_parser_content(const out_parser *p) { return p->content.p ? p->content.p : ""; }
size_t out_parser_n_calls(const out_parser *p) { return p->n_calls; }
const out_call *out_parser_call(const out_parser *p, size_t i) { return &p->calls[i]; }

const char *out_parser_raw_block(const out_parser *p, size_t *len)
{
    *len = p->raw_len;
    return p->raw;
}

const char *out_parser_text(const out_parser *p, size_t *len)
{
    *len = p->text.len;
    return p->text.p ? p->text.p : "";
}

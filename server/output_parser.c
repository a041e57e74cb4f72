/*
 * output_parser.c - the generated-text state machine (see header).
 *
 * The whole generated text is kept in one buffer and a cursor says how far
 * it has been classified; each feed re-examines only the unclassified tail,
 * so the work per token is bounded by the hold-back windows, not the length
 * of the generation. DSML is matched on bytes (chat-format §3.7: the tags
 * are several tokens each). Values are passed through as the model wrote
 * them, the official encoder's convention (no entity decoding).
 */
#include "server/output_parser.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "server/prompt_render.h"
#include "server/tool_memory.h"

#define M_THINK_END "</think>"
#define M_BLOCK "<" DS4_DSML "tool_calls>"
#define M_BLOCK_END "</" DS4_DSML "tool_calls>"
#define M_INVOKE "<" DS4_DSML "invoke"
#define M_INVOKE_END "</" DS4_DSML "invoke>"
#define M_PARAM "<" DS4_DSML "parameter"
#define M_PARAM_END "</" DS4_DSML "parameter>"
#define MARKER_WINDOW 80

typedef enum { S_REASONING, S_CONTENT, S_BETWEEN_INVOKES, S_BETWEEN_PARAMS,
               S_VALUE, S_DONE, S_BROKEN } state;

typedef struct { char *p; size_t len, cap; } sbuf;

static void sb_add(sbuf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return; /* keeps the old text; a too-short result beats a crash */
        b->p = q; b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

struct out_parser {
    bool thinking, tools;
    char id_prefix[16];
    char *const *stops;
    size_t n_stops;
    out_event_fn fn;
    void *ud;

    sbuf text;        /* everything generated */
    size_t cur;       /* bytes of text classified */
    state st;
    bool stop_seq;

    sbuf reasoning, content;
    bool saw_reasoning;
    size_t block_start; /* where the raw block begins (after trimmed content) */
    size_t block_end;

    out_call *calls;
    size_t n_calls;
    json_t *args;     /* arguments object of the call being parsed */
    char *param_name;
    bool param_string;
    size_t value_start;
    int n_params;
};

out_parser *out_parser_new(bool thinking, bool tools, const char *id_prefix,
                           char *const *stops, size_t n_stops,
                           out_event_fn fn, void *ud)
{
    out_parser *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->thinking = thinking;
    p->tools = tools;
    snprintf(p->id_prefix, sizeof p->id_prefix, "%s", id_prefix ? id_prefix : "call_");
    p->stops = stops;
    p->n_stops = n_stops;
    p->fn = fn;
    p->ud = ud;
    p->st = thinking ? S_REASONING : S_CONTENT;
    return p;
}

void out_parser_free(out_parser *p)
{
    if (!p) return;
    free(p->text.p);
    free(p->reasoning.p);
    free(p->content.p);
    for (size_t i = 0; i < p->n_calls; i++) {
        free(p->calls[i].id);
        free(p->calls[i].name);
        free(p->calls[i].arguments);
    }
    free(p->calls);
    json_decref(p->args);
    free(p->param_name);
    free(p);
}

/* Length of s[0..n) without a trailing incomplete UTF-8 sequence. */
static size_t utf8_safe(const char *s, size_t n)
{
    size_t i = n, k = 0;
    while (i > 0 && k < 4) {
        unsigned char c = (unsigned char)s[i - 1];
        if ((c & 0xC0) != 0x80) {
            size_t need = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
            return (k + 1 >= need) ? n : i - 1;
        }
        i--; k++;
    }
    return n;
}

/* Longest suffix of s[0..n) that is a proper prefix of `tag`. */
static size_t partial_tag(const char *s, size_t n, const char *tag)
{
    size_t t = strlen(tag);
    for (size_t k = (t - 1 < n ? t - 1 : n); k > 0; k--)
        if (!memcmp(s + n - k, tag, k)) return k;
    return 0;
}

static const char *find(const char *s, size_t n, const char *tag)
{
    size_t t = strlen(tag);
    if (n < t) return NULL;
    return memmem(s, n, tag, t);
}

static void emit(out_parser *p, out_event_type type, const char *s, size_t n)
{
    if (n == 0 && (type == OUT_REASONING || type == OUT_CONTENT || type == OUT_TOOL_ARGS)) return;
    if (type == OUT_REASONING) { sb_add(&p->reasoning, s, n); p->saw_reasoning = true; }
    if (type == OUT_CONTENT) sb_add(&p->content, s, n);
    out_event ev = {type, (int)p->n_calls - 1, s, n, NULL, NULL};
    if (type == OUT_TOOL_START) {
        ev.id = p->calls[p->n_calls - 1].id;
        ev.name = p->calls[p->n_calls - 1].name;
    }
    if (p->fn) p->fn(p->ud, &ev);
}

/* JSON-escape s[0..n) into an event (argument deltas of string values). */
static void emit_escaped(out_parser *p, const char *s, size_t n)
{
    if (!n) return;
    json_t *j = json_stringn(s, n);
    char *e = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    if (e) emit(p, OUT_TOOL_ARGS, e + 1, strlen(e) - 2); /* without quotes */
    free(e);
    json_decref(j);
}

/* Value of attr="..." inside a tag body; malloc'd, or NULL. */
static char *attr(const char *tag, size_t n, const char *name)
{
    char pat[32];
    snprintf(pat, sizeof pat, "%s=\"", name);
    const char *a = find(tag, n, pat);
    if (!a) return NULL;
    a += strlen(pat);
    const char *e = memchr(a, '"', (size_t)(tag + n - a));
    if (!e) return NULL;
    return strndup(a, (size_t)(e - a));
}

static size_t skip_ws(const char *s, size_t i, size_t n)
{
    while (i < n && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) i++;
    return i;
}

/* Does s[i..n) start with tag (1), possibly (0 = need more), or not (-1)? */
static int starts(const char *s, size_t i, size_t n, const char *tag)
{
    size_t t = strlen(tag), have = n - i;
    if (have >= t) return memcmp(s + i, tag, t) ? -1 : 1;
    return memcmp(s + i, tag, have) ? -1 : 0;
}

static size_t stop_holdback(out_parser *p, const char *s, size_t n, size_t *hit)
{
    size_t hold = 0;
    *hit = (size_t)-1;
    for (size_t k = 0; k < p->n_stops; k++) {
        const char *f = find(s, n, p->stops[k]);
        if (f && (size_t)(f - s) < *hit) *hit = (size_t)(f - s);
        size_t h = partial_tag(s, n, p->stops[k]);
        if (h > hold) hold = h;
    }
    return hold;
}

static void step_content(out_parser *p, bool final)
{
    const char *s = p->text.p + p->cur;
    size_t n = p->text.len - p->cur;
    size_t stop_at = (size_t)-1;
    size_t hold = p->n_stops ? stop_holdback(p, s, n, &stop_at) : 0;
    const char *m = p->tools ? find(s, n, M_BLOCK) : NULL;
    if (stop_at != (size_t)-1 && (!m || stop_at < (size_t)(m - s))) {
        emit(p, OUT_CONTENT, s, stop_at);
        p->cur += n;
        p->stop_seq = true;
        p->st = S_DONE;
        return;
    }
    if (m) {
        size_t end = (size_t)(m - s);
        while (end > 0 && strchr(" \t\r\n", s[end - 1])) end--;
        emit(p, OUT_CONTENT, s, end);
        p->block_start = p->cur + end;
        p->cur += (size_t)(m - s) + strlen(M_BLOCK);
        p->st = S_BETWEEN_INVOKES;
        return;
    }
    size_t safe = n;
    if (!final) {
        if (p->tools) {
            /* a possible marker start within the window, and the whitespace
             * that would separate it from the content */
            size_t lo = n > MARKER_WINDOW ? n - MARKER_WINDOW : 0;
            for (size_t i = n; i > lo; i--)
                if (s[i - 1] == '<') { safe = i - 1; break; }
            while (safe > 0 && strchr(" \t\r\n", s[safe - 1])) safe--;
        }
        if (n - hold < safe) safe = n - hold;
        safe = utf8_safe(s, safe);
    } else if (p->tools) {
        /* trailing whitespace of a final answer is still content */
    }
    emit(p, OUT_CONTENT, s, safe);
    p->cur += safe;
}

static void step_reasoning(out_parser *p, bool final)
{
    const char *s = p->text.p + p->cur;
    size_t n = p->text.len - p->cur;
    if (p->cur == 0 && !p->saw_reasoning) {
        /* the model may repeat the <think> of the prompt */
        int k = starts(s, 0, n, "<think>");
        if (k == 0 && !final) return;
        if (k == 1) { p->cur += 7; s += 7; n -= 7; }
    }
    const char *e = find(s, n, M_THINK_END);
    if (e) {
        emit(p, OUT_REASONING, s, (size_t)(e - s));
        p->saw_reasoning = true;
        p->cur += (size_t)(e - s) + strlen(M_THINK_END);
        p->st = S_CONTENT;
        return;
    }
    size_t safe = final ? n : utf8_safe(s, n - partial_tag(s, n, M_THINK_END));
    emit(p, OUT_REASONING, s, safe);
    p->saw_reasoning = true;
    p->cur += safe;
}

static void start_call(out_parser *p, const char *tag, size_t n)
{
    char *name = attr(tag, n, "name");
    out_call *c = realloc(p->calls, (p->n_calls + 1) * sizeof *c);
    if (!c || !name) { free(name); if (c) p->calls = c; p->st = S_BROKEN; return; }
    p->calls = c;
    c = &p->calls[p->n_calls++];
    char id[64];
    if (tool_id_new(p->id_prefix, id, sizeof id) < 0) snprintf(id, sizeof id, "%s%zu", p->id_prefix, p->n_calls);
    c->id = strdup(id);
    c->name = name;
    c->arguments = NULL;
    json_decref(p->args);
    p->args = json_object();
    p->n_params = 0;
    emit(p, OUT_TOOL_START, NULL, 0);
    emit(p, OUT_TOOL_ARGS, "{", 1);
}

static void end_call(out_parser *p)
{
    out_call *c = &p->calls[p->n_calls - 1];
    c->arguments = json_dumps(p->args, JSON_COMPACT);
    json_decref(p->args);
    p->args = NULL;
    emit(p, OUT_TOOL_ARGS, "}", 1);
    emit(p, OUT_TOOL_END, NULL, 0);
}

/* Returns true while progress was made. */
static bool step_tools(out_parser *p, bool final)
{
    const char *s = p->text.p;
    size_t n = p->text.len, i = p->cur;
    if (p->st == S_VALUE) {
        const char *e = find(s + i, n - i, M_PARAM_END);
        size_t upto = e ? (size_t)(e - s) : n - partial_tag(s + i, n - i, M_PARAM_END);
        if (!e && final) upto = n;
        upto = i + utf8_safe(s + i, upto - i);
        if (p->param_string) emit_escaped(p, s + i, upto - i);
        else emit(p, OUT_TOOL_ARGS, s + i, upto - i);
        p->cur = upto;
        if (!e) return false;
        size_t vlen = (size_t)(e - s) - p->value_start;
        const char *v = s + p->value_start;
        json_t *val = NULL;
        if (p->param_string) val = json_stringn(v, vlen);
        else {
            val = json_loadb(v, vlen, JSON_DECODE_ANY, NULL);
            if (!val) val = json_stringn(v, vlen); /* keep what the model wrote */
        }
        if (val) json_object_set_new(p->args, p->param_name, val);
        if (p->param_string) emit(p, OUT_TOOL_ARGS, "\"", 1);
        p->cur = (size_t)(e - s) + strlen(M_PARAM_END);
        p->st = S_BETWEEN_PARAMS;
        return true;
    }
    i = skip_ws(s, i, n);
    if (i == n) return false;
    if (p->st == S_BETWEEN_INVOKES) {
        int k = starts(s, i, n, M_BLOCK_END);
        if (k == 1) {
            p->block_end = i + strlen(M_BLOCK_END);
            p->cur = p->block_end;
            p->st = S_DONE;
            return false;
        }
        int k2 = starts(s, i, n, M_INVOKE);
        if (k < 0 && k2 < 0) { p->st = S_BROKEN; return false; }
        if (k2 < 1) return false;
        const char *gt = memchr(s + i, '>', n - i);
        if (!gt) return false;
        start_call(p, s + i, (size_t)(gt - s) - i);
        p->cur = (size_t)(gt - s) + 1;
        if (p->st != S_BROKEN) p->st = S_BETWEEN_PARAMS;
        return p->st != S_BROKEN;
    }
    /* S_BETWEEN_PARAMS */
    int k = starts(s, i, n, M_INVOKE_END);
    if (k == 1) {
        end_call(p);
        p->cur = i + strlen(M_INVOKE_END);
        p->st = S_BETWEEN_INVOKES;
        return true;
    }
    int k2 = starts(s, i, n, M_PARAM);
    if (k < 0 && k2 < 0) { p->st = S_BROKEN; return false; }
    if (k2 < 1) return false;
    const char *gt = memchr(s + i, '>', n - i);
    if (!gt) return false;
    size_t tl = (size_t)(gt - s) - i;
    char *name = attr(s + i, tl, "name");
    char *str = attr(s + i, tl, "string");
    if (!name) { free(str); p->st = S_BROKEN; return false; }
    free(p->param_name);
    p->param_name = name;
    p->param_string = !str || strcmp(str, "false");
    free(str);
    json_t *nm = json_string(name);
    char *q = nm ? json_dumps(nm, JSON_ENCODE_ANY) : NULL;
    json_decref(nm);
    if (p->n_params++) emit(p, OUT_TOOL_ARGS, ",", 1);
    if (q) emit(p, OUT_TOOL_ARGS, q, strlen(q));
    free(q);
    emit(p, OUT_TOOL_ARGS, p->param_string ? ":\"" : ":", p->param_string ? 2 : 1);
    p->cur = (size_t)(gt - s) + 1;
    p->value_start = p->cur;
    p->st = S_VALUE;
    return true;
}

static void run(out_parser *p, bool final)
{
    for (int guard = 0; guard < 1000000; guard++) {
        state before = p->st;
        size_t cur = p->cur;
        if (p->st == S_REASONING) step_reasoning(p, final);
        else if (p->st == S_CONTENT) step_content(p, final);
        else if (p->st == S_BETWEEN_INVOKES || p->st == S_BETWEEN_PARAMS || p->st == S_VALUE) {
            if (!step_tools(p, final) && p->st == before && p->cur == cur) break;
        } else break;
        if (p->st == before && p->cur == cur) break;
    }
}

void out_parser_feed(out_parser *p, const char *bytes, size_t len)
{
    if (p->st == S_DONE) return;
    sb_add(&p->text, bytes, len);
    if (p->st == S_BROKEN) return;
    run(p, false);
}

bool out_parser_done(const out_parser *p) { return p->st == S_DONE; }

bool out_parser_structural(const out_parser *p)
{
    return p->st == S_BETWEEN_INVOKES || p->st == S_BETWEEN_PARAMS ||
           (p->st == S_VALUE && !p->param_string);
}
bool out_parser_stopped_by_sequence(const out_parser *p) { return p->stop_seq; }

void out_parser_finish(out_parser *p)
{
    if (p->st == S_REASONING || p->st == S_CONTENT) run(p, true);
    if (p->st == S_BROKEN || p->st == S_VALUE || p->st == S_BETWEEN_PARAMS ||
        p->st == S_BETWEEN_INVOKES) {
        /* An unfinished or malformed block: its complete calls stand, the
         * partial call is dropped, and nothing else is invented. */
        if (p->n_calls && !p->calls[p->n_calls - 1].arguments) {
            out_call *c = &p->calls[--p->n_calls];
            free(c->id); free(c->name);
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
    if (!p->block_end) { *len = 0; return NULL; }
    *len = p->block_end - p->block_start;
    return p->text.p + p->block_start;
}

const char *out_parser_text(const out_parser *p, size_t *len)
{
    *len = p->text.len;
    return p->text.p ? p->text.p : "";
}

/*
 * dsml_parse.c - incremental parser of generated assistant text:
 * reasoning, content and DSML tool calls (public API in
 * include/ds4_dsml.h; format in dsv4-chat-format.md §3.4, §3.6, §6).
 *
 * Bytes are appended to a pending buffer and consumed by a phase machine:
 *   REASONING  until "</think>" (a repeated leading "<think>" is skipped)
 *   CONTENT    until the start marker "\n\n<｜DSML｜tool_calls>" (or the
 *              marker without the blank line), when tools are enabled
 *   TOOLS      tags one at a time: invoke, parameter, value, closing tags
 *   DONE       after "</｜DSML｜tool_calls>" (the rest is ignored)
 *   FAILED     the block was malformed: everything from the marker on is
 *              content (so the final message loses nothing)
 * A phase consumes only what is certain and keeps in `pend` what a later
 * byte could still change: a suffix that may begin a marker or closing
 * tag, and an incomplete UTF-8 sequence. Emitted text is always valid
 * UTF-8 (bytes that never can be are replaced by U+FFFD).
 *
 * Tolerance, beyond DeepSeek's strict parser: ASCII whitespace between
 * tags, attributes in any order, a parameter without string="..." is a
 * string, a non-string value is trimmed and an empty one becomes null.
 * The official encoder escapes nothing inside values, so neither do we
 * decode entities.
 */
#include "include/ds4_dsml.h"

#include "text/pyjson.h"
#include "text/strbuf.h"
#include "text/utf8.h"
#include "util/error.h"

#include <stdlib.h>
#include <string.h>

#define TAG_DSML "\xEF\xBD\x9C" "DSML\xEF\xBD\x9C"
static const char k_think_open[] = "<think>";
static const char k_think_close[] = "</think>";
static const char k_marker[] = "<" TAG_DSML "tool_calls>";
static const char k_marker_nl[] = "\n\n<" TAG_DSML "tool_calls>";
static const char k_invoke[] = "<" TAG_DSML "invoke";
static const char k_invoke_end[] = "</" TAG_DSML "invoke>";
static const char k_param[] = "<" TAG_DSML "parameter";
static const char k_param_end[] = "</" TAG_DSML "parameter>";
static const char k_block_end[] = "</" TAG_DSML "tool_calls>";

#define MAX_TAG 4096            /* a tag longer than this is malformed */
#define MAX_VALUE (64u << 20)   /* non-string values are buffered up to this */

typedef enum { PH_REASONING, PH_CONTENT, PH_TOOLS, PH_DONE, PH_FAILED } phase;
typedef enum { T_BETWEEN_INVOKES, T_BETWEEN_PARAMS, T_VALUE } tool_state;

typedef struct {
    ds4_strbuf name, args;
    bool closed;
} call;

struct ds4_gen_parser {
    bool thinking, tools, finished, at_start;
    phase ph;
    tool_state ts;
    ds4_gen_event_fn cb;
    void *user;
    ds4_strbuf pend;   /* unconsumed bytes */
    size_t pos;        /* consumed prefix of pend */
    ds4_strbuf reasoning, content, raw, value, error;
    call *calls;
    size_t n_calls, cap_calls;
    int n_params;      /* parameters of the current invoke */
    bool value_is_string;
    bool oom;
};

/* ---- helpers ----------------------------------------------------------- */

static bool starts(const char *p, size_t n, const char *lit)
{
    size_t k = strlen(lit);
    return n >= k && memcmp(p, lit, k) == 0;
}

/* p[0..n) is a proper prefix of lit (more bytes could complete it) */
static bool partial(const char *p, size_t n, const char *lit)
{
    size_t k = strlen(lit);
    return n < k && memcmp(p, lit, n) == 0;
}

/* Longest suffix of p[0..n) that is a proper prefix of lit. */
static size_t suffix_prefix(const char *p, size_t n, const char *lit)
{
    size_t k = strlen(lit);
    for (size_t s = n < k - 1 ? n : k - 1; s > 0; s--)
        if (memcmp(p + n - s, lit, s) == 0) return s;
    return 0;
}

static const char *find(const char *p, size_t n, const char *lit)
{
    return memmem(p, n, lit, strlen(lit));
}

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/* Append s[0..n) with every byte that is not valid UTF-8 as U+FFFD. */
static void append_valid(ds4_strbuf *dst, const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t v = ds4_utf8_valid_prefix((const uint8_t *)s + i, n - i);
        ds4_sb_append(dst, s + i, v);
        i += v;
        if (i < n) {
            ds4_sb_append(dst, "\xEF\xBF\xBD", 3);
            i++;
        }
    }
}

static void emit(ds4_gen_parser *p, ds4_gen_event_kind kind, int index, const char *text, size_t len)
{
    if (!p->cb) return;
    ds4_gen_event ev = {kind, index, text, len};
    p->cb(p->user, &ev);
}

/* Append valid UTF-8 to dst (invalid bytes -> U+FFFD) and emit it. */
static void emit_text(ds4_gen_parser *p, ds4_gen_event_kind kind, ds4_strbuf *dst, const char *s, size_t n)
{
    if (n == 0) return;
    size_t start = dst->n;
    append_valid(dst, s, n);
    if (!dst->oom) emit(p, kind, 0, dst->p + start, dst->n - start);
}

/* Emit args text for the current call and record it. */
static void emit_args(ds4_gen_parser *p, const char *s, size_t n)
{
    call *c = &p->calls[p->n_calls - 1];
    size_t start = c->args.n;
    ds4_sb_append(&c->args, s, n);
    if (!c->args.oom) emit(p, DS4_GEN_CALL_ARGS, (int)p->n_calls - 1, c->args.p + start, n);
}

/* A string value chunk: JSON-escaped (Python escapes), invalid UTF-8 -> U+FFFD. */
static void emit_string_chunk(ds4_gen_parser *p, const char *s, size_t n)
{
    ds4_strbuf clean = {0}, esc = {0};
    append_valid(&clean, s, n);
    ds4_pyjson_string(&esc, clean.p ? clean.p : "", clean.n);
    /* strip the surrounding quotes: the value is streamed inside one string */
    if (esc.n >= 2) emit_args(p, esc.p + 1, esc.n - 2);
    p->oom |= clean.oom || esc.oom;
    ds4_sb_free(&clean);
    ds4_sb_free(&esc);
}

static const char *rest(const ds4_gen_parser *p, size_t *n)
{
    *n = p->pend.n - p->pos;
    return p->pend.p ? p->pend.p + p->pos : "";
}

static void consume(ds4_gen_parser *p, size_t n, bool raw)
{
    if (raw) ds4_sb_append(&p->raw, p->pend.p + p->pos, n);
    p->pos += n;
}

static void fail(ds4_gen_parser *p, const char *why)
{
    size_t off = p->raw.n;
    ds4_sb_printf(&p->error, "malformed tool call block at byte %zu of the block: %s", off, why);
    emit(p, DS4_GEN_ERROR, (int)p->n_calls, p->error.p, p->error.n);
    /* the block so far becomes content; the rest follows as content */
    ds4_strbuf raw = p->raw;
    memset(&p->raw, 0, sizeof p->raw);
    emit_text(p, DS4_GEN_CONTENT, &p->content, raw.p ? raw.p : "", raw.n);
    p->raw = raw;
    p->ph = PH_FAILED;
}

/* ---- tag attributes ---------------------------------------------------- */

typedef enum { ATTR_MORE, ATTR_OK, ATTR_BAD } attr_result;

/* Parse ` name="..." string="..."` up to '>' starting at s. On ATTR_OK,
 * *end is the offset just past '>'. */
static attr_result parse_attrs(const char *s, size_t n, size_t *end, const char **name, size_t *name_len,
                               const char **str, size_t *str_len)
{
    size_t i = 0;
    *name = *str = NULL;
    *name_len = *str_len = 0;
    for (;;) {
        while (i < n && is_ws(s[i])) i++;
        if (i >= n) return n > MAX_TAG ? ATTR_BAD : ATTR_MORE;
        if (s[i] == '>') {
            *end = i + 1;
            return ATTR_OK;
        }
        size_t k0 = i;
        while (i < n && ((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || s[i] == '_')) i++;
        if (i >= n) return n > MAX_TAG ? ATTR_BAD : ATTR_MORE;
        size_t klen = i - k0;
        if (klen == 0 || s[i] != '=') return ATTR_BAD;
        if (++i >= n) return ATTR_MORE;
        if (s[i] != '"') return ATTR_BAD;
        const char *q = memchr(s + i + 1, '"', n - i - 1);
        if (!q) return n > MAX_TAG ? ATTR_BAD : ATTR_MORE;
        const char *v = s + i + 1;
        size_t vlen = (size_t)(q - v);
        if (klen == 4 && !memcmp(s + k0, "name", 4)) {
            *name = v;
            *name_len = vlen;
        } else if (klen == 6 && !memcmp(s + k0, "string", 6)) {
            *str = v;
            *str_len = vlen;
        }
        i = (size_t)(q - s) + 1;
    }
}

/* ---- phases ------------------------------------------------------------ */

/* Keep back an incomplete UTF-8 tail unless finishing. */
static size_t utf8_hold(const ds4_gen_parser *p, const char *s, size_t n)
{
    return p->finished ? 0 : ds4_utf8_incomplete_tail((const uint8_t *)s, n);
}

static bool step_reasoning(ds4_gen_parser *p)
{
    size_t n;
    const char *s = rest(p, &n);
    if (p->at_start) {
        if (!p->finished && partial(s, n, k_think_open)) return false;
        p->at_start = false;
        if (starts(s, n, k_think_open)) {
            consume(p, strlen(k_think_open), false);
            return true;
        }
    }
    const char *close = find(s, n, k_think_close);
    if (close) {
        emit_text(p, DS4_GEN_REASONING, &p->reasoning, s, (size_t)(close - s));
        consume(p, (size_t)(close - s) + strlen(k_think_close), false);
        p->ph = PH_CONTENT;
        return true;
    }
    size_t hold = p->finished ? 0 : suffix_prefix(s, n, k_think_close);
    size_t u = utf8_hold(p, s, n - hold);
    size_t out = n - hold - u;
    emit_text(p, DS4_GEN_REASONING, &p->reasoning, s, out);
    consume(p, out, false);
    return false;
}

static bool step_content(ds4_gen_parser *p)
{
    size_t n;
    const char *s = rest(p, &n);
    if (p->tools) {
        const char *m = find(s, n, k_marker);
        if (m) {
            size_t k = (size_t)(m - s);
            size_t text_end = k >= 2 && s[k - 1] == '\n' && s[k - 2] == '\n' ? k - 2 : k;
            emit_text(p, DS4_GEN_CONTENT, &p->content, s, text_end);
            consume(p, text_end, false);
            consume(p, k - text_end + strlen(k_marker), true);
            p->ph = PH_TOOLS;
            p->ts = T_BETWEEN_INVOKES;
            return true;
        }
    }
    size_t hold = 0;
    if (p->tools && !p->finished) {
        size_t a = suffix_prefix(s, n, k_marker_nl), b = suffix_prefix(s, n, k_marker);
        hold = a > b ? a : b;
    }
    size_t u = utf8_hold(p, s, n - hold);
    size_t out = n - hold - u;
    emit_text(p, DS4_GEN_CONTENT, &p->content, s, out);
    consume(p, out, false);
    return false;
}

static bool add_call(ds4_gen_parser *p)
{
    if (p->n_calls == p->cap_calls) {
        size_t cap = p->cap_calls ? p->cap_calls * 2 : 4;
        call *c = realloc(p->calls, cap * sizeof *c);
        if (!c) return false;
        p->calls = c;
        p->cap_calls = cap;
    }
    memset(&p->calls[p->n_calls++], 0, sizeof(call));
    return true;
}

static bool step_tools(ds4_gen_parser *p)
{
    size_t n;
    const char *s = rest(p, &n);
    if (p->ts == T_VALUE) {
        const char *e = find(s, n, k_param_end);
        size_t len, hold = 0;
        if (e) {
            len = (size_t)(e - s);
        } else {
            hold = p->finished ? 0 : suffix_prefix(s, n, k_param_end);
            hold += utf8_hold(p, s, n - hold);
            len = n - hold;
        }
        if (p->value_is_string) {
            emit_string_chunk(p, s, len);
        } else {
            ds4_sb_append(&p->value, s, len);
            if (p->value.n > MAX_VALUE) {
                consume(p, len, true);
                fail(p, "non-string parameter value too long");
                return true;
            }
        }
        consume(p, len, true);
        if (!e) return false;
        if (p->value_is_string) {
            emit_args(p, "\"", 1);
        } else {
            size_t a = 0, b = p->value.n;
            while (a < b && is_ws(p->value.p[a])) a++;
            while (b > a && is_ws(p->value.p[b - 1])) b--;
            if (a == b) emit_args(p, "null", 4);
            else emit_args(p, p->value.p + a, b - a);
            ds4_sb_free(&p->value);
        }
        consume(p, strlen(k_param_end), true);
        p->ts = T_BETWEEN_PARAMS;
        return true;
    }

    size_t ws = 0;
    while (ws < n && is_ws(s[ws])) ws++;
    if (ws) {
        consume(p, ws, true);
        return true;
    }
    if (n == 0) return false;
    if (p->ts == T_BETWEEN_INVOKES) {
        if (starts(s, n, k_block_end)) {
            consume(p, strlen(k_block_end), true);
            p->ph = PH_DONE;
            return true;
        }
        if (starts(s, n, k_invoke)) {
            size_t t = strlen(k_invoke), end;
            const char *name, *str;
            size_t name_len, str_len;
            attr_result r = parse_attrs(s + t, n - t, &end, &name, &name_len, &str, &str_len);
            if (r == ATTR_MORE) return false; /* at finish: an unclosed block */
            if (r != ATTR_OK || !name || name_len == 0) {
                fail(p, r == ATTR_OK ? "invoke without a name" : "bad invoke tag");
                return true;
            }
            if (!add_call(p)) {
                p->oom = true;
                return false;
            }
            call *c = &p->calls[p->n_calls - 1];
            append_valid(&c->name, name, name_len);
            int idx = (int)p->n_calls - 1;
            emit(p, DS4_GEN_CALL_BEGIN, idx, NULL, 0);
            emit(p, DS4_GEN_CALL_NAME, idx, c->name.p, c->name.n);
            emit_args(p, "{", 1);
            p->n_params = 0;
            consume(p, t + end, true);
            p->ts = T_BETWEEN_PARAMS;
            return true;
        }
        if (partial(s, n, k_block_end) || partial(s, n, k_invoke)) return false;
        fail(p, "expected an invoke tag or the end of the block");
        return true;
    }
    /* T_BETWEEN_PARAMS */
    if (starts(s, n, k_invoke_end)) {
        emit_args(p, "}", 1);
        p->calls[p->n_calls - 1].closed = true;
        emit(p, DS4_GEN_CALL_END, (int)p->n_calls - 1, NULL, 0);
        consume(p, strlen(k_invoke_end), true);
        p->ts = T_BETWEEN_INVOKES;
        return true;
    }
    if (starts(s, n, k_param)) {
        size_t t = strlen(k_param), end;
        const char *name, *str;
        size_t name_len, str_len;
        attr_result r = parse_attrs(s + t, n - t, &end, &name, &name_len, &str, &str_len);
        if (r == ATTR_MORE) return false; /* at finish: an unclosed block */
        if (r != ATTR_OK || !name) {
            fail(p, r == ATTR_OK ? "parameter without a name" : "bad parameter tag");
            return true;
        }
        p->value_is_string = !(str && str_len == 5 && !memcmp(str, "false", 5));
        ds4_strbuf key = {0};
        if (p->n_params++) ds4_sb_puts(&key, ", ");
        ds4_strbuf q = {0};
        ds4_pyjson_string(&q, name, name_len);
        ds4_sb_append(&key, q.p, q.n);
        ds4_sb_puts(&key, p->value_is_string ? ": \"" : ": ");
        p->oom |= key.oom || q.oom;
        if (key.p) emit_args(p, key.p, key.n);
        ds4_sb_free(&key);
        ds4_sb_free(&q);
        consume(p, t + end, true);
        p->ts = T_VALUE;
        return true;
    }
    if (partial(s, n, k_invoke_end) || partial(s, n, k_param)) return false;
    fail(p, "expected a parameter tag or the end of the invoke");
    return true;
}

static void run(ds4_gen_parser *p)
{
    for (;;) {
        bool progress;
        switch (p->ph) {
        case PH_REASONING: progress = step_reasoning(p); break;
        case PH_CONTENT: progress = step_content(p); break;
        case PH_TOOLS: progress = step_tools(p); break;
        case PH_FAILED: {
            size_t n;
            const char *s = rest(p, &n);
            size_t out = n - utf8_hold(p, s, n);
            emit_text(p, DS4_GEN_CONTENT, &p->content, s, out);
            consume(p, out, false);
            progress = false;
            break;
        }
        default: /* PH_DONE: ignore the rest */
            p->pos = p->pend.n;
            progress = false;
        }
        if (!progress || p->oom) break;
    }
    /* drop the consumed prefix */
    if (p->pos > 0 && p->pend.p) {
        memmove(p->pend.p, p->pend.p + p->pos, p->pend.n - p->pos);
        p->pend.n -= p->pos;
        p->pend.p[p->pend.n] = '\0';
        p->pos = 0;
    }
}

/* ---- public ------------------------------------------------------------ */

/* A JSON string from bytes that may hold invalid UTF-8 (-> U+FFFD). */
static json_t *json_text(const char *s, size_t n)
{
    ds4_strbuf b = {0};
    append_valid(&b, s, n);
    json_t *j = json_stringn(b.p ? b.p : "", b.n);
    ds4_sb_free(&b);
    return j;
}

ds4_gen_parser *ds4_gen_parser_new(bool thinking, bool tools, ds4_gen_event_fn cb, void *user)
{
    ds4_gen_parser *p = calloc(1, sizeof *p);
    if (!p) {
        ds4_fail(DS4_ERR_NOMEM, "dsml: out of memory");
        return NULL;
    }
    p->thinking = thinking;
    p->tools = tools;
    p->cb = cb;
    p->user = user;
    p->ph = thinking ? PH_REASONING : PH_CONTENT;
    p->at_start = true;
    return p;
}

void ds4_gen_parser_free(ds4_gen_parser *p)
{
    if (!p) return;
    ds4_sb_free(&p->pend);
    ds4_sb_free(&p->reasoning);
    ds4_sb_free(&p->content);
    ds4_sb_free(&p->raw);
    ds4_sb_free(&p->value);
    ds4_sb_free(&p->error);
    for (size_t i = 0; i < p->n_calls; i++) {
        ds4_sb_free(&p->calls[i].name);
        ds4_sb_free(&p->calls[i].args);
    }
    free(p->calls);
    free(p);
}

static bool any_oom(const ds4_gen_parser *p)
{
    bool o = p->oom || p->pend.oom || p->reasoning.oom || p->content.oom || p->raw.oom || p->value.oom;
    for (size_t i = 0; i < p->n_calls; i++) o |= p->calls[i].name.oom || p->calls[i].args.oom;
    return o;
}

ds4_status ds4_gen_parser_feed(ds4_gen_parser *p, const char *text, size_t len)
{
    if (p->finished) return ds4_fail(DS4_ERR_INVALID, "dsml: feed after finish");
    if (p->ph == PH_DONE) return DS4_OK;
    ds4_sb_append(&p->pend, text, len);
    run(p);
    return any_oom(p) ? ds4_fail(DS4_ERR_NOMEM, "dsml: out of memory") : DS4_OK;
}

ds4_status ds4_gen_parser_finish(ds4_gen_parser *p)
{
    if (p->finished) return DS4_OK;
    p->finished = true;
    run(p);
    return any_oom(p) ? ds4_fail(DS4_ERR_NOMEM, "dsml: out of memory") : DS4_OK;
}

/* Inside a non-string value: is the end of what we have inside a JSON
 * string literal? */
static bool value_in_json_string(const ds4_strbuf *v)
{
    bool in = false;
    for (size_t i = 0; i < v->n; i++) {
        if (in && v->p[i] == '\\') i++;
        else if (v->p[i] == '"') in = !in;
    }
    return in;
}

bool ds4_gen_parser_structural(const ds4_gen_parser *p)
{
    size_t held = p->pend.n - p->pos;
    const char *h = p->pend.p ? p->pend.p + p->pos : "";
    switch (p->ph) {
    case PH_CONTENT:
        /* the model has begun writing the start marker: finish it greedily */
        return p->tools && memchr(h, '<', held) != NULL;
    case PH_TOOLS:
        if (p->ts != T_VALUE) return true;
        if (held && h[0] == '<') return true; /* a closing tag is being written */
        return p->value_is_string ? false : !value_in_json_string(&p->value);
    default:
        return false;
    }
}

ds4_gen_state ds4_gen_parser_state(const ds4_gen_parser *p)
{
    switch (p->ph) {
    case PH_TOOLS: return DS4_GEN_IN_TOOLS;
    case PH_DONE: return DS4_GEN_TOOLS_DONE;
    case PH_FAILED: return DS4_GEN_MALFORMED;
    default: return DS4_GEN_OPEN;
    }
}

json_t *ds4_gen_parser_message(const ds4_gen_parser *p, const char **error)
{
    if (error) *error = p->error.p ? p->error.p : "";
    json_t *m = json_object();
    json_object_set_new(m, "role", json_string("assistant"));
    json_object_set_new(m, "content", json_text(p->content.p, p->content.n));
    if (p->thinking)
        json_object_set_new(m, "reasoning_content", json_text(p->reasoning.p, p->reasoning.n));
    if (p->ph != PH_FAILED) {
        json_t *calls = json_array();
        for (size_t i = 0; i < p->n_calls; i++) {
            const call *c = &p->calls[i];
            if (!c->closed) continue;
            json_t *fn = json_object();
            json_object_set_new(fn, "name", json_text(c->name.p, c->name.n));
            json_object_set_new(fn, "arguments", json_text(c->args.p, c->args.n));
            json_t *tc = json_object();
            json_object_set_new(tc, "type", json_string("function"));
            json_object_set_new(tc, "function", fn);
            json_array_append_new(calls, tc);
        }
        if (json_array_size(calls)) json_object_set_new(m, "tool_calls", calls);
        else json_decref(calls);
    }
    return m;
}

const char *ds4_gen_parser_raw_dsml(const ds4_gen_parser *p, size_t *len)
{
    *len = p->raw.n;
    return p->raw.n && p->ph != PH_FAILED ? p->raw.p : NULL;
}

json_t *ds4_dsml_parse_message(const char *text, size_t len, bool thinking, bool tools, ds4_gen_state *state,
                               char **error)
{
    ds4_gen_parser *p = ds4_gen_parser_new(thinking, tools, NULL, NULL);
    if (!p) return NULL;
    json_t *m = NULL;
    if (ds4_gen_parser_feed(p, text, len) == DS4_OK && ds4_gen_parser_finish(p) == DS4_OK) {
        const char *err;
        m = ds4_gen_parser_message(p, &err);
        if (state) *state = ds4_gen_parser_state(p);
        if (error) *error = strdup(err);
    }
    ds4_gen_parser_free(p);
    return m;
}

/*
 * api_request.c - JSON bodies of the four APIs -> api_request (see header).
 *
 * Shape notes (facts of the public APIs):
 *  - OpenAI chat: messages[] with role system|developer|user|assistant|tool;
 *    content is a string or a list of {type:"text", text}; assistant
 *    messages may carry tool_calls[{id, type:"function", function:{name,
 *    arguments}}] and reasoning_content; tool messages carry tool_call_id.
 *    tools[{type:"function", function:{name, description, parameters}}].
 *  - OpenAI Responses: instructions (system) and input (a string or a list of
 *    message items, function_call and function_call_output items, reasoning
 *    items); tools are flat {type:"function", name, description, parameters}.
 *  - Anthropic Messages: system (string or text blocks), messages[] whose
 *    content is a string or blocks text|thinking|tool_use|tool_result;
 *    tools[{name, description, input_schema}]; max_tokens is required.
 * Every error names the field, so a client author sees what to fix.
 */
#include "server/api_request.h"
#include "server/dsml_grammar.h"
#include "server/json_grammar.h"
#include "server/thinking_signature.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Upper bounds that keep a hostile body from making us allocate or loop in
 * proportion to anything but its own size. */
static api_limits g_limits = {100000, 4096, 500000};

void api_request_set_limits(const api_limits *l) { g_limits = *l; }

size_t api_json_count_values(const char *body, size_t len)
{
    size_t n = 0;
    bool in_str = false, esc = false, in_scalar = false;
    for (size_t i = 0; i < len; i++) {
        char ch = body[i];
        if (in_str) {
            if (esc) esc = false;
            else if (ch == '\\') esc = true;
            else if (ch == '"') in_str = false;
            continue;
        }
        switch (ch) {
        case '"': n++; in_str = true; in_scalar = false; break;
        case '{': case '[': n++; in_scalar = false; break;
        case '}': case ']': case ',': case ':': case ' ': case '\t': case '\n': case '\r': in_scalar = false; break;
        default:
            if (!in_scalar) n++;
            in_scalar = true;
        }
    }
    return n;
}

typedef struct {
    api_request *r;
    api_error *err;
} pctx;

static int fail(pctx *c, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(pctx *c, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err->message, sizeof c->err->message, fmt, ap);
    va_end(ap);
    snprintf(c->err->param, sizeof c->err->param, "%s", param ? param : "");
    c->err->status = 400;
    return -1;
}

static char *xstrdup(const char *s)
{
    size_t n = strlen(s);
    char *p = malloc(n + 1);
    if (p) memcpy(p, s, n + 1);
    return p;
}

const char *api_kind_name(api_kind k)
{
    switch (k) {
    case API_CHAT: return "chat.completions";
    case API_COMPLETIONS: return "completions";
    case API_RESPONSES: return "responses";
    case API_MESSAGES: return "messages";
    }
    return "?";
}

int api_model_alias_thinking(const char *model)
{
    if (!model) return -1;
    if (!strcmp(model, "deepseek-chat")) return 0;
    if (!strcmp(model, "deepseek-reasoner")) return 1;
    size_t n = strlen(model);
    if (n > 8 && !strcmp(model + n - 8, "-nothink")) return 0;
    return -1;
}

/* ---- growable string ---------------------------------------------------- */

typedef struct { char *p; size_t len, cap; } sbuf;

static int sb_add(sbuf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < b->len + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return -1;
        b->p = q; b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

static char *sb_take(sbuf *b)
{
    if (!b->p) return xstrdup("");
    char *p = b->p;
    b->p = NULL; b->len = b->cap = 0;
    return p;
}

/* ---- field helpers --------------------------------------------------------- */

/* Optional number field; sets *out and returns 1 if present, 0 if absent or
 * null, -1 on a wrong type or range. */
static int get_number(pctx *c, json_t *obj, const char *key, double lo, double hi,
                      double *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return fail(c, key, "'%s' must be a number", key);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi))
        return fail(c, key, "'%s' = %g is out of range [%g, %g]", key, d, lo, hi);
    *out = d;
    return 1;
}

static int get_int(pctx *c, json_t *obj, const char *key, long long lo, long long hi,
                   long long *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) return fail(c, key, "'%s' must be an integer", key);
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return fail(c, key, "'%s' = %lld is out of range [%lld, %lld]", key, x, lo, hi);
    *out = x;
    return 1;
}

static int get_bool(pctx *c, json_t *obj, const char *key, bool *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return fail(c, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 1;
}

/* Text of a content value: a string, or a list of parts of which the text
 * ones ({type: text|input_text|output_text, text}) are joined with "\n\n".
 * Other part types (images, files) are rejected: this model reads text. */
static int content_text(pctx *c, json_t *v, const char *path, char **out)
{
    if (!v || json_is_null(v)) { *out = xstrdup(""); return *out ? 0 : -1; }
    if (json_is_string(v)) {
        *out = xstrdup(json_string_value(v));
        return *out ? 0 : fail(c, path, "out of memory");
    }
    if (!json_is_array(v))
        return fail(c, path, "'%s' must be a string or an array of content parts", path);
    sbuf b = {0};
    size_t i;
    json_t *part;
    json_array_foreach(v, i, part) {
        char p[96];
        snprintf(p, sizeof p, "%s[%zu]", path, i);
        if (json_is_string(part)) {
            if (b.len) sb_add(&b, "\n\n", 2);
            sb_add(&b, json_string_value(part), strlen(json_string_value(part)));
            continue;
        }
        if (!json_is_object(part)) { free(b.p); return fail(c, p, "'%s' must be an object", p); }
        const char *type = json_string_value(json_object_get(part, "type"));
        json_t *text = json_object_get(part, "text");
        if (type && strcmp(type, "text") && strcmp(type, "input_text") &&
            strcmp(type, "output_text") && strcmp(type, "reasoning_text") &&
            strcmp(type, "summary_text")) {
            free(b.p);
            return fail(c, p, "'%s' has unsupported content type '%s' (only text)", p, type);
        }
        if (!json_is_string(text)) { free(b.p); return fail(c, p, "'%s.text' must be a string", p); }
        if (b.len) sb_add(&b, "\n\n", 2);
        sb_add(&b, json_string_value(text), json_string_length(text));
    }
    *out = sb_take(&b);
    return *out ? 0 : fail(c, path, "out of memory");
}

static api_message *push_msg(pctx *c, api_role role)
{
    api_request *r = c->r;
    if (r->n_msgs >= g_limits.max_messages) {
        fail(c, "messages", "more than %zu messages (--max-messages)", g_limits.max_messages);
        return NULL;
    }
    api_message *m = realloc(r->msgs, (r->n_msgs + 1) * sizeof *m);
    if (!m) { fail(c, "messages", "out of memory"); return NULL; }
    r->msgs = m;
    m = &r->msgs[r->n_msgs++];
    memset(m, 0, sizeof *m);
    m->role = role;
    return m;
}

/* Tool names: what OpenAI (^[a-zA-Z0-9_-]{1,64}$) and Anthropic (the same
 * characters, up to 128) accept. A name is written into the DSML of the
 * prompt (invoke name="...") and is what the tool_choice name filter
 * matches token by token, so a quote, '>' or a name no sampled text can
 * spell would break the call instead of failing here. */
#define TOOL_NAME_MAX 128

static int check_tool_name(pctx *c, const char *name, const char *path)
{
    size_t n = strlen(name);
    bool ok = n >= 1 && n <= TOOL_NAME_MAX;
    for (size_t i = 0; ok && i < n; i++) {
        unsigned char ch = (unsigned char)name[i];
        ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
             ch == '-';
    }
    if (ok) return 0;
    return fail(c, path, "'%s' is not a valid tool name: it must match ^[a-zA-Z0-9_-]{1,%d}$ (got %zu bytes)", path,
                TOOL_NAME_MAX, n);
}

static int push_call(pctx *c, api_message *m, const char *id, const char *name,
                     const char *args, const char *path)
{
    char np[96];
    snprintf(np, sizeof np, "%s.name", path);
    if (check_tool_name(c, name, np) < 0) return -1;
    api_tool_call *k = realloc(m->calls, (m->n_calls + 1) * sizeof *k);
    if (!k) return fail(c, path, "out of memory");
    m->calls = k;
    k = &m->calls[m->n_calls++];
    k->id = id ? xstrdup(id) : NULL;
    k->name = xstrdup(name);
    k->arguments = xstrdup(args && *args ? args : "{}");
    return 0;
}

/* Python json.dumps(obj, ensure_ascii=False) shape: jansson without
 * JSON_COMPACT writes ", " and ": ", keeps insertion order and raw UTF-8. */
static char *python_json(json_t *v)
{
    return json_dumps(v, JSON_ENCODE_ANY | JSON_REAL_PRECISION(17));
}

static void note_left_out(pctx *c, const char *what)
{
    char *lo = c->r->left_out;
    size_t n = strlen(lo);
    if (n + strlen(what) + 3 >= sizeof c->r->left_out) return;
    snprintf(lo + n, sizeof c->r->left_out - n, "%s%s", n ? ", " : "", what);
}

const api_tool *api_request_tool(const api_request *r, const char *name)
{
    for (size_t i = 0; name && i < r->n_tools; i++)
        if (!strcmp(r->tools[i].name, name)) return &r->tools[i];
    return NULL;
}

/* Codex's flat form of a namespaced tool: "NS__name", the namespace's
 * trailing and the name's leading underscores trimmed. malloc'd. */
static char *qualified_name(const char *ns, const char *name)
{
    size_t nl = strlen(ns);
    while (nl && ns[nl - 1] == '_') nl--;
    while (*name == '_') name++;
    size_t len = nl + 2 + strlen(name);
    char *q = malloc(len + 1);
    if (q) snprintf(q, len + 1, "%.*s__%s", (int)nl, ns, name);
    return q;
}

/* A strict tool's schema is followed exactly when its call is forced
 * (server/dsml_grammar.h). One the grammar cannot take is refused when the
 * request forces the tool (check_forced_strict), not otherwise: the model
 * may call it freely then. Returns the reason (malloc'd) or NULL. */
static char *strict_problem(const char *name, json_t *params)
{
    char *text = params && json_is_object(params) ? json_dumps(params, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    dg_tool t = {name, text};
    char err[160];
    dsml_grammar *g = dsml_grammar_new(&t, 1, err, sizeof err);
    free(text);
    if (g) { dsml_grammar_free(g); return NULL; }
    return xstrdup(err);
}

static int push_tool(pctx *c, const char *name, json_t *desc, json_t *params, bool strict,
                     const char *path)
{
    api_request *r = c->r;
    if (r->n_tools >= g_limits.max_tools)
        return fail(c, "tools", "more than %zu tools (--max-tools)", g_limits.max_tools);
    char np[96];
    snprintf(np, sizeof np, "%s.name", path);
    if (check_tool_name(c, name, np) < 0) return -1;
    if (desc && !json_is_null(desc) && !json_is_string(desc))
        return fail(c, path, "'%s.description' must be a string", path);
    if (params && !json_is_null(params) && !json_is_object(params))
        return fail(c, path, "'%s.parameters' must be an object", path);
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(name));
    if (desc && json_is_string(desc)) json_object_set(o, "description", desc);
    if (params && json_is_object(params)) json_object_set(o, "parameters", params);
    char *s = python_json(o);
    json_decref(o);
    api_tool *t = realloc(r->tools, (r->n_tools + 1) * sizeof *t);
    if (!t || !s) { free(s); if (t) r->tools = t; return fail(c, "tools", "out of memory"); }
    r->tools = t;
    t = &r->tools[r->n_tools++];
    t->name = xstrdup(name);
    t->schema_json = s;
    t->ns = t->local = NULL;
    t->strict = strict;
    t->strict_error = strict ? strict_problem(name, params) : NULL;
    snprintf(t->strict_param, sizeof t->strict_param, "%s.%s", path,
             c->r->kind == API_MESSAGES ? "input_schema" : "parameters");
    return 0;
}

/* A Responses namespace group ({"type":"namespace","name","tools":[...]},
 * Codex's MCP servers and agent tools): each function in it becomes a tool
 * of the qualified name, and calls of it go back as {namespace, name}. */
static int push_namespace(pctx *c, json_t *t, const char *p)
{
    const char *ns = json_string_value(json_object_get(t, "name"));
    json_t *inner = json_object_get(t, "tools");
    if (!ns || !*ns) return fail(c, p, "'%s.name' must be a non-empty string", p);
    if (!json_is_array(inner)) return fail(c, p, "'%s.tools' must be an array", p);
    size_t i;
    json_t *f;
    json_array_foreach(inner, i, f) {
        char q[96];
        snprintf(q, sizeof q, "%s.tools[%zu]", p, i);
        if (!json_is_object(f)) return fail(c, q, "'%s' must be an object", q);
        const char *type = json_string_value(json_object_get(f, "type"));
        const char *name = json_string_value(json_object_get(f, "name"));
        if (type && strcmp(type, "function")) {
            char what[96];
            snprintf(what, sizeof what, "%s.%s", ns, name ? name : type);
            note_left_out(c, what);
            continue;
        }
        if (!name || !*name) return fail(c, q, "'%s' has no 'name' string", q);
        char *flat = qualified_name(ns, name);
        if (!flat) return fail(c, q, "out of memory");
        int rc = push_tool(c, flat, json_object_get(f, "description"), json_object_get(f, "parameters"),
                           json_is_true(json_object_get(f, "strict")), q);
        free(flat);
        if (rc < 0) return -1;
        api_tool *at = &c->r->tools[c->r->n_tools - 1];
        at->ns = xstrdup(ns);
        at->local = xstrdup(name);
    }
    return 0;
}

/* ---- common knobs -------------------------------------------------------- */

static int parse_effort(pctx *c, const char *path, json_t *v)
{
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return fail(c, path, "'%s' must be a string", path);
    const char *e = json_string_value(v);
    if (!strcmp(e, "none")) { c->r->thinking = 0; return 0; }
    if (!strcmp(e, "max")) { c->r->thinking = 1; c->r->think_max = true; return 0; }
    if (!strcmp(e, "xhigh") || !strcmp(e, "high") || !strcmp(e, "medium") ||
        !strcmp(e, "low") || !strcmp(e, "minimal")) {
        c->r->thinking = 1;
        return 0;
    }
    return fail(c, path, "'%s' = '%s' is not one of none, minimal, low, medium, high, xhigh, max",
                path, e);
}

/* thinking: {"type":"enabled"|"disabled"|"adaptive"} or a boolean; think: bool */
static int parse_thinking(pctx *c, json_t *root)
{
    json_t *t = json_object_get(root, "thinking");
    if (t && !json_is_null(t)) {
        if (json_is_boolean(t)) c->r->thinking = json_is_true(t);
        else if (json_is_object(t)) {
            const char *ty = json_string_value(json_object_get(t, "type"));
            if (!ty) return fail(c, "thinking.type", "'thinking.type' must be a string");
            if (!strcmp(ty, "disabled")) c->r->thinking = 0;
            else if (!strcmp(ty, "enabled") || !strcmp(ty, "adaptive")) c->r->thinking = 1;
            else return fail(c, "thinking.type", "'thinking.type' = '%s' is not enabled or disabled", ty);
        } else return fail(c, "thinking", "'thinking' must be an object or a boolean");
    }
    bool b;
    int k = get_bool(c, root, "think", &b);
    if (k < 0) return -1;
    if (k) c->r->thinking = b;
    if (parse_effort(c, "reasoning_effort", json_object_get(root, "reasoning_effort")) < 0) return -1;
    json_t *reasoning = json_object_get(root, "reasoning");
    if (reasoning && json_is_object(reasoning) &&
        parse_effort(c, "reasoning.effort", json_object_get(reasoning, "effort")) < 0) return -1;
    json_t *oc = json_object_get(root, "output_config");
    if (oc && json_is_object(oc) &&
        parse_effort(c, "output_config.effort", json_object_get(oc, "effort")) < 0) return -1;
    return 0;
}

static int parse_stop(pctx *c, json_t *root, const char *key)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 0;
    if (json_is_string(v)) {
        if (json_string_length(v) == 0) return 0;
        c->r->stop[c->r->n_stop++] = xstrdup(json_string_value(v));
        return 0;
    }
    if (!json_is_array(v)) return fail(c, key, "'%s' must be a string or an array of strings", key);
    if (json_array_size(v) > API_MAX_STOP)
        return fail(c, key, "'%s' has %zu entries, at most %d allowed", key, json_array_size(v), API_MAX_STOP);
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        if (!json_is_string(s)) return fail(c, key, "'%s[%zu]' must be a string", key, i);
        if (json_string_length(s) == 0) continue;
        c->r->stop[c->r->n_stop++] = xstrdup(json_string_value(s));
    }
    return 0;
}

/* n > 1 and log-probabilities are not implemented: they used to be
 * ignored silently (one choice, no logprobs), which a client cannot tell
 * from a real answer, so they are refused. The values that ask for nothing
 * (n 1, logprobs false or 0, top_logprobs 0, best_of 1) are accepted. */
static int refuse_unsupported(pctx *c, json_t *root)
{
    static const char *const one[] = {"n", "best_of"};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(root, one[i]);
        if (!v || json_is_null(v)) continue;
        if (!json_is_integer(v)) return fail(c, one[i], "'%s' must be an integer", one[i]);
        if (json_integer_value(v) != 1)
            return fail(c, one[i], "'%s' = %lld is not supported: this server returns one choice (use 1 or leave it out)",
                        one[i], (long long)json_integer_value(v));
    }
    json_t *lp = json_object_get(root, "logprobs");
    if (lp && !json_is_null(lp) && !json_is_false(lp) && !(json_is_integer(lp) && json_integer_value(lp) == 0))
        return fail(c, "logprobs", "'logprobs' is not supported by this server (leave it out or false)");
    json_t *tl = json_object_get(root, "top_logprobs");
    if (tl && !json_is_null(tl) && !(json_is_integer(tl) && json_integer_value(tl) == 0))
        return fail(c, "top_logprobs", "'top_logprobs' is not supported by this server (leave it out or 0)");
    json_t *inc = json_object_get(root, "include");
    for (size_t i = 0; json_is_array(inc) && i < json_array_size(inc); i++) {
        const char *s = json_string_value(json_array_get(inc, i));
        if (s && strstr(s, "logprobs"))
            return fail(c, "include", "'include' asks for '%s', which this server does not support", s);
    }
    return 0;
}

static int parse_sampling(pctx *c, json_t *root)
{
    api_request *r = c->r;
    double d;
    long long x;
    int k;
    if (refuse_unsupported(c, root) < 0) return -1;
    if ((k = get_number(c, root, "temperature", 0, 2, &d)) < 0) return -1;
    if (k) r->temperature = d;
    if ((k = get_number(c, root, "top_p", 0, 1, &d)) < 0) return -1;
    if (k) r->top_p = d;
    if ((k = get_number(c, root, "min_p", 0, 1, &d)) < 0) return -1;
    if (k) r->min_p = d;
    if ((k = get_int(c, root, "top_k", 0, 1 << 20, &x)) < 0) return -1;
    if (k) r->top_k = (int)x;
    json_t *seed = json_object_get(root, "seed");
    if (seed && !json_is_null(seed)) {
        if (!json_is_integer(seed)) return fail(c, "seed", "'seed' must be an integer");
        r->has_seed = true;
        r->seed = (uint64_t)json_integer_value(seed);
    }
    static const char *const max_keys[] = {"max_tokens", "max_completion_tokens",
                                           "max_output_tokens"};
    for (int i = 0; i < 3; i++) {
        if ((k = get_int(c, root, max_keys[i], 1, 1 << 30, &x)) < 0) return -1;
        if (k) r->max_tokens = (int)x;
    }
    if (get_bool(c, root, "stream", &r->stream) < 0) return -1;
    json_t *so = json_object_get(root, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return fail(c, "stream_options", "'stream_options' must be an object");
        json_t *iu = json_object_get(so, "include_usage");
        if (iu && !json_is_boolean(iu))
            return fail(c, "stream_options.include_usage", "'stream_options.include_usage' must be a boolean");
        r->include_usage = iu && json_is_true(iu);
    }
    json_t *model = json_object_get(root, "model");
    if (model && !json_is_null(model)) {
        if (!json_is_string(model)) return fail(c, "model", "'model' must be a string");
        r->model = xstrdup(json_string_value(model));
        int t = api_model_alias_thinking(r->model);
        if (t >= 0) r->thinking = t;
    }
    return parse_thinking(c, root);
}

/* tool_choice: "auto" | "none" | "required" | "any" (Anthropic) |
 * {type:"function", function:{name}} (chat) | {type:"function", name}
 * (Responses) | {type:"tool", name} (Anthropic) | {type:"auto"|"any"|"none"}. */
static int parse_tool_choice(pctx *c, json_t *root)
{
    json_t *v = json_object_get(root, "tool_choice");
    if (!v || json_is_null(v)) return 0;
    const char *s = json_string_value(v);
    if (json_is_object(v)) s = json_string_value(json_object_get(v, "type"));
    if (!s) return fail(c, "tool_choice", "'tool_choice' must be a string or an object with a 'type'");
    api_request *r = c->r;
    if (!strcmp(s, "auto")) r->tool_choice = TOOL_CHOICE_AUTO;
    else if (!strcmp(s, "none")) r->tool_choice = TOOL_CHOICE_NONE;
    else if (!strcmp(s, "required") || !strcmp(s, "any")) r->tool_choice = TOOL_CHOICE_REQUIRED;
    else if (json_is_object(v) && (!strcmp(s, "function") || !strcmp(s, "tool"))) {
        json_t *fn = json_object_get(v, "function");
        const char *name = json_string_value(json_object_get(json_is_object(fn) ? fn : v, "name"));
        if (!name) return fail(c, "tool_choice", "'tool_choice' names no function");
        r->tool_choice = TOOL_CHOICE_NAMED;
        r->tool_choice_name = xstrdup(name);
    } else return fail(c, "tool_choice", "'tool_choice' = '%s' is not auto, none, required or a named function", s);
    if (r->tool_choice == TOOL_CHOICE_REQUIRED && r->n_tools == 0)
        return fail(c, "tool_choice", "'tool_choice' = '%s' needs at least one tool in 'tools'", s);
    if (r->tool_choice == TOOL_CHOICE_NAMED) {
        bool found = false;
        for (size_t i = 0; i < r->n_tools; i++)
            if (!strcmp(r->tools[i].name, r->tool_choice_name)) found = true;
        if (!found)
            return fail(c, "tool_choice", "'tool_choice' names '%s', which is not in 'tools'", r->tool_choice_name);
    }
    return 0;
}

/* A forced call of a strict tool follows its schema: a schema the grammar
 * cannot take is a 400 naming it (as OpenAI refuses a strict schema it
 * cannot enforce). */
static int check_forced_strict(pctx *c)
{
    api_request *r = c->r;
    if (r->tool_choice != TOOL_CHOICE_REQUIRED && r->tool_choice != TOOL_CHOICE_NAMED) return 0;
    for (size_t i = 0; i < r->n_tools; i++) {
        const api_tool *t = &r->tools[i];
        if (!t->strict_error) continue;
        if (r->tool_choice == TOOL_CHOICE_NAMED && strcmp(t->name, r->tool_choice_name)) continue;
        return fail(c, t->strict_param, "'%s' (strict, and the call is forced): %s", t->strict_param, t->strict_error);
    }
    return 0;
}

/* ---- lists of objects ---------------------------------------------------------- */

/* Chat and Messages both carry the conversation as "messages": required,
 * an array, not empty. */
static int messages_array(pctx *c, json_t *root, json_t **msgs)
{
    *msgs = json_object_get(root, "messages");
    if (!*msgs) return fail(c, "messages", "'messages' is required");
    if (!json_is_array(*msgs)) return fail(c, "messages", "'messages' must be an array");
    if (json_array_size(*msgs) == 0) return fail(c, "messages", "'messages' must not be empty");
    return 0;
}

/* Element i of the list `key` ("messages", "input", "tools") must be an object;
 * path gets its name ("messages[3]"), which the caller's errors start with. */
static int element_object(pctx *c, json_t *v, const char *key, size_t i, char *path, size_t path_size)
{
    snprintf(path, path_size, "%s[%zu]", key, i);
    if (!json_is_object(v)) return fail(c, path, "'%s' must be an object", path);
    return 0;
}

static int parse_tools(pctx *c, json_t *root)
{
    json_t *v = json_object_get(root, "tools");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_array(v)) return fail(c, "tools", "'tools' must be an array");
    size_t i;
    json_t *t;
    json_array_foreach(v, i, t) {
        char p[64];
        if (element_object(c, t, "tools", i, p, sizeof p) < 0) return -1;
        json_t *fn = t;
        const char *type = json_string_value(json_object_get(t, "type"));
        json_t *params_key = NULL;
        if (c->r->kind == API_CHAT) {
            if (type && strcmp(type, "function"))
                return fail(c, p, "'%s.type' = '%s' is not 'function'", p, type);
            fn = json_object_get(t, "function");
            if (!json_is_object(fn)) return fail(c, p, "'%s.function' must be an object", p);
            params_key = json_object_get(fn, "parameters");
        } else if (c->r->kind == API_RESPONSES) {
            if (type && !strcmp(type, "namespace")) {
                if (push_namespace(c, t, p) < 0) return -1;
                continue;
            }
            if (type && strcmp(type, "function")) {
                /* hosted tools (web_search, file_search, code_interpreter,
                 * image_generation, mcp, ...) run at the provider: no
                 * client runs them for us, so the model is not offered them */
                note_left_out(c, type);
                continue;
            }
            params_key = json_object_get(fn, "parameters");
        } else {
            /* Anthropic: server tools (web_search_..., code_execution_...)
             * carry a type other than "custom"; the provider runs them, so
             * the model is not offered them here. */
            if (type && strcmp(type, "custom")) {
                note_left_out(c, type);
                continue;
            }
            params_key = json_object_get(fn, "input_schema");
        }
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (!name || !*name) return fail(c, p, "'%s' has no 'name' string", p);
        if (push_tool(c, name, json_object_get(fn, "description"), params_key,
                      json_is_true(json_object_get(fn, "strict")), p) < 0) return -1;
    }
    return 0;
}

/* ---- OpenAI chat ------------------------------------------------------------ */

static int parse_chat_messages(pctx *c, json_t *root)
{
    json_t *msgs;
    if (messages_array(c, root, &msgs) < 0) return -1;
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        char p[64];
        if (element_object(c, m, "messages", i, p, sizeof p) < 0) return -1;
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role) return fail(c, p, "'%s.role' must be a string", p);
        api_role r;
        if (!strcmp(role, "system") || !strcmp(role, "developer")) r = ROLE_SYSTEM;
        else if (!strcmp(role, "user")) r = ROLE_USER;
        else if (!strcmp(role, "assistant")) r = ROLE_ASSISTANT;
        else if (!strcmp(role, "tool") || !strcmp(role, "function")) r = ROLE_TOOL;
        else return fail(c, p, "'%s.role' = '%s' is not system, developer, user, assistant or tool", p, role);
        api_message *am = push_msg(c, r);
        if (!am) return -1;
        char cp[96];
        snprintf(cp, sizeof cp, "%s.content", p);
        if (content_text(c, json_object_get(m, "content"), cp, &am->content) < 0) return -1;
        if (r == ROLE_TOOL) {
            json_t *id = json_object_get(m, "tool_call_id");
            if (id && !json_is_string(id)) return fail(c, p, "'%s.tool_call_id' must be a string", p);
            am->tool_call_id = id ? xstrdup(json_string_value(id)) : NULL;
        }
        if (r != ROLE_ASSISTANT) continue;
        json_t *rc = json_object_get(m, "reasoning_content");
        if (!rc || json_is_null(rc)) rc = json_object_get(m, "reasoning");
        if (rc && !json_is_null(rc)) {
            if (!json_is_string(rc)) return fail(c, p, "'%s.reasoning_content' must be a string", p);
            am->reasoning = xstrdup(json_string_value(rc));
        }
        json_t *tc = json_object_get(m, "tool_calls");
        if (!tc || json_is_null(tc)) continue;
        if (!json_is_array(tc)) return fail(c, p, "'%s.tool_calls' must be an array", p);
        size_t j;
        json_t *call;
        json_array_foreach(tc, j, call) {
            char q[128];
            snprintf(q, sizeof q, "%s.tool_calls[%zu]", p, j);
            json_t *fn = json_object_get(call, "function");
            if (!json_is_object(fn)) return fail(c, q, "'%s.function' must be an object", q);
            const char *name = json_string_value(json_object_get(fn, "name"));
            if (!name) return fail(c, q, "'%s.function.name' must be a string", q);
            json_t *args = json_object_get(fn, "arguments");
            char *dumped = NULL;
            const char *a = "{}";
            if (json_is_string(args)) a = json_string_value(args);
            else if (json_is_object(args)) a = dumped = json_dumps(args, JSON_COMPACT);
            else if (args && !json_is_null(args))
                return fail(c, q, "'%s.function.arguments' must be a string", q);
            int rc2 = push_call(c, am, json_string_value(json_object_get(call, "id")), name, a, q);
            free(dumped);
            if (rc2 < 0) return -1;
        }
    }
    return 0;
}

/* ---- OpenAI Responses --------------------------------------------------------- */

/* Responses item types of the public API that carry nothing the prompt
 * renders (hosted tools run by the provider, custom-grammar tools, which
 * are not offered here, item references and compactions). */
static bool replayed_item_type(const char *t)
{
    static const char *const known[] = {
        "web_search_call", "file_search_call", "computer_call", "computer_call_output",
        "code_interpreter_call", "image_generation_call", "local_shell_call", "local_shell_call_output",
        "shell_call", "shell_call_output", "apply_patch_call", "apply_patch_call_output",
        "mcp_call", "mcp_list_tools", "mcp_approval_request", "mcp_approval_response",
        "custom_tool_call", "custom_tool_call_output", "tool_search_call", "tool_search_output",
        "item_reference", "compaction", "compaction_summary",
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(t, known[i])) return true;
    return false;
}

static int parse_responses_input(pctx *c, json_t *root)
{
    json_t *ins = json_object_get(root, "instructions");
    if (ins && !json_is_null(ins)) {
        if (!json_is_string(ins)) return fail(c, "instructions", "'instructions' must be a string");
        api_message *m = push_msg(c, ROLE_SYSTEM);
        if (!m) return -1;
        m->content = xstrdup(json_string_value(ins));
    }
    json_t *in = json_object_get(root, "input");
    if (!in) return fail(c, "input", "'input' is required");
    if (json_is_string(in)) {
        api_message *m = push_msg(c, ROLE_USER);
        if (!m) return -1;
        m->content = xstrdup(json_string_value(in));
        return 0;
    }
    if (!json_is_array(in)) return fail(c, "input", "'input' must be a string or an array");
    size_t i;
    json_t *it;
    json_array_foreach(in, i, it) {
        char p[64];
        if (element_object(c, it, "input", i, p, sizeof p) < 0) return -1;
        const char *type = json_string_value(json_object_get(it, "type"));
        const char *role = json_string_value(json_object_get(it, "role"));
        if (!type || !strcmp(type, "message")) {
            if (!role) return fail(c, p, "'%s.role' must be a string", p);
            api_role r;
            if (!strcmp(role, "system") || !strcmp(role, "developer")) r = ROLE_SYSTEM;
            else if (!strcmp(role, "user")) r = ROLE_USER;
            else if (!strcmp(role, "assistant")) r = ROLE_ASSISTANT;
            else return fail(c, p, "'%s.role' = '%s' is not system, developer, user or assistant", p, role);
            /* An assistant message right after a reasoning item or a function
             * call of the same turn joins it. */
            api_message *m = NULL;
            if (r == ROLE_ASSISTANT && c->r->n_msgs &&
                c->r->msgs[c->r->n_msgs - 1].role == ROLE_ASSISTANT &&
                c->r->msgs[c->r->n_msgs - 1].content[0] == 0 &&
                c->r->msgs[c->r->n_msgs - 1].n_calls == 0)
                m = &c->r->msgs[c->r->n_msgs - 1];
            else if (!(m = push_msg(c, r))) return -1;
            free(m->content);
            m->content = NULL;
            char cp[96];
            snprintf(cp, sizeof cp, "%s.content", p);
            if (content_text(c, json_object_get(it, "content"), cp, &m->content) < 0) return -1;
        } else if (!strcmp(type, "function_call")) {
            const char *name = json_string_value(json_object_get(it, "name"));
            const char *args = json_string_value(json_object_get(it, "arguments"));
            const char *id = json_string_value(json_object_get(it, "call_id"));
            const char *ns = json_string_value(json_object_get(it, "namespace"));
            if (!name) return fail(c, p, "'%s.name' must be a string", p);
            if (!args) return fail(c, p, "'%s.arguments' must be a string", p);
            api_message *m = c->r->n_msgs ? &c->r->msgs[c->r->n_msgs - 1] : NULL;
            if (!m || m->role != ROLE_ASSISTANT) {
                if (!(m = push_msg(c, ROLE_ASSISTANT))) return -1;
                m->content = xstrdup("");
            }
            /* a namespaced call renders under the name the model wrote */
            char *flat = ns && *ns ? qualified_name(ns, name) : NULL;
            int rc = push_call(c, m, id, flat ? flat : name, args, p);
            free(flat);
            if (rc < 0) return -1;
        } else if (!strcmp(type, "function_call_output")) {
            json_t *out = json_object_get(it, "output");
            const char *id = json_string_value(json_object_get(it, "call_id"));
            api_message *m = push_msg(c, ROLE_TOOL);
            if (!m) return -1;
            m->tool_call_id = id ? xstrdup(id) : NULL;
            char cp[96];
            snprintf(cp, sizeof cp, "%s.output", p);
            if (content_text(c, out, cp, &m->content) < 0) return -1;
        } else if (!strcmp(type, "reasoning")) {
            /* summary[] / content[] of {type, text}; becomes the reasoning of
             * the assistant turn that follows. */
            api_message *m = push_msg(c, ROLE_ASSISTANT);
            if (!m) return -1;
            m->content = xstrdup("");
            json_t *parts = json_object_get(it, "content");
            if (!json_is_array(parts)) parts = json_object_get(it, "summary");
            char cp[96];
            snprintf(cp, sizeof cp, "%s.summary", p);
            /* our encrypted_content carries the reasoning as sampled
             * (thinking_signature.h); clients that keep only it (Codex,
             * store=false) get their prefix back */
            size_t sl = 0;
            m->reasoning = thinking_signature_open(
                json_string_value(json_object_get(it, "encrypted_content")), &sl);
            if (!m->reasoning && json_is_array(parts) && content_text(c, parts, cp, &m->reasoning) < 0)
                return -1;
            if (!m->reasoning) m->reasoning = xstrdup("");
        } else if (replayed_item_type(type)) {
            /* Items a client replays from its history that have nothing to
             * render here (hosted tool calls, references, compactions,
             * calls of tools we do not offer): left out, the trace says so. */
            char what[80];
            snprintf(what, sizeof what, "item %.60s", type);
            note_left_out(c, what);
        } else {
            return fail(c, p, "'%s.type' = '%s' is not supported", p, type);
        }
    }
    return 0;
}

/* ---- Anthropic Messages -------------------------------------------------------- */

static int parse_anthropic(pctx *c, json_t *root)
{
    json_t *sys = json_object_get(root, "system");
    if (sys && !json_is_null(sys)) {
        api_message *m = push_msg(c, ROLE_SYSTEM);
        if (!m) return -1;
        if (content_text(c, sys, "system", &m->content) < 0) return -1;
    }
    json_t *msgs;
    if (messages_array(c, root, &msgs) < 0) return -1;
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        char p[64];
        if (element_object(c, m, "messages", i, p, sizeof p) < 0) return -1;
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role || (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system")))
            return fail(c, p, "'%s.role' must be 'user', 'assistant' or 'system'", p);
        bool asst = !strcmp(role, "assistant");
        json_t *content = json_object_get(m, "content");
        char cp[96];
        snprintf(cp, sizeof cp, "%s.content", p);
        if (!strcmp(role, "system")) {
            /* Claude Code sends system messages inside `messages` (its agent
             * and skill lists, beta mid-conversation-system): text only; the
             * renderer places them where they stand (prompt_render.c). */
            api_message *sm = push_msg(c, ROLE_SYSTEM);
            if (!sm) return -1;
            if (content_text(c, content, cp, &sm->content) < 0) return -1;
            continue;
        }
        if (json_is_string(content)) {
            api_message *am = push_msg(c, asst ? ROLE_ASSISTANT : ROLE_USER);
            if (!am) return -1;
            am->content = xstrdup(json_string_value(content));
            continue;
        }
        if (!json_is_array(content)) return fail(c, cp, "'%s' must be a string or an array of blocks", cp);
        /* Blocks in order: tool_result blocks become tool messages, text
         * blocks the user/assistant text, thinking the reasoning, tool_use
         * the calls. */
        api_message *cur = NULL;
        sbuf text = {0};
        size_t j;
        json_t *b;
        json_array_foreach(content, j, b) {
            char q[128];
            snprintf(q, sizeof q, "%s[%zu]", cp, j);
            const char *type = json_is_object(b) ? json_string_value(json_object_get(b, "type")) : NULL;
            if (!type) { free(text.p); return fail(c, q, "'%s.type' must be a string", q); }
            if (!strcmp(type, "text")) {
                json_t *t = json_object_get(b, "text");
                if (!json_is_string(t)) { free(text.p); return fail(c, q, "'%s.text' must be a string", q); }
                if (text.len) sb_add(&text, "\n\n", 2);
                sb_add(&text, json_string_value(t), json_string_length(t));
            } else if (!strcmp(type, "thinking") || !strcmp(type, "redacted_thinking")) {
                if (!asst) { free(text.p); return fail(c, q, "'%s' thinking blocks belong to assistant messages", q); }
                if (!cur && !(cur = push_msg(c, ROLE_ASSISTANT))) { free(text.p); return -1; }
                /* Our own signature carries the reasoning as sampled: it
                 * wins over the text, which clients may omit or rewrite. */
                json_t *t = json_object_get(b, "thinking");
                size_t sl = 0;
                char *signed_text = thinking_signature_open(
                    json_string_value(json_object_get(b, "signature")), &sl);
                if (signed_text) {
                    free(cur->reasoning);
                    cur->reasoning = signed_text;
                } else if (json_is_string(t)) {
                    free(cur->reasoning);
                    cur->reasoning = xstrdup(json_string_value(t));
                }
            } else if (!strcmp(type, "tool_use")) {
                if (!asst) { free(text.p); return fail(c, q, "'%s' tool_use blocks belong to assistant messages", q); }
                if (!cur && !(cur = push_msg(c, ROLE_ASSISTANT))) { free(text.p); return -1; }
                const char *name = json_string_value(json_object_get(b, "name"));
                json_t *input = json_object_get(b, "input");
                if (!name) { free(text.p); return fail(c, q, "'%s.name' must be a string", q); }
                if (input && !json_is_object(input)) { free(text.p); return fail(c, q, "'%s.input' must be an object", q); }
                char *a = input ? json_dumps(input, JSON_COMPACT) : NULL;
                int rc = push_call(c, cur, json_string_value(json_object_get(b, "id")), name, a, q);
                free(a);
                if (rc < 0) { free(text.p); return -1; }
            } else if (!strcmp(type, "tool_result")) {
                if (asst) { free(text.p); return fail(c, q, "'%s' tool_result blocks belong to user messages", q); }
                api_message *tm = push_msg(c, ROLE_TOOL);
                if (!tm) { free(text.p); return -1; }
                const char *id = json_string_value(json_object_get(b, "tool_use_id"));
                tm->tool_call_id = id ? xstrdup(id) : NULL;
                if (content_text(c, json_object_get(b, "content"), q, &tm->content) < 0) { free(text.p); return -1; }
            } else {
                free(text.p);
                return fail(c, q, "'%s.type' = '%s' is not supported", q, type);
            }
        }
        if (asst) {
            if (!cur && !(cur = push_msg(c, ROLE_ASSISTANT))) { free(text.p); return -1; }
            cur->content = sb_take(&text);
        } else if (text.len || json_array_size(content) == 0) {
            api_message *um = push_msg(c, ROLE_USER);
            if (!um) { free(text.p); return -1; }
            um->content = sb_take(&text);
        } else free(text.p);
    }
    return 0;
}

/* ---- structured output ------------------------------------------------------------ */

/* {type: text | json_object | json_schema, ...}: the schema is `schema_key`
 * inside `holder` (OpenAI chat nests it in json_schema, the others do not). */
static int parse_format(pctx *c, json_t *f, const char *path)
{
    if (!f || json_is_null(f)) return 0;
    if (!json_is_object(f)) return fail(c, path, "'%s' must be an object", path);
    const char *type = json_string_value(json_object_get(f, "type"));
    if (!type) return fail(c, path, "'%s.type' must be a string", path);
    if (!strcmp(type, "text")) return 0;
    if (!strcmp(type, "json_object")) { c->r->response_format = RF_JSON_OBJECT; return 0; }
    if (strcmp(type, "json_schema"))
        return fail(c, path, "'%s.type' = '%s' is not text, json_object or json_schema", path, type);
    json_t *holder = json_object_get(f, "json_schema");
    json_t *schema = json_object_get(json_is_object(holder) ? holder : f, "schema");
    char sp[96];
    snprintf(sp, sizeof sp, "%s%s.schema", path, json_is_object(holder) ? ".json_schema" : "");
    if (!json_is_object(schema)) return fail(c, sp, "'%s' must be an object", sp);
    char *text = json_dumps(schema, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text) return fail(c, sp, "out of memory");
    char err[160];
    json_grammar *g = json_grammar_new(text, err, sizeof err);
    if (!g) { free(text); return fail(c, sp, "'%s': %s", sp, err); }
    json_grammar_free(g);
    c->r->response_format = RF_JSON_SCHEMA;
    c->r->rf_schema = text;
    return 0;
}

static int parse_response_format(pctx *c, json_t *root)
{
    switch (c->r->kind) {
    case API_CHAT:
    case API_COMPLETIONS:
        return parse_format(c, json_object_get(root, "response_format"), "response_format");
    case API_RESPONSES: {
        json_t *t = json_object_get(root, "text");
        return json_is_object(t) ? parse_format(c, json_object_get(t, "format"), "text.format") : 0;
    }
    case API_MESSAGES: {
        json_t *oc = json_object_get(root, "output_config");
        if (json_is_object(oc) && json_object_get(oc, "format"))
            return parse_format(c, json_object_get(oc, "format"), "output_config.format");
        return parse_format(c, json_object_get(root, "output_format"), "output_format");
    }
    }
    return 0;
}

/* ---- entry ------------------------------------------------------------------------ */

static void fix_null_contents(api_request *r)
{
    for (size_t i = 0; i < r->n_msgs; i++)
        if (!r->msgs[i].content) r->msgs[i].content = xstrdup("");
}

int api_request_parse(api_kind kind, const char *body, size_t len,
                      api_request *out, api_error *err)
{
    memset(out, 0, sizeof *out);
    memset(err, 0, sizeof *err);
    out->kind = kind;
    out->max_tokens = -1;
    out->temperature = out->top_p = out->min_p = -1;
    out->top_k = -1;
    out->thinking = -1;
    pctx c = {out, err};
    size_t values = api_json_count_values(body, len);
    if (values > g_limits.max_json_values) {
        snprintf(err->message, sizeof err->message,
                 "the request holds %zu JSON values, more than the limit of %zu (--max-json-values)", values,
                 g_limits.max_json_values);
        err->status = 413;
        return -1;
    }
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        snprintf(err->message, sizeof err->message, "malformed JSON at line %d column %d: %s",
                 je.line, je.column, je.text);
        err->status = 400;
        return -1;
    }
    int rc = -1;
    if (!json_is_object(root)) { fail(&c, "", "the request body must be a JSON object"); goto done; }
    if (parse_sampling(&c, root) < 0) goto done;
    if (parse_tools(&c, root) < 0) goto done;
    if (parse_tool_choice(&c, root) < 0) goto done;
    if (check_forced_strict(&c) < 0) goto done;
    if (parse_stop(&c, root, kind == API_MESSAGES ? "stop_sequences" : "stop") < 0) goto done;
    if (parse_response_format(&c, root) < 0) goto done;
    switch (kind) {
    case API_CHAT:
        if (parse_chat_messages(&c, root) < 0) goto done;
        break;
    case API_COMPLETIONS: {
        json_t *p = json_object_get(root, "prompt");
        if (json_is_array(p) && json_array_size(p) == 1) p = json_array_get(p, 0);
        if (!json_is_string(p)) { fail(&c, "prompt", "'prompt' must be a string"); goto done; }
        out->prompt = xstrdup(json_string_value(p));
        break;
    }
    case API_RESPONSES:
        if (parse_responses_input(&c, root) < 0) goto done;
        break;
    case API_MESSAGES:
        if (out->max_tokens < 0) { fail(&c, "max_tokens", "'max_tokens' is required"); goto done; }
        if (parse_anthropic(&c, root) < 0) goto done;
        break;
    }
    fix_null_contents(out);
    rc = 0;
done:
    json_decref(root);
    if (rc < 0) {
        api_error keep = *err;
        api_request_free(out);
        *err = keep;
    }
    return rc;
}

void api_request_free(api_request *r)
{
    if (!r) return;
    for (size_t i = 0; i < r->n_msgs; i++) {
        api_message *m = &r->msgs[i];
        free(m->content);
        free(m->reasoning);
        free(m->tool_call_id);
        for (size_t j = 0; j < m->n_calls; j++) {
            free(m->calls[j].id);
            free(m->calls[j].name);
            free(m->calls[j].arguments);
        }
        free(m->calls);
    }
    free(r->msgs);
    for (size_t i = 0; i < r->n_tools; i++) {
        free(r->tools[i].name);
        free(r->tools[i].schema_json);
        free(r->tools[i].ns);
        free(r->tools[i].local);
        free(r->tools[i].strict_error);
    }
    free(r->tools);
    for (size_t i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->model);
    free(r->prompt);
    free(r->tool_choice_name);
    free(r->rf_schema);
    api_kind k = r->kind;
    memset(r, 0, sizeof *r);
    r->kind = k;
}

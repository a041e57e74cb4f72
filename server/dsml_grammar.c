/*
 * dsml_grammar.c - see the header. The state walks the block a byte at a
 * time: fixed DSML text (a few alternatives at a time, none a prefix of
 * another), a tool name, a parameter name, or a value. A value is handed
 * to the property's json_grammar: JSON as it is (string="false"), raw text
 * as the JSON string it becomes (string="true": a '"' first, each byte
 * escaped as jansson writes it, so an enum's spelling compares byte for
 * byte). The closing tag's bytes are held back while they match it: they
 * are value bytes if the match breaks.
 */
#include "server/dsml_grammar.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/json_grammar.h"

#define D "\xEF\xBD\x9C" "DSML\xEF\xBD\x9C" /* ｜DSML｜ */
#define MAX_KEY 128
#define MAX_PROPS 64

/* the fixed pieces of the block */
enum {
    L_PARAM_OPEN,   /* a parameter tag up to its name */
    L_INVOKE_END0,  /* the end of a call without parameters */
    L_INVOKE_END,
    L_STR_ATTR,     /* after the parameter's name */
    L_TRUE,         /* string="true"> : raw text */
    L_FALSE,        /* string="false"> : JSON */
    L_NL,           /* after a parameter */
    L_BLOCK_END,
    L_NEXT_INVOKE,  /* another call (when any tool may be called) */
    L_NAME_END,     /* after a tool's name */
    L_COUNT
};
static const char *const lits[L_COUNT] = {
    "<" D "parameter name=\"", "\n</" D "invoke>", "</" D "invoke>", "\" string=\"", "true\">", "false\">",
    "\n", "\n</" D "tool_calls>", "\n<" D "invoke name=\"", "\">\n",
};
static const char tag_end[] = "</" D "parameter>";
#define TAG_LEN (sizeof tag_end - 1)
/* past "</｜DSML｜" the tag must be finished: the marker is never value text */
#define TAG_COMMIT (2 + sizeof D - 1)

typedef struct {
    char *name;
    int n_props;
    char **keys;
    json_grammar **vals;
    uint64_t str_ok, json_ok;  /* per property: string="true" / "false" values possible */
    uint64_t required;
    bool extra_ok;             /* keys beyond the declared ones (values: any) */
} tooldef;

struct dsml_grammar {
    tooldef *t;
    size_t n;
    json_grammar *any;         /* the values of extra keys */
};

typedef enum { P_LIT, P_NAME, P_KEY, P_VALUE, P_DONE } phase;

/* What a byte changes; copied whole to try bytes (dg_accepts). */
typedef struct {
    phase ph;
    uint16_t cand;             /* P_LIT: the literals still possible */
    uint16_t pos;              /* P_LIT: bytes matched; P_NAME/P_KEY: buffer length */
    int tool;                  /* the call being written, -1 before its name */
    int prop;                  /* the parameter being written, -1: an extra key */
    uint64_t seen;             /* declared parameters written */
    int n_params;              /* parameters of this call */
    bool named;                /* one call of a named tool: no second invoke */
    bool str;                  /* P_VALUE: raw text */
    bool started;              /* P_VALUE (JSON): a non-space byte came */
    uint8_t k;                 /* P_VALUE: bytes of the closing tag held back */
    bool real;                 /* feeding for real (not trying) */
    jg_state *js;              /* P_VALUE: the value so far */
    char buf[MAX_KEY];         /* P_NAME / P_KEY */
} core;

struct dg_state {
    const dsml_grammar *g;
    core c;
    jg_state *scratch;         /* the value's state while bytes are tried */
    char *extra;               /* extra keys of this call, NUL-separated */
    size_t extra_len, extra_cap;
    /* the bytes that may come next, worked out once per fed token: the
     * sampler asks about every token of the vocabulary, and most fail on
     * their first byte */
    bool first_known;
    uint64_t first_ok[4];
};

/* ---- compile ----------------------------------------------------------------- */

static void tool_free(tooldef *t)
{
    for (int i = 0; i < t->n_props; i++) {
        free(t->keys[i]);
        json_grammar_free(t->vals[i]);
    }
    free(t->keys);
    free(t->vals);
    free(t->name);
}

void dsml_grammar_free(dsml_grammar *g)
{
    if (!g) return;
    for (size_t i = 0; i < g->n; i++) tool_free(&g->t[i]);
    free(g->t);
    json_grammar_free(g->any);
    free(g);
}

/* Which value forms a fresh value of vg can take. */
static void value_modes(const json_grammar *vg, bool *str_ok, bool *json_ok)
{
    jg_state *s = jg_state_new(vg);
    *str_ok = *json_ok = false;
    if (!s) return;
    *str_ok = jg_accepts(s, "\"", 1);
    static const char starts[] = "{[-0123456789tfn";
    for (const char *p = starts; *p && !*json_ok; p++) *json_ok = jg_accepts(s, p, 1);
    jg_state_free(s);
}

static int compile_tool(tooldef *t, const dg_tool *in, char *err, size_t es)
{
    t->name = strdup(in->name);
    if (!t->name) { snprintf(err, es, "out of memory"); return -1; }
    if (strlen(in->name) >= MAX_KEY) { snprintf(err, es, "tool name '%.40s' too long", in->name); return -1; }
    json_t *s = NULL;
    if (in->schema_json) {
        json_error_t je;
        s = json_loads(in->schema_json, 0, &je);
        if (!s) { snprintf(err, es, "input schema is not JSON: %s", je.text); return -1; }
    }
    int rc = -1;
    const char *type = json_string_value(json_object_get(s, "type"));
    if (s && (!json_is_object(s) || (json_object_size(s) && (!type || strcmp(type, "object"))))) {
        snprintf(err, es, "the input schema of '%.40s' is not {\"type\":\"object\",...}", in->name);
        goto out;
    }
    json_t *props = json_object_get(s, "properties"), *ap = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) { snprintf(err, es, "'properties' must be an object"); goto out; }
    /* as json_grammar reads an object schema */
    t->extra_ok = json_object_size(props) == 0 ? s && !json_is_false(ap) : json_is_true(ap) || json_is_object(ap);
    size_t np = json_object_size(props);
    if (np > MAX_PROPS) { snprintf(err, es, "more than %d properties", MAX_PROPS); goto out; }
    t->keys = calloc(np ? np : 1, sizeof *t->keys);
    t->vals = calloc(np ? np : 1, sizeof *t->vals);
    if (!t->keys || !t->vals) { snprintf(err, es, "out of memory"); goto out; }
    const char *k;
    json_t *v;
    json_object_foreach(props, k, v) {
        if (strlen(k) == 0 || strlen(k) >= MAX_KEY || strchr(k, '"')) {
            snprintf(err, es, "property name '%.40s' cannot be a DSML parameter name", k);
            goto out;
        }
        int i = t->n_props++;
        t->keys[i] = strdup(k);
        char *vs = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        t->vals[i] = vs ? json_grammar_new_opts(vs, JG_LONG_STRINGS, err, es) : NULL;
        free(vs);
        if (!t->keys[i] || !t->vals[i]) {
            char why[160];
            snprintf(why, sizeof why, "%s", err[0] ? err : "out of memory");
            snprintf(err, es, "property '%.40s': %s", k, why);
            goto out;
        }
        bool so, jo;
        value_modes(t->vals[i], &so, &jo);
        if (so) t->str_ok |= 1ull << i;
        if (jo) t->json_ok |= 1ull << i;
    }
    json_t *req = json_object_get(s, "required");
    size_t ri;
    json_t *r;
    json_array_foreach(req, ri, r) {
        int found = -1;
        for (int j = 0; json_is_string(r) && j < t->n_props; j++)
            if (!strcmp(t->keys[j], json_string_value(r))) found = j;
        if (found < 0) { snprintf(err, es, "required property '%.40s' is not in properties", json_string_value(r) ? json_string_value(r) : "?"); goto out; }
        t->required |= 1ull << found;
    }
    rc = 0;
out:
    json_decref(s);
    return rc;
}

dsml_grammar *dsml_grammar_new(const dg_tool *tools, size_t n, char *err, size_t es)
{
    err[0] = 0;
    dsml_grammar *g = calloc(1, sizeof *g);
    if (!g || !(g->t = calloc(n ? n : 1, sizeof *g->t)) ||
        !(g->any = json_grammar_new_opts("{}", JG_LONG_STRINGS, err, es))) {
        snprintf(err, es, "out of memory");
        dsml_grammar_free(g);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        g->n++;
        if (compile_tool(&g->t[i], &tools[i], err, es) < 0) {
            dsml_grammar_free(g);
            return NULL;
        }
    }
    return g;
}

/* ---- the matcher ---------------------------------------------------------------- */

static void between(const dg_state *s, core *c);

dg_state *dg_state_new(const dsml_grammar *g, int named)
{
    dg_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->g = g;
    s->c.js = jg_state_new(g->any);
    s->scratch = jg_state_new(g->any);
    if (!s->c.js || !s->scratch) { dg_state_free(s); return NULL; }
    if (named >= 0 && (size_t)named >= g->n) { dg_state_free(s); return NULL; }
    s->c.named = named >= 0;
    s->c.tool = named;
    s->c.ph = P_NAME;
    if (named >= 0) between(s, &s->c); /* a call that has no parameters yet */
    return s;
}

void dg_state_free(dg_state *s)
{
    if (!s) return;
    jg_state_free(s->c.js);
    jg_state_free(s->scratch);
    free(s->extra);
    free(s);
}

static const tooldef *cur_tool(const dg_state *s, const core *c) { return &s->g->t[c->tool]; }

/* Can another parameter be written in this call? */
static bool more_keys(const dg_state *s, const core *c)
{
    const tooldef *t = cur_tool(s, c);
    if (t->extra_ok) return true;
    uint64_t all = t->n_props >= 64 ? ~0ull : (1ull << t->n_props) - 1;
    return (c->seen & all) != all;
}

static void to_lits(core *c, unsigned cand)
{
    c->ph = P_LIT;
    c->cand = (uint16_t)cand;
    c->pos = 0;
}

/* Between the parameters of the current call. */
static void between(const dg_state *s, core *c)
{
    const tooldef *t = cur_tool(s, c);
    unsigned cand = more_keys(s, c) ? 1u << L_PARAM_OPEN : 0;
    if ((c->seen & t->required) == t->required) cand |= 1u << (c->n_params ? L_INVOKE_END : L_INVOKE_END0);
    to_lits(c, cand);
}

static bool key_seen_extra(const dg_state *s, const char *k, size_t n)
{
    for (size_t at = 0; at < s->extra_len; at += strlen(s->extra + at) + 1)
        if (strlen(s->extra + at) == n && !memcmp(s->extra + at, k, n)) return true;
    return false;
}

static int remember_extra(dg_state *s, const char *k, size_t n)
{
    if (s->extra_len + n + 1 > s->extra_cap) {
        size_t cap = (s->extra_len + n + 1) * 2;
        char *p = realloc(s->extra, cap);
        if (!p) return -1;
        s->extra = p;
        s->extra_cap = cap;
    }
    memcpy(s->extra + s->extra_len, k, n);
    s->extra[s->extra_len + n] = 0;
    s->extra_len += n + 1;
    return 0;
}

/* A fixed piece is complete. */
static int lit_done(dg_state *s, core *c, int which)
{
    const tooldef *t;
    switch (which) {
    case L_PARAM_OPEN: c->ph = P_KEY; c->pos = 0; return 0;
    case L_INVOKE_END0: case L_INVOKE_END:
        to_lits(c, c->named ? 1u << L_BLOCK_END : (1u << L_BLOCK_END) | (1u << L_NEXT_INVOKE));
        return 0;
    case L_STR_ATTR:
        t = cur_tool(s, c);
        if (c->prop < 0) to_lits(c, (1u << L_TRUE) | (1u << L_FALSE));
        else to_lits(c, (t->str_ok >> c->prop & 1 ? 1u << L_TRUE : 0) | (t->json_ok >> c->prop & 1 ? 1u << L_FALSE : 0));
        return c->cand ? 0 : -1;
    case L_TRUE: case L_FALSE:
        t = cur_tool(s, c);
        jg_state_reset(c->js, c->prop < 0 ? s->g->any : t->vals[c->prop]);
        c->ph = P_VALUE;
        c->str = which == L_TRUE;
        c->started = false;
        c->k = 0;
        return c->str ? jg_feed(c->js, "\"", 1) : 0;
    case L_NL: between(s, c); return 0;
    case L_BLOCK_END: c->ph = P_DONE; return 0;
    case L_NEXT_INVOKE: c->ph = P_NAME; c->pos = 0; c->tool = -1; return 0;
    case L_NAME_END:
        c->seen = 0;
        c->n_params = 0;
        if (c->real) s->extra_len = 0;
        between(s, c);
        return 0;
    }
    return -1;
}

/* Raw text byte -> the bytes of it inside a JSON string, as jansson
 * writes them (enum and const values are compared in that spelling). */
static size_t escape_byte(unsigned ch, char out[8])
{
    switch (ch) {
    case '"': memcpy(out, "\\\"", 2); return 2;
    case '\\': memcpy(out, "\\\\", 2); return 2;
    case '\b': memcpy(out, "\\b", 2); return 2;
    case '\f': memcpy(out, "\\f", 2); return 2;
    case '\n': memcpy(out, "\\n", 2); return 2;
    case '\r': memcpy(out, "\\r", 2); return 2;
    case '\t': memcpy(out, "\\t", 2); return 2;
    }
    if (ch < 0x20) { snprintf(out, 8, "\\u%04X", ch); return 6; }
    out[0] = (char)ch;
    return 1;
}

/* Value bytes (not the closing tag) into the value's grammar. */
static int value_bytes(core *c, const char *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned ch = (unsigned char)b[i];
        if (c->str) {
            char e[8];
            size_t el = escape_byte(ch, e);
            if (jg_feed(c->js, e, el) < 0) return -1;
            continue;
        }
        if (!c->started && ch != ' ' && ch != '\n' && ch != '\t' && ch != '\r') {
            /* a JSON string is written as raw text (string="true") */
            if (ch == '"') return -1;
            c->started = true;
        }
        if (jg_feed(c->js, (const char *)&b[i], 1) < 0) return -1;
    }
    return 0;
}

/* The value can end here (the closing tag would close it). */
static bool value_can_end(const core *c)
{
    return c->str ? jg_accepts_to_end(c->js, "\"", 1) : jg_done(c->js);
}

static int value_byte(dg_state *s, core *c, unsigned ch)
{
    if (c->k < TAG_LEN && ch == (unsigned char)tag_end[c->k]) {
        c->k++;
        if (c->k == TAG_LEN) {
            /* the parser ends the value here, whatever it is */
            if (!value_can_end(c)) return -1;
            if (c->str && jg_feed(c->js, "\"", 1) < 0) return -1;
            if (c->prop >= 0) c->seen |= 1ull << c->prop;
            c->n_params++;
            to_lits(c, 1u << L_NL);
            return 0;
        }
        /* held back: either the tag, or value bytes if the match breaks */
        if (value_can_end(c)) return 0;
        if (c->k >= TAG_COMMIT) return -1;
        return jg_accepts(c->js, tag_end, c->k) ? 0 : -1; /* no byte of the tag needs escaping */
    }
    if (c->k >= TAG_COMMIT) return -1;
    if (c->k) {
        /* the match broke: the held bytes were value bytes ('<' starts the
         * tag only, so the byte is looked at afresh) */
        uint8_t k = c->k;
        c->k = 0;
        if (value_bytes(c, tag_end, k) < 0) return -1;
        return value_byte(s, c, ch);
    }
    char b = (char)ch;
    return value_bytes(c, &b, 1);
}

static int feed_byte(dg_state *s, core *c, unsigned ch)
{
    const dsml_grammar *g = s->g;
    switch (c->ph) {
    case P_LIT: {
        unsigned keep = 0;
        int ended = -1;
        for (int i = 0; i < L_COUNT; i++) {
            if (!(c->cand >> i & 1)) continue;
            size_t ll = strlen(lits[i]);
            if (c->pos < ll && (unsigned char)lits[i][c->pos] == ch) {
                keep |= 1u << i;
                if ((size_t)c->pos + 1 == ll) ended = i;
            }
        }
        if (!keep) return -1;
        c->cand = (uint16_t)keep;
        c->pos++;
        return ended >= 0 ? lit_done(s, c, ended) : 0;
    }
    case P_NAME:
        if (ch == '"') {
            for (size_t i = 0; i < g->n; i++)
                if (strlen(g->t[i].name) == c->pos && !memcmp(g->t[i].name, c->buf, c->pos)) {
                    c->tool = (int)i;
                    to_lits(c, 1u << L_NAME_END);
                    c->pos = 1; /* the '"' of L_NAME_END */
                    return 0;
                }
            return -1;
        }
        if (c->pos + 1 >= MAX_KEY) return -1;
        for (size_t i = 0; i < g->n; i++)
            if (strlen(g->t[i].name) > c->pos && !memcmp(g->t[i].name, c->buf, c->pos) &&
                (unsigned char)g->t[i].name[c->pos] == ch) {
                c->buf[c->pos++] = (char)ch;
                return 0;
            }
        return -1;
    case P_KEY: {
        const tooldef *t = cur_tool(s, c);
        if (ch == '"') {
            if (c->pos == 0) return -1;
            int k = -1;
            bool declared = false;
            for (int i = 0; i < t->n_props; i++)
                if (strlen(t->keys[i]) == c->pos && !memcmp(t->keys[i], c->buf, c->pos)) {
                    declared = true;
                    if (!(c->seen >> i & 1)) k = i;
                }
            if (k < 0) {
                if (declared || !t->extra_ok || key_seen_extra(s, c->buf, c->pos)) return -1;
                if (c->real && remember_extra(s, c->buf, c->pos) < 0) return -1;
            }
            c->prop = k;
            to_lits(c, 1u << L_STR_ATTR);
            c->pos = 1; /* the '"' of L_STR_ATTR */
            return 0;
        }
        if (ch < 0x20 || c->pos + 1 >= MAX_KEY) return -1;
        if (!t->extra_ok) {
            bool any = false;
            for (int i = 0; i < t->n_props && !any; i++)
                any = !(c->seen >> i & 1) && strlen(t->keys[i]) > c->pos && !memcmp(t->keys[i], c->buf, c->pos) &&
                      (unsigned char)t->keys[i][c->pos] == ch;
            if (!any) return -1;
        }
        c->buf[c->pos++] = (char)ch;
        return 0;
    }
    case P_VALUE:
        return value_byte(s, c, ch);
    case P_DONE:
        return -1;
    }
    return -1;
}

static bool try_bytes(dg_state *s, const char *bytes, size_t n);

bool dg_accepts(dg_state *s, const char *bytes, size_t n)
{
    if (n == 0) return true;
    if (!s->first_known) {
        memset(s->first_ok, 0, sizeof s->first_ok);
        for (int b = 0; b < 256; b++) {
            char ch = (char)b;
            if (try_bytes(s, &ch, 1)) s->first_ok[b >> 6] |= 1ull << (b & 63);
        }
        s->first_known = true;
    }
    unsigned b0 = (unsigned char)bytes[0];
    if (!(s->first_ok[b0 >> 6] >> (b0 & 63) & 1)) return false;
    return n == 1 || try_bytes(s, bytes, n);
}

static bool try_bytes(dg_state *s, const char *bytes, size_t n)
{
    core c = s->c;
    c.real = false;
    c.js = s->scratch;
    if (s->c.ph == P_VALUE) jg_state_copy(s->scratch, s->c.js);
    for (size_t i = 0; i < n; i++)
        if (feed_byte(s, &c, (unsigned char)bytes[i]) < 0) return false;
    return true;
}

int dg_feed(dg_state *s, const char *bytes, size_t n)
{
    if (!dg_accepts(s, bytes, n)) return -1;
    s->first_known = false;
    s->c.real = true;
    for (size_t i = 0; i < n; i++)
        if (feed_byte(s, &s->c, (unsigned char)bytes[i]) < 0) return -1; /* not reached: tried above */
    return 0;
}

bool dg_done(const dg_state *s) { return s->c.ph == P_DONE; }

bool dg_marker_is_text(const dg_state *s)
{
    /* names and values are text; in a value the marker may only follow
     * "</" (the closing tag) */
    return (s->c.ph == P_VALUE && s->c.k != 2) || s->c.ph == P_KEY || s->c.ph == P_NAME;
}

/* ---- the shortest completion --------------------------------------------------------- */

/* The literal a completion takes among the candidates: toward the end. */
static int closing_lit(const dg_state *s, const core *c)
{
    static const int order[] = {L_BLOCK_END, L_INVOKE_END0, L_INVOKE_END, L_NL,   L_NAME_END,
                                L_STR_ATTR,  L_TRUE,        L_FALSE,      L_PARAM_OPEN, L_NEXT_INVOKE};
    (void)s;
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        if (c->cand >> order[i] & 1) return order[i];
    return -1;
}

/* JSON-string text -> the raw byte it stands for (its first character). */
static int unescape_first(const char *t, size_t n)
{
    if (n == 0) return -1;
    if (t[0] != '\\') return (unsigned char)t[0];
    if (n < 2) return -1;
    switch (t[1]) {
    case '"': return '"';
    case '\\': return '\\';
    case '/': return '/';
    case 'b': return '\b';
    case 'f': return '\f';
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case 'u': {
        unsigned v = 0;
        if (n < 6 || sscanf(t + 2, "%4x", &v) != 1 || v >= 0x20) return -1;
        return (int)v;
    }
    }
    return -1;
}

/* The next byte of the shortest completion; *structural: DSML text. */
static int next_byte(dg_state *s, const core *c, jg_state *tmp, bool *structural)
{
    const dsml_grammar *g = s->g;
    *structural = false;
    switch (c->ph) {
    case P_LIT: {
        int l = closing_lit(s, c);
        *structural = true;
        return l < 0 ? -1 : (unsigned char)lits[l][c->pos];
    }
    case P_NAME:
        for (size_t i = 0; i < g->n; i++)
            if (strlen(g->t[i].name) >= c->pos && !memcmp(g->t[i].name, c->buf, c->pos))
                return c->pos == strlen(g->t[i].name) ? '"' : (unsigned char)g->t[i].name[c->pos];
        return -1;
    case P_KEY: {
        const tooldef *t = cur_tool(s, c);
        int pick = -1;
        for (int pass = 0; pass < 2 && pick < 0; pass++)
            for (int i = 0; i < t->n_props && pick < 0; i++)
                if (!(c->seen >> i & 1) && (pass || t->required >> i & 1) && strlen(t->keys[i]) >= c->pos &&
                    !memcmp(t->keys[i], c->buf, c->pos))
                    pick = i;
        if (pick < 0) return c->pos ? '"' : 'x'; /* an extra key of its own */
        return c->pos == strlen(t->keys[pick]) ? '"' : (unsigned char)t->keys[pick][c->pos];
    }
    case P_VALUE: {
        if (value_can_end(c)) {
            *structural = true;
            return (unsigned char)tag_end[c->k];
        }
        /* the value's own shortest completion, held tag bytes taken as
         * value bytes first */
        core t = *c;
        jg_state_copy(tmp, c->js);
        t.js = tmp;
        if (t.k && value_bytes(&t, tag_end, t.k) < 0) return -1;
        size_t cl = 0;
        char *comp = jg_completion(tmp, &cl);
        int b = -1;
        if (comp) b = t.str ? unescape_first(comp, cl) : cl ? (unsigned char)comp[0] : -1;
        free(comp);
        return b;
    }
    case P_DONE:
        return -1;
    }
    return -1;
}

char *dg_completion(dg_state *s, size_t *len, ds4_spans *tpl)
{
    core c = s->c;
    c.real = false;
    jg_state *js = jg_state_new(s->g->any), *tmp = jg_state_new(s->g->any), *js0 = jg_state_new(s->g->any);
    size_t cap = 64, n = 0;
    char *out = malloc(cap);
    bool ok = js && tmp && js0 && out;
    if (ok) {
        jg_state_copy(js, s->c.js);
        c.js = js;
    }
    /* when the value's shortest form is not allowed here (a JSON string
     * under string="false": it is written as raw text), the first of these
     * bytes that is */
    static const char fallback[] = "n0tf[{-";
    for (int guard = 0; ok && c.ph != P_DONE && guard < 65536; guard++) {
        bool structural;
        int b = next_byte(s, &c, tmp, &structural);
        core c0 = c;
        jg_state_copy(js0, js);
        bool fed = b >= 0 && feed_byte(s, &c, (unsigned)b) == 0;
        for (const char *f = fallback; !fed && c.ph == P_VALUE && *f; f++) {
            c = c0;
            jg_state_copy(js, js0);
            b = (unsigned char)*f;
            fed = feed_byte(s, &c, (unsigned)b) == 0;
        }
        if (!fed) { ok = false; break; }
        if (n + 2 > cap) {
            char *q = realloc(out, cap *= 2);
            if (!q) { ok = false; break; }
            out = q;
        }
        if (structural && tpl) ds4_spans_add(tpl, n, 1);
        out[n++] = (char)b;
    }
    jg_state_free(js);
    jg_state_free(tmp);
    jg_state_free(js0);
    if (!ok || c.ph != P_DONE) { free(out); return NULL; }
    out[n] = 0;
    *len = n;
    return out;
}

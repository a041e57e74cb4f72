/*
 * json_grammar.c - see the header. The schema compiles into a tree of
 * nodes; the state is a stack of frames, one per open value, fed a byte
 * at a time. A number or a literal (true, an enum value) ends only when
 * the next byte cannot continue it; that byte then goes to the parent.
 */
#include "server/json_grammar.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 32
#define MAX_WS 4
#define MAX_STR 1024
#define MAX_ITEMS 256
#define MAX_DIGITS 32
#define MAX_INT_DIGITS 18 /* fits an int64 */
#define MAX_EXP_DIGITS 2  /* 1e99 at most: every parser holds it as a double */
#define MAX_KEY 128
#define MAX_LIT 64
#define MAX_PROPS 64

typedef enum { N_ANY, N_OBJECT, N_ARRAY, N_STRING, N_NUMBER, N_INTEGER, N_LITS, N_UNION } nkind;

typedef struct node node;
struct node {
    nkind kind;
    /* object */
    int n_props;
    char **names;         /* raw key text (no escapes in declared names) */
    node **props;
    uint64_t required;
    bool extra_ok;        /* keys beyond the declared ones (values: any) */
    /* array */
    node *items;
    int min_items, max_items;
    /* string */
    int max_len;
    /* literals: JSON texts (enum, const, true/false/null) */
    int n_lits;
    char **lits;
    /* union: branches */
    int n_alt;
    node **alt;
    node *next_alloc;     /* every node, for freeing */
};

struct json_grammar {
    int str_bound;        /* strings without maxLength: MAX_STR, or far more */
    node *root;
    node *all;
    node any;             /* shared "any value" */
    node tfn;             /* true / false / null */
};

typedef enum { F_VALUE, F_OBJ, F_ARR, F_STR, F_NUM, F_LIT, F_KEY } fkind;
enum { O_KEY_OR_CLOSE, O_COLON, O_AFTER_VALUE, O_KEY, A_VALUE_OR_CLOSE, A_AFTER, A_VALUE };

typedef struct {
    uint8_t kind, sub;
    uint16_t count;       /* array items; object: the property being read */
    uint32_t len;         /* string bytes, number digits, literal position */
    const node *n;
    uint64_t set;         /* object: properties seen; literal: candidates */
} frame;

struct jg_state {
    const json_grammar *g;
    int depth;            /* frames in use; 0 = the value is complete */
    int ws;               /* consecutive whitespace */
    uint32_t keylen;
    char key[MAX_KEY];
    frame f[MAX_DEPTH];
};

/* ---- schema -> nodes ----------------------------------------------------------- */

static node *new_node(json_grammar *g, nkind k)
{
    node *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->kind = k;
    n->max_len = g->str_bound;
    n->max_items = MAX_ITEMS;
    n->next_alloc = g->all;
    g->all = n;
    return n;
}

static char *dup_str(const char *s)
{
    size_t n = strlen(s);
    char *p = malloc(n + 1);
    if (p) memcpy(p, s, n + 1);
    return p;
}

static node *compile(json_grammar *g, json_t *s, int depth, char *err, size_t es);

static node *compile_type(json_grammar *g, json_t *s, const char *type, int depth, char *err, size_t es)
{
    node *n = NULL;
    if (!strcmp(type, "object")) {
        n = new_node(g, N_OBJECT);
        if (!n) return NULL;
        json_t *props = json_object_get(s, "properties");
        json_t *ap = json_object_get(s, "additionalProperties");
        n->extra_ok = !json_is_object(props) || json_object_size(props) == 0 ? !json_is_false(ap)
                                                                              : json_is_true(ap) || json_is_object(ap);
        if (json_is_object(props)) {
            size_t np = json_object_size(props);
            if (np > MAX_PROPS) { snprintf(err, es, "more than %d properties in one object", MAX_PROPS); return NULL; }
            n->names = calloc(np ? np : 1, sizeof *n->names);
            n->props = calloc(np ? np : 1, sizeof *n->props);
            if (!n->names || !n->props) return NULL;
            const char *k;
            json_t *v;
            json_object_foreach(props, k, v) {
                if (strlen(k) >= MAX_KEY || strpbrk(k, "\"\\") || strspn(k, "\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f")) {
                    snprintf(err, es, "property name '%.40s' is too long or needs escaping", k);
                    return NULL;
                }
                int i = n->n_props++; /* counted first: freed with the node on failure */
                n->names[i] = dup_str(k);
                if (!n->names[i] || !(n->props[i] = compile(g, v, depth + 1, err, es))) return NULL;
            }
        }
        json_t *req = json_object_get(s, "required");
        size_t i;
        json_t *r;
        if (json_is_array(req)) json_array_foreach(req, i, r) {
            int k = -1;
            for (int j = 0; json_is_string(r) && j < n->n_props; j++)
                if (!strcmp(n->names[j], json_string_value(r))) k = j;
            if (k < 0) { snprintf(err, es, "required property '%.40s' is not in properties", json_string_value(r) ? json_string_value(r) : "?"); return NULL; }
            n->required |= 1ull << k;
        }
    } else if (!strcmp(type, "array")) {
        n = new_node(g, N_ARRAY);
        if (!n) return NULL;
        json_t *it = json_object_get(s, "items");
        n->items = it ? compile(g, it, depth + 1, err, es) : &g->any;
        if (!n->items) return NULL;
        json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
        if (json_is_integer(mn)) n->min_items = (int)json_integer_value(mn);
        if (json_is_integer(mx) && json_integer_value(mx) < MAX_ITEMS) n->max_items = (int)json_integer_value(mx);
        if (n->min_items > n->max_items) { snprintf(err, es, "minItems above maxItems"); return NULL; }
    } else if (!strcmp(type, "string")) {
        n = new_node(g, N_STRING);
        if (!n) return NULL;
        json_t *ml = json_object_get(s, "maxLength");
        if (json_is_integer(ml) && json_integer_value(ml) >= 0 && json_integer_value(ml) < g->str_bound)
            n->max_len = (int)json_integer_value(ml);
    } else if (!strcmp(type, "number") || !strcmp(type, "integer")) {
        n = new_node(g, !strcmp(type, "number") ? N_NUMBER : N_INTEGER);
    } else if (!strcmp(type, "boolean") || !strcmp(type, "null")) {
        n = new_node(g, N_LITS);
        if (!n) return NULL;
        n->lits = calloc(2, sizeof *n->lits);
        if (!n->lits) return NULL;
        if (!strcmp(type, "null")) n->lits[n->n_lits++] = dup_str("null");
        else { n->lits[n->n_lits++] = dup_str("true"); n->lits[n->n_lits++] = dup_str("false"); }
    } else {
        snprintf(err, es, "unknown type '%.40s'", type);
        return NULL;
    }
    return n;
}

static node *compile(json_grammar *g, json_t *s, int depth, char *err, size_t es)
{
    if (depth >= MAX_DEPTH - 2) { snprintf(err, es, "schema nested deeper than %d", MAX_DEPTH - 2); return NULL; }
    if (json_is_true(s) || (json_is_object(s) && json_object_size(s) == 0)) return &g->any;
    if (!json_is_object(s)) { snprintf(err, es, "a schema must be an object"); return NULL; }
    if (json_object_get(s, "$ref")) { snprintf(err, es, "$ref is not supported"); return NULL; }
    json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (en || cn) {
        if (en && (!json_is_array(en) || json_array_size(en) == 0 || json_array_size(en) > MAX_LIT)) {
            snprintf(err, es, "enum must be an array of 1..%d values", MAX_LIT);
            return NULL;
        }
        node *n = new_node(g, N_LITS);
        if (!n) return NULL;
        size_t cnt = en ? json_array_size(en) : 1;
        n->lits = calloc(cnt, sizeof *n->lits);
        if (!n->lits) return NULL;
        for (size_t i = 0; i < cnt; i++) {
            char *t = json_dumps(en ? json_array_get(en, i) : cn, JSON_COMPACT | JSON_ENCODE_ANY);
            if (!t) return NULL;
            n->lits[n->n_lits++] = t;
        }
        return n;
    }
    json_t *any = json_object_get(s, "anyOf");
    if (!any) any = json_object_get(s, "oneOf");
    json_t *type = json_object_get(s, "type");
    if (json_is_array(any) || json_is_array(type)) {
        json_t *list = json_is_array(any) ? any : type;
        node *n = new_node(g, N_UNION);
        if (!n) return NULL;
        n->alt = calloc(json_array_size(list) + 1, sizeof *n->alt);
        if (!n->alt) return NULL;
        size_t i;
        json_t *v;
        json_array_foreach(list, i, v) {
            node *a = json_is_string(v) ? compile_type(g, s, json_string_value(v), depth, err, es)
                                        : compile(g, v, depth + 1, err, es);
            if (!a) return NULL;
            n->alt[n->n_alt++] = a;
        }
        return n;
    }
    if (json_is_string(type)) return compile_type(g, s, json_string_value(type), depth, err, es);
    return &g->any;
}

json_grammar *json_grammar_new_opts(const char *schema_json, unsigned flags, char *err, size_t es)
{
    json_grammar *g = calloc(1, sizeof *g);
    if (!g) { snprintf(err, es, "out of memory"); return NULL; }
    g->str_bound = flags & JG_LONG_STRINGS ? JG_LONG_STRING_BOUND : MAX_STR;
    g->any.kind = N_ANY;
    g->any.extra_ok = true;
    g->any.max_len = g->str_bound;
    g->any.max_items = MAX_ITEMS;
    g->any.items = &g->any;
    static char *tfn[] = {"true", "false", "null"};
    g->tfn.kind = N_LITS;
    g->tfn.n_lits = 3;
    g->tfn.lits = tfn;
    err[0] = 0;
    if (!schema_json) {
        /* json_object: an object of anything */
        g->root = new_node(g, N_OBJECT);
        if (g->root) g->root->extra_ok = true;
    } else {
        json_error_t je;
        json_t *s = json_loads(schema_json, 0, &je);
        if (!s) snprintf(err, es, "schema is not JSON: %s", je.text);
        else g->root = compile(g, s, 0, err, es);
        json_decref(s);
    }
    if (!g->root) {
        if (!err[0]) snprintf(err, es, "out of memory");
        json_grammar_free(g);
        return NULL;
    }
    return g;
}

json_grammar *json_grammar_new(const char *schema_json, char *err, size_t es)
{
    return json_grammar_new_opts(schema_json, 0, err, es);
}

void json_grammar_free(json_grammar *g)
{
    if (!g) return;
    for (node *n = g->all, *nx; n; n = nx) {
        nx = n->next_alloc;
        for (int i = 0; i < n->n_props; i++) free(n->names[i]);
        free(n->names);
        free(n->props);
        for (int i = 0; i < n->n_lits; i++) free(n->lits[i]);
        free(n->lits);
        free(n->alt);
        free(n);
    }
    free(g);
}

/* ---- the matcher ------------------------------------------------------------------ */

jg_state *jg_state_new(const json_grammar *g)
{
    jg_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->g = g;
    s->depth = 1;
    s->f[0] = (frame){.kind = F_VALUE, .n = g->root};
    return s;
}

void jg_state_free(jg_state *s) { free(s); }

void jg_state_reset(jg_state *s, const json_grammar *g)
{
    s->g = g;
    s->depth = 1;
    s->ws = 0;
    s->keylen = 0;
    s->f[0] = (frame){.kind = F_VALUE, .n = g->root};
}

void jg_state_copy(jg_state *dst, const jg_state *src)
{
    memcpy(dst, src, offsetof(jg_state, f) + (size_t)src->depth * sizeof(frame));
}

static bool is_ws(unsigned c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

static int ws_ok(jg_state *s) { return ++s->ws <= MAX_WS ? 0 : -1; }

/* The branch of a union (or the node itself) a value starting with c takes. */
static const node *branch(const json_grammar *g, const node *n, unsigned c)
{
    if (n->kind != N_UNION) return n;
    for (int i = 0; i < n->n_alt; i++) {
        const node *a = branch(g, n->alt[i], c);
        if (!a) continue; /* an inner union none of whose branches starts with c */
        switch (a->kind) {
        case N_ANY: return a;
        case N_OBJECT: if (c == '{') return a; break;
        case N_ARRAY: if (c == '[') return a; break;
        case N_STRING: if (c == '"') return a; break;
        case N_NUMBER: case N_INTEGER: if (c == '-' || (c >= '0' && c <= '9')) return a; break;
        case N_LITS:
            for (int k = 0; k < a->n_lits; k++) if ((unsigned char)a->lits[k][0] == c) return a;
            break;
        case N_UNION: break;
        }
    }
    return NULL;
}

static int feed_byte(jg_state *s, unsigned c);

/* The top frame's value is complete: pop it and tell the parent. */
static void value_done(jg_state *s)
{
    s->depth--;
    if (s->depth == 0) return;
    frame *p = &s->f[s->depth - 1];
    if (p->kind == F_OBJ) p->sub = O_AFTER_VALUE;
    else if (p->kind == F_ARR) { p->count++; p->sub = A_AFTER; }
}

static int push(jg_state *s, frame f)
{
    if (s->depth >= MAX_DEPTH) return -1;
    s->f[s->depth++] = f;
    return 0;
}

/* Start a value of node n with byte c (the current top frame is F_VALUE). */
static int start_value(jg_state *s, unsigned c)
{
    frame *f = &s->f[s->depth - 1];
    const node *n = branch(s->g, f->n, c);
    if (!n) return -1;
    nkind k = n->kind;
    if (k == N_ANY) {
        if (c == '{') k = N_OBJECT;
        else if (c == '[') k = N_ARRAY;
        else if (c == '"') k = N_STRING;
        else if (c == '-' || (c >= '0' && c <= '9')) k = N_NUMBER;
        else { n = &s->g->tfn; k = N_LITS; }
    }
    switch (k) {
    case N_OBJECT:
        if (c != '{') return -1;
        *f = (frame){.kind = F_OBJ, .sub = O_KEY_OR_CLOSE, .n = n};
        return 0;
    case N_ARRAY:
        if (c != '[') return -1;
        *f = (frame){.kind = F_ARR, .sub = A_VALUE_OR_CLOSE, .n = n};
        return 0;
    case N_STRING:
        if (c != '"') return -1;
        *f = (frame){.kind = F_STR, .n = n};
        return 0;
    case N_NUMBER: case N_INTEGER:
        *f = (frame){.kind = F_NUM, .n = n, .sub = 0};
        if (c == '-') return 0;
        return feed_byte(s, c);
    case N_LITS: {
        uint64_t all = n->n_lits >= 64 ? ~0ull : (1ull << n->n_lits) - 1;
        *f = (frame){.kind = F_LIT, .n = n, .set = all};
        return feed_byte(s, c);
    }
    default: return -1;
    }
}

static bool required_met(const frame *f) { return (f->set & f->n->required) == f->n->required; }

/* Can another key still be written in this object? */
static bool more_keys(const frame *f)
{
    if (f->n->extra_ok) return true;
    for (int i = 0; i < f->n->n_props; i++)
        if (!(f->set >> i & 1)) return true;
    return false;
}

static int feed_key(jg_state *s, frame *f, unsigned c)
{
    frame *obj = &s->f[s->depth - 2];
    const node *n = obj->n;
    if (c == '"') {
        /* the key is complete: which property? */
        int k = -1;
        for (int i = 0; i < n->n_props; i++)
            if (!(obj->set >> i & 1) && strlen(n->names[i]) == s->keylen && !memcmp(n->names[i], s->key, s->keylen)) k = i;
        if (k < 0 && !n->extra_ok) return -1;
        if (k >= 0) obj->set |= 1ull << k;
        obj->count = k < 0 ? 0xffff : (uint16_t)k;
        obj->sub = O_COLON;
        s->depth--;
        return 0;
    }
    if (c < 0x20 || c == '\\' || s->keylen + 1 >= MAX_KEY) return -1; /* keys: no escapes */
    if (!n->extra_ok) {
        bool any = false;
        for (int i = 0; i < n->n_props && !any; i++)
            any = !(obj->set >> i & 1) && strlen(n->names[i]) > s->keylen &&
                  !memcmp(n->names[i], s->key, s->keylen) && (unsigned char)n->names[i][s->keylen] == c;
        if (!any) return -1;
    }
    s->key[s->keylen++] = (char)c;
    (void)f;
    return 0;
}

static int feed_byte(jg_state *s, unsigned c)
{
    if (s->depth == 0) return is_ws(c) ? ws_ok(s) : -1;
    frame *f = &s->f[s->depth - 1];
    switch (f->kind) {
    case F_VALUE:
        if (is_ws(c)) return ws_ok(s);
        s->ws = 0;
        return start_value(s, c);
    case F_OBJ:
        if (is_ws(c)) return ws_ok(s);
        s->ws = 0;
        switch (f->sub) {
        case O_KEY_OR_CLOSE:
            if (c == '}') { if (!required_met(f)) return -1; value_done(s); return 0; }
            /* fall through */
        case O_KEY:
            if (c != '"' || !more_keys(f)) return -1;
            s->keylen = 0;
            return push(s, (frame){.kind = F_KEY, .n = f->n});
        case O_COLON:
            if (c != ':') return -1;
            f->sub = O_AFTER_VALUE; /* set again by value_done */
            return push(s, (frame){.kind = F_VALUE,
                                   .n = f->count == 0xffff ? &s->g->any : f->n->props[f->count]});
        case O_AFTER_VALUE:
            if (c == ',') { if (!more_keys(f)) return -1; f->sub = O_KEY; return 0; }
            if (c == '}') { if (!required_met(f)) return -1; value_done(s); return 0; }
            return -1;
        }
        return -1;
    case F_KEY:
        return feed_key(s, f, c);
    case F_ARR:
        if (is_ws(c)) return ws_ok(s);
        s->ws = 0;
        if (f->sub == A_VALUE_OR_CLOSE && c == ']') {
            if (f->count < f->n->min_items) return -1;
            value_done(s);
            return 0;
        }
        if (f->sub == A_AFTER) {
            if (c == ']') { if (f->count < f->n->min_items) return -1; value_done(s); return 0; }
            if (c != ',' || f->count >= f->n->max_items) return -1;
            f->sub = A_VALUE;
            return 0;
        }
        if (f->count >= f->n->max_items) return -1;
        if (push(s, (frame){.kind = F_VALUE, .n = f->n->items}) < 0) return -1;
        return start_value(s, c);
    case F_STR:
        if (f->sub == 0) {
            if (c == '"') { value_done(s); return 0; }
            if (c < 0x20 || f->len >= (uint32_t)f->n->max_len) return -1;
            f->len++;
            if (c == '\\') f->sub = 1;
            return 0;
        }
        if (f->sub == 1) {
            if (c == 'u') { f->sub = 2; return 0; }
            if (!strchr("\"\\/bfnrt", (int)c) || !c) return -1;
            f->sub = 0;
            return 0;
        }
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return -1;
        f->sub = f->sub == 5 ? 0 : f->sub + 1;
        return 0;
    case F_NUM: {
        bool digit = c >= '0' && c <= '9', integer = f->n->kind == N_INTEGER;
        if (digit && ++f->len > MAX_DIGITS) return -1;
        switch (f->sub) {
        case 0: if (!digit) return -1; f->sub = c == '0' ? 2 : 1; return 0;
        case 1: if (digit) return f->len <= MAX_INT_DIGITS ? 0 : -1; break;
        case 2: if (digit) return -1; break;
        case 3: if (!digit) return -1; f->sub = 4; return 0;
        case 4: if (digit) return 0; break;
        case 5: if (c == '+' || c == '-') { f->sub = 6; return 0; } if (!digit) return -1; f->sub = 7; f->count = 1; return 0;
        case 6: if (!digit) return -1; f->sub = 7; f->count = 1; return 0;
        case 7: if (digit) return ++f->count <= MAX_EXP_DIGITS ? 0 : -1; break;
        }
        /* subs 1, 2, 4, 7 can end here */
        if (!integer && c == '.' && (f->sub == 1 || f->sub == 2)) { f->sub = 3; return 0; }
        if (!integer && (c == 'e' || c == 'E') && f->sub != 7) { f->sub = 5; return 0; }
        value_done(s);
        return feed_byte(s, c);
    }
    case F_LIT: {
        uint64_t keep = 0;
        bool ended = false;
        for (int i = 0; i < f->n->n_lits; i++) {
            if (!(f->set >> i & 1)) continue;
            const char *l = f->n->lits[i];
            size_t ll = strlen(l);
            if (f->len < ll && (unsigned char)l[f->len] == c) keep |= 1ull << i;
            if (f->len == ll) ended = true;
        }
        if (keep) { f->set = keep; f->len++; return 0; }
        if (!ended) return -1;
        value_done(s);
        return feed_byte(s, c);
    }
    }
    return -1;
}

int jg_feed(jg_state *s, const char *bytes, size_t n)
{
    jg_state save;
    size_t hdr = offsetof(jg_state, f) + (size_t)s->depth * sizeof(frame);
    memcpy(&save, s, hdr);
    for (size_t i = 0; i < n; i++)
        if (feed_byte(s, (unsigned char)bytes[i]) < 0) {
            memcpy(s, &save, hdr);
            return -1;
        }
    return 0;
}

bool jg_accepts(const jg_state *s, const char *bytes, size_t n)
{
    /* a copy of the frames in use; most tokens fail on their first byte */
    jg_state t;
    memcpy(&t, s, offsetof(jg_state, f) + (size_t)s->depth * sizeof(frame));
    for (size_t i = 0; i < n; i++)
        if (feed_byte(&t, (unsigned char)bytes[i]) < 0) return false;
    return true;
}

bool jg_accepts_to_end(const jg_state *s, const char *bytes, size_t n)
{
    jg_state t;
    memcpy(&t, s, offsetof(jg_state, f) + (size_t)s->depth * sizeof(frame));
    for (size_t i = 0; i < n; i++)
        if (feed_byte(&t, (unsigned char)bytes[i]) < 0) return false;
    return jg_done(&t);
}

bool jg_done(const jg_state *s)
{
    if (s->depth == 0) return true;
    if (s->depth != 1) return false;
    /* a root number or literal ends with the text */
    jg_state t = *s;
    return feed_byte(&t, ' ') == 0 && t.depth == 0;
}

/* ---- the shortest completion ---------------------------------------------------------- */

static bool frame_can_end(const frame *f)
{
    if (f->kind == F_NUM) return f->sub == 1 || f->sub == 2 || f->sub == 4 || f->sub == 7;
    if (f->kind == F_LIT)
        for (int i = 0; i < f->n->n_lits; i++)
            if ((f->set >> i & 1) && strlen(f->n->lits[i]) == f->len) return true;
    return false;
}

static const node *shortest_alt(const node *n)
{
    if (n->kind != N_UNION || n->n_alt == 0) return n;
    for (int i = 0; i < n->n_alt; i++) /* a scalar first: it closes soonest */
        if (n->alt[i]->kind != N_OBJECT && n->alt[i]->kind != N_ARRAY) return shortest_alt(n->alt[i]);
    return shortest_alt(n->alt[0]);
}

/* The first byte of the shortest value of n. */
static char value_start(const node *n)
{
    n = shortest_alt(n);
    switch (n->kind) {
    case N_ANY: return 'n';
    case N_OBJECT: return '{';
    case N_ARRAY: return '[';
    case N_STRING: return '"';
    case N_NUMBER: case N_INTEGER: return '0';
    case N_LITS: {
        const char *best = n->lits[0];
        for (int i = 1; i < n->n_lits; i++) if (strlen(n->lits[i]) < strlen(best)) best = n->lits[i];
        return best[0];
    }
    default: return 'n';
    }
}

static int missing_required(const frame *f)
{
    for (int i = 0; i < f->n->n_props; i++)
        if ((f->n->required >> i & 1) && !(f->set >> i & 1)) return i;
    return -1;
}

/* The next byte of the shortest completion, decided by frame `lv`. */
static int next_byte(const jg_state *s, int lv)
{
    const frame *f = &s->f[lv];
    if (frame_can_end(f)) return lv > 0 ? next_byte(s, lv - 1) : -1;
    switch (f->kind) {
    case F_VALUE: return value_start(f->n);
    case F_STR: return f->sub == 0 ? '"' : f->sub == 1 ? 'n' : '0';
    case F_NUM: return '0';
    case F_LIT: {
        const char *best = NULL;
        for (int i = 0; i < f->n->n_lits; i++)
            if ((f->set >> i & 1) && (!best || strlen(f->n->lits[i]) < strlen(best))) best = f->n->lits[i];
        return best ? (unsigned char)best[f->len] : -1;
    }
    case F_KEY: {
        const frame *o = &s->f[lv - 1];
        const node *n = o->n;
        int pick = -1;
        for (int pass = 0; pass < 2 && pick < 0; pass++)
            for (int i = 0; i < n->n_props && pick < 0; i++) {
                if (o->set >> i & 1) continue;
                if (pass == 0 && !(n->required >> i & 1)) continue;
                if (strlen(n->names[i]) >= s->keylen && !memcmp(n->names[i], s->key, s->keylen)) pick = i;
            }
        if (pick < 0) return '"'; /* a key of its own (extra_ok) */
        return s->keylen == strlen(n->names[pick]) ? '"' : (unsigned char)n->names[pick][s->keylen];
    }
    case F_OBJ:
        switch (f->sub) {
        case O_COLON: return ':';
        case O_KEY: return '"';
        case O_KEY_OR_CLOSE: return missing_required(f) >= 0 ? '"' : '}';
        case O_AFTER_VALUE: return missing_required(f) >= 0 ? ',' : '}';
        }
        return -1;
    case F_ARR:
        if (f->sub == A_VALUE) return value_start(f->n->items);
        if (f->count < f->n->min_items) return f->sub == A_AFTER ? ',' : value_start(f->n->items);
        return ']';
    }
    return -1;
}

char *jg_completion(const jg_state *s, size_t *len)
{
    jg_state t;
    memcpy(&t, s, offsetof(jg_state, f) + (size_t)s->depth * sizeof(frame));
    size_t cap = 64, n = 0;
    char *out = malloc(cap);
    if (!out) return NULL;
    for (int guard = 0; !jg_done(&t) && guard < 65536; guard++) {
        int c = t.depth ? next_byte(&t, t.depth - 1) : -1;
        if (c < 0 || feed_byte(&t, (unsigned)c) < 0) { free(out); return NULL; }
        if (n + 2 > cap) {
            char *q = realloc(out, cap *= 2);
            if (!q) { free(out); return NULL; }
            out = q;
        }
        out[n++] = (char)c;
    }
    if (!jg_done(&t)) { free(out); return NULL; }
    out[n] = 0;
    *len = n;
    return out;
}

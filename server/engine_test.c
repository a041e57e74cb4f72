/*
 * engine_test.c - the scripted test engine behind `ds4-server --test-engine`.
 *
 * It is not a model. Its tokenizer maps the 7 special tokens of DeepSeek V4
 * to ids 0..6 and every other byte b to 16 + b (so multi-byte characters
 * arrive split across tokens, as real BPE does to DSML markers). Its
 * "generation" reads the live prompt and replies by a fixed script:
 *   - thinking mode: a short reasoning, then </think>;
 *   - tools declared and the user asks about the weather (no tool result
 *     yet): one DSML call get_weather(city="Rome", days=2);
 *   - a tool result in the last user turn: "The tool said: <result>";
 *   - otherwise: "Hello! You said: <the user's text>."
 *   - the answer already holds an open tool-call block (the server forced
 *     one, for tool_choice): the script completes the call, named as the
 *     forced text says, else get_weather when the user mentions the
 *     weather, else the first declared tool; one string parameter, the
 *     first property of the tool's schema, set to the user's text; a
 *     second call (of the next declared tool) when the user asks for
 *     "two calls". So a plain-text answer visibly becomes a call.
 * Sampling honours the server's token filter (srv_sampling.allow): when the
 * scripted token is not allowed, the lowest allowed token id is taken and
 * the script re-plans from the live text, as a model would.
 * The session is the token list, so snapshot/restore/prefix reuse behave
 * exactly like the real engine's contract. An optional per-token delay
 * makes prefills long enough to test keep-alives and disconnects. Each slot
 * (`--parallel N`) is such a session with its own script; a batched decode
 * step costs one token's delay however many sessions it advances (the
 * batched forward's aim: one read of the weights for all of them).
 */
#include "server/engine_port.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/prompt_render.h"

static const char *const SPECIALS[7] = {DS4_BOS, DS4_EOS, DS4_USER, DS4_ASSISTANT,
                                        DS4_THINK, DS4_ENDTHINK, DS4_DSML};
#define BYTE_BASE 16

typedef struct {
    int32_t *toks;
    size_t n, cap;
    char *reply;        /* scripted reply of the current turn */
    size_t reply_pos;
    int32_t *reply_toks;
    size_t n_reply;
} test_session;

typedef struct {
    srv_engine e;
    test_session *ss;   /* n_slots */
    int delay_us;
} test_engine;

static void nap(int us, size_t n)
{
    if (us <= 0 || n == 0) return;
    long long total = (long long)us * (long long)n;
    struct timespec ts = {total / 1000000, (total % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* Specials only inside the template ranges when tpl is given (text from
 * byte `base` of the prompt); everywhere when all_special. */
static int tokenize_in(const char *s, size_t len, bool all_special, const ds4_spans *tpl, size_t base,
                       int32_t **out, size_t *n)
{
    if (tpl && tpl->oom) return -1;
    int32_t *t = malloc((len ? len : 1) * sizeof *t);
    if (!t) return -1;
    size_t k = 0, sp_i = 0;
    for (size_t i = 0; i < len;) {
        int sp = -1;
        size_t room = all_special ? len - i : 0; /* bytes a special may span here */
        if (tpl) {
            while (sp_i < tpl->n && tpl->v[sp_i].off + tpl->v[sp_i].len <= base + i) sp_i++;
            if (sp_i < tpl->n && tpl->v[sp_i].off <= base + i) {
                size_t end = tpl->v[sp_i].off + tpl->v[sp_i].len - base;
                room = (end < len ? end : len) - i;
            }
        }
        for (int j = 0; j < 7; j++) {
            size_t l = strlen(SPECIALS[j]);
            if (l <= room && !memcmp(s + i, SPECIALS[j], l)) { sp = j; i += l; break; }
        }
        if (sp >= 0) t[k++] = sp;
        else t[k++] = BYTE_BASE + (unsigned char)s[i++];
    }
    *out = t;
    *n = k;
    return 0;
}

static int tokenize(srv_engine *e, const char *s, size_t len, int32_t **out, size_t *n)
{
    (void)e;
    return tokenize_in(s, len, true, NULL, 0, out, n);
}

static int tokenize_prompt(srv_engine *e, const char *s, size_t len, const ds4_spans *tpl, size_t base,
                           int32_t **out, size_t *n)
{
    (void)e;
    return tokenize_in(s, len, false, tpl, base, out, n);
}

static bool is_special(srv_engine *e, int32_t tok)
{
    (void)e;
    return tok >= 0 && tok < 7;
}

static int token_bytes(srv_engine *e, int32_t tok, char *buf, size_t cap)
{
    (void)e;
    if (tok >= 0 && tok < 7) {
        size_t l = strlen(SPECIALS[tok]);
        if (l > cap) return -1;
        memcpy(buf, SPECIALS[tok], l);
        return (int)l;
    }
    if (tok >= BYTE_BASE && tok < BYTE_BASE + 256 && cap >= 1) {
        buf[0] = (char)(tok - BYTE_BASE);
        return 1;
    }
    return -1;
}

static int push(test_engine *te, test_session *t, const int32_t *toks, size_t n)
{
    if (t->n + n > (size_t)te->e.ctx) {
        snprintf(te->e.err, sizeof te->e.err, "context full: %zu + %zu tokens > ctx %d",
                 t->n, n, te->e.ctx);
        return -1;
    }
    if (t->n + n > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 4096;
        while (cap < t->n + n) cap *= 2;
        int32_t *q = realloc(t->toks, cap * sizeof *q);
        if (!q) { snprintf(te->e.err, sizeof te->e.err, "out of memory"); return -1; }
        t->toks = q; t->cap = cap;
    }
    memcpy(t->toks + t->n, toks, n * sizeof *toks);
    t->n += n;
    return 0;
}

static void drop_reply(test_session *t)
{
    free(t->reply);
    free(t->reply_toks);
    t->reply = NULL;
    t->reply_toks = NULL;
    t->n_reply = t->reply_pos = 0;
}

static int reset(srv_engine *e, int slot)
{
    test_session *t = &((test_engine *)e)->ss[slot];
    t->n = 0;
    drop_reply(t);
    return 0;
}

static int prefill(srv_engine *e, int slot, const int32_t *toks, size_t n)
{
    test_engine *te = (test_engine *)e;
    test_session *t = &te->ss[slot];
    drop_reply(t);
    nap(te->delay_us, n);
    return push(te, t, toks, n);
}

static char *live_text(test_session *t, size_t *len)
{
    size_t cap = t->n * 16 + 1, k = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    for (size_t i = 0; i < t->n; i++) {
        int l = token_bytes(NULL, t->toks[i], s + k, cap - k);
        if (l > 0) k += (size_t)l;
    }
    s[k] = 0;
    *len = k;
    return s;
}

static const char *rfind(const char *s, const char *needle)
{
    const char *last = NULL;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle)) last = p;
    return last;
}

#define DSML_OPEN "<" DS4_DSML "tool_calls>"
#define DSML_CLOSE "</" DS4_DSML "tool_calls>"
#define DSML_INVOKE "<" DS4_DSML "invoke name=\""
#define DSML_INVOKE_END "</" DS4_DSML "invoke>"

/* The schema line of tool `name` in the prompt's tools block: the first
 * property of its parameters (NULL when it has none). malloc'd. */
static char *first_property(const char *prompt, const char *name)
{
    const char *p = strstr(prompt, "### Available Tool Schemas\n\n");
    if (!p) return NULL;
    p += strlen("### Available Tool Schemas\n\n");
    char *out = NULL;
    while (*p == '{' && !out) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        json_t *j = json_loadb(p, n, 0, NULL);
        const char *nm = json_string_value(json_object_get(j, "name"));
        if (nm && !strcmp(nm, name)) {
            json_t *props = json_object_get(json_object_get(j, "parameters"), "properties");
            void *it = json_object_iter(props);
            if (it) out = strdup(json_object_iter_key(it));
            else out = strdup("");
        }
        json_decref(j);
        if (!e) break;
        p = e + 1;
    }
    if (out && !*out) { free(out); out = NULL; }
    return out;
}

/* The i-th declared tool's name (schema lines in order), or NULL. */
static char *tool_name(const char *prompt, int i)
{
    const char *p = strstr(prompt, "### Available Tool Schemas\n\n");
    if (!p) return NULL;
    p += strlen("### Available Tool Schemas\n\n");
    for (int k = 0; *p == '{'; k++) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (k == i) {
            json_t *j = json_loadb(p, n, 0, NULL);
            const char *nm = json_string_value(json_object_get(j, "name"));
            char *out = nm ? strdup(nm) : NULL;
            json_decref(j);
            return out;
        }
        if (!e) break;
        p = e + 1;
    }
    return NULL;
}

/* One invoke from after `name="` on: NAME">\n[param]\n</invoke> */
static size_t put_invoke_tail(char *out, size_t cap, const char *prompt, const char *name, const char *value)
{
    char *prop = first_property(prompt, name);
    int k;
    if (prop)
        k = snprintf(out, cap, "%s\">\n<" DS4_DSML "parameter name=\"%s\" string=\"true\">%s</" DS4_DSML
                     "parameter>\n" DSML_INVOKE_END, name, prop, value);
    else
        k = snprintf(out, cap, "%s\">\n\n" DSML_INVOKE_END, name);
    free(prop);
    return k < 0 ? 0 : (size_t)k < cap ? (size_t)k : cap - 1;
}

/* The answer (after the last <｜Assistant｜>) holds an open tool block: the
 * rest of it. Returns false when there is none. */
static bool continue_block(const char *s, const char *user, char *out, size_t cap, size_t *len)
{
    const char *a = rfind(s, DS4_ASSISTANT);
    const char *blk = a ? strstr(a, DSML_OPEN) : NULL;
    if (!blk || strstr(blk, DSML_CLOSE)) return false;
    *len = 0;
    const char *inv = rfind(blk, DSML_INVOKE);
    if (!inv) return true; /* nothing the script knows how to continue */
    const char *written = inv + strlen(DSML_INVOKE); /* from the name on */
    if (strstr(written, DSML_INVOKE_END)) {
        *len = (size_t)snprintf(out, cap, "\n" DSML_CLOSE);
        return true;
    }
    /* the name: as written when its tag is closed, else the script's wish
     * among those the written bytes still allow */
    char name[128] = "";
    const char *q = strstr(written, "\">");
    char *first = tool_name(s, 0);
    if (q && (size_t)(q - written) < sizeof name) {
        memcpy(name, written, (size_t)(q - written));
    } else {
        const char *wish = strstr(user, "weather") ? "get_weather" : first ? first : "none";
        char *cand[9] = {strdup(wish)};
        for (int i = 0; i < 8; i++) cand[i + 1] = tool_name(s, i);
        for (int i = 0; i < 9 && !name[0]; i++) {
            char tag[160];
            if (!cand[i]) continue;
            snprintf(tag, sizeof tag, "%s\">", cand[i]);
            if (!strncmp(tag, written, strlen(written)) && strlen(cand[i]) < sizeof name)
                strcpy(name, cand[i]);
        }
        if (!name[0]) snprintf(name, sizeof name, "%s", wish);
        for (int i = 0; i < 9; i++) free(cand[i]);
    }
    char body[2048];
    size_t k = put_invoke_tail(body, sizeof body, s, name, user);
    if (strstr(user, "two calls")) {
        char *second = tool_name(s, 1);
        k += (size_t)snprintf(body + k, sizeof body - k, "\n" DSML_INVOKE);
        k += put_invoke_tail(body + k, sizeof body - k, s, second ? second : name, user);
        free(second);
    }
    snprintf(body + k, sizeof body - k, "\n" DSML_CLOSE);
    free(first);
    size_t wl = strlen(written);
    if (strncmp(body, written, wl)) return true; /* not a continuation: stop */
    *len = (size_t)snprintf(out, cap, "%s", body + wl);
    return true;
}

static void build_reply(test_session *t)
{
    size_t len;
    char *s = live_text(t, &len);
    if (!s) return;
    bool thinking = len >= 7 && !strcmp(s + len - 7, DS4_THINK);
    bool tools = strstr(s, "## Tools") != NULL;
    const char *u = rfind(s, DS4_USER);
    char user[200] = "";
    bool weather = false; /* anywhere in the turn: agent clients put their reminders first */
    if (u) {
        u += strlen(DS4_USER);
        const char *end = strstr(u, DS4_ASSISTANT);
        size_t ul = end ? (size_t)(end - u) : strlen(u);
        weather = memmem(u, ul, "weather", 7) != NULL;
        if (ul > 120) ul = 120;
        memcpy(user, u, ul);
        user[ul] = 0;
    }
    char out[4096];
    size_t k = 0;
    if (continue_block(s, user, out, sizeof out, &k)) {
        /* a forced block: finish the call, nothing else */
    } else {
    if (thinking)
        k += (size_t)snprintf(out + k, sizeof out - k,
                              "The user wrote %zu bytes; I will answer.</think>", strlen(user));
    const char *res = strstr(user, "<tool_result>");
    if (res) {
        res += strlen("<tool_result>");
        const char *re = strstr(res, "</tool_result>");
        int rl = re ? (int)(re - res) : (int)strlen(res);
        k += (size_t)snprintf(out + k, sizeof out - k, "The tool said: %.*s", rl > 60 ? 60 : rl, res);
    } else if (tools && weather && !strstr(user, "<tool_result>")) {
        /* the declared weather tool, as an agent client qualifies it
         * (Claude Code "mcp__weather__get_weather", Codex's namespace
         * flattened the same way), else plain get_weather */
        char wname[128] = "get_weather";
        for (int i = 0; i < 64; i++) {
            char *nm = tool_name(s, i);
            if (!nm) break;
            size_t nl = strlen(nm);
            bool hit = nl >= 11 && nl < sizeof wname && !strcmp(nm + nl - 11, "get_weather");
            if (hit) memcpy(wname, nm, nl + 1);
            free(nm);
            if (hit) break;
        }
        k += (size_t)snprintf(out + k, sizeof out - k,
            "\n\n<" DS4_DSML "tool_calls>\n<" DS4_DSML "invoke name=\"%s\">\n"
            "<" DS4_DSML "parameter name=\"city\" string=\"true\">Rome</" DS4_DSML "parameter>\n"
            "<" DS4_DSML "parameter name=\"days\" string=\"false\">2</" DS4_DSML "parameter>\n"
            "</" DS4_DSML "invoke>\n</" DS4_DSML "tool_calls>", wname);
    } else if (strstr(user, "long story")) {
        for (int i = 0; i < 200 && k + 40 < sizeof out; i++)
            k += (size_t)snprintf(out + k, sizeof out - k, "word%d ", i);
    } else {
        k += (size_t)snprintf(out + k, sizeof out - k, "Hello! You said: %s.", user);
    }
    }
    free(s);
    t->reply = strndup(out, k);
    size_t n = 0;
    if (t->reply && tokenize(NULL, t->reply, k, &t->reply_toks, &n) == 0) t->n_reply = n;
    t->reply_pos = 0;
}

static bool allowed(const srv_sampling *s, int32_t tok)
{
    char b[64];
    int l = token_bytes(NULL, tok, b, sizeof b);
    return l > 0 && s->allow(s->allow_ud, b, (size_t)l);
}

static int sample(srv_engine *e, int slot, const srv_sampling *s, int32_t *tok)
{
    test_session *t = &((test_engine *)e)->ss[slot];
    if (!t->reply) build_reply(t);
    *tok = t->reply_pos < t->n_reply ? t->reply_toks[t->reply_pos] : e->eos;
    if (s->allow && !allowed(s, *tok)) {
        int32_t k = 0;
        while (k < BYTE_BASE + 256 && !allowed(s, k)) k++;
        if (k == BYTE_BASE + 256) {
            snprintf(e->err, sizeof e->err, "sample: no usable token");
            return -1;
        }
        *tok = k;
        drop_reply(t); /* re-plan from the live text */
    }
    return 0;
}

static int decode_batch(srv_engine *e, const int *slots, const int32_t *toks, int n)
{
    test_engine *te = (test_engine *)e;
    for (int i = 0; i < n; i++) {
        if (slots[i] < 0 || slots[i] >= e->n_slots) {
            snprintf(e->err, sizeof e->err, "decode: slot %d of %d sessions", slots[i], e->n_slots);
            return -1;
        }
        for (int k = 0; k < i; k++)
            if (slots[k] == slots[i]) {
                snprintf(e->err, sizeof e->err, "decode: slot %d twice in one step", slots[i]);
                return -1;
            }
    }
    nap(te->delay_us, n > 0 ? 1 : 0);
    for (int i = 0; i < n; i++) {
        test_session *t = &te->ss[slots[i]];
        if (push(te, t, &toks[i], 1) < 0) return -1;
        t->reply_pos++;
    }
    return 0;
}

static int snapshot(srv_engine *e, int slot, void **bytes, size_t *len)
{
    test_session *t = &((test_engine *)e)->ss[slot];
    size_t n = 8 + t->n * 4;
    unsigned char *b = malloc(n);
    if (!b) return -1;
    memcpy(b, "TENG", 4);
    uint32_t c = (uint32_t)t->n;
    memcpy(b + 4, &c, 4);
    memcpy(b + 8, t->toks, t->n * 4);
    *bytes = b;
    *len = n;
    return 0;
}

static size_t snapshot_size(srv_engine *e, int slot) { return 8 + ((test_engine *)e)->ss[slot].n * 4; }
static size_t snapshot_max(srv_engine *e) { return 8 + (size_t)e->ctx * 4; }

static int restore(srv_engine *e, int slot, const void *bytes, size_t len)
{
    test_engine *te = (test_engine *)e;
    test_session *t = &te->ss[slot];
    const unsigned char *b = bytes;
    uint32_t c;
    if (len < 8 || memcmp(b, "TENG", 4)) {
        snprintf(e->err, sizeof e->err, "snapshot: bad magic");
        return -1;
    }
    memcpy(&c, b + 4, 4);
    if ((size_t)c * 4 + 8 != len) {
        snprintf(e->err, sizeof e->err, "snapshot: %u tokens do not fit %zu bytes", c, len);
        return -1;
    }
    t->n = 0;
    drop_reply(t);
    for (uint32_t i = 0; i < c; i++) {
        int32_t v;
        memcpy(&v, b + 8 + 4 * i, 4);
        if (v < 0 || v >= BYTE_BASE + 256) {
            snprintf(e->err, sizeof e->err, "snapshot: token %d out of range", v);
            t->n = 0;
            return -1;
        }
        if (push(te, t, &v, 1) < 0) return -1;
    }
    return 0;
}

static void close_(srv_engine *e)
{
    test_engine *t = (test_engine *)e;
    for (int i = 0; i < e->n_slots; i++) {
        drop_reply(&t->ss[i]);
        free(t->ss[i].toks);
    }
    free(t->ss);
    free(t);
}

srv_engine *engine_test_open(int ctx, int delay_us, int n_slots)
{
    test_engine *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->e.n_slots = n_slots > 0 ? n_slots : 1;
    t->ss = calloc((size_t)t->e.n_slots, sizeof *t->ss);
    if (!t->ss) { free(t); return NULL; }
    snprintf(t->e.model_id, sizeof t->e.model_id, "deepseek-v4-flash");
    t->e.ctx = ctx > 0 ? ctx : 32768;
    t->e.prefill_chunk = SRV_PREFILL_CHUNK_CPU;
    t->e.eos = 1;
    t->e.quant_bits = 4;
    t->e.tokenize = tokenize;
    t->e.tokenize_prompt = tokenize_prompt;
    t->e.is_special = is_special;
    t->e.token_bytes = token_bytes;
    t->e.reset = reset;
    t->e.prefill = prefill;
    t->e.sample = sample;
    t->e.decode_batch = decode_batch;
    t->e.snapshot = snapshot;
    t->e.snapshot_size = snapshot_size;
    t->e.restore = restore;
    t->e.snapshot_max = snapshot_max;
    t->e.close = close_;
    t->delay_us = delay_us;
    return &t->e;
}

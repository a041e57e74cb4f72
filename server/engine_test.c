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
 * The session is the token list, so snapshot/restore/prefix reuse behave
 * exactly like the real engine's contract. An optional per-token delay
 * makes prefills long enough to test keep-alives and disconnects.
 */
#include "server/engine_port.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/prompt_render.h"

static const char *const SPECIALS[7] = {DS4_BOS, DS4_EOS, DS4_USER, DS4_ASSISTANT,
                                        DS4_THINK, DS4_ENDTHINK, DS4_DSML};
#define BYTE_BASE 16

typedef struct {
    srv_engine e;
    int32_t *toks;
    size_t n, cap;
    char *reply;        /* scripted reply of the current turn */
    size_t reply_pos;
    int32_t *reply_toks;
    size_t n_reply;
    int delay_us;
} test_engine;

static void nap(int us, size_t n)
{
    if (us <= 0 || n == 0) return;
    long long total = (long long)us * (long long)n;
    struct timespec ts = {total / 1000000, (total % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static int tokenize(srv_engine *e, const char *s, size_t len, int32_t **out, size_t *n)
{
    (void)e;
    int32_t *t = malloc((len ? len : 1) * sizeof *t);
    if (!t) return -1;
    size_t k = 0;
    for (size_t i = 0; i < len;) {
        int sp = -1;
        for (int j = 0; j < 7; j++) {
            size_t l = strlen(SPECIALS[j]);
            if (l <= len - i && !memcmp(s + i, SPECIALS[j], l)) { sp = j; i += l; break; }
        }
        if (sp >= 0) t[k++] = sp;
        else t[k++] = BYTE_BASE + (unsigned char)s[i++];
    }
    *out = t;
    *n = k;
    return 0;
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

static int push(test_engine *t, const int32_t *toks, size_t n)
{
    if (t->n + n > (size_t)t->e.ctx) {
        snprintf(t->e.err, sizeof t->e.err, "context full: %zu + %zu tokens > ctx %d",
                 t->n, n, t->e.ctx);
        return -1;
    }
    if (t->n + n > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 4096;
        while (cap < t->n + n) cap *= 2;
        int32_t *q = realloc(t->toks, cap * sizeof *q);
        if (!q) { snprintf(t->e.err, sizeof t->e.err, "out of memory"); return -1; }
        t->toks = q; t->cap = cap;
    }
    memcpy(t->toks + t->n, toks, n * sizeof *toks);
    t->n += n;
    return 0;
}

static void drop_reply(test_engine *t)
{
    free(t->reply);
    free(t->reply_toks);
    t->reply = NULL;
    t->reply_toks = NULL;
    t->n_reply = t->reply_pos = 0;
}

static int reset(srv_engine *e)
{
    test_engine *t = (test_engine *)e;
    t->n = 0;
    drop_reply(t);
    return 0;
}

static int prefill(srv_engine *e, const int32_t *toks, size_t n)
{
    test_engine *t = (test_engine *)e;
    drop_reply(t);
    nap(t->delay_us, n);
    return push(t, toks, n);
}

static char *live_text(test_engine *t, size_t *len)
{
    size_t cap = t->n * 16 + 1, k = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    for (size_t i = 0; i < t->n; i++) {
        int l = token_bytes(&t->e, t->toks[i], s + k, cap - k);
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

static void build_reply(test_engine *t)
{
    size_t len;
    char *s = live_text(t, &len);
    if (!s) return;
    bool thinking = len >= 7 && !strcmp(s + len - 7, DS4_THINK);
    bool tools = strstr(s, "## Tools") != NULL;
    const char *u = rfind(s, DS4_USER);
    char user[200] = "";
    if (u) {
        u += strlen(DS4_USER);
        const char *end = strstr(u, DS4_ASSISTANT);
        size_t ul = end ? (size_t)(end - u) : strlen(u);
        if (ul > 120) ul = 120;
        memcpy(user, u, ul);
        user[ul] = 0;
    }
    char out[4096];
    size_t k = 0;
    if (thinking)
        k += (size_t)snprintf(out + k, sizeof out - k,
                              "The user wrote %zu bytes; I will answer.</think>", strlen(user));
    const char *res = strstr(user, "<tool_result>");
    if (res) {
        res += strlen("<tool_result>");
        const char *re = strstr(res, "</tool_result>");
        int rl = re ? (int)(re - res) : (int)strlen(res);
        k += (size_t)snprintf(out + k, sizeof out - k, "The tool said: %.*s", rl > 60 ? 60 : rl, res);
    } else if (tools && strstr(user, "weather")) {
        k += (size_t)snprintf(out + k, sizeof out - k,
            "\n\n<" DS4_DSML "tool_calls>\n<" DS4_DSML "invoke name=\"get_weather\">\n"
            "<" DS4_DSML "parameter name=\"city\" string=\"true\">Rome</" DS4_DSML "parameter>\n"
            "<" DS4_DSML "parameter name=\"days\" string=\"false\">2</" DS4_DSML "parameter>\n"
            "</" DS4_DSML "invoke>\n</" DS4_DSML "tool_calls>");
    } else if (strstr(user, "long story")) {
        for (int i = 0; i < 200 && k + 40 < sizeof out; i++)
            k += (size_t)snprintf(out + k, sizeof out - k, "word%d ", i);
    } else {
        k += (size_t)snprintf(out + k, sizeof out - k, "Hello! You said: %s.", user);
    }
    free(s);
    t->reply = strndup(out, k);
    size_t n = 0;
    if (t->reply && tokenize(&t->e, t->reply, k, &t->reply_toks, &n) == 0) t->n_reply = n;
    t->reply_pos = 0;
}

static int sample(srv_engine *e, const srv_sampling *s, int32_t *tok)
{
    (void)s;
    test_engine *t = (test_engine *)e;
    if (!t->reply) build_reply(t);
    *tok = t->reply_pos < t->n_reply ? t->reply_toks[t->reply_pos] : t->e.eos;
    return 0;
}

static int accept(srv_engine *e, int32_t tok)
{
    test_engine *t = (test_engine *)e;
    nap(t->delay_us, 1);
    if (push(t, &tok, 1) < 0) return -1;
    t->reply_pos++;
    return 0;
}

static int snapshot(srv_engine *e, void **bytes, size_t *len)
{
    test_engine *t = (test_engine *)e;
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

static int restore(srv_engine *e, const void *bytes, size_t len)
{
    test_engine *t = (test_engine *)e;
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
        if (push(t, &v, 1) < 0) return -1;
    }
    return 0;
}

static void close_(srv_engine *e)
{
    test_engine *t = (test_engine *)e;
    drop_reply(t);
    free(t->toks);
    free(t);
}

srv_engine *engine_test_open(int ctx, int delay_us)
{
    test_engine *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    snprintf(t->e.model_id, sizeof t->e.model_id, "deepseek-v4-flash");
    t->e.ctx = ctx > 0 ? ctx : 32768;
    t->e.eos = 1;
    t->e.quant_bits = 4;
    t->e.tokenize = tokenize;
    t->e.token_bytes = token_bytes;
    t->e.reset = reset;
    t->e.prefill = prefill;
    t->e.sample = sample;
    t->e.accept = accept;
    t->e.snapshot = snapshot;
    t->e.restore = restore;
    t->e.close = close_;
    t->delay_us = delay_us;
    return &t->e;
}

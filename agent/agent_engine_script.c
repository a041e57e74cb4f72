/*
 * agent_engine_script.c - the scripted test engine behind
 * `ds4-agent --test-script FILE`.
 *
 * It is not a model. Its tokenizer maps the 7 chat special tokens to ids
 * 0..6 where the template wrote them (like ds4_tokenize_spans; elsewhere
 * their bytes stay bytes) and every other byte b to 16 + b (so multi-byte markers arrive split
 * across tokens, as real BPE splits DSML). Its "generation" reads the live
 * session and replies from the script, a JSON file:
 *
 *   {"replies": [{"when": "TEXT", "text": "REPLY"}, ...]}
 *
 * The reply is the first entry whose "when" occurs in the last user turn
 * (the bytes after the last <｜User｜>, tool results included); an entry
 * without "when" matches anything. REPLY is emitted byte by byte and may
 * hold DSML tool calls; in it, {{tokens}} becomes the number of tokens in
 * the session when the reply starts. The choice depends only on the
 * session's tokens, never on how the process got there, so a session
 * restored from disk answers exactly as the uninterrupted one would; the
 * {{tokens}} placeholder makes a wrongly restored session visible.
 * The session is the token list, so snapshot/restore behave as the real
 * engine's contract says. Optional top-level "delay_ms" makes every
 * sampled token take that long, and "prefill_delay_ms" every prefill call,
 * so tests can interrupt a generation or a prefill.
 */
#include "agent/agent_engine.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "include/ds4_chat.h"

static const char *const SPECIALS[7] = {DS4_TEXT_BOS,   DS4_TEXT_EOS,       DS4_TEXT_USER, DS4_TEXT_ASSISTANT,
                                        DS4_TEXT_THINK, DS4_TEXT_THINK_END, DS4_TEXT_DSML};
#define BYTE_BASE 16
#define N_IDS (BYTE_BASE + 256)

typedef struct {
    agent_engine e;
    json_t *replies;
    int32_t *toks;
    size_t n, cap;
    char *reply;
    size_t reply_len, reply_pos;
    unsigned char bytebuf[N_IDS];
    long delay_ms, prefill_delay_ms;
} script_engine;

static void nap_ms(long ms)
{
    if (ms <= 0) return;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* True when [off, off+len) lies inside one template range of tpl. */
static bool in_template(const ds4_spans *tpl, size_t off, size_t len)
{
    if (!tpl) return false;
    for (size_t k = 0; k < tpl->n; k++)
        if (off >= tpl->v[k].off && off + len <= tpl->v[k].off + tpl->v[k].len) return true;
    return false;
}

/* Like the real engine's: a special only where the template wrote it. */
static int tokenize(agent_engine *e, const char *s, size_t len, const ds4_spans *tpl, ds4_tokens *out)
{
    if (tpl && tpl->oom) {
        snprintf(e->err, sizeof e->err, "tokenize: out of memory");
        return -1;
    }
    for (size_t i = 0; i < len;) {
        int sp = -1;
        for (int j = 0; j < 7; j++) {
            size_t l = strlen(SPECIALS[j]);
            if (l <= len - i && !memcmp(s + i, SPECIALS[j], l) && in_template(tpl, i, l)) {
                sp = j;
                i += l;
                break;
            }
        }
        int32_t id = sp >= 0 ? sp : BYTE_BASE + (unsigned char)s[i++];
        if (ds4_tokens_push(out, id) != DS4_OK) {
            snprintf(e->err, sizeof e->err, "tokenize: out of memory");
            return -1;
        }
    }
    return 0;
}

static const char *token_bytes(agent_engine *e, int32_t tok, size_t *len)
{
    script_engine *t = (script_engine *)e;
    if (tok >= 0 && tok < 7) {
        *len = strlen(SPECIALS[tok]);
        return SPECIALS[tok];
    }
    if (tok >= BYTE_BASE && tok < N_IDS) {
        *len = 1;
        return (const char *)&t->bytebuf[tok];
    }
    *len = 0;
    return NULL;
}

static void drop_reply(script_engine *t)
{
    free(t->reply);
    t->reply = NULL;
    t->reply_len = t->reply_pos = 0;
}

static int push(script_engine *t, const int32_t *toks, size_t n)
{
    if ((int64_t)(t->n + n) > t->e.ctx) {
        snprintf(t->e.err, sizeof t->e.err, "context full: %zu + %zu tokens > ctx %lld", t->n, n,
                 (long long)t->e.ctx);
        return -1;
    }
    if (t->n + n > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 4096;
        while (cap < t->n + n) cap *= 2;
        int32_t *q = realloc(t->toks, cap * sizeof *q);
        if (!q) {
            snprintf(t->e.err, sizeof t->e.err, "out of memory");
            return -1;
        }
        t->toks = q;
        t->cap = cap;
    }
    for (size_t i = 0; i < n; i++)
        if (toks[i] < 0 || toks[i] >= N_IDS) {
            snprintf(t->e.err, sizeof t->e.err, "token %d outside the vocabulary", toks[i]);
            return -1;
        }
    memcpy(t->toks + t->n, toks, n * sizeof *toks);
    t->n += n;
    return 0;
}

static int reset(agent_engine *e)
{
    script_engine *t = (script_engine *)e;
    t->n = 0;
    drop_reply(t);
    return 0;
}

static int prefill(agent_engine *e, const int32_t *toks, size_t n)
{
    script_engine *t = (script_engine *)e;
    drop_reply(t);
    nap_ms(t->prefill_delay_ms);
    return push(t, toks, n);
}

static void reseed(agent_engine *e, uint64_t seed)
{
    (void)e;
    (void)seed;
}

/* The live session as text (malloc'd). */
static char *live_text(script_engine *t, size_t *len)
{
    size_t cap = t->n * 16 + 1, k = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    for (size_t i = 0; i < t->n; i++) {
        size_t l;
        const char *b = token_bytes(&t->e, t->toks[i], &l);
        memcpy(s + k, b, l);
        k += l;
    }
    s[k] = 0;
    *len = k;
    return s;
}

static void build_reply(script_engine *t)
{
    size_t len;
    char *s = live_text(t, &len);
    if (!s) return;
    const char *user = s;
    for (const char *p = strstr(s, DS4_TEXT_USER); p; p = strstr(p + 1, DS4_TEXT_USER)) user = p;
    const char *text = "I have nothing scripted for this.";
    for (size_t i = 0; i < json_array_size(t->replies); i++) {
        json_t *r = json_array_get(t->replies, i);
        const char *when = json_string_value(json_object_get(r, "when"));
        if (!when || strstr(user, when)) {
            text = json_string_value(json_object_get(r, "text"));
            break;
        }
    }
    free(s);
    /* expand {{tokens}} */
    size_t cap = strlen(text) * 2 + 64, k = 0;
    char *out = malloc(cap);
    if (!out) return;
    for (const char *p = text; *p;) {
        if (!strncmp(p, "{{tokens}}", 10)) {
            k += (size_t)snprintf(out + k, cap - k, "%zu", t->n);
            p += 10;
        } else {
            out[k++] = *p++;
        }
        if (k + 32 > cap) {
            cap *= 2;
            char *q = realloc(out, cap);
            if (!q) {
                free(out);
                return;
            }
            out = q;
        }
    }
    t->reply = out;
    t->reply_len = k;
    t->reply_pos = 0;
}

static int sample(agent_engine *e, bool greedy, int32_t *tok)
{
    (void)greedy;
    script_engine *t = (script_engine *)e;
    if (t->n == 0) {
        snprintf(e->err, sizeof e->err, "sample: the session has no logits yet");
        return -1;
    }
    nap_ms(t->delay_ms);
    if (!t->reply) build_reply(t);
    if (!t->reply) {
        snprintf(e->err, sizeof e->err, "sample: out of memory");
        return -1;
    }
    /* a special token's text in the reply is emitted as that token */
    if (t->reply_pos < t->reply_len) {
        const char *p = t->reply + t->reply_pos;
        size_t rest = t->reply_len - t->reply_pos;
        for (int j = 0; j < 7; j++) {
            size_t l = strlen(SPECIALS[j]);
            if (l <= rest && !memcmp(p, SPECIALS[j], l)) {
                *tok = j;
                return 0;
            }
        }
        *tok = BYTE_BASE + (unsigned char)*p;
    } else {
        *tok = e->eos;
    }
    return 0;
}

static int decode(agent_engine *e, int32_t tok)
{
    script_engine *t = (script_engine *)e;
    if (push(t, &tok, 1) != 0) return -1;
    if (t->reply && t->reply_pos < t->reply_len) {
        size_t l;
        token_bytes(e, tok, &l);
        t->reply_pos += l;
    }
    return 0;
}

static int64_t n_past(agent_engine *e) { return (int64_t)((script_engine *)e)->n; }

static int snapshot(agent_engine *e, void **bytes, size_t *len)
{
    script_engine *t = (script_engine *)e;
    size_t n = 8 + t->n * 4;
    unsigned char *b = malloc(n);
    if (!b) {
        snprintf(e->err, sizeof e->err, "snapshot: out of memory");
        return -1;
    }
    memcpy(b, "AGSC", 4);
    uint32_t c = (uint32_t)t->n;
    memcpy(b + 4, &c, 4);
    if (t->n) memcpy(b + 8, t->toks, t->n * 4);
    *bytes = b;
    *len = n;
    return 0;
}

static int restore(agent_engine *e, const void *bytes, size_t len)
{
    script_engine *t = (script_engine *)e;
    const unsigned char *b = bytes;
    uint32_t c;
    if (len < 8 || memcmp(b, "AGSC", 4)) {
        snprintf(e->err, sizeof e->err, "restore: not a test-engine snapshot");
        return -1;
    }
    memcpy(&c, b + 4, 4);
    if ((size_t)c * 4 + 8 != len) {
        snprintf(e->err, sizeof e->err, "restore: %u tokens do not fit %zu bytes", c, len);
        return -1;
    }
    reset(e);
    for (uint32_t i = 0; i < c; i++) {
        int32_t v;
        memcpy(&v, b + 8 + 4 * i, 4);
        if (push(t, &v, 1) != 0) {
            t->n = 0;
            return -1;
        }
    }
    return 0;
}

static void close_(agent_engine *e)
{
    script_engine *t = (script_engine *)e;
    drop_reply(t);
    free(t->toks);
    json_decref(t->replies);
    free(t);
}

agent_engine *agent_engine_script_open(const char *path, int64_t ctx, char *err, size_t es)
{
    json_error_t je;
    json_t *doc = json_load_file(path, 0, &je);
    if (!doc) {
        snprintf(err, es, "--test-script %s: line %d: %s", path, je.line, je.text);
        return NULL;
    }
    json_t *replies = json_object_get(doc, "replies");
    if (!json_is_array(replies)) {
        snprintf(err, es, "--test-script %s: no \"replies\" array", path);
        json_decref(doc);
        return NULL;
    }
    for (size_t i = 0; i < json_array_size(replies); i++) {
        json_t *r = json_array_get(replies, i);
        json_t *w = json_object_get(r, "when");
        if (!json_is_string(json_object_get(r, "text")) || (w && !json_is_string(w))) {
            snprintf(err, es, "--test-script %s: replies[%zu] needs a string \"text\" (and \"when\", if any)",
                     path, i);
            json_decref(doc);
            return NULL;
        }
    }
    script_engine *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, es, "out of memory");
        json_decref(doc);
        return NULL;
    }
    t->replies = json_incref(replies);
    json_t *delay = json_object_get(doc, "delay_ms");
    t->delay_ms = json_is_integer(delay) && json_integer_value(delay) > 0 ? (long)json_integer_value(delay) : 0;
    delay = json_object_get(doc, "prefill_delay_ms");
    t->prefill_delay_ms = json_is_integer(delay) && json_integer_value(delay) > 0 ? (long)json_integer_value(delay) : 0;
    json_decref(doc);
    for (int i = 0; i < 256; i++) t->bytebuf[BYTE_BASE + i] = (unsigned char)i;
    t->e.ctx = ctx > 0 ? ctx : 32768;
    t->e.eos = 1;
    t->e.quant_bits = 0;
    t->e.tokenize = tokenize;
    t->e.token_bytes = token_bytes;
    t->e.reset = reset;
    t->e.prefill = prefill;
    t->e.reseed = reseed;
    t->e.sample = sample;
    t->e.decode = decode;
    t->e.n_past = n_past;
    t->e.snapshot = snapshot;
    t->e.restore = restore;
    t->e.close = close_;
    return &t->e;
}

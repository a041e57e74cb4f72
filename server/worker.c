/*
 * worker.c - the engine thread: queue, prefix reuse, disk cache, generation.
 *
 * The live session is described by two parallel facts kept here: the tokens
 * it holds (live_toks) and the bytes they spell (live_text, always the
 * concatenation of the tokens' bytes). A new prompt reuses the session when
 *   1. the live tokens are a prefix of the prompt's tokens, or
 *   2. the live text is a byte prefix of the prompt (sampled tokens are
 *      often not the canonical BPE of their own text; chat-format §7.5):
 *      the live tokens stay and only the new suffix is tokenized;
 * otherwise the live session is saved to disk ("evict" moment), and the
 * longest disk snapshot whose text prefixes the prompt is restored, or the
 * session is reset and the whole prompt prefilled ("cold", saved when it is
 * long enough). A session that grew by --kv-cache-continued-interval-tokens
 * since its last save is saved again ("continued"), and the live session is
 * saved at shutdown.
 *
 * The disk payload is [u32 token count][tokens][engine snapshot bytes], so
 * a restored session knows its tokens as well as its KV state; the file's
 * tool-id map restores the exact-replay entries of the blocks in its text.
 */
#include "server/worker.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/kv_disk.h"
#include "include/ds4.h"
#include "server/api_response.h"
#include "server/output_parser.h"
#include "server/prompt_render.h"
#include "server/tool_memory.h"
#include "server/trace.h"

#define PREFILL_CHUNK 128
#define MAX_SESSION_TOOLS 4096

struct worker {
    srv_engine *eng;
    server_config cfg;
    kv_disk *disk;
    tool_memory *mem;

    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *head, *tail;
    int qlen;
    bool stop;
    job *current;            /* the job being processed (cancelled at shutdown) */

    char *live_text;
    size_t live_len, live_text_cap;
    int32_t *live_toks;
    size_t n_live, live_toks_cap;
    size_t saved_tokens;     /* n_live when the session was last on disk */

    kv_disk_tool session_tools[MAX_SESSION_TOOLS]; /* exact blocks in this session */
    size_t n_session_tools;

    /* The in-memory snapshot: the session at the stable point of the last
     * thinking prompt without tools (see process), with its tokens and text. */
    struct {
        void *bytes;
        size_t len;
        int32_t *toks;
        size_t n;
        char *text;
        size_t text_len;
    } snap;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void disk_log(void *ud, const char *msg)
{
    (void)ud;
    fprintf(stderr, "ds4-server: %s\n", msg);
    trace_printf("%s", msg);
}

/* ---- live state ---------------------------------------------------------- */

static int live_add_text(worker *w, const char *s, size_t n)
{
    if (w->live_len + n + 1 > w->live_text_cap) {
        size_t cap = w->live_text_cap ? w->live_text_cap * 2 : 65536;
        while (cap < w->live_len + n + 1) cap *= 2;
        char *q = realloc(w->live_text, cap);
        if (!q) return -1;
        w->live_text = q;
        w->live_text_cap = cap;
    }
    memcpy(w->live_text + w->live_len, s, n);
    w->live_len += n;
    w->live_text[w->live_len] = 0;
    return 0;
}

static int live_add_toks(worker *w, const int32_t *t, size_t n)
{
    if (w->n_live + n > w->live_toks_cap) {
        size_t cap = w->live_toks_cap ? w->live_toks_cap * 2 : 8192;
        while (cap < w->n_live + n) cap *= 2;
        int32_t *q = realloc(w->live_toks, cap * sizeof *q);
        if (!q) return -1;
        w->live_toks = q;
        w->live_toks_cap = cap;
    }
    memcpy(w->live_toks + w->n_live, t, n * sizeof *t);
    w->n_live += n;
    return 0;
}

static void session_tools_clear(worker *w)
{
    for (size_t i = 0; i < w->n_session_tools; i++) {
        free(w->session_tools[i].id);
        free(w->session_tools[i].dsml);
    }
    w->n_session_tools = 0;
}

static void session_tool_add(worker *w, const char *id, const char *dsml, size_t dl)
{
    if (w->n_session_tools >= MAX_SESSION_TOOLS) return;
    kv_disk_tool *t = &w->session_tools[w->n_session_tools];
    t->id = strdup(id);
    t->dsml = malloc(dl + 1);
    if (!t->id || !t->dsml) { free(t->id); free(t->dsml); return; }
    memcpy(t->dsml, dsml, dl);
    t->dsml[dl] = 0;
    t->id_len = strlen(id);
    t->dsml_len = dl;
    w->n_session_tools++;
}

static void live_reset(worker *w)
{
    w->eng->reset(w->eng);
    w->live_len = 0;
    if (w->live_text) w->live_text[0] = 0;
    w->n_live = 0;
    w->saved_tokens = 0;
    session_tools_clear(w);
}

/* ---- the in-memory snapshot ---------------------------------------------------
 *
 * In thinking mode without tools the official rendering drops a turn's
 * reasoning once the next user message arrives (chat-format §3.3): the next
 * prompt spells the turn as "<｜Assistant｜></think>answer", while the live
 * session holds "<｜Assistant｜><think>reasoning</think>answer". The two part
 * right after "<｜Assistant｜>", so the live session cannot be extended.
 * That point, the prompt without its final "<think>", is the stable point:
 * process() prefills up to it, snapshots the session here, then prefills
 * "<think>". The next turn's prompt extends the stable point, restores the
 * snapshot and prefills only its new suffix.
 *
 * One snapshot is kept, replaced by the next one taken. It is taken only
 * when the engine says it fits --kv-memory-snapshot-mb: copying it costs
 * far less time than re-prefilling its tokens (docs/SERVER.md has numbers),
 * so memory is what bounds it. */

static void snap_drop(worker *w)
{
    free(w->snap.bytes);
    free(w->snap.toks);
    free(w->snap.text);
    memset(&w->snap, 0, sizeof w->snap);
}

static void snap_take(worker *w)
{
    srv_engine *e = w->eng;
    if (w->snap.bytes && w->snap.n == w->n_live && w->snap.text_len == w->live_len &&
        !memcmp(w->snap.toks, w->live_toks, w->n_live * sizeof *w->live_toks))
        return; /* the same point again (a regenerated turn) */
    size_t budget = w->cfg.kv_memory_snapshot_mb << 20;
    size_t need = e->snapshot_size ? e->snapshot_size(e) : 0;
    if (!need || need > budget) {
        trace_printf("cache: no memory snapshot: %zu bytes, budget %zu", need, budget);
        return;
    }
    snap_drop(w); /* never two in memory at once */
    double t0 = now_ms();
    void *b = NULL;
    size_t len = 0;
    if (e->snapshot(e, &b, &len) != 0) {
        fprintf(stderr, "ds4-server: snapshot failed: %s\n", e->err);
        return;
    }
    w->snap.toks = malloc((w->n_live ? w->n_live : 1) * sizeof *w->snap.toks);
    w->snap.text = malloc(w->live_len + 1);
    if (!w->snap.toks || !w->snap.text) {
        free(b);
        snap_drop(w);
        return;
    }
    w->snap.bytes = b;
    w->snap.len = len;
    memcpy(w->snap.toks, w->live_toks, w->n_live * sizeof *w->snap.toks);
    w->snap.n = w->n_live;
    memcpy(w->snap.text, w->live_text, w->live_len);
    w->snap.text[w->live_len] = 0;
    w->snap.text_len = w->live_len;
    trace_printf("cache: memory snapshot: %zu tokens, %zu bytes, %.2f ms", w->snap.n, len, now_ms() - t0);
}

/* Does the snapshot prefix the prompt? 1: by tokens, 2: by text, 0: no. */
static int snap_match(const worker *w, const int32_t *q, size_t nq, const char *prompt, size_t plen)
{
    if (!w->snap.bytes) return 0;
    if (w->snap.n <= nq && !memcmp(w->snap.toks, q, w->snap.n * sizeof *q)) return 1;
    if (w->snap.text_len <= plen && !memcmp(w->snap.text, prompt, w->snap.text_len)) return 2;
    return 0;
}

/* Make the snapshot the live session; false (and an empty session) if the
 * engine refuses it. */
static bool snap_restore(worker *w)
{
    double t0 = now_ms();
    if (w->eng->restore(w->eng, w->snap.bytes, w->snap.len) != 0) {
        fprintf(stderr, "ds4-server: memory snapshot refused: %s\n", w->eng->err);
        snap_drop(w);
        live_reset(w);
        return false;
    }
    w->n_live = w->live_len = 0;
    w->saved_tokens = 0;
    if (live_add_toks(w, w->snap.toks, w->snap.n) != 0 || live_add_text(w, w->snap.text, w->snap.text_len) != 0) {
        live_reset(w);
        return false;
    }
    /* the exact blocks that travel with a later disk save: those still here */
    size_t k = 0;
    for (size_t i = 0; i < w->n_session_tools; i++) {
        kv_disk_tool *t = &w->session_tools[i];
        if (memmem(w->live_text, w->live_len, t->dsml, t->dsml_len)) w->session_tools[k++] = *t;
        else { free(t->id); free(t->dsml); }
    }
    w->n_session_tools = k;
    trace_printf("cache: memory snapshot restored: %zu tokens, %.2f ms", w->snap.n, now_ms() - t0);
    return true;
}

/* ---- disk ------------------------------------------------------------------- */

static void disk_save(worker *w, kv_disk_reason reason)
{
    if (!w->disk || w->n_live == 0 || w->n_live < (size_t)w->cfg.kv_cache_min_tokens) return;
    if (w->saved_tokens == w->n_live) return;
    void *snap = NULL;
    size_t snap_len = 0;
    if (w->eng->snapshot(w->eng, &snap, &snap_len) != 0) {
        fprintf(stderr, "ds4-server: snapshot failed: %s\n", w->eng->err);
        return;
    }
    size_t pl = 4 + w->n_live * 4 + snap_len;
    unsigned char *payload = malloc(pl);
    if (!payload) { free(snap); return; }
    uint32_t n = (uint32_t)w->n_live;
    for (int i = 0; i < 4; i++) payload[i] = (unsigned char)(n >> (8 * i));
    for (size_t i = 0; i < w->n_live; i++)
        for (int k = 0; k < 4; k++) payload[4 + 4 * i + k] = (unsigned char)((uint32_t)w->live_toks[i] >> (8 * k));
    memcpy(payload + 4 + w->n_live * 4, snap, snap_len);
    free(snap);
    /* only the blocks that occur in this text travel with it */
    kv_disk_tool keep[MAX_SESSION_TOOLS];
    size_t nk = 0;
    for (size_t i = 0; i < w->n_session_tools; i++)
        if (memmem(w->live_text, w->live_len, w->session_tools[i].dsml, w->session_tools[i].dsml_len))
            keep[nk++] = w->session_tools[i];
    ds4_status st = kv_disk_save(w->disk, reason, w->live_text, w->live_len, n, payload, pl, keep, nk);
    free(payload);
    if (st != DS4_OK) fprintf(stderr, "ds4-server: %s\n", ds4_last_error());
    else w->saved_tokens = w->n_live;
}

/* Restores the longest disk prefix of prompt; returns true on success. */
static bool disk_restore(worker *w, const char *prompt, size_t plen)
{
    if (!w->disk) return false;
    kv_disk_hit hit;
    if (kv_disk_lookup(w->disk, prompt, plen, plen, &hit) != DS4_OK) return false;
    bool ok = false;
    const unsigned char *p = hit.payload;
    if (hit.payload_len >= 4) {
        uint32_t n = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        if (n == hit.tokens && (uint64_t)n * 4 + 4 <= hit.payload_len) {
            live_reset(w);
            if (w->eng->restore(w->eng, p + 4 + (size_t)n * 4, hit.payload_len - 4 - (size_t)n * 4) == 0) {
                ok = true;
                for (uint32_t i = 0; i < n && ok; i++) {
                    int32_t t = (int32_t)((uint32_t)p[4 + 4 * i] | (uint32_t)p[5 + 4 * i] << 8 |
                                          (uint32_t)p[6 + 4 * i] << 16 | (uint32_t)p[7 + 4 * i] << 24);
                    ok = live_add_toks(w, &t, 1) == 0;
                }
                ok = ok && live_add_text(w, prompt, hit.text_len) == 0;
            } else {
                fprintf(stderr, "ds4-server: kv-disk: %s: engine refused the snapshot: %s\n", hit.sha, w->eng->err);
            }
        }
    }
    if (ok) {
        w->saved_tokens = w->n_live;
        for (size_t i = 0; i < hit.n_tools; i++) {
            const char *id = hit.tools[i].id;
            if (w->mem) tool_memory_put(w->mem, &id, 1, hit.tools[i].dsml, hit.tools[i].dsml_len);
            session_tool_add(w, id, hit.tools[i].dsml, hit.tools[i].dsml_len);
        }
        trace_printf("cache: disk hit %s: %u tokens, %zu text bytes", hit.sha, hit.tokens, hit.text_len);
    } else {
        live_reset(w);
    }
    kv_disk_hit_free(&hit);
    return ok;
}

typedef struct {
    job *j;
    resp_writer *rw;
    int calls_started, calls_ended;  /* tool_choice enforcement watches these */
} sink_ctx;

static void job_sink(void *ud, const char *s, size_t n) { job_write(((sink_ctx *)ud)->j, s, n); }

static void on_event(void *ud, const out_event *ev)
{
    sink_ctx *c = ud;
    if (ev->type == OUT_TOOL_START) {
        c->calls_started++;
        trace_printf("tool: call %d start %s id %s", ev->index, ev->name, ev->id);
    } else if (ev->type == OUT_TOOL_END) {
        c->calls_ended++;
        trace_printf("tool: call %d end", ev->index);
    }
    resp_writer_event(c->rw, ev);
}

static void fail_job(job *j, int status, const char *msg, bool streaming_started)
{
    fprintf(stderr, "ds4-server: request failed (%d): %s\n", status, msg);
    trace_printf("error %d: %s", status, msg);
    if (streaming_started) {
        char *e = api_error_event(j->req.kind, msg);
        if (e) { job_write(j, e, strlen(e)); free(e); }
        job_finish(j, 200);
        return;
    }
    pthread_mutex_lock(&j->mu);
    j->out_len = 0;
    pthread_mutex_unlock(&j->mu);
    char *b = api_error_body(j->req.kind, status, msg, NULL);
    if (b) { job_write(j, b, strlen(b)); free(b); }
    job_finish(j, status);
}

/* Prefill toks in chunks, checking for a vanished client in between. */
static int prefill(worker *w, job *j, const int32_t *toks, size_t n)
{
    for (size_t i = 0; i < n; i += PREFILL_CHUNK) {
        if (job_is_cancelled(j)) return 1;
        size_t k = n - i < PREFILL_CHUNK ? n - i : PREFILL_CHUNK;
        if (w->eng->prefill(w->eng, toks + i, k) != 0) return -1;
        if (live_add_toks(w, toks + i, k) != 0) return -1;
    }
    return 0;
}

/* ---- tool_choice enforcement -------------------------------------------------------
 *
 * "required" and a named function are enforced by writing the start of a
 * tool-call block into the answer where the visible answer begins (at once
 * in chat mode, right after </think> in thinking mode): the canonical DSML
 * opening (prompt_render_call_opening), through the invoke tag with the
 * name for a named function, through `name="` for "required". The forced
 * text is prefilled onto the session and fed to the output parser exactly
 * as if the model had sampled it, so streaming, the final body, exact
 * replay and prefix reuse all see one consistent text. Under "required"
 * the name's tokens are then restricted to the declared names; a named
 * call's block is closed right after its invoke ends. */

/* Appends text to the answer as if generated. Returns its token count,
 * 0 when it does not fit the output budget (`budget` tokens) or the
 * context, -1 on an engine error. */
static int force_text(worker *w, out_parser *op, const char *text, int budget)
{
    srv_engine *e = w->eng;
    int32_t *t = NULL;
    size_t n = 0;
    if (e->tokenize(e, text, strlen(text), &t, &n) != 0) return -1;
    if (n > (size_t)budget || w->n_live + n >= (size_t)e->ctx) {
        trace_printf("tool_choice: %zu forced tokens do not fit: the answer ends here", n);
        free(t);
        return 0;
    }
    trace_printf("tool_choice: forcing %zu tokens: %s", n, text);
    int rc = n && e->prefill(e, t, n) != 0 ? -1 : 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        /* the live text stays the exact bytes of the live tokens */
        char b[4096];
        int bl = e->token_bytes(e, t[i], b, sizeof b);
        if (bl < 0 || live_add_toks(w, &t[i], 1) != 0 || live_add_text(w, b, (size_t)bl) != 0) rc = -1;
        else out_parser_feed(op, b, (size_t)bl);
    }
    free(t);
    return rc < 0 ? -1 : (int)n;
}

/* The function name being written since `from` (live text offset) may only
 * grow into one of the declared names followed by `">`. */
typedef struct {
    const worker *w;
    const api_request *r;
    size_t from;
} name_filter;

static bool name_allow(void *ud, const char *b, size_t n)
{
    const name_filter *f = ud;
    const char *have = f->w->live_text + f->from;
    size_t hl = f->w->live_len - f->from;
    char target[512];
    for (size_t i = 0; i < f->r->n_tools; i++) {
        int tl = snprintf(target, sizeof target, "%s\">", f->r->tools[i].name);
        if (tl < 0 || (size_t)tl >= sizeof target) continue;
        /* bytes past the target are free: the tag is closed */
        size_t m1 = hl < (size_t)tl ? hl : (size_t)tl;
        if (memcmp(have, target, m1)) continue;
        size_t m2 = hl + n < (size_t)tl ? n : (size_t)tl - m1;
        if (!memcmp(b, target + m1, m2)) return true;
    }
    return false;
}

/* After a named call's invoke closed: the canonical rest of the block, minus
 * what the model already wrote after the closing tag (a token can carry the
 * "\n"). NULL when what it wrote does not fit. malloc'd. */
static char *named_close_rest(const out_parser *op, const char *close)
{
    static const char end_tag[] = "</" DS4_DSML "invoke>";
    size_t gl;
    const char *g = out_parser_text(op, &gl);
    const char *at = NULL;
    for (const char *f = memmem(g, gl, end_tag, strlen(end_tag)); f;
         f = memmem(f + 1, gl - (size_t)(f + 1 - g), end_tag, strlen(end_tag)))
        at = f;
    if (!at) return NULL;
    size_t after = gl - (size_t)(at + strlen(end_tag) - g);
    if (after > strlen(close) || memcmp(at + strlen(end_tag), close, after)) return NULL;
    return strdup(close + after);
}

/* ---- one request -------------------------------------------------------------------- */

static void process(worker *w, job *j)
{
    api_request *r = &j->req;
    srv_engine *e = w->eng;
    bool thinking = r->thinking != 0;
    bool think_max = thinking && r->think_max && e->ctx >= 393216;
    bool tools = r->n_tools > 0 && r->tool_choice != TOOL_CHOICE_NONE;
    render_opts ro = {thinking, think_max, tools, w->cfg.disable_exact_replay ? NULL : w->mem};
    size_t plen = 0;
    int replayed = 0;
    char *prompt = prompt_render(r, &ro, &plen, &replayed);
    if (!prompt) { fail_job(j, 500, "out of memory rendering the prompt", false); return; }
    trace_text(thinking ? "prompt (thinking)" : "prompt (chat)", prompt, plen);
    if (replayed) trace_printf("tool: %d assistant turn(s) replayed from exact sampled DSML", replayed);

    double t0 = now_ms();
    usage_info u = {0};
    const char *decision = "cold";
    int32_t *q = NULL;
    size_t nq = 0;
    int rc = 0;
    char *opening = NULL, *closing = NULL;
    if (e->tokenize(e, prompt, plen, &q, &nq) != 0) {
        fail_job(j, 500, "tokenizer failed", false);
        free(prompt);
        return;
    }
    /* Reuse: the live session when it prefixes the prompt (by tokens, else
     * by text), unless the memory snapshot covers more; then the disk. */
    bool live_tok = w->n_live && w->n_live <= nq && !memcmp(w->live_toks, q, w->n_live * sizeof *q);
    bool live_txt = !live_tok && w->n_live && w->live_len <= plen && !memcmp(w->live_text, prompt, w->live_len);
    size_t live_cover = live_tok || live_txt ? w->n_live : 0;
    int snap = snap_match(w, q, nq, prompt, plen);
    bool by_tokens = false;
    if (snap && w->snap.n > live_cover) {
        if (w->n_live && !live_cover) disk_save(w, KV_DISK_REASON_EVICT);
        if (snap_restore(w)) {
            decision = "memory";
            by_tokens = snap == 1;
        }
    } else if (live_tok) {
        decision = "token-prefix";
        by_tokens = true;
    } else if (live_txt) {
        decision = "text-prefix";
    }
    if (!strcmp(decision, "cold")) {
        if (w->n_live) disk_save(w, KV_DISK_REASON_EVICT);
        if (disk_restore(w, prompt, plen)) decision = "disk";
        else live_reset(w);
    }
    int32_t *suffix = NULL, *tail = NULL;
    size_t n_suffix = 0;
    if (by_tokens) {
        suffix = q + w->n_live;
        n_suffix = nq - w->n_live;
    } else if (!strcmp(decision, "cold")) {
        suffix = q;
        n_suffix = nq;
    } else if (e->tokenize(e, prompt + w->live_len, plen - w->live_len, &tail, &n_suffix) == 0) {
        suffix = tail;
    } else {
        fail_job(j, 500, "tokenizer failed", false);
        goto out;
    }
    u.cached_tokens = (int)w->n_live;
    u.prompt_tokens = (int)(w->n_live + n_suffix);
    u.cache = decision;
    trace_printf("cache: %s: %zu tokens reused, %zu to prefill (prompt %d tokens, %zu bytes)", decision,
                 w->n_live, n_suffix, u.prompt_tokens, plen);
    if (u.prompt_tokens >= e->ctx) {
        char msg[160];
        snprintf(msg, sizeof msg, "the prompt has %d tokens; the context is %d", u.prompt_tokens, e->ctx);
        live_reset(w);
        fail_job(j, 400, msg, false);
        goto out;
    }
    if (tools && (r->tool_choice == TOOL_CHOICE_REQUIRED || r->tool_choice == TOOL_CHOICE_NAMED)) {
        bool named = r->tool_choice == TOOL_CHOICE_NAMED;
        opening = prompt_render_call_opening(named ? r->tool_choice_name : NULL);
        closing = named ? prompt_render_calls_close() : NULL;
        if (!opening || (named && !closing)) { fail_job(j, 500, "out of memory", false); goto out; }
    }

    sink_ctx sc = {j, NULL, 0, 0};
    sc.rw = resp_writer_new(r->kind, r->stream, r->include_usage, r->model ? r->model : e->model_id, job_sink, &sc);
    if (!sc.rw) { fail_job(j, 500, "out of memory", false); goto out; }
    resp_writer_begin(sc.rw, &u);

    /* The stable point (see the in-memory snapshot above): in thinking mode
     * without tools, prefill all but the final <think>, snapshot, then it. */
    size_t head = n_suffix;
    bool stable = false;
    if (thinking && !tools && n_suffix > 0 && w->cfg.kv_memory_snapshot_mb > 0) {
        char b[16];
        int bl = e->token_bytes(e, suffix[n_suffix - 1], b, sizeof b);
        stable = bl == (int)strlen(DS4_THINK) && !memcmp(b, DS4_THINK, (size_t)bl);
        if (stable) head = n_suffix - 1;
    }
    size_t text_end = plen - (stable ? strlen(DS4_THINK) : 0);
    rc = prefill(w, j, suffix, head);
    if (rc == 0 && live_add_text(w, prompt + w->live_len, text_end - w->live_len) != 0) rc = -1;
    /* a cold prompt's disk copy is taken at the stable point too: it then
     * serves the next turn as well as this prompt again */
    bool save_cold = !strcmp(decision, "cold") && (int)nq <= w->cfg.kv_cache_cold_max_tokens;
    if (rc == 0 && stable) {
        if (save_cold) disk_save(w, KV_DISK_REASON_COLD);
        save_cold = false;
        snap_take(w);
        rc = prefill(w, j, suffix + head, n_suffix - head);
        if (rc == 0 && live_add_text(w, DS4_THINK, strlen(DS4_THINK)) != 0) rc = -1;
    }
    if (rc != 0) {
        /* the session no longer matches its text: start over next time */
        live_reset(w);
        if (rc < 0) fail_job(j, 500, e->err[0] ? e->err : "prefill failed", r->stream);
        else job_finish(j, 499);
        resp_writer_free(sc.rw);
        goto out;
    }
    u.prefill_ms = now_ms() - t0;
    if (save_cold) disk_save(w, KV_DISK_REASON_COLD);

    /* generation */
    double t1 = now_ms();
    out_parser *op = out_parser_new(thinking, tools, r->kind == API_MESSAGES ? "toolu_" : "call_",
                                    r->stop, r->n_stop, on_event, &sc);
    int max = r->max_tokens > 0 ? r->max_tokens : w->cfg.default_max_tokens;
    if ((size_t)max > (size_t)e->ctx - w->n_live) max = (int)((size_t)e->ctx - w->n_live);
    srv_sampling sp = {
        .temperature = r->temperature >= 0 ? r->temperature : 1.0,
        .top_p = r->top_p >= 0 ? r->top_p : 1.0,
        .min_p = r->min_p >= 0 ? r->min_p : 0.05,
        .top_k = r->top_k >= 0 ? r->top_k : 0,
        .seed = r->has_seed ? r->seed : ((uint64_t)time(NULL) * 6364136223846793005ull) ^ (uint64_t)(uintptr_t)j,
    };
    name_filter nf = {w, r, 0};
    finish_kind fin = FIN_LENGTH;
    int gen = 0, reasoning_toks = 0;
    bool failed = false, cancelled = false, in_reasoning = thinking, first = true;
    /* enforcement: the opening is due once the visible answer begins */
    bool open_due = opening && !thinking, opened = false, closed = false;
    while (gen < max) {
        if (job_is_cancelled(j)) { cancelled = true; break; }
        if (open_due) {
            int k = force_text(w, op, opening, max - gen);
            if (k < 0) { failed = true; break; }
            if (k == 0) break; /* no room: "length" */
            gen += k;
            open_due = false;
            opened = true;
            nf.from = w->live_len;
            continue;
        }
        if (closing && opened && !closed && sc.calls_ended > 0) {
            closed = true; /* one try: what follows the invoke is decided now */
            char *rest = named_close_rest(op, closing);
            if (rest && *rest) {
                int k = force_text(w, op, rest, max - gen);
                free(rest);
                if (k < 0) { failed = true; break; }
                if (k == 0) break;
                gen += k;
                if (out_parser_done(op)) { fin = FIN_TOOL_CALLS; break; }
                continue;
            }
            free(rest);
        }
        int32_t t;
        sp.reseed = first;
        first = false;
        sp.greedy = out_parser_structural(op);
        /* "required": the name's tokens until its tag closes */
        bool naming = opened && !closing && sc.calls_started == 0;
        sp.allow = naming ? name_allow : NULL;
        sp.allow_ud = naming ? &nf : NULL;
        if (e->sample(e, &sp, &t) != 0) { failed = true; break; }
        if (t == e->eos) {
            if (opening && !opened && in_reasoning) {
                /* the model would end inside its reasoning: close it
                 * (as the canonical turn reads) and open the call */
                int k = force_text(w, op, DS4_ENDTHINK, max - gen);
                if (k <= 0) { failed = k < 0; break; }
                gen += k;
                reasoning_toks += k;
                in_reasoning = false;
                open_due = true;
                continue;
            }
            fin = FIN_STOP;
            break;
        }
        if (e->accept(e, t) != 0) { failed = true; break; }
        char bytes[4096];
        int bl = e->token_bytes(e, t, bytes, sizeof bytes);
        /* the live text must stay the exact bytes of the live tokens */
        if (bl < 0 || live_add_toks(w, &t, 1) != 0 || live_add_text(w, bytes, (size_t)bl) != 0) {
            snprintf(e->err, sizeof e->err, "token %d has no text or memory ran out", (int)t);
            failed = true;
            break;
        }
        gen++;
        if (in_reasoning) {
            reasoning_toks++;
            size_t win = (size_t)bl + 8 < w->live_len - plen ? (size_t)bl + 8 : w->live_len - plen;
            if (memmem(w->live_text + w->live_len - win, win, "</think>", 8)) {
                in_reasoning = false;
                open_due = opening && !opened;
            }
        }
        out_parser_feed(op, bytes, (size_t)bl);
        if (out_parser_done(op)) {
            fin = out_parser_stopped_by_sequence(op) ? FIN_STOP_SEQUENCE : FIN_TOOL_CALLS;
            break;
        }
    }
    out_parser_finish(op);
    if (fin == FIN_STOP && out_parser_n_calls(op)) fin = FIN_TOOL_CALLS;
    u.completion_tokens = gen;
    u.reasoning_tokens = reasoning_toks;
    u.decode_ms = now_ms() - t1;
    size_t gl;
    const char *gtext = out_parser_text(op, &gl);
    trace_text("generated", gtext, gl);
    trace_printf("done: %d tokens, finish %d%s%s, prefill %.1f ms, decode %.1f ms", gen, (int)fin,
                 cancelled ? ", client gone" : "", failed ? ", engine error" : "", u.prefill_ms, u.decode_ms);

    size_t nc = out_parser_n_calls(op);
    size_t rl = 0;
    const char *raw = out_parser_raw_block(op, &rl);
    if (nc && raw && rl) {
        const char *ids[64];
        size_t n = nc < 64 ? nc : 64;
        for (size_t i = 0; i < n; i++) ids[i] = out_parser_call(op, i)->id;
        if (w->mem) tool_memory_put(w->mem, ids, n, raw, rl);
        for (size_t i = 0; i < n; i++) session_tool_add(w, ids[i], raw, rl);
    }
    if (failed) {
        live_reset(w);
        fail_job(j, 500, e->err[0] ? e->err : "generation failed", r->stream);
    } else if (cancelled) {
        job_finish(j, 499);
    } else {
        resp_writer_end(sc.rw, op, fin, &u);
        job_finish(j, 200);
    }
    out_parser_free(op);
    resp_writer_free(sc.rw);
    if (w->cfg.kv_cache_continued_interval_tokens > 0 &&
        w->n_live - w->saved_tokens >= (size_t)w->cfg.kv_cache_continued_interval_tokens)
        disk_save(w, KV_DISK_REASON_CONTINUED);
out:
    free(opening);
    free(closing);
    free(tail);
    free(q);
    free(prompt);
}

/* ---- thread and queue ------------------------------------------------------------ */

static void *run(void *arg)
{
    worker *w = arg;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        while (!w->head && !w->stop) pthread_cond_wait(&w->cv, &w->mu);
        if (w->stop) { pthread_mutex_unlock(&w->mu); break; }
        job *j = w->head;
        w->head = j->next;
        if (!w->head) w->tail = NULL;
        w->qlen--;
        w->current = j;
        pthread_mutex_unlock(&w->mu);
        pthread_mutex_lock(&j->mu);
        j->started = true;
        pthread_mutex_unlock(&j->mu);
        if (job_is_cancelled(j)) job_finish(j, 499);
        else process(w, j);
        pthread_mutex_lock(&w->mu);
        w->current = NULL;
        pthread_mutex_unlock(&w->mu);
        job_unref(j);
    }
    return NULL;
}

worker *worker_start(srv_engine *eng, const server_config *cfg, char *err, size_t es)
{
    worker *w = calloc(1, sizeof *w);
    if (!w) { snprintf(err, es, "out of memory"); return NULL; }
    w->eng = eng;
    w->cfg = *cfg;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (!cfg->disable_exact_replay) w->mem = tool_memory_new(cfg->tool_memory_max_ids);
    if (cfg->kv_disk_dir) {
        kv_disk_options o = {
            .dir = cfg->kv_disk_dir,
            .space_bytes = (uint64_t)cfg->kv_disk_space_mb << 20,
            .quant_bits = eng->quant_bits,
            .ctx_size = (uint32_t)eng->ctx,
            .reject_different_quant = cfg->kv_cache_reject_different_quant,
            .log = disk_log,
        };
        w->disk = kv_disk_open(&o);
        if (!w->disk) {
            snprintf(err, es, "%s", ds4_last_error());
            tool_memory_free(w->mem);
            free(w);
            return NULL;
        }
    }
    if (pthread_create(&w->th, NULL, run, w) != 0) {
        snprintf(err, es, "cannot start the worker thread");
        kv_disk_close(w->disk);
        tool_memory_free(w->mem);
        free(w);
        return NULL;
    }
    return w;
}

void worker_stop(worker *w)
{
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    job *j = w->head;
    w->head = w->tail = NULL;
    w->qlen = 0;
    if (w->current) job_cancel(w->current);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->th, NULL);
    while (j) {
        job *next = j->next;
        char *b = api_error_body(j->req.kind, 503, "the server is shutting down", NULL);
        if (b) { job_write(j, b, strlen(b)); free(b); }
        job_finish(j, 503);
        job_unref(j);
        j = next;
    }
    disk_save(w, KV_DISK_REASON_SHUTDOWN);
    session_tools_clear(w);
    kv_disk_close(w->disk);
    tool_memory_free(w->mem);
    free(w->live_text);
    free(w->live_toks);
    snap_drop(w);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
}

int worker_submit(worker *w, job *j)
{
    pthread_mutex_lock(&w->mu);
    if (w->stop || w->qlen >= w->cfg.max_queue) {
        pthread_mutex_unlock(&w->mu);
        return -1;
    }
    job_ref(j);
    j->next = NULL;
    if (w->tail) w->tail->next = j;
    else w->head = j;
    w->tail = j;
    w->qlen++;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return 0;
}

const char *worker_model_id(worker *w) { return w->eng->model_id; }

int worker_queue_length(worker *w)
{
    pthread_mutex_lock(&w->mu);
    int n = w->qlen;
    pthread_mutex_unlock(&w->mu);
    return n;
}

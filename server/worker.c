/*
 * worker.c - the engine thread: queue, slots, prefix reuse, disk cache,
 * prefill and batched generation.
 *
 * The engine holds --parallel N live sessions, one per slot. A slot's
 * session is described by two parallel facts kept here: the tokens it
 * holds (live_toks) and the bytes they spell (live_text, always the
 * concatenation of the tokens' bytes). A new prompt reuses a slot's session
 * when
 *   1. the live tokens are a prefix of the prompt's tokens, or
 *   2. the live text is a byte prefix of the prompt (sampled tokens are
 *      often not the canonical BPE of their own text; chat-format §7.5):
 *      the live tokens stay and only the new suffix is tokenized;
 * otherwise the slot's session is saved to disk ("evict" moment), and the
 * longest disk snapshot whose text prefixes the prompt is restored, or the
 * session is reset and the whole prompt prefilled ("cold", saved when it is
 * long enough). A session that grew by --kv-cache-continued-interval-tokens
 * since its last save is saved again ("continued"), and every slot's
 * session is saved at shutdown.
 *
 * Scheduling (one thread, so the engine is never called concurrently):
 * queued requests take free slots in arrival order, each the free slot
 * whose session covers most of its prompt (rule 1 or 2 above), else the
 * least recently used one. Then each scheduler step does
 *   - one prefill chunk (the engine's prefill_chunk tokens) of the oldest slot still
 *     prefilling, so a long prompt delays the other streams by one chunk
 *     per token instead of freezing them;
 *   - one decode step: every generating slot samples its next token, and
 *     all those tokens are fed with ONE engine decode_batch call.
 * With --parallel 1 this is the old one-request-at-a-time loop exactly.
 *
 * A slot's session side (live text and tokens, memory snapshot, disk
 * save and restore) is slot_session.c; this file is the request side.
 */
#include "server/worker.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "engine/kv_disk.h"
#include "include/ds4.h"
#include "server/api_response.h"
#include "server/output_parser.h"
#include "server/dsml_grammar.h"
#include "server/json_grammar.h"
#include "server/prompt_render.h"
#include "server/server_log.h"
#include "server/slot.h"
#include "server/tool_memory.h"
#include "server/trace.h"

#define MAX_SLOTS 256            /* --parallel's bound (server_config.c) */

struct worker {
    srv_engine *eng;
    server_config cfg;
    kv_disk *disk;
    tool_memory *mem;

    pthread_t th;
    pthread_mutex_t mu;      /* queue, stop, n_busy, slot jobs, stats */
    pthread_cond_t cv;
    job *head, *tail;
    int qlen;
    bool stop;

    slot *slots;
    int n_slots;
    int n_busy;              /* slots serving a request (or being given one) */
    uint64_t clock;          /* admissions and request ends */
    int last_batch;          /* size of the previous decode step (trace) */
    worker_stats stats;

};

/* prompts of at least this many new tokens log their prefill progress */
#define PREFILL_PROGRESS_MIN 2048

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

static void disk_save(worker *w, slot *s, kv_disk_reason reason)
{
    slot_disk_save(w->disk, w->eng, s, (size_t)w->cfg.kv_cache_min_tokens, reason);
}

static bool disk_restore(worker *w, slot *s, const char *prompt, size_t plen, const int32_t *q, size_t nq)
{
    return slot_disk_restore(w->disk, w->mem, w->eng, s, prompt, plen, q, nq);
}

/* ---- responses ---------------------------------------------------------------- */

static void job_sink(void *ud, const char *s, size_t n) { job_write(((sink_ctx *)ud)->j, s, n); }

static void on_event(void *ud, const out_event *ev)
{
    sink_ctx *c = ud;
    if (ev->type == OUT_TOOL_START) {
        c->calls_started++;
        trace_printf("%stool: call %d start %s id %s", c->tag, ev->index, ev->name, ev->id);
    } else if (ev->type == OUT_TOOL_END) {
        c->calls_ended++;
        trace_printf("%stool: call %d end", c->tag, ev->index);
    }
    resp_writer_event(c->rw, ev);
}

static void fail_job(job *j, int status, const char *msg, bool streaming_started)
{
    slog_error("POST", slog_endpoint((int)j->req.kind), status, msg);
    trace_printf("error %d: %s", status, msg);
    if (streaming_started || job_headers_sent(j)) {
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

/* The request is over (its job finished or failed): free what it held and
 * give the slot back; its live session stays for prefix reuse. */
static void slot_release(worker *w, slot *s)
{
    jg_state_free(s->jst);
    json_grammar_free(s->jgram);
    s->jst = NULL;
    s->jgram = NULL;
    dg_state_free(s->dst);
    dsml_grammar_free(s->dgram);
    s->dst = NULL;
    s->dgram = NULL;
    free(s->opening);
    free(s->closing);
    free(s->tail);
    free(s->q);
    free(s->prompt);
    out_parser_free(s->op);
    resp_writer_free(s->sc.rw);
    job *j = s->j;
    pthread_mutex_lock(&w->mu);
    s->j = NULL;
    s->phase = SLOT_IDLE;
    s->last_used = ++w->clock;
    w->n_busy--;
    pthread_mutex_unlock(&w->mu);
    /* zero the request fields, keep the live session */
    s->opening = s->closing = NULL;
    s->tail = s->q = NULL;
    s->prompt = NULL;
    s->op = NULL;
    s->sc.rw = NULL;
    job_unref(j);
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
/* plain: tokenized as text, markers only inside tpl's ranges (NULL: none) */
static int force_text_as(worker *w, slot *s, const char *text, int budget, bool plain, const ds4_spans *tpl)
{
    srv_engine *e = w->eng;
    int32_t *t = NULL;
    size_t n = 0;
    int rc0 = plain ? e->tokenize_prompt(e, text, strlen(text), tpl, 0, &t, &n)
                    : e->tokenize(e, text, strlen(text), &t, &n);
    if (rc0 != 0) return -1;
    if (n > (size_t)budget || s->n_live + n >= (size_t)e->ctx) {
        slot_trace(s, "tool_choice: %zu forced tokens do not fit: the answer ends here", n);
        free(t);
        return 0;
    }
    slot_trace(s, "forcing %zu tokens: %s", n, text);
    int rc = n && e->prefill(e, s->id, t, n) != 0 ? -1 : 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        /* the live text stays the exact bytes of the live tokens */
        char b[4096];
        int bl = e->token_bytes(e, t[i], b, sizeof b);
        if (bl < 0 || slot_add_toks(s, &t[i], 1) != 0 || slot_add_text(s, b, (size_t)bl) != 0) rc = -1;
        else out_parser_feed(s->op, b, (size_t)bl);
    }
    free(t);
    return rc < 0 ? -1 : (int)n;
}

/* The server's own text (DSML openings and closings, </think>): its
 * markers are meant. */
static int force_text(worker *w, slot *s, const char *text, int budget)
{
    return force_text_as(w, s, text, budget, false, NULL);
}

static bool name_allow(void *ud, const char *b, size_t n)
{
    const name_filter *f = ud;
    const char *have = f->s->live_text + f->from;
    size_t hl = f->s->live_len - f->from;
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

/* Structured output: a token may be sampled when its bytes keep the
 * answer valid JSON under the schema; end-of-sentence only once the value
 * is complete; no other special token. */
static bool json_allow(void *ud, const char *b, size_t n)
{
    slot *s = ud;
    const jg_state *st = s->jst;
    static const char *const specials[] = {DS4_BOS, DS4_USER, DS4_ASSISTANT, DS4_THINK, DS4_ENDTHINK};
    if (n == strlen(DS4_EOS) && !memcmp(b, DS4_EOS, n)) return jg_done(st);
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++)
        if (n == strlen(specials[i]) && !memcmp(b, specials[i], n)) return false;
    if (n == 0) return true;
    /* the bytes that may come next, once per step: most of the
     * vocabulary fails on its first byte */
    if (!s->jfirst_known) {
        memset(s->jfirst, 0, sizeof s->jfirst);
        for (int c = 0; c < 256; c++) {
            char ch = (char)c;
            if (jg_accepts(st, &ch, 1)) s->jfirst[c >> 6] |= 1ull << (c & 63);
        }
        s->jfirst_known = true;
    }
    unsigned b0 = (unsigned char)b[0];
    if (!(s->jfirst[b0 >> 6] >> (b0 & 63) & 1)) return false;
    return n == 1 || jg_accepts(st, b, n);
}

/* A forced call under its tool's schema: a token may be sampled when its
 * bytes keep the block valid DSML of a valid call; no chat marker, and the
 * DSML marker only where it is structure (in a value it would be text the
 * replay spells differently). */
static bool dsml_allow(void *ud, const char *b, size_t n)
{
    dg_state *st = ud;
    static const char *const specials[] = {DS4_BOS, DS4_EOS, DS4_USER, DS4_ASSISTANT, DS4_THINK, DS4_ENDTHINK};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++)
        if (n == strlen(specials[i]) && !memcmp(b, specials[i], n)) return false;
    if (n == strlen(DS4_DSML) && !memcmp(b, DS4_DSML, n) && dg_marker_is_text(st)) return false;
    return dg_accepts(st, b, n);
}

/* Does a forced call follow its tool's schema? Anthropic's forced
 * tool_choice is its structured-output form, so always; OpenAI's only for
 * strict tools (every tool for "required"). */
static bool schema_forced(const api_request *r)
{
    if (r->kind == API_MESSAGES) return true;
    for (size_t i = 0; i < r->n_tools; i++)
        if ((r->tool_choice == TOOL_CHOICE_REQUIRED || !strcmp(r->tools[i].name, r->tool_choice_name)) &&
            !r->tools[i].strict)
            return false;
    return true;
}

/* The forced call's grammar: the named tool, or every tool. NULL (with the
 * reason in the trace) when a schema is not one it can take. */
static void dsml_grammar_start(slot *s, const api_request *r)
{
    bool named = r->tool_choice == TOOL_CHOICE_NAMED;
    dg_tool *t = calloc(r->n_tools ? r->n_tools : 1, sizeof *t);
    char **texts = calloc(r->n_tools ? r->n_tools : 1, sizeof *texts);
    size_t n = 0;
    for (size_t i = 0; t && texts && i < r->n_tools; i++) {
        if (named && strcmp(r->tools[i].name, r->tool_choice_name)) continue;
        /* schema_json is {"name","description","parameters"} */
        json_t *o = json_loads(r->tools[i].schema_json, 0, NULL);
        json_t *p = json_object_get(o, "parameters");
        texts[n] = p ? json_dumps(p, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        t[n].name = r->tools[i].name;
        t[n].schema_json = texts[n];
        n++;
        json_decref(o);
    }
    char err[160] = "out of memory";
    s->dgram = t && texts ? dsml_grammar_new(t, n, err, sizeof err) : NULL;
    s->dst = s->dgram ? dg_state_new(s->dgram, named ? 0 : -1) : NULL;
    if (!s->dst) {
        slot_trace(s, "tool_choice: parameters not constrained: %s", err);
        dsml_grammar_free(s->dgram);
        s->dgram = NULL;
    } else {
        slot_trace(s, "tool_choice: parameters follow the schema of %s", named ? r->tool_choice_name : "each tool");
    }
    for (size_t i = 0; texts && i < n; i++) free(texts[i]);
    free(texts);
    free(t);
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

/* ---- admission: slot choice and the reuse decision ----------------------------------- */

/* The free slot for a prompt: the one whose live session or memory
 * snapshot covers most of it (by tokens or text, as reused below), then the
 * least recently used. */
static slot *choose_slot(worker *w, const int32_t *q, size_t nq, const char *prompt, size_t plen)
{
    slot *best = NULL;
    size_t best_cover = 0;
    for (int i = 0; i < w->n_slots; i++) {
        slot *s = &w->slots[i];
        if (s->phase != SLOT_IDLE) continue;
        size_t cover = slot_live_match(w->eng, s, q, nq, prompt, plen) ? s->n_live : 0;
        if (slot_snap_match(w->eng, s, q, nq, prompt, plen) && s->snap.n > cover) cover = s->snap.n;
        if (!best || cover > best_cover || (cover == best_cover && s->last_used < best->last_used)) {
            best = s;
            best_cover = cover;
        }
    }
    return best;
}

static void end_request(worker *w, slot *s);

/* Takes a job off the queue (a slot is reserved for it in n_busy): renders
 * and tokenizes its prompt, picks the slot, decides what of the prompt the
 * slot (or the memory snapshot, or the disk) already holds, and leaves the
 * slot in SLOT_PREFILL with the suffix to prefill. Failures answer the job. */
static void admit(worker *w, job *j)
{
    api_request *r = &j->req;
    srv_engine *e = w->eng;
    bool thinking = r->thinking != 0;
    bool think_max = thinking && r->think_max && e->ctx >= 393216;
    bool tools = r->n_tools > 0 && r->tool_choice != TOOL_CHOICE_NONE;
    render_opts ro = {thinking, think_max, tools, w->cfg.disable_exact_replay ? NULL : w->mem};
    size_t plen = 0;
    int replayed = 0;
    int32_t *q = NULL;
    size_t nq = 0;
    /* the template ranges: only they may yield special tokens */
    ds4_spans tpl = {0};
    char *prompt = prompt_render_spans(r, &ro, &plen, &replayed, &tpl);
    const char *fail = !prompt ? "out of memory rendering the prompt"
                       : e->tokenize_prompt(e, prompt, plen, &tpl, 0, &q, &nq) != 0 ? "tokenizer failed" : NULL;
    slot *s = fail ? NULL : choose_slot(w, q, nq, prompt, plen);
    if (!s) {
        if (prompt) trace_text(thinking ? "prompt (thinking)" : "prompt (chat)", prompt, plen);
        fail_job(j, 500, fail ? fail : "no free slot", false);
        free(prompt);
        free(q);
        ds4_spans_free(&tpl);
        pthread_mutex_lock(&w->mu);
        w->n_busy--;
        pthread_mutex_unlock(&w->mu);
        job_unref(j);
        return;
    }
    pthread_mutex_lock(&w->mu);
    s->j = j;
    s->phase = SLOT_PREFILL;
    s->admitted = ++w->clock;
    pthread_mutex_unlock(&w->mu);
    pthread_mutex_lock(&j->mu);
    j->started = true;
    pthread_mutex_unlock(&j->mu);
    s->thinking = thinking;
    s->tools = tools;
    s->prompt = prompt;
    s->plen = plen;
    s->q = q;
    s->nq = nq;
    s->tail = NULL;
    s->opening = s->closing = NULL;
    s->op = NULL;
    memset(&s->sc, 0, sizeof s->sc);
    memset(&s->u, 0, sizeof s->u);
    slot_trace_text(s, thinking ? "prompt (thinking)" : "prompt (chat)", prompt, plen);
    if (replayed) slot_trace(s, "tool: %d assistant turn(s) replayed from exact sampled DSML", replayed);

    s->t0 = now_ms();
    const char *decision = "cold";
    /* Reuse: the live session when it prefixes the prompt (by tokens, else
     * by text), unless the memory snapshot covers more; then the disk. */
    int live = slot_live_match(w->eng, s, q, nq, prompt, plen);
    bool live_tok = live == 1, live_txt = live == 2;
    size_t live_cover = live ? s->n_live : 0;
    int snap = slot_snap_match(w->eng, s, q, nq, prompt, plen);
    bool by_tokens = false;
    if (snap && s->snap.n > live_cover) {
        if (s->n_live && !live_cover) disk_save(w, s, KV_DISK_REASON_EVICT);
        if (slot_snap_restore(w->eng, s)) {
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
        if (s->n_live) disk_save(w, s, KV_DISK_REASON_EVICT);
        if (disk_restore(w, s, prompt, plen, q, nq)) decision = "disk";
        else slot_reset(w->eng, s);
    }
    if (by_tokens) {
        s->suffix = q + s->n_live;
        s->n_suffix = nq - s->n_live;
    } else if (!strcmp(decision, "cold")) {
        s->suffix = q;
        s->n_suffix = nq;
    } else if (e->tokenize_prompt(e, prompt + s->live_len, plen - s->live_len, &tpl, s->live_len, &s->tail,
                                  &s->n_suffix) == 0) {
        s->suffix = s->tail;
    } else {
        fail_job(j, 500, "tokenizer failed", false);
        slot_release(w, s);
        ds4_spans_free(&tpl);
        return;
    }
    ds4_spans_free(&tpl);
    s->u.cached_tokens = (int)s->n_live;
    s->u.prompt_tokens = (int)(s->n_live + s->n_suffix);
    s->u.cache = decision;
    slot_trace(s, "cache: %s: %zu tokens reused, %zu to prefill (prompt %d tokens, %zu bytes)", decision,
               s->n_live, s->n_suffix, s->u.prompt_tokens, plen);
    if (s->u.prompt_tokens >= e->ctx) {
        char msg[160];
        snprintf(msg, sizeof msg, "the prompt has %d tokens; the context is %d", s->u.prompt_tokens, e->ctx);
        slot_reset(w->eng, s);
        fail_job(j, 400, msg, false);
        slot_release(w, s);
        return;
    }
    if (tools && (r->tool_choice == TOOL_CHOICE_REQUIRED || r->tool_choice == TOOL_CHOICE_NAMED)) {
        bool named = r->tool_choice == TOOL_CHOICE_NAMED;
        s->opening = prompt_render_call_opening(named ? r->tool_choice_name : NULL);
        s->closing = named ? prompt_render_calls_close() : NULL;
        if (!s->opening || (named && !s->closing)) {
            fail_job(j, 500, "out of memory", false);
            slot_release(w, s);
            return;
        }
    }
    s->sc.j = j;
    s->sc.tag = s->tag;
    s->sc.rw = resp_writer_new(r->kind, r->stream, r->include_usage, r->model ? r->model : e->model_id, job_sink, &s->sc);
    if (!s->sc.rw) { fail_job(j, 500, "out of memory", false); slot_release(w, s); return; }
    resp_writer_tool_choice(s->sc.rw, r->tool_choice, r->tool_choice_name);
    resp_writer_request(s->sc.rw, r);
    if (r->left_out[0]) slot_trace(s, "left out of the prompt: %s", r->left_out);
    resp_writer_begin(s->sc.rw, &s->u);

    /* The stable point (see the in-memory snapshot above): in thinking mode
     * without tools, prefill all but the final <think>, snapshot, then it. */
    s->head = s->n_suffix;
    s->stable = false;
    if (thinking && !tools && s->n_suffix > 0 && w->cfg.kv_memory_snapshot_mb > 0) {
        char b[16];
        int bl = e->token_bytes(e, s->suffix[s->n_suffix - 1], b, sizeof b);
        s->stable = bl == (int)strlen(DS4_THINK) && !memcmp(b, DS4_THINK, (size_t)bl);
        if (s->stable) s->head = s->n_suffix - 1;
    }
    s->text_end = plen - (s->stable ? strlen(DS4_THINK) : 0);
    s->pf_pos = 0;
    s->head_done = false;
    /* a cold prompt's disk copy is taken at the stable point too: it then
     * serves the next turn as well as this prompt again */
    s->save_cold = !strcmp(decision, "cold") && (int)nq <= w->cfg.kv_cache_cold_max_tokens;
}

/* ---- prefill: one chunk per scheduler step ------------------------------------------ */

static void start_decode(worker *w, slot *s);

/* Prefills the next chunk of the slot's suffix (checking for a vanished
 * client first); at the stable point takes the snapshots; when the suffix
 * is in, the slot starts generating. */
static void prefill_step(worker *w, slot *s)
{
    srv_engine *e = w->eng;
    api_request *r = &s->j->req;
    size_t end = s->head_done ? s->n_suffix : s->head;
    int rc = 0;
    if (s->pf_pos < end) {
        if (job_is_cancelled(s->j)) rc = 1;
        else {
            size_t chunk = (size_t)e->prefill_chunk;
            size_t k = end - s->pf_pos < chunk ? end - s->pf_pos : chunk;
            if (e->prefill(e, s->id, s->suffix + s->pf_pos, k) != 0 || slot_add_toks(s, s->suffix + s->pf_pos, k) != 0)
                rc = -1;
            /* a long prefill says how far it got, about every quarter */
            size_t quarter = s->n_suffix / 4;
            if (rc == 0 && s->n_suffix >= PREFILL_PROGRESS_MIN && s->pf_pos / quarter != (s->pf_pos + k) / quarter &&
                s->pf_pos + k < s->n_suffix) {
                double ms = now_ms() - s->t0;
                slog_event("prefill", "slot %d: %zu/%zu tokens (%.0f%%), %.1f s, %.0f tok/s", s->id, s->pf_pos + k,
                           s->n_suffix, 100.0 * (double)(s->pf_pos + k) / (double)s->n_suffix, ms / 1000.0,
                           ms > 0 ? (double)(s->pf_pos + k) / (ms / 1000.0) : 0.0);
            }
            s->pf_pos += k;
        }
        if (rc == 0 && s->pf_pos < end) return; /* more next step */
    }
    if (rc == 0 && !s->head_done) {
        s->head_done = true;
        if (slot_add_text(s, s->prompt + s->live_len, s->text_end - s->live_len) != 0) rc = -1;
        if (rc == 0 && s->stable) {
            if (s->save_cold) disk_save(w, s, KV_DISK_REASON_COLD);
            s->save_cold = false;
            slot_snap_take(w->eng, s, w->cfg.kv_memory_snapshot_mb << 20);
            if (s->pf_pos < s->n_suffix) return; /* the <think> next step */
        }
    }
    if (rc == 0 && s->stable && slot_add_text(s, DS4_THINK, strlen(DS4_THINK)) != 0) rc = -1;
    if (rc != 0) {
        /* the session no longer matches its text: start over next time */
        slot_reset(w->eng, s);
        if (rc < 0) fail_job(s->j, 500, e->err[0] ? e->err : "prefill failed", r->stream);
        else job_finish(s->j, 499);
        slot_release(w, s);
        return;
    }
    s->u.prefill_ms = now_ms() - s->t0;
    if (s->save_cold) disk_save(w, s, KV_DISK_REASON_COLD);
    start_decode(w, s);
}

/* ---- generation: one token per slot per scheduler step ----------------------------- */

static void start_decode(worker *w, slot *s)
{
    srv_engine *e = w->eng;
    api_request *r = &s->j->req;
    s->t1 = now_ms();
    s->op = out_parser_new(s->thinking, s->tools, r->kind == API_MESSAGES ? "toolu_" : "call_", r->stop, r->n_stop,
                           on_event, &s->sc);
    if (!s->op) { fail_job(s->j, 500, "out of memory", r->stream); slot_release(w, s); return; }
    int max = r->max_tokens > 0 ? r->max_tokens : w->cfg.default_max_tokens;
    if ((size_t)max > (size_t)e->ctx - s->n_live) max = (int)((size_t)e->ctx - s->n_live);
    s->max = max;
    s->sp = (srv_sampling){
        .temperature = r->temperature >= 0 ? r->temperature : w->cfg.default_temperature,
        .top_p = r->top_p >= 0 ? r->top_p : 1.0,
        .min_p = r->min_p >= 0 ? r->min_p : 0.05,
        .top_k = r->top_k >= 0 ? r->top_k : 0,
        .seed = r->has_seed ? r->seed : ((uint64_t)time(NULL) * 6364136223846793005ull) ^ (uint64_t)(uintptr_t)s->j,
    };
    s->nf = (name_filter){s, r, 0};
    /* structured output: the visible answer (after the reasoning) follows
     * the schema's grammar; with tools declared the model may call them
     * instead, so the grammar applies only without tools */
    if (r->response_format != RF_TEXT && !s->tools) {
        char err[160];
        s->jgram = json_grammar_new(r->rf_schema, err, sizeof err);
        s->jst = s->jgram ? jg_state_new(s->jgram) : NULL;
        s->jfirst_known = false;
        if (!s->jst) { fail_job(s->j, 500, s->jgram ? "out of memory" : err, r->stream); slot_release(w, s); return; }
        slot_trace(s, "response format: %s", r->rf_schema ? r->rf_schema : "json_object");
    }
    if (s->opening && schema_forced(r)) dsml_grammar_start(s, r);
    s->fin = FIN_LENGTH;
    s->gen = s->reasoning_toks = 0;
    s->failed = s->cancelled = false;
    s->in_reasoning = s->thinking;
    s->first = true;
    /* enforcement: the opening is due once the visible answer begins */
    s->open_due = s->opening && !s->thinking;
    s->opened = s->closed = false;
    s->pending = -1;
    s->phase = SLOT_DECODE;
}

/* Runs the request's logic up to its next token: forced text is prefilled
 * here, the model's token is sampled. Returns true with *tok to feed in
 * the batched step, false when the request is over (fin/failed/cancelled
 * say why). */
static bool gen_next(worker *w, slot *s, int32_t *tok)
{
    srv_engine *e = w->eng;
    while (s->gen < s->max) {
        if (job_is_cancelled(s->j)) { s->cancelled = true; return false; }
        if (s->open_due) {
            int k = force_text(w, s, s->opening, s->max - s->gen);
            if (k < 0) { s->failed = true; return false; }
            if (k == 0) return false; /* no room: "length" */
            s->gen += k;
            s->open_due = false;
            s->opened = true;
            s->nf.from = s->live_len;
            continue;
        }
        if (s->closing && s->opened && !s->closed && s->sc.calls_ended > 0) {
            s->closed = true; /* one try: what follows the invoke is decided now */
            char *rest = named_close_rest(s->op, s->closing);
            if (rest && *rest) {
                int k = force_text(w, s, rest, s->max - s->gen);
                free(rest);
                if (k < 0) { s->failed = true; return false; }
                if (k == 0) return false;
                s->gen += k;
                if (out_parser_done(s->op)) { s->fin = FIN_TOOL_CALLS; return false; }
                continue;
            }
            free(rest);
        }
        if (s->dst && !dg_done(s->dst) && (s->opened || s->in_reasoning)) {
            /* a forced call under its schema: when the rest of the budget
             * would end inside it, close the reasoning (the opening and
             * the call need the rest), or write the call's shortest
             * completion, so even a cut call validates */
            ds4_spans tpl = {0};
            size_t cl = 0;
            char *comp = dg_completion(s->dst, &cl, &tpl);
            size_t left = (size_t)(s->max - s->gen);
            bool due = comp && left <= (s->opened ? cl : strlen(s->opening) + cl + 8);
            int k = 0;
            if (due && !s->opened) {
                k = force_text(w, s, DS4_ENDTHINK, s->max - s->gen);
                if (k > 0) {
                    s->reasoning_toks += k;
                    s->in_reasoning = false;
                    s->open_due = true;
                }
            } else if (due) {
                /* names and values stay text (schema strings); the DSML
                 * structure keeps its markers */
                k = force_text_as(w, s, comp, s->max - s->gen, true, &tpl);
                if (k > 0) dg_feed(s->dst, comp, cl);
            }
            free(comp);
            ds4_spans_free(&tpl);
            if (due) {
                if (k <= 0) { s->failed = k < 0; return false; }
                s->gen += k;
                if (s->opened) return false; /* complete; finish "length" */
                continue;
            }
        }
        if (s->jst) {
            /* structured output: when the rest of the budget would end
             * inside the JSON, write its shortest completion (closing
             * </think> first), so the answer still parses */
            size_t cl = 0;
            char *comp = jg_done(s->jst) ? NULL : jg_completion(s->jst, &cl);
            size_t left = (size_t)(s->max - s->gen);
            const char *forced = !comp ? NULL
                               : s->in_reasoning ? (left <= cl + 8 ? DS4_ENDTHINK : NULL)
                               : (left <= cl ? comp : NULL);
            if (forced) {
                /* the JSON's completion may repeat strings of the
                 * client's schema (enum, const): plain text, no specials */
                int k = force_text_as(w, s, forced, s->max - s->gen, forced == comp, NULL);
                if (k > 0 && forced == comp) jg_feed(s->jst, comp, cl);
                s->jfirst_known = false;
                free(comp);
                if (k <= 0) { s->failed = k < 0; return false; }
                s->gen += k;
                if (s->in_reasoning) { s->reasoning_toks += k; s->in_reasoning = false; continue; }
                return false; /* complete; finish "length" */
            }
            free(comp);
        }
        int32_t t;
        s->sp.reseed = s->first;
        s->first = false;
        s->sp.greedy = out_parser_structural(s->op);
        /* "required": the name's tokens until its tag closes */
        bool naming = s->opened && !s->closing && s->sc.calls_started == 0;
        s->sp.allow = naming ? name_allow : NULL;
        s->sp.allow_ud = naming ? &s->nf : NULL;
        if (s->dst && s->opened) {
            /* the forced call under its schema (the names included) */
            s->sp.allow = dsml_allow;
            s->sp.allow_ud = s->dst;
        }
        if (s->jst && !s->in_reasoning) {
            s->sp.allow = json_allow;
            s->sp.allow_ud = s;
        }
        if (s->pending >= 0) { /* --mtp: the speculative rule's draw (spec_step) */
            t = s->pending;
            s->pending = -1;
        } else if (e->sample(e, s->id, &s->sp, &t) != 0) {
            s->failed = true;
            return false;
        }
        if (t == e->eos) {
            if (s->jst && s->in_reasoning) {
                /* the answer is due: close the reasoning, then the JSON */
                int k = force_text(w, s, DS4_ENDTHINK, s->max - s->gen);
                if (k <= 0) { s->failed = k < 0; return false; }
                s->gen += k;
                s->reasoning_toks += k;
                s->in_reasoning = false;
                continue;
            }
            if (s->opening && !s->opened && s->in_reasoning) {
                /* the model would end inside its reasoning: close it
                 * (as the canonical turn reads) and open the call */
                int k = force_text(w, s, DS4_ENDTHINK, s->max - s->gen);
                if (k <= 0) { s->failed = k < 0; return false; }
                s->gen += k;
                s->reasoning_toks += k;
                s->in_reasoning = false;
                s->open_due = true;
                continue;
            }
            s->fin = FIN_STOP;
            return false;
        }
        *tok = t;
        return true;
    }
    return false;
}

/* The token fed in the batched step: its bytes go to the live text and the
 * output parser. Returns false when the request is over. */
static bool gen_accepted(worker *w, slot *s, int32_t t)
{
    srv_engine *e = w->eng;
    char bytes[4096];
    int bl = e->token_bytes(e, t, bytes, sizeof bytes);
    /* the live text must stay the exact bytes of the live tokens */
    if (bl < 0 || slot_add_toks(s, &t, 1) != 0 || slot_add_text(s, bytes, (size_t)bl) != 0) {
        snprintf(e->err, sizeof e->err, "token %d has no text or memory ran out", (int)t);
        s->failed = true;
        return false;
    }
    s->gen++;
    bool was_reasoning = s->in_reasoning;
    if (s->in_reasoning) {
        s->reasoning_toks++;
        size_t win = (size_t)bl + 8 < s->live_len - s->plen ? (size_t)bl + 8 : s->live_len - s->plen;
        if (memmem(s->live_text + s->live_len - win, win, "</think>", 8)) {
            s->in_reasoning = false;
            s->open_due = s->opening && !s->opened;
        }
    }
    if (s->jst && !s->in_reasoning) {
        /* the answer's bytes (after </think> when it ends in this token) */
        const char *a = bytes;
        size_t al = (size_t)bl;
        const char *et = was_reasoning ? memmem(bytes, al, "</think>", 8) : NULL;
        if (et) { al -= (size_t)(et + 8 - bytes); a = et + 8; }
        else if (was_reasoning) al = 0;
        if (al && t != e->eos) jg_feed(s->jst, a, al);
        s->jfirst_known = false;
    }
    if (s->dst && s->opened && !dg_done(s->dst) && dg_feed(s->dst, bytes, (size_t)bl) != 0)
        slot_trace(s, "tool_choice: token %d left the schema's grammar", (int)t); /* not reached: filtered */
    out_parser_feed(s->op, bytes, (size_t)bl);
    if (out_parser_done(s->op)) {
        s->fin = out_parser_stopped_by_sequence(s->op) ? FIN_STOP_SEQUENCE : FIN_TOOL_CALLS;
        return false;
    }
    return s->gen < s->max;
}

/* The end of a generating request: the final events or body, the trace,
 * the exact-replay map, the continued disk save. */
static void end_request(worker *w, slot *s)
{
    srv_engine *e = w->eng;
    job *j = s->j;
    api_request *r = &j->req;
    out_parser *op = s->op;
    out_parser_finish(op);
    if (s->fin == FIN_STOP && out_parser_n_calls(op)) s->fin = FIN_TOOL_CALLS;
    s->u.completion_tokens = s->gen;
    s->u.reasoning_tokens = s->reasoning_toks;
    s->u.decode_ms = now_ms() - s->t1;
    size_t gl;
    const char *gtext = out_parser_text(op, &gl);
    slot_trace_text(s, "generated", gtext, gl);
    slot_trace(s, "done: %d tokens, finish %d%s%s, prefill %.1f ms, decode %.1f ms", s->gen, (int)s->fin,
               s->cancelled ? ", client gone" : "", s->failed ? ", engine error" : "", s->u.prefill_ms, s->u.decode_ms);

    size_t nc = out_parser_n_calls(op);
    size_t rl = 0;
    const char *raw = out_parser_raw_block(op, &rl);
    if (nc && raw && rl) {
        const char *ids[64];
        size_t n = nc < 64 ? nc : 64;
        for (size_t i = 0; i < n; i++) ids[i] = out_parser_call(op, i)->id;
        if (w->mem) tool_memory_put(w->mem, ids, n, raw, rl);
        for (size_t i = 0; i < n; i++) slot_tool_add(s, ids[i], raw, rl);
    }
    static const char *const fin_name[] = {"stop", "length", "tool_calls", "stop_sequence"};
    slog_request_info li = {
        .endpoint = slog_endpoint((int)r->kind), .model = r->model,
        .status = s->failed ? 500 : s->cancelled ? 499 : 200,
        .prompt_tokens = s->u.prompt_tokens, .reused_tokens = s->u.cached_tokens,
        .generated_tokens = s->gen, .reasoning_tokens = s->reasoning_toks, .cache = s->u.cache,
        .finish = s->failed ? "error" : s->cancelled ? "cancelled" : fin_name[s->fin],
        .queue_ms = s->t0 - j->submitted_ms, .prefill_ms = s->u.prefill_ms, .decode_ms = s->u.decode_ms,
    };
    if (s->failed) {
        slot_reset(w->eng, s);
        fail_job(j, 500, e->err[0] ? e->err : "generation failed", r->stream);
    } else if (s->cancelled) {
        job_finish(j, 499);
    } else {
        resp_writer_end(s->sc.rw, op, s->fin, &s->u);
        job_finish(j, 200);
    }
    slog_request(&li);
    if (w->cfg.kv_cache_continued_interval_tokens > 0 &&
        s->n_live - s->saved_tokens >= (size_t)w->cfg.kv_cache_continued_interval_tokens)
        disk_save(w, s, KV_DISK_REASON_CONTINUED);
    slot_release(w, s);
}

/* --mtp: may this step speculate? Only where the one-token path samples
 * every token from the plain logits up to the end-of-sentence token: no
 * token filter (structured output, a forced call's name or schema) and no
 * forced text (tool_choice); the output parser, stop strings and the
 * token budget are then checked per accepted token below. */
static bool spec_allowed(const worker *w, const slot *s)
{
    return w->eng->decode_spec && !s->sp.allow && !s->jst && !s->opening && !s->dst && s->max - s->gen >= 2;
}

/* One speculative step of a slot: t and the drafts the model confirmed
 * are fed as one chunk. The drafts are judged under the sampling mode
 * that follows t (greedy where the parser wants DSML structure, the
 * request's sampling otherwise); each is then taken as a one-token step
 * takes its token (live text, output parser: stop strings, tool-call
 * ends; the budget; a client gone between tokens) while that mode holds.
 * Where the request ends, or the mode changes, inside the drafts the step
 * is trimmed to the tokens taken, so the session holds exactly what the
 * one-token path would; the next token is then sampled afresh (a position
 * the rule did not settle: the output distribution is unchanged). */
static void spec_step(worker *w, slot *s, int32_t t)
{
    srv_engine *e = w->eng;
    int32_t fed[17], next = -1;
    int nf = 0, drafted = 0;
    bool more = gen_accepted(w, s, t);
    bool mode = out_parser_structural(s->op);
    srv_sampling sa = s->sp;
    sa.greedy = mode;
    sa.allow = NULL;
    /* a request that ended at t has t fed alone (max_out 1: no drafts) */
    if (e->decode_spec(e, s->id, t, &sa, more ? s->max - s->gen + 1 : 1, fed, &nf, &drafted, &next) != 0) {
        s->failed = true;
        end_request(w, s);
        return;
    }
    int used = 1;
    for (int i = 0; more && i < nf && out_parser_structural(s->op) == mode; i++) {
        if (job_is_cancelled(s->j)) { s->cancelled = true; more = false; break; }
        more = gen_accepted(w, s, fed[i]);
        used++;
    }
    if (more && used == 1 + nf && out_parser_structural(s->op) == mode) s->pending = next;
    s->u.mtp_drafted += drafted;
    s->u.mtp_accepted += nf;
    pthread_mutex_lock(&w->mu);
    w->stats.decode_steps++;
    w->stats.decode_tokens += (uint64_t)used;
    pthread_mutex_unlock(&w->mu);
    if (used < 1 + nf) {
        slot_trace(s, "mtp: %s at token %d of the %d fed: the step keeps %d",
                   more ? "the sampling mode changed" : "the request ended", used, 1 + nf, used);
        if (e->spec_trim(e, s->id, used) != 0) {
            s->failed = true;
            more = false;
        }
    }
    if (!more) end_request(w, s);
}

/* One decode step: each generating slot picks its next token, then all of
 * them are fed to their sessions with one decode_batch call (a slot that
 * speculates takes its own step: its verify chunk is its own forward). */
static void decode_step(worker *w)
{
    srv_engine *e = w->eng;
    int ids[MAX_SLOTS];
    int32_t toks[MAX_SLOTS];
    int n = 0;
    for (int i = 0; i < w->n_slots; i++) {
        slot *s = &w->slots[i];
        if (s->phase != SLOT_DECODE) continue;
        if (!gen_next(w, s, &toks[n])) end_request(w, s);
        else if (spec_allowed(w, s)) spec_step(w, s, toks[n]);
        else ids[n++] = s->id;
    }
    if (n == 0) return;
    if (w->n_slots > 1 && n != w->last_batch) {
        char list[512];
        size_t k = 0;
        list[0] = 0;
        for (int i = 0; i < n && k + 12 < sizeof list; i++)
            k += (size_t)snprintf(list + k, sizeof list - k, i ? ",%d" : "%d", ids[i]);
        trace_printf("decode: %d session%s per step (slots %s)", n, n > 1 ? "s" : "", list);
    }
    w->last_batch = n;
    pthread_mutex_lock(&w->mu);
    w->stats.decode_steps++;
    w->stats.decode_tokens += (uint64_t)n;
    if (n > 1) w->stats.batched_steps++;
    if (n > w->stats.max_batch) w->stats.max_batch = n;
    pthread_mutex_unlock(&w->mu);
    int rc = e->decode_batch(e, ids, toks, n);
    for (int i = 0; i < n; i++) {
        slot *s = &w->slots[ids[i]];
        if (rc != 0) {
            /* which sessions advanced is unknown: each one is reset */
            s->failed = true;
            end_request(w, s);
        } else if (!gen_accepted(w, s, toks[i])) {
            end_request(w, s);
        }
    }
}

/* ---- thread and queue ------------------------------------------------------------ */

static void *run(void *arg)
{
    worker *w = arg;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        while (!w->stop && !w->n_busy && !w->head) pthread_cond_wait(&w->cv, &w->mu);
        bool quit = w->stop && !w->n_busy;
        pthread_mutex_unlock(&w->mu);
        if (quit) break;
        /* queued jobs take the free slots, in arrival order */
        for (;;) {
            pthread_mutex_lock(&w->mu);
            job *j = NULL;
            if (!w->stop && w->head && w->n_busy < w->n_slots) {
                j = w->head;
                w->head = j->next;
                if (!w->head) w->tail = NULL;
                w->qlen--;
                w->n_busy++;
            }
            pthread_mutex_unlock(&w->mu);
            if (!j) break;
            if (job_is_cancelled(j)) {
                job_finish(j, 499);
                pthread_mutex_lock(&w->mu);
                w->n_busy--;
                pthread_mutex_unlock(&w->mu);
                job_unref(j);
            } else {
                admit(w, j);
            }
        }
        slot *pf = NULL;
        for (int i = 0; i < w->n_slots; i++) {
            slot *s = &w->slots[i];
            if (s->phase == SLOT_PREFILL && (!pf || s->admitted < pf->admitted)) pf = s;
        }
        if (pf) prefill_step(w, pf);
        decode_step(w);
    }
    return NULL;
}

static void slots_free(worker *w)
{
    for (int i = 0; w->slots && i < w->n_slots; i++) {
        slot *s = &w->slots[i];
        if (s->session_tools) slot_tools_clear(s);
        free(s->session_tools);
        free(s->live_text);
        free(s->live_toks);
        slot_snap_drop(s);
    }
    free(w->slots);
}

worker *worker_start(srv_engine *eng, const server_config *cfg, char *err, size_t es)
{
    worker *w = calloc(1, sizeof *w);
    if (!w) { snprintf(err, es, "out of memory"); return NULL; }
    w->eng = eng;
    w->cfg = *cfg;
    w->n_slots = eng->n_slots < 1 ? 1 : eng->n_slots > MAX_SLOTS ? MAX_SLOTS : eng->n_slots;
    w->slots = calloc((size_t)w->n_slots, sizeof *w->slots);
    for (int i = 0; w->slots && i < w->n_slots; i++) {
        slot *s = &w->slots[i];
        s->id = i;
        if (w->n_slots > 1) snprintf(s->tag, sizeof s->tag, "slot %d: ", i);
        s->session_tools = calloc(MAX_SESSION_TOOLS, sizeof *s->session_tools);
        if (!s->session_tools) { slots_free(w); w->slots = NULL; }
    }
    if (!w->slots) { snprintf(err, es, "out of memory"); free(w); return NULL; }
    w->stats.slots = w->n_slots;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (!cfg->disable_exact_replay) w->mem = tool_memory_new(cfg->tool_memory_max_ids);
    /* states saved under directional steering live in a subdirectory of
     * their settings' digest: never found by a server steered otherwise
     * (or not at all), kept for the next run steered the same way */
    char steered_dir[4096];
    if (cfg->kv_disk_dir && eng->state_key[0])
        snprintf(steered_dir, sizeof steered_dir, "%s/steer-%s", cfg->kv_disk_dir, eng->state_key);
    if (cfg->kv_disk_dir) {
        kv_disk_options o = {
            .dir = eng->state_key[0] ? steered_dir : cfg->kv_disk_dir,
            .space_bytes = (uint64_t)cfg->kv_disk_space_mb << 20,
            .quant_bits = eng->quant_bits,
            .ctx_size = (uint32_t)eng->ctx,
            /* the token list and a full-context state: nothing larger is read */
            .max_payload_bytes = eng->snapshot_max ? 4 + 4 * (uint64_t)eng->ctx + eng->snapshot_max(eng) : 0,
            .reject_different_quant = cfg->kv_cache_reject_different_quant,
            .log = disk_log,
        };
        w->disk = kv_disk_open(&o);
        if (!w->disk) {
            snprintf(err, es, "%s", ds4_last_error());
            tool_memory_free(w->mem);
            slots_free(w);
            free(w);
            return NULL;
        }
    }
    if (pthread_create(&w->th, NULL, run, w) != 0) {
        snprintf(err, es, "cannot start the worker thread");
        kv_disk_close(w->disk);
        tool_memory_free(w->mem);
        slots_free(w);
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
    for (int i = 0; i < w->n_slots; i++)
        if (w->slots[i].j) job_cancel(w->slots[i].j);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->th, NULL);
    while (j) {
        job *next = j->next;
        bool sse = job_headers_sent(j);
        char *b = sse ? api_error_event(j->req.kind, "the server is shutting down")
                      : api_error_body(j->req.kind, 503, "the server is shutting down", NULL);
        if (b) { job_write(j, b, strlen(b)); free(b); }
        job_finish(j, sse ? 200 : 503);
        job_unref(j);
        j = next;
    }
    for (int i = 0; i < w->n_slots; i++) disk_save(w, &w->slots[i], KV_DISK_REASON_SHUTDOWN);
    kv_disk_close(w->disk);
    tool_memory_free(w->mem);
    slots_free(w);
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
    j->submitted_ms = now_ms();
    if (w->tail) w->tail->next = j;
    else w->head = j;
    w->tail = j;
    w->qlen++;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return 0;
}

int worker_count_tokens(worker *w, const api_request *r, int *n)
{
    /* The prompt as a request would render it (canonical tool calls: the
     * exact-replay map belongs to the worker thread), tokenized with the
     * engine's tokenizer, which is safe to call from any thread. */
    srv_engine *e = w->eng;
    bool thinking = r->thinking != 0;
    render_opts ro = {thinking, thinking && r->think_max && e->ctx >= 393216,
                      r->n_tools > 0 && r->tool_choice != TOOL_CHOICE_NONE, NULL};
    size_t plen = 0;
    ds4_spans tpl = {0};
    char *prompt = prompt_render_spans(r, &ro, &plen, NULL, &tpl);
    int32_t *q = NULL;
    size_t nq = 0;
    /* as a request's prefill tokenizes it: specials only where the
     * template wrote them */
    int rc = prompt && e->tokenize_prompt(e, prompt, plen, &tpl, 0, &q, &nq) == 0 ? 0 : -1;
    free(prompt);
    ds4_spans_free(&tpl);
    free(q);
    if (rc == 0) *n = (int)nq;
    return rc;
}

int worker_ctx(worker *w) { return w->eng->ctx; }

const char *worker_model_id(worker *w) { return w->eng->model_id; }

int worker_queue_length(worker *w)
{
    pthread_mutex_lock(&w->mu);
    int n = w->qlen;
    pthread_mutex_unlock(&w->mu);
    return n;
}

void worker_get_stats(worker *w, worker_stats *out)
{
    pthread_mutex_lock(&w->mu);
    *out = w->stats;
    out->busy = w->n_busy;
    out->queue = w->qlen;
    pthread_mutex_unlock(&w->mu);
}

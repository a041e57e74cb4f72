/*
 * slot_session.c - what the worker knows about a slot's live session (see
 * slot.h): its tokens and the bytes they spell, the exact tool-call blocks
 * in it, its in-memory snapshot, and saving it to / restoring it from the
 * disk cache. The payload of a disk file is [u32 token count][tokens]
 * [engine snapshot bytes], so a restored session knows its tokens as well
 * as its KV state; the file's tool-id map restores the exact-replay entries
 * of the blocks in its text.
 */
#include "server/slot.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "include/ds4.h"
#include "server/trace.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

void slot_trace(const slot *s, const char *fmt, ...)
{
    if (!trace_on()) return;
    char buf[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    trace_printf("%s%s", s->tag, buf);
}

void slot_trace_text(const slot *s, const char *what, const char *text, size_t len)
{
    char w[96];
    snprintf(w, sizeof w, "%s%s", s->tag, what);
    trace_text(w, text, len);
}

/* ---- live state ---------------------------------------------------------- */

int slot_add_text(slot *s, const char *t, size_t n)
{
    if (s->live_len + n + 1 > s->live_text_cap) {
        size_t cap = s->live_text_cap ? s->live_text_cap * 2 : 65536;
        while (cap < s->live_len + n + 1) cap *= 2;
        char *q = realloc(s->live_text, cap);
        if (!q) return -1;
        s->live_text = q;
        s->live_text_cap = cap;
    }
    memcpy(s->live_text + s->live_len, t, n);
    s->live_len += n;
    s->live_text[s->live_len] = 0;
    return 0;
}

int slot_add_toks(slot *s, const int32_t *t, size_t n)
{
    if (s->n_live + n > s->live_toks_cap) {
        size_t cap = s->live_toks_cap ? s->live_toks_cap * 2 : 8192;
        while (cap < s->n_live + n) cap *= 2;
        int32_t *q = realloc(s->live_toks, cap * sizeof *q);
        if (!q) return -1;
        s->live_toks = q;
        s->live_toks_cap = cap;
    }
    memcpy(s->live_toks + s->n_live, t, n * sizeof *t);
    s->n_live += n;
    return 0;
}

void slot_tools_clear(slot *s)
{
    for (size_t i = 0; i < s->n_session_tools; i++) {
        free(s->session_tools[i].id);
        free(s->session_tools[i].dsml);
    }
    s->n_session_tools = 0;
}

void slot_tool_add(slot *s, const char *id, const char *dsml, size_t dl)
{
    if (s->n_session_tools >= MAX_SESSION_TOOLS) return;
    kv_disk_tool *t = &s->session_tools[s->n_session_tools];
    t->id = strdup(id);
    t->dsml = malloc(dl + 1);
    if (!t->id || !t->dsml) { free(t->id); free(t->dsml); return; }
    memcpy(t->dsml, dsml, dl);
    t->dsml[dl] = 0;
    t->id_len = strlen(id);
    t->dsml_len = dl;
    s->n_session_tools++;
}

void slot_reset(srv_engine *e, slot *s)
{
    e->reset(e, s->id);
    s->live_len = 0;
    if (s->live_text) s->live_text[0] = 0;
    s->n_live = 0;
    s->saved_tokens = 0;
    slot_tools_clear(s);
}

/* Next special token at or after *i in toks, with its byte offset (*off
 * counts the bytes before toks[*i]); false at the end or when a token's
 * bytes are unknown (then nothing is trusted). */
static bool next_special(srv_engine *e, const int32_t *toks, size_t n, size_t *i, size_t *off, bool *bad,
                         size_t *at, int32_t *id)
{
    char b[1024];
    for (; *i < n; (*i)++) {
        int bl = e->token_bytes(e, toks[*i], b, sizeof b);
        if (bl < 0) { *bad = true; return false; }
        if (e->is_special(e, toks[*i])) {
            *at = *off;
            *id = toks[*i];
            *off += (size_t)bl;
            (*i)++;
            return true;
        }
        *off += (size_t)bl;
    }
    return false;
}

/* Text reuse keeps tokens that were not made from this prompt's
 * tokenization. That is only sound when their special tokens are exactly
 * the prompt's within the reused bytes: the same ids at the same byte
 * offsets. Otherwise request text that spells a marker (plain text in the
 * prompt) would reuse a session holding the real control token, and a
 * marker cut by the boundary would be fed as plain bytes. */
bool slot_specials_agree(srv_engine *e, const int32_t *have, size_t n_have, size_t text_len, const int32_t *q,
                         size_t nq)
{
    if (!e->is_special) return true;
    size_t hi = 0, ho = 0, qi = 0, qo = 0;
    bool bad = false;
    for (;;) {
        size_t ha = 0, qa = 0;
        int32_t hid = -1, qid = -1;
        bool h = next_special(e, have, n_have, &hi, &ho, &bad, &ha, &hid);
        bool qq = next_special(e, q, nq, &qi, &qo, &bad, &qa, &qid);
        if (bad) return false;
        if (qq && qa >= text_len) qq = false; /* past the reused bytes */
        if (!h && !qq) return true;
        if (h != qq || ha != qa || hid != qid) return false;
    }
}

/* Does the slot's live session prefix the prompt? 1: by tokens, 2: by text. */
int slot_live_match(srv_engine *e, const slot *s, const int32_t *q, size_t nq, const char *prompt, size_t plen)
{
    if (!s->n_live) return 0;
    if (s->n_live <= nq && !memcmp(s->live_toks, q, s->n_live * sizeof *q)) return 1;
    if (s->live_len <= plen && !memcmp(s->live_text, prompt, s->live_len) &&
        slot_specials_agree(e, s->live_toks, s->n_live, s->live_len, q, nq))
        return 2;
    return 0;
}

/* ---- the in-memory snapshot ---------------------------------------------------
 *
 * In thinking mode without tools the official rendering drops a turn's
 * reasoning once the next user message arrives (chat-format §3.3): the next
 * prompt spells the turn as "<｜Assistant｜></think>answer", while the live
 * session holds "<｜Assistant｜><think>reasoning</think>answer". The two part
 * right after "<｜Assistant｜>", so the live session cannot be extended.
 * That point, the prompt without its final "<think>", is the stable point:
 * the prefill stops there, snapshots the session, then prefills "<think>".
 * The next turn's prompt extends the stable point, restores the snapshot
 * and prefills only its new suffix.
 *
 * Each slot keeps one snapshot, replaced by the next one it takes, so
 * concurrent thinking conversations each keep theirs. It is taken only when
 * the engine says it fits --kv-memory-snapshot-mb (per slot): copying it
 * costs far less time than re-prefilling its tokens (docs/SERVER.md has
 * numbers), so memory is what bounds it. */

void slot_snap_drop(slot *s)
{
    free(s->snap.bytes);
    free(s->snap.toks);
    free(s->snap.text);
    memset(&s->snap, 0, sizeof s->snap);
}

void slot_snap_take(srv_engine *e, slot *s, size_t budget)
{
    if (s->snap.bytes && s->snap.n == s->n_live && s->snap.text_len == s->live_len &&
        !memcmp(s->snap.toks, s->live_toks, s->n_live * sizeof *s->live_toks))
        return; /* the same point again (a regenerated turn) */
    size_t need = e->snapshot_size ? e->snapshot_size(e, s->id) : 0;
    if (!need || need > budget) {
        slot_trace(s, "cache: no memory snapshot: %zu bytes, budget %zu", need, budget);
        return;
    }
    slot_snap_drop(s); /* never two in memory at once */
    double t0 = now_ms();
    void *b = NULL;
    size_t len = 0;
    if (e->snapshot(e, s->id, &b, &len) != 0) {
        fprintf(stderr, "ds4-server: snapshot failed: %s\n", e->err);
        return;
    }
    s->snap.toks = malloc((s->n_live ? s->n_live : 1) * sizeof *s->snap.toks);
    s->snap.text = malloc(s->live_len + 1);
    if (!s->snap.toks || !s->snap.text) {
        free(b);
        slot_snap_drop(s);
        return;
    }
    s->snap.bytes = b;
    s->snap.len = len;
    memcpy(s->snap.toks, s->live_toks, s->n_live * sizeof *s->snap.toks);
    s->snap.n = s->n_live;
    memcpy(s->snap.text, s->live_text, s->live_len);
    s->snap.text[s->live_len] = 0;
    s->snap.text_len = s->live_len;
    slot_trace(s, "cache: memory snapshot: %zu tokens, %zu bytes, %.2f ms", s->snap.n, len, now_ms() - t0);
}

/* Does the snapshot prefix the prompt? 1: by tokens, 2: by text, 0: no. */
int slot_snap_match(srv_engine *e, const slot *s, const int32_t *q, size_t nq, const char *prompt, size_t plen)
{
    if (!s->snap.bytes) return 0;
    if (s->snap.n <= nq && !memcmp(s->snap.toks, q, s->snap.n * sizeof *q)) return 1;
    if (s->snap.text_len <= plen && !memcmp(s->snap.text, prompt, s->snap.text_len) &&
        slot_specials_agree(e, s->snap.toks, s->snap.n, s->snap.text_len, q, nq))
        return 2;
    return 0;
}

/* Make the snapshot the slot's live session; false (and an empty session)
 * if the engine refuses it. */
bool slot_snap_restore(srv_engine *e, slot *s)
{
    double t0 = now_ms();
    if (e->restore(e, s->id, s->snap.bytes, s->snap.len) != 0) {
        fprintf(stderr, "ds4-server: memory snapshot refused: %s\n", e->err);
        slot_snap_drop(s);
        slot_reset(e, s);
        return false;
    }
    s->n_live = s->live_len = 0;
    s->saved_tokens = 0;
    if (slot_add_toks(s, s->snap.toks, s->snap.n) != 0 || slot_add_text(s, s->snap.text, s->snap.text_len) != 0) {
        slot_reset(e, s);
        return false;
    }
    /* the exact blocks that travel with a later disk save: those still here */
    size_t k = 0;
    for (size_t i = 0; i < s->n_session_tools; i++) {
        kv_disk_tool *t = &s->session_tools[i];
        if (memmem(s->live_text, s->live_len, t->dsml, t->dsml_len)) s->session_tools[k++] = *t;
        else { free(t->id); free(t->dsml); }
    }
    s->n_session_tools = k;
    slot_trace(s, "cache: memory snapshot restored: %zu tokens, %.2f ms", s->snap.n, now_ms() - t0);
    return true;
}

/* ---- disk ------------------------------------------------------------------- */

void slot_disk_save(kv_disk *disk, srv_engine *e, slot *s, size_t min_tokens, kv_disk_reason reason)
{
    if (!disk || s->n_live == 0 || s->n_live < min_tokens) return;
    if (s->saved_tokens == s->n_live) return;
    void *snap = NULL;
    size_t snap_len = 0;
    if (e->snapshot(e, s->id, &snap, &snap_len) != 0) {
        fprintf(stderr, "ds4-server: snapshot failed: %s\n", e->err);
        return;
    }
    size_t pl = 4 + s->n_live * 4 + snap_len;
    unsigned char *payload = malloc(pl);
    if (!payload) { free(snap); return; }
    uint32_t n = (uint32_t)s->n_live;
    for (int i = 0; i < 4; i++) payload[i] = (unsigned char)(n >> (8 * i));
    for (size_t i = 0; i < s->n_live; i++)
        for (int k = 0; k < 4; k++) payload[4 + 4 * i + k] = (unsigned char)((uint32_t)s->live_toks[i] >> (8 * k));
    memcpy(payload + 4 + s->n_live * 4, snap, snap_len);
    free(snap);
    /* only the blocks that occur in this text travel with it */
    kv_disk_tool *keep = malloc((s->n_session_tools ? s->n_session_tools : 1) * sizeof *keep);
    if (!keep) { free(payload); return; }
    size_t nk = 0;
    for (size_t i = 0; i < s->n_session_tools; i++)
        if (memmem(s->live_text, s->live_len, s->session_tools[i].dsml, s->session_tools[i].dsml_len))
            keep[nk++] = s->session_tools[i];
    ds4_status st = kv_disk_save(disk, reason, s->live_text, s->live_len, n, payload, pl, keep, nk);
    free(keep);
    free(payload);
    if (st != DS4_OK) fprintf(stderr, "ds4-server: %s\n", ds4_last_error());
    else s->saved_tokens = s->n_live;
}

/* Restores the longest disk prefix of prompt into the slot; true on success. */
bool slot_disk_restore(kv_disk *disk, tool_memory *mem, srv_engine *e, slot *s, const char *prompt, size_t plen,
                       const int32_t *q, size_t nq)
{
    if (!disk) return false;
    kv_disk_hit hit;
    if (kv_disk_lookup(disk, prompt, plen, plen, &hit) != DS4_OK) return false;
    bool ok = false;
    const unsigned char *p = hit.payload;
    if (hit.payload_len >= 4) {
        uint32_t n = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        if (n == hit.tokens && (uint64_t)n * 4 + 4 <= hit.payload_len) {
            slot_reset(e, s);
            if (e->restore(e, s->id, p + 4 + (size_t)n * 4, hit.payload_len - 4 - (size_t)n * 4) == 0) {
                ok = true;
                for (uint32_t i = 0; i < n && ok; i++) {
                    int32_t t = (int32_t)((uint32_t)p[4 + 4 * i] | (uint32_t)p[5 + 4 * i] << 8 |
                                          (uint32_t)p[6 + 4 * i] << 16 | (uint32_t)p[7 + 4 * i] << 24);
                    ok = slot_add_toks(s, &t, 1) == 0;
                }
                ok = ok && slot_add_text(s, prompt, hit.text_len) == 0;
                if (ok && !slot_specials_agree(e, s->live_toks, s->n_live, hit.text_len, q, nq)) {
                    /* the file's bytes match, its control tokens do not
                     * (request text spelling a marker): prefill instead */
                    slot_trace(s, "cache: disk file %s: special tokens differ from the prompt's; not used", hit.sha);
                    ok = false;
                }
            } else {
                /* a state of another shape, or holding NaN / +inf: never
                 * tried again; this request is prefilled instead */
                fprintf(stderr, "ds4-server: kv-disk: %s: engine refused the snapshot: %s\n", hit.sha, e->err);
                kv_disk_remove(disk, hit.sha, "the engine refused its state");
            }
        }
    }
    if (ok) {
        s->saved_tokens = s->n_live;
        for (size_t i = 0; i < hit.n_tools; i++) {
            const char *id = hit.tools[i].id;
            if (mem) tool_memory_put(mem, &id, 1, hit.tools[i].dsml, hit.tools[i].dsml_len);
            slot_tool_add(s, id, hit.tools[i].dsml, hit.tools[i].dsml_len);
        }
        slot_trace(s, "cache: disk hit %s: %u tokens, %zu text bytes", hit.sha, hit.tokens, hit.text_len);
    } else {
        slot_reset(e, s);
    }
    kv_disk_hit_free(&hit);
    return ok;
}

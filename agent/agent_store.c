/*
 * agent_store.c - saving and resuming agent sessions (see agent_store.h).
 */
#include "agent/agent_store.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent/agent_fileio.h"
#include "engine/kv_disk.h"

#define TRANSCRIPT "transcript.json"
#define FORMAT_NAME "ds4-agent-session"
#define FORMAT_VERSION 1
#define MAX_TRANSCRIPT (1u << 30)

bool agent_store_name_ok(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > 64 || name[0] == '.') return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-'))
            return false;
    }
    return true;
}

static char *join(const char *a, const char *b, const char *c)
{
    size_t n = strlen(a) + strlen(b) + (c ? strlen(c) : 0) + 3;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s%s%s", a, b, c ? "/" : "", c ? c : "");
    return p;
}

bool agent_store_exists(const char *dir, const char *name)
{
    char *p = join(dir, name, TRANSCRIPT);
    bool ok = p && access(p, R_OK) == 0;
    free(p);
    return ok;
}

static void kv_log(void *ud, const char *msg)
{
    (void)ud;
    if (strstr(msg, ": saved ") || strstr(msg, ": hit ")) return; /* routine; failures and removed bad files are worth a line */
    fprintf(stderr, "ds4-agent: snapshot file: %s\n", msg);
}

static kv_disk *open_kv(const char *dir, const char *name, const agent *a, char *err, size_t es)
{
    char *kd = join(dir, name, "kv");
    if (!kd) {
        snprintf(err, es, "out of memory");
        return NULL;
    }
    kv_disk_options o = {.dir = kd, .space_bytes = 0, .quant_bits = a->eng->quant_bits,
                         .ctx_size = (uint32_t)a->eng->ctx, .log = kv_log};
    kv_disk *d = kv_disk_open(&o);
    if (!d) snprintf(err, es, "%s", ds4_last_error());
    free(kd);
    return d;
}

/* Remove the snapshot files other than keep_sha (stale after a save). */
static void drop_stale(const char *dir, const char *name, const char *keep_sha)
{
    char *kd = join(dir, name, "kv");
    DIR *d = kd ? opendir(kd) : NULL;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l != 43 || strcmp(e->d_name + 40, ".kv") || !strncmp(e->d_name, keep_sha, 40)) continue;
        char *p = join(kd, e->d_name, NULL);
        if (p) unlink(p);
        free(p);
    }
    if (d) closedir(d);
    free(kd);
}

static char *hex(const char *s, size_t n)
{
    char *h = malloc(2 * n + 1);
    if (!h) return NULL;
    for (size_t i = 0; i < n; i++) snprintf(h + 2 * i, 3, "%02x", (unsigned char)s[i]);
    h[2 * n] = '\0';
    return h;
}

static char *unhex(const char *h, size_t *n)
{
    size_t l = strlen(h);
    if (l % 2) return NULL;
    char *s = malloc(l / 2 + 1);
    if (!s) return NULL;
    for (size_t i = 0; i < l / 2; i++) {
        unsigned v;
        if (sscanf(h + 2 * i, "%2x", &v) != 1) {
            free(s);
            return NULL;
        }
        s[i] = (char)v;
    }
    s[l / 2] = '\0';
    *n = l / 2;
    return s;
}

bool agent_store_save(agent *a, const char *dir, const char *name, const char *workspace, char *err, size_t es)
{
    if (!agent_store_name_ok(name)) {
        snprintf(err, es, "bad session name '%s' (1-64 of A-Z a-z 0-9 . _ -, not starting with .)", name);
        return false;
    }
    char *sd = join(dir, name, NULL);
    if (!sd || !agent_mkdirs(sd, err, es)) {
        free(sd);
        return false;
    }
    free(sd);
    const char *text = a->live_text.p ? a->live_text.p : "";
    size_t tl = a->live_text.n;
    char sha[41];
    kv_disk_sha1_hex(text, tl, sha);
    if (a->live.n) {
        kv_disk *d = open_kv(dir, name, a, err, es);
        if (!d) return false;
        void *snap = NULL;
        size_t sl = 0;
        if (a->eng->snapshot(a->eng, &snap, &sl) != 0) {
            snprintf(err, es, "%s", a->eng->err);
            kv_disk_close(d);
            return false;
        }
        size_t pl = 4 + a->live.n * 4 + sl;
        unsigned char *payload = malloc(pl);
        if (!payload) {
            free(snap);
            kv_disk_close(d);
            snprintf(err, es, "out of memory");
            return false;
        }
        uint32_t n = (uint32_t)a->live.n;
        for (int i = 0; i < 4; i++) payload[i] = (unsigned char)(n >> (8 * i));
        for (size_t i = 0; i < a->live.n; i++)
            for (int k = 0; k < 4; k++)
                payload[4 + 4 * i + k] = (unsigned char)((uint32_t)a->live.ids[i] >> (8 * k));
        memcpy(payload + 4 + a->live.n * 4, snap, sl);
        free(snap);
        ds4_status st = kv_disk_save(d, KV_DISK_REASON_CONTINUED, text, tl, n, payload, pl, NULL, 0);
        free(payload);
        kv_disk_close(d);
        if (st != DS4_OK) {
            snprintf(err, es, "%s", ds4_last_error());
            return false;
        }
    }
    json_t *doc = json_object();
    json_object_set_new(doc, "format", json_string(FORMAT_NAME));
    json_object_set_new(doc, "version", json_integer(FORMAT_VERSION));
    json_object_set_new(doc, "name", json_string(name));
    json_object_set_new(doc, "workspace", json_string(workspace));
    json_object_set_new(doc, "updated", json_integer((json_int_t)time(NULL)));
    json_object_set_new(doc, "seed", json_integer((json_int_t)a->s.seed));
    json_object_set_new(doc, "thinking", json_boolean(a->s.thinking));
    json_object_set_new(doc, "tokens", json_integer((json_int_t)a->live.n));
    json_object_set_new(doc, "live_sha1", json_string(sha));
    json_t *lt = json_stringn(text, tl);
    if (lt) {
        json_object_set_new(doc, "live_text", lt);
    } else { /* generation stopped inside a UTF-8 character */
        char *h = hex(text, tl);
        json_object_set_new(doc, "live_text_hex", json_string(h ? h : ""));
        free(h);
    }
    /* the ids themselves: a resume without a usable snapshot prefills them
     * as they are, instead of tokenizing the text again (which would lose
     * which bytes were markers and which were file contents) */
    json_t *ids = json_array();
    for (size_t i = 0; ids && i < a->live.n; i++) json_array_append_new(ids, json_integer(a->live.ids[i]));
    if (ids) json_object_set_new(doc, "live_tokens", ids);
    json_object_set_new(doc, "n_in_session", json_integer((json_int_t)a->n_in_session));
    json_object_set_new(doc, "pending_eos", json_boolean(a->pending_eos));
    json_object_set_new(doc, "next_call_id", json_integer(a->next_call_id));
    json_object_set(doc, "messages", a->messages);
    char *s = json_dumps(doc, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(doc);
    char *tp = join(dir, name, TRANSCRIPT);
    bool ok = s && tp && agent_write_atomic(tp, s, strlen(s), err, es);
    if (!s || !tp) snprintf(err, es, "out of memory");
    free(s);
    free(tp);
    if (ok) drop_stale(dir, name, a->live.n ? sha : "");
    return ok;
}

static uint32_t get32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Restore the snapshot covering text; true when the session now holds
 * exactly text[0..covered). */
static bool restore_snapshot(agent *a, const char *dir, const char *name, const char *text, size_t tl,
                             size_t *covered)
{
    char err[512];
    kv_disk *d = open_kv(dir, name, a, err, sizeof err);
    if (!d) return false;
    kv_disk_hit hit;
    bool ok = false;
    if (kv_disk_lookup(d, text, tl, tl, &hit) == DS4_OK) {
        const unsigned char *p = hit.payload;
        uint32_t n = hit.payload_len >= 4 ? get32(p) : 0;
        if (hit.payload_len >= 4 && n == hit.tokens && (uint64_t)n * 4 + 4 <= hit.payload_len) {
            a->eng->reset(a->eng);
            a->live.n = 0;
            a->live_text.n = 0;
            if (a->eng->restore(a->eng, p + 4 + (size_t)n * 4, hit.payload_len - 4 - (size_t)n * 4) == 0) {
                ok = true;
                for (uint32_t i = 0; i < n && ok; i++) {
                    int32_t t = (int32_t)get32(p + 4 + 4 * (size_t)i);
                    size_t l;
                    const char *b = a->eng->token_bytes(a->eng, t, &l);
                    ok = b && ds4_tokens_push(&a->live, t) == DS4_OK;
                    if (ok) agent_buf_add(&a->live_text, b, l);
                }
                /* the tokens must spell the text the file is keyed by */
                ok = ok && a->live_text.n == hit.text_len && !memcmp(a->live_text.p, text, hit.text_len) &&
                     a->eng->n_past(a->eng) == (int64_t)n;
                if (!ok) fprintf(stderr, "ds4-agent: snapshot %s: its tokens do not match its text; ignored\n", hit.sha);
            } else {
                fprintf(stderr, "ds4-agent: snapshot %s refused by the engine: %s\n", hit.sha, a->eng->err);
            }
        }
        if (ok) *covered = hit.text_len;
        kv_disk_hit_free(&hit);
    }
    kv_disk_close(d);
    if (!ok) {
        a->eng->reset(a->eng);
        a->live.n = 0;
        a->live_text.n = 0;
    }
    return ok;
}

bool agent_store_load(agent *a, const char *dir, const char *name, const char *workspace, bool *restored,
                      char *err, size_t es)
{
    *restored = false;
    if (!agent_store_name_ok(name)) {
        snprintf(err, es, "bad session name '%s'", name);
        return false;
    }
    char *tp = join(dir, name, TRANSCRIPT);
    size_t len;
    char *s = tp ? agent_read_whole(tp, MAX_TRANSCRIPT, &len, err, es) : NULL;
    if (!s) {
        free(tp);
        return false;
    }
    json_error_t je;
    json_t *doc = json_loadb(s, len, 0, &je);
    free(s);
    json_t *msgs = json_object_get(doc, "messages");
    const char *fmt = json_string_value(json_object_get(doc, "format"));
    const char *lt = json_string_value(json_object_get(doc, "live_text"));
    const char *lth = json_string_value(json_object_get(doc, "live_text_hex"));
    json_t *nis = json_object_get(doc, "n_in_session");
    if (!doc) snprintf(err, es, "%s: line %d: %s", tp, je.line, je.text);
    else if (!fmt || strcmp(fmt, FORMAT_NAME) || json_integer_value(json_object_get(doc, "version")) != FORMAT_VERSION)
        snprintf(err, es, "%s: not a ds4-agent session transcript of version %d", tp, FORMAT_VERSION);
    else if (!json_is_array(msgs) || json_array_size(msgs) < 1 || (!lt && !lth) || !json_is_integer(nis) ||
             json_integer_value(nis) < 0 || (size_t)json_integer_value(nis) > json_array_size(msgs))
        snprintf(err, es, "%s: missing or bad \"messages\", \"live_text\" or \"n_in_session\"", tp);
    else
        err[0] = '\0';
    free(tp);
    if (err[0]) {
        json_decref(doc);
        return false;
    }
    size_t tl = 0;
    char *text = lt ? strdup(lt) : unhex(lth, &tl);
    if (lt && text) tl = json_string_length(json_object_get(doc, "live_text"));
    if (!text) {
        snprintf(err, es, "session %s: bad live text", name);
        json_decref(doc);
        return false;
    }
    const char *saved_ws = json_string_value(json_object_get(doc, "workspace"));
    if (saved_ws && workspace && strcmp(saved_ws, workspace))
        fprintf(stderr, "ds4-agent: warning: session %s was saved in the workspace %s, now %s\n", name, saved_ws,
                workspace);
    json_decref(a->messages);
    a->messages = json_deep_copy(msgs);
    a->n_in_session = (size_t)json_integer_value(nis);
    a->pending_eos = json_is_true(json_object_get(doc, "pending_eos"));
    a->next_call_id = (long)json_integer_value(json_object_get(doc, "next_call_id"));
    a->s.seed = (uint64_t)json_integer_value(json_object_get(doc, "seed"));
    a->s.thinking = json_is_true(json_object_get(doc, "thinking"));
    ds4_tokens saved = {0};
    json_t *jids = json_object_get(doc, "live_tokens");
    bool have_ids = json_is_array(jids);
    for (size_t i = 0; have_ids && i < json_array_size(jids); i++) {
        json_t *v = json_array_get(jids, i);
        have_ids = json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= INT32_MAX &&
                   ds4_tokens_push(&saved, (int32_t)json_integer_value(v)) == DS4_OK;
    }
    json_decref(doc);

    size_t covered = 0;
    bool ok = true;
    if (tl > 0) {
        *restored = restore_snapshot(a, dir, name, text, tl, &covered);
        if (covered < tl) {
            /* no snapshot (or an older one): prefill the rest of the saved
             * ids, once they are checked to spell the saved text and to
             * continue what the snapshot restored */
            if (!*restored) fprintf(stderr, "ds4-agent: session %s: no usable snapshot; prefilling its %zu bytes again\n", name, tl);
            *restored = false;
            bool match = have_ids && saved.n >= a->live.n;
            for (size_t i = 0; match && i < a->live.n; i++) match = saved.ids[i] == a->live.ids[i];
            size_t off = 0;
            for (size_t i = 0; match && i < saved.n; i++) {
                size_t l;
                const char *b = a->eng->token_bytes(a->eng, saved.ids[i], &l);
                match = b && l <= tl - off && !memcmp(text + off, b, l);
                off += l;
            }
            if (match && off == tl) {
                ok = agent_feed_tokens(a, saved.ids + a->live.n, saved.n - a->live.n);
                if (!ok) snprintf(err, es, "session %s: the conversation could not be prefilled again", name);
            } else {
                /* no trustworthy ids: rebuild from the messages (rendered
                 * and tokenized afresh at the next step) */
                fprintf(stderr, "ds4-agent: session %s: its saved tokens do not spell its text; rebuilding from its messages\n", name);
                a->eng->reset(a->eng);
                a->live.n = 0;
                a->live_text.n = 0;
                a->n_in_session = 0;
                a->pending_eos = false;
            }
        }
    } else {
        a->eng->reset(a->eng);
        a->live.n = 0;
        a->live_text.n = 0;
    }
    free(text);
    ds4_tokens_free(&saved);
    return ok;
}

void agent_store_list(const char *dir, const char *current, FILE *out)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(out, "no sessions in %s\n", dir);
        return;
    }
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        if (!agent_store_name_ok(e->d_name)) continue;
        char *tp = join(dir, e->d_name, TRANSCRIPT);
        json_t *doc = tp ? json_load_file(tp, 0, NULL) : NULL;
        free(tp);
        if (!doc) continue;
        time_t up = (time_t)json_integer_value(json_object_get(doc, "updated"));
        struct tm tm;
        char when[32] = "?";
        if (localtime_r(&up, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M", &tm);
        fprintf(out, "%s %-24s %s  %3zu messages  %6lld tokens\n", current && !strcmp(current, e->d_name) ? "*" : " ",
                e->d_name, when, json_array_size(json_object_get(doc, "messages")),
                (long long)json_integer_value(json_object_get(doc, "tokens")));
        json_decref(doc);
        n++;
    }
    closedir(d);
    if (n == 0) fprintf(out, "no sessions in %s\n", dir);
}

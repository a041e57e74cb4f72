/*
 * slot.h - one of the worker's --parallel slots: an engine session (its
 * index in the engine port), what the worker knows about it (the tokens it
 * holds and the bytes they spell, the exact tool-call blocks in it, its
 * in-memory snapshot) and the request it is serving, if any.
 *
 * The request side is driven by worker.c; the session side
 * (slot_session.c) is what prefix reuse, the memory snapshot and the disk
 * cache need. Everything runs on the worker thread.
 */
#ifndef DS4_SERVER_SLOT_H
#define DS4_SERVER_SLOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/kv_disk.h"
#include "server/api_response.h"
#include "server/engine_port.h"
#include "server/job.h"
#include "server/output_parser.h"
#include "server/tool_memory.h"

#define MAX_SESSION_TOOLS 4096

typedef struct slot slot;

typedef struct {
    job *j;
    resp_writer *rw;
    int calls_started, calls_ended;  /* tool_choice enforcement watches these */
    const char *tag;                 /* the slot's trace prefix */
} sink_ctx;

/* The function name being written since `from` (live text offset) may only
 * grow into one of the declared names followed by `">`. */
typedef struct {
    const slot *s;
    const api_request *r;
    size_t from;
} name_filter;

typedef enum { SLOT_IDLE, SLOT_PREFILL, SLOT_DECODE } slot_phase;

struct slot {
    int id;                  /* the engine's session index */
    char tag[24];            /* "slot N: " before its trace lines when N > 1 slots */
    uint64_t last_used;      /* worker clock when its last request ended; 0 = never */

    /* the live session */
    char *live_text;
    size_t live_len, live_text_cap;
    int32_t *live_toks;
    size_t n_live, live_toks_cap;
    size_t saved_tokens;     /* n_live when the session was last on disk */
    kv_disk_tool *session_tools; /* exact blocks in this session (MAX_SESSION_TOOLS) */
    size_t n_session_tools;

    /* The in-memory snapshot: this slot's session at the stable point of
     * its last thinking prompt without tools, with its tokens and text. */
    struct {
        void *bytes;
        size_t len;
        int32_t *toks;
        size_t n;
        char *text;
        size_t text_len;
    } snap;

    /* the request being served (phase != SLOT_IDLE) */
    slot_phase phase;
    job *j;
    uint64_t admitted;       /* admission order: the oldest prefill goes first */
    bool thinking, tools;
    char *prompt;
    size_t plen;
    int32_t *q, *tail;       /* prompt tokens; suffix tokenized after a text match */
    size_t nq;
    const int32_t *suffix;   /* what is prefilled: [0, head) then [head, n_suffix) */
    size_t n_suffix, head, pf_pos;
    bool stable, head_done, save_cold;
    size_t text_end;
    usage_info u;
    double t0, t1;
    char *opening, *closing;
    sink_ctx sc;
    out_parser *op;
    int max, gen, reasoning_toks;
    srv_sampling sp;
    name_filter nf;
    finish_kind fin;
    bool failed, cancelled, in_reasoning, first, open_due, opened, closed;
    /* structured output: the answer's grammar and how far it got (NULL
     * when the request has none) */
    struct json_grammar *jgram;
    struct jg_state *jst;
    bool jfirst_known;        /* jfirst is of the state as it is now */
    uint64_t jfirst[4];       /* the answer's possible next bytes */
    /* a forced call under its tool's schema (NULL when not constrained) */
    struct dsml_grammar *dgram;
    struct dg_state *dst;
    /* --mtp with sampling: the token a speculative step's rule drew after
     * its fed tokens, to be taken next instead of a fresh draw (-1: none) */
    int32_t pending;
};

/* Trace records, prefixed with the slot's tag. */
void slot_trace(const slot *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void slot_trace_text(const slot *s, const char *what, const char *text, size_t len);

/* The live text and tokens grow together: the text is always the bytes of
 * the tokens. 0, or -1 when memory ran out. */
int slot_add_text(slot *s, const char *t, size_t n);
int slot_add_toks(slot *s, const int32_t *t, size_t n);
void slot_tools_clear(slot *s);
void slot_tool_add(slot *s, const char *id, const char *dsml, size_t dl);
/* An empty session (engine reset, nothing known). */
void slot_reset(srv_engine *e, slot *s);
/* Does the live session prefix the prompt? 1: by tokens, 2: by text, 0: no. */
int slot_live_match(srv_engine *e, const slot *s, const int32_t *q, size_t nq, const char *prompt, size_t plen);
/* Do the special tokens of `have` (spelling text_len bytes) sit exactly
 * where the prompt's tokenization q puts them within those bytes? Text
 * reuse (2 above) and disk restores require it. */
bool slot_specials_agree(srv_engine *e, const int32_t *have, size_t n_have, size_t text_len, const int32_t *q,
                         size_t nq);

/* The in-memory snapshot (see slot_session.c): taken when it fits `budget`
 * bytes, replacing the slot's previous one. */
void slot_snap_drop(slot *s);
void slot_snap_take(srv_engine *e, slot *s, size_t budget);
int slot_snap_match(srv_engine *e, const slot *s, const int32_t *q, size_t nq, const char *prompt, size_t plen);
/* Makes the snapshot the live session; false (and an empty session) if the
 * engine refuses it. */
bool slot_snap_restore(srv_engine *e, slot *s);

/* Saves the live session (when it has at least min_tokens and is not on
 * disk at this length already). */
void slot_disk_save(kv_disk *disk, srv_engine *e, slot *s, size_t min_tokens, kv_disk_reason reason);
/* Restores the longest disk prefix of prompt; true on success, else an
 * empty session. */
bool slot_disk_restore(kv_disk *disk, tool_memory *mem, srv_engine *e, slot *s, const char *prompt, size_t plen,
                       const int32_t *q, size_t nq);

#endif

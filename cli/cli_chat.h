/*
 * cli_chat.h - a live conversation for the `ds4` front end: model,
 * tokenizer, session, sampler, the messages so far and the exact tokens
 * the session has consumed.
 *
 * The session is never re-run for text it has already seen: each user
 * turn appends only "[EOS]<｜User｜>text<｜Assistant｜><think|/think>" to
 * the live tokens (the EOS closes the previous answer when generation
 * stopped before sampling it, or when it was sampled but not yet fed).
 * In thinking mode the live state keeps earlier reasoning, while a fresh
 * render of the messages would drop it (dsv4-chat-format.md §3.3); we
 * keep the live state, as ds4 does, and re-render only when the session
 * must be rebuilt (/ctx, /load).
 */
#ifndef DS4_CLI_CHAT_H
#define DS4_CLI_CHAT_H

#include "cli/cli_options.h"
#include "include/ds4.h"
#include "include/ds4_sampler.h"
#include "include/ds4_tokenizer.h"

#include <jansson.h>
#include <stdbool.h>

typedef struct {
    ds4_cli_options opt;     /* current settings (think mode and ctx change in the REPL) */
    ds4_model *model;
    ds4_session *session;
    ds4_tokenizer *tok;
    ds4_sampler *sampler;
    int n_vocab;
    json_t *messages;        /* the conversation (OpenAI-style) */
    ds4_tokens live;         /* every token the session has consumed */
    bool pending_eos;        /* the last answer is not closed by EOS in the session yet */
    bool progress;           /* draw a prefill progress bar on stderr */
    bool color;              /* dim reasoning on stdout */
    ds4_rng spec_rng;        /* --mtp with sampling: the acceptance rule's draws */
} ds4_cli_chat;

/* Load model + tokenizer, create the session. Prints errors; false on failure. */
bool ds4_cli_chat_open(ds4_cli_chat *c, const ds4_cli_options *opt);
void ds4_cli_chat_close(ds4_cli_chat *c);

/* Effective thinking settings for the current options (Think Max falls
 * back to thinking below DS4_CLI_THINK_MAX_MIN_CTX, with a warning). */
void ds4_cli_chat_modes(const ds4_cli_chat *c, bool *thinking, bool *think_max);

/* One user turn: append the message, prefill its tokens, stream the
 * answer to stdout, append the assistant message. Speeds go to stderr
 * when `stats`. false on an engine error (printed). */
bool ds4_cli_chat_turn(ds4_cli_chat *c, const char *text, size_t len, bool stats);

/* The first prompt for a user text under the current options (system
 * prompt, thinking mode), without touching the conversation. malloc'd;
 * its template ranges are appended to *tpl (for ds4_tokenize_spans). */
char *ds4_cli_chat_first_prompt(ds4_cli_chat *c, const char *text, size_t len, size_t *plen, ds4_spans *tpl);

/* --raw-prompt: prefill the text as already rendered (every special-token
 * string in it is recognised, on purpose: the user wrote the template) and
 * generate. */
bool ds4_cli_chat_raw_turn(ds4_cli_chat *c, const char *text, size_t len, bool stats);

/* Rebuild the session from c->messages (after /ctx or /load): new session
 * with opt.ctx, full render, prefill. If the conversation ends with a user
 * message the answer is generated too. */
bool ds4_cli_chat_rebuild(ds4_cli_chat *c);

/* Prefill tokens into the session (appending to c->live), with the
 * progress bar. false on error or interrupt (message printed). */
bool ds4_cli_chat_prefill(ds4_cli_chat *c, const int32_t *ids, size_t n, double *seconds);

#endif

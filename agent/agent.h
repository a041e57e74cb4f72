/*
 * agent.h - one ds4-agent conversation on one live engine session.
 *
 * The session is never re-run for text it has already consumed: messages
 * [0, n_in_session) are in it, and each step renders only the messages
 * after those with the official renderer (include/ds4_chat.h) and prefills
 * that tail: the user's task, or the tool results (merged into one user
 * turn, as the chat format says), preceded by the EOS that closes the last
 * answer when it was not fed yet. Tools are declared, so reasoning is
 * never dropped from history (dsv4-chat-format.md §3.3) and the live text
 * equals what a full render of the messages gives (tests check this).
 *
 * live_text holds the exact bytes of the tokens in `live`: the key of the
 * session's disk snapshot (engine/kv_disk.h).
 */
#ifndef DS4_AGENT_H
#define DS4_AGENT_H

#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "agent/agent_buf.h"
#include "agent/agent_engine.h"
#include "agent/agent_tools.h"

typedef struct {
    bool thinking, think_max;
    int n_predict;        /* tokens per generation */
    int max_steps;        /* model turns per task */
    double compact_at;    /* compact when the session would pass this fraction of ctx */
    uint64_t seed;        /* base seed; each generation reseeds from it and the session length */
    bool color;           /* ANSI dim for reasoning and tool output */
    bool progress;        /* prefill progress bar on stderr */
    bool stats;           /* speeds on stderr */
    FILE *out;            /* the conversation (stdout) */
    FILE *trace;          /* --trace FILE, or NULL */
} agent_settings;

typedef struct {
    agent_engine *eng;
    agent_tools tools;
    json_t *schemas;        /* the declared tools (OpenAI form) */
    agent_settings s;
    json_t *messages;       /* messages[0] is the system prompt */
    size_t n_in_session;    /* messages already consumed by the session */
    agent_buf live_text;
    ds4_tokens live;
    bool pending_eos;       /* the last answer's EOS is not in the session yet */
    long next_call_id;
    int compactions;
    volatile sig_atomic_t *stop; /* Ctrl-C */
} agent;

typedef enum {
    AGENT_DONE = 0,      /* the model answered without calling a tool */
    AGENT_STOPPED,       /* Ctrl-C */
    AGENT_STEP_LIMIT,    /* max_steps model turns without a final answer */
    AGENT_FAILED,        /* engine error, context full (printed) */
} agent_outcome;

/* Takes ownership of nothing: eng, tools and schemas must outlive a. */
void agent_init(agent *a, agent_engine *eng, const agent_tools *tools, json_t *schemas, const agent_settings *s,
                const char *system_prompt);
void agent_free(agent *a);
/* Forget the conversation (keeps the system prompt) and reset the engine. */
void agent_clear(agent *a);

/* Run one user task to its end: generate, run the tools the model calls,
 * feed the results back, until an answer without tool calls. */
agent_outcome agent_task(agent *a, const char *text);

/* Summarise the oldest turns with the model itself and rebuild the
 * session from the summary and the recent turns (agent_compact.c). false
 * when there is nothing to compact or it failed (message printed). */
bool agent_compact(agent *a);

/* Bring the session up to date with the messages (prefill their tail).
 * false on an engine error or Ctrl-C (printed). */
bool agent_sync(agent *a);
/* Generate one answer onto the session (no tools run); the message is
 * appended. Returns the message (borrowed) or NULL. `quiet`: print nothing. */
json_t *agent_generate(agent *a, bool use_tools, bool quiet, const char **stop_reason);

/* The session's tokens/text bookkeeping (agent_loop.c). agent_feed_text
 * tokenizes rendered text whose template ranges are tpl (from
 * ds4_chat_render_spans; NULL: all of it is content, no specials);
 * agent_feed_tokens prefills ids as they are (a resumed session's own). */
bool agent_feed_text(agent *a, const char *text, size_t len, const ds4_spans *tpl);
bool agent_feed_tokens(agent *a, const int32_t *ids, size_t n);

/* The rendered text of all messages under the agent's settings (what a
 * fresh session would consume): tests compare it with live_text. */
char *agent_render_all(agent *a, size_t *len);

#endif

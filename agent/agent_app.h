/*
 * agent_app.h - the ds4-agent program around one agent: options, the
 * workspace, the engine, the current named session and the confirmation
 * prompt (Ctrl-C: cli/cli_sigint.h). main (ds4_agent_main.c) sets it up; the
 * interactive loop (agent_repl.c) drives it.
 */
#ifndef DS4_AGENT_APP_H
#define DS4_AGENT_APP_H

#include <stdbool.h>

#include "agent/agent.h"
#include "agent/agent_options.h"
#include "agent/agent_workspace.h"

typedef struct {
    agent_options opt;
    agent_workspace ws;
    agent_engine *eng;
    json_t *schemas;
    agent a;
    char sessions_dir[4096];
    char session[72];         /* current session name ("" = none: not saved) */
    bool can_ask;             /* confirmations read from stdin */
    bool always;              /* the user answered "a" */
    bool repl;                /* answers come through libedit */
    size_t saved_msgs, saved_tokens; /* what the last save wrote (skip identical saves) */
} agent_app;

/* Save the current session (when it has a name); prints errors. */
bool agent_app_save(agent_app *app);
/* Load session NAME into the agent (it becomes current). */
bool agent_app_load(agent_app *app, const char *name);
/* The confirmation callback (agent_tools.confirm). */
bool agent_app_confirm(void *app, const char *what);

int agent_repl(agent_app *app);

#endif

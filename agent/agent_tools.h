/*
 * agent_tools.h - the tools ds4-agent declares to the model and runs.
 *
 * Coding tool set (the default): read (line ranges), write, edit (exact
 * replacement), list, glob, search (PCRE2), shell. Demo tool set (for the
 * shipped demo model, which was trained on exactly these three):
 * get_weather, add, get_time, answered locally with made-up but
 * deterministic weather. Schemas are OpenAI function objects, rendered
 * into the prompt by the official renderer (include/ds4_chat.h).
 *
 * Every result is text for the model. Failures (bad arguments, a path
 * outside the workspace, a refused confirmation) are results too, starting
 * with "error:", so the model can see them and try something else.
 */
#ifndef DS4_AGENT_TOOLS_H
#define DS4_AGENT_TOOLS_H

#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

#include "agent/agent_workspace.h"

typedef enum { AGENT_TOOLSET_CODING = 0, AGENT_TOOLSET_DEMO = 1 } agent_toolset;

typedef struct {
    agent_workspace *ws;
    agent_toolset set;
    int cmd_timeout_ms;      /* default and maximum per command */
    size_t output_cap;       /* bytes of one result */
    /* Asked before a write, an edit or a command; NULL = always allowed
     * (--yes). Returns true to go ahead. */
    bool (*confirm)(void *ud, const char *what);
    void *confirm_ud;
    volatile sig_atomic_t *stop; /* Ctrl-C: a running command is killed */
} agent_tools;

/* The tool schemas of a set (a new array). */
json_t *agent_tools_schemas(agent_toolset set);

/* Run one call; the result text (malloc'd, never NULL unless out of
 * memory). *failed tells whether it is an error result. */
char *agent_tools_call(agent_tools *t, const char *name, const char *args_json, bool *failed);

#endif

/*
 * agent_options.h - the ds4-agent command line.
 *
 * The agent's own flags are parsed here; everything else (model, machine,
 * sampling, thinking: -m, --ctx, -t, --cpu, --cuda, --gpu-device, -p,
 * --prompt-file, -sys, -n, --think, --think-max, --nothink, --temp,
 * --top-p, --top-k, --min-p, --seed) goes to the ds4 CLI's own parser
 * (cli/cli_options.h), so both commands take the same flags the same way.
 */
#ifndef DS4_AGENT_OPTIONS_H
#define DS4_AGENT_OPTIONS_H

#include <stdbool.h>
#include <stdio.h>

#include "cli/cli_options.h"

typedef struct {
    ds4_cli_options cli;
    const char *workspace;     /* --workspace DIR, default "." */
    bool non_interactive;      /* --non-interactive: never ask, never read stdin */
    bool yes;                  /* --yes: writes and commands need no confirmation */
    const char *trace;         /* --trace FILE */
    const char *session;       /* --session NAME */
    const char *sessions_dir;  /* --sessions-dir DIR */
    const char *toolset;       /* --tools coding|demo (NULL: by model) */
    const char *test_script;   /* --test-script FILE: scripted test engine */
    int max_steps;             /* --max-steps N */
    int cmd_timeout_s;         /* --cmd-timeout S */
    long output_cap;           /* --output-cap BYTES */
    double compact_at;         /* --compact-at F */
    bool help;
} agent_options;

/* NULL on success, else the message. */
const char *agent_options_parse(agent_options *o, int argc, char **argv);
void agent_print_help(FILE *f);

#endif

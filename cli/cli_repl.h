/*
 * cli_repl.h - the interactive `ds4` chat (no -p): line editing and
 * history through libedit, slash commands, Ctrl-C to stop an answer.
 */
#ifndef DS4_CLI_REPL_H
#define DS4_CLI_REPL_H

#include "cli/cli_chat.h"

/* Runs until /quit or end of input. Returns the exit code. */
int ds4_cli_repl(ds4_cli_chat *c);

#endif

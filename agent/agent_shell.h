/*
 * agent_shell.h - running one shell command for the model.
 *
 * `/bin/sh -c COMMAND` with the workspace as cwd, stdin from /dev/null,
 * stdout and stderr merged, in its own process group (so the timeout and
 * Ctrl-C stop everything it started), and a clean environment: only PATH,
 * HOME, USER, LOGNAME, LANG, LC_ALL, LC_CTYPE, TZ and TMPDIR are passed
 * on, plus TERM=dumb and PWD; tokens and keys in the agent's environment
 * never reach the command. Output beyond the cap keeps its head and its
 * tail (a build's last lines matter most) and says how much was cut.
 */
#ifndef DS4_AGENT_SHELL_H
#define DS4_AGENT_SHELL_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct {
    int exit_code;      /* exit status, or 128 + signal */
    bool timed_out;
    bool interrupted;   /* *stop became set */
    size_t dropped;     /* output bytes cut out of the middle */
    char *output;       /* malloc'd, NUL-terminated */
    size_t len;
} agent_shell_result;

/* -1 with err when the command could not be started at all. */
int agent_shell_run(const char *cwd, const char *cmd, int timeout_ms, size_t cap, volatile sig_atomic_t *stop,
                    agent_shell_result *r, char *err, size_t es);
void agent_shell_result_free(agent_shell_result *r);

#endif

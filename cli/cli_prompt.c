/*
 * cli_prompt.c - the front ends' prompt line (see cli_prompt.h).
 */
#include "cli/cli_prompt.h"

#include "cli/cli_sigint.h"

#include <editline/readline.h>
#include <stdio.h>

char *ds4_cli_prompt_line(const char *prompt)
{
    for (;;) {
        ds4_cli_interrupted = 0;
        char *line = readline(prompt);
        if (line) return line;
        /* readline returns NULL at end of input, and also when the
         * handler's SIGINT ended the read (no SA_RESTART): only the
         * first ends the session */
        putchar('\n');
        if (!ds4_cli_interrupted) return NULL;
    }
}

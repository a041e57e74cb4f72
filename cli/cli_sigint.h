/*
 * cli_sigint.h - Ctrl-C in the interactive front ends (`ds4` and
 * ds4-agent): the handler only raises a flag, and prefill, generation, a
 * running tool command and the prompt look at it, so Ctrl-C stops the
 * work at hand and returns to the prompt instead of ending the program.
 */
#ifndef DS4_CLI_SIGINT_H
#define DS4_CLI_SIGINT_H

#include <signal.h>

/* Set by the SIGINT handler; whoever acts on it clears it. */
extern volatile sig_atomic_t ds4_cli_interrupted;

/* Install the handler, without SA_RESTART: a blocking read returns. */
void ds4_cli_install_sigint(void);

#endif

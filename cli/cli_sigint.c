/*
 * cli_sigint.c - the front ends' Ctrl-C flag (see cli_sigint.h).
 */
#include "cli/cli_sigint.h"

#include <string.h>

volatile sig_atomic_t ds4_cli_interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    ds4_cli_interrupted = 1;
}

void ds4_cli_install_sigint(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL); /* no SA_RESTART: a blocking read returns */
}

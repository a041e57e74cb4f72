/*
 * cli_prompt.h - the interactive prompt of `ds4` and ds4-agent: a libedit
 * line, where Ctrl-C (cli_sigint.h) abandons what was typed and gives a
 * fresh prompt instead of ending the session.
 */
#ifndef DS4_CLI_PROMPT_H
#define DS4_CLI_PROMPT_H

/* The next line typed after prompt (malloc'd, the caller frees it), NULL
 * at the end of input. Clears ds4_cli_interrupted before each read, so
 * what follows sees only a Ctrl-C pressed after the line was entered. */
char *ds4_cli_prompt_line(const char *prompt);

#endif

/*
 * cli_dump_tokens.h - `ds4 --dump-tokens`: tokenize text exactly as
 * written and print one "id<TAB>piece" line per token.
 */
#ifndef DS4_CLI_DUMP_TOKENS_H
#define DS4_CLI_DUMP_TOKENS_H

#include "include/ds4_tokenizer.h"

#include <stdio.h>

/* Print piece bytes escaped: printable ASCII as is, backslash as \\,
 * \n \r \t, every other byte as \xNN (so the line is unambiguous ASCII). */
void ds4_cli_print_escaped(FILE *f, const char *p, size_t n);

/* Tokenize with added tokens recognised; print the lines. Returns an exit code. */
int ds4_cli_dump_tokens(const ds4_tokenizer *tok, const char *text, size_t len, FILE *out);

#endif

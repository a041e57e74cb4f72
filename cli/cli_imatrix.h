/*
 * cli_imatrix.h - importance-matrix collection from the `ds4` command
 * (`--imatrix-dataset FILE --imatrix-out OUT.dat`, docs/QUALITY.md).
 */
#ifndef DS4_CLI_IMATRIX_H
#define DS4_CLI_IMATRIX_H

#include "cli/cli_options.h"

/* Render and tokenize every prompt of the dataset, evaluate them with a
 * collecting session, write OUT. 0 on success, 1 on error (printed). */
int ds4_cli_imatrix(const ds4_cli_options *o);

#endif

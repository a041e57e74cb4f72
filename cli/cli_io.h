/*
 * cli_io.h - small file helpers for the `ds4` front end.
 */
#ifndef DS4_CLI_IO_H
#define DS4_CLI_IO_H

#include <stddef.h>

/* Read a whole file (binary-safe, NUL-terminated). NULL + message on
 * stderr naming the file and the cause. */
char *ds4_cli_read_file(const char *path, size_t *len);

#endif

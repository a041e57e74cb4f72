/*
 * cli_io.h - small file helpers for the `ds4` front end.
 */
#ifndef DS4_CLI_IO_H
#define DS4_CLI_IO_H

#include <stdbool.h>
#include <stddef.h>

/* Read a whole file (binary-safe, NUL-terminated). NULL + message on
 * stderr naming the file and the cause. */
char *ds4_cli_read_file(const char *path, size_t *len);

/* The demo model ships in the repository (models/ds4-demo.gguf): its path
 * beside the current directory (a user running ./ds4 from the checkout),
 * else beside the executable, in out; false when neither exists. Used by
 * ds4 and ds4-agent when no -m is given. */
bool ds4_cli_find_demo_model(char *out, size_t cap);

#endif

/*
 * agent_fileio.h - whole-file reads and crash-safe writes (tool writes and
 * session transcripts).
 */
#ifndef DS4_AGENT_FILEIO_H
#define DS4_AGENT_FILEIO_H

#include <stdbool.h>
#include <stddef.h>

/* A whole file, at most max bytes (malloc'd, NUL-terminated); NULL with err. */
char *agent_read_whole(const char *path, size_t max, size_t *len, char *err, size_t es);
/* Replace path crash-safely: a temporary file in the same directory,
 * written and fsynced, renamed over path, then the directory fsynced. A
 * crash leaves either the old file or the new one, never a torn one. */
bool agent_write_atomic(const char *path, const char *data, size_t len, char *err, size_t es);
/* mkdir -p (mode 0700 for new directories). */
bool agent_mkdirs(const char *dir, char *err, size_t es);

#endif

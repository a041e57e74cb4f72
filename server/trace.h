/*
 * trace.h - the --trace FILE log: rendered prompts, cache decisions,
 * generated text and tool-parser events, one timestamped record each.
 *
 * Meant for debugging prompt rendering and cache misses; it contains
 * whatever users sent, so it is opt-in and the file is created 0600.
 */
#ifndef DS4_SERVER_TRACE_H
#define DS4_SERVER_TRACE_H

#include <stdbool.h>
#include <stddef.h>

/* Returns 0, or -1 when the file cannot be opened. NULL path = off. */
int trace_open(const char *path);
void trace_close(void);
bool trace_on(void);
/* One record: "== <time> <what>\n" then the text (escaped: no raw
 * control bytes except newline) and a newline. */
void trace_text(const char *what, const char *text, size_t len);
void trace_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif

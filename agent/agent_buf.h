/*
 * agent_buf.h - a growable byte buffer for the agent's texts (tool
 * results, the live session text). On allocation failure it sets `oom`
 * and ignores further appends, so callers check once at the end.
 */
#ifndef DS4_AGENT_BUF_H
#define DS4_AGENT_BUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    char *p; /* NUL-terminated when non-NULL */
    size_t n, cap;
    bool oom;
} agent_buf;

void agent_buf_add(agent_buf *b, const char *s, size_t n);
void agent_buf_puts(agent_buf *b, const char *s);
void agent_buf_printf(agent_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void agent_buf_free(agent_buf *b);
/* The bytes, handed over (an empty string rather than NULL); NULL on oom. */
char *agent_buf_take(agent_buf *b);

#endif

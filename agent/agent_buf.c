/*
 * agent_buf.c - growable byte buffer (see agent_buf.h).
 */
#include "agent/agent_buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void agent_buf_add(agent_buf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

void agent_buf_puts(agent_buf *b, const char *s) { agent_buf_add(b, s, strlen(s)); }

void agent_buf_printf(agent_buf *b, const char *fmt, ...)
{
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        agent_buf_add(b, small, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    agent_buf_add(b, big, (size_t)n);
    free(big);
}

void agent_buf_free(agent_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

char *agent_buf_take(agent_buf *b)
{
    if (b->oom) {
        agent_buf_free(b);
        return NULL;
    }
    if (!b->p) agent_buf_add(b, "", 0);
    char *p = b->p;
    memset(b, 0, sizeof *b);
    return p;
}

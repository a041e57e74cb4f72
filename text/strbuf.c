/*
 * strbuf.c - growable byte buffer (see strbuf.h).
 */
#include "text/strbuf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool reserve(ds4_strbuf *b, size_t extra)
{
    if (b->oom) return false;
    if (b->n + extra + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra + 1) {
        if (cap > SIZE_MAX / 2) {
            b->oom = true;
            return false;
        }
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

void ds4_sb_tpl(ds4_strbuf *b, const char *s)
{
    size_t n = strlen(s), at = b->n;
    ds4_sb_append(b, s, n);
    if (b->tpl && !b->oom) ds4_spans_add(b->tpl, at, n);
}

void ds4_sb_append(ds4_strbuf *b, const char *s, size_t n)
{
    if (!reserve(b, n)) return;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

void ds4_sb_puts(ds4_strbuf *b, const char *s) { ds4_sb_append(b, s, strlen(s)); }

void ds4_sb_putc(ds4_strbuf *b, char c) { ds4_sb_append(b, &c, 1); }

void ds4_sb_printf(ds4_strbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
}

void ds4_sb_free(ds4_strbuf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

char *ds4_sb_take(ds4_strbuf *b, size_t *len)
{
    if (b->oom) {
        ds4_sb_free(b);
        return NULL;
    }
    if (!b->p) ds4_sb_append(b, "", 0);
    char *p = b->p;
    if (len) *len = b->n;
    memset(b, 0, sizeof *b);
    return p;
}

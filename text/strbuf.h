/*
 * strbuf.h - a growable byte buffer for the renderers.
 *
 * Appends never fail loudly: on allocation failure the buffer sets `oom`
 * and ignores further appends, so rendering code can append freely and
 * check once at the end.
 */
#ifndef DS4_TEXT_STRBUF_H
#define DS4_TEXT_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

#include "include/ds4_tokenizer.h"

typedef struct {
    char *p;      /* NUL-terminated when non-NULL */
    size_t n, cap;
    bool oom;
    /* When set, ds4_sb_tpl records the ranges the template writes (the
     * renderers' text, as opposed to the caller's content). */
    ds4_spans *tpl;
} ds4_strbuf;

void ds4_sb_append(ds4_strbuf *b, const char *s, size_t n);
void ds4_sb_puts(ds4_strbuf *b, const char *s);
void ds4_sb_putc(ds4_strbuf *b, char c);
void ds4_sb_printf(ds4_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Template text (markers and the format's fixed wording): appended like
 * ds4_sb_puts, and its range recorded in b->tpl when set. Everything else
 * appended is the caller's content, which never becomes control tokens
 * (ds4_tokenize_spans). */
void ds4_sb_tpl(ds4_strbuf *b, const char *s);
void ds4_sb_free(ds4_strbuf *b);
/* Hand the bytes to the caller (never NULL unless oom); the buffer is reset. */
char *ds4_sb_take(ds4_strbuf *b, size_t *len);

#endif

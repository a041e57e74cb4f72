/*
 * utf8_stream.c - streaming token decoding that only ever emits complete,
 * valid UTF-8 (ds4_utf8_stream in include/ds4_tokenizer.h).
 *
 * One character often spans two tokens (CJK, emoji, accented letters in
 * some merges), so a front end printing token by token must hold back an
 * incomplete tail. Bytes that cannot start or continue a valid sequence are
 * replaced by U+FFFD immediately, so a broken byte never stalls the stream.
 */
#include "include/ds4_tokenizer.h"

#include "text/utf8.h"

#include <stdint.h>
#include <string.h>

static size_t put_replacement(char *out)
{
    memcpy(out, "\xEF\xBF\xBD", 3);
    return 3;
}

/* Emit what is complete in buf[0..n), keep an incomplete tail in s->held. */
static size_t drain(ds4_utf8_stream *s, const uint8_t *buf, size_t n, char *out)
{
    size_t o = 0, i = 0;
    size_t tail = ds4_utf8_incomplete_tail(buf, n);
    size_t end = n - tail;
    while (i < end) {
        size_t v = ds4_utf8_valid_prefix(buf + i, end - i);
        memcpy(out + o, buf + i, v);
        o += v;
        i += v;
        if (i < end) {
            o += put_replacement(out + o);
            i++;
        }
    }
    memcpy(s->held, buf + end, tail);
    s->n_held = tail;
    return o;
}

size_t ds4_utf8_stream_feed(ds4_utf8_stream *s, const char *bytes, size_t n, char *out)
{
    size_t o = 0;
    if (s->n_held) {
        /* complete the held sequence from the first few new bytes */
        uint8_t tmp[8];
        size_t take = n < 4 ? n : 4;
        memcpy(tmp, s->held, s->n_held);
        memcpy(tmp + s->n_held, bytes, take);
        size_t total = s->n_held + take;
        size_t k = ds4_utf8_seq_len(tmp, total);
        if (k > s->n_held) {
            memcpy(out, tmp, k);
            o = k;
            bytes += k - s->n_held;
            n -= k - s->n_held;
            s->n_held = 0;
        } else if (ds4_utf8_incomplete_tail(tmp, total) == total) {
            /* still incomplete: everything new was absorbed */
            memcpy(s->held, tmp, total);
            s->n_held = total;
            return 0;
        } else {
            o = put_replacement(out); /* the held bytes can never complete */
            s->n_held = 0;
        }
    }
    return o + drain(s, (const uint8_t *)bytes, n, out + o);
}

size_t ds4_utf8_stream_flush(ds4_utf8_stream *s, char *out)
{
    size_t o = 0;
    if (s->n_held) o = put_replacement(out);
    s->n_held = 0;
    return o;
}

size_t ds4_utf8_stream_token(ds4_utf8_stream *s, const ds4_tokenizer *tok, int32_t id, char *out,
                             size_t out_cap)
{
    size_t n;
    const char *p = ds4_token_bytes(tok, id, &n);
    if (!p) return 0;
    if (out_cap < DS4_UTF8_STREAM_MAX_OUT(n)) return SIZE_MAX;
    return ds4_utf8_stream_feed(s, p, n, out);
}

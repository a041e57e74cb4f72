/*
 * utf8.c - strict UTF-8 validation (see utf8.h).
 */
#include "text/utf8.h"

/* Valid second-byte range for a lead byte (the Unicode table 3-7). */
static int lead_info(uint8_t c, uint8_t *lo, uint8_t *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0;
    if (c < 0xE0) return 2;
    if (c == 0xE0) { *lo = 0xA0; return 3; }
    if (c == 0xED) { *hi = 0x9F; return 3; }
    if (c < 0xF0) return 3;
    if (c == 0xF0) { *lo = 0x90; return 4; }
    if (c < 0xF4) return 4;
    if (c == 0xF4) { *hi = 0x8F; return 4; }
    return 0;
}

size_t ds4_utf8_seq_len(const uint8_t *s, size_t n)
{
    if (n == 0) return 0;
    uint8_t lo, hi;
    int len = lead_info(s[0], &lo, &hi);
    if (len == 0 || (size_t)len > n) return 0;
    if (len >= 2 && (s[1] < lo || s[1] > hi)) return 0;
    for (int i = 2; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    return (size_t)len;
}

size_t ds4_utf8_valid_prefix(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = ds4_utf8_seq_len(s + i, n - i);
        if (!k) break;
        i += k;
    }
    return i;
}

size_t ds4_utf8_incomplete_tail(const uint8_t *s, size_t n)
{
    /* look at the last up-to-3 bytes for a lead byte whose sequence is cut */
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        uint8_t c = s[n - back];
        if ((c & 0xC0) == 0x80) continue; /* continuation: keep looking */
        uint8_t lo, hi;
        int len = lead_info(c, &lo, &hi);
        if (len <= 1 || (size_t)len <= back) return 0;
        /* check the bytes present so far are a valid prefix */
        if (back >= 2 && (s[n - back + 1] < lo || s[n - back + 1] > hi)) return 0;
        for (size_t i = 2; i < back; i++)
            if ((s[n - back + i] & 0xC0) != 0x80) return 0;
        return back;
    }
    return 0;
}

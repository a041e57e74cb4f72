/*
 * byte_unicode.c - GPT-2 byte-level table (see byte_unicode.h).
 *
 * The table is built from its definition rather than stored: printable
 * Latin-1 bytes keep their value, the rest are numbered from 256 upward in
 * byte order.
 */
#include "text/byte_unicode.h"

#include <pthread.h>

static bool byte_is_printable(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

uint32_t ds4_byte_to_codepoint(uint8_t b)
{
    if (byte_is_printable(b)) return b;
    /* count non-printable bytes below b */
    uint32_t n = 0;
    for (unsigned x = 0; x < b; x++) n += !byte_is_printable(x);
    return 256 + n;
}

/* Inverse: code point -> byte, -1 when not in the table. */
static int16_t g_inverse[256 + 68];
static pthread_once_t g_inverse_once = PTHREAD_ONCE_INIT;

static void build_inverse(void)
{
    for (unsigned i = 0; i < 256 + 68; i++) g_inverse[i] = -1;
    for (unsigned b = 0; b < 256; b++) g_inverse[ds4_byte_to_codepoint((uint8_t)b)] = (int16_t)b;
}

static int codepoint_to_byte(uint32_t cp)
{
    pthread_once(&g_inverse_once, build_inverse);
    if (cp >= 256 + 68) return -1;
    return g_inverse[cp];
}

bool ds4_byte_level_decode(const char *s, size_t len, uint8_t *out, size_t *out_len)
{
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0, n = 0;
    while (i < len) {
        uint32_t cp;
        if (p[i] < 0x80) {
            cp = p[i++];
        } else if ((p[i] & 0xE0) == 0xC0 && i + 1 < len && (p[i + 1] & 0xC0) == 0x80) {
            cp = ((uint32_t)(p[i] & 0x1F) << 6) | (p[i + 1] & 0x3F);
            i += 2;
        } else {
            return false; /* every table code point is below U+0800 */
        }
        int b = codepoint_to_byte(cp);
        if (b < 0) return false;
        out[n++] = (uint8_t)b;
    }
    *out_len = n;
    return true;
}

size_t ds4_byte_level_encode(const uint8_t *s, size_t len, char *out)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        uint32_t cp = ds4_byte_to_codepoint(s[i]);
        if (cp < 0x80) {
            out[n++] = (char)cp;
        } else {
            out[n++] = (char)(0xC0 | (cp >> 6));
            out[n++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    return n;
}

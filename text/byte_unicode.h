/*
 * byte_unicode.h - the GPT-2 byte <-> printable code point table.
 *
 * Byte-level BPE vocabularies store every normal token as a string of
 * printable characters, one per byte: bytes 0x21-0x7E, 0xA1-0xAC and
 * 0xAE-0xFF stand for themselves; the other 68 bytes, in increasing order,
 * map to U+0100..U+0143 (space -> U+0120 'Ġ', '\n' -> U+010A 'Ċ').
 * The tokenizer decodes vocabulary strings to raw bytes once at load time
 * and then works on raw bytes only.
 */
#ifndef DS4_TEXT_BYTE_UNICODE_H
#define DS4_TEXT_BYTE_UNICODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Code point that stands for byte b. */
uint32_t ds4_byte_to_codepoint(uint8_t b);

/* Decode a byte-level vocabulary string (UTF-8 of mapped code points) into
 * raw bytes. `out` needs room for `len` bytes (the result is never longer).
 * false if the string is not valid UTF-8 or holds a code point outside the
 * table. */
bool ds4_byte_level_decode(const char *s, size_t len, uint8_t *out, size_t *out_len);

/* Encode raw bytes into the byte-level form (UTF-8); `out` needs 2*len
 * bytes. Returns the length written. */
size_t ds4_byte_level_encode(const uint8_t *s, size_t len, char *out);

#endif

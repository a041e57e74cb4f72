/*
 * utf8.h - strict UTF-8 scanning shared by the tokenizer and renderers.
 *
 * "Strict" means what PCRE2 and JSON accept: no overlong forms, no
 * surrogates (U+D800..U+DFFF), nothing above U+10FFFF. The tokenizer runs
 * regexes only over valid runs (validated once, then matched with
 * PCRE2_NO_UTF_CHECK) and hands invalid bytes to BPE one by one.
 */
#ifndef DS4_TEXT_UTF8_H
#define DS4_TEXT_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length (1..4) of the valid UTF-8 sequence at s[0..n), or 0 if the bytes
 * there are not a complete valid sequence. */
size_t ds4_utf8_seq_len(const uint8_t *s, size_t n);

/* Length of the longest valid UTF-8 prefix of s[0..n). */
size_t ds4_utf8_valid_prefix(const uint8_t *s, size_t n);

/* Number of trailing bytes of s[0..n) that form an incomplete but so far
 * valid sequence (0..3): what a stream must hold back until more arrives. */
size_t ds4_utf8_incomplete_tail(const uint8_t *s, size_t n);

#endif

/*
 * pretokenizer.h - the DeepSeek V3/V4 pre-tokenizer (split before BPE).
 *
 * Three regex Split passes with "Isolated" behaviour, in order (see
 * dsv4-chat-format.md §2.2): numbers in groups of at most three, runs of
 * CJK ideographs and kana, then the main GPT-style pattern. Each pass runs
 * on every piece the previous one produced; matches and the gaps between
 * them are both pieces. Unicode classes (\p{L} \p{N} \p{P} \p{S} \p{M},
 * \s with U+0085) come from PCRE2 compiled with UTF+UCP and JIT.
 *
 * The input must be valid UTF-8 (the tokenizer validates once and hands
 * only valid runs here; matching then skips PCRE2's own UTF check, which
 * would otherwise rescan the subject on every call).
 */
#ifndef DS4_TEXT_PRETOKENIZER_H
#define DS4_TEXT_PRETOKENIZER_H

#include "include/ds4.h"

#include <stddef.h>

typedef struct ds4_pretokenizer ds4_pretokenizer;

/* Compile the three patterns. NULL + error message on failure. */
ds4_pretokenizer *ds4_pretokenizer_new(void);
void ds4_pretokenizer_free(ds4_pretokenizer *pt);

/* Called once per piece, in order; pieces tile the input exactly.
 * Return non-zero to stop (that value is returned by ds4_pretokenize). */
typedef int (*ds4_piece_fn)(void *ctx, const char *piece, size_t len);

/* Split valid UTF-8 text into pieces. Thread-safe (per-call match data).
 * Returns 0, the callback's non-zero value, or -1 on a regex engine error
 * (message set). */
int ds4_pretokenize(const ds4_pretokenizer *pt, const char *text, size_t len,
                    ds4_piece_fn fn, void *ctx);

#endif

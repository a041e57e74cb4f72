/*
 * bpe.h - byte-level BPE merging of one pre-token.
 *
 * The merge table maps an adjacent pair of token ids to its rank (the line
 * number in tokenizer.ggml.merges; lower merges first) and the id of the
 * merged token. Encoding starts from one token per byte and repeatedly
 * merges the lowest-ranked adjacent pair, the leftmost one on ties, until
 * no adjacent pair is in the table (dsv4-chat-format.md §2.2 step 4).
 *
 * The loop keeps the symbols in a linked list and candidate pairs in a
 * binary heap keyed by (rank, position), discarding stale entries when they
 * surface, so a piece of n bytes costs O(n log n) whatever its content
 * (a megabyte of one letter is one pre-token and must not go quadratic).
 */
#ifndef DS4_TEXT_BPE_H
#define DS4_TEXT_BPE_H

#include "text/str_map.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    ds4_u64_map pairs;       /* (left << 32 | right) -> (rank << 32 | merged) */
    int32_t byte_token[256]; /* id of the single-byte token, -1 if missing */
} ds4_bpe;

/* Reusable per-call buffers (grown on demand; free with ds4_bpe_scratch_free). */
typedef struct {
    int32_t *id, *prev, *next;
    void *heap;
    size_t cap, heap_cap;
} ds4_bpe_scratch;

void ds4_bpe_init(ds4_bpe *b);
void ds4_bpe_free(ds4_bpe *b);
/* Add a merge; an already present pair keeps its lower rank. */
bool ds4_bpe_add_merge(ds4_bpe *b, int32_t left, int32_t right, int32_t merged, uint32_t rank);

void ds4_bpe_scratch_free(ds4_bpe_scratch *s);

/* Merge the bytes of one piece. Writes the ids to out (needs room for len
 * ids; the result is never longer) and returns their count, or -1 when out
 * of memory or a byte has no single-byte token. */
long ds4_bpe_encode(const ds4_bpe *b, ds4_bpe_scratch *s, const uint8_t *bytes, size_t len,
                    int32_t *out);

#endif

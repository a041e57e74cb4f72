/*
 * added_tokens.h - finding added-token strings in text (leftmost-longest).
 *
 * The V4 vocabulary has 1,283 added tokens (<｜User｜>, <think>, ｜DSML｜,
 * placeholders, ...). HF splits every one of them out of the input before
 * pre-tokenization: at the leftmost position where any matches, the
 * longest one wins. A byte trie gives the longest match at a position in
 * O(match length); a first-byte filter makes scanning ordinary text cheap.
 */
#ifndef DS4_TEXT_ADDED_TOKENS_H
#define DS4_TEXT_ADDED_TOKENS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    int32_t first_child, next_sibling, token; /* token -1 when no token ends here */
    uint8_t byte;
} ds4_trie_node;

typedef struct {
    ds4_trie_node *nodes;
    size_t n, cap;
    bool first_byte[256];
} ds4_added_trie;

void ds4_added_trie_init(ds4_added_trie *t);
void ds4_added_trie_free(ds4_added_trie *t);
/* Insert a non-empty string; false when out of memory. A string inserted
 * twice keeps its first id. */
bool ds4_added_trie_insert(ds4_added_trie *t, const char *s, size_t len, int32_t id);
/* Longest token starting exactly at s[0]: its id and *match_len, or -1. */
int32_t ds4_added_trie_match(const ds4_added_trie *t, const char *s, size_t len, size_t *match_len);
/* Exact lookup of a whole string, or -1. */
int32_t ds4_added_trie_find(const ds4_added_trie *t, const char *s, size_t len);

#endif

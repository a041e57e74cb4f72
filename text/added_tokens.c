/*
 * added_tokens.c - byte trie of the added tokens (see added_tokens.h).
 *
 * Node 0 is the root. Children are a singly linked list: nodes have at
 * most a few dozen children and tries hold ~30K nodes, so lists beat
 * per-node 256-entry tables on memory and are fast enough.
 */
#include "text/added_tokens.h"

#include <stdlib.h>
#include <string.h>

void ds4_added_trie_init(ds4_added_trie *t) { memset(t, 0, sizeof *t); }

void ds4_added_trie_free(ds4_added_trie *t)
{
    free(t->nodes);
    memset(t, 0, sizeof *t);
}

static int32_t new_node(ds4_added_trie *t, uint8_t byte)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 1024;
        ds4_trie_node *nn = realloc(t->nodes, cap * sizeof *nn);
        if (!nn) return -1;
        t->nodes = nn;
        t->cap = cap;
    }
    ds4_trie_node *nd = &t->nodes[t->n];
    nd->first_child = nd->next_sibling = nd->token = -1;
    nd->byte = byte;
    return (int32_t)t->n++;
}

static int32_t child(const ds4_added_trie *t, int32_t node, uint8_t b)
{
    for (int32_t c = t->nodes[node].first_child; c >= 0; c = t->nodes[c].next_sibling)
        if (t->nodes[c].byte == b) return c;
    return -1;
}

bool ds4_added_trie_insert(ds4_added_trie *t, const char *s, size_t len, int32_t id)
{
    if (len == 0) return true;
    if (t->n == 0 && new_node(t, 0) < 0) return false;
    int32_t node = 0;
    for (size_t i = 0; i < len; i++) {
        uint8_t b = (uint8_t)s[i];
        int32_t c = child(t, node, b);
        if (c < 0) {
            c = new_node(t, b);
            if (c < 0) return false;
            t->nodes[c].next_sibling = t->nodes[node].first_child;
            t->nodes[node].first_child = c;
        }
        node = c;
    }
    if (t->nodes[node].token < 0) t->nodes[node].token = id;
    t->first_byte[(uint8_t)s[0]] = true;
    return true;
}

int32_t ds4_added_trie_match(const ds4_added_trie *t, const char *s, size_t len, size_t *match_len)
{
    int32_t best = -1, node = 0;
    if (t->n == 0) return -1;
    for (size_t i = 0; i < len; i++) {
        node = child(t, node, (uint8_t)s[i]);
        if (node < 0) break;
        if (t->nodes[node].token >= 0) {
            best = t->nodes[node].token;
            *match_len = i + 1;
        }
    }
    return best;
}

int32_t ds4_added_trie_find(const ds4_added_trie *t, const char *s, size_t len)
{
    if (t->n == 0 || len == 0) return -1;
    int32_t node = 0;
    for (size_t i = 0; i < len && node >= 0; i++) node = child(t, node, (uint8_t)s[i]);
    return node >= 0 ? t->nodes[node].token : -1;
}

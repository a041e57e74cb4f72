/*
 * bpe.c - rank-ordered pair merging (see bpe.h).
 */
#include "text/bpe.h"

#include <stdlib.h>

typedef struct {
    uint32_t rank;
    uint32_t pos;   /* index of the left symbol (its first byte) */
    int32_t left, right, merged;
} heap_entry;

void ds4_bpe_init(ds4_bpe *b)
{
    ds4_u64_map_init(&b->pairs);
    for (int i = 0; i < 256; i++) b->byte_token[i] = -1;
}

void ds4_bpe_free(ds4_bpe *b) { ds4_u64_map_free(&b->pairs); }

static uint64_t pair_key(int32_t l, int32_t r) { return ((uint64_t)(uint32_t)l << 32) | (uint32_t)r; }

bool ds4_bpe_add_merge(ds4_bpe *b, int32_t left, int32_t right, int32_t merged, uint32_t rank)
{
    uint64_t old;
    if (ds4_u64_map_get(&b->pairs, pair_key(left, right), &old)) return true;
    return ds4_u64_map_put(&b->pairs, pair_key(left, right), ((uint64_t)rank << 32) | (uint32_t)merged);
}

void ds4_bpe_scratch_free(ds4_bpe_scratch *s)
{
    free(s->id);
    free(s->prev);
    free(s->next);
    free(s->heap);
    s->id = s->prev = s->next = NULL;
    s->heap = NULL;
    s->cap = s->heap_cap = 0;
}

static bool heap_less(const heap_entry *a, const heap_entry *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

typedef struct {
    heap_entry *e;
    size_t n, cap;
} heap;

static bool heap_push(heap *h, heap_entry x)
{
    if (h->n == h->cap) return false; /* sized up front: never more than 2*len pushes live */
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&x, &h->e[p])) break;
        h->e[i] = h->e[p];
        i = p;
    }
    h->e[i] = x;
    return true;
}

static heap_entry heap_pop(heap *h)
{
    heap_entry top = h->e[0], x = h->e[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && heap_less(&h->e[c + 1], &h->e[c])) c++;
        if (!heap_less(&h->e[c], &x)) break;
        h->e[i] = h->e[c];
        i = c;
    }
    if (h->n) h->e[i] = x;
    return top;
}

static void try_pair(const ds4_bpe *b, heap *h, const int32_t *id, int32_t i, int32_t j)
{
    if (i < 0 || j < 0) return;
    uint64_t v;
    if (!ds4_u64_map_get(&b->pairs, pair_key(id[i], id[j]), &v)) return;
    heap_entry e = {(uint32_t)(v >> 32), (uint32_t)i, id[i], id[j], (int32_t)(uint32_t)v};
    heap_push(h, e);
}

static bool reserve(ds4_bpe_scratch *s, size_t len)
{
    if (len > s->cap) {
        size_t cap = len < 64 ? 64 : len;
        int32_t *a = realloc(s->id, cap * sizeof *a);
        if (a) s->id = a;
        int32_t *p = realloc(s->prev, cap * sizeof *p);
        if (p) s->prev = p;
        int32_t *n = realloc(s->next, cap * sizeof *n);
        if (n) s->next = n;
        if (!a || !p || !n) return false;
        s->cap = cap;
    }
    /* Each merge pushes at most 2 entries and there are < len merges, plus
     * the len-1 initial pairs: 3*len bounds the live heap. */
    if (3 * len > s->heap_cap) {
        size_t cap = 3 * len < 192 ? 192 : 3 * len;
        void *hp = realloc(s->heap, cap * sizeof(heap_entry));
        if (!hp) return false;
        s->heap = hp;
        s->heap_cap = cap;
    }
    return true;
}

long ds4_bpe_encode(const ds4_bpe *b, ds4_bpe_scratch *s, const uint8_t *bytes, size_t len,
                    int32_t *out)
{
    if (len == 0) return 0;
    if (len > INT32_MAX / 4 || !reserve(s, len)) return -1;
    int32_t *id = s->id, *prev = s->prev, *next = s->next;
    for (size_t i = 0; i < len; i++) {
        id[i] = b->byte_token[bytes[i]];
        if (id[i] < 0) return -1;
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < len ? (int32_t)i + 1 : -1;
    }
    if (len == 1) {
        out[0] = id[0];
        return 1;
    }
    heap h = {s->heap, 0, s->heap_cap};
    for (size_t i = 0; i + 1 < len; i++) try_pair(b, &h, id, (int32_t)i, (int32_t)i + 1);
    while (h.n) {
        heap_entry e = heap_pop(&h);
        int32_t i = (int32_t)e.pos, j = next[i];
        /* stale: the left symbol was absorbed, or either side changed */
        if (id[i] != e.left || j < 0 || id[j] != e.right) continue;
        id[i] = e.merged;
        id[j] = -1;
        next[i] = next[j];
        if (next[j] >= 0) prev[next[j]] = i;
        try_pair(b, &h, id, prev[i], i);
        try_pair(b, &h, id, i, next[i]);
    }
    long n = 0;
    for (int32_t i = 0; i >= 0; i = next[i]) out[n++] = id[i];
    return n;
}

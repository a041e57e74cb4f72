/*
 * tool_memory.c - bounded id -> sampled DSML map (see header).
 *
 * Blocks are shared by the ids of one assistant turn, so entries hold a
 * reference-counted block. Lookups are linear over a hash-bucketed table;
 * eviction takes the entry with the oldest use stamp found by a scan, which
 * is O(n) but happens once per inserted id and n is bounded by the flag.
 */
#include "server/tool_memory.h"

#include <openssl/rand.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *text;
    size_t len;
    int refs;
} block;

typedef struct {
    char *id;     /* NULL = free slot */
    block *b;
    uint64_t used;
} entry;

struct tool_memory {
    pthread_mutex_t mu;
    entry *e;
    size_t cap, count, max_ids;
    uint64_t clock;
};

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

tool_memory *tool_memory_new(size_t max_ids)
{
    tool_memory *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
    m->max_ids = max_ids ? max_ids : 1;
    m->cap = 64;
    while (m->cap < m->max_ids * 2 && m->cap < (1u << 24)) m->cap *= 2;
    m->e = calloc(m->cap, sizeof *m->e);
    if (!m->e) { free(m); return NULL; }
    return m;
}

static void block_unref(block *b)
{
    if (b && --b->refs == 0) { free(b->text); free(b); }
}

void tool_memory_free(tool_memory *m)
{
    if (!m) return;
    for (size_t i = 0; i < m->cap; i++)
        if (m->e[i].id) { free(m->e[i].id); block_unref(m->e[i].b); }
    free(m->e);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static entry *find(tool_memory *m, const char *id)
{
    size_t i = hash_str(id) & (m->cap - 1);
    for (size_t k = 0; k < m->cap; k++, i = (i + 1) & (m->cap - 1)) {
        if (!m->e[i].id) return NULL;
        if (!strcmp(m->e[i].id, id)) return &m->e[i];
    }
    return NULL;
}

/* Open addressing without tombstones: removing re-inserts the run after it. */
static void remove_at(tool_memory *m, size_t i)
{
    free(m->e[i].id);
    block_unref(m->e[i].b);
    m->e[i].id = NULL;
    m->count--;
    for (size_t j = (i + 1) & (m->cap - 1); m->e[j].id; j = (j + 1) & (m->cap - 1)) {
        entry t = m->e[j];
        m->e[j].id = NULL;
        size_t k = hash_str(t.id) & (m->cap - 1);
        while (m->e[k].id) k = (k + 1) & (m->cap - 1);
        m->e[k] = t;
    }
}

static void evict_oldest(tool_memory *m)
{
    size_t best = m->cap;
    for (size_t i = 0; i < m->cap; i++)
        if (m->e[i].id && (best == m->cap || m->e[i].used < m->e[best].used)) best = i;
    if (best < m->cap) remove_at(m, best);
}

void tool_memory_put(tool_memory *m, const char *const *ids, size_t n,
                     const char *dsml, size_t dsml_len)
{
    if (!m || n == 0) return;
    block *b = calloc(1, sizeof *b);
    if (!b || !(b->text = malloc(dsml_len + 1))) { free(b); return; }
    memcpy(b->text, dsml, dsml_len);
    b->text[dsml_len] = 0;
    b->len = dsml_len;
    pthread_mutex_lock(&m->mu);
    for (size_t k = 0; k < n; k++) {
        entry *e = find(m, ids[k]);
        if (e) {
            block_unref(e->b);
        } else {
            while (m->count >= m->max_ids || m->count + 1 > m->cap / 2) evict_oldest(m);
            size_t i = hash_str(ids[k]) & (m->cap - 1);
            while (m->e[i].id) i = (i + 1) & (m->cap - 1);
            e = &m->e[i];
            e->id = strdup(ids[k]);
            if (!e->id) continue;
            m->count++;
        }
        e->b = b;
        b->refs++;
        e->used = ++m->clock;
    }
    if (b->refs == 0) { free(b->text); free(b); }
    pthread_mutex_unlock(&m->mu);
}

char *tool_memory_get_block(tool_memory *m, const char *const *ids, size_t n)
{
    if (!m || n == 0) return NULL;
    char *out = NULL;
    pthread_mutex_lock(&m->mu);
    block *b = NULL;
    size_t k;
    for (k = 0; k < n; k++) {
        entry *e = ids[k] ? find(m, ids[k]) : NULL;
        if (!e || (b && e->b != b)) break;
        b = e->b;
        e->used = ++m->clock;
    }
    if (k == n && b && (out = malloc(b->len + 1))) memcpy(out, b->text, b->len + 1);
    pthread_mutex_unlock(&m->mu);
    return out;
}

size_t tool_memory_count(tool_memory *m)
{
    pthread_mutex_lock(&m->mu);
    size_t n = m->count;
    pthread_mutex_unlock(&m->mu);
    return n;
}

int tool_id_new(const char *prefix, char *out, size_t out_size)
{
    unsigned char r[16];
    size_t pl = strlen(prefix);
    if (out_size < pl + 33) return -1;
    if (RAND_bytes(r, sizeof r) != 1) return -1;
    memcpy(out, prefix, pl);
    for (int i = 0; i < 16; i++) snprintf(out + pl + 2 * i, 3, "%02x", r[i]);
    return 0;
}

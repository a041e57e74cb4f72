/*
 * str_map.c - the open-addressing hash maps of str_map.h.
 *
 * Linear probing over a power-of-two table kept at most half full. The hash
 * is 64-bit FNV-1a followed by a murmur-style finalizer (FNV alone clusters
 * badly on the short, similar keys a vocabulary is made of).
 */
#include "text/str_map.h"

#include <stdlib.h>
#include <string.h>

static uint64_t mix64(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

uint64_t ds4_hash_bytes(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ULL;
    }
    return mix64(h ^ n) | 1;
}

void ds4_str_map_init(ds4_str_map *m) { memset(m, 0, sizeof *m); }

void ds4_str_map_free(ds4_str_map *m)
{
    free(m->slots);
    free(m->arena);
    memset(m, 0, sizeof *m);
}

void ds4_str_map_clear(ds4_str_map *m)
{
    if (m->slots) memset(m->slots, 0, m->cap * sizeof *m->slots);
    m->count = 0;
    m->arena_len = 0;
}

size_t ds4_str_map_bytes(const ds4_str_map *m)
{
    return m->cap * sizeof *m->slots + m->arena_cap;
}

static ds4_str_slot *find_slot(const ds4_str_map *m, const void *key, size_t len, uint64_t h)
{
    size_t mask = m->cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        ds4_str_slot *s = &m->slots[i];
        if (s->hash == 0) return s;
        if (s->hash == h && s->len == len && memcmp(m->arena + s->off, key, len) == 0) return s;
    }
}

bool ds4_str_map_get(const ds4_str_map *m, const void *key, size_t len, uint64_t *value)
{
    if (m->count == 0) return false;
    ds4_str_slot *s = find_slot(m, key, len, ds4_hash_bytes(key, len));
    if (s->hash == 0) return false;
    if (value) *value = s->value;
    return true;
}

static bool grow(ds4_str_map *m)
{
    size_t ncap = m->cap ? m->cap * 2 : 1024;
    ds4_str_slot *ns = calloc(ncap, sizeof *ns);
    if (!ns) return false;
    for (size_t i = 0; i < m->cap; i++) {
        ds4_str_slot s = m->slots[i];
        if (s.hash == 0) continue;
        size_t j = s.hash & (ncap - 1);
        while (ns[j].hash) j = (j + 1) & (ncap - 1);
        ns[j] = s;
    }
    free(m->slots);
    m->slots = ns;
    m->cap = ncap;
    return true;
}

bool ds4_str_map_put(ds4_str_map *m, const void *key, size_t len, uint64_t value)
{
    if (len > UINT32_MAX) return false;
    if ((m->count + 1) * 2 > m->cap && !grow(m)) return false;
    uint64_t h = ds4_hash_bytes(key, len);
    ds4_str_slot *s = find_slot(m, key, len, h);
    if (s->hash) {
        s->value = value;
        return true;
    }
    if (m->arena_len + len > m->arena_cap) {
        size_t ncap = m->arena_cap ? m->arena_cap : 4096;
        while (ncap < m->arena_len + len) ncap *= 2;
        if (ncap > UINT32_MAX) return false;
        char *na = realloc(m->arena, ncap);
        if (!na) return false;
        m->arena = na;
        m->arena_cap = ncap;
    }
    memcpy(m->arena + m->arena_len, key, len);
    s->hash = h;
    s->value = value;
    s->off = (uint32_t)m->arena_len;
    s->len = (uint32_t)len;
    m->arena_len += len;
    m->count++;
    return true;
}

void ds4_u64_map_init(ds4_u64_map *m) { memset(m, 0, sizeof *m); }

void ds4_u64_map_free(ds4_u64_map *m)
{
    free(m->keys);
    free(m->values);
    memset(m, 0, sizeof *m);
}

bool ds4_u64_map_get(const ds4_u64_map *m, uint64_t key, uint64_t *value)
{
    if (m->count == 0) return false;
    uint64_t k = key + 1;
    size_t mask = m->cap - 1;
    for (size_t i = mix64(key) & mask;; i = (i + 1) & mask) {
        if (m->keys[i] == k) {
            *value = m->values[i];
            return true;
        }
        if (m->keys[i] == 0) return false;
    }
}

bool ds4_u64_map_put(ds4_u64_map *m, uint64_t key, uint64_t value)
{
    if (key == UINT64_MAX) return false;
    if ((m->count + 1) * 2 > m->cap) {
        size_t ncap = m->cap ? m->cap * 2 : 1024;
        uint64_t *nk = calloc(ncap, sizeof *nk), *nv = malloc(ncap * sizeof *nv);
        if (!nk || !nv) {
            free(nk);
            free(nv);
            return false;
        }
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->keys[i]) continue;
            size_t j = mix64(m->keys[i] - 1) & (ncap - 1);
            while (nk[j]) j = (j + 1) & (ncap - 1);
            nk[j] = m->keys[i];
            nv[j] = m->values[i];
        }
        free(m->keys);
        free(m->values);
        m->keys = nk;
        m->values = nv;
        m->cap = ncap;
    }
    uint64_t k = key + 1;
    size_t mask = m->cap - 1;
    size_t i = mix64(key) & mask;
    while (m->keys[i] && m->keys[i] != k) i = (i + 1) & mask;
    if (!m->keys[i]) m->count++;
    m->keys[i] = k;
    m->values[i] = value;
    return true;
}

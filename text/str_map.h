/*
 * str_map.h - open-addressing hash maps used by the tokenizer.
 *
 * ds4_str_map maps byte strings (not NUL-terminated, may contain NUL) to a
 * uint64 value. Keys are copied into an arena the map owns, so callers can
 * insert slices of a temporary buffer. ds4_u64_map maps a uint64 key to a
 * uint64 value (BPE pair -> rank/merged id). Both grow by doubling at 50%
 * load; lookups are a hash, a few compares, no allocation.
 *
 * They are private to text/: small, with exactly the operations the
 * tokenizer needs (no deletion; clear drops everything at once, which is
 * how the bounded pre-token cache is reset).
 */
#ifndef DS4_TEXT_STR_MAP_H
#define DS4_TEXT_STR_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t hash;   /* 0 marks an empty slot (real hashes are forced odd) */
    uint64_t value;
    uint32_t off;    /* key offset in the arena */
    uint32_t len;
} ds4_str_slot;

typedef struct {
    ds4_str_slot *slots;
    size_t cap;      /* power of two */
    size_t count;
    char *arena;
    size_t arena_len, arena_cap;
} ds4_str_map;

uint64_t ds4_hash_bytes(const void *p, size_t n);

void ds4_str_map_init(ds4_str_map *m);
void ds4_str_map_free(ds4_str_map *m);
void ds4_str_map_clear(ds4_str_map *m);
/* true and *value when present. */
bool ds4_str_map_get(const ds4_str_map *m, const void *key, size_t len, uint64_t *value);
/* Insert or overwrite. false only when out of memory (or key > 4 GiB). */
bool ds4_str_map_put(ds4_str_map *m, const void *key, size_t len, uint64_t value);
/* Bytes held (slots + arena), for bounding caches. */
size_t ds4_str_map_bytes(const ds4_str_map *m);

typedef struct {
    uint64_t *keys;   /* key+1 stored, so 0 means empty */
    uint64_t *values;
    size_t cap, count;
} ds4_u64_map;

void ds4_u64_map_init(ds4_u64_map *m);
void ds4_u64_map_free(ds4_u64_map *m);
bool ds4_u64_map_get(const ds4_u64_map *m, uint64_t key, uint64_t *value);
bool ds4_u64_map_put(ds4_u64_map *m, uint64_t key, uint64_t value);

#endif

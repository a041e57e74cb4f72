/*
 * expert_cache.h - a bounded cache of routed experts read from the GGUF
 * file with pread (expert streaming, docs/STREAMING.md).
 *
 * 97.5% of a Flash file is routed experts and a token uses 6 of 256 per
 * layer, so a model larger than memory runs when only the experts in use
 * live in memory. The cache holds a fixed number of slots; a slot holds
 * one (layer, expert): its gate, up and down matrices back to back, read
 * from the file by a pool of reader threads (several reads in flight, so
 * an SSD's queue depth is used), never by page faults on the mapping, so
 * the memory used is the budget and nothing more. A miss evicts the slot
 * the policy picks among those no caller holds.
 *
 * Bytes are the file's bytes, so a computation on a slot gives exactly the
 * bits it gives on the mapping: output does not depend on the budget.
 *
 * Use (backend/cpu/ops_cpu_moe.c): find the layer by the address of its
 * gate tensor in the mapping; touch() the experts a call needs (they are
 * then evicted last); acquire() each (a hit pins the slot, a miss also
 * queues its read), wait() for its bytes, compute, release(). Thread-safe:
 * the sessions of one model share one cache.
 */
#ifndef DS4_BACKEND_EXPERT_CACHE_H
#define DS4_BACKEND_EXPERT_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "include/ds4.h"

typedef struct ds4_expert_cache ds4_expert_cache;

/* The routed-expert tensors of one layer: where the gate tensor is in the
 * mapping (the lookup key), and the file offset and bytes per expert of
 * gate, up and down (expert e of tensor i is at off[i] + e * stride[i]). */
typedef struct {
    const void *gate_data;
    uint64_t off[3];
    uint64_t stride[3];
} ds4_expert_layer;

typedef enum {
    DS4_EXPERT_POLICY_LRU = 1,  /* evict the least recently used */
    DS4_EXPERT_POLICY_FREQ = 2, /* evict the least used (counts halve every n_slots misses), LRU among equals */
} ds4_expert_policy;

typedef struct {
    uint64_t hits, misses;      /* acquires served from memory / from the file */
    uint64_t bytes_read;        /* bytes read from the file (misses and preload) */
    uint64_t slots, slot_bytes; /* capacity */
    uint64_t resident;          /* slots holding an expert now */
    double read_seconds;        /* summed over reader threads */
} ds4_expert_cache_stats;

/* Open `path` for reading and allocate n_slots slots (memory is touched
 * only as slots fill). layers[n_layer] describe the tensors; each layer
 * has n_expert experts. n_readers threads read misses (<= 0: 8). NULL +
 * message on failure. */
ds4_expert_cache *ds4_expert_cache_create(const char *path, int n_layer, int n_expert,
                                          const ds4_expert_layer *layers, uint64_t n_slots,
                                          ds4_expert_policy policy, int n_readers);
void ds4_expert_cache_free(ds4_expert_cache *c);

/* Bytes one slot takes (gate + up + down of the largest layer, aligned). */
uint64_t ds4_expert_cache_slot_bytes(int n_layer, const ds4_expert_layer *layers);

/* The layer whose gate tensor is at `gate_data`, or -1 (not streamed). */
int ds4_expert_cache_layer(const ds4_expert_cache *c, const void *gate_data);

/* Mark the n experts of one call as in use now: the policy evicts them
 * last while the call runs (a later acquire of the same call must not
 * evict an expert the call still needs). */
void ds4_expert_cache_touch(ds4_expert_cache *c, int layer, const int32_t *experts, int n);

/* Pin the slot of (layer, expert), queueing its read on a miss. With
 * may_block false returns -1 when every slot is pinned; with may_block
 * true waits for a release instead (call it so only while holding no
 * pin, or two callers could wait on each other). */
int64_t ds4_expert_cache_acquire(ds4_expert_cache *c, int layer, int expert, bool may_block);

/* Wait until a pinned slot's bytes are in; returns gate, up and down. */
void ds4_expert_cache_wait(ds4_expert_cache *c, int64_t slot, const void **gate, const void **up,
                           const void **down);
void ds4_expert_cache_release(ds4_expert_cache *c, int64_t slot);

/* Read the n (layer, expert) pairs (pairs[2i], pairs[2i+1]) ahead of use,
 * in parallel, up to the number of slots; they count as used once. */
void ds4_expert_cache_preload(ds4_expert_cache *c, const int32_t *pairs, int64_t n);

void ds4_expert_cache_get_stats(ds4_expert_cache *c, ds4_expert_cache_stats *out);

/* DS4_OK, or the first read error (short read, I/O error) with a message
 * naming the file, layer, expert and offset. A slot whose read failed
 * holds zeros, so the forward that used it must be discarded. */
ds4_status ds4_expert_cache_error(ds4_expert_cache *c);

#endif

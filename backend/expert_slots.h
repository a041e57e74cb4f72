/*
 * expert_slots.h - bookkeeping of a fixed pool of expert slots: which
 * (layer, expert) each slot holds, the expert -> slot map of every layer,
 * and which slot a miss evicts (LRU or frequency, the policies of the CPU
 * streaming cache, backend/expert_cache.h). No memory of its own besides
 * the tables, no threads, no I/O: the caller moves the bytes. Used by the
 * CUDA VRAM expert cache (backend/cuda/cuda_expert_cache.cu), which copies
 * a miss's weights into the slot it is given; kept in plain C so that the
 * bookkeeping is tested without a GPU (tests/test_expert_slots.c).
 *
 * A call (one MoE op, or one chunk of its tokens) first begins(), then
 * resolves its experts: each gets a slot, a miss evicts the slot the
 * policy picks among those the call has not used, so a call never loses
 * an expert it still needs. A call needs at most n_slots distinct experts.
 */
#ifndef DS4_BACKEND_EXPERT_SLOTS_H
#define DS4_BACKEND_EXPERT_SLOTS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct ds4_expert_slots ds4_expert_slots;

/* Policies, numbered as ds4_expert_evict (include/ds4.h). */
enum { DS4_SLOTS_LRU = 1, DS4_SLOTS_FREQ = 2 };

/* NULL (message set) on bad sizes or out of memory. n_slots >= 1. */
ds4_expert_slots *ds4_expert_slots_create(int n_layer, int n_expert, int64_t n_slots, int policy);
void ds4_expert_slots_free(ds4_expert_slots *s);

/* The slot holding (layer, expert), or -1. */
int64_t ds4_expert_slots_find(const ds4_expert_slots *s, int layer, int expert);

/* The expert -> slot map of a layer: n_expert entries, -1 = not held. */
const int32_t *ds4_expert_slots_map(const ds4_expert_slots *s, int layer);

/* Start a call: the slots it resolves are protected until the next begin. */
void ds4_expert_slots_begin(ds4_expert_slots *s);

/* Give (layer, expert) a slot for this call. Returns the slot; *miss is
 * set when the expert was not held (the caller must fill the slot);
 * *evicted_layer/_expert name what the slot held before (-1: empty).
 * -1 (message set) when every slot is used by this call already, or the
 * ids are out of range. */
int64_t ds4_expert_slots_resolve(ds4_expert_slots *s, int layer, int expert, bool *miss, int *evicted_layer,
                                 int *evicted_expert);

/* Distinct experts among ids[0..n) in range [0, n_expert). */
int ds4_expert_slots_distinct(const ds4_expert_slots *s, const int32_t *ids, int n);

typedef struct {
    uint64_t hits, misses, evictions;
    int64_t n_slots, resident;
} ds4_expert_slots_stats;
void ds4_expert_slots_get_stats(const ds4_expert_slots *s, ds4_expert_slots_stats *out);

#endif

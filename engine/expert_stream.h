/*
 * expert_stream.h - expert streaming for a loaded model (docs/STREAMING.md):
 * sizing the routed-expert cache from the options and the machine's free
 * memory, creating it over the GGUF, keeping the other weights resident,
 * and preloading the hot list.
 */
#ifndef DS4_ENGINE_EXPERT_STREAM_H
#define DS4_ENGINE_EXPERT_STREAM_H

#include "backend/expert_cache.h"
#include "engine/expert_profile.h"
#include "include/ds4.h"
#include "model/dsv4_model.h"

/* The cache for model m (opened from path) per the options; *preloaded:
 * experts read from the hot list. NULL + message on a bad option value
 * (a budget of 0, more than the model, a malformed hot list). */
ds4_expert_cache *ds4_expert_stream_open(const dsv4_model *m, const char *path, const ds4_model_options *o,
                                         uint64_t *preloaded);

/* The hot-list entries to preload into a cache of `slots` experts of
 * slot_bytes each, per the options: none when cold; the file
 * o->hotlist_path (checked against the model) or the list compiled in for
 * the model's family (none: *n = 0); the first o->preload_experts, or by
 * default at most default_cap_bytes and half the cache. *out holds the
 * list (free it), *n how many of its first entries to load. */
ds4_status ds4_expert_stream_hotlist(const dsv4_model *m, const ds4_model_options *o, uint64_t slots,
                                     uint64_t slot_bytes, uint64_t default_cap_bytes, ds4_expert_hotlist *out,
                                     uint64_t *n);

/* Bytes of all routed experts of the model, as stored in the file. */
uint64_t ds4_expert_stream_model_bytes(const dsv4_model *m);

#endif

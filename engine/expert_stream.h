/*
 * expert_stream.h - expert streaming for a loaded model (docs/STREAMING.md):
 * sizing the routed-expert cache from the options and the machine's free
 * memory, creating it over the GGUF, keeping the other weights resident,
 * and preloading the hot list.
 */
#ifndef DS4_ENGINE_EXPERT_STREAM_H
#define DS4_ENGINE_EXPERT_STREAM_H

#include "backend/expert_cache.h"
#include "include/ds4.h"
#include "model/dsv4_model.h"

/* The cache for model m (opened from path) per the options; *preloaded:
 * experts read from the hot list. NULL + message on a bad option value
 * (a budget of 0, more than the model, a malformed hot list). */
ds4_expert_cache *ds4_expert_stream_open(const dsv4_model *m, const char *path, const ds4_model_options *o,
                                         uint64_t *preloaded);

/* Bytes of all routed experts of the model, as stored in the file. */
uint64_t ds4_expert_stream_model_bytes(const dsv4_model *m);

#endif

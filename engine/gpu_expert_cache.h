/*
 * gpu_expert_cache.h - sizing and attaching the CUDA backend's VRAM expert
 * cache (--gpu-expert-cache; docs/STREAMING.md "CUDA"). The cache itself
 * is backend/cuda/cuda_expert_cache.cu; its bookkeeping
 * backend/expert_slots.c.
 */
#ifndef DS4_ENGINE_GPU_EXPERT_CACHE_H
#define DS4_ENGINE_GPU_EXPERT_CACHE_H

#include "backend/ops.h"
#include "include/ds4.h"
#include "model/dsv4_model.h"

/* The number of slots the options ask for: 0 when the cache is off or
 * would hold every routed expert (then nothing is gained: full
 * residency). Errors (message naming the cause): a negative count, a
 * size that holds no expert, fewer slots than one token's experts of one
 * layer, more than the model's routed experts, with ssd_streaming. */
ds4_status ds4_gpu_expert_slots(const dsv4_model *m, const ds4_model_options *o, int64_t *slots);

/* The hot-list pairs a cache of `slots` experts starts with (copied in the
 * background at session start): the expert streaming rules
 * (engine/expert_stream.h: --ssd-streaming-cold, -hotlist FILE,
 * -preload-experts N), by default the list compiled in for the model's
 * family, at most half the cache. *pairs: malloc'd, 2 x *n entries. */
ds4_status ds4_gpu_expert_preload(const dsv4_model *m, const ds4_model_options *o, int64_t slots, int32_t **pairs,
                                  int64_t *n);

/* Give backend be a cache of `slots` experts of model m (before its
 * weights are prepared), seeded with the n preload pairs. An error when
 * the backend has none (the CPU). */
ds4_status ds4_gpu_expert_cache_attach(const dsv4_model *m, ds4_backend *be, int64_t slots, ds4_expert_evict evict,
                                       const int32_t *pairs, int64_t n);

#endif

/*
 * cuda_expert_cache.h - plain C entry points of the VRAM expert cache's
 * file (cuda_expert_cache.cu) for programs outside the backend.
 */
#ifndef DS4_CUDA_EXPERT_CACHE_H
#define DS4_CUDA_EXPERT_CACHE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Host -> device copy bandwidth in bytes/s on `device`: `bytes` from
 * page-locked host memory (pinned = 1) or pageable memory (0), the
 * median of `reps` timed cudaMemcpy calls after one warm-up. What a miss
 * of the VRAM expert cache can get at best: the roofline of a cached run
 * (ds4-bench --gpu-expert-cache). <= 0 on failure. */
double ds4_cuda_h2d_bandwidth(int device, size_t bytes, int pinned, int reps);

#ifdef __cplusplus
}
#endif

#endif

/*
 * dist_plan.h - which layers each rank of a distributed run holds
 * (docs/DISTRIBUTED.md), and the fingerprint that tells whether two ranks
 * opened the same model file. No MPI here: rank 0 decides with these, the
 * tests call them directly.
 */
#ifndef DS4_ENGINE_DIST_PLAN_H
#define DS4_ENGINE_DIST_PLAN_H

#include "include/ds4.h"

#include <stdint.h>

typedef struct {
    int lo, hi; /* layers lo..hi-1; lo < 0: none asked for */
} ds4_dist_range;

/* "A:B" (0 <= A < B) into r; DS4_ERR_INVALID naming the text otherwise. */
ds4_status ds4_dist_parse_range(const char *text, ds4_dist_range *r);

/* The bytes of a model file's tensors per layer (layer_bytes has room for
 * DSV4_MAX_LAYERS), of the embedding and of the head (output*), and a
 * fingerprint of its tensor table (names, types, shapes, sizes, offsets)
 * and file size: equal files give equal fingerprints. Reads the header only. */
typedef struct {
    int n_layer;
    uint64_t layer_bytes[256];
    uint64_t embed_bytes, head_bytes;
    uint64_t fingerprint;
} ds4_dist_model_info;
ds4_status ds4_dist_model_info_read(const char *path, ds4_dist_model_info *out);

/* The ranges of n_rank ranks. asked[r]: what rank r was given with
 * --layers (lo < 0: nothing); either every rank has one, and they must
 * cover 0..n_layer-1 in rank order without gap or overlap, or none has,
 * and the layers are split into contiguous ranges whose bytes (the
 * embedding counted with the first, the head with the last) are
 * proportional to weight[r] (each rank's free memory; NULL: equal). Every
 * rank gets at least one layer. DS4_ERR_INVALID with a message naming the
 * rank and the range when the ranges cannot be used. */
ds4_status ds4_dist_plan(const ds4_dist_model_info *mi, int n_rank, const ds4_dist_range *asked,
                         const uint64_t *weight, ds4_dist_range *out);

#endif

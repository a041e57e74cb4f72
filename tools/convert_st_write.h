/*
 * convert_st_write.h - write a .safetensors file (u64 header length, JSON
 * header, raw data), for crafting small checkpoints in tests and tools
 * (e.g. an official-style checkpoint with FP8/FP4 tensors made from the
 * tiny fixture). Tensors are written in the given order, densely packed.
 */
#ifndef DS4_TOOLS_CONVERT_ST_WRITE_H
#define DS4_TOOLS_CONVERT_ST_WRITE_H

#include "include/ds4.h"

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *name;
    const char *dtype; /* "BF16", "F8_E4M3", ... written as is */
    int n_dims;
    int64_t shape[8];
    const void *data;
    size_t nbytes;
} st_write_tensor;

ds4_status st_write_file(const char *path, const st_write_tensor *t, int n);

/* model.safetensors.index.json for shards: files[i] holds tensor names[i]. */
ds4_status st_write_index(const char *path, const char *const *names, const char *const *files, int n);

#endif

/*
 * convert_safetensors.h - read-only view of a Hugging Face checkpoint's
 * *.safetensors files, for the converter (ds4-quantize).
 *
 * A checkpoint directory holds either model.safetensors.index.json (whose
 * "weight_map" names the shard of every tensor) or just one or more
 * *.safetensors files. Every shard is mmapped; its header (u64 length + JSON
 * of {name: {dtype, shape, data_offsets}}) is parsed with jansson and fully
 * validated at open: offsets inside the file and ordered, byte size equal to
 * shape x dtype size, no duplicate names across shards. Tensors are then
 * found by name (sorted table, binary search) and read in place, so an
 * 160 GB checkpoint costs only address space.
 *
 * A dtype this reader does not know is kept (dtype ST_UNKNOWN, its string in
 * dtype_name) so that a checkpoint with an unrelated exotic tensor still
 * opens; the converter fails only if it needs that tensor, naming it.
 */
#ifndef DS4_TOOLS_CONVERT_SAFETENSORS_H
#define DS4_TOOLS_CONVERT_SAFETENSORS_H

#include "include/ds4.h"

#include <stdint.h>

#define ST_MAX_DIMS 8

typedef enum {
    ST_UNKNOWN = 0,
    ST_F64,
    ST_F32,
    ST_F16,
    ST_BF16,
    ST_F8_E4M3, /* FP8 E4M3 "fn" (no inf, 0x7f/0xff NaN) */
    ST_F8_E8M0, /* UE8M0 power-of-two scale, 2^(e-127) */
    ST_I64,
    ST_I32,
    ST_I16,
    ST_I8,      /* also packed FP4-E2M1 pairs in the official experts */
    ST_U8,
    ST_BOOL,
} st_dtype;

typedef struct {
    const char *name;
    st_dtype dtype;
    const char *dtype_name; /* as written in the header ("BF16", ...) */
    int n_dims;
    int64_t shape[ST_MAX_DIMS]; /* PyTorch order: shape[n_dims-1] fastest */
    const uint8_t *data;
    uint64_t nbytes;
    const char *file; /* shard path, for messages */
} st_tensor;

typedef struct st_archive st_archive;

/* Bytes of one element of a dtype (0 for ST_UNKNOWN). */
int st_dtype_size(st_dtype dt);
const char *st_dtype_str(st_dtype dt);

/* Open a checkpoint directory (index or every *.safetensors in it), or a
 * single .safetensors file. NULL + ds4_last_error() on failure. */
st_archive *st_open(const char *path);
void st_close(st_archive *a);

int64_t st_count(const st_archive *a);
const st_tensor *st_at(const st_archive *a, int64_t i);
/* NULL when absent (no error set: absence is often a normal probe). */
const st_tensor *st_find(const st_archive *a, const char *name);
/* Product of the shape (1 for a scalar). */
int64_t st_nelements(const st_tensor *t);

#endif

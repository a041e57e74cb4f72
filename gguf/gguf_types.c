/*
 * gguf_types.c - sizes and names of GGUF value types and ggml tensor types.
 *
 * The reader must size every tensor of a file, including types the engine
 * never computes with, so it keeps its own table of all ggml type ids with
 * a known block layout (ids ggml removed from GGUF files, 4, 5, 31..33 and
 * 36..38, are left out and rejected). The numbers are the public format's
 * block sizes (ggml-common.h); the quant/ layer owns the block structs.
 */
#include "gguf/gguf.h"

#include "util/error.h"

static const ds4_gguf_type_info k_types[] = {
    [0] = {"F32", 1, 4},
    [1] = {"F16", 1, 2},
    [2] = {"Q4_0", 32, 18},
    [3] = {"Q4_1", 32, 20},
    [6] = {"Q5_0", 32, 22},
    [7] = {"Q5_1", 32, 24},
    [8] = {"Q8_0", 32, 34},
    [9] = {"Q8_1", 32, 36},
    [10] = {"Q2_K", 256, 84},
    [11] = {"Q3_K", 256, 110},
    [12] = {"Q4_K", 256, 144},
    [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210},
    [15] = {"Q8_K", 256, 292},
    [16] = {"IQ2_XXS", 256, 66},
    [17] = {"IQ2_XS", 256, 74},
    [18] = {"IQ3_XXS", 256, 98},
    [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18},
    [21] = {"IQ3_S", 256, 110},
    [22] = {"IQ2_S", 256, 82},
    [23] = {"IQ4_XS", 256, 136},
    [24] = {"I8", 1, 1},
    [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},
    [27] = {"I64", 1, 8},
    [28] = {"F64", 1, 8},
    [29] = {"IQ1_M", 256, 56},
    [30] = {"BF16", 1, 2},
    [34] = {"TQ1_0", 256, 54},
    [35] = {"TQ2_0", 256, 66},
    [39] = {"MXFP4", 32, 17},
    [40] = {"NVFP4", 64, 36},
};
#define N_TYPES (sizeof k_types / sizeof k_types[0])

const ds4_gguf_type_info *ds4_gguf_type_info_of(uint32_t t)
{
    if (t >= N_TYPES || k_types[t].name == NULL) return NULL;
    return &k_types[t];
}

const char *ds4_gguf_type_name(uint32_t t)
{
    const ds4_gguf_type_info *ti = ds4_gguf_type_info_of(t);
    return ti ? ti->name : "?";
}

ds4_status ds4_gguf_tensor_nbytes(uint32_t type, uint32_t n_dims,
                                  const uint64_t *ne, uint64_t *out)
{
    const ds4_gguf_type_info *ti = ds4_gguf_type_info_of(type);
    if (!ti) return ds4_fail(DS4_ERR_UNSUPPORTED, "unknown ggml type id %u", type);
    if (n_dims < 1 || n_dims > DS4_GGUF_MAX_DIMS)
        return ds4_fail(DS4_ERR_FORMAT, "n_dims %u not in 1..%d", n_dims,
                        DS4_GGUF_MAX_DIMS);
    /* ggml counts elements in int64_t, so the product must fit there. */
    uint64_t nel = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] == 0) return ds4_fail(DS4_ERR_FORMAT, "dim %u is 0", d);
        if (ne[d] > (uint64_t)INT64_MAX / nel)
            return ds4_fail(DS4_ERR_FORMAT, "shape overflows: dim %u = %llu", d,
                            (unsigned long long)ne[d]);
        nel *= ne[d];
    }
    if (ne[0] % ti->block_elems != 0)
        return ds4_fail(DS4_ERR_FORMAT, "ne[0] = %llu is not a multiple of the %s block size %u",
                        (unsigned long long)ne[0], ti->name, ti->block_elems);
    uint64_t blocks = nel / ti->block_elems;
    if (blocks > (uint64_t)INT64_MAX / ti->block_bytes)
        return ds4_fail(DS4_ERR_FORMAT, "tensor byte size overflows (%llu blocks of %u)",
                        (unsigned long long)blocks, ti->block_bytes);
    *out = blocks * ti->block_bytes;
    return DS4_OK;
}

static const char *const k_vnames[DS4_GGUF_VTYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr",
    "u64", "i64", "f64",
};
static const unsigned char k_vsizes[DS4_GGUF_VTYPE_COUNT] = {
    1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8,
};

const char *ds4_gguf_vtype_name(uint32_t v)
{
    return v < DS4_GGUF_VTYPE_COUNT ? k_vnames[v] : "?";
}

size_t ds4_gguf_vtype_size(uint32_t v)
{
    return v < DS4_GGUF_VTYPE_COUNT ? k_vsizes[v] : 0;
}

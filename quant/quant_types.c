/*
 * quant_types.c - the table of GGML types this project knows, row sizes and
 * lookup by name.
 *
 * One static table is the single source of block sizes; everything else
 * (GGUF tensor sizes, kernels, converter flags) asks it. Ids not in the
 * table are rejected here so that callers need no special cases.
 */
#include "quant/quant.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "util/error.h"

static const ds4_type_info k_types[] = {
    {DS4_TYPE_F32, "f32", 1, 4, true, true, false},
    {DS4_TYPE_F16, "f16", 1, 2, true, true, false},
    {DS4_TYPE_Q8_0, "q8_0", QK8_0, sizeof(block_q8_0), true, true, false},
    {DS4_TYPE_Q2_K, "q2_K", QK_K, sizeof(block_q2_K), true, true, false},
    {DS4_TYPE_Q4_K, "q4_K", QK_K, sizeof(block_q4_K), true, true, false},
    {DS4_TYPE_Q8_K, "q8_K", QK_K, sizeof(block_q8_K), true, true, false},
    {DS4_TYPE_IQ2_XXS, "iq2_xxs", QK_K, sizeof(block_iq2_xxs), true, true, true},
    {DS4_TYPE_I32, "i32", 1, 4, false, false, false},
    {DS4_TYPE_BF16, "bf16", 1, 2, true, true, false},
    {DS4_TYPE_MXFP4, "mxfp4", QK_MXFP4, sizeof(block_mxfp4), true, true, false},
};

#define N_TYPES (sizeof k_types / sizeof k_types[0])

static const ds4_type_info *find_type(ds4_type type)
{
    for (size_t i = 0; i < N_TYPES; i++)
        if (k_types[i].type == type) return &k_types[i];
    return NULL;
}

const ds4_type_info *ds4_type_get(ds4_type type)
{
    const ds4_type_info *t = find_type(type);
    if (!t)
        ds4_fail(DS4_ERR_UNSUPPORTED,
                 "quant: ggml type id %d is not supported (known: f32 f16 "
                 "q8_0 q2_K q4_K q8_K iq2_xxs i32 bf16 mxfp4)",
                 (int)type);
    return t;
}

const char *ds4_type_name(ds4_type type)
{
    const ds4_type_info *t = find_type(type);
    return t ? t->name : "unknown";
}

ds4_status ds4_type_from_name(const char *name, ds4_type *out)
{
    if (name)
        for (size_t i = 0; i < N_TYPES; i++)
            if (strcasecmp(name, k_types[i].name) == 0) {
                *out = k_types[i].type;
                return DS4_OK;
            }
    return ds4_fail(DS4_ERR_NOT_FOUND,
                    "quant: unknown type name '%s' (known: f32 f16 q8_0 q2_K "
                    "q4_K q8_K iq2_xxs i32 bf16 mxfp4)",
                    name ? name : "(null)");
}

ds4_status ds4_row_bytes_checked(ds4_type type, int64_t n, int64_t *out)
{
    const ds4_type_info *t = ds4_type_get(type);
    if (!t) return DS4_ERR_UNSUPPORTED;
    if (n < 0)
        return ds4_fail(DS4_ERR_INVALID, "quant: %s: negative row length %lld",
                        t->name, (long long)n);
    if (n % t->block_elems != 0)
        return ds4_fail(DS4_ERR_INVALID,
                        "quant: %s: row length %lld is not a multiple of the "
                        "block size %lld",
                        t->name, (long long)n, (long long)t->block_elems);
    int64_t blocks = n / t->block_elems;
    if (blocks > INT64_MAX / t->block_bytes)
        return ds4_fail(DS4_ERR_INVALID, "quant: %s: row of %lld values overflows",
                        t->name, (long long)n);
    *out = blocks * t->block_bytes;
    return DS4_OK;
}

int64_t ds4_row_bytes(ds4_type type, int64_t n)
{
    int64_t b;
    return ds4_row_bytes_checked(type, n, &b) == DS4_OK ? b : -1;
}

/*
 * convert_source.h - where the values of one GGUF tensor come from in a
 * checkpoint, validated up front, and decoded to f32 rows on demand.
 *
 * Resolving checks everything before a byte is written: the tensor exists
 * (an error names the checkpoint tensor and the GGUF tensor it feeds), its
 * shape is the reverse of the GGUF shape (PyTorch [out, in] = GGUF [in,
 * out]), its dtype is one we decode, and its scale tensor (FP8 / FP4) is
 * present with the matching shape. Source dtypes:
 *   F32, F64, F16, BF16
 *   F8_E4M3 weight + "<name>.scale" (or ".weight_scale_inv"), one scale per
 *       128x128 block, scale dtype F8_E8M0 (UE8M0), F32 or BF16
 *   I8/U8 packed FP4-E2M1 (low nibble = even column) + per-32 F8_E8M0
 *       scale [rows, cols/32] (the official routed experts)
 *   I32 / I64 for tid2eid.
 * Decoding a row range is thread-safe (read-only mmapped data).
 */
#ifndef DS4_TOOLS_CONVERT_SOURCE_H
#define DS4_TOOLS_CONVERT_SOURCE_H

#include "tools/convert_names.h"

typedef struct {
    const st_tensor *w;
    const st_tensor *scale; /* NULL unless FP8 / FP4 */
    uint64_t rows, cols;    /* logical matrix (cols = values per row) */
    bool fp4;
} convert_part;

typedef enum { SRC_WHOLE, SRC_FUSED_GATE, SRC_FUSED_UP, SRC_PER_EXPERT } convert_src_kind;

typedef struct {
    const plan_tensor *t;
    convert_src_kind kind;
    convert_part whole;     /* WHOLE and FUSED */
    convert_part *experts;  /* PER_EXPERT: one per slab */
} convert_src;

ds4_status convert_src_resolve(const st_archive *a, convert_scheme s, const plan_tensor *t,
                               convert_src *out);
void convert_src_free(convert_src *src);

/* Rows [row0, row0+n) of expert slab `slab` (0 for 1-D/2-D) as f32, n*ne0
 * values. Fails (naming the tensor) on a NaN FP8 code or a bad scale. */
ds4_status convert_src_rows(const convert_src *src, uint64_t slab, uint64_t row0, uint64_t n, float *out);

/* The whole integer tensor (tid2eid) as int32; every value must be in
 * [0, max_value). */
ds4_status convert_src_i32(const convert_src *src, int32_t *out, int64_t max_value);

/* Set used[i] for every checkpoint tensor (index in st_at order) that src
 * reads, scales included. */
void convert_src_mark_used(const convert_src *src, const st_archive *a, uint8_t *used);

/* Official FP4 experts with UE8M0 scales hold exactly MXFP4 values: repack
 * rows [row0, row0+n) of an expert losslessly into MXFP4 blocks. */
bool convert_src_is_fp4_e8m0(const convert_src *src);
ds4_status convert_src_fp4_to_mxfp4(const convert_src *src, uint64_t slab, uint64_t row0, uint64_t n, void *dst);

#endif

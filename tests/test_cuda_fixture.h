/*
 * test_cuda_fixture.h - loading the ggml quantization fixtures
 * (tests/data/quants/TYPE-nN-MODE.bin, layout in that folder's README) for
 * the CUDA tests. Header-only: each test binary is one .c file.
 */
#ifndef DS4_TEST_CUDA_FIXTURE_H
#define DS4_TEST_CUDA_FIXTURE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant/blocks.h"
#include "tests/test.h"

typedef struct {
    void *file;
    ds4_type type;
    int64_t n, rows, row_bytes;
    const float *x, *deq, *y, *dot_ggml;
    const uint8_t *q;
    double dot_exact[8];
} cuda_fixture;

/* One fixture per supported weight type, n = 4096 (the plain variant where
 * ggml made one; IQ2_XXS needs an importance matrix). */
static const struct {
    ds4_type type;
    const char *file;
} CUDA_FIXTURES[] = {
    {DS4_TYPE_Q8_0, "quants/q8_0-n4096-plain.bin"},
    {DS4_TYPE_Q2_K, "quants/q2_K-n4096-plain.bin"},
    {DS4_TYPE_Q4_K, "quants/q4_K-n4096-plain.bin"},
    {DS4_TYPE_IQ2_XXS, "quants/iq2_xxs-n4096-imatrix.bin"},
    {DS4_TYPE_MXFP4, "quants/mxfp4-n4096-plain.bin"},
    {DS4_TYPE_F16, "quants/f16-n4096-plain.bin"},
    {DS4_TYPE_BF16, "quants/bf16-n4096-plain.bin"},
};
#define N_CUDA_FIXTURES ((int)(sizeof CUDA_FIXTURES / sizeof CUDA_FIXTURES[0]))

static inline uint32_t fixture_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* 0 on success; the pointers alias the loaded file. */
static inline int cuda_fixture_load(const char *rel, cuda_fixture *f)
{
    size_t len = 0;
    memset(f, 0, sizeof *f);
    uint8_t *b = test_read_file(test_data(rel), &len);
    if (!b || len < 28 || memcmp(b, "QFX1", 4) != 0) {
        free(b);
        return -1;
    }
    f->file = b;
    f->type = (ds4_type)fixture_u32(b + 4);
    f->n = fixture_u32(b + 8);
    f->rows = fixture_u32(b + 12);
    f->row_bytes = fixture_u32(b + 16);
    uint32_t has_im = fixture_u32(b + 20);
    if (f->rows != 8 || f->n % 256 != 0) return -1;
    size_t off = 28;
    size_t need = off + 4 * (size_t)(f->rows * f->n) + (has_im ? 4 * (size_t)f->n : 0) +
                  (size_t)(f->rows * f->row_bytes) + 4 * (size_t)(f->rows * f->n) +
                  4 * (size_t)f->n + 4 * 8 + 8 * 8;
    if (len < need) return -1;
    f->x = (const float *)(b + off);
    off += 4 * (size_t)(f->rows * f->n);
    if (has_im) off += 4 * (size_t)f->n;
    f->q = b + off;
    off += (size_t)(f->rows * f->row_bytes);
    f->deq = (const float *)(b + off);
    off += 4 * (size_t)(f->rows * f->n);
    f->y = (const float *)(b + off);
    off += 4 * (size_t)f->n;
    f->dot_ggml = (const float *)(b + off);
    off += 4 * 8;
    memcpy(f->dot_exact, b + off, 8 * 8);
    return 0;
}

static inline void cuda_fixture_free(cuda_fixture *f)
{
    free(f->file);
    f->file = NULL;
}

/* Deterministic uniform numbers in [-1, 1). */
static inline float cuda_test_rand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

#endif

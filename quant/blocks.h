/*
 * blocks.h - GGML tensor types and quantization block layouts.
 *
 * These are the on-disk layouts of the GGUF ecosystem (ggml-common.h is the
 * reference); the published DeepSeek V4 GGUFs use them, so they must match
 * bit for bit. Each block is a plain packed struct with a static size check.
 * Halves (`uint16_t` named d/dmin) are IEEE binary16 bit patterns.
 */
#ifndef DS4_QUANT_BLOCKS_H
#define DS4_QUANT_BLOCKS_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

/* GGML type ids as stored in GGUF tensor infos. */
typedef enum {
    DS4_TYPE_F32 = 0,
    DS4_TYPE_F16 = 1,
    DS4_TYPE_Q8_0 = 8,
    DS4_TYPE_Q2_K = 10,
    DS4_TYPE_Q4_K = 12,
    DS4_TYPE_Q8_K = 15,
    DS4_TYPE_IQ2_XXS = 16,
    DS4_TYPE_I32 = 26,
    DS4_TYPE_BF16 = 30,
    DS4_TYPE_MXFP4 = 39,
} ds4_type;

#define QK8_0 32   /* Q8_0 values per block */
#define QK_K 256   /* super-block size of the K-quants and IQ2_XXS */
#define QK_MXFP4 32
#define K_SCALE_SIZE 12

/* Q8_0: 32 int8 values, one f16 scale. x = d * q */
typedef struct {
    uint16_t d;
    int8_t qs[QK8_0];
} block_q8_0;
static_assert(sizeof(block_q8_0) == 34, "block_q8_0 size");

/* Q2_K: 16 sub-blocks of 16; 4-bit scale and 4-bit min per sub-block,
 * 2-bit quants. x = d * (scales & 15) * q - dmin * (scales >> 4) */
typedef struct {
    uint8_t scales[QK_K / 16];
    uint8_t qs[QK_K / 4];
    uint16_t d;
    uint16_t dmin;
} block_q2_K;
static_assert(sizeof(block_q2_K) == 84, "block_q2_K size");

/* Q4_K: 8 sub-blocks of 32; 6-bit scales and mins packed in 12 bytes,
 * 4-bit quants. */
typedef struct {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qs[QK_K / 2];
} block_q4_K;
static_assert(sizeof(block_q4_K) == 144, "block_q4_K size");

/* Q8_K: the activation format of the K-quant dot products (f32 scale). */
typedef struct {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
} block_q8_K;
static_assert(sizeof(block_q8_K) == 292, "block_q8_K size");

/* IQ2_XXS: 2.0625 bits per weight; per 32 values one uint32 of 4 grid
 * indices and one uint32 of 4x7 sign bits + a 4-bit scale. */
typedef struct {
    uint16_t d;
    uint16_t qs[QK_K / 8];
} block_iq2_xxs;
static_assert(sizeof(block_iq2_xxs) == 66, "block_iq2_xxs size");

/* MXFP4: 32 E2M1 values (two per byte, low nibbles first half), one E8M0
 * shared exponent. */
typedef struct {
    uint8_t e;
    uint8_t qs[QK_MXFP4 / 2];
} block_mxfp4;
static_assert(sizeof(block_mxfp4) == 17, "block_mxfp4 size");

#endif

/*
 * quant_tables.h - the numeric tables of the IQ2_XXS and MXFP4 formats
 * (data in quant_tables.c; format facts shared with every GGUF reader).
 */
#ifndef DS4_QUANT_TABLES_H
#define DS4_QUANT_TABLES_H

#include <stdint.h>

/* IQ2_XXS: 256 grid points; byte j of entry k is the magnitude of value j
 * (one of 0x08, 0x19, 0x2b). */
extern const uint64_t ds4_iq2xxs_grid[256];

/* IQ2 signs: 7-bit index -> 8 sign bits (bit j set: value j negative);
 * bit 7 is the parity of the other seven (even number of minus signs). */
extern const uint8_t ds4_ksigns_iq2xs[128];

/* MXFP4: the 16 E2M1 codes as doubled integers (0, 1, 2, 3, 4, 6, 8, 12,
 * then negated); the block scale 2^(e-128) undoes the doubling. */
extern const int8_t ds4_kvalues_mxfp4[16];

#endif

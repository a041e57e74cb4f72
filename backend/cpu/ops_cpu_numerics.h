/*
 * ops_cpu_numerics.h - the "official" numerics simulations of
 * dsv4-model.md §4.1 on single rows, for the CPU ops:
 *   D1 FP8-E4M3 round trip of a KV row's non-RoPE dims (blocks of 64,
 *      power-of-two scale 2^ceil(log2(amax/448)), amax floored at 1e-4);
 *   D2 indexer QAT: Hadamard (unnormalized butterfly x 1/sqrt(n)) then
 *      FP4-E2M1 round trip (blocks of 32, scale 2^ceil(log2(amax/6)));
 *   D3 f16 storage rounding.
 * Row lengths that are not multiples of the block (tiny test models) end
 * with a shorter block; a Hadamard needs a power-of-two length (128 for
 * Flash), other lengths skip it.
 */
#ifndef DS4_BACKEND_CPU_OPS_CPU_NUMERICS_H
#define DS4_BACKEND_CPU_OPS_CPU_NUMERICS_H

#include <stdint.h>

void cpu_fp8_kv_roundtrip(float *x, int n);
void cpu_fp4_roundtrip(float *x, int n);
void cpu_hadamard(float *x, int n);
void cpu_indexer_qat_row(float *x, int n);
void cpu_f16_round(float *x, int n);

#endif

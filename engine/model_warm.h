/*
 * model_warm.h - bring every page of a mapped model into this process's
 * page tables before the first token (ds4_model_options.warm_weights,
 * `--warm-weights`), so that the first prefill does not pay a page fault
 * per 4 KiB of weights it touches (first-touch faults were ~14% of the
 * samples of a cold CPU prefill at 256 experts).
 */
#ifndef DS4_ENGINE_MODEL_WARM_H
#define DS4_ENGINE_MODEL_WARM_H

#include <stddef.h>

/* Reads one byte per page of [base, base + size) on n_threads threads
 * (<= 0: the online CPUs), after asking the kernel to read ahead. Returns
 * the number of pages touched. */
size_t ds4_model_warm(const void *base, size_t size, int n_threads);

#endif

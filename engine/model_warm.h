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

/* Bytes of [base, base + size) that this process maps with huge pages
 * (the kernel's own count: /proc/self/smaps FilePmdMapped, AnonHugePages,
 * ShmemPmdMapped and Private/Shared_Hugetlb of the mappings overlapping
 * the range: the file's mapping ends on the page boundary past it), or -1
 * where smaps cannot be read. */
long long ds4_mapped_huge_bytes(const void *base, size_t size);

#endif

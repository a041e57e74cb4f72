/*
 * model_numa.h - NUMA placement of the weights (ds4_model_options.numa,
 * `--numa interleave`). A CPU decode streams every weight byte once per
 * token, so on a multi-socket server it runs at the bandwidth of the
 * memory the pages sit in: with the default policy (first touch) the whole
 * file lands on the node of whichever thread read it first, and the other
 * sockets' memory controllers idle. Interleaving spreads the pages round
 * robin over every node with memory.
 */
#ifndef DS4_ENGINE_MODEL_NUMA_H
#define DS4_ENGINE_MODEL_NUMA_H

#include "include/ds4.h"

#include <stddef.h>

/* Interleave over every node with memory: this process's policy (what it
 * allocates from now on: KV, activations, page cache it reads in) and the
 * mapping [base, base + size)'s, moving the pages of it already in memory
 * that only this process maps. DS4_ERR_UNSUPPORTED (with a message) where
 * the kernel has no NUMA support. */
ds4_status ds4_numa_interleave(const void *base, size_t size);

/* "policy P; N0 x%, N1 y%" for the pages of [base, base + size) in memory,
 * as the kernel reports them (/proc/self/numa_maps); returns the number of
 * nodes listed, -1 where the kernel does not report it. */
int ds4_numa_report(const void *base, size_t size, char *buf, size_t len);

#endif

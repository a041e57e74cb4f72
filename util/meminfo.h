/*
 * meminfo.h - what the kernel says about memory, for the parts that size
 * themselves to the machine (the distributed front's rank report, expert
 * streaming's resident budget).
 */
#ifndef DS4_UTIL_MEMINFO_H
#define DS4_UTIL_MEMINFO_H

#include <stdint.h>

/* MemAvailable from /proc/meminfo in bytes; 0 when unknown. */
uint64_t ds4_mem_available(void);

#endif

/*
 * bench_disk.h - read bandwidth of the disk holding a file (bench_disk.c).
 */
#ifndef DS4_BENCH_BENCH_DISK_H
#define DS4_BENCH_BENCH_DISK_H

#include <stdint.h>

/* Bytes/s of `total` bytes read from `path` in random `chunk`-sized
 * pieces by `threads` threads, page cache dropped around each; -1 on an
 * error. */
double bench_disk_read_bw(const char *path, uint64_t chunk, uint64_t total, int threads);

#endif

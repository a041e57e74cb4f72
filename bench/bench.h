/*
 * bench.h - options shared by the ds4-bench modes, and the modes.
 *
 * ds4-bench is one program with several benchmark modes (kernels now;
 * model prefill/decode later). ds4_bench_main.c parses the options common
 * to all modes into ds4_bench_opts and calls the selected mode.
 */
#ifndef DS4_BENCH_BENCH_H
#define DS4_BENCH_BENCH_H

#include <stdint.h>
#include <time.h>

typedef struct {
    int threads; /* <= 0: all online CPUs */
    int reps;    /* timed repeats per measurement (median is reported) */
    const char *types; /* comma-separated type names, NULL = all */
    const char *tables; /* --kernels tables: matvec,rate,prefill,moe; NULL = all */
} ds4_bench_opts;

/* CPU kernel bandwidth table (matvec GB/s vs copy GB/s). Returns 0 or 1. */
int ds4_bench_kernels(const ds4_bench_opts *opts);
/* The `moe` table of --kernels (bench_moe.c); 0, or 1 on failure. */
int ds4_bench_moe_table(const ds4_bench_opts *opts);

/* Wall-clock seconds (monotonic), for the modes' timings. */
static inline double ds4_bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* xorshift64: the benches' random weights and picks (a fixed seed per
 * table, so two runs time the same data). */
static inline uint64_t ds4_bench_xorshift(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}

#endif

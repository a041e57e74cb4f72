/*
 * bench.h - options shared by the ds4-bench modes, and the modes.
 *
 * ds4-bench is one program with several benchmark modes (kernels now;
 * model prefill/decode later). ds4_bench_main.c parses the options common
 * to all modes into ds4_bench_opts and calls the selected mode.
 */
#ifndef DS4_BENCH_BENCH_H
#define DS4_BENCH_BENCH_H

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

#endif

/*
 * ds4_bench_main.c - ds4-bench: DwarfStar's benchmark program.
 *
 *   ds4-bench --kernels [--threads N] [--reps N] [--types q8_0,q2_K,...]
 *                       [--tables matvec,rate,prefill,moe]
 *   ds4-bench -m MODEL --prompt-file FILE [...]   (bench/bench_model.c)
 *
 * Modes are a table (name, help, function) so that later modes (model
 * prefill / decode) add a row; the options every mode shares are parsed
 * here into ds4_bench_opts.
 */
#include "include/ds4.h"
#include "bench/bench.h"
#include "bench/bench_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "util/version.h"

typedef struct {
    const char *flag;
    const char *help;
    int (*run)(const ds4_bench_opts *);
} bench_mode;

static const bench_mode modes[] = {
    {"--kernels", "CPU matvec GB/s per weight type vs the machine's copy bandwidth",
     ds4_bench_kernels},
};
#define N_MODES (sizeof(modes) / sizeof(modes[0]))

static void usage(FILE *f)
{
    fprintf(f, "usage: ds4-bench MODE [options]\nmodes:\n");
    for (size_t i = 0; i < N_MODES; i++) fprintf(f, "  %-12s %s\n", modes[i].flag, modes[i].help);
    fprintf(f, "options:\n"
               "  --threads N  threads (default: all online CPUs)\n"
               "  --reps N     timed repeats, the median is reported (default 9)\n"
               "  --types L    comma-separated weight types (default: all)\n"
               "  --tables L   --kernels tables: matvec,rate,prefill,moe (default: all)\n"
               "model mode (no MODE flag; prefill/decode tokens/s at context frontiers):\n"
               "  ds4-bench -m MODEL --prompt-file FILE [...]  (with --help: its options)\n");
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

int main(int argc, char **argv)
{
    if (ds4_version_requested(argc, argv)) { ds4_version_print(stdout, "ds4-bench"); return 0; }
    /* under mpirun: ranks other than 0 serve the pipeline here (docs/DISTRIBUTED.md) */
    int dist_rc;
    if (ds4_dist_init(&argc, argv, &dist_rc)) return dist_rc;
    ds4_bench_opts o = {.threads = 0, .reps = 9, .types = NULL, .tables = NULL};
    const bench_mode *mode = NULL;
    /* The model mode has antirez/ds4's flags and no mode flag: -m or --prompt-file selects it. */
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--prompt-file") || !strcmp(argv[i], "-m") || !strcmp(argv[i], "--model"))
            return ds4_bench_model_main(argc, argv);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        int found = 0;
        for (size_t m = 0; m < N_MODES; m++)
            if (!strcmp(a, modes[m].flag)) {
                mode = &modes[m];
                found = 1;
            }
        if (found) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--threads") && val) {
            if (parse_int(val, 0, 4096, &o.threads)) {
                fprintf(stderr, "ds4-bench: bad --threads value '%s'\n", val);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--reps") && val) {
            if (parse_int(val, 1, 1000, &o.reps)) {
                fprintf(stderr, "ds4-bench: bad --reps value '%s'\n", val);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--types") && val) {
            o.types = val;
            i++;
        } else if (!strcmp(a, "--tables") && val) {
            o.tables = val;
            i++;
        } else {
            fprintf(stderr, "ds4-bench: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!mode) {
        usage(stderr);
        return 2;
    }
    return mode->run(&o);
}

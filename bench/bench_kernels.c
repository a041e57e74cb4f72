/*
 * bench_kernels.c - `ds4-bench --kernels`: how close the CPU matvec comes
 * to the memory bandwidth of the machine.
 *
 * Decode is a sequence of matvecs whose weights do not fit in any cache, so
 * a matvec kernel is as good as the fraction of the memory bandwidth it
 * streams weights at. For each weight type and shape (rows x cols) this
 * times n_tok = 1 matvecs over enough distinct matrices, used in rotation,
 * that together they are several times the L3 (so weights come from DRAM),
 * and prints GB/s of weight bytes. In the same run it measures the copy
 * bandwidth: a multi-threaded memcpy of a 256 MiB (or larger) buffer,
 * counted as bytes read + bytes written (the STREAM "copy" convention, i.e.
 * the DRAM traffic).
 * Copy passes and matvec passes alternate (--reps pairs per row, after a
 * warm-up) and the ratio is the median of the per-pair ratios, so a busy or
 * drifting machine moves both sides of a ratio together.
 *
 * Two more tables give each kernel's own speed (one thread, data in L2):
 * the decode kernels at n_tok 1 and 4, and the prefill GEMM at n_tok 64,
 * each beside the per-row kernels of before the GEMM, measured in the same
 * run. A fourth (bench_moe.c) times one token's MoE sublayer in one region
 * against the op pair it replaces. `--tables` picks among them.
 *
 * It calls the backend directly (cpu_matmul.h): it measures the kernels,
 * not the engine.
 */
#include "backend/cpu/cpu_matmul_kernels.h"
#include "bench/bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- copy bandwidth ---------------------------------------------------- */

/* Two chunks per thread of at least 64 MiB each (256 MiB in all at the
 * least): glibc's memcpy switches to non-temporal stores above a few MiB,
 * so the copy moves 2 bytes of DRAM traffic per byte (no read-for-
 * ownership of the destination) and is as fast as a copy gets. */
#define COPY_MIN_CHUNK ((size_t)64 << 20)

struct copy_job {
    uint8_t *dst;
    const uint8_t *src;
    size_t bytes, chunk;
    int64_t chunks;
};

static void copy_task(void *arg, int64_t i, int ti)
{
    (void)ti;
    struct copy_job *j = arg;
    memcpy(j->dst + (size_t)i * j->chunk, j->src + (size_t)i * j->chunk, j->chunk);
}

/* One timed pass of the multi-threaded copy; GB/s (read + written). */
static double copy_pass(ds4_threadpool *pool, struct copy_job *j)
{
    double t0 = ds4_bench_now_s();
    ds4_pool_run(pool, j->chunks, copy_task, j);
    return 2.0 * (double)j->bytes / (ds4_bench_now_s() - t0) / 1e9;
}

static int copy_init(struct copy_job *j, int n_threads)
{
    j->chunks = 2 * (int64_t)n_threads;
    if (j->chunks < 4) j->chunks = 4;
    j->chunk = COPY_MIN_CHUNK;
    j->bytes = j->chunk * (size_t)j->chunks;
    j->dst = malloc(j->bytes);
    j->src = malloc(j->bytes);
    if (!j->dst || !j->src) return -1;
    memset(j->dst, 1, j->bytes);
    memset((void *)j->src, 2, j->bytes);
    return 0;
}

/* ---- matvec ------------------------------------------------------------ */

/* Pool of rotated matrices: at least this many bytes in all. */
#define ROTATION_BYTES ((size_t)320 << 20)

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) { return ds4_bench_xorshift(&rng_state); }

/* Random weight bytes with sane scales (no NaN/Inf/denormals, so the
 * timing is the kernel's ordinary path). */
static void fill_weights(ds4_type type, uint8_t *w, size_t bytes)
{
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        uint64_t r = rnd();
        memcpy(w + i, &r, 8);
    }
    size_t bb = ds4_cpu_block_bytes(type), nb = bytes / bb;
    for (size_t b = 0; b < nb; b++) {
        uint8_t *p = w + b * bb;
        uint16_t h = (uint16_t)(0x2000 | (rnd() & 0x3ff)), h2 = (uint16_t)(0x1c00 | (rnd() & 0x3ff));
        switch (type) {
        case DS4_TYPE_F32: {
            float f = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
            memcpy(p, &f, 4);
            break;
        }
        case DS4_TYPE_F16: h = (uint16_t)((rnd() & 0x83ff) | 0x3400); memcpy(p, &h, 2); break;
        case DS4_TYPE_BF16: h = (uint16_t)((rnd() & 0x807f) | 0x3e80); memcpy(p, &h, 2); break;
        case DS4_TYPE_Q8_0:
        case DS4_TYPE_Q4_K:
        case DS4_TYPE_IQ2_XXS: memcpy(p, &h, 2); if (type == DS4_TYPE_Q4_K) memcpy(p + 2, &h2, 2); break;
        case DS4_TYPE_Q2_K: memcpy(p + 80, &h, 2); memcpy(p + 82, &h2, 2); break;
        case DS4_TYPE_MXFP4: p[0] = (uint8_t)(120 + rnd() % 10); break;
        default: break;
        }
    }
}

static const struct {
    ds4_type type;
    const char *name;
} bench_types[] = {
    {DS4_TYPE_F32, "f32"},    {DS4_TYPE_F16, "f16"},       {DS4_TYPE_BF16, "bf16"},
    {DS4_TYPE_Q8_0, "q8_0"},  {DS4_TYPE_Q4_K, "q4_K"},     {DS4_TYPE_Q2_K, "q2_K"},
    {DS4_TYPE_IQ2_XXS, "iq2_xxs"}, {DS4_TYPE_MXFP4, "mxfp4"},
};
#define N_TYPES (sizeof(bench_types) / sizeof(bench_types[0]))

static int type_selected(const char *list, const char *name)
{
    if (!list) return 1;
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && !strncasecmp(p, name, n)) return 1;
        p += l + (e ? 1 : 0);
    }
    return 0;
}

typedef struct {
    double matvec_gbs, copy_gbs, ratio; /* medians */
    double old_gbs, new_old;            /* the per-row kernels of before the GEMM */
    int n_mats;
    double mib;
} kernel_result;

/* One matvec pass through all the matrices; GB/s of weights. */
static double matvec_pass(ds4_threadpool *pool, ds4_mm_path path, ds4_type type, const uint8_t *w,
                          size_t mat_bytes, int n_mats, int64_t rows, int64_t cols, const float *x, float *y)
{
    ds4_simd_level level = ds4_cpu_simd_best();
    double t0 = ds4_bench_now_s();
    for (int m = 0; m < n_mats; m++)
        ds4_cpu_matmul_path(level, path, pool, type, w + (size_t)m * mat_bytes, rows, cols, x, 1, y);
    return (double)mat_bytes * n_mats / (ds4_bench_now_s() - t0) / 1e9;
}

/* `reps` rounds of (one copy pass, one matvec pass through all matrices,
 * one more with the per-row kernels of before the GEMM), alternating, so
 * that all see the same machine (other processes, clock) and the ratios
 * are taken round by round. */
static int measure(ds4_threadpool *pool, struct copy_job *cj, ds4_type type, int64_t rows, int64_t cols,
                   int reps, kernel_result *res)
{
    size_t mat_bytes = (size_t)(cols / ds4_cpu_block_values(type)) * ds4_cpu_block_bytes(type) * (size_t)rows;
    int n_mats = (int)((ROTATION_BYTES + mat_bytes - 1) / mat_bytes);
    if (n_mats < 3) n_mats = 3;
    res->n_mats = n_mats;
    res->mib = mat_bytes / 1048576.0;
    uint8_t *w = malloc(mat_bytes * (size_t)n_mats);
    float *x = malloc(sizeof(float) * (size_t)cols), *y = malloc(sizeof(float) * (size_t)rows);
    double *mv = calloc((size_t)reps, sizeof(double)), *cp = calloc((size_t)reps, sizeof(double));
    double *ra = calloc((size_t)reps, sizeof(double)), *old = calloc((size_t)reps, sizeof(double));
    double *no = calloc((size_t)reps, sizeof(double));
    int rc = -1;
    if (w && x && y && mv && cp && ra && old && no) {
        fill_weights(type, w, mat_bytes * (size_t)n_mats);
        for (int64_t i = 0; i < cols; i++) x[i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
        /* warm-up, and touch every page */
        matvec_pass(pool, DS4_MM_AUTO, type, w, mat_bytes, n_mats, rows, cols, x, y);
        matvec_pass(pool, DS4_MM_TILES, type, w, mat_bytes, n_mats, rows, cols, x, y);
        for (int r = 0; r < reps; r++) {
            cp[r] = copy_pass(pool, cj);
            mv[r] = matvec_pass(pool, DS4_MM_AUTO, type, w, mat_bytes, n_mats, rows, cols, x, y);
            old[r] = matvec_pass(pool, DS4_MM_TILES, type, w, mat_bytes, n_mats, rows, cols, x, y);
            ra[r] = mv[r] / cp[r];
            no[r] = mv[r] / old[r];
        }
        res->matvec_gbs = median(mv, reps);
        res->copy_gbs = median(cp, reps);
        res->ratio = median(ra, reps);
        res->old_gbs = median(old, reps);
        res->new_old = median(no, reps);
        rc = 0;
    }
    free(w), free(x), free(y), free(mv), free(cp), free(ra), free(old), free(no);
    return rc;
}

/* ---- kernel compute rate ----------------------------------------------- */

static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Median thread-CPU seconds of one ds4_cpu_matmul_path call on one thread
 * (rows x 4096 weights, n_tok tokens), each repeat calling until min_s has
 * passed. -1 when the level cannot run here or memory is short. */
static size_t row_bytes_4096(ds4_type type)
{
    return (size_t)(4096 / ds4_cpu_block_values(type)) * ds4_cpu_block_bytes(type);
}

static double timed_call_s(ds4_simd_level level, ds4_mm_path path, ds4_type type, int64_t rows, int64_t n_tok,
                           int reps, double min_s)
{
    const int64_t cols = 4096;
    const size_t row_bytes = row_bytes_4096(type);
    uint8_t *w = malloc(row_bytes * (size_t)rows);
    float *x = malloc(sizeof(float) * (size_t)(cols * n_tok)), *y = malloc(sizeof(float) * (size_t)(rows * n_tok));
    double *t = calloc((size_t)reps, sizeof(double)), sec = -1;
    if (w && x && y && t && ds4_cpu_simd_supported(level)) {
        fill_weights(type, w, row_bytes * (size_t)rows);
        for (int64_t i = 0; i < cols * n_tok; i++) x[i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
        ds4_cpu_matmul_path(level, path, NULL, type, w, rows, cols, x, n_tok, y);
        for (int r = 0; r < reps; r++) {
            int calls = 0;
            double t0 = thread_cpu_s(), dt;
            do {
                ds4_cpu_matmul_path(level, path, NULL, type, w, rows, cols, x, n_tok, y);
                calls++;
            } while ((dt = thread_cpu_s() - t0) < min_s);
            t[r] = dt / calls;
        }
        sec = median(t, reps);
    }
    free(w), free(x), free(y), free(t);
    return sec;
}

/* GB/s of weight bytes one thread computes at with the matrix in its L2
 * (768 KiB; L2s are 1 MiB or more per core on AVX-512 parts), timed in
 * thread CPU time: the kernel's own speed, apart from DRAM and from other
 * processes. 0 when the level cannot run here. */
static double kernel_rate(ds4_simd_level level, ds4_mm_path path, ds4_type type, int64_t n_tok, int reps)
{
    const int64_t rows = (int64_t)((768u << 10) / row_bytes_4096(type));
    double sec = timed_call_s(level, path, type, rows, n_tok, reps, 0.01);
    return sec > 0 ? (double)row_bytes_4096(type) * rows / sec / 1e9 : 0;
}

static void print_kernel_rates(const ds4_bench_opts *o)
{
    printf("\nkernel compute rate: 1 thread, 768 KiB matrix (in L2), 4096 columns, thread CPU time;\n"
           "GB/s of weight bytes per pass (a pass covers n_tok tokens); new = the kernels in use\n"
           "(for the GEMM types the fused kernels, which compute the GEMM's numbers), old = the\n"
           "per-row kernels of before the GEMM (DS4_CPU_GEMM=0)\n\n");
    printf("| type    | scalar n_tok=1 | avx2 old 1 | avx2 new 1 | avx512 old 1 | avx512 new 1 | avx512 old 4 | avx512 new 4 |\n");
    printf("| ------- | -------------- | ---------- | ---------- | ------------ | ------------ | ------------ | ------------ |\n");
    for (size_t k = 0; k < N_TYPES; k++) {
        if (!type_selected(o->types, bench_types[k].name)) continue;
        ds4_type ty = bench_types[k].type;
        printf("| %-7s | %14.2f | %10.2f | %10.2f | %12.2f | %12.2f | %12.2f | %12.2f |\n", bench_types[k].name,
               kernel_rate(DS4_SIMD_SCALAR, DS4_MM_TILES, ty, 1, o->reps < 3 ? o->reps : 3),
               kernel_rate(DS4_SIMD_AVX2, DS4_MM_TILES, ty, 1, o->reps),
               kernel_rate(DS4_SIMD_AVX2, DS4_MM_AUTO, ty, 1, o->reps),
               kernel_rate(DS4_SIMD_AVX512, DS4_MM_TILES, ty, 1, o->reps),
               kernel_rate(DS4_SIMD_AVX512, DS4_MM_AUTO, ty, 1, o->reps),
               kernel_rate(DS4_SIMD_AVX512, DS4_MM_TILES, ty, 4, o->reps),
               kernel_rate(DS4_SIMD_AVX512, DS4_MM_AUTO, ty, 4, o->reps));
        fflush(stdout);
    }
}

/* GMAC/s of one thread on a prefill-shaped product (PREFILL_ROWS x 4096
 * weights, n_tok tokens per call, thread CPU time), through the given
 * path: the per-row tile kernels or the GEMM (activation conversion and
 * packing included). 0 when the level cannot run here. */
#define PREFILL_ROWS 512
#define PREFILL_TOK 64

static double prefill_rate(ds4_simd_level level, ds4_mm_path path, ds4_type type, int64_t n_tok, int reps)
{
    double sec = timed_call_s(level, path, type, PREFILL_ROWS, n_tok, reps, 0.02);
    return sec > 0 ? (double)PREFILL_ROWS * 4096 * n_tok / sec / 1e9 : 0;
}

static void print_prefill_rates(const ds4_bench_opts *o)
{
    printf("\nprefill compute rate: 1 thread, %d x 4096 weights, n_tok = %d per call, thread CPU time;\n"
           "GMAC/s (weights x tokens per second), activation conversion and packing included;\n"
           "tiles = the per-row kernels over tiles of %d tokens (the path before the GEMM,\n"
           "DS4_CPU_GEMM=0), gemm = the GEMM (packed weights)\n\n",
           PREFILL_ROWS, PREFILL_TOK, DS4_TILE_TOK);
    printf("| type    | avx2 tiles | avx2 gemm | gemm/tiles | avx512 tiles | avx512 gemm | gemm/tiles |\n");
    printf("| ------- | ---------- | --------- | ---------- | ------------ | ----------- | ---------- |\n");
    for (size_t k = 0; k < N_TYPES; k++) {
        if (!type_selected(o->types, bench_types[k].name)) continue;
        ds4_type ty = bench_types[k].type;
        double r[4];
        for (int l = 0; l < 2; l++) {
            ds4_simd_level lv = l ? DS4_SIMD_AVX512 : DS4_SIMD_AVX2;
            r[2 * l] = prefill_rate(lv, DS4_MM_TILES, ty, PREFILL_TOK, o->reps);
            r[2 * l + 1] = prefill_rate(lv, DS4_MM_GEMM, ty, PREFILL_TOK, o->reps);
        }
        printf("| %-7s | %10.2f | %9.2f | %9.2fx | %12.2f | %11.2f | %9.2fx |\n", bench_types[k].name, r[0], r[1],
               r[0] > 0 ? r[1] / r[0] : 0.0, r[2], r[3], r[2] > 0 ? r[3] / r[2] : 0.0);
        fflush(stdout);
    }
}

/* The matvec-vs-copy table (all threads). */
static void print_matvec_table(const ds4_bench_opts *o, ds4_threadpool *pool, struct copy_job *cj)
{
    copy_pass(pool, cj); /* warm-up: fault the pages in */
    double *c = calloc((size_t)o->reps, sizeof(double));
    for (int r = 0; c && r < o->reps; r++) c[r] = copy_pass(pool, cj);
    double copy = c ? median(c, o->reps) : 0;
    free(c);
    printf("copy bandwidth (memcpy of %zu MiB in %lld chunks, bytes read + written): %.1f GB/s\n",
           cj->bytes >> 20, (long long)cj->chunks, copy);
    printf("each row: copy, matvec and old matvec passes alternate; ratios = medians of the per-round\n"
           "ratios; old = the per-row kernels of before the GEMM (DS4_CPU_GEMM=0)\n\n");
    printf("| type    | rows x cols | MiB/matrix | matrices | matvec GB/s | copy GB/s | matvec/copy | old GB/s | new/old |\n");
    printf("| ------- | ----------- | ---------- | -------- | ----------- | --------- | ----------- | -------- | ------- |\n");
    fflush(stdout);
    const int64_t shapes[2][2] = {{4096, 4096}, {2048, 4096}};
    for (size_t k = 0; k < N_TYPES; k++) {
        if (!type_selected(o->types, bench_types[k].name)) continue;
        for (int s = 0; s < 2; s++) {
            kernel_result r;
            if (measure(pool, cj, bench_types[k].type, shapes[s][0], shapes[s][1], o->reps, &r)) {
                printf("| %-7s | %4lld x %4lld | out of memory |\n", bench_types[k].name,
                       (long long)shapes[s][0], (long long)shapes[s][1]);
                continue;
            }
            printf("| %-7s | %4lld x %4lld | %10.2f | %8d | %11.1f | %9.1f | %10.0f%% | %8.1f | %6.2fx |\n",
                   bench_types[k].name, (long long)shapes[s][0], (long long)shapes[s][1], r.mib, r.n_mats,
                   r.matvec_gbs, r.copy_gbs, 100.0 * r.ratio, r.old_gbs, r.new_old);
            fflush(stdout);
        }
    }
}

int ds4_bench_kernels(const ds4_bench_opts *o)
{
    int any = 0;
    for (size_t k = 0; k < N_TYPES; k++) any |= type_selected(o->types, bench_types[k].name);
    if (!any) {
        fprintf(stderr, "ds4-bench: no known type in --types '%s'\n", o->types);
        return 1;
    }
    int t_matvec = type_selected(o->tables, "matvec"), t_rate = type_selected(o->tables, "rate"),
        t_prefill = type_selected(o->tables, "prefill"), t_moe = type_selected(o->tables, "moe");
    if (!t_matvec && !t_rate && !t_prefill && !t_moe) {
        fprintf(stderr, "ds4-bench: no known table in --tables '%s' (matvec, rate, prefill, moe)\n", o->tables);
        return 1;
    }
    ds4_threadpool *pool = ds4_pool_create(o->threads);
    if (!pool) {
        fprintf(stderr, "ds4-bench: cannot create a pool of %d threads\n", o->threads);
        return 1;
    }
    int nt = ds4_pool_size(pool);
    struct copy_job cj = {0};
    if (t_matvec && copy_init(&cj, nt)) {
        fprintf(stderr, "ds4-bench: out of memory for the copy buffers\n");
        free(cj.dst), free((void *)cj.src);
        ds4_pool_destroy(pool);
        return 1;
    }
    FILE *la = fopen("/proc/loadavg", "r");
    char load[64] = "?";
    if (la) {
        if (!fgets(load, sizeof(load), la)) strcpy(load, "?");
        fclose(la);
        load[strcspn(load, " ")] = 0; /* the 1-minute figure */
    }
    printf("ds4-bench --kernels: %d threads, kernels %s, medians of %d repeats\n", nt,
           ds4_cpu_simd_name(ds4_cpu_simd_best()), o->reps);
    printf("load average before the run: %s (other processes skew the figures)\n", load);
    if (t_matvec) print_matvec_table(o, pool, &cj);
    free(cj.dst), free((void *)cj.src);
    ds4_pool_destroy(pool);
    if (t_rate) print_kernel_rates(o);
    if (t_prefill) print_prefill_rates(o);
    if (t_moe) return ds4_bench_moe_table(o);
    return 0;
}

/*
 * ds4_gpubench_main.c - `ds4-gpubench`: bandwidth of the CUDA weight
 * kernels on realistic DeepSeek V4 Flash shapes.
 *
 * Decode is bound by how fast the weights stream from device memory, so
 * each kernel is reported as weight bytes per second and as a fraction of
 * the device-to-device copy bandwidth measured in the same run (the copy
 * counts bytes read + written, the usual "copy bandwidth"). Every matrix
 * is replicated into enough copies (>= 1 GiB in all) that the 60 MB L2
 * cannot serve repeated calls; calls rotate over the copies. Weights are
 * real ggml blocks (rows of the tests/data/quants fixtures), so the
 * kernels decode the same bit patterns as in a real model.
 *
 *   ds4-gpubench [--device N] [--quick]
 *   ds4-gpubench --model FILE.gguf [--device N] [--prefill N] [--decode N] [--chunk N]
 *   ds4-gpubench --l2probe [--device N]
 *
 * The first form benchmarks the kernels (run from the repository root: it
 * reads tests/data/quants). The second runs a whole model on the CUDA
 * backend through the public session API: prefill tokens/s (in chunks
 * of --chunk tokens, 128 unless given; the library's default is 512), decode
 * tokens/s (each step includes the logits download), the weight bytes a
 * decode step reads (every tensor except the embedding table, whose one
 * row is negligible, with routed experts counted n_used / n_expert), and
 * that traffic per second as a fraction of the copy bandwidth. The third
 * asks whether weights can wait in L2 (cuda_l2_probe.cu says why): for
 * buffers of 8-48 MB, the microseconds of one read by all SMs after each
 * way of bringing the buffer into L2, and after 26 MB of other weights (a
 * decode layer's six routed experts) streamed past it, as CSV lines
 * `l2probe,MB,setaside,case,us,GB/s` against the cold read of the same run.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "include/ds4.h"
#include "util/version.h"

#include <time.h>

#if DS4_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#include "gguf/gguf.h"

static ds4_cuda *cu;
static double g_copy_gbs;
static int g_quick;

#define CHECK(call)                                                               \
    do {                                                                          \
        if ((call) != DS4_OK) {                                                   \
            fprintf(stderr, "ds4-gpubench: %s: %s\n", #call, ds4_last_error());  \
            exit(1);                                                              \
        }                                                                         \
    } while (0)

static void *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    void *b = malloc((size_t)n);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* The 8 quantized rows of a fixture (see tests/data/quants/README.md). */
static uint8_t *fixture_rows(const char *name, int64_t cols, int64_t *row_bytes)
{
    char path[256];
    size_t len;
    snprintf(path, sizeof path, "tests/data/quants/%s-n%lld-%s.bin", name, (long long)cols,
             strcmp(name, "iq2_xxs") == 0 ? "imatrix" : "plain");
    uint8_t *b = read_all(path, &len);
    if (!b) {
        fprintf(stderr, "ds4-gpubench: cannot read %s (run from the repository root)\n", path);
        exit(1);
    }
    uint32_t h[7];
    memcpy(h, b + 4, sizeof h);
    int64_t n = h[1], rows = h[2];
    *row_bytes = h[3];
    size_t off = 28 + 4 * (size_t)(rows * n) + (h[4] ? 4 * (size_t)n : 0);
    uint8_t *q = malloc((size_t)(rows * *row_bytes));
    memcpy(q, b + off, (size_t)(rows * *row_bytes));
    free(b);
    return q;
}

typedef struct {
    void **copies;
    int n_copies;
    size_t bytes;
} dev_matrix;

static const char *type_name(ds4_type t)
{
    switch (t) {
    case DS4_TYPE_Q8_0: return "q8_0";
    case DS4_TYPE_Q2_K: return "q2_K";
    case DS4_TYPE_Q4_K: return "q4_K";
    case DS4_TYPE_IQ2_XXS: return "iq2_xxs";
    case DS4_TYPE_MXFP4: return "mxfp4";
    case DS4_TYPE_F16: return "f16";
    case DS4_TYPE_BF16: return "bf16";
    case DS4_TYPE_F32: return "f32";
    default: return "?";
    }
}

/* rows x cols of `type` (n_mat matrices back to back), replicated into
 * copies totalling at least 1 GiB. */
static dev_matrix upload_matrix(ds4_type type, int64_t rows, int64_t cols, int64_t n_mat)
{
    dev_matrix m;
    int64_t rb = (int64_t)ds4_cuda_row_bytes(type, cols);
    m.bytes = (size_t)(rows * rb * n_mat);
    uint8_t *h = malloc(m.bytes);
    if (type == DS4_TYPE_F32) {
        uint64_t s = 1;
        for (size_t i = 0; i < m.bytes / 4; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            ((float *)h)[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
        }
    } else {
        int64_t frb;
        uint8_t *q = fixture_rows(type_name(type), cols, &frb);
        for (int64_t r = 0; r < rows * n_mat; r++)
            memcpy(h + r * rb, q + ((r * 5 + r / 8) % 8) * frb, (size_t)rb);
        free(q);
    }
    size_t target = (size_t)1 << 30;
    m.n_copies = (int)((target + m.bytes - 1) / m.bytes);
    if (m.n_copies < 2) m.n_copies = 2;
    m.copies = calloc((size_t)m.n_copies, sizeof(void *));
    for (int i = 0; i < m.n_copies; i++) {
        CHECK(ds4_cuda_malloc(cu, m.bytes, &m.copies[i]));
        if (i == 0) CHECK(ds4_cuda_upload_weight(cu, m.copies[0], h, m.bytes, type, cols)); /* the kernels' layout */
        else CHECK(ds4_cuda_copy_d2d(cu, m.copies[i], m.copies[0], m.bytes));
    }
    CHECK(ds4_cuda_sync(cu));
    free(h);
    return m;
}

static void free_matrix(dev_matrix *m)
{
    for (int i = 0; i < m->n_copies; i++) ds4_cuda_free(cu, m->copies[i]);
    free(m->copies);
}

static float *dev_rand(int64_t n)
{
    float *h = malloc(sizeof(float) * (size_t)n), *d;
    uint64_t s = 42;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    CHECK(ds4_cuda_malloc(cu, sizeof(float) * (size_t)n, (void **)&d));
    CHECK(ds4_cuda_upload(cu, d, h, sizeof(float) * (size_t)n));
    free(h);
    return d;
}

static int iters_for(size_t bytes_per_call)
{
    double target = g_quick ? 4e9 : 40e9; /* bytes streamed per measurement */
    int n = (int)(target / (double)bytes_per_call);
    return n < 10 ? 10 : n > 5000 ? 5000 : n;
}

static void measure_copy(void)
{
    size_t bytes = (size_t)2 << 30;
    void *a, *b;
    CHECK(ds4_cuda_malloc(cu, bytes, &a));
    CHECK(ds4_cuda_malloc(cu, bytes, &b));
    for (int i = 0; i < 3; i++) CHECK(ds4_cuda_copy_d2d(cu, b, a, bytes));
    int n = g_quick ? 5 : 20;
    double ms;
    CHECK(ds4_cuda_timer_start(cu));
    for (int i = 0; i < n; i++) CHECK(ds4_cuda_copy_d2d(cu, i & 1 ? a : b, i & 1 ? b : a, bytes));
    CHECK(ds4_cuda_timer_stop(cu, &ms));
    g_copy_gbs = 2.0 * (double)bytes * n / (ms * 1e-3) / 1e9;
    printf("copy bandwidth (device to device, read + write): %.0f GB/s  [%d x %zu MiB]\n\n",
           g_copy_gbs, n, bytes >> 20);
    ds4_cuda_free(cu, a);
    ds4_cuda_free(cu, b);
}

static void l2probe_line(size_t mb, const char *mode, const char *what, double us, double cold_us)
{
    if (us <= 0) return;
    printf("l2probe,%zu,%s,%s,%.2f,%.0f,%.2f\n", mb, mode, what, us, (double)(mb << 20) / (us * 1e-6) / 1e9,
           cold_us / us);
}

static void l2probe_times(size_t mb, const char *mode, const ds4_cuda_l2probe_times *t, int bulk)
{
    l2probe_line(mb, mode, "cold", t->cold_us, t->cold_us);
    l2probe_line(mb, mode, "warm", t->warm_us, t->cold_us);
    l2probe_line(mb, mode, "warm_last", t->warm_last_us, t->cold_us);
    l2probe_line(mb, mode, "warm_last+other_first", t->warm_last_then_other_first_us, t->cold_us);
    l2probe_line(mb, mode, "warm+other", t->warm_then_other_us, t->cold_us);
    if (bulk) l2probe_line(mb, mode, "bulk", t->bulk_us, t->cold_us);
    if (bulk) l2probe_line(mb, mode, "bulk_last", t->bulk_last_us, t->cold_us);
    if (bulk) l2probe_line(mb, mode, "bulk_last+other_first", t->bulk_last_then_other_first_us, t->cold_us);
    l2probe_line(mb, mode, "cold_after_last", t->cold_after_last_us, t->cold_us);
}

/* --l2probe: each size's cases, each the median of 5 runs of the probe */
static int bench_l2probe(void)
{
    static const size_t sizes_mb[] = {8, 16, 24, 32, 40, 48};
    enum { REPS = 5 };
    printf("l2probe,MB,setaside,case,us,GB/s,cold/this\n");
    for (size_t k = 0; k < sizeof sizes_mb / sizeof sizes_mb[0]; k++) {
        ds4_cuda_l2probe r[REPS];
        for (int i = 0; i < REPS; i++)
            if (ds4_cuda_l2_probe(cu, sizes_mb[k] << 20, (size_t)26 << 20, (size_t)48 << 20, &r[i]) != DS4_OK) {
                fprintf(stderr, "ds4-gpubench: %s\n", ds4_last_error());
                return 1;
            }
        if (k == 0)
            printf("# L2 %zu MB, set aside for persisting lines in the second half: %zu MB\n", r[0].l2_bytes >> 20,
                   r[0].persist_bytes >> 20);
        /* the median of each case over the runs */
        ds4_cuda_l2probe_times med[2];
        for (int m = 0; m < 2; m++) {
            enum { NF = sizeof(ds4_cuda_l2probe_times) / sizeof(double) };
            for (int f = 0; f < NF; f++) {
                double v[REPS];
                for (int i = 0; i < REPS; i++) v[i] = ((const double *)(m ? &r[i].persist : &r[i].plain))[f];
                for (int a = 1; a < REPS; a++)
                    for (int b = a; b > 0 && v[b] < v[b - 1]; b--) {
                        const double t = v[b];
                        v[b] = v[b - 1], v[b - 1] = t;
                    }
                ((double *)&med[m])[f] = v[REPS / 2];
            }
        }
        int persist_all = 1; /* the set-aside pass in every run, or its lines are left out */
        for (int i = 0; i < REPS; i++) persist_all &= r[i].persist_bytes > 0;
        l2probe_times(sizes_mb[k], "none", &med[0], r[0].bulk);
        if (persist_all) l2probe_times(sizes_mb[k], "persist", &med[1], r[0].bulk);
    }
    return 0;
}

static void report(const char *what, ds4_type type, int64_t rows, int64_t cols, int64_t n_tok,
                   size_t bytes, double us)
{
    double gbs = (double)bytes / (us * 1e-6) / 1e9;
    printf("%-22s %-8s %7lld x %-5lld tok %3lld %9.1f MB %9.1f us %7.0f GB/s %5.1f%%\n", what,
           type_name(type), (long long)rows, (long long)cols, (long long)n_tok, (double)bytes / 1e6,
           us, gbs, 100.0 * gbs / g_copy_gbs);
}

static void bench_matvec(const char *what, ds4_type type, int64_t rows, int64_t cols,
                         const int64_t *toks, int n_toks)
{
    dev_matrix m = upload_matrix(type, rows, cols, 1);
    float *x = dev_rand(16 * cols), *y;
    CHECK(ds4_cuda_malloc(cu, sizeof(float) * (size_t)(16 * rows), (void **)&y));
    for (int k = 0; k < n_toks; k++) {
        int64_t nt = toks[k];
        for (int i = 0; i < m.n_copies; i++)
            CHECK(ds4_cuda_matvec(cu, type, m.copies[i], rows, cols, x, nt, y));
        int n = iters_for(m.bytes);
        double ms;
        CHECK(ds4_cuda_timer_start(cu));
        for (int i = 0; i < n; i++)
            CHECK(ds4_cuda_matvec(cu, type, m.copies[i % m.n_copies], rows, cols, x, nt, y));
        CHECK(ds4_cuda_timer_stop(cu, &ms));
        report(what, type, rows, cols, nt, m.bytes, ms * 1e3 / n);
    }
    ds4_cuda_free(cu, x);
    ds4_cuda_free(cu, y);
    free_matrix(&m);
}

/* Routed MoE: n_expert experts resident, 6 used per token, random ids
 * (a fresh set per call, precomputed on the device). */
static void bench_moe(const char *what, ds4_type type, int64_t n_expert, int64_t rows, int64_t cols,
                      int64_t x_share)
{
    const int n_used = 6, n_sets = 64;
    dev_matrix m = upload_matrix(type, rows, cols, n_expert);
    int32_t ids[64 * 6];
    uint64_t s = 7;
    for (int k = 0; k < n_sets; k++)
        for (int j = 0; j < n_used; j++) {
            int32_t e;
            int dup;
            do {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                e = (int32_t)((s >> 33) % (uint64_t)n_expert);
                dup = 0;
                for (int q = 0; q < j; q++) dup |= ids[k * n_used + q] == e;
            } while (dup);
            ids[k * n_used + j] = e;
        }
    int32_t *d_ids;
    CHECK(ds4_cuda_malloc(cu, sizeof ids, (void **)&d_ids));
    CHECK(ds4_cuda_upload(cu, d_ids, ids, sizeof ids));
    float *x = dev_rand(n_used * cols), *y;
    CHECK(ds4_cuda_malloc(cu, sizeof(float) * (size_t)(n_used * rows), (void **)&y));
    size_t expert_bytes = m.bytes / (size_t)n_expert, per_call = expert_bytes * (size_t)n_used;
    int n = iters_for(per_call);
    double ms;
    for (int i = 0; i < 10; i++)
        CHECK(ds4_cuda_moe_matvec(cu, type, m.copies[0], n_expert, rows, cols, d_ids, n_used,
                                  x_share, x, y));
    CHECK(ds4_cuda_timer_start(cu));
    for (int i = 0; i < n; i++)
        CHECK(ds4_cuda_moe_matvec(cu, type, m.copies[i % m.n_copies], n_expert, rows, cols,
                                  d_ids + (i % n_sets) * n_used, n_used, x_share, x, y));
    CHECK(ds4_cuda_timer_stop(cu, &ms));
    report(what, type, rows, cols, 1, per_call, ms * 1e3 / n);
    ds4_cuda_free(cu, d_ids);
    ds4_cuda_free(cu, x);
    ds4_cuda_free(cu, y);
    free_matrix(&m);
}

static void bench_gemm(ds4_type type, int64_t rows, int64_t cols, int64_t n_tok)
{
    dev_matrix m = upload_matrix(type, rows, cols, 1);
    float *x = dev_rand(n_tok * cols), *y;
    CHECK(ds4_cuda_malloc(cu, sizeof(float) * (size_t)(n_tok * rows), (void **)&y));
    for (int prec = 0; prec < 2; prec++) {
        ds4_cuda_set_gemm_precision(cu, prec ? DS4_CUDA_GEMM_F32 : DS4_CUDA_GEMM_BF16);
        for (int i = 0; i < 3; i++) CHECK(ds4_cuda_gemm(cu, type, m.copies[i % m.n_copies], rows, cols, x, n_tok, y));
        int n = g_quick ? 5 : 20;
        double ms;
        CHECK(ds4_cuda_timer_start(cu));
        for (int i = 0; i < n; i++)
            CHECK(ds4_cuda_gemm(cu, type, m.copies[i % m.n_copies], rows, cols, x, n_tok, y));
        CHECK(ds4_cuda_timer_stop(cu, &ms));
        double us = ms * 1e3 / n;
        printf("gemm %-4s %-8s %6lld x %-5lld tok %5lld %9.1f us %8.1f TFLOP/s %9.0f tok/s\n",
               prec ? "f32" : "bf16", type_name(type), (long long)rows, (long long)cols,
               (long long)n_tok, us, 2.0 * rows * cols * n_tok / (us * 1e-6) / 1e12,
               n_tok / (us * 1e-6));
    }
    ds4_cuda_set_gemm_precision(cu, DS4_CUDA_GEMM_BF16);
    ds4_cuda_free(cu, x);
    ds4_cuda_free(cu, y);
    free_matrix(&m);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Weight bytes one decode step reads, from the GGUF's tensor table. */
static double decode_weight_bytes(const char *path, double *total)
{
    ds4_gguf *g = ds4_gguf_open(path);
    if (!g) {
        fprintf(stderr, "ds4-gpubench: %s\n", ds4_last_error());
        exit(1);
    }
    uint64_t n_expert = 0, n_used = 0;
    ds4_gguf_get_uint(g, "deepseek4.expert_count", &n_expert);
    ds4_gguf_get_uint(g, "deepseek4.expert_used_count", &n_used);
    double b = 0;
    *total = 0;
    for (int64_t i = 0; i < ds4_gguf_n_tensors(g); i++) {
        const ds4_gguf_tensor *t = ds4_gguf_tensor_at(g, i);
        *total += (double)t->size;
        if (strstr(t->name, "token_embd")) continue;
        if (strstr(t->name, "_exps") && n_expert > 0) b += (double)t->size * (double)n_used / (double)n_expert;
        else b += (double)t->size;
    }
    printf("model %s: %.2f GiB of tensors, %llu experts (%llu used)\n", path, *total / 1073741824.0,
           (unsigned long long)n_expert, (unsigned long long)n_used);
    ds4_gguf_close(g);
    return b;
}

static int bench_model(const char *path, int device, int n_prefill, int n_decode, int chunk)
{
    double total = 0, per_tok = decode_weight_bytes(path, &total);
    double t0 = now_s();
    ds4_model *m = ds4_model_open(path, NULL);
    if (!m) {
        fprintf(stderr, "ds4-gpubench: %s\n", ds4_last_error());
        return 1;
    }
    ds4_session_params p;
    ds4_session_params_default(&p);
    p.backend = DS4_BACKEND_CUDA;
    p.gpu_device = device;
    p.n_ctx = n_prefill + n_decode + 8;
    p.max_chunk = chunk;
    p.numerics = DS4_NUMERICS_OFFICIAL;
    ds4_session *s = ds4_session_create(m, &p);
    if (!s) {
        fprintf(stderr, "ds4-gpubench: session: %s\n", ds4_last_error());
        return 1;
    }
    double t1 = now_s();
    printf("load + upload to the GPU: %.1f s\n", t1 - t0);
    int V = ds4_model_n_vocab(m);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(n_prefill + n_decode));
    uint64_t r = 12345;
    for (int i = 0; i < n_prefill + n_decode; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((r >> 33) % (uint64_t)(V > 1000 ? 1000 : V)) + 100 % V;
    }
    /* warm-up: a short prefill, then reset */
    if (ds4_session_prefill(s, tok, 8, NULL) != DS4_OK) {
        fprintf(stderr, "ds4-gpubench: prefill: %s\n", ds4_last_error());
        return 1;
    }
    ds4_session_reset(s);
    double a = now_s();
    if (ds4_session_prefill(s, tok, n_prefill, NULL) != DS4_OK) {
        fprintf(stderr, "ds4-gpubench: prefill: %s\n", ds4_last_error());
        return 1;
    }
    double b = now_s();
    for (int i = 0; i < n_decode; i++)
        if (ds4_session_decode(s, tok[n_prefill + i]) != DS4_OK) {
            fprintf(stderr, "ds4-gpubench: decode: %s\n", ds4_last_error());
            return 1;
        }
    double c = now_s();
    const float *lg = ds4_session_logits(s);
    int finite = 1;
    for (int i = 0; i < V; i++) finite &= isfinite(lg[i]);
    double dec_tps = n_decode / (c - b), bw = per_tok * dec_tps;
    printf("prefill %d tokens: %.3f s, %.1f tokens/s\n", n_prefill, b - a, n_prefill / (b - a));
    printf("decode %d tokens: %.3f s, %.2f tokens/s, %.2f ms/token (logits finite: %s)\n", n_decode, c - b, dec_tps,
           1e3 / dec_tps, finite ? "yes" : "NO");
    printf("weights read per decoded token: %.1f MB -> %.0f GB/s = %.1f%% of the copy bandwidth (%.0f GB/s)\n",
           per_tok / 1e6, bw / 1e9, 100.0 * bw / (g_copy_gbs * 1e9), g_copy_gbs);
    ds4_session_free(s);
    ds4_model_close(m);
    free(tok);
    return 0;
}

int main(int argc, char **argv)
{
    if (ds4_version_requested(argc, argv)) { ds4_version_print(stdout, "ds4-gpubench"); return 0; }
    int device = 0, n_prefill = 512, n_decode = 64, chunk = 128;
    const char *model = NULL;
    int l2probe = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) device = atoi(argv[++i]);
        else if (strcmp(argv[i], "--quick") == 0) g_quick = 1;
        else if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) model = argv[++i];
        else if (strcmp(argv[i], "--prefill") == 0 && i + 1 < argc) n_prefill = atoi(argv[++i]);
        else if (strcmp(argv[i], "--chunk") == 0 && i + 1 < argc) chunk = atoi(argv[++i]);
        else if (strcmp(argv[i], "--decode") == 0 && i + 1 < argc) n_decode = atoi(argv[++i]);
        else if (strcmp(argv[i], "--l2probe") == 0) l2probe = 1;
        else {
            fprintf(stderr, "usage: ds4-gpubench [--device N] [--quick]\n"
                            "       ds4-gpubench --model FILE.gguf [--device N] [--prefill N] [--decode N] [--chunk N]\n"
                            "       ds4-gpubench --l2probe [--device N]\n");
            return 2;
        }
    }
    if (n_prefill < 8 || n_decode < 1 || chunk < 1) {
        fprintf(stderr, "ds4-gpubench: --prefill >= 8, --decode >= 1 and --chunk >= 1\n");
        return 2;
    }
    if (ds4_cuda_open(device, &cu) != DS4_OK) {
        fprintf(stderr, "ds4-gpubench: %s\n", ds4_last_error());
        return 1;
    }
    printf("ds4-gpubench on %s\n", ds4_cuda_device_desc(cu));
    g_quick = g_quick || model != NULL || l2probe;
    measure_copy();
    if (l2probe) {
        const int rc = bench_l2probe();
        ds4_cuda_close(cu);
        return rc;
    }
    if (model) {
        ds4_cuda_close(cu);
        return bench_model(model, device, n_prefill, n_decode, chunk);
    }
    printf("%-22s %-8s %15s %7s %12s %12s %12s %6s\n", "kernel", "type", "rows x cols", "", "weights",
           "time/call", "weights/s", "%copy");
    static const int64_t one[] = {1}, batch[] = {1, 2, 4, 8, 16};
    bench_matvec("attn 4096x4096", DS4_TYPE_Q8_0, 4096, 4096, batch, 5);
    bench_matvec("lm head", DS4_TYPE_Q8_0, 129280, 4096, one, 1);
    bench_matvec("expert gate/up", DS4_TYPE_IQ2_XXS, 2048, 4096, batch, 5);
    bench_matvec("expert down", DS4_TYPE_IQ2_XXS, 4096, 2048, one, 1);
    bench_matvec("expert gate/up", DS4_TYPE_Q2_K, 2048, 4096, batch, 5);
    bench_matvec("expert down", DS4_TYPE_Q2_K, 4096, 2048, one, 1);
    bench_matvec("expert gate/up", DS4_TYPE_Q4_K, 2048, 4096, one, 1);
    bench_matvec("expert gate/up", DS4_TYPE_MXFP4, 2048, 4096, one, 1);
    bench_matvec("dense 4096x4096", DS4_TYPE_F16, 4096, 4096, one, 1);
    bench_matvec("dense 4096x4096", DS4_TYPE_BF16, 4096, 4096, one, 1);
    bench_matvec("dense 4096x4096", DS4_TYPE_F32, 4096, 4096, one, 1);
    bench_moe("moe 6/64 gate/up", DS4_TYPE_IQ2_XXS, 64, 2048, 4096, 6);
    bench_moe("moe 6/64 down", DS4_TYPE_Q2_K, 64, 4096, 2048, 1);
    printf("\n");
    bench_gemm(DS4_TYPE_Q8_0, 4096, 4096, 512);
    bench_gemm(DS4_TYPE_IQ2_XXS, 2048, 4096, 512);
    ds4_cuda_close(cu);
    return 0;
}
#else
int main(int argc, char **argv)
{
    if (ds4_version_requested(argc, argv)) { ds4_version_print(stdout, "ds4-gpubench"); return 0; }
    fprintf(stderr, "ds4-gpubench: built without CUDA (no nvcc found at build time)\n");
    return 1;
}
#endif

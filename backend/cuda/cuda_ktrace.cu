/*
 * cuda_ktrace.cu - in-graph kernel times (DS4_CUDA_KTIME=1; the device
 * side is ds4_kt_stamp_slot and ds4_kt_stamp_time in cuda_internal.cuh).
 *
 * While a decode step is recorded, the launch helpers note each kernel and
 * its launch shape in launch order; the recorded graph runs them in that
 * order on one stream. Before each replay the stamp counter is cleared;
 * before the next one the stamps come back, each is matched to the next
 * unused noted launch of its shape (ds4_cuda_ktime_match_replay: a launch
 * whose kernel does not stamp is passed over; a stamp that matches none
 * within 32 launches counts as unmatched), and the difference to the
 * following stamp is added to that launch's total. Kernels forked onto a side stream (DS4_CUDA_SIDE,
 * DS4_CUDA_MOE_AHEAD) interleave their stamps with the main stream's:
 * turn those off to time each kernel. With them on, each launch's stream
 * is noted too, and a second total takes the time to the next stamp of
 * the same stream: the main stream's kernels then add up to the step
 * with the side kernels beside them, each kernel's share including what
 * the side kernels cost it (SMs, bandwidth, a join's wait), to be read
 * against the same kernels' times in one stream. At the backend's end,
 * stderr gets the table: the kernels' mean times a step, summed by kernel
 * name (and with several streams, the main stream's by the same-stream
 * times), and the first layer's sequence. The step's last kernel has no
 * successor in the step and is left out.
 */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_ktrace.h"

#include <cxxabi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { KT_SETTERS = 256 };

static void (*g_setters[KT_SETTERS])(unsigned long long *);
static int g_n_setters;
static int g_on = -1;
static int g_print; /* DS4_CUDA_KTIME=1: the table at the backend's end; =2: collect only */
static int g_recording;
static const void *g_kernels[DS4_KT_CAP];
static unsigned long long g_shapes[DS4_KT_CAP];
static unsigned char g_lanes[DS4_KT_CAP]; /* each launch's stream, numbered as first seen */
static const void *g_lane_streams[DS4_KT_LANES];
static int g_n_lanes;
static double g_lane_ns[DS4_KT_CAP];
static int g_n_kernels;
static unsigned long long *g_dev;
static unsigned long long *g_host;
static double g_sum_ns[DS4_KT_CAP];
static long g_steps, g_unmatched, g_unstamped;
static double g_span_ns;
static unsigned long long g_count_min = ~0ull, g_count_max;
static bool g_pending;
/* the phases' totals (ds4_kt_phase), over replays whose window held only
 * the replay's stamps (a prefill between two replays also marks phases) */
static double g_ph_ns[DS4_KT_SITES][DS4_KT_PHASES];
static double g_ph_n[DS4_KT_SITES][DS4_KT_PHASES];
static long g_ph_kept, g_ph_dropped;
enum { KT_WORDS = DS4_KT_PH + 2 * DS4_KT_SITES * DS4_KT_PHASES };

/* What each site's phases end with (NULL: no such phase); the times are
 * from the picked thread's dependency wait to the phase's end. */
static const char *const kt_phase_names[DS4_KT_SITES][DS4_KT_PHASES] = {
    /* DS4_KT_HCC */
    {"streams read (and hc_post)", "partial dots in the block", "first cluster exchange", "cluster sums read",
     "collapse", "norm exchange", "stores issued", "last cluster barrier"},
    /* DS4_KT_HCC_SERVICE */
    {"first cluster exchange", "coefficients in shared memory", "post and Sinkhorn stored", "last cluster barrier"},
    /* DS4_KT_ATTN_SPLIT */
    {"first rows in", "rows walked", "partials stored"},
    /* DS4_KT_ATTN_COMBINE */
    {"chunk maxima folded", "weights folded", "output stored"},
    /* DS4_KT_G1 */
    {"activation quantized", "block 0's units done"},
    /* DS4_KT_G2 */
    {"activations quantized", "block 0's units done"},
    /* DS4_KT_ROUTER (block 0's thread 0, then the last block's) */
    {"block 0's row stored", "last block's ticket seen", "experts picked and stored"},
};
static const char *const kt_site_names[DS4_KT_SITES] = {
    "hyper-connection site", "its service warp", "attention split", "attention combine", "routed gate+up",
    "routed down", "router",
};

void ds4_kt_register(void (*set)(unsigned long long *))
{
    if (g_n_setters < KT_SETTERS) g_setters[g_n_setters++] = set;
}

bool ds4_kt_on(void)
{
    if (g_on < 0) {
        const char *e = getenv("DS4_CUDA_KTIME");
        g_on = e && (e[0] == '1' || e[0] == '2');
        g_print = e && e[0] == '1';
    }
    return g_on == 1;
}

extern "C" void ds4_cuda_ktime_totals(ds4_cuda_ktime *out)
{
    memset(out, 0, sizeof *out);
    if (!ds4_kt_on()) return;
    out->kernels = g_n_kernels;
    out->replays = g_steps;
    out->unmatched = g_unmatched;
    out->unstamped = g_unstamped;
    out->us_per_step = g_steps ? g_span_ns / (double)g_steps / 1e3 : 0.0;
}

extern "C" double ds4_cuda_ktime_phase(int site, int k, double *marks_per_replay)
{
    const bool any = ds4_kt_on() && site >= 0 && site < DS4_KT_SITES && k >= 0 && k < DS4_KT_PHASES &&
                     g_ph_kept > 0 && g_ph_n[site][k] > 0;
    if (marks_per_replay) *marks_per_replay = any ? g_ph_n[site][k] / (double)g_ph_kept : 0.0;
    return any ? g_ph_ns[site][k] / g_ph_n[site][k] / 1e3 : 0.0;
}

void ds4_kt_note_launch(const void *kernel, unsigned long long shape, const void *stream)
{
    if (g_recording && g_n_kernels < DS4_KT_CAP) {
        int lane = 0;
        while (lane < g_n_lanes && g_lane_streams[lane] != stream) lane++;
        if (lane == g_n_lanes) {
            if (g_n_lanes < DS4_KT_LANES) g_lane_streams[g_n_lanes++] = stream;
            else lane = DS4_KT_LANES - 1;
        }
        g_kernels[g_n_kernels] = kernel;
        g_lanes[g_n_kernels] = (unsigned char)lane;
        g_shapes[g_n_kernels++] = shape;
    }
}

void ds4_kt_record_begin(void)
{
    if (!ds4_kt_on()) return;
    g_n_kernels = 0;
    g_n_lanes = 0;
    g_recording = 1;
    memset(g_sum_ns, 0, sizeof g_sum_ns);
    memset(g_lane_ns, 0, sizeof g_lane_ns);
    g_steps = g_unmatched = g_unstamped = 0;
    g_span_ns = 0;
    g_count_min = ~0ull;
    g_count_max = 0;
    g_pending = false;
    memset(g_ph_ns, 0, sizeof g_ph_ns);
    memset(g_ph_n, 0, sizeof g_ph_n);
    g_ph_kept = g_ph_dropped = 0;
}

void ds4_kt_record_end(void) { g_recording = 0; }

extern "C" void ds4_cuda_ktime_match_replay(const unsigned long long *stamps, unsigned long long n,
                                            const unsigned long long *shapes, int nk, double *sum_ns,
                                            unsigned char *used, const unsigned char *lanes, double *lane_ns,
                                            ds4_cuda_ktime_match *out)
{
    enum { W = 32 };
    memset(out, 0, sizeof *out);
    if (nk > 0) memset(used, 0, (size_t)nk);
    int j = 0, prev = -1;
    unsigned long long t_prev = 0, t_min = ~0ull, t_max = 0;
    int lane_prev[DS4_KT_LANES]; /* per stream: the launch of its last matched stamp, and that stamp's time */
    unsigned long long lane_t[DS4_KT_LANES] = {};
    for (int l = 0; l < DS4_KT_LANES; l++) lane_prev[l] = -1;
    for (unsigned long long i = 0; i < n; i++) {
        const unsigned long long t = stamps[2 * i], sh = stamps[2 * i + 1];
        int at = -1;
        for (int k = j; k < nk && k < j + W && at < 0; k++)
            if (!used[k] && shapes[k] == sh) at = k;
        for (int k = j - 1; k >= 0 && k >= j - W && at < 0; k--)
            if (!used[k] && shapes[k] == sh) at = k;
        if (at >= 0) {
            used[at] = 1;
            if (at >= j) j = at + 1;
        } else {
            out->unmatched++;
        }
        if (i > 0 && prev >= 0) sum_ns[prev] += t > t_prev ? (double)(t - t_prev) : 0.0;
        if (lanes && lane_ns && at >= 0) {
            const int l = lanes[at] < DS4_KT_LANES ? lanes[at] : DS4_KT_LANES - 1;
            if (lane_prev[l] >= 0) lane_ns[lane_prev[l]] += t > lane_t[l] ? (double)(t - lane_t[l]) : 0.0;
            lane_prev[l] = at;
            lane_t[l] = t;
        }
        prev = at;
        t_prev = t;
        t_min = t < t_min ? t : t_min;
        t_max = t > t_max ? t : t_max;
    }
    for (int k = 0; k < nk; k++) out->unstamped += !used[k];
    out->span_ns = n > 0 ? (double)(t_max - t_min) : 0.0;
}

/* One replay's n stamps into the launches' totals. */
static void kt_add(unsigned long long n)
{
    static unsigned char used[DS4_KT_CAP];
    ds4_cuda_ktime_match m;
    ds4_cuda_ktime_match_replay(g_host + 1, n, g_shapes, g_n_kernels, g_sum_ns, used, g_lanes, g_lane_ns, &m);
    g_unmatched += m.unmatched;
    g_unstamped += m.unstamped;
    g_span_ns += m.span_ns;
}

/* The previous replay's stamps into the totals (it has finished: the
 * caller read its logits), then a cleared counter for this one. */
void ds4_kt_before_replay(cudaStream_t stream)
{
    if (!ds4_kt_on() || g_n_kernels < 2) return;
    const size_t words = KT_WORDS, ph_bytes = sizeof(unsigned long long) * (KT_WORDS - DS4_KT_PH);
    if (!g_dev) {
        g_host = (unsigned long long *)malloc(sizeof(unsigned long long) * words);
        if (!g_host || cudaMalloc((void **)&g_dev, sizeof(unsigned long long) * words) != cudaSuccess ||
            cudaMemset(g_dev, 0, sizeof(unsigned long long) * words) != cudaSuccess) {
            (void)cudaGetLastError();
            g_on = 0;
            return;
        }
        for (int i = 0; i < g_n_setters; i++) g_setters[i](g_dev);
    }
    if (g_pending && cudaStreamSynchronize(stream) == cudaSuccess &&
        cudaMemcpy(g_host, g_dev, sizeof(unsigned long long), cudaMemcpyDeviceToHost) == cudaSuccess) {
        const unsigned long long cap = DS4_KT_CAP, n = g_host[0] < cap ? g_host[0] : cap;
        if (cudaMemcpy(g_host + 1, g_dev + 1, sizeof(unsigned long long) * 2 * n, cudaMemcpyDeviceToHost) ==
            cudaSuccess) {
            if (g_host[0] < g_count_min) g_count_min = g_host[0];
            if (g_host[0] > g_count_max) g_count_max = g_host[0];
            kt_add(n);
            g_steps++;
            /* the phases, where nothing but the replay ran since the last clear */
            if (g_host[0] <= 2 * (unsigned long long)g_n_kernels &&
                cudaMemcpy(g_host + DS4_KT_PH, g_dev + DS4_KT_PH, ph_bytes, cudaMemcpyDeviceToHost) == cudaSuccess) {
                for (int i = 0; i < DS4_KT_SITES; i++)
                    for (int k = 0; k < DS4_KT_PHASES; k++) {
                        g_ph_ns[i][k] += (double)g_host[DS4_KT_PH + 2 * (i * DS4_KT_PHASES + k)];
                        g_ph_n[i][k] += (double)g_host[DS4_KT_PH + 2 * (i * DS4_KT_PHASES + k) + 1];
                    }
                g_ph_kept++;
            } else {
                g_ph_dropped++;
            }
        }
    }
    (void)cudaMemsetAsync(g_dev, 0, sizeof(unsigned long long), stream);
    (void)cudaMemsetAsync(g_dev + DS4_KT_PH, 0, ph_bytes, stream);
    g_pending = true;
}

static const char *kt_name(const void *k, char *buf, size_t n)
{
    const char *name = NULL;
    if (cudaFuncGetName(&name, k) != cudaSuccess || !name) {
        (void)cudaGetLastError();
        snprintf(buf, n, "kernel %p", k);
        return buf;
    }
    int st = 0;
    char *dem = abi::__cxa_demangle(name, NULL, NULL, &st);
    snprintf(buf, n, "%s", st == 0 && dem ? dem : name);
    free(dem);
    char *paren = strchr(buf, '('); /* the template arguments say enough */
    if (paren) *paren = 0;
    return buf;
}

/* A kernel's line of the table. */
struct kt_row {
    const void *kernel;
    double us;
    int calls;
};

static int kt_row_cmp(const void *a, const void *b)
{
    const double x = ((const kt_row *)a)->us, y = ((const kt_row *)b)->us;
    return x < y ? 1 : x > y ? -1 : 0;
}

void ds4_kt_report(void)
{
    if (!ds4_kt_on() || !g_print || g_n_kernels < 2) return;
    fprintf(stderr, "ktime: %d kernels a recorded step, %ld replays timed, %llu-%llu stamps a replay\n", g_n_kernels,
            g_steps, g_steps ? g_count_min : 0ull, g_count_max);
    if (g_steps == 0) return;
    fprintf(stderr, "ktime: a replay: %.1f launches without a stamp, %.1f stamps matching no launch, %.1f us from "
            "the first stamp to the last\n",
            (double)g_unstamped / (double)g_steps, (double)g_unmatched / (double)g_steps,
            g_span_ns / (double)g_steps / 1e3);
    if ((double)g_unmatched / (double)g_steps > 0.01 * g_n_kernels)
        fprintf(stderr, "ktime: many stamps matched no launch: kernels forked onto side streams stamp out of launch "
                        "order; DS4_CUDA_SIDE=0 DS4_CUDA_MOE_AHEAD=0 time each kernel by itself\n");
    /* by kernel: its total a step and its launches a step, largest first */
    static kt_row rows[DS4_KT_CAP];
    int n = 0;
    double all = 0;
    for (int i = 0; i + 1 < g_n_kernels; i++) {
        int j = 0;
        while (j < n && rows[j].kernel != g_kernels[i]) j++;
        if (j == n) rows[n++] = kt_row{g_kernels[i], 0.0, 0};
        const double us = g_sum_ns[i] / (double)g_steps / 1e3;
        rows[j].us += us;
        rows[j].calls++;
        all += us;
    }
    qsort(rows, (size_t)n, sizeof rows[0], kt_row_cmp);
    fprintf(stderr, "ktime: %.1f us a step in the kernels' times (to the next stamp)\n", all);
    fprintf(stderr, "ktime: %-64s %6s %9s %9s %6s\n", "kernel", "calls", "us/call", "total us", "share");
    for (int k = 0; k < n; k++) {
        char buf[96];
        fprintf(stderr, "ktime: %-64s %6d %9.2f %9.1f %5.1f%%\n", kt_name(rows[k].kernel, buf, sizeof buf),
                rows[k].calls, rows[k].us / rows[k].calls, rows[k].us, 100.0 * rows[k].us / all);
    }
    /* several streams: the main stream's kernels (the step's first
     * launch's stream) by their times to the main stream's next stamp,
     * which add up to the step; each other stream's total likewise */
    if (g_n_lanes > 1) {
        double lane_all[DS4_KT_LANES] = {}, main_all = 0;
        int lane_calls[DS4_KT_LANES] = {}, lane_last[DS4_KT_LANES];
        /* a stream's last launch has no successor in it: left out, as the
         * step's last is from the table above */
        for (int l = 0; l < DS4_KT_LANES; l++) lane_last[l] = -1;
        for (int i = 0; i < g_n_kernels; i++) lane_last[g_lanes[i]] = i;
        n = 0;
        for (int i = 0; i < g_n_kernels; i++) {
            if (i == lane_last[g_lanes[i]]) continue;
            const double us = g_lane_ns[i] / (double)g_steps / 1e3;
            lane_all[g_lanes[i]] += us;
            lane_calls[g_lanes[i]]++;
            if (g_lanes[i] != 0) continue;
            int j = 0;
            while (j < n && rows[j].kernel != g_kernels[i]) j++;
            if (j == n) rows[n++] = kt_row{g_kernels[i], 0.0, 0};
            rows[j].us += us;
            rows[j].calls++;
            main_all += us;
        }
        for (int l = 0; l < g_n_lanes; l++)
            fprintf(stderr, "ktime stream %d: %d launches a step, %.1f us in their times to the same stream's next "
                    "stamp%s\n", l, lane_calls[l], lane_all[l], l == 0 ? " (the main stream)" : "");
        qsort(rows, (size_t)n, sizeof rows[0], kt_row_cmp);
        fprintf(stderr, "ktime main: %-59s %6s %9s %9s %6s\n", "kernel (main stream, to its next stamp)", "calls",
                "us/call", "total us", "share");
        for (int k = 0; k < n; k++) {
            char buf[96];
            fprintf(stderr, "ktime main: %-59s %6d %9.2f %9.1f %5.1f%%\n", kt_name(rows[k].kernel, buf, sizeof buf),
                    rows[k].calls, rows[k].us / rows[k].calls, rows[k].us, main_all > 0 ? 100.0 * rows[k].us / main_all : 0.0);
        }
    }
    /* the phases of the kernels that mark them: mean time from the wait */
    for (int i = 0; i < DS4_KT_SITES && g_ph_kept > 0; i++)
        for (int k = 0; k < DS4_KT_PHASES; k++)
            if (g_ph_n[i][k] > 0 && kt_phase_names[i][k])
                fprintf(stderr, "ktime phase %-22s %d %-32s %8.2f us after the wait (%.1f marks a replay)\n",
                        kt_site_names[i], k, kt_phase_names[i][k], g_ph_ns[i][k] / g_ph_n[i][k] / 1e3,
                        g_ph_n[i][k] / (double)g_ph_kept);
    if (g_ph_dropped) fprintf(stderr, "ktime phase: %ld replay windows left out (other launches in them)\n", g_ph_dropped);
    /* the step's sequence: its first 80 kernels (the first layers) one by one */
    const int show = g_n_kernels - 1 < 80 ? g_n_kernels - 1 : 80;
    for (int i = 0; i < show; i++) {
        char buf[96];
        if (g_n_lanes > 1) /* with its stream and the time to that stream's next stamp */
            fprintf(stderr, "ktime seq %4d %-64s %8.2f  stream %d %8.2f\n", i, kt_name(g_kernels[i], buf, sizeof buf),
                    g_sum_ns[i] / (double)g_steps / 1e3, g_lanes[i], g_lane_ns[i] / (double)g_steps / 1e3);
        else
            fprintf(stderr, "ktime seq %4d %-64s %8.2f\n", i, kt_name(g_kernels[i], buf, sizeof buf),
                    g_sum_ns[i] / (double)g_steps / 1e3);
    }
}

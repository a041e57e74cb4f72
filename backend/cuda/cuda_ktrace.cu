/*
 * cuda_ktrace.cu - in-graph kernel times (DS4_CUDA_KTIME=1; the device
 * side is ds4_kt_stamp in cuda_internal.cuh).
 *
 * While a decode step is recorded, the launch helpers note each kernel in
 * launch order; the recorded graph runs them in that order on one stream.
 * Before each replay the stamp counter is cleared; before the next one the
 * stamps come back and stamp i - stamp (i - 1) is added to kernel i - 1's
 * total (when the count matches the recording: kernels forked onto a side
 * stream, DS4_CUDA_SIDE, interleave their stamps; turn it off to time
 * them). At the backend's end, stderr gets the table: per kernel of the
 * step its mean time, summed by kernel name. The step's last kernel has no
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
static int g_recording;
static const void *g_kernels[DS4_KT_CAP];
static int g_n_kernels;
static unsigned long long *g_dev;
static unsigned long long *g_host;
static double g_sum_ns[DS4_KT_CAP];
static long g_steps, g_mismatch;
static bool g_pending;

void ds4_kt_register(void (*set)(unsigned long long *))
{
    if (g_n_setters < KT_SETTERS) g_setters[g_n_setters++] = set;
}

bool ds4_kt_on(void)
{
    if (g_on < 0) {
        const char *e = getenv("DS4_CUDA_KTIME");
        g_on = e && e[0] == '1';
    }
    return g_on == 1;
}

void ds4_kt_note_launch(const void *kernel)
{
    if (g_recording && g_n_kernels < DS4_KT_CAP) g_kernels[g_n_kernels++] = kernel;
}

void ds4_kt_record_begin(void)
{
    if (!ds4_kt_on()) return;
    g_n_kernels = 0;
    g_recording = 1;
    memset(g_sum_ns, 0, sizeof g_sum_ns);
    g_steps = 0;
    g_pending = false;
}

void ds4_kt_record_end(void) { g_recording = 0; }

/* The previous replay's stamps into the totals (it has finished: the
 * caller read its logits), then a cleared counter for this one. */
void ds4_kt_before_replay(cudaStream_t stream)
{
    if (!ds4_kt_on() || g_n_kernels < 2) return;
    if (!g_dev) {
        if (cudaMalloc((void **)&g_dev, sizeof(unsigned long long) * (1 + DS4_KT_CAP)) != cudaSuccess) {
            (void)cudaGetLastError();
            g_on = 0;
            return;
        }
        g_host = (unsigned long long *)malloc(sizeof(unsigned long long) * (1 + DS4_KT_CAP));
        for (int i = 0; i < g_n_setters; i++) g_setters[i](g_dev);
    }
    if (g_pending && cudaStreamSynchronize(stream) == cudaSuccess &&
        cudaMemcpy(g_host, g_dev, sizeof(unsigned long long) * (1 + (size_t)g_n_kernels), cudaMemcpyDeviceToHost) ==
            cudaSuccess) {
        if (g_host[0] == (unsigned long long)g_n_kernels) {
            for (int i = 1; i < g_n_kernels; i++) g_sum_ns[i - 1] += (double)(g_host[1 + i] - g_host[i]);
            g_steps++;
        } else {
            g_mismatch++;
        }
    }
    (void)cudaMemsetAsync(g_dev, 0, sizeof(unsigned long long), stream);
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

void ds4_kt_report(void)
{
    if (!ds4_kt_on() || g_n_kernels < 2) return;
    fprintf(stderr, "ktime: %d kernels a recorded step, %ld replays timed, %ld with another stamp count\n",
            g_n_kernels, g_steps, g_mismatch);
    if (g_steps == 0) return;
    /* by kernel name: total a step and launches a step */
    static char names[DS4_KT_CAP][96];
    static double tot[DS4_KT_CAP];
    static int calls[DS4_KT_CAP];
    int n = 0;
    double all = 0;
    for (int i = 0; i + 1 < g_n_kernels; i++) {
        char buf[96];
        kt_name(g_kernels[i], buf, sizeof buf);
        int j = 0;
        while (j < n && strcmp(names[j], buf) != 0) j++;
        if (j == n) {
            snprintf(names[n], sizeof names[n], "%s", buf);
            tot[n] = 0;
            calls[n] = 0;
            n++;
        }
        const double us = g_sum_ns[i] / (double)g_steps / 1e3;
        tot[j] += us;
        calls[j]++;
        all += us;
    }
    fprintf(stderr, "ktime: %.1f us a step between the first kernel's stamp and the last one's\n", all);
    fprintf(stderr, "ktime: %-64s %6s %9s %9s %6s\n", "kernel", "calls", "us/call", "total us", "share");
    for (int k = 0; k < n; k++) {
        int best = k;
        for (int j = k + 1; j < n; j++)
            if (tot[j] > tot[best]) best = j;
        char tn[96];
        memcpy(tn, names[k], sizeof tn);
        memcpy(names[k], names[best], sizeof tn);
        memcpy(names[best], tn, sizeof tn);
        const double t = tot[k];
        tot[k] = tot[best];
        tot[best] = t;
        const int c = calls[k];
        calls[k] = calls[best];
        calls[best] = c;
        fprintf(stderr, "ktime: %-64s %6d %9.2f %9.1f %5.1f%%\n", names[k], calls[k], tot[k] / calls[k], tot[k],
                100.0 * tot[k] / all);
    }
    /* the step's sequence: the first layer's kernels one by one */
    const int show = g_n_kernels - 1 < 80 ? g_n_kernels - 1 : 80;
    for (int i = 0; i < show; i++) {
        char buf[96];
        fprintf(stderr, "ktime seq %4d %-64s %8.2f\n", i, kt_name(g_kernels[i], buf, sizeof buf),
                g_sum_ns[i] / (double)g_steps / 1e3);
    }
}

/*
 * cli_stream_options.c - parsing of the expert streaming flags
 * (cli_stream_options.h).
 */
#include "cli/cli_stream_options.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static char g_err[256];

static const char *bad(const char *flag, const char *v, const char *why)
{
    snprintf(g_err, sizeof g_err, "invalid value for %s: '%s' (%s)", flag, v, why);
    return g_err;
}

/* "N" experts or "N GB"/"NGiB"/"NG" (GiB, fractions allowed). */
static const char *parse_cache(int64_t *experts, uint64_t *bytes, const char *flag, const char *v)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || errno || !isfinite(x) || v[0] == '-' || v[0] == '+' || v[0] == ' ')
        return bad(flag, v, "expected a number of experts or a size like 8GB");
    while (*end == ' ') end++;
    if (*end) {
        if (strcasecmp(end, "GB") && strcasecmp(end, "GiB") && strcasecmp(end, "G"))
            return bad(flag, v, "the only unit is GB (GiB)");
        double b = x * 1073741824.0;
        if (b < 1.0) return bad(flag, v, "the budget must be above 0");
        if (b > 1.8e19) return bad(flag, v, "too large");
        *bytes = (uint64_t)b;
        *experts = 0;
        return NULL;
    }
    if (x != floor(x) || x > 9e15) return bad(flag, v, "a count of experts is a whole number");
    if (x < 1) return bad(flag, v, "the cache must hold at least 1 expert");
    *experts = (int64_t)x;
    *bytes = 0;
    return NULL;
}

int ds4_cli_stream_option(ds4_model_options *o, int argc, char **argv, int *i, const char **err)
{
    const char *a = argv[*i];
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    bool takes = !strcmp(a, "--ssd-streaming-cache-experts") || !strcmp(a, "--ssd-streaming-preload-experts") ||
                 !strcmp(a, "--ssd-streaming-hotlist") || !strcmp(a, "--ssd-streaming-evict") ||
                 !strcmp(a, "--expert-profile") || !strcmp(a, "--gpu-expert-cache") ||
                 !strcmp(a, "--tensor-parallel") || !strcmp(a, "--gpu-devices") || !strcmp(a, "--numa");
    if (!strcmp(a, "--ssd-streaming")) {
        o->ssd_streaming = 1;
        return 1;
    }
    if (!strcmp(a, "--warm-weights")) {
        o->warm_weights = 1;
        return 1;
    }
    if (!strcmp(a, "--ssd-streaming-cold")) {
        o->cold = 1;
        return 1;
    }
    if (!takes) return 0;
    if (!v) {
        snprintf(g_err, sizeof g_err, "%s needs a value", a);
        *err = g_err;
        return -1;
    }
    (*i)++;
    *err = NULL;
    if (!strcmp(a, "--ssd-streaming-cache-experts")) {
        *err = parse_cache(&o->cache_experts, &o->cache_bytes, a, v);
    } else if (!strcmp(a, "--gpu-expert-cache")) {
        *err = parse_cache(&o->gpu_cache_experts, &o->gpu_cache_bytes, a, v);
    } else if (!strcmp(a, "--ssd-streaming-preload-experts")) {
        char *end;
        errno = 0;
        long long n = strtoll(v, &end, 10);
        if (!*v || *end || errno || n < 0) *err = bad(a, v, "expected a count of experts, 0 for none");
        else if (n == 0) o->cold = 1;
        else o->preload_experts = n;
    } else if (!strcmp(a, "--tensor-parallel")) {
        char *end;
        errno = 0;
        long n = strtol(v, &end, 10);
        if (!*v || *end || errno || n < 1 || n > 64) *err = bad(a, v, "expected a rank count 1..64");
        else o->tensor_parallel = (int)n;
    } else if (!strcmp(a, "--gpu-devices")) {
        o->gpu_devices = v; /* checked against the rank count when the model opens */
    } else if (!strcmp(a, "--numa")) {
        if (!strcmp(v, "off")) o->numa = DS4_NUMA_OFF;
        else if (!strcmp(v, "interleave")) o->numa = DS4_NUMA_INTERLEAVE;
        else *err = bad(a, v, "off or interleave");
    } else if (!strcmp(a, "--ssd-streaming-hotlist")) {
        o->hotlist_path = v;
    } else if (!strcmp(a, "--ssd-streaming-evict")) {
        if (!strcmp(v, "lru")) o->evict = DS4_EXPERT_EVICT_LRU;
        else if (!strcmp(v, "freq")) o->evict = DS4_EXPERT_EVICT_FREQ;
        else *err = bad(a, v, "lru or freq");
    } else {
        o->expert_profile = v;
    }
    return *err ? -1 : 1;
}

const char *ds4_cli_stream_check(const ds4_model_options *o)
{
    if (o->gpu_devices && o->tensor_parallel < 2) return "--gpu-devices lists the ranks' GPUs: it needs --tensor-parallel N (N >= 2)";
    if (o->tensor_parallel > 1 && (o->ssd_streaming || o->gpu_cache_experts || o->gpu_cache_bytes))
        return "--tensor-parallel splits the experts over the ranks: not with --ssd-streaming or --gpu-expert-cache";
    const bool gpu = o->gpu_cache_experts || o->gpu_cache_bytes;
    if (o->ssd_streaming && gpu)
        return "--gpu-expert-cache and --ssd-streaming exclude each other (CUDA vs CPU streaming)";
    if (o->ssd_streaming && o->warm_weights) return "--warm-weights reads the whole file; not with --ssd-streaming";
    if (o->ssd_streaming) return NULL;
    if (o->cache_experts || o->cache_bytes)
        return "--ssd-streaming-cache-experts needs --ssd-streaming (the GPU cache's size is --gpu-expert-cache)";
    if (gpu) return NULL; /* the GPU cache takes the preload, hot list and eviction flags too */
    if (o->preload_experts || o->cold) return "--ssd-streaming-preload-experts/--ssd-streaming-cold need --ssd-streaming";
    if (o->hotlist_path) return "--ssd-streaming-hotlist needs --ssd-streaming";
    if (o->evict) return "--ssd-streaming-evict needs --ssd-streaming or --gpu-expert-cache";
    return NULL;
}

void ds4_cli_stream_help(FILE *f)
{
    fputs("Expert streaming (models larger than memory; docs/STREAMING.md):\n"
          "  --ssd-streaming         Keep only the routed experts in use in memory, read\n"
          "                          from the file on demand; output is unchanged. CPU.\n"
          "  --ssd-streaming-cache-experts N|NGB\n"
          "                          Cache size: N experts or N GiB. Default: what fits\n"
          "                          in free memory.\n"
          "  --ssd-streaming-preload-experts N\n"
          "                          Hot-list experts read at start (0 = none). Default:\n"
          "                          up to 4 GiB and half the cache.\n"
          "  --ssd-streaming-cold    Start with an empty cache.\n"
          "  --ssd-streaming-hotlist FILE\n"
          "                          Preload this hot list instead of the built-in one.\n"
          "  --ssd-streaming-evict lru|freq\n"
          "                          Eviction policy. Default: freq.\n"
          "  --expert-profile FILE   Count expert selections into FILE (merged with it).\n"
          "  --gpu-expert-cache N|NGB\n"
          "                          CUDA: keep only N routed experts (or N GiB of them)\n"
          "                          in GPU memory, copied from host memory on use;\n"
          "                          output is unchanged. Takes --ssd-streaming-evict,\n"
          "                          -hotlist, -preload-experts, -cold (start: the\n"
          "                          built-in hot list, up to half the cache).\n"
          "  --warm-weights          Read every page of the weights at start, so the\n"
          "                          first prefill pays no page faults (not with\n"
          "                          --ssd-streaming).\n"
          "  --numa off|interleave   interleave: spread the weights' pages (and later\n"
          "                          allocations) over every NUMA node with memory, so\n"
          "                          decode reads from all sockets at once. Default off.\n"
          "Tensor parallel (docs/TENSOR-PARALLEL.md):\n"
          "  --tensor-parallel N     Split every layer over N ranks in this process\n"
          "                          (heads, experts, vocabulary; all-reduced). CPU\n"
          "                          backend: N in-process ranks sharing the threads.\n"
          "  --gpu-devices LIST      CUDA devices of the ranks, e.g. 0,1 (one per rank).\n",
          f);
}

/*
 * gpu_expert_cache.c - sizing and attaching the VRAM expert cache
 * (gpu_expert_cache.h).
 */
#include "engine/gpu_expert_cache.h"

#include "backend/expert_slots.h"
#include "engine/expert_stream.h"
#include "util/error.h"

#include <stdio.h>
#include <stdlib.h>

/* Bytes of one expert (gate + up + down) of layer 0. */
static uint64_t expert_bytes(const dsv4_model *m)
{
    const dsv4_layer *L = &m->layers[0];
    const ds4_weight *w[3] = {&L->gate_exps, &L->up_exps, &L->down_exps};
    uint64_t b = 0;
    for (int i = 0; i < 3; i++) b += w[i]->nbytes / (uint64_t)(w[i]->ne[2] > 0 ? w[i]->ne[2] : 1);
    return b;
}

/* "12.34 GiB", or MiB below one GiB (small test models) */
static const char *fmt_size(char *buf, size_t n, double bytes)
{
    if (bytes >= 1073741824.0) snprintf(buf, n, "%.2f GiB", bytes / 1073741824.0);
    else snprintf(buf, n, "%.2f MiB", bytes / 1048576.0);
    return buf;
}

ds4_status ds4_gpu_expert_slots(const dsv4_model *m, const ds4_model_options *o, int64_t *slots)
{
    *slots = 0;
    if (o->gpu_cache_experts == 0 && o->gpu_cache_bytes == 0) return DS4_OK;
    const dsv4_config *c = &m->cfg;
    if (o->gpu_cache_experts < 0)
        return ds4_fail(DS4_ERR_INVALID, "gpu expert cache: %lld experts (give at least %d)",
                        (long long)o->gpu_cache_experts, c->n_expert_used);
    if (o->ssd_streaming)
        return ds4_fail(DS4_ERR_INVALID,
                        "gpu expert cache: not with ssd streaming (that one keeps the experts in host memory for "
                        "the CPU backend)");
    if (o->cache_experts || o->cache_bytes)
        return ds4_fail(DS4_ERR_INVALID,
                        "gpu expert cache: a cache size for ssd streaming was given too (the GPU cache's size is "
                        "gpu_cache_experts / gpu_cache_bytes)");
    const uint64_t eb = expert_bytes(m), total = (uint64_t)c->n_layer * (uint64_t)c->n_expert;
    const uint64_t n = o->gpu_cache_experts > 0 ? (uint64_t)o->gpu_cache_experts : o->gpu_cache_bytes / eb;
    const double mib = (double)eb / 1048576.0;
    if (n == 0)
        return ds4_fail(DS4_ERR_INVALID,
                        "gpu expert cache: %llu bytes hold no expert (one takes %.2f MiB); give at least %d experts",
                        (unsigned long long)o->gpu_cache_bytes, mib, c->n_expert_used);
    if (n < (uint64_t)c->n_expert_used)
        return ds4_fail(DS4_ERR_INVALID,
                        "gpu expert cache: %llu experts (%.2f MiB) is under one token's %d experts of a layer; give at "
                        "least %d",
                        (unsigned long long)n, (double)n * mib, c->n_expert_used, c->n_expert_used);
    if (n > total)
        return ds4_fail(DS4_ERR_INVALID,
                        "gpu expert cache: %llu experts (%.2f GiB) is more than the model's %llu routed experts (%d "
                        "layers x %d, %.2f GiB)",
                        (unsigned long long)n, (double)n * mib / 1024.0, (unsigned long long)total, c->n_layer,
                        c->n_expert, (double)total * mib / 1024.0);
    if (o->evict != DS4_EXPERT_EVICT_DEFAULT && o->evict != DS4_EXPERT_EVICT_LRU && o->evict != DS4_EXPERT_EVICT_FREQ)
        return ds4_fail(DS4_ERR_INVALID, "gpu expert cache: unknown eviction policy %d", (int)o->evict);
    if (n == total) return DS4_OK; /* everything fits: plain full residency, nothing can miss */
    if (n < 2 * (uint64_t)c->n_layer * (uint64_t)c->n_expert_used) {
        char a[32], b[32];
        fprintf(stderr,
                "ds4: warning: the gpu expert cache (%llu experts, %s) is under twice one token's routed working set "
                "(2 x %d layers x %d experts = %s): most expert uses will wait for a copy\n",
                (unsigned long long)n, fmt_size(a, sizeof a, (double)n * (double)eb), c->n_layer, c->n_expert_used,
                fmt_size(b, sizeof b, 2.0 * c->n_layer * c->n_expert_used * (double)eb));
    }
    *slots = (int64_t)n;
    return DS4_OK;
}

ds4_status ds4_gpu_expert_preload(const dsv4_model *m, const ds4_model_options *o, int64_t slots, int32_t **pairs,
                                  int64_t *n)
{
    *pairs = NULL;
    *n = 0;
    ds4_expert_hotlist h;
    uint64_t k;
    ds4_status st = ds4_expert_stream_hotlist(m, o, (uint64_t)slots, expert_bytes(m), UINT64_MAX, &h, &k);
    if (st != DS4_OK) return st;
    if (k == 0) {
        ds4_expert_hotlist_free(&h);
        return DS4_OK;
    }
    *pairs = h.pairs; /* the list's first k pairs; the rest is unused */
    *n = (int64_t)k;
    return DS4_OK;
}

ds4_status ds4_gpu_expert_cache_attach(const dsv4_model *m, ds4_backend *be, int64_t slots, ds4_expert_evict evict,
                                       const int32_t *pairs, int64_t n)
{
    if (!be->set_vram_expert_cache)
        return ds4_fail(DS4_ERR_UNSUPPORTED,
                        "gpu expert cache: the session runs on the %s backend; the cache needs CUDA (a GPU and a "
                        "CUDA build)",
                        be->name);
    const int L = m->cfg.n_layer;
    const ds4_weight **gud = malloc((size_t)L * 3 * sizeof *gud);
    if (!gud) return ds4_fail(DS4_ERR_NOMEM, "gpu expert cache: out of memory");
    for (int l = 0; l < L; l++) {
        gud[3 * l] = &m->layers[l].gate_exps;
        gud[3 * l + 1] = &m->layers[l].up_exps;
        gud[3 * l + 2] = &m->layers[l].down_exps;
    }
    const int pol = evict == DS4_EXPERT_EVICT_LRU ? DS4_SLOTS_LRU : DS4_SLOTS_FREQ;
    ds4_status st = be->set_vram_expert_cache(be, L, m->cfg.n_expert, gud, slots, pol, pairs, n);
    free(gud);
    return st;
}

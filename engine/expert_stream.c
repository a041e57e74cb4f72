/*
 * expert_stream.c - setting up expert streaming for a model
 * (expert_stream.h, docs/STREAMING.md).
 */
#include "engine/expert_stream.h"

#include "engine/expert_profile.h"
#include "gguf/gguf.h"
#include "util/error.h"
#include "util/meminfo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define GIB (1024.0 * 1024.0 * 1024.0)
/* Headroom left to the KV cache, activations and the rest of the system
 * when the budget is sized from free memory. */
#define DEFAULT_RESERVE (2ull << 30)
/* Default preload: at most this many bytes, and half the cache, so start
 * stays fast and the cache keeps room to adapt to the prompt. */
#define DEFAULT_PRELOAD_BYTES (4ull << 30)

static void layer_descs(const dsv4_model *m, ds4_expert_layer *d)
{
    const uint8_t *base = ds4_gguf_base(m->gguf);
    for (int l = 0; l < m->cfg.n_layer; l++) {
        const dsv4_layer *L = &m->layers[l];
        const ds4_weight *w[3] = {&L->gate_exps, &L->up_exps, &L->down_exps};
        d[l].gate_data = L->gate_exps.data;
        for (int i = 0; i < 3; i++) {
            d[l].off[i] = (uint64_t)((const uint8_t *)w[i]->data - base);
            d[l].stride[i] = w[i]->nbytes / (uint64_t)w[i]->ne[2];
        }
    }
}

uint64_t ds4_expert_stream_model_bytes(const dsv4_model *m)
{
    uint64_t b = 0;
    for (int l = 0; l < m->cfg.n_layer; l++)
        b += m->layers[l].gate_exps.nbytes + m->layers[l].up_exps.nbytes + m->layers[l].down_exps.nbytes;
    return b;
}

/* "12.34 GiB", or MiB below one GiB (tiny test models) */
static const char *fmt_size(char *buf, size_t cap, double bytes)
{
    if (bytes >= GIB) snprintf(buf, cap, "%.2f GiB", bytes / GIB);
    else snprintf(buf, cap, "%.3f GiB = %.2f MiB", bytes / GIB, bytes / (1 << 20));
    return buf;
}

/* Ask the kernel to read the non-routed tensors now (they are used by
 * every token); the routed experts' pages of the mapping are never
 * touched while streaming. */
static uint64_t prefetch_resident(const dsv4_model *m)
{
    const uint8_t *base = ds4_gguf_base(m->gguf);
    long page = sysconf(_SC_PAGESIZE);
    uint64_t bytes = 0;
    for (int64_t i = 0; i < ds4_gguf_n_tensors(m->gguf); i++) {
        const ds4_gguf_tensor *t = ds4_gguf_tensor_at(m->gguf, i);
        if (strstr(t->name, "_exps.")) continue;
        uintptr_t a = (uintptr_t)t->data & ~(uintptr_t)(page - 1);
        size_t n = (size_t)((uintptr_t)t->data + t->size - a);
        if (base && n) madvise((void *)a, n, MADV_WILLNEED);
        bytes += t->size;
    }
    return bytes;
}

ds4_status ds4_expert_stream_hotlist(const dsv4_model *m, const ds4_model_options *o, uint64_t slots,
                                     uint64_t slot_bytes, uint64_t default_cap_bytes, ds4_expert_hotlist *out,
                                     uint64_t *n_out)
{
    const dsv4_config *cfg = &m->cfg;
    ds4_expert_hotlist h;
    ds4_status st;
    memset(out, 0, sizeof *out);
    *n_out = 0;
    if (o->cold) return DS4_OK;
    if (o->hotlist_path) {
        st = ds4_expert_hotlist_read(o->hotlist_path, &h);
        if (st != DS4_OK) return st;
        if (h.n_expert != cfg->n_expert) {
            ds4_expert_hotlist_free(&h);
            return ds4_fail(DS4_ERR_INVALID, "expert hot list %s: made for %d experts per layer, the model has %d",
                            o->hotlist_path, h.n_expert, cfg->n_expert);
        }
        for (int64_t i = 0; i < h.n; i++)
            if (h.pairs[2 * i] >= cfg->n_layer) {
                int l = h.pairs[2 * i];
                ds4_expert_hotlist_free(&h);
                return ds4_fail(DS4_ERR_INVALID, "expert hot list %s: entry %lld names layer %d, the model has %d layers",
                                o->hotlist_path, (long long)i + 1, l, cfg->n_layer);
            }
    } else {
        const char *source;
        st = ds4_expert_hotlist_default(cfg->n_layer, cfg->n_expert, cfg->n_embd, &h, &source);
        if (st == DS4_ERR_NOT_FOUND) { /* no list for this family: start empty */
            ds4_clear_error();
            return DS4_OK;
        }
        if (st != DS4_OK) return st;
    }
    uint64_t n = (uint64_t)h.n;
    if (o->preload_experts > 0) {
        if ((uint64_t)o->preload_experts < n) n = (uint64_t)o->preload_experts;
    } else {
        uint64_t cap = default_cap_bytes / slot_bytes;
        if (cap > slots / 2) cap = slots / 2;
        if (n > cap) n = cap;
    }
    if (n > slots) n = slots;
    *out = h;
    *n_out = n;
    return DS4_OK;
}

static ds4_status preload(const dsv4_model *m, ds4_expert_cache *c, const ds4_model_options *o, uint64_t slots,
                          uint64_t slot_bytes, uint64_t *preloaded)
{
    ds4_expert_hotlist h;
    uint64_t n;
    ds4_status st = ds4_expert_stream_hotlist(m, o, slots, slot_bytes, DEFAULT_PRELOAD_BYTES, &h, &n);
    if (st != DS4_OK) return st;
    if (n) ds4_expert_cache_preload(c, h.pairs, (int64_t)n);
    *preloaded = n;
    ds4_expert_hotlist_free(&h);
    return ds4_expert_cache_error(c);
}

ds4_expert_cache *ds4_expert_stream_open(const dsv4_model *m, const char *path, const ds4_model_options *o,
                                         uint64_t *preloaded)
{
    const dsv4_config *cfg = &m->cfg;
    *preloaded = 0;
    ds4_expert_layer *d = calloc((size_t)cfg->n_layer, sizeof *d);
    if (!d) {
        ds4_fail(DS4_ERR_NOMEM, "expert streaming: out of memory");
        return NULL;
    }
    layer_descs(m, d);
    uint64_t slot_bytes = ds4_expert_cache_slot_bytes(cfg->n_layer, d);
    uint64_t total = (uint64_t)cfg->n_layer * (uint64_t)cfg->n_expert;
    uint64_t token_set = (uint64_t)cfg->n_layer * (uint64_t)cfg->n_expert_used; /* one token's experts */
    uint64_t slots;
    if (o->cache_experts < 0) {
        free(d);
        ds4_fail(DS4_ERR_INVALID, "expert streaming: cache of %lld experts (give at least 1)", (long long)o->cache_experts);
        return NULL;
    }
    if (o->cache_experts > 0 || o->cache_bytes > 0) {
        slots = o->cache_experts > 0 ? (uint64_t)o->cache_experts : o->cache_bytes / slot_bytes;
        if (slots == 0) {
            free(d);
            ds4_fail(DS4_ERR_INVALID,
                     "expert streaming: a cache of %llu bytes holds no expert (one takes %.2f MiB); give at least 1 expert",
                     (unsigned long long)o->cache_bytes, (double)slot_bytes / (1 << 20));
            return NULL;
        }
        if (slots > total) {
            free(d);
            char a[64], b[64];
            ds4_fail(DS4_ERR_INVALID,
                     "expert streaming: a cache of %llu experts (%s) is more than the model's %llu routed experts "
                     "(%d layers x %d, %s)",
                     (unsigned long long)slots, fmt_size(a, sizeof a, (double)(slots * slot_bytes)),
                     (unsigned long long)total, cfg->n_layer, cfg->n_expert,
                     fmt_size(b, sizeof b, (double)(total * slot_bytes)));
            return NULL;
        }
    } else {
        /* default: what fits in free memory after the resident weights and
         * some headroom for the KV cache and activations */
        uint64_t avail = ds4_mem_available(), resident = 0;
        for (int64_t i = 0; i < ds4_gguf_n_tensors(m->gguf); i++) {
            const ds4_gguf_tensor *t = ds4_gguf_tensor_at(m->gguf, i);
            if (!strstr(t->name, "_exps.")) resident += t->size;
        }
        uint64_t room = avail > resident + DEFAULT_RESERVE ? avail - resident - DEFAULT_RESERVE : 0;
        slots = room / slot_bytes;
        if (slots < 2 * token_set) slots = 2 * token_set;
        if (slots > total) slots = total;
    }
    if (slots < 2 * token_set) {
        char a[64], b[64];
        fprintf(stderr,
                "ds4: warning: the expert cache (%llu experts, %s) is under twice one token's routed working set "
                "(2 x %d layers x %d experts = %s): most expert uses will wait for the disk\n",
                (unsigned long long)slots, fmt_size(a, sizeof a, (double)(slots * slot_bytes)), cfg->n_layer,
                cfg->n_expert_used, fmt_size(b, sizeof b, (double)(2 * token_set * slot_bytes)));
    }
    /* frequency by default: it read 10-35% fewer bytes than LRU once the
     * cache holds 1.5x a token's experts (docs/STREAMING.md, "Eviction") */
    ds4_expert_policy pol = o->evict == DS4_EXPERT_EVICT_LRU ? DS4_EXPERT_POLICY_LRU : DS4_EXPERT_POLICY_FREQ;
    if (o->evict != DS4_EXPERT_EVICT_DEFAULT && o->evict != DS4_EXPERT_EVICT_LRU && o->evict != DS4_EXPERT_EVICT_FREQ) {
        free(d);
        ds4_fail(DS4_ERR_INVALID, "expert streaming: unknown eviction policy %d", (int)o->evict);
        return NULL;
    }
    ds4_expert_cache *c = ds4_expert_cache_create(path, cfg->n_layer, cfg->n_expert, d, slots, pol, 0);
    free(d);
    if (!c) return NULL;
    prefetch_resident(m);
    if (preload(m, c, o, slots, slot_bytes, preloaded) != DS4_OK) {
        ds4_expert_cache_free(c);
        return NULL;
    }
    return c;
}

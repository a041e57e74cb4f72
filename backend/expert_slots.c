/*
 * expert_slots.c - slot bookkeeping of a fixed expert pool (expert_slots.h).
 *
 * The eviction order is the CPU streaming cache's (backend/expert_cache.c):
 * never what the current call uses; then, for FREQ, the fewest uses
 * (counts per (layer, expert), halved every n_slots misses so that old
 * popularity fades); then the least recently used. An empty slot is taken
 * before any eviction.
 */
#include "backend/expert_slots.h"

#include "util/error.h"

#include <stdlib.h>

typedef struct {
    int32_t key;    /* layer * n_expert + expert, -1 = empty */
    uint64_t stamp; /* clock of the last use */
    uint64_t call;  /* the call that used it last */
} xslot;

struct ds4_expert_slots {
    int n_layer, n_expert, policy;
    int64_t n_slots, resident;
    xslot *slots;
    int32_t *map;   /* key -> slot, -1 */
    uint32_t *freq; /* key -> uses */
    uint8_t *seen;  /* distinct(): scratch, one per expert */
    uint64_t clock, call, misses_since_decay;
    uint64_t hits, misses, evictions;
};

ds4_expert_slots *ds4_expert_slots_create(int n_layer, int n_expert, int64_t n_slots, int policy)
{
    if (n_layer < 1 || n_expert < 1 || n_slots < 1 || (int64_t)n_layer * n_expert > INT32_MAX ||
        n_slots > (int64_t)n_layer * n_expert) {
        ds4_fail(DS4_ERR_INVALID, "expert slots: %lld slots for %d layers x %d experts (1 .. all)", (long long)n_slots,
                 n_layer, n_expert);
        return NULL;
    }
    if (policy != DS4_SLOTS_LRU && policy != DS4_SLOTS_FREQ) {
        ds4_fail(DS4_ERR_INVALID, "expert slots: unknown eviction policy %d", policy);
        return NULL;
    }
    ds4_expert_slots *s = calloc(1, sizeof *s);
    size_t keys = (size_t)n_layer * (size_t)n_expert;
    if (s) {
        s->slots = malloc((size_t)n_slots * sizeof *s->slots);
        s->map = malloc(keys * sizeof *s->map);
        s->freq = calloc(keys, sizeof *s->freq);
        s->seen = calloc((size_t)n_expert, 1);
    }
    if (!s || !s->slots || !s->map || !s->freq || !s->seen) {
        ds4_expert_slots_free(s);
        ds4_fail(DS4_ERR_NOMEM, "expert slots: out of memory");
        return NULL;
    }
    s->n_layer = n_layer;
    s->n_expert = n_expert;
    s->n_slots = n_slots;
    s->policy = policy;
    for (int64_t i = 0; i < n_slots; i++) s->slots[i] = (xslot){-1, 0, 0};
    for (size_t k = 0; k < keys; k++) s->map[k] = -1;
    s->call = 1;
    return s;
}

void ds4_expert_slots_free(ds4_expert_slots *s)
{
    if (!s) return;
    free(s->slots);
    free(s->map);
    free(s->freq);
    free(s->seen);
    free(s);
}

int64_t ds4_expert_slots_find(const ds4_expert_slots *s, int layer, int expert)
{
    if (layer < 0 || layer >= s->n_layer || expert < 0 || expert >= s->n_expert) return -1;
    return s->map[(size_t)layer * (size_t)s->n_expert + (size_t)expert];
}

const int32_t *ds4_expert_slots_map(const ds4_expert_slots *s, int layer)
{
    return s->map + (size_t)layer * (size_t)s->n_expert;
}

void ds4_expert_slots_begin(ds4_expert_slots *s) { s->call++; }

/* Whether slot a is a better victim than slot b (neither used by this call). */
static int better_victim(const ds4_expert_slots *s, const xslot *a, const xslot *b)
{
    if (s->policy == DS4_SLOTS_FREQ) {
        uint32_t fa = s->freq[a->key], fb = s->freq[b->key];
        if (fa != fb) return fa < fb;
    }
    return a->stamp < b->stamp;
}

static int64_t pick_victim(const ds4_expert_slots *s)
{
    int64_t best = -1;
    for (int64_t i = 0; i < s->n_slots; i++) {
        const xslot *x = &s->slots[i];
        if (x->key < 0) return i;
        if (x->call == s->call) continue;
        if (best < 0 || better_victim(s, x, &s->slots[best])) best = i;
    }
    return best;
}

int64_t ds4_expert_slots_resolve(ds4_expert_slots *s, int layer, int expert, bool *miss, int *evicted_layer,
                                 int *evicted_expert)
{
    *miss = false;
    *evicted_layer = *evicted_expert = -1;
    if (layer < 0 || layer >= s->n_layer || expert < 0 || expert >= s->n_expert) {
        ds4_fail(DS4_ERR_INVALID, "expert slots: (layer %d, expert %d) out of range (%d x %d)", layer, expert,
                 s->n_layer, s->n_expert);
        return -1;
    }
    const int32_t key = (int32_t)((size_t)layer * (size_t)s->n_expert + (size_t)expert);
    int64_t v = s->map[key];
    if (v >= 0) {
        s->hits++;
    } else {
        v = pick_victim(s);
        if (v < 0) {
            ds4_fail(DS4_ERR_INVALID, "expert slots: one call needs more than the %lld slots", (long long)s->n_slots);
            return -1;
        }
        xslot *x = &s->slots[v];
        if (x->key >= 0) {
            s->map[x->key] = -1;
            *evicted_layer = x->key / s->n_expert;
            *evicted_expert = x->key % s->n_expert;
            s->evictions++;
        } else {
            s->resident++;
        }
        x->key = key;
        s->map[key] = (int32_t)v;
        s->misses++;
        *miss = true;
        if (s->policy == DS4_SLOTS_FREQ && ++s->misses_since_decay >= (uint64_t)s->n_slots) {
            size_t keys = (size_t)s->n_layer * (size_t)s->n_expert;
            for (size_t k = 0; k < keys; k++) s->freq[k] >>= 1;
            s->misses_since_decay = 0;
        }
    }
    xslot *x = &s->slots[v];
    x->stamp = ++s->clock;
    x->call = s->call;
    if (s->freq[key] < UINT32_MAX) s->freq[key]++;
    return v;
}

int ds4_expert_slots_distinct(const ds4_expert_slots *s, const int32_t *ids, int n)
{
    int d = 0;
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < s->n_expert && !s->seen[ids[i]]) s->seen[ids[i]] = 1, d++;
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < s->n_expert) s->seen[ids[i]] = 0;
    return d;
}

void ds4_expert_slots_get_stats(const ds4_expert_slots *s, ds4_expert_slots_stats *out)
{
    out->hits = s->hits;
    out->misses = s->misses;
    out->evictions = s->evictions;
    out->n_slots = s->n_slots;
    out->resident = s->resident;
}

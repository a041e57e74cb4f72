/*
 * expert_cache.c - the bounded routed-expert cache (expert_cache.h).
 *
 * One mutex guards the table; reader threads take queued misses, pread
 * the three matrices outside the lock and mark the slot ready. After a
 * read the file range is dropped from the page cache (POSIX_FADV_DONTNEED):
 * the bytes now live in the slot, and a second copy in the page cache
 * would grow memory past the budget (and make a re-read after eviction
 * look faster than the disk is).
 */
#include "backend/expert_cache.h"

#include "util/error.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

enum { SLOT_EMPTY = 0, SLOT_LOADING = 1, SLOT_READY = 2 };

typedef struct {
    int32_t key; /* layer * n_expert + expert; -1 when empty */
    int32_t pins;
    int state;
    uint64_t stamp; /* clock of the last use */
    uint64_t touch; /* epoch of the last touch() that named it */
} slot;

struct ds4_expert_cache {
    int fd;
    char *path;
    int n_layer, n_expert;
    ds4_expert_layer *layers;
    uint64_t n_slots, slot_bytes;
    uint8_t *arena;
    size_t arena_bytes;
    slot *slots;
    int32_t *map;   /* key -> slot, -1 */
    uint32_t *freq; /* key -> uses (halved every n_slots misses) */
    ds4_expert_policy policy;
    uint64_t clock, epoch, misses_since_decay;
    pthread_mutex_t mu;
    pthread_cond_t cv_ready, cv_free, cv_job;
    int64_t *jobs; /* ring of slots to read */
    uint64_t jhead, jtail, jcap;
    pthread_t *readers;
    int n_readers;
    bool stop;
    ds4_expert_cache_stats st;
    ds4_status err;
    char errmsg[512];
};

static uint64_t align64(uint64_t x) { return (x + 63) & ~(uint64_t)63; }

uint64_t ds4_expert_cache_slot_bytes(int n_layer, const ds4_expert_layer *layers)
{
    uint64_t best = 0;
    for (int l = 0; l < n_layer; l++) {
        uint64_t b = align64(layers[l].stride[0]) + align64(layers[l].stride[1]) + align64(layers[l].stride[2]);
        if (b > best) best = b;
    }
    return best;
}

static uint8_t *slot_base(ds4_expert_cache *c, int64_t s) { return c->arena + (uint64_t)s * c->slot_bytes; }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* pread all of [off, off+len) into dst; false + errno-style message on failure */
static bool read_all(int fd, uint8_t *dst, uint64_t len, uint64_t off, char *msg, size_t cap)
{
    uint64_t done = 0;
    while (done < len) {
        ssize_t n = pread(fd, dst + done, (size_t)(len - done), (off_t)(off + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            snprintf(msg, cap, "%s at offset %llu (%llu of %llu bytes read)", n < 0 ? strerror(errno) : "file ends",
                     (unsigned long long)(off + done), (unsigned long long)done, (unsigned long long)len);
            return false;
        }
        done += (uint64_t)n;
    }
    return true;
}

static void *reader_main(void *arg)
{
    ds4_expert_cache *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->stop && c->jhead == c->jtail) pthread_cond_wait(&c->cv_job, &c->mu);
        if (c->stop) break;
        int64_t s = c->jobs[c->jhead % c->jcap];
        c->jhead++;
        int32_t key = c->slots[s].key;
        pthread_mutex_unlock(&c->mu);

        int layer = key / c->n_expert, e = key % c->n_expert;
        const ds4_expert_layer *L = &c->layers[layer];
        uint8_t *dst = slot_base(c, s);
        char msg[256] = "";
        bool ok = true;
        uint64_t bytes = 0;
        double t0 = now_s();
        for (int i = 0; i < 3 && ok; i++) {
            uint64_t off = L->off[i] + (uint64_t)e * L->stride[i];
            ok = read_all(c->fd, dst, L->stride[i], off, msg, sizeof msg);
            if (ok) {
                posix_fadvise(c->fd, (off_t)off, (off_t)L->stride[i], POSIX_FADV_DONTNEED);
                bytes += L->stride[i];
                dst += align64(L->stride[i]);
            }
        }
        double dt = now_s() - t0;
        if (!ok) memset(slot_base(c, s), 0, c->slot_bytes);

        pthread_mutex_lock(&c->mu);
        if (!ok && c->err == DS4_OK) {
            c->err = DS4_ERR_IO;
            snprintf(c->errmsg, sizeof c->errmsg, "expert streaming: %s: reading layer %d expert %d: %s", c->path,
                     layer, e, msg);
        }
        c->st.bytes_read += bytes;
        c->st.read_seconds += dt;
        c->slots[s].state = SLOT_READY;
        pthread_cond_broadcast(&c->cv_ready);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

void ds4_expert_cache_free(ds4_expert_cache *c)
{
    if (!c) return;
    if (c->readers) {
        pthread_mutex_lock(&c->mu);
        c->stop = true;
        pthread_cond_broadcast(&c->cv_job);
        pthread_mutex_unlock(&c->mu);
        for (int i = 0; i < c->n_readers; i++) pthread_join(c->readers[i], NULL);
        free(c->readers);
    }
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv_ready);
    pthread_cond_destroy(&c->cv_free);
    pthread_cond_destroy(&c->cv_job);
    if (c->arena) munmap(c->arena, c->arena_bytes);
    if (c->fd >= 0) close(c->fd);
    free(c->path);
    free(c->layers);
    free(c->slots);
    free(c->map);
    free(c->freq);
    free(c->jobs);
    free(c);
}

ds4_expert_cache *ds4_expert_cache_create(const char *path, int n_layer, int n_expert,
                                          const ds4_expert_layer *layers, uint64_t n_slots,
                                          ds4_expert_policy policy, int n_readers)
{
    if (n_layer < 1 || n_expert < 1 || n_slots < 1) {
        ds4_fail(DS4_ERR_INVALID, "expert streaming: %llu cache slots for %d layers of %d experts",
                 (unsigned long long)n_slots, n_layer, n_expert);
        return NULL;
    }
    if (policy != DS4_EXPERT_POLICY_LRU && policy != DS4_EXPERT_POLICY_FREQ) {
        ds4_fail(DS4_ERR_INVALID, "expert streaming: unknown eviction policy %d", (int)policy);
        return NULL;
    }
    ds4_expert_cache *c = calloc(1, sizeof *c);
    if (!c) {
        ds4_fail(DS4_ERR_NOMEM, "expert streaming: out of memory");
        return NULL;
    }
    c->fd = -1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv_ready, NULL);
    pthread_cond_init(&c->cv_free, NULL);
    pthread_cond_init(&c->cv_job, NULL);
    c->n_layer = n_layer;
    c->n_expert = n_expert;
    c->policy = policy;
    c->n_slots = n_slots;
    c->slot_bytes = ds4_expert_cache_slot_bytes(n_layer, layers);
    size_t keys = (size_t)n_layer * (size_t)n_expert;
    c->path = strdup(path);
    c->layers = malloc((size_t)n_layer * sizeof *c->layers);
    c->slots = calloc((size_t)n_slots, sizeof *c->slots);
    c->map = malloc(keys * sizeof *c->map);
    c->freq = calloc(keys, sizeof *c->freq);
    c->jcap = n_slots + 1;
    c->jobs = malloc((size_t)c->jcap * sizeof *c->jobs);
    if (!c->path || !c->layers || !c->slots || !c->map || !c->freq || !c->jobs) {
        ds4_fail(DS4_ERR_NOMEM, "expert streaming: out of memory for %llu slots", (unsigned long long)n_slots);
        ds4_expert_cache_free(c);
        return NULL;
    }
    memcpy(c->layers, layers, (size_t)n_layer * sizeof *c->layers);
    for (size_t k = 0; k < keys; k++) c->map[k] = -1;
    for (uint64_t s = 0; s < n_slots; s++) c->slots[s].key = -1;
    if (c->slot_bytes == 0 || n_slots > SIZE_MAX / c->slot_bytes) {
        ds4_fail(DS4_ERR_INVALID, "expert streaming: %llu slots of %llu bytes do not fit the address space",
                 (unsigned long long)n_slots, (unsigned long long)c->slot_bytes);
        ds4_expert_cache_free(c);
        return NULL;
    }
    /* anonymous memory is committed page by page as slots fill, so RSS
     * follows what the cache holds, up to the budget */
    c->arena_bytes = (size_t)(n_slots * c->slot_bytes);
    void *a = mmap(NULL, c->arena_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (a == MAP_FAILED) {
        ds4_fail(DS4_ERR_NOMEM, "expert streaming: cannot reserve %.2f GiB for the expert cache: %s",
                 (double)c->arena_bytes / (1 << 30), strerror(errno));
        c->arena = NULL;
        ds4_expert_cache_free(c);
        return NULL;
    }
    c->arena = a;
    /* huge pages where the kernel has them: a GiB-sized cache filled page
     * by page otherwise costs hundreds of thousands of faults */
    madvise(a, c->arena_bytes, MADV_HUGEPAGE);
    c->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (c->fd < 0) {
        ds4_fail(DS4_ERR_IO, "expert streaming: cannot open %s: %s", path, strerror(errno));
        ds4_expert_cache_free(c);
        return NULL;
    }
    posix_fadvise(c->fd, 0, 0, POSIX_FADV_RANDOM);
    c->n_readers = n_readers > 0 ? n_readers : 8;
    c->readers = calloc((size_t)c->n_readers, sizeof *c->readers);
    if (!c->readers) {
        ds4_fail(DS4_ERR_NOMEM, "expert streaming: out of memory");
        ds4_expert_cache_free(c);
        return NULL;
    }
    for (int i = 0; i < c->n_readers; i++) {
        if (pthread_create(&c->readers[i], NULL, reader_main, c) != 0) {
            c->n_readers = i;
            ds4_fail(DS4_ERR_NOMEM, "expert streaming: cannot start reader thread %d", i);
            ds4_expert_cache_free(c);
            return NULL;
        }
    }
    c->st.slots = n_slots;
    c->st.slot_bytes = c->slot_bytes;
    return c;
}

int ds4_expert_cache_layer(const ds4_expert_cache *c, const void *gate_data)
{
    for (int l = 0; l < c->n_layer; l++)
        if (c->layers[l].gate_data == gate_data) return l;
    return -1;
}

void ds4_expert_cache_touch(ds4_expert_cache *c, int layer, const int32_t *experts, int n)
{
    pthread_mutex_lock(&c->mu);
    c->epoch++;
    for (int i = 0; i < n; i++) {
        int32_t s = c->map[(size_t)layer * (size_t)c->n_expert + (size_t)experts[i]];
        if (s >= 0) c->slots[s].touch = c->epoch;
    }
    pthread_mutex_unlock(&c->mu);
}

/* Whether slot a is a better victim than slot b. Experts the latest call
 * touched go last; then by the policy. */
static bool better_victim(const ds4_expert_cache *c, const slot *a, const slot *b)
{
    bool pa = a->touch == c->epoch, pb = b->touch == c->epoch;
    if (pa != pb) return !pa;
    if (c->policy == DS4_EXPERT_POLICY_FREQ) {
        uint32_t fa = c->freq[a->key], fb = c->freq[b->key];
        if (fa != fb) return fa < fb;
    }
    return a->stamp < b->stamp;
}

static int64_t pick_victim(ds4_expert_cache *c)
{
    int64_t best = -1;
    for (uint64_t i = 0; i < c->n_slots; i++) {
        const slot *s = &c->slots[i];
        if (s->pins || s->state == SLOT_LOADING) continue;
        if (s->key < 0) return (int64_t)i;
        if (best < 0 || better_victim(c, s, &c->slots[best])) best = (int64_t)i;
    }
    return best;
}

static int64_t acquire_locked(ds4_expert_cache *c, int layer, int expert, bool may_block, bool count)
{
    int32_t key = (int32_t)((size_t)layer * (size_t)c->n_expert + (size_t)expert);
    for (;;) {
        int32_t s = c->map[key];
        if (s >= 0) {
            c->slots[s].pins++;
            c->slots[s].stamp = ++c->clock;
            if (c->freq[key] < UINT32_MAX) c->freq[key]++;
            if (count) c->st.hits++;
            return s;
        }
        int64_t v = pick_victim(c);
        if (v < 0) {
            if (!may_block) return -1;
            pthread_cond_wait(&c->cv_free, &c->mu);
            continue; /* another caller may have loaded it meanwhile */
        }
        slot *sl = &c->slots[v];
        if (sl->key >= 0) c->map[sl->key] = -1;
        else c->st.resident++;
        sl->key = key;
        sl->state = SLOT_LOADING;
        sl->pins = 1;
        sl->stamp = ++c->clock;
        sl->touch = 0;
        c->map[key] = (int32_t)v;
        if (c->freq[key] < UINT32_MAX) c->freq[key]++;
        if (count) c->st.misses++;
        if (c->policy == DS4_EXPERT_POLICY_FREQ && ++c->misses_since_decay >= c->n_slots) {
            /* aging: old popularity fades, so a shift of topic can win
             * its experts back from those of the previous one */
            size_t keys = (size_t)c->n_layer * (size_t)c->n_expert;
            for (size_t k = 0; k < keys; k++) c->freq[k] >>= 1;
            c->misses_since_decay = 0;
        }
        c->jobs[c->jtail % c->jcap] = v;
        c->jtail++;
        pthread_cond_signal(&c->cv_job);
        return v;
    }
}

int64_t ds4_expert_cache_acquire(ds4_expert_cache *c, int layer, int expert, bool may_block)
{
    pthread_mutex_lock(&c->mu);
    int64_t s = acquire_locked(c, layer, expert, may_block, true);
    pthread_mutex_unlock(&c->mu);
    return s;
}

void ds4_expert_cache_wait(ds4_expert_cache *c, int64_t s, const void **gate, const void **up, const void **down)
{
    pthread_mutex_lock(&c->mu);
    while (c->slots[s].state != SLOT_READY) pthread_cond_wait(&c->cv_ready, &c->mu);
    const ds4_expert_layer *L = &c->layers[c->slots[s].key / c->n_expert];
    pthread_mutex_unlock(&c->mu);
    uint8_t *b = slot_base(c, s);
    *gate = b;
    *up = b + align64(L->stride[0]);
    *down = b + align64(L->stride[0]) + align64(L->stride[1]);
}

void ds4_expert_cache_release(ds4_expert_cache *c, int64_t s)
{
    pthread_mutex_lock(&c->mu);
    if (--c->slots[s].pins == 0) pthread_cond_broadcast(&c->cv_free);
    pthread_mutex_unlock(&c->mu);
}

void ds4_expert_cache_preload(ds4_expert_cache *c, const int32_t *pairs, int64_t n)
{
    if (n > (int64_t)c->n_slots) n = (int64_t)c->n_slots;
    int64_t *pin = malloc((size_t)(n > 0 ? n : 1) * sizeof *pin);
    if (!pin) return; /* preloading is an optimization: skip it */
    int64_t got = 0;
    pthread_mutex_lock(&c->mu);
    for (int64_t i = 0; i < n; i++) {
        int l = pairs[2 * i], e = pairs[2 * i + 1];
        if (l < 0 || l >= c->n_layer || e < 0 || e >= c->n_expert) continue;
        if (c->map[(size_t)l * (size_t)c->n_expert + (size_t)e] >= 0) continue; /* listed twice */
        int64_t s = acquire_locked(c, l, e, false, false);
        if (s < 0) break;
        pin[got++] = s;
    }
    pthread_mutex_unlock(&c->mu);
    for (int64_t i = 0; i < got; i++) {
        const void *g, *u, *d;
        ds4_expert_cache_wait(c, pin[i], &g, &u, &d);
        ds4_expert_cache_release(c, pin[i]);
    }
    free(pin);
}

void ds4_expert_cache_get_stats(ds4_expert_cache *c, ds4_expert_cache_stats *out)
{
    pthread_mutex_lock(&c->mu);
    *out = c->st;
    pthread_mutex_unlock(&c->mu);
}

ds4_status ds4_expert_cache_error(ds4_expert_cache *c)
{
    pthread_mutex_lock(&c->mu);
    ds4_status st = c->err;
    char msg[sizeof c->errmsg];
    memcpy(msg, c->errmsg, sizeof msg);
    pthread_mutex_unlock(&c->mu);
    if (st != DS4_OK) return ds4_fail(st, "%s", msg);
    return DS4_OK;
}

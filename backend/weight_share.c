/*
 * weight_share.c - the process-wide registry of shared device weight
 * copies (weight_share.h). A model has ~1300 tensors, so a linear scan of
 * one array is cheap next to the uploads it saves; lookups happen only
 * while sessions are created.
 */
#include "backend/weight_share.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int device;
    ds4_wshare_key key;
    void *dev;
    long refs;
} wshare_entry;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static wshare_entry *g_e;
static size_t g_n, g_cap;

void ds4_wshare_key_of(ds4_wshare_key *k, const void *host, size_t bytes, int type, int n_dims,
                       const int64_t *ne)
{
    memset(k, 0, sizeof *k);
    k->host = host;
    k->bytes = bytes;
    k->type = type;
    for (int d = 0; d < 4; d++) k->ne[d] = d < n_dims ? ne[d] : 1;
    size_t fp = bytes < DS4_WSHARE_FP_BYTES ? bytes : DS4_WSHARE_FP_BYTES;
    if (host && fp) {
        memcpy(k->head, host, fp);
        memcpy(k->tail, (const uint8_t *)host + bytes - fp, fp);
    }
}

bool ds4_wshare_key_equal(const ds4_wshare_key *a, const ds4_wshare_key *b)
{
    if (a->host != b->host || a->bytes != b->bytes || a->type != b->type) return false;
    for (int d = 0; d < 4; d++)
        if (a->ne[d] != b->ne[d]) return false;
    return memcmp(a->head, b->head, sizeof a->head) == 0 && memcmp(a->tail, b->tail, sizeof a->tail) == 0;
}

void *ds4_wshare_acquire(int device, const ds4_wshare_key *k)
{
    void *dev = NULL;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_n; i++)
        if (g_e[i].device == device && ds4_wshare_key_equal(&g_e[i].key, k)) {
            g_e[i].refs++;
            dev = g_e[i].dev;
            break;
        }
    pthread_mutex_unlock(&g_lock);
    return dev;
}

bool ds4_wshare_add(int device, const ds4_wshare_key *k, void *dev)
{
    bool ok = true;
    pthread_mutex_lock(&g_lock);
    if (g_n == g_cap) {
        size_t cap = g_cap ? 2 * g_cap : 256;
        wshare_entry *ne = realloc(g_e, cap * sizeof *ne);
        if (ne) {
            g_e = ne;
            g_cap = cap;
        } else {
            ok = false;
        }
    }
    if (ok) g_e[g_n++] = (wshare_entry){.device = device, .key = *k, .dev = dev, .refs = 1};
    pthread_mutex_unlock(&g_lock);
    return ok;
}

bool ds4_wshare_release(int device, void *dev)
{
    bool last = false;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_n; i++)
        if (g_e[i].device == device && g_e[i].dev == dev) {
            if (--g_e[i].refs == 0) {
                g_e[i] = g_e[--g_n];
                last = true;
            }
            break;
        }
    if (g_n == 0) { /* the last backend is gone: give the table back too */
        free(g_e);
        g_e = NULL;
        g_cap = 0;
    }
    pthread_mutex_unlock(&g_lock);
    return last;
}

size_t ds4_wshare_count(void)
{
    pthread_mutex_lock(&g_lock);
    size_t n = g_n;
    pthread_mutex_unlock(&g_lock);
    return n;
}

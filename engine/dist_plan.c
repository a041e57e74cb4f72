/*
 * dist_plan.c - the layer split of a distributed run and the model file's
 * fingerprint (dist_plan.h).
 */
#include "engine/dist_plan.h"

#include "gguf/gguf.h"
#include "model/dsv4_config.h"
#include "util/error.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

ds4_status ds4_dist_parse_range(const char *text, ds4_dist_range *r)
{
    char *end;
    errno = 0;
    long a = strtol(text, &end, 10);
    if (errno || end == text || *end != ':' || a < 0 || a >= DSV4_MAX_LAYERS) goto bad;
    const char *p = end + 1;
    long b = strtol(p, &end, 10);
    if (errno || end == p || *end || b <= a || b > DSV4_MAX_LAYERS) goto bad;
    r->lo = (int)a;
    r->hi = (int)b;
    return DS4_OK;
bad:
    return ds4_fail(DS4_ERR_INVALID, "--layers '%s': expected A:B, the layers A..B-1 (0 <= A < B)", text);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* "blk.N." -> N, else -1 */
static int layer_of(const char *name)
{
    if (strncmp(name, "blk.", 4) != 0) return -1;
    char *end;
    long v = strtol(name + 4, &end, 10);
    return end != name + 4 && *end == '.' && v >= 0 && v < DSV4_MAX_LAYERS ? (int)v : -1;
}

ds4_status ds4_dist_model_info_read(const char *path, ds4_dist_model_info *out)
{
    memset(out, 0, sizeof *out);
    ds4_gguf *g = ds4_gguf_open(path);
    if (!g) return ds4_last_error()[0] ? DS4_ERR_IO : ds4_fail(DS4_ERR_IO, "cannot open %s", path);
    dsv4_config c;
    ds4_status st = dsv4_config_load(g, &c);
    if (st != DS4_OK) {
        ds4_error_prefix("%s: ", path);
        ds4_gguf_close(g);
        return st;
    }
    out->n_layer = c.n_layer;
    uint64_t h = 0xcbf29ce484222325ull, fsize = ds4_gguf_file_size(g);
    int64_t nt = ds4_gguf_n_tensors(g);
    h = fnv(h, &fsize, sizeof fsize);
    h = fnv(h, &nt, sizeof nt);
    for (int64_t i = 0; i < nt; i++) {
        const ds4_gguf_tensor *t = ds4_gguf_tensor_at(g, i);
        h = fnv(h, t->name, strlen(t->name) + 1);
        h = fnv(h, &t->type, sizeof t->type);
        h = fnv(h, t->ne, sizeof t->ne);
        h = fnv(h, &t->size, sizeof t->size);
        h = fnv(h, &t->offset, sizeof t->offset);
        int il = layer_of(t->name);
        if (il >= 0 && il < c.n_layer) out->layer_bytes[il] += t->size;
        else if (strcmp(t->name, "token_embd.weight") == 0) out->embed_bytes += t->size;
        else if (strncmp(t->name, "output", 6) == 0) out->head_bytes += t->size;
    }
    out->fingerprint = h;
    ds4_gguf_close(g);
    return DS4_OK;
}

static ds4_status check_asked(const ds4_dist_model_info *mi, int n_rank, const ds4_dist_range *asked)
{
    int next = 0;
    for (int r = 0; r < n_rank; r++) {
        const ds4_dist_range *a = &asked[r];
        if (a->lo < 0)
            return ds4_fail(DS4_ERR_INVALID,
                            "distributed: --layers given to some ranks but not to rank %d (give it to every rank, "
                            "or to none for an automatic split)",
                            r);
        if (a->lo != next)
            return ds4_fail(DS4_ERR_INVALID,
                            "distributed: rank %d has layers %d:%d, but the ranks before it end at layer %d (the "
                            "ranges must follow each other in rank order from layer 0)",
                            r, a->lo, a->hi, next);
        if (a->hi > mi->n_layer)
            return ds4_fail(DS4_ERR_INVALID, "distributed: rank %d has layers %d:%d, the model has %d layers", r, a->lo,
                            a->hi, mi->n_layer);
        next = a->hi;
    }
    if (next != mi->n_layer)
        return ds4_fail(DS4_ERR_INVALID,
                        "distributed: the ranks' --layers end at layer %d, the model has %d layers (the last rank "
                        "must end at %d)",
                        next, mi->n_layer, mi->n_layer);
    return DS4_OK;
}

ds4_status ds4_dist_plan(const ds4_dist_model_info *mi, int n_rank, const ds4_dist_range *asked,
                         const uint64_t *weight, ds4_dist_range *out)
{
    const int L = mi->n_layer;
    if (n_rank < 1 || n_rank > L)
        return ds4_fail(DS4_ERR_INVALID, "distributed: %d ranks for a model of %d layers (each rank needs a layer)",
                        n_rank, L);
    bool any = false;
    for (int r = 0; r < n_rank; r++) any |= asked && asked[r].lo >= 0;
    if (any) {
        ds4_status st = check_asked(mi, n_rank, asked);
        if (st != DS4_OK) return st;
        memcpy(out, asked, (size_t)n_rank * sizeof *out);
        return DS4_OK;
    }
    /* cum[i]: the bytes of everything before layer i (the embedding first) */
    double cum[257], wsum = 0, wacc = 0;
    cum[0] = (double)mi->embed_bytes;
    for (int i = 0; i < L; i++) cum[i + 1] = cum[i] + (double)mi->layer_bytes[i];
    double total = cum[L] + (double)mi->head_bytes;
    for (int r = 0; r < n_rank; r++) wsum += weight && weight[r] ? (double)weight[r] : 1.0;
    int lo = 0;
    for (int r = 0; r < n_rank; r++) {
        wacc += weight && weight[r] ? (double)weight[r] : 1.0;
        int hi = L;
        if (r < n_rank - 1) {
            double target = total * wacc / wsum;
            /* at least one layer here, and one left for each later rank */
            hi = lo + 1;
            int max_hi = L - (n_rank - 1 - r);
            while (hi < max_hi && cum[hi + 1] <= target) hi++;
            /* the boundary nearest the target */
            if (hi < max_hi && target - cum[hi] > cum[hi + 1] - target) hi++;
        }
        out[r].lo = lo;
        out[r].hi = hi;
        lo = hi;
    }
    return DS4_OK;
}

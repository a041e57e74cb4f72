/*
 * dsv4_undo.c - undo record of one chunk (model/dsv4_undo.h).
 *
 * Feeding T tokens at positions P..P+T-1 writes, per layer:
 *   - the raw ring slots p mod window of those positions;
 *   - per compressor, the pending-window slots p mod ratio (buf_c, buf_z),
 *     prev_c / prev_z when a window completes inside the chunk (CSA keeps
 *     the last complete window there), and rows floor(P/ratio).. that the
 *     completed windows append.
 * The appended rows need no saving: a state at P reads rows
 * < floor(P/ratio) only (the row count follows from the position,
 * backend/ops.h) and feeding the tokens again writes them again. So the
 * record is the ring and pending slots the chunk overwrites plus the CSA
 * prev windows, O(T) rows per layer instead of the whole window and every
 * compressed row of a snapshot.
 */
#include "model/dsv4_undo.h"

#include <string.h>

#include "util/error.h"

typedef struct {
    uint8_t *p;       /* NULL: count only */
    const uint8_t *q; /* restoring */
    size_t at, len;
    ds4_backend *be;
    bool bad;
} ucur;

static void seg(ucur *u, float *dev, size_t n_floats)
{
    size_t b = n_floats * 4;
    if (u->at + b > u->len) {
        u->bad = true;
        return;
    }
    if (u->p && dev) u->be->download(u->be, u->p + u->at, dev, b);
    if (u->q && dev) u->be->upload(u->be, dev, u->q + u->at, b);
    u->at += b;
}

static void comp_walk(ucur *u, ds4_comp_state *cs, int64_t P, int T)
{
    size_t win = (size_t)cs->out_dim * (cs->overlap ? 2 : 1);
    int n = T < cs->ratio ? T : cs->ratio;
    for (int i = 0; i < n; i++) {
        size_t slot = (size_t)((P + i) % cs->ratio);
        seg(u, cs->buf_c ? cs->buf_c + slot * win : NULL, win);
        seg(u, cs->buf_z ? cs->buf_z + slot * win : NULL, win);
    }
    /* a window completes when some p in [P, P+T) has (p+1) % ratio == 0 */
    bool completes = (P + T) / cs->ratio != P / cs->ratio;
    if (cs->overlap && completes) {
        size_t m = (size_t)cs->ratio * cs->out_dim;
        seg(u, cs->prev_c, m);
        seg(u, cs->prev_z, m);
    }
}

static void walk(ucur *u, dsv4_state *s, int64_t P, int T)
{
    const dsv4_config *c = &s->m->cfg;
    int n = T < c->window ? T : c->window;
    for (int il = s->m->layer_lo; il < s->m->layer_hi; il++) {
        dsv4_layer_state *ls = &s->layers[il];
        for (int i = 0; i < n; i++) {
            size_t slot = (size_t)((P + i) % c->window);
            seg(u, ls->ring ? ls->ring + slot * c->head_dim : NULL, (size_t)c->head_dim);
        }
        if (ls->comp.ratio) comp_walk(u, &ls->comp, P, T);
        if (ls->idx.ratio) comp_walk(u, &ls->idx, P, T);
    }
}

#define UNDO_HEAD 12 /* i64 position, i32 chunk length */

size_t dsv4_undo_size(const dsv4_state *s, int T)
{
    ucur u = {NULL, NULL, 0, (size_t)-1, s->be, false};
    walk(&u, (dsv4_state *)s, s->n_pos, T);
    return UNDO_HEAD + u.at;
}

ds4_status dsv4_undo_save(const dsv4_state *s, int T, void *buf, size_t len)
{
    if (T < 1) return ds4_fail(DS4_ERR_INVALID, "undo: chunk of %d tokens", T);
    if (len < UNDO_HEAD) return ds4_fail(DS4_ERR_INVALID, "undo: buffer of %zu bytes too small", len);
    int64_t P = s->n_pos;
    int32_t t = T;
    memcpy(buf, &P, 8);
    memcpy((uint8_t *)buf + 8, &t, 4);
    ucur u = {(uint8_t *)buf + UNDO_HEAD, NULL, 0, len - UNDO_HEAD, s->be, false};
    walk(&u, (dsv4_state *)s, P, T);
    if (u.bad) return ds4_fail(DS4_ERR_INVALID, "undo: buffer of %zu bytes too small", len);
    return DS4_OK;
}

ds4_status dsv4_undo_restore(dsv4_state *s, const void *buf, size_t len)
{
    int64_t P;
    int32_t T;
    if (len < UNDO_HEAD) return ds4_fail(DS4_ERR_INVALID, "undo: record of %zu bytes too short", len);
    memcpy(&P, buf, 8);
    memcpy(&T, (const uint8_t *)buf + 8, 4);
    /* the record only holds what feeding T tokens at P overwrote: it
     * undoes that chunk and nothing else */
    if (T < 1 || P < 0 || s->n_pos < P || s->n_pos > P + T)
        return ds4_fail(DS4_ERR_INVALID, "undo: record of %d tokens at %lld does not cover a state at %lld", (int)T,
                        (long long)P, (long long)s->n_pos);
    ucur u = {NULL, (const uint8_t *)buf + UNDO_HEAD, 0, len - UNDO_HEAD, s->be, false};
    walk(&u, s, P, T);
    if (u.bad) return ds4_fail(DS4_ERR_INVALID, "undo: record of %zu bytes too short", len);
    s->n_pos = P;
    return DS4_OK;
}

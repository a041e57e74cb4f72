/*
 * dsv4_state.c - allocation, reset and snapshot/restore of the DeepSeek V4
 * session state (dsv4-model.md §5.1) in backend memory.
 *
 * Snapshot format (version 1, little-endian), backend-neutral because it
 * stores the logical state, not a backend's buffers:
 *   "DS4STATE" u32 version u32 numerics-flags
 *   i64 n_pos, u32 n_layer, n_embd, head_dim, window, idx_dim, n_rot
 *   u32 compress_ratio[n_layer]
 *   per layer:
 *     raw rows of positions max(0, n_pos-window) .. n_pos-1 (head_dim f32 each)
 *     for each compressor (main if ratio != 0, indexer if ratio == 4):
 *       floor(n_pos/ratio) emitted rows (out_dim f32 each)
 *       (n_pos mod ratio) pending slots of kv then of gate (width_in f32 each)
 *       CSA: prev kv, prev gate (ratio x out_dim f32 each)
 * Only the rows that exist are written, so a snapshot is O(context/ratio)
 * and restores into a session of any context length that can hold it.
 */
#include "model/dsv4_state.h"

#include "quant/fp8.h"
#include "util/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SNAP_MAGIC "DS4STATE"
#define SNAP_VERSION 1u

static void *balloc(dsv4_state *s, size_t bytes, ds4_status *st)
{
    if (*st != DS4_OK) return NULL;
    void *p = s->be->alloc(s->be, bytes ? bytes : 4);
    s->work_bytes += bytes; /* the KV part is moved out of it in create */
    if (!p) *st = ds4_fail(DS4_ERR_NOMEM, "session: cannot allocate %zu bytes of state", bytes);
    return p;
}

/* The shape is set on every layer (snapshot sizes count all layers); the
 * buffers exist only on the layers of this state's model (own). */
static void comp_alloc(dsv4_state *s, ds4_comp_state *cs, int ratio, int out_dim, bool overlap, bool own,
                       ds4_status *st)
{
    cs->ratio = ratio;
    cs->out_dim = out_dim;
    cs->overlap = overlap;
    cs->cap_rows = s->n_ctx / ratio + 1;
    if (!own) return;
    size_t win = (size_t)out_dim * (overlap ? 2 : 1);
    cs->buf_c = balloc(s, (size_t)ratio * win * 4, st);
    cs->buf_z = balloc(s, (size_t)ratio * win * 4, st);
    if (overlap) {
        cs->prev_c = balloc(s, (size_t)ratio * out_dim * 4, st);
        cs->prev_z = balloc(s, (size_t)ratio * out_dim * 4, st);
    }
    cs->rows = balloc(s, (size_t)cs->cap_rows * out_dim * 4, st);
}

static void comp_free(ds4_backend *be, ds4_comp_state *cs)
{
    void *p[] = {cs->buf_c, cs->buf_z, cs->prev_c, cs->prev_z, cs->rows};
    for (size_t i = 0; i < 5; i++)
        if (p[i]) be->free(be, p[i]);
}

ds4_kv_numerics dsv4_numerics(const dsv4_config *c, bool official)
{
    ds4_kv_numerics nm = {0, false, false};
    if (official) {
        nm.fp8_nope = c->head_dim - c->n_rot;
        nm.f16_store = true;
        nm.indexer_qat = true;
    }
    return nm;
}

ds4_status dsv4_numerics_check(const dsv4_config *c, const ds4_kv_numerics *nm)
{
    if (nm->fp8_nope && (nm->fp8_nope != c->head_dim - c->n_rot || nm->fp8_nope % DS4_FP8_KV_BLOCK))
        return ds4_fail(DS4_ERR_UNSUPPORTED,
                        "official numerics: FP8 KV rounding needs the %d non-RoPE dims (key_length %d - rope %d) "
                        "to be a multiple of %d (dsv4-model.md §4.1 D1, §7.1)",
                        c->head_dim - c->n_rot, c->head_dim, c->n_rot, DS4_FP8_KV_BLOCK);
    bool any_csa = false;
    for (int i = 0; i < c->n_layer; i++) any_csa |= dsv4_layer_is_csa(c, i);
    if (nm->indexer_qat && any_csa && c->idx_dim != DS4_HADAMARD_N)
        return ds4_fail(DS4_ERR_UNSUPPORTED,
                        "official numerics: the indexer Hadamard+FP4 simulation needs indexer.key_length %d, "
                        "this model has %d (dsv4-model.md §4.1 D2, §7.1)",
                        DS4_HADAMARD_N, c->idx_dim);
    return DS4_OK;
}

ds4_status dsv4_state_create(const dsv4_model *m, ds4_backend *be, int64_t n_ctx, int max_chunk,
                             const ds4_kv_numerics *nm, dsv4_state **out)
{
    const dsv4_config *c = &m->cfg;
    *out = NULL;
    if (n_ctx < 1 || n_ctx > ((int64_t)1 << 32))
        return ds4_fail(DS4_ERR_INVALID, "session: context length %lld out of range", (long long)n_ctx);
    if (max_chunk < 1 || max_chunk > 65536)
        return ds4_fail(DS4_ERR_INVALID, "session: chunk size %d out of range [1, 65536]", max_chunk);
    dsv4_state *s = calloc(1, sizeof *s);
    if (!s) return ds4_fail(DS4_ERR_NOMEM, "session: out of memory");
    s->m = m;
    s->be = be;
    s->n_ctx = n_ctx;
    s->max_chunk = max_chunk;
    s->logit_rows = max_chunk < DSV4_LOGIT_ROWS ? max_chunk : DSV4_LOGIT_ROWS;
    ds4_status st = DS4_OK;
    if (nm) {
        s->nm = *nm;
        st = dsv4_numerics_check(c, nm);
    }
    s->layers = calloc((size_t)c->n_layer, sizeof *s->layers);
    if (!s->layers) st = ds4_fail(DS4_ERR_NOMEM, "session: out of memory");
    for (int il = 0; il < c->n_layer && st == DS4_OK; il++) {
        dsv4_layer_state *ls = &s->layers[il];
        int r = c->compress_ratio[il];
        bool own = il >= m->layer_lo && il < m->layer_hi; /* a pipeline stage keeps its layers' state */
        if (own) ls->ring = balloc(s, (size_t)c->window * c->head_dim * 4, &st);
        if (r) comp_alloc(s, &ls->comp, r, c->head_dim, r == DSV4_CSA_RATIO, own, &st);
        if (r == DSV4_CSA_RATIO) comp_alloc(s, &ls->idx, r, c->idx_dim, true, own, &st);
    }
    s->kv_bytes = s->work_bytes;
    s->work_bytes = 0;
    size_t T = (size_t)max_chunk, E = (size_t)c->n_embd, HC = (size_t)c->n_hc;
    size_t D = (size_t)c->head_dim, H = (size_t)c->n_head;
    s->tokens = balloc(s, T * 4, &st);
    s->sel = balloc(s, T * (size_t)c->idx_topk * 4, &st);
    s->esel = balloc(s, T * (size_t)c->n_expert_used * 4, &st);
    s->ew = balloc(s, T * (size_t)c->n_expert_used * 4, &st);
    s->X = balloc(s, T * HC * E * 4, &st);
    s->y = balloc(s, T * E * 4, &st);
    s->post = balloc(s, T * HC * 4, &st);
    s->comb = balloc(s, T * HC * HC * 4, &st);
    s->a = balloc(s, T * E * 4, &st);
    s->qr = balloc(s, T * (size_t)c->q_lora * 4, &st);
    s->q = balloc(s, T * H * D * 4, &st);
    s->kv = balloc(s, T * D * 4, &st);
    s->c = balloc(s, T * 2 * D * 4, &st);
    s->z = balloc(s, T * 2 * D * 4, &st);
    s->ci = balloc(s, T * 2 * (size_t)c->idx_dim * 4, &st);
    s->zi = balloc(s, T * 2 * (size_t)c->idx_dim * 4, &st);
    s->qi = balloc(s, T * (size_t)c->idx_heads * c->idx_dim * 4, &st);
    s->wi = balloc(s, T * (size_t)c->idx_heads * 4, &st);
    s->o = balloc(s, T * H * D * 4, &st);
    s->u = balloc(s, T * (size_t)c->o_groups * c->o_lora * 4, &st);
    s->F = balloc(s, T * E * 4, &st);
    s->rlogits = balloc(s, T * (size_t)c->n_expert * 4, &st);
    s->hy = balloc(s, T * E * 4, &st);
    /* tensor parallel: only rank 0 receives logits (dsv4_pass_head) */
    const size_t R = (size_t)s->logit_rows;
    s->logits = balloc(s, dsv4_model_tp(m) && m->tp_rank ? 4 : R * (size_t)c->n_vocab * 4, &st);
    if (m->tp_vocab) s->tp_logits = balloc(s, R * (size_t)(c->n_vocab / m->tp_size) * 4, &st);
    if (st != DS4_OK) {
        dsv4_state_free(s);
        return st;
    }
    dsv4_state_reset(s);
    *out = s;
    return DS4_OK;
}

int dsv4_state_batch_rows(const dsv4_state *s) { return s->logit_rows; }

void dsv4_state_free(dsv4_state *s)
{
    if (!s) return;
    ds4_backend *be = s->be;
    if (s->layers) {
        for (int il = 0; il < s->m->cfg.n_layer; il++) {
            if (s->layers[il].ring) be->free(be, s->layers[il].ring);
            comp_free(be, &s->layers[il].comp);
            comp_free(be, &s->layers[il].idx);
        }
        free(s->layers);
    }
    void *bufs[] = {s->tokens, s->sel, s->esel, s->ew, s->X, s->y, s->post, s->comb, s->a, s->qr,
                    s->q, s->kv, s->c, s->z, s->ci, s->zi, s->qi, s->wi, s->o, s->u, s->F,
                    s->rlogits, s->hy, s->logits, s->tp_logits};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]) be->free(be, bufs[i]);
    free(s);
}

static void comp_reset(ds4_backend *be, ds4_comp_state *cs)
{
    if (!cs->rows) return;
    size_t win = (size_t)cs->out_dim * (cs->overlap ? 2 : 1);
    be->fill(be, cs->buf_c, 0.0f, (size_t)cs->ratio * win);
    be->fill(be, cs->buf_z, 0.0f, (size_t)cs->ratio * win);
    if (cs->overlap) {
        /* §3.5: window 0 has no previous half: kv 0, gate -inf (weight 0) */
        be->fill(be, cs->prev_c, 0.0f, (size_t)cs->ratio * cs->out_dim);
        be->fill(be, cs->prev_z, -INFINITY, (size_t)cs->ratio * cs->out_dim);
    }
}

void dsv4_state_reset(dsv4_state *s)
{
    const dsv4_config *c = &s->m->cfg;
    for (int il = s->m->layer_lo; il < s->m->layer_hi; il++) {
        s->be->fill(s->be, s->layers[il].ring, 0.0f, (size_t)c->window * c->head_dim);
        comp_reset(s->be, &s->layers[il].comp);
        comp_reset(s->be, &s->layers[il].idx);
    }
    s->n_pos = 0;
}

/* ---- snapshot ---------------------------------------------------------- */

typedef struct {
    uint8_t *p;
    const uint8_t *q;
    size_t at, len;
    bool bad;
} cursor;

static void put(cursor *w, const void *src, size_t n)
{
    if (w->at + n > w->len) {
        w->bad = true;
        return;
    }
    if (w->p) memcpy(w->p + w->at, src, n);
    w->at += n;
}

static void put_dev(cursor *w, ds4_backend *be, const float *src, size_t n_floats)
{
    if (w->at + n_floats * 4 > w->len) {
        w->bad = true;
        return;
    }
    if (w->p && n_floats) be->download(be, w->p + w->at, src, n_floats * 4);
    w->at += n_floats * 4;
}

static void get(cursor *r, void *dst, size_t n)
{
    if (r->bad || r->at + n > r->len) {
        r->bad = true;
        return;
    }
    memcpy(dst, r->q + r->at, n);
    r->at += n;
}

static void get_dev(cursor *r, ds4_backend *be, float *dst, size_t n_floats)
{
    if (r->bad || r->at + n_floats * 4 > r->len) {
        r->bad = true;
        return;
    }
    if (n_floats) be->upload(be, dst, r->q + r->at, n_floats * 4);
    r->at += n_floats * 4;
}

static uint32_t numerics_flags(const dsv4_state *s)
{
    return (s->nm.fp8_nope ? 1u : 0u) | (s->nm.f16_store ? 2u : 0u) | (s->nm.indexer_qat ? 4u : 0u);
}

/* The header fields after the magic, as u32 (n_pos as two u32). */
static int header_words(const dsv4_state *s, int64_t n_pos, uint32_t *h)
{
    const dsv4_config *c = &s->m->cfg;
    int n = 0;
    h[n++] = SNAP_VERSION;
    h[n++] = numerics_flags(s);
    h[n++] = (uint32_t)((uint64_t)n_pos & 0xffffffffu);
    h[n++] = (uint32_t)((uint64_t)n_pos >> 32);
    h[n++] = (uint32_t)c->n_layer;
    h[n++] = (uint32_t)c->n_embd;
    h[n++] = (uint32_t)c->head_dim;
    h[n++] = (uint32_t)c->window;
    h[n++] = (uint32_t)c->idx_dim;
    h[n++] = (uint32_t)c->n_rot;
    for (int il = 0; il < c->n_layer; il++) h[n++] = (uint32_t)c->compress_ratio[il];
    return n;
}

/* Walk the logical state in snapshot order: write (w) or read (r). */
static void walk_comp(cursor *cu, bool writing, ds4_backend *be, ds4_comp_state *cs, int64_t n_pos)
{
    int64_t rows = n_pos / cs->ratio, pend = n_pos % cs->ratio;
    size_t win = (size_t)cs->out_dim * (cs->overlap ? 2 : 1);
    float *arrs[4] = {cs->rows, cs->buf_c, cs->buf_z, NULL};
    size_t lens[3] = {(size_t)rows * cs->out_dim, (size_t)pend * win, (size_t)pend * win};
    for (int i = 0; i < 3; i++) {
        if (writing) put_dev(cu, be, arrs[i], lens[i]);
        else get_dev(cu, be, arrs[i], lens[i]);
    }
    if (cs->overlap) {
        size_t n = (size_t)cs->ratio * cs->out_dim;
        if (writing) {
            put_dev(cu, be, cs->prev_c, n);
            put_dev(cu, be, cs->prev_z, n);
        } else {
            get_dev(cu, be, cs->prev_c, n);
            get_dev(cu, be, cs->prev_z, n);
        }
    }
}

/* Layers lo..hi-1 (a pipeline stage walks its own; sizes walk them all,
 * writing to no buffer, so the missing layers' memory is never read). */
static void walk_range(cursor *cu, bool writing, const dsv4_state *s, int64_t n_pos, int lo, int hi)
{
    const dsv4_config *c = &s->m->cfg;
    for (int il = lo; il < hi; il++) {
        dsv4_layer_state *ls = &s->layers[il];
        int64_t lo = n_pos > c->window ? n_pos - c->window : 0;
        for (int64_t p = lo; p < n_pos; p++) {
            /* (no ring on a layer another stage holds: only counted) */
            float *row = ls->ring ? ls->ring + (size_t)(p % c->window) * c->head_dim : NULL;
            if (writing) put_dev(cu, s->be, row, (size_t)c->head_dim);
            else get_dev(cu, s->be, row, (size_t)c->head_dim);
        }
        if (ls->comp.ratio) walk_comp(cu, writing, s->be, &ls->comp, n_pos);
        if (ls->idx.ratio) walk_comp(cu, writing, s->be, &ls->idx, n_pos);
    }
}

static void walk_layers(cursor *cu, bool writing, const dsv4_state *s, int64_t n_pos)
{
    walk_range(cu, writing, s, n_pos, 0, s->m->cfg.n_layer);
}

size_t dsv4_state_snapshot_size(const dsv4_state *s) { return dsv4_state_snapshot_size_at(s, s->n_pos); }

size_t dsv4_state_snapshot_size_at(const dsv4_state *s, int64_t n_pos)
{
    cursor cu = {NULL, NULL, 0, (size_t)-1, false};
    uint32_t h[16 + DSV4_MAX_LAYERS];
    int n = header_words(s, n_pos, h);
    put(&cu, SNAP_MAGIC, 8);
    put(&cu, h, (size_t)n * 4);
    walk_layers(&cu, true, s, n_pos);
    return cu.at;
}

/* A compressor's part of a snapshot at most positions <= n_ctx: its rows
 * grow with the position, its pending buffers with the position modulo the
 * ratio, so the sizes at n_ctx and at ratio - 1 pending rows bound it. */
static size_t comp_bound(const ds4_comp_state *cs, int64_t n_ctx)
{
    size_t win = (size_t)cs->out_dim * (cs->overlap ? 2 : 1);
    size_t pend = (size_t)(n_ctx < cs->ratio - 1 ? n_ctx : cs->ratio - 1);
    size_t f = (size_t)(n_ctx / cs->ratio) * (size_t)cs->out_dim + 2 * pend * win;
    if (cs->overlap) f += 2 * (size_t)cs->ratio * (size_t)cs->out_dim;
    return f * 4;
}

size_t dsv4_state_snapshot_size_max(const dsv4_state *s)
{
    const dsv4_config *c = &s->m->cfg;
    size_t total = dsv4_state_snapshot_size_at(s, 0);
    int64_t rows = s->n_ctx < c->window ? s->n_ctx : c->window;
    for (int il = 0; il < c->n_layer; il++) {
        const dsv4_layer_state *ls = &s->layers[il];
        total += (size_t)rows * (size_t)c->head_dim * 4;
        if (ls->comp.ratio) total += comp_bound(&ls->comp, s->n_ctx);
        if (ls->idx.ratio) total += comp_bound(&ls->idx, s->n_ctx);
    }
    return total;
}

static size_t header_bytes(const dsv4_state *s)
{
    return 8 + 4 * (size_t)(10 + s->m->cfg.n_layer);
}

size_t dsv4_state_part_offset(const dsv4_state *s, int64_t n_pos, int layer)
{
    cursor cu = {NULL, NULL, header_bytes(s), (size_t)-1, false};
    walk_range(&cu, true, s, n_pos, 0, layer);
    return cu.at;
}

ds4_status dsv4_state_snapshot_header(const dsv4_state *s, void *buf, size_t len)
{
    cursor cu = {buf, NULL, 0, len, false};
    uint32_t h[16 + DSV4_MAX_LAYERS];
    int n = header_words(s, s->n_pos, h);
    put(&cu, SNAP_MAGIC, 8);
    put(&cu, h, (size_t)n * 4);
    if (cu.bad) return ds4_fail(DS4_ERR_INVALID, "snapshot: buffer of %zu bytes too small", len);
    return DS4_OK;
}

ds4_status dsv4_state_snapshot_part(const dsv4_state *s, void *buf, size_t len)
{
    const dsv4_model *m = s->m;
    size_t want = dsv4_state_part_offset(s, s->n_pos, m->layer_hi) - dsv4_state_part_offset(s, s->n_pos, m->layer_lo);
    if (len != want)
        return ds4_fail(DS4_ERR_INVALID, "snapshot: layers %d:%d take %zu bytes, not %zu", m->layer_lo, m->layer_hi,
                        want, len);
    cursor cu = {buf, NULL, 0, len, false};
    walk_range(&cu, true, s, s->n_pos, m->layer_lo, m->layer_hi);
    return DS4_OK;
}

ds4_status dsv4_state_snapshot(const dsv4_state *s, void *buf, size_t len)
{
    if (!dsv4_model_is_whole(s->m))
        return ds4_fail(DS4_ERR_INVALID, "snapshot: the state holds layers %d:%d only (a pipeline stage)",
                        s->m->layer_lo, s->m->layer_hi);
    cursor cu = {buf, NULL, 0, len, false};
    uint32_t h[16 + DSV4_MAX_LAYERS];
    int n = header_words(s, s->n_pos, h);
    put(&cu, SNAP_MAGIC, 8);
    put(&cu, h, (size_t)n * 4);
    walk_layers(&cu, true, s, s->n_pos);
    if (cu.bad) return ds4_fail(DS4_ERR_INVALID, "snapshot: buffer of %zu bytes too small", len);
    return DS4_OK;
}

ds4_status dsv4_state_restore_check(const dsv4_state *s, const void *buf, size_t len, int64_t *n_pos_out)
{
    cursor cu = {NULL, buf, 0, len, false};
    char magic[8];
    get(&cu, magic, 8);
    if (cu.bad || memcmp(magic, SNAP_MAGIC, 8) != 0)
        return ds4_fail(DS4_ERR_FORMAT, "snapshot: bad magic (not a DwarfStar session snapshot)");
    uint32_t want[16 + DSV4_MAX_LAYERS], got[16 + DSV4_MAX_LAYERS];
    get(&cu, got, 4 * 4);
    if (cu.bad) return ds4_fail(DS4_ERR_FORMAT, "snapshot: truncated header (%zu bytes)", len);
    if (got[0] != SNAP_VERSION)
        return ds4_fail(DS4_ERR_UNSUPPORTED, "snapshot: version %u (this build reads %u)", got[0], SNAP_VERSION);
    int64_t n_pos = (int64_t)((uint64_t)got[2] | ((uint64_t)got[3] << 32));
    int n = header_words(s, n_pos, want);
    get(&cu, got + 4, (size_t)(n - 4) * 4);
    if (cu.bad) return ds4_fail(DS4_ERR_FORMAT, "snapshot: truncated header (%zu bytes)", len);
    if (got[1] != want[1])
        return ds4_fail(DS4_ERR_INVALID, "snapshot: numerics flags %u differ from this session's %u", got[1], want[1]);
    for (int i = 4; i < n; i++)
        if (got[i] != want[i])
            return ds4_fail(DS4_ERR_INVALID, "snapshot: model shape differs (header word %d is %u, this model has %u)", i,
                            got[i], want[i]);
    if (n_pos < 0 || n_pos > s->n_ctx)
        return ds4_fail(DS4_ERR_INVALID, "snapshot: %lld positions do not fit a context of %lld", (long long)n_pos,
                        (long long)s->n_ctx);
    /* check the exact size before touching the state */
    cursor probe = {NULL, NULL, cu.at, (size_t)-1, false};
    walk_layers(&probe, true, s, n_pos);
    if (probe.at != len)
        return ds4_fail(DS4_ERR_FORMAT, "snapshot: %zu bytes, expected %zu for %lld positions", len, probe.at,
                        (long long)n_pos);
    /* Every value after the header is a float of the state. A NaN or +inf
     * (a corrupt or forged file whose checksum was recomputed) would
     * poison every later step, so it is refused here and the caller
     * prefills instead; -inf is legitimate (the compressor's empty gate). */
    for (size_t at = cu.at; at + 4 <= len; at += 4) {
        float v;
        memcpy(&v, (const uint8_t *)buf + at, 4);
        if (isnan(v) || v == INFINITY)
            return ds4_fail(DS4_ERR_INVALID, "snapshot: value at byte %zu is %s", at, isnan(v) ? "NaN" : "+inf");
    }
    *n_pos_out = n_pos;
    return DS4_OK;
}

ds4_status dsv4_state_restore_part(dsv4_state *s, const void *buf, size_t len, int64_t n_pos)
{
    const dsv4_model *m = s->m;
    if (n_pos < 0 || n_pos > s->n_ctx)
        return ds4_fail(DS4_ERR_INVALID, "snapshot: %lld positions do not fit a context of %lld", (long long)n_pos,
                        (long long)s->n_ctx);
    size_t want = dsv4_state_part_offset(s, n_pos, m->layer_hi) - dsv4_state_part_offset(s, n_pos, m->layer_lo);
    if (len != want)
        return ds4_fail(DS4_ERR_FORMAT, "snapshot: layers %d:%d at %lld positions take %zu bytes, not %zu",
                        m->layer_lo, m->layer_hi, (long long)n_pos, want, len);
    cursor cu = {NULL, buf, 0, len, false};
    dsv4_state_reset(s);
    walk_range(&cu, false, s, n_pos, m->layer_lo, m->layer_hi);
    if (cu.bad) return ds4_fail(DS4_ERR_FORMAT, "snapshot: truncated");
    s->n_pos = n_pos;
    return DS4_OK;
}

ds4_status dsv4_state_restore(dsv4_state *s, const void *buf, size_t len)
{
    if (!dsv4_model_is_whole(s->m))
        return ds4_fail(DS4_ERR_INVALID, "snapshot: the state holds layers %d:%d only (a pipeline stage)",
                        s->m->layer_lo, s->m->layer_hi);
    int64_t n_pos;
    ds4_status st = dsv4_state_restore_check(s, buf, len, &n_pos);
    if (st != DS4_OK) return st;
    size_t head = header_bytes(s);
    return dsv4_state_restore_part(s, (const uint8_t *)buf + head, len - head, n_pos);
}

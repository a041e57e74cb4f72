/*
 * dsv4_shard.c - a tensor-parallel rank's view of a whole model
 * (dsv4_model.h, docs/TENSOR-PARALLEL.md).
 *
 * Most slices are views: a weight is row-major (ne[0] contiguous), so a
 * range of its rows (heads of q_b, groups of o_a, hidden units of the
 * shared gate/up, vocabulary rows of the head) or of its experts (the
 * third axis of the routed tensors) is a pointer offset into the mapping.
 * A range of columns is not contiguous: the attention output o_b and the
 * shared expert's down projection, which consume the rank's part of the
 * hidden vector, are copied row by row (whole quantization blocks), a
 * 1/size share of two small tensors per layer.
 *
 * A split is taken only where the shapes allow it on every rank: heads by
 * whole output groups (size divides o_groups) with o_lora a multiple of
 * o_b's block, shared hidden units in whole blocks of down's type, the
 * vocabulary only when size divides it. Otherwise that part is
 * replicated: every rank attends with all heads (no all-reduce after the
 * attention), rank 0 alone runs the shared expert or the head.
 */
#include "model/dsv4_model.h"

#include "quant/quant.h"
#include "util/error.h"

#include <stdlib.h>
#include <string.h>

static void *keep(dsv4_model *v, size_t bytes)
{
    if (v->n_owned == v->cap_owned) {
        int cap = v->cap_owned ? 2 * v->cap_owned : 64;
        float **p = realloc(v->owned, (size_t)cap * sizeof *p);
        if (!p) return NULL;
        v->owned = p;
        v->cap_owned = cap;
    }
    void *b = malloc(bytes ? bytes : 1);
    if (b) v->owned[v->n_owned++] = b;
    return b;
}

/* Rows [r0, r1) of a matrix (ne[1] rows; a 1-D tensor: elements). */
static void rows_view(ds4_weight *w, int64_t r0, int64_t r1)
{
    int64_t rows = w->n_dims == 1 ? w->ne[0] : w->ne[1];
    uint64_t rb = w->nbytes / (uint64_t)rows;
    w->data = (const char *)w->data + (uint64_t)r0 * rb;
    w->nbytes = (uint64_t)(r1 - r0) * rb;
    if (w->n_dims == 1) w->ne[0] = r1 - r0;
    else w->ne[1] = r1 - r0;
}

/* Experts [e0, e1) of a [D, F, E] tensor. */
static void experts_view(ds4_weight *w, int64_t e0, int64_t e1)
{
    uint64_t eb = w->nbytes / (uint64_t)w->ne[2];
    w->data = (const char *)w->data + (uint64_t)e0 * eb;
    w->nbytes = (uint64_t)(e1 - e0) * eb;
    w->ne[2] = e1 - e0;
}

/* Columns [c0, c1) of a matrix, copied (c0, c1 on block boundaries). */
static ds4_status cols_copy(dsv4_model *v, ds4_weight *w, int64_t c0, int64_t c1)
{
    int64_t rb = ds4_row_bytes(w->type, w->ne[0]), skip = ds4_row_bytes(w->type, c0),
            nb = ds4_row_bytes(w->type, c1 - c0);
    if (rb < 0 || skip < 0 || nb < 0) return DS4_ERR_INVALID; /* not on a block boundary: message set */
    char *dst = keep(v, (size_t)nb * (size_t)w->ne[1]);
    if (!dst) return ds4_fail(DS4_ERR_NOMEM, "tensor parallel: out of memory for a slice of %s", w->name);
    for (int64_t r = 0; r < w->ne[1]; r++)
        memcpy(dst + (size_t)r * (size_t)nb, (const char *)w->data + (size_t)r * (size_t)rb + (size_t)skip, (size_t)nb);
    w->data = dst;
    w->ne[0] = c1 - c0;
    w->nbytes = (uint64_t)nb * (uint64_t)w->ne[1];
    return DS4_OK;
}

/* Whether [0, n) cut in `size` equal parts falls on blocks of `type`. */
static bool splits(ds4_type type, int64_t n, int size)
{
    const ds4_type_info *ti = ds4_type_get(type);
    return ti && n % size == 0 && (n / size) % ti->block_elems == 0;
}

/* The parts every rank splits the same way, from the first layer's shapes
 * and types (the binding checked that every layer has the same shapes). */
static void choose(dsv4_model *v, const dsv4_model *m, int size)
{
    const dsv4_config *c = &m->cfg;
    const dsv4_layer *L = &m->layers[0];
    v->tp_attn = c->o_groups % size == 0 && splits(L->o_b.type, (int64_t)c->o_groups * c->o_lora, size) &&
                 splits(L->o_b.type, c->o_lora, 1);
    v->tp_shared = splits(L->down_sh.type, L->down_sh.ne[0], size);
    v->tp_vocab = c->n_vocab % size == 0;
    for (int il = 1; il < c->n_layer; il++) {
        const dsv4_layer *l = &m->layers[il];
        v->tp_attn &= l->o_b.type == L->o_b.type;
        v->tp_shared &= l->down_sh.type == L->down_sh.type && l->down_sh.ne[0] == L->down_sh.ne[0];
    }
}

static ds4_status shard_layer(dsv4_model *v, dsv4_layer *L, int rank, int size)
{
    const dsv4_config *c = &v->cfg;
    if (v->tp_attn) {
        int64_t Hr = c->n_head / size, Gr = c->o_groups / size, D = c->head_dim, OL = c->o_lora;
        rows_view(&L->q_b, rank * Hr * D, (rank + 1) * Hr * D);
        rows_view(&L->sinks, rank * Hr, (rank + 1) * Hr);
        rows_view(&L->o_a, rank * Gr * OL, (rank + 1) * Gr * OL);
        ds4_status st = cols_copy(v, &L->o_b, rank * Gr * OL, (rank + 1) * Gr * OL);
        if (st != DS4_OK) return st;
    }
    if (v->tp_shared) {
        int64_t Fr = L->gate_sh.ne[1] / size;
        rows_view(&L->gate_sh, rank * Fr, (rank + 1) * Fr);
        rows_view(&L->up_sh, rank * Fr, (rank + 1) * Fr);
        ds4_status st = cols_copy(v, &L->down_sh, rank * Fr, (rank + 1) * Fr);
        if (st != DS4_OK) return st;
    }
    experts_view(&L->gate_exps, v->tp_e_lo, v->tp_e_hi);
    experts_view(&L->up_exps, v->tp_e_lo, v->tp_e_hi);
    experts_view(&L->down_exps, v->tp_e_lo, v->tp_e_hi);
    return DS4_OK;
}

dsv4_model *dsv4_model_shard(const dsv4_model *m, int rank, int size)
{
    if (size < 2 || size > 64 || rank < 0 || rank >= size) {
        ds4_fail(DS4_ERR_INVALID, "tensor parallel: rank %d of %d (2..64 ranks)", rank, size);
        return NULL;
    }
    if (!dsv4_model_is_whole(m) || dsv4_model_tp(m)) {
        ds4_fail(DS4_ERR_UNSUPPORTED, "tensor parallel: the model must be whole (not a pipeline stage or a view)");
        return NULL;
    }
    if (m->cfg.n_expert < size) {
        ds4_fail(DS4_ERR_UNSUPPORTED, "tensor parallel: %d ranks but the model has %d routed experts per layer",
                 size, m->cfg.n_expert);
        return NULL;
    }
    dsv4_model *v = malloc(sizeof *v);
    if (!v) {
        ds4_fail(DS4_ERR_NOMEM, "tensor parallel: out of memory");
        return NULL;
    }
    *v = *m;
    v->owned = NULL;
    v->n_owned = v->cap_owned = 0;
    v->mtp = NULL;
    /* selections are counted once, on rank 0, before its experts are picked */
    if (rank) v->expert_counts = NULL;
    v->tp_rank = rank;
    v->tp_size = size;
    v->tp_e_lo = (int)((int64_t)m->cfg.n_expert * rank / size);
    v->tp_e_hi = (int)((int64_t)m->cfg.n_expert * (rank + 1) / size);
    choose(v, m, size);
    v->layers = malloc((size_t)m->cfg.n_layer * sizeof *v->layers);
    ds4_status st = v->layers ? DS4_OK : ds4_fail(DS4_ERR_NOMEM, "tensor parallel: out of memory");
    if (st == DS4_OK) memcpy(v->layers, m->layers, (size_t)m->cfg.n_layer * sizeof *v->layers);
    for (int il = 0; il < m->cfg.n_layer && st == DS4_OK; il++) st = shard_layer(v, &v->layers[il], rank, size);
    if (st == DS4_OK && v->tp_vocab) {
        int64_t Vr = m->cfg.n_vocab / size;
        rows_view(&v->output, rank * Vr, (rank + 1) * Vr);
    }
    if (st != DS4_OK) {
        ds4_error_prefix("tensor parallel rank %d of %d: ", rank, size);
        dsv4_model_shard_free(v);
        return NULL;
    }
    return v;
}

void dsv4_model_shard_free(dsv4_model *v)
{
    if (!v) return;
    for (int i = 0; i < v->n_owned; i++) free(v->owned[i]);
    free(v->owned);
    free(v->layers);
    free(v); /* the gguf, the small f32 arrays and the MTP block are the base model's */
}

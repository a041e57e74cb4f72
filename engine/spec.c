/*
 * spec.c - speculative decoding with the model's MTP block
 * (docs/MODEL.md "Speculative decoding").
 *
 * The MTP block trails the main model by one position: after the main
 * model has fed position P-1 it holds h_{P-1} (its final mHC state), and
 * once token x_P is chosen the pair (h_{P-1}, x_P) is the MTP block's row
 * P-1, whose logits draft x_{P+1}. Further drafts chain on the block's
 * own output state. The main model then feeds [x_P, d_1 .. d_N] as one
 * chunk and the longest prefix of drafts that the main model's own choice
 * confirms is kept, plus the main model's token after it. A rejection
 * takes the chunk back and feeds the accepted tokens again, so the state
 * is exactly that of never having seen the rejected ones. Taking it back
 * uses an undo record of what the chunk overwrites (model/dsv4_undo.h:
 * the ring and pending-window slots of its positions, the CSA prev
 * windows), saved before the chunk; the older scheme, a full snapshot of
 * the state, stays selectable (ds4_session_spec_full_snapshot) so
 * ds4-bench can compare the two in one run. The MTP state is marked the
 * same way before drafting, taken back after the verify, and then fed the
 * true pairs of the kept positions.
 *
 * A caller that stops inside the kept tokens (a stop string, a tool call
 * that ended) trims the step to fewer tokens (ds4_session_spec_trim), so
 * the session again holds exactly what was emitted.
 */
#include "include/ds4.h"
#include "include/ds4_sampler.h"

#include "engine/model_access.h"
#include "engine/session_access.h"
#include "model/dsv4_mtp.h"
#include "model/dsv4_undo.h"
#include "util/error.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    dsv4_mtp_state *ms;
    int n_draft;
    int HC, E, V;
    float *h;      /* host [max_chunk, HC, E]: main rows of the last forward */
    float *pend;   /* host [HC, E]: h of the last position the main model fed */
    bool have_pend;
    float *hout;   /* host [n_draft + 1, HC, E]: MTP output states */
    float *qlog;   /* host [n_draft, V]: draft logits */
    float *vlog;   /* host [n_draft + 1, V]: verify logits */
    double *pp, *qq; /* host [V] distributions (sampling) */
    double *qd;    /* host [n_draft, V] draft distributions (sampling) */
    /* the marks before a step: an undo record (or, full_snap, a snapshot)
     * of the main state and of the MTP state */
    void *snap, *msnap;
    size_t snap_cap, msnap_cap, snap_len, msnap_len;
    bool full_snap;
    float *pend0;  /* host [HC, E]: pend before the step */
    float *pairs;  /* host [n_draft + 1, HC, E]: rows fed to the MTP after a verify */
    int32_t last_chunk[17];
    int last_fed;  /* tokens the last step left fed (0: no step to trim) */
    bool inside; /* a verify chunk is being fed: the prefill hook stays out */
    int32_t (*hook)(void *ctx, int64_t pos, int32_t draft); /* tests: replace drafts */
    void *bsnap;   /* ds4_session_spec_mark: the MTP state and pending h */
    size_t bsnap_cap, bsnap_len;
    float *bpend;
    bool bhave;
    void *hook_ctx;
    ds4_spec_stats stats;
} spec_state;

ds4_status ds4_model_load_mtp(ds4_model *m, const char *path)
{
    if (path && !strcmp(path, "auto")) path = NULL;
    dsv4_model *dm = (dsv4_model *)ds4_model_dsv4(m);
    /* the block needs the last layer's state and the head, which a
     * distributed run keeps on another rank */
    if (!dsv4_model_is_whole(dm))
        return ds4_fail(DS4_ERR_UNSUPPORTED, "mtp: not available in a distributed run (this process holds layers %d:%d)",
                        dm->layer_lo, dm->layer_hi);
    return dsv4_mtp_load(dm, path);
}

int ds4_model_has_mtp(const ds4_model *m) { return ds4_model_dsv4(m)->mtp != NULL; }

void ds4_session_spec_free(void *p)
{
    spec_state *sp = p;
    if (!sp) return;
    dsv4_mtp_state_free(sp->ms);
    free(sp->h), free(sp->pend), free(sp->pend0), free(sp->pairs), free(sp->hout), free(sp->qlog), free(sp->vlog);
    free(sp->pp), free(sp->qq), free(sp->qd), free(sp->snap), free(sp->msnap), free(sp->bsnap), free(sp->bpend);
    free(sp);
}

typedef struct {
    ds4_backend *be;
    ds4_status st;
} prep;

static void prep_one(void *ctx, const ds4_weight *w)
{
    prep *p = ctx;
    if (p->st == DS4_OK) p->st = p->be->weight_prepare(p->be, w);
}

ds4_status ds4_session_set_mtp(ds4_session *s, int n_draft)
{
    spec_state **slot = (spec_state **)ds4_session_spec_slot(s);
    dsv4_state *st = ds4_session_dsv4(s);
    if (n_draft == 0) {
        ds4_session_spec_free(*slot);
        *slot = NULL;
        return DS4_OK;
    }
    if (n_draft < 1 || n_draft > 16) return ds4_fail(DS4_ERR_INVALID, "mtp: %d draft tokens (1..16)", n_draft);
    if (n_draft + 1 > st->max_chunk)
        return ds4_fail(DS4_ERR_INVALID, "mtp: %d drafts need chunks of %d tokens, the session's max is %d", n_draft,
                        n_draft + 1, st->max_chunk);
    const dsv4_model *m = st->m;
    if (dsv4_model_tp(m))
        return ds4_fail(DS4_ERR_UNSUPPORTED, "mtp: speculative decoding does not run with tensor parallel yet (the "
                                             "MTP block is not split over the ranks)");
    if (!m->mtp) return ds4_fail(DS4_ERR_NOT_FOUND, "mtp: this model has no MTP block loaded (--mtp FILE|auto)");
    ds4_session_spec_free(*slot);
    *slot = NULL;
    spec_state *sp = calloc(1, sizeof *sp);
    if (!sp) return ds4_fail(DS4_ERR_NOMEM, "mtp: out of memory");
    sp->n_draft = n_draft;
    sp->HC = m->cfg.n_hc, sp->E = m->cfg.n_embd, sp->V = m->cfg.n_vocab;
    size_t row = (size_t)sp->HC * sp->E, V = (size_t)sp->V;
    prep pc = {st->be, DS4_OK};
    dsv4_mtp_for_each_weight(m->mtp, prep_one, &pc);
    ds4_status rc = pc.st;
    if (rc == DS4_OK) rc = dsv4_mtp_state_create(m->mtp, st->be, st->n_ctx, st->max_chunk, &st->nm, &sp->ms);
    sp->h = malloc((size_t)st->max_chunk * row * sizeof(float));
    sp->pend = malloc(row * sizeof(float));
    sp->bpend = malloc(row * sizeof(float));
    sp->pend0 = malloc(row * sizeof(float));
    sp->pairs = malloc((size_t)(n_draft + 1) * row * sizeof(float));
    sp->hout = malloc((size_t)(n_draft + 1) * row * sizeof(float));
    sp->qlog = malloc((size_t)n_draft * V * sizeof(float));
    sp->vlog = malloc((size_t)(n_draft + 1) * V * sizeof(float));
    sp->pp = malloc(V * sizeof(double));
    sp->qq = malloc(V * sizeof(double));
    sp->qd = malloc((size_t)n_draft * V * sizeof(double));
    if (rc == DS4_OK && (!sp->h || !sp->pend || !sp->bpend || !sp->pend0 || !sp->pairs || !sp->hout || !sp->qlog || !sp->vlog || !sp->pp || !sp->qq || !sp->qd))
        rc = ds4_fail(DS4_ERR_NOMEM, "mtp: out of memory");
    if (rc != DS4_OK) {
        ds4_session_spec_free(sp);
        return rc;
    }
    *slot = sp;
    return DS4_OK;
}

void ds4_session_spec_stats(ds4_session *s, ds4_spec_stats *out)
{
    spec_state *sp = *(spec_state **)ds4_session_spec_slot(s);
    if (sp) *out = sp->stats;
    else memset(out, 0, sizeof *out);
}

void ds4_session_spec_draft_hook(ds4_session *s, int32_t (*fn)(void *ctx, int64_t pos, int32_t draft), void *ctx)
{
    spec_state *sp = *(spec_state **)ds4_session_spec_slot(s);
    if (!sp) return;
    sp->hook = fn;
    sp->hook_ctx = ctx;
}

void ds4_session_spec_reset(void *p)
{
    spec_state *sp = p;
    if (!sp) return;
    dsv4_state_reset(sp->ms->st);
    sp->have_pend = false;
}

/* Feed the MTP block the pairs that the main model's last forward made
 * known: (pending h, tokens[0]), (h[0], tokens[1]), ..., and keep h[T-1]
 * pending for the token that will follow it. */
static ds4_status mtp_catch_up(spec_state *sp, const float *h, const int32_t *tokens, int T)
{
    size_t row = (size_t)sp->HC * sp->E;
    dsv4_state *ms = sp->ms->st;
    /* rows for the MTP: pending + the first T-1 of h */
    float *buf = malloc((size_t)T * row * sizeof(float));
    if (!buf) return ds4_fail(DS4_ERR_NOMEM, "mtp: out of memory");
    int n = 0, t0 = 0;
    if (sp->have_pend) {
        memcpy(buf, sp->pend, row * sizeof(float));
        n = 1;
    } else {
        t0 = 1; /* the first token has no h before it (a fresh state) */
    }
    if (T > 1) memcpy(buf + (size_t)n * row, h, (size_t)(T - 1) * row * sizeof(float));
    n += T - 1;
    ds4_status st = DS4_OK;
    /* the MTP ring is bounded by n_ctx like the main one */
    if (n > 0 && ms->n_pos + n <= ms->n_ctx) st = dsv4_mtp_forward(sp->ms, buf, tokens + t0, n, NULL, NULL);
    free(buf);
    memcpy(sp->pend, h + (size_t)(T - 1) * row, row * sizeof(float));
    sp->have_pend = true;
    return st;
}

ds4_status ds4_session_spec_after_forward(ds4_session *s, const int32_t *tokens, int T)
{
    spec_state *sp = *(spec_state **)ds4_session_spec_slot(s);
    if (!sp || sp->inside) return DS4_OK;
    dsv4_state *st = ds4_session_dsv4(s);
    size_t row = (size_t)sp->HC * sp->E;
    st->be->download(st->be, sp->h, st->X, (size_t)T * row * sizeof(float));
    return mtp_catch_up(sp, sp->h, tokens, T);
}

static ds4_status snap(dsv4_state *st, void **buf, size_t *cap, size_t *len)
{
    size_t n = dsv4_state_snapshot_size(st);
    *len = n;
    if (n > *cap) {
        void *b = realloc(*buf, n);
        if (!b) return ds4_fail(DS4_ERR_NOMEM, "mtp: out of memory for a %zu-byte snapshot", n);
        *buf = b;
        *cap = n;
    }
    return dsv4_state_snapshot(st, *buf, n);
}

static ds4_status unsnap(dsv4_state *st, const void *buf, size_t len) { return dsv4_state_restore(st, buf, len); }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The mark before a chunk of up to T tokens: an undo record, or in the
 * older scheme a full snapshot (T unused). Both are timed (the stats'
 * rollback_s: what ds4-bench compares). */
static ds4_status mark_(spec_state *sp, dsv4_state *st, int T, void **buf, size_t *cap, size_t *len)
{
    if (sp->full_snap) return snap(st, buf, cap, len);
    size_t n = dsv4_undo_size(st, T);
    *len = n;
    if (n > *cap) {
        void *b = realloc(*buf, n);
        if (!b) return ds4_fail(DS4_ERR_NOMEM, "mtp: out of memory for a %zu-byte undo record", n);
        *buf = b;
        *cap = n;
    }
    return dsv4_undo_save(st, T, *buf, n);
}

static ds4_status mark(spec_state *sp, dsv4_state *st, int T, void **buf, size_t *cap, size_t *len)
{
    double t0 = now_s();
    ds4_status rc = mark_(sp, st, T, buf, cap, len);
    sp->stats.rollback_s += now_s() - t0;
    return rc;
}

static ds4_status back(spec_state *sp, dsv4_state *st, const void *buf, size_t len)
{
    double t0 = now_s();
    ds4_status rc = sp->full_snap ? unsnap(st, buf, len) : dsv4_undo_restore(st, buf, len);
    sp->stats.rollback_s += now_s() - t0;
    return rc;
}

/* A draft from MTP logits: argmax, or a draw from the sampler's
 * distribution (kept in qd for the acceptance test). */
static int32_t draft_pick(spec_state *sp, const float *logits, const ds4_sampler_params *sa, ds4_rng *rng, double *qd)
{
    if (!sa || sa->temperature <= 0) return ds4_argmax(logits, sp->V);
    if (ds4_sampler_probs(sa, logits, sp->V, qd) < 0) return ds4_argmax(logits, sp->V);
    return ds4_spec_draw(qd, sp->V, rng);
}

/* The MTP block (taken back to its mark) learns the true pairs of the
 * first n fed positions: (pend0, chunk[0]), (h[0], chunk[1]), ...; then
 * h[n-1] is pending. */
static ds4_status mtp_true_pairs(spec_state *sp, const int32_t *chunk, int n)
{
    size_t row = (size_t)sp->HC * sp->E;
    ds4_status rc = back(sp, sp->ms->st, sp->msnap, sp->msnap_len);
    if (rc != DS4_OK) return rc;
    memcpy(sp->pairs, sp->pend0, row * sizeof(float));
    if (n > 1) memcpy(sp->pairs + row, sp->h, (size_t)(n - 1) * row * sizeof(float));
    dsv4_state *ms = sp->ms->st;
    if (ms->n_pos + n <= ms->n_ctx) rc = dsv4_mtp_forward(sp->ms, sp->pairs, chunk, n, NULL, NULL);
    memcpy(sp->pend, sp->h + (size_t)(n - 1) * row, row * sizeof(float));
    sp->have_pend = true;
    return rc;
}

ds4_status ds4_session_decode_spec(ds4_session *s, int32_t token, const ds4_sampler_params *sa, ds4_rng *rng,
                                   int32_t stop, int max_out, int32_t *out, int *n_out)
{
    spec_state *sp = *(spec_state **)ds4_session_spec_slot(s);
    dsv4_state *st = ds4_session_dsv4(s);
    *n_out = 0;
    if (!sp) return ds4_fail(DS4_ERR_INVALID, "mtp: speculation is off for this session (ds4_session_set_mtp)");
    /* logits a greedy pick left in the state's buffer come home before the
     * verify overwrites it: a step that fails on the way keeps them */
    ds4_session_logits_home(s);
    sp->last_fed = 0;
    if (sa && sa->temperature > 0 && !rng) return ds4_fail(DS4_ERR_INVALID, "mtp: sampling needs an rng");
    const int V = sp->V;
    const size_t row = (size_t)sp->HC * sp->E;
    int N = sp->n_draft;
    if (max_out < 1) return ds4_fail(DS4_ERR_INVALID, "mtp: room for %d tokens (at least 1)", max_out);
    if (N > max_out - 1) N = max_out - 1; /* never feed more than the caller may emit */
    /* room for the chunk in both contexts; else a plain step */
    if (!sp->have_pend || st->n_pos + N + 1 > st->n_ctx || sp->ms->st->n_pos + N + 1 > sp->ms->st->n_ctx) N = 0;
    int32_t *chunk = sp->last_chunk;
    chunk[0] = token;
    ds4_status rc = DS4_OK;
    if (N > 0) {
        /* the MTP state is marked for its N draft rows and the k + 1 true
         * pairs after the verify (both start at its position now) */
        if ((rc = mark(sp, sp->ms->st, N + 1, &sp->msnap, &sp->msnap_cap, &sp->msnap_len)) != DS4_OK) return rc;
        memcpy(sp->pend0, sp->pend, row * sizeof(float));
        /* draft 1 from the true pair (h_{P-1}, x_P) */
        rc = dsv4_mtp_forward(sp->ms, sp->pend, &token, 1, sp->qlog, sp->hout);
        if (rc != DS4_OK) return rc;
        sp->have_pend = false;
        chunk[1] = draft_pick(sp, sp->qlog, sa, rng, sp->qd);
        if (sp->hook) chunk[1] = sp->hook(sp->hook_ctx, st->n_pos + 1, chunk[1]);
        /* drafts 2..N chain on the block's own state */
        for (int i = 1; i < N; i++) {
            rc = dsv4_mtp_forward(sp->ms, sp->hout + (size_t)(i - 1) * row, &chunk[i], 1, sp->qlog + (size_t)i * V,
                                  sp->hout + (size_t)i * row);
            if (rc != DS4_OK) return rc;
            chunk[i + 1] = draft_pick(sp, sp->qlog + (size_t)i * V, sa, rng, sp->qd + (size_t)i * V);
            if (sp->hook) chunk[i + 1] = sp->hook(sp->hook_ctx, st->n_pos + 1 + i, chunk[i + 1]);
        }
        if ((rc = mark(sp, st, N + 1, &sp->snap, &sp->snap_cap, &sp->snap_len)) != DS4_OK) return rc;
    }
    /* verify: the main model feeds x_P and the drafts as one chunk */
    sp->inside = true;
    rc = dsv4_forward(st, chunk, N + 1, true, sp->vlog);
    sp->inside = false;
    if (rc == DS4_OK) rc = ds4_session_stream_error(s);
    if (rc != DS4_OK) {
        ds4_session_set_have_logits(s, false);
        return rc;
    }
    st->be->download(st->be, sp->h, st->X, (size_t)(N + 1) * row * sizeof(float));
    /* the longest confirmed prefix, then the main model's own next token */
    int k = 0;
    int32_t next = -1;
    bool greedy = !sa || sa->temperature <= 0;
    for (; k < N; k++) {
        const float *L = sp->vlog + (size_t)k * V;
        if (greedy) {
            int32_t g = ds4_argmax(L, V);
            /* a confirmed stop token ends the run unfed, as plain decoding would */
            if (g != chunk[k + 1] || g == stop) {
                next = g;
                break;
            }
        } else {
            bool acc = false;
            if (ds4_sampler_probs(sa, L, V, sp->pp) < 0) return ds4_fail(DS4_ERR_INVALID, "mtp: no usable logit");
            next = ds4_spec_accept(sp->pp, sp->qd + (size_t)k * V, V, chunk[k + 1], rng, &acc);
            if (!acc || next == stop) break;
            next = -1;
        }
    }
    if (next < 0) { /* every draft confirmed (or none made): the token after them */
        const float *L = sp->vlog + (size_t)k * V;
        if (greedy) next = ds4_argmax(L, V);
        else if (ds4_sampler_probs(sa, L, V, sp->pp) < 0) return ds4_fail(DS4_ERR_INVALID, "mtp: no usable logit");
        else next = ds4_spec_draw(sp->pp, V, rng);
    }
    sp->stats.steps++;
    sp->stats.drafted += (uint64_t)N;
    sp->stats.accepted += (uint64_t)k;
    if (k < N) {
        /* exact rollback: the state before the chunk, then the kept tokens */
        if ((rc = back(sp, st, sp->snap, sp->snap_len)) != DS4_OK) return rc;
        sp->inside = true;
        rc = dsv4_forward(st, chunk, k + 1, false, NULL);
        sp->inside = false;
        if (rc != DS4_OK) return rc;
    }
    memcpy(ds4_session_logits_buffer(s), sp->vlog + (size_t)k * V, (size_t)V * sizeof(float));
    ds4_session_set_have_logits(s, true);
    if (N > 0) rc = mtp_true_pairs(sp, chunk, k + 1);
    else rc = mtp_catch_up(sp, sp->h, chunk, 1);
    if (rc != DS4_OK) return rc;
    sp->last_fed = k + 1;
    for (int i = 0; i < k; i++) out[i] = chunk[i + 1];
    out[k] = next;
    *n_out = k + 1;
    return DS4_OK;
}

ds4_status ds4_session_spec_trim(ds4_session *s, int keep)
{
    spec_state *sp = *(spec_state **)ds4_session_spec_slot(s);
    if (!sp || sp->last_fed == 0) return ds4_fail(DS4_ERR_INVALID, "mtp trim: no speculative step to trim");
    if (keep < 1 || keep > sp->last_fed)
        return ds4_fail(DS4_ERR_INVALID, "mtp trim: keep %d of the %d tokens the step fed", keep, sp->last_fed);
    if (keep == sp->last_fed) return DS4_OK;
    /* keep < last_fed means the step drafted, so both marks are set */
    dsv4_state *st = ds4_session_dsv4(s);
    const int V = sp->V;
    sp->last_fed = 0;
    ds4_status rc = back(sp, st, sp->snap, sp->snap_len);
    sp->inside = true;
    if (rc == DS4_OK) rc = dsv4_forward(st, sp->last_chunk, keep, false, NULL);
    sp->inside = false;
    if (rc == DS4_OK) rc = ds4_session_stream_error(s);
    if (rc != DS4_OK) {
        ds4_session_set_have_logits(s, false);
        return rc;
    }
    /* the verify's rows are those of any shorter chunk (causal): its
     * logits and states stand for the refed tokens */
    memcpy(ds4_session_logits_buffer(s), sp->vlog + (size_t)(keep - 1) * V, (size_t)V * sizeof(float));
    ds4_session_set_have_logits(s, true);
    rc = mtp_true_pairs(sp, sp->last_chunk, keep);
    sp->last_fed = keep;
    return rc;
}

void ds4_session_spec_full_snapshot(ds4_session *s, int on)
{
    spec_state *sp = *(spec_state **)ds4_session_spec_slot(s);
    if (sp) sp->full_snap = on != 0;
}

void ds4_session_spec_pause(ds4_session *s, int paused)
{
    spec_state *sp = *(spec_state **)ds4_session_spec_slot(s);
    if (sp) sp->inside = paused != 0;
}

ds4_status ds4_session_spec_mark(ds4_session *s)
{
    spec_state *sp = *(spec_state **)ds4_session_spec_slot(s);
    if (!sp) return DS4_OK;
    ds4_status st = snap(sp->ms->st, &sp->bsnap, &sp->bsnap_cap, &sp->bsnap_len);
    if (st == DS4_OK) {
        memcpy(sp->bpend, sp->pend, (size_t)sp->HC * sp->E * sizeof(float));
        sp->bhave = sp->have_pend;
    }
    return st;
}

ds4_status ds4_session_spec_rewind(ds4_session *s)
{
    spec_state *sp = *(spec_state **)ds4_session_spec_slot(s);
    if (!sp || !sp->bsnap_len) return DS4_OK;
    ds4_status st = unsnap(sp->ms->st, sp->bsnap, sp->bsnap_len);
    if (st == DS4_OK) {
        memcpy(sp->pend, sp->bpend, (size_t)sp->HC * sp->E * sizeof(float));
        sp->have_pend = sp->bhave;
    }
    return st;
}

ds4_status ds4_session_hidden(ds4_session *s, int rows, float *out)
{
    dsv4_state *st = ds4_session_dsv4(s);
    if (rows < 1 || rows > st->max_chunk)
        return ds4_fail(DS4_ERR_INVALID, "hidden: %d rows (1..%d)", rows, st->max_chunk);
    size_t row = (size_t)st->m->cfg.n_hc * st->m->cfg.n_embd;
    st->be->download(st->be, out, st->X, (size_t)rows * row * sizeof(float));
    return DS4_OK;
}

int ds4_model_n_hc(const ds4_model *m) { return ds4_model_dsv4(m)->cfg.n_hc; }

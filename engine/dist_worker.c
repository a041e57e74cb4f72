/*
 * dist_worker.c - a rank other than 0 in a distributed run
 * (docs/DISTRIBUTED.md): it holds its stage (a contiguous range of layers)
 * of the model rank 0 opened and the KV state of those layers for each of
 * rank 0's sessions, and serves rank 0's commands until told to quit.
 *
 * It uses the engine's own public API on its stage (ds4_model_open and
 * ds4_session_create give it the same backend, numerics and checks as a
 * plain run; dist.h makes the model load only the stage), and runs its
 * layers of a chunk with dsv4_forward_stage.
 */
#include "engine/dist_mpi.h"
#include "engine/dist_proto.h"
#include "engine/session_access.h"
#include "include/ds4.h"
#include "util/error.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int sid;
    ds4_session *s;
} wsess;

typedef struct {
    int rank, n_rank;
    ds4_model *model;
    wsess *sess;
    int n_sess, cap_sess;
    void *in;          /* the message received */
    size_t in_cap, in_len;
    float *x, *xo, *lg; /* stream in / out, logits */
    size_t x_cap, xo_cap, lg_cap;
    uint8_t *out;
    size_t out_cap;
} worker;

static ds4_status ensure(void **p, size_t *cap, size_t n)
{
    if (*p && *cap >= n) return DS4_OK;
    void *q = realloc(*p, n ? n : 1);
    if (!q) return ds4_fail(DS4_ERR_NOMEM, "out of memory for %zu bytes", n);
    *p = q;
    *cap = n;
    return DS4_OK;
}

static wsess *find(worker *w, int sid)
{
    for (int i = 0; i < w->n_sess; i++)
        if (w->sess[i].sid == sid) return &w->sess[i];
    return NULL;
}

static void drop(worker *w, int sid)
{
    wsess *e = find(w, sid);
    if (!e) return;
    ds4_session_free(e->s);
    *e = w->sess[--w->n_sess];
}

static void close_model(worker *w)
{
    while (w->n_sess) drop(w, w->sess[0].sid);
    ds4_model_close(w->model);
    w->model = NULL;
}

/* Answer rank 0: the header (status) and an optional payload. */
static void reply(worker *w, dist_hdr *h, ds4_status st, const void *pay, size_t n, int tag)
{
    h->status = st;
    if (st != DS4_OK) {
        h->err_rank = w->rank;
        snprintf(h->msg, sizeof h->msg, "%s", ds4_last_error());
        n = 0;
    }
    if (ensure((void **)&w->out, &w->out_cap, sizeof *h + n) != DS4_OK) {
        n = 0; /* the header alone still goes */
        h->status = DS4_ERR_NOMEM;
    }
    memcpy(w->out, h, sizeof *h);
    if (n) memcpy(w->out + sizeof *h, pay, n);
    if (ds4_mpi_send(w->out, sizeof *h + n, 0, tag) != DS4_OK) {
        fprintf(stderr, "ds4: rank %d: %s\n", w->rank, ds4_last_error());
        ds4_mpi_abort(1);
    }
}

static ds4_status do_open(worker *w, const uint8_t *p, size_t n)
{
    if (w->model) close_model(w);
    if (n < 16) return ds4_fail(DS4_ERR_FORMAT, "short open command");
    uint64_t fp;
    int32_t nr[2];
    memcpy(&fp, p, 8);
    memcpy(nr, p + 8, 8);
    size_t ranges = (size_t)nr[0] * sizeof(ds4_dist_range);
    if (nr[0] != w->n_rank || n < 16 + ranges + 1 || p[n - 1] != 0)
        return ds4_fail(DS4_ERR_FORMAT, "malformed open command");
    ds4_dist_range mine;
    memcpy(&mine, p + 16 + (size_t)w->rank * sizeof mine, sizeof mine);
    /* a rank whose copy of the file lives elsewhere says where */
    const char *path = getenv("DS4_DIST_MODEL") ? getenv("DS4_DIST_MODEL") : (const char *)p + 16 + ranges;
    ds4_dist_model_info mi;
    ds4_status st = ds4_dist_model_info_read(path, &mi);
    if (st != DS4_OK) return st;
    if (mi.fingerprint != fp)
        return ds4_fail(DS4_ERR_INVALID,
                        "model file %s is not the one rank 0 opened (its tensor table differs: fingerprint "
                        "%016llx, rank 0 %016llx)",
                        path, (unsigned long long)mi.fingerprint, (unsigned long long)fp);
    ds4_dist_set_stage(mine);
    w->model = ds4_model_open(path, NULL);
    return w->model ? DS4_OK : DS4_ERR_IO;
}

static ds4_status do_new(worker *w, int sid, const uint8_t *p, size_t n)
{
    dist_new nw;
    if (!w->model) return ds4_fail(DS4_ERR_INVALID, "no model open");
    if (n != sizeof nw) return ds4_fail(DS4_ERR_FORMAT, "malformed session command");
    memcpy(&nw, p, sizeof nw);
    ds4_session_params sp;
    ds4_session_params_default(&sp);
    sp.n_ctx = nw.n_ctx;
    sp.numerics = (ds4_numerics)nw.numerics;
    sp.n_threads = nw.n_threads;
    sp.backend = (ds4_backend_kind)nw.backend;
    sp.max_chunk = nw.max_chunk;
    /* one GPU per rank: the ranks of a host take consecutive devices */
    sp.gpu_device = nw.gpu_device + ds4_mpi_local_rank();
    if (w->n_sess == w->cap_sess) {
        int cap = w->cap_sess ? 2 * w->cap_sess : 8;
        wsess *q = realloc(w->sess, (size_t)cap * sizeof *q);
        if (!q) return ds4_fail(DS4_ERR_NOMEM, "out of memory");
        w->sess = q;
        w->cap_sess = cap;
    }
    ds4_session *s = ds4_session_create(w->model, &sp);
    if (!s) return DS4_ERR_INVALID;
    w->sess[w->n_sess++] = (wsess){sid, s};
    return DS4_OK;
}

/* A chunk from the rank before: its layers, then on to the next rank, or
 * (last rank) the logits back to rank 0. A chunk that failed upstream
 * passes through untouched, so rank 0 hears of it from the last rank. */
static void do_fwd(worker *w)
{
    dist_hdr h;
    memcpy(&h, w->in, sizeof h);
    const bool last = w->rank == w->n_rank - 1;
    wsess *e = find(w, h.sid);
    dsv4_state *st = e ? ds4_session_dsv4(e->s) : NULL;
    const int T = h.T;
    size_t Wd = st ? (size_t)st->m->cfg.n_hc * st->m->cfg.n_embd : 0, V = st ? (size_t)st->m->cfg.n_vocab : 0;
    const uint8_t *tok = (const uint8_t *)w->in + sizeof h;
    ds4_status rc = (ds4_status)h.status;
    size_t want = sizeof h + (size_t)T * 4 + dist_stream_bytes(h.bits, (size_t)T * Wd);
    int rows = h.flags & DIST_WANT_ALL ? T : h.flags & DIST_WANT_LAST ? 1 : 0;
    if (rc == DS4_OK) {
        if (!st) rc = ds4_fail(DS4_ERR_INVALID, "no session %d here", h.sid);
        else if (T < 1 || T > st->max_chunk || w->in_len != want)
            rc = ds4_fail(DS4_ERR_FORMAT, "malformed chunk (%d tokens, %zu bytes)", T, w->in_len);
        else if (st->n_pos != h.pos0)
            rc = ds4_fail(DS4_ERR_INVALID, "session %d is at position %lld here, the chunk starts at %lld", h.sid,
                          (long long)st->n_pos, (long long)h.pos0);
        else if (ensure((void **)&w->x, &w->x_cap, (size_t)T * Wd * 4) != DS4_OK ||
                 ensure((void **)&w->xo, &w->xo_cap, (size_t)T * Wd * 4) != DS4_OK ||
                 ensure((void **)&w->lg, &w->lg_cap, (size_t)(rows ? rows : 1) * V * 4) != DS4_OK)
            rc = DS4_ERR_NOMEM;
        if (rc != DS4_OK) {
            h.err_rank = w->rank;
            snprintf(h.msg, sizeof h.msg, "%s", ds4_last_error());
        }
    }
    if (rc == DS4_OK) {
        int32_t *tokens = malloc((size_t)T * 4);
        if (!tokens) rc = ds4_fail(DS4_ERR_NOMEM, "out of memory");
        else {
            memcpy(tokens, tok, (size_t)T * 4);
            dist_stream_unpack(h.bits, tok + (size_t)T * 4, (size_t)T * Wd, w->x);
            rc = dsv4_forward_stage(st, tokens, T, w->x, last ? NULL : w->xo, h.flags & DIST_WANT_ALL,
                                    last && rows ? w->lg : NULL);
            if (rc == DS4_OK) rc = ds4_session_stream_error(e->s);
            free(tokens);
        }
        if (rc != DS4_OK) {
            h.err_rank = w->rank;
            snprintf(h.msg, sizeof h.msg, "%s", ds4_last_error());
        }
        h.status = rc;
    }
    if (last) {
        reply(w, &h, (ds4_status)h.status, w->lg, h.status == DS4_OK ? (size_t)rows * V * 4 : 0, DIST_TAG_LOGITS);
        return;
    }
    /* on to the next rank: the same header, tokens and the new stream */
    if (h.status == DS4_OK) {
        dist_stream_pack(h.bits, w->xo, (size_t)T * Wd, (uint8_t *)w->in + sizeof h + (size_t)T * 4);
    }
    memcpy(w->in, &h, sizeof h);
    size_t n = h.status == DS4_OK ? want : sizeof h;
    if (ds4_mpi_send(w->in, n, w->rank + 1, DIST_TAG_FWD) != DS4_OK) {
        fprintf(stderr, "ds4: rank %d: %s\n", w->rank, ds4_last_error());
        ds4_mpi_abort(1);
    }
}

/* A batched decode step: n sessions' rows, each session's state here. */
static void do_fwd_batch(worker *w)
{
    dist_hdr h;
    memcpy(&h, w->in, sizeof h);
    const bool last = w->rank == w->n_rank - 1;
    const int n = h.T;
    const uint8_t *in = (const uint8_t *)w->in;
    dsv4_state **ss = n > 0 ? calloc((size_t)n, sizeof *ss) : NULL;
    float **lgp = n > 0 ? calloc((size_t)n, sizeof *lgp) : NULL;
    int32_t *tokens = n > 0 ? malloc((size_t)n * 4) : NULL;
    ds4_status rc = (ds4_status)h.status;
    size_t Wd = 0, V = 0, head = sizeof h + (size_t)(n > 0 ? n : 0) * 16, want = 0;
    if (rc == DS4_OK && (!ss || !lgp || !tokens)) rc = ds4_fail(DS4_ERR_NOMEM, "out of memory for %d sessions", n);
    for (int i = 0; i < n && rc == DS4_OK; i++) {
        int32_t sid;
        int64_t pos;
        if (w->in_len < head) {
            rc = ds4_fail(DS4_ERR_FORMAT, "malformed batched step (%zu bytes)", w->in_len);
            break;
        }
        memcpy(&sid, in + sizeof h + (size_t)i * 4, 4);
        memcpy(&pos, in + sizeof h + (size_t)n * 4 + (size_t)i * 8, 8);
        wsess *e = find(w, sid);
        if (!e) rc = ds4_fail(DS4_ERR_INVALID, "no session %d here", sid);
        else if ((ss[i] = ds4_session_dsv4(e->s))->n_pos != pos)
            rc = ds4_fail(DS4_ERR_INVALID, "session %d is at position %lld here, the step is at %lld", sid,
                          (long long)ss[i]->n_pos, (long long)pos);
    }
    if (rc == DS4_OK) {
        Wd = (size_t)ss[0]->m->cfg.n_hc * ss[0]->m->cfg.n_embd;
        V = (size_t)ss[0]->m->cfg.n_vocab;
        want = head + dist_stream_bytes(h.bits, (size_t)n * Wd);
        if (w->in_len != want) rc = ds4_fail(DS4_ERR_FORMAT, "malformed batched step (%zu bytes)", w->in_len);
        else if (ensure((void **)&w->x, &w->x_cap, (size_t)n * Wd * 4) != DS4_OK ||
                 ensure((void **)&w->xo, &w->xo_cap, (size_t)n * Wd * 4) != DS4_OK ||
                 ensure((void **)&w->lg, &w->lg_cap, (size_t)n * V * 4) != DS4_OK)
            rc = DS4_ERR_NOMEM;
    }
    if (rc == DS4_OK) {
        memcpy(tokens, in + sizeof h + (size_t)n * 12, (size_t)n * 4);
        dist_stream_unpack(h.bits, in + head, (size_t)n * Wd, w->x);
        for (int i = 0; i < n; i++) lgp[i] = w->lg + (size_t)i * V;
        rc = dsv4_forward_batch_stage(ss, tokens, n, w->x, last ? NULL : w->xo, lgp);
    }
    if (rc != DS4_OK && h.status == DS4_OK) {
        h.err_rank = w->rank;
        snprintf(h.msg, sizeof h.msg, "%s", ds4_last_error());
        h.status = rc;
    }
    free(ss), free(lgp), free(tokens);
    if (last) {
        reply(w, &h, (ds4_status)h.status, w->lg, h.status == DS4_OK ? (size_t)n * V * 4 : 0, DIST_TAG_LOGITS);
        return;
    }
    if (h.status == DS4_OK) dist_stream_pack(h.bits, w->xo, (size_t)n * Wd, (uint8_t *)w->in + head);
    memcpy(w->in, &h, sizeof h);
    if (ds4_mpi_send(w->in, h.status == DS4_OK ? want : sizeof h, w->rank + 1, DIST_TAG_FWD) != DS4_OK) {
        fprintf(stderr, "ds4: rank %d: %s\n", w->rank, ds4_last_error());
        ds4_mpi_abort(1);
    }
}

int ds4_dist_worker_run(void)
{
    worker w = {.rank = ds4_mpi_rank(), .n_rank = ds4_mpi_size()};
    /* a test of the failure path: this rank dies at its first chunk */
    const char *die = getenv("DS4_DIST_TEST_DIE_RANK");
    bool dies = die && atoi(die) == w.rank;
    for (;;) {
        int tag = 0;
        if (ds4_mpi_recv(-1, -1, &w.in, &w.in_cap, &w.in_len, NULL, &tag) != DS4_OK || w.in_len < sizeof(dist_hdr)) {
            fprintf(stderr, "ds4: rank %d: %s\n", w.rank, ds4_last_error()[0] ? ds4_last_error() : "short message");
            ds4_mpi_abort(1);
        }
        dist_hdr h;
        memcpy(&h, w.in, sizeof h);
        const uint8_t *pay = (const uint8_t *)w.in + sizeof h;
        size_t n = w.in_len - sizeof h;
        ds4_clear_error();
        if (tag == DIST_TAG_FWD) {
            if (dies) raise(SIGKILL); /* as the OOM killer would: no message, no cleanup */
            if (h.op == DIST_FWDB) do_fwd_batch(&w);
            else do_fwd(&w);
            continue;
        }
        ds4_status st = DS4_OK;
        void *part = NULL;
        size_t plen = 0;
        wsess *e = find(&w, h.sid);
        switch (h.op) {
        case DIST_QUIT:
            if (w.model) close_model(&w);
            free(w.sess), free(w.in), free(w.x), free(w.xo), free(w.lg), free(w.out);
            return 0;
        case DIST_OPEN: st = do_open(&w, pay, n); break;
        case DIST_CLOSE:
            if (w.model) close_model(&w);
            break;
        case DIST_NEW: st = do_new(&w, h.sid, pay, n); break;
        case DIST_FREE: drop(&w, h.sid); break;
        case DIST_RESET:
            if (!e) st = ds4_fail(DS4_ERR_INVALID, "no session %d here", h.sid);
            else ds4_session_reset(e->s);
            break;
        case DIST_SNAP:
            if (!e) {
                st = ds4_fail(DS4_ERR_INVALID, "no session %d here", h.sid);
                break;
            }
            {
                dsv4_state *s = ds4_session_dsv4(e->s);
                plen = dsv4_state_part_offset(s, s->n_pos, s->m->layer_hi) -
                       dsv4_state_part_offset(s, s->n_pos, s->m->layer_lo);
                part = malloc(plen ? plen : 1);
                st = part ? dsv4_state_snapshot_part(s, part, plen)
                          : ds4_fail(DS4_ERR_NOMEM, "out of memory for %zu snapshot bytes", plen);
            }
            break;
        case DIST_RESTORE:
            if (!e) st = ds4_fail(DS4_ERR_INVALID, "no session %d here", h.sid);
            else {
                st = dsv4_state_restore_part(ds4_session_dsv4(e->s), pay, n, h.pos0);
                ds4_session_set_have_logits(e->s, false);
            }
            break;
        default: st = ds4_fail(DS4_ERR_FORMAT, "unknown command %d", h.op);
        }
        reply(&w, &h, st, part, plen, DIST_TAG_REPLY);
        free(part);
    }
}

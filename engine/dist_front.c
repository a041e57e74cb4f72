/*
 * dist_front.c - the start of a distributed run on every rank, and rank
 * 0's side of it (engine/dist.h, docs/DISTRIBUTED.md).
 *
 * MPI is initialised only when the launcher's environment says this
 * process is part of an mpirun job (dist_mpi.h): a plain `./ds4` never
 * loads the MPI runtime, so it behaves exactly as before. Rank 0 runs the
 * front end and the first stage; every call that touches other ranks
 * holds one lock, so the server's threads take turns and rank 0 never has
 * two conversations with a rank at once.
 */
#include "engine/dist.h"

#include "engine/dist_mpi.h"
#include "engine/dist_proto.h"
#include "quant/half.h"
#include "util/error.h"
#include "util/meminfo.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct {
    dist_role role;
    int rank, n_rank, bits;
    ds4_dist_range asked;    /* this rank's --layers */
    dist_rank_info *info;    /* rank 0: every rank's */
    ds4_dist_range *plan;    /* rank 0: the stages of the open model */
    const dsv4_model *model; /* rank 0: the model open over the ranks */
    ds4_dist_range stage;    /* worker: its stage */
    int next_sid;
    uint64_t chunks, batch_steps, batch_rows; /* what went through the pipeline (DS4_DIST_VERBOSE) */
    int said_batch;                           /* the first step of several sessions was logged */
    void *rbuf;
    size_t rcap;
} G = {.bits = 32, .asked = {-1, -1}};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

struct ds4_dist_session {
    int sid;
    bool broken; /* a rank failed in a step: the ranks' states may differ */
};

dist_role ds4_dist_role(void) { return G.role; }
void ds4_dist_set_stage(ds4_dist_range r) { G.stage = r; }

/* ---- the residual stream in messages ------------------------------------ */

size_t dist_stream_bytes(int bits, size_t n) { return n * (bits == 16 ? 2 : 4); }

void dist_stream_pack(int bits, const float *x, size_t n, void *out)
{
    if (bits != 16) {
        memcpy(out, x, n * 4);
        return;
    }
    uint16_t *o = out;
    for (size_t i = 0; i < n; i++) o[i] = ds4_f32_to_bf16(x[i]);
}

void dist_stream_unpack(int bits, const void *in, size_t n, float *x)
{
    if (bits != 16) {
        memcpy(x, in, n * 4);
        return;
    }
    const uint16_t *h = in;
    for (size_t i = 0; i < n; i++) x[i] = ds4_bf16_to_f32(h[i]);
}

/* ---- start ---------------------------------------------------------------- */

static void front_finish(void)
{
    if (G.role == DIST_FRONT && getenv("DS4_DIST_VERBOSE"))
        fprintf(stderr, "ds4: distributed: %llu chunks, %llu batched decode steps (%llu rows) through %d ranks\n",
                (unsigned long long)G.chunks, (unsigned long long)G.batch_steps, (unsigned long long)G.batch_rows,
                G.n_rank);
    if (G.role == DIST_FRONT) {
        dist_hdr h = {.op = DIST_QUIT};
        for (int r = 1; r < G.n_rank; r++) ds4_mpi_send(&h, sizeof h, r, DIST_TAG_CMD);
        G.role = DIST_NONE;
    }
    ds4_mpi_finalize();
    free(G.info);
    free(G.plan);
    free(G.rbuf);
}

/* Removes argv[i] and argv[i+1]. */
static void drop_two(int *argc, char **argv, int i)
{
    for (int k = i; k + 2 <= *argc; k++) argv[k] = argv[k + 2];
    *argc -= 2;
    argv[*argc] = NULL;
}

int ds4_dist_init(int *argc, char **argv, int *exit_code)
{
    *exit_code = 0;
    bool have_layers = false;
    for (int i = 1; i < *argc;) {
        const char *a = argv[i], *v = i + 1 < *argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--layers") || !strcmp(a, "--dist-activation-bits")) {
            if (!v) {
                fprintf(stderr, "ds4: %s needs a value\n", a);
                *exit_code = 2;
                return 1;
            }
            if (!strcmp(a, "--layers")) {
                if (ds4_dist_parse_range(v, &G.asked) != DS4_OK) {
                    fprintf(stderr, "ds4: %s\n", ds4_last_error());
                    *exit_code = 2;
                    return 1;
                }
                have_layers = true;
            } else if (!strcmp(v, "32") || !strcmp(v, "16")) {
                G.bits = atoi(v);
            } else {
                fprintf(stderr, "ds4: --dist-activation-bits takes 32 or 16, not '%s'\n", v);
                *exit_code = 2;
                return 1;
            }
            drop_two(argc, argv, i);
            continue;
        }
        i++;
    }
    if (!ds4_mpi_launched()) {
        if (have_layers) {
            fprintf(stderr, "ds4: --layers gives a rank its layers in a distributed run: start it with mpirun "
                            "(docs/DISTRIBUTED.md)\n");
            *exit_code = 2;
            return 1;
        }
        return 0;
    }
    if (ds4_mpi_init() != DS4_OK) {
        fprintf(stderr, "ds4: %s\n", ds4_last_error());
        *exit_code = 1;
        return 1;
    }
    G.rank = ds4_mpi_rank();
    G.n_rank = ds4_mpi_size();
    dist_rank_info me = {.asked = G.asked, .mem_avail = ds4_mem_available(), .local_rank = ds4_mpi_local_rank()};
    gethostname(me.host, sizeof me.host - 1);
    if (G.rank == 0 && !(G.info = calloc((size_t)G.n_rank, sizeof *G.info))) {
        fprintf(stderr, "ds4: out of memory\n");
        ds4_mpi_abort(1);
    }
    if (ds4_mpi_gather(&me, sizeof me, G.info) != DS4_OK) {
        fprintf(stderr, "ds4: rank %d: %s\n", G.rank, ds4_last_error());
        ds4_mpi_abort(1);
    }
    if (G.rank == 0) {
        G.role = G.n_rank > 1 ? DIST_FRONT : DIST_NONE;
        atexit(front_finish);
        return 0;
    }
    G.role = DIST_WORKER;
    /* Ctrl-C and SIGTERM are rank 0's to handle (the server shuts down
     * cleanly, saving snapshots that need these ranks); the others end
     * when rank 0 says so, or are killed by mpirun if rank 0 dies */
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    *exit_code = ds4_dist_worker_run();
    ds4_mpi_finalize();
    return 1;
}

/* ---- talking to the other ranks (rank 0, lock held) --------------------- */

static void hdr_error(dist_hdr *h, ds4_status st, int rank)
{
    h->status = st;
    h->err_rank = rank;
    snprintf(h->msg, sizeof h->msg, "%s", ds4_last_error());
}

static ds4_status hdr_fail(const dist_hdr *h)
{
    int r = h->err_rank;
    const char *host = G.info && r >= 0 && r < G.n_rank ? G.info[r].host : "?";
    return ds4_fail((ds4_status)h->status, "distributed: rank %d (%s): %s", r, host, h->msg);
}

/* The same command to every other rank. */
static ds4_status send_all(const void *msg, size_t len)
{
    for (int r = 1; r < G.n_rank; r++) {
        ds4_status st = ds4_mpi_send(msg, len, r, DIST_TAG_CMD);
        if (st != DS4_OK) return st;
    }
    return DS4_OK;
}

/* Every rank's reply to the last command; the first failure is returned.
 * part(r, payload, len): what SNAP replies carry after their header. */
typedef ds4_status (*part_fn)(void *ctx, int r, const uint8_t *p, size_t len);
static ds4_status collect(part_fn part, void *ctx)
{
    ds4_status first = DS4_OK;
    for (int r = 1; r < G.n_rank; r++) {
        size_t len = 0;
        ds4_status st = ds4_mpi_recv(r, DIST_TAG_REPLY, &G.rbuf, &G.rcap, &len, NULL, NULL);
        if (st != DS4_OK) return st;
        dist_hdr h;
        if (len < sizeof h) return ds4_fail(DS4_ERR_BACKEND, "distributed: rank %d sent a short reply", r);
        memcpy(&h, G.rbuf, sizeof h);
        if (h.status != DS4_OK) {
            if (first == DS4_OK) first = hdr_fail(&h);
            continue;
        }
        if (part && first == DS4_OK) first = part(ctx, r, (const uint8_t *)G.rbuf + sizeof h, len - sizeof h);
    }
    return first;
}

static ds4_status command(const dist_hdr *h, const void *payload, size_t n, part_fn part, void *ctx)
{
    uint8_t *msg = malloc(sizeof *h + n);
    if (!msg) return ds4_fail(DS4_ERR_NOMEM, "distributed: out of memory");
    memcpy(msg, h, sizeof *h);
    if (n) memcpy(msg + sizeof *h, payload, n);
    ds4_status st = send_all(msg, sizeof *h + n);
    free(msg);
    return st == DS4_OK ? collect(part, ctx) : st;
}

/* ---- model ----------------------------------------------------------------- */

static dsv4_model *front_model_load(const char *path, const ds4_model_options *o)
{
    if (o && (o->ssd_streaming || o->expert_profile)) {
        ds4_fail(DS4_ERR_UNSUPPORTED, "distributed: %s is not available in a run over several ranks yet",
                 o->ssd_streaming ? "expert streaming" : "the expert profile");
        return NULL;
    }
    if (G.model) {
        ds4_fail(DS4_ERR_UNSUPPORTED, "distributed: one model at a time in a run over several ranks");
        return NULL;
    }
    ds4_dist_model_info mi;
    if (ds4_dist_model_info_read(path, &mi) != DS4_OK) return NULL;
    ds4_dist_range *asked = malloc((size_t)G.n_rank * sizeof *asked);
    uint64_t *w = malloc((size_t)G.n_rank * sizeof *w);
    ds4_dist_range *plan = malloc((size_t)G.n_rank * sizeof *plan);
    if (!asked || !w || !plan) {
        free(asked), free(w), free(plan);
        ds4_fail(DS4_ERR_NOMEM, "distributed: out of memory");
        return NULL;
    }
    for (int r = 0; r < G.n_rank; r++) {
        asked[r] = G.info[r].asked;
        w[r] = G.info[r].mem_avail;
    }
    ds4_status st = ds4_dist_plan(&mi, G.n_rank, asked, w, plan);
    free(asked);
    free(w);
    dsv4_model *m = NULL;
    if (st == DS4_OK) m = dsv4_model_load_range(path, plan[0].lo, plan[0].hi);
    if (!m) {
        free(plan);
        return NULL;
    }
    /* OPEN: u64 fingerprint, i32 n_rank, i32 0, the ranges, the path */
    size_t plen = strlen(path) + 1, n = 16 + (size_t)G.n_rank * sizeof *plan + plen;
    uint8_t *pay = malloc(n);
    if (!pay) {
        free(plan);
        dsv4_model_free(m);
        ds4_fail(DS4_ERR_NOMEM, "distributed: out of memory");
        return NULL;
    }
    int32_t nr[2] = {G.n_rank, 0};
    memcpy(pay, &mi.fingerprint, 8);
    memcpy(pay + 8, nr, 8);
    memcpy(pay + 16, plan, (size_t)G.n_rank * sizeof *plan);
    memcpy(pay + 16 + (size_t)G.n_rank * sizeof *plan, path, plen);
    dist_hdr h = {.op = DIST_OPEN};
    st = command(&h, pay, n, NULL, NULL);
    free(pay);
    if (st != DS4_OK) {
        /* the ranks that opened their stage close it again */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ds4_last_error());
        dist_hdr c = {.op = DIST_CLOSE};
        command(&c, NULL, 0, NULL, NULL);
        ds4_fail(st, "%s", msg);
        free(plan);
        dsv4_model_free(m);
        return NULL;
    }
    G.plan = plan;
    G.model = m;
    if (getenv("DS4_DIST_VERBOSE"))
        for (int r = 0; r < G.n_rank; r++)
            fprintf(stderr, "ds4: rank %d (%s): layers %d:%d\n", r, G.info[r].host, plan[r].lo, plan[r].hi);
    return m;
}

dsv4_model *ds4_dist_model_load(const char *path, const ds4_model_options *o)
{
    if (G.role == DIST_WORKER) return dsv4_model_load_range(path, G.stage.lo, G.stage.hi);
    if (G.role != DIST_FRONT) return dsv4_model_load(path);
    pthread_mutex_lock(&mu);
    dsv4_model *m = front_model_load(path, o);
    pthread_mutex_unlock(&mu);
    return m;
}

void ds4_dist_model_close(const dsv4_model *m)
{
    if (G.role != DIST_FRONT || !m || m != G.model) return;
    pthread_mutex_lock(&mu);
    dist_hdr h = {.op = DIST_CLOSE};
    if (command(&h, NULL, 0, NULL, NULL) != DS4_OK) fprintf(stderr, "ds4: %s\n", ds4_last_error());
    G.model = NULL;
    free(G.plan);
    G.plan = NULL;
    pthread_mutex_unlock(&mu);
}

/* ---- sessions ---------------------------------------------------------------- */

ds4_status ds4_dist_session_open(const dsv4_model *m, const ds4_session_params *p, ds4_dist_session **out)
{
    *out = NULL;
    if (G.role != DIST_FRONT || m != G.model) return DS4_OK;
    if (p->imatrix)
        return ds4_fail(DS4_ERR_UNSUPPORTED, "distributed: importance-matrix collection needs one process");
    ds4_dist_session *d = calloc(1, sizeof *d);
    if (!d) return ds4_fail(DS4_ERR_NOMEM, "distributed: out of memory");
    pthread_mutex_lock(&mu);
    d->sid = ++G.next_sid;
    dist_hdr h = {.op = DIST_NEW, .sid = d->sid};
    dist_new nw = {p->n_ctx, (int32_t)p->numerics, p->n_threads, (int32_t)p->backend, p->max_chunk, p->gpu_device, 0};
    ds4_status st = command(&h, &nw, sizeof nw, NULL, NULL);
    if (st != DS4_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ds4_last_error());
        dist_hdr f = {.op = DIST_FREE, .sid = d->sid};
        command(&f, NULL, 0, NULL, NULL);
        ds4_fail(st, "%s", msg);
        free(d);
        d = NULL;
    }
    pthread_mutex_unlock(&mu);
    *out = d;
    return st;
}

void ds4_dist_session_close(ds4_dist_session *d)
{
    if (!d) return;
    pthread_mutex_lock(&mu);
    dist_hdr h = {.op = DIST_FREE, .sid = d->sid};
    if (G.role == DIST_FRONT && command(&h, NULL, 0, NULL, NULL) != DS4_OK)
        fprintf(stderr, "ds4: %s\n", ds4_last_error());
    pthread_mutex_unlock(&mu);
    free(d);
}

ds4_status ds4_dist_reset(ds4_dist_session *d)
{
    pthread_mutex_lock(&mu);
    dist_hdr h = {.op = DIST_RESET, .sid = d->sid};
    ds4_status st = command(&h, NULL, 0, NULL, NULL);
    if (st == DS4_OK) d->broken = false;
    pthread_mutex_unlock(&mu);
    return st;
}

static ds4_status check_sync(const ds4_dist_session *d)
{
    if (d->broken)
        return ds4_fail(DS4_ERR_INVALID, "distributed: a rank failed during an earlier step of this session, so the "
                                         "ranks' states may differ: reset or restore it first");
    return DS4_OK;
}

/* ---- the pipeline ------------------------------------------------------------ */

typedef struct {
    ds4_mpi_req *req;
    uint8_t *buf;
    size_t cap;
    int64_t row0; /* the chunk's first token */
    int rows;     /* logit rows it brings */
} pending;

static ds4_status pipeline(ds4_dist_session *d, dsv4_state *st, const int32_t *tokens, int64_t n, float *all_logits,
                           float *last_logits)
{
    const dsv4_config *c = &st->m->cfg;
    const size_t V = (size_t)c->n_vocab, W = (size_t)c->n_hc * c->n_embd;
    const int chunk = st->max_chunk, last = G.n_rank - 1;
    const int64_t n_chunks = (n + chunk - 1) / chunk;
    pending *pd = calloc((size_t)n_chunks, sizeof *pd);
    float *x = malloc((size_t)chunk * W * sizeof(float));
    uint8_t *msg = malloc(sizeof(dist_hdr) + (size_t)chunk * 4 + dist_stream_bytes(G.bits, (size_t)chunk * W));
    ds4_status rc = DS4_OK;
    if (!pd || !x || !msg) {
        free(pd), free(x), free(msg);
        return ds4_fail(DS4_ERR_NOMEM, "distributed: out of memory for a chunk of %d tokens", chunk);
    }
    int64_t posted = 0;
    for (int64_t k = 0; k < n_chunks && rc == DS4_OK; k++) {
        int64_t i = k * chunk;
        int T = n - i < chunk ? (int)(n - i) : chunk;
        bool is_last = k == n_chunks - 1;
        dist_hdr h = {.op = DIST_FWD, .sid = d->sid, .T = T, .bits = G.bits, .pos0 = st->n_pos};
        h.flags = all_logits ? DIST_WANT_ALL : is_last ? DIST_WANT_LAST : 0;
        pending *p = &pd[k];
        p->row0 = i;
        p->rows = all_logits ? T : is_last ? 1 : 0;
        p->cap = sizeof h + (size_t)p->rows * V * sizeof(float);
        if (!(p->buf = malloc(p->cap))) {
            rc = ds4_fail(DS4_ERR_NOMEM, "distributed: out of memory for the logits of %d tokens", p->rows);
            break;
        }
        /* posted before the chunk leaves: the last rank never waits on us */
        if (!(p->req = ds4_mpi_irecv(p->buf, p->cap, last, DIST_TAG_LOGITS))) {
            rc = DS4_ERR_BACKEND;
            break;
        }
        posted = k + 1;
        ds4_status fs = dsv4_forward_stage(st, tokens + i, T, NULL, x, false, NULL);
        if (fs != DS4_OK) hdr_error(&h, fs, 0); /* it still travels, so every rank answers */
        memcpy(msg, &h, sizeof h);
        memcpy(msg + sizeof h, tokens + i, (size_t)T * 4);
        dist_stream_pack(G.bits, x, (size_t)T * W, msg + sizeof h + (size_t)T * 4);
        rc = ds4_mpi_send(msg, sizeof h + (size_t)T * 4 + dist_stream_bytes(G.bits, (size_t)T * W), 1, DIST_TAG_FWD);
        if (rc != DS4_OK) posted = k; /* no answer will come for a chunk that did not leave */
        G.chunks++;
    }
    ds4_status first = rc;
    for (int64_t k = 0; k < posted; k++) {
        pending *p = &pd[k];
        size_t len = 0;
        ds4_status ws = ds4_mpi_wait(p->req, &len);
        if (ws != DS4_OK) {
            if (first == DS4_OK) first = ws;
            continue;
        }
        dist_hdr h;
        memcpy(&h, p->buf, sizeof h);
        if (h.status != DS4_OK) {
            if (first == DS4_OK) first = hdr_fail(&h);
            continue;
        }
        if (len != p->cap && first == DS4_OK)
            first = ds4_fail(DS4_ERR_BACKEND, "distributed: rank %d sent %zu bytes of logits, %zu expected", last,
                             len - sizeof h, p->cap - sizeof h);
        if (first != DS4_OK || !p->rows) continue;
        const float *lg = (const float *)(p->buf + sizeof h);
        if (all_logits) memcpy(all_logits + (size_t)p->row0 * V, lg, (size_t)p->rows * V * sizeof(float));
        if (k == n_chunks - 1 && last_logits)
            memcpy(last_logits, lg + (size_t)(p->rows - 1) * V, V * sizeof(float));
    }
    for (int64_t k = 0; k < n_chunks; k++) free(pd[k].buf);
    free(pd);
    free(x);
    free(msg);
    if (first != DS4_OK) d->broken = true;
    return first;
}

ds4_status ds4_dist_prefill(ds4_dist_session *d, dsv4_state *st, const int32_t *tokens, int64_t n, float *all_logits,
                            float *last_logits)
{
    const dsv4_config *c = &st->m->cfg;
    if (n == 0) return DS4_OK;
    /* what would fail on a rank is refused here, before anything moves */
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->n_vocab)
            return ds4_fail(DS4_ERR_INVALID, "prefill: token id %d at index %lld outside vocabulary [0, %d)",
                            tokens[i], (long long)i, c->n_vocab);
    pthread_mutex_lock(&mu);
    ds4_status rc = check_sync(d);
    if (rc == DS4_OK) rc = pipeline(d, st, tokens, n, all_logits, last_logits);
    pthread_mutex_unlock(&mu);
    return rc;
}

static ds4_status batch_step(ds4_dist_session *const *d, dsv4_state *const *st, const int32_t *tokens, int n,
                             float *const *logits)
{
    const dsv4_config *c = &st[0]->m->cfg;
    const size_t V = (size_t)c->n_vocab, W = (size_t)c->n_hc * c->n_embd;
    size_t head = sizeof(dist_hdr) + (size_t)n * (4 + 8 + 4);
    size_t len = head + dist_stream_bytes(G.bits, (size_t)n * W), cap = sizeof(dist_hdr) + (size_t)n * V * 4;
    float *x = malloc((size_t)n * W * sizeof(float));
    uint8_t *msg = malloc(len), *rep = malloc(cap);
    ds4_status rc = DS4_OK;
    if (!x || !msg || !rep) rc = ds4_fail(DS4_ERR_NOMEM, "distributed: out of memory for %d sessions", n);
    dist_hdr h = {.op = DIST_FWDB, .T = n, .bits = G.bits};
    for (int i = 0; i < n && rc == DS4_OK; i++) {
        memcpy(msg + sizeof h + (size_t)i * 4, &d[i]->sid, 4);
        memcpy(msg + sizeof h + (size_t)n * 4 + (size_t)i * 8, &st[i]->n_pos, 8);
    }
    ds4_mpi_req *req = NULL;
    if (rc == DS4_OK && !(req = ds4_mpi_irecv(rep, cap, G.n_rank - 1, DIST_TAG_LOGITS))) rc = DS4_ERR_BACKEND;
    if (rc == DS4_OK) {
        ds4_status fs = dsv4_forward_batch_stage(st, tokens, n, NULL, x, NULL);
        if (fs != DS4_OK) hdr_error(&h, fs, 0);
        memcpy(msg, &h, sizeof h);
        memcpy(msg + sizeof h + (size_t)n * 12, tokens, (size_t)n * 4);
        dist_stream_pack(G.bits, x, (size_t)n * W, msg + head);
        rc = ds4_mpi_send(msg, len, 1, DIST_TAG_FWD);
        G.batch_steps++;
        G.batch_rows += (uint64_t)n;
        /* Said when it happens, not only at exit: mpirun may SIGKILL rank 0
           before its exit summary when shutting down is slow. */
        if (n > 1 && !G.said_batch && getenv("DS4_DIST_VERBOSE")) {
            G.said_batch = 1;
            fprintf(stderr, "ds4: distributed: first decode step of %d sessions at once, through %d ranks\n", n,
                    G.n_rank);
        }
        size_t got = 0;
        ds4_status ws = rc == DS4_OK ? ds4_mpi_wait(req, &got) : rc;
        if (rc == DS4_OK) rc = ws;
        if (rc == DS4_OK) {
            memcpy(&h, rep, sizeof h);
            if (h.status != DS4_OK) rc = hdr_fail(&h);
            else if (got != cap)
                rc = ds4_fail(DS4_ERR_BACKEND, "distributed: %zu bytes of logits for %d sessions, %zu expected", got, n,
                              cap);
        }
        for (int i = 0; i < n && rc == DS4_OK; i++)
            if (logits[i]) memcpy(logits[i], rep + sizeof h + (size_t)i * V * 4, V * 4);
    }
    free(x), free(msg), free(rep);
    if (rc != DS4_OK)
        for (int i = 0; i < n; i++) d[i]->broken = true;
    return rc;
}

ds4_status ds4_dist_decode_batch(ds4_dist_session *const *d, dsv4_state *const *st, const int32_t *tokens, int n,
                                 float *const *logits)
{
    pthread_mutex_lock(&mu);
    ds4_status rc = DS4_OK;
    for (int i = 0; i < n && rc == DS4_OK; i++) rc = check_sync(d[i]);
    if (rc == DS4_OK) rc = batch_step(d, st, tokens, n, logits);
    pthread_mutex_unlock(&mu);
    return rc;
}

/* ---- snapshots ---------------------------------------------------------------- */

typedef struct {
    const dsv4_state *st;
    uint8_t *buf;
    int64_t n_pos;
} snap_ctx;

static ds4_status snap_part(void *ctx, int r, const uint8_t *p, size_t len)
{
    snap_ctx *s = ctx;
    size_t a = dsv4_state_part_offset(s->st, s->n_pos, G.plan[r].lo);
    size_t b = dsv4_state_part_offset(s->st, s->n_pos, G.plan[r].hi);
    if (len != b - a)
        return ds4_fail(DS4_ERR_BACKEND, "distributed: rank %d sent %zu snapshot bytes for layers %d:%d, %zu expected",
                        r, len, G.plan[r].lo, G.plan[r].hi, b - a);
    memcpy(s->buf + a, p, len);
    return DS4_OK;
}

ds4_status ds4_dist_snapshot(ds4_dist_session *d, const dsv4_state *st, void *buf, size_t len)
{
    pthread_mutex_lock(&mu);
    ds4_status rc = check_sync(d);
    const int L = st->m->cfg.n_layer;
    size_t head = dsv4_state_part_offset(st, st->n_pos, 0), own = dsv4_state_part_offset(st, st->n_pos, G.plan[0].hi);
    if (rc == DS4_OK && len != dsv4_state_part_offset(st, st->n_pos, L))
        rc = ds4_fail(DS4_ERR_INVALID, "snapshot: buffer of %zu bytes, the state takes %zu", len,
                      dsv4_state_part_offset(st, st->n_pos, L));
    if (rc == DS4_OK) rc = dsv4_state_snapshot_header(st, buf, head);
    if (rc == DS4_OK) rc = dsv4_state_snapshot_part(st, (uint8_t *)buf + head, own - head);
    if (rc == DS4_OK) {
        snap_ctx sc = {st, buf, st->n_pos};
        dist_hdr h = {.op = DIST_SNAP, .sid = d->sid, .pos0 = st->n_pos};
        rc = command(&h, NULL, 0, snap_part, &sc);
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

ds4_status ds4_dist_restore(ds4_dist_session *d, dsv4_state *st, const void *buf, size_t len)
{
    int64_t n_pos;
    ds4_status rc = dsv4_state_restore_check(st, buf, len, &n_pos);
    if (rc != DS4_OK) return rc;
    pthread_mutex_lock(&mu);
    const uint8_t *b = buf;
    size_t head = dsv4_state_part_offset(st, n_pos, 0), own = dsv4_state_part_offset(st, n_pos, G.plan[0].hi);
    rc = dsv4_state_restore_part(st, b + head, own - head, n_pos);
    for (int r = 1; r < G.n_rank && rc == DS4_OK; r++) {
        size_t a = dsv4_state_part_offset(st, n_pos, G.plan[r].lo), e = dsv4_state_part_offset(st, n_pos, G.plan[r].hi);
        dist_hdr h = {.op = DIST_RESTORE, .sid = d->sid, .pos0 = n_pos};
        uint8_t *msg = malloc(sizeof h + (e - a));
        if (!msg) {
            rc = ds4_fail(DS4_ERR_NOMEM, "distributed: out of memory for %zu snapshot bytes", e - a);
            break;
        }
        memcpy(msg, &h, sizeof h);
        memcpy(msg + sizeof h, b + a, e - a);
        rc = ds4_mpi_send(msg, sizeof h + (e - a), r, DIST_TAG_CMD);
        free(msg);
    }
    /* every rank that got its part answers (a failed send: the job is ending) */
    if (rc == DS4_OK) rc = collect(NULL, NULL);
    d->broken = rc != DS4_OK;
    pthread_mutex_unlock(&mu);
    return rc;
}

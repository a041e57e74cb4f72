/*
 * session.c - the public model/session API of include/ds4.h over the
 * DeepSeek V4 model (model/) and a backend (backend/ops.h).
 *
 * A session owns its backend instance (the CPU one has its thread pool)
 * and its state (model/dsv4_state.h). Prefill cuts the tokens into steps of
 * at most max_chunk; decode is a step of one. A snapshot is the model
 * state's logical bytes plus the last logits, so restoring it gives the
 * exact same continuation. A greedy step (ds4_session_decode_pick) on a
 * backend that picks leaves the logits in the state's buffer and takes
 * only the token; they come into the host row at their first read
 * (ds4_session_logits, the snapshot), the same bits.
 */
#include "include/ds4.h"
#include "include/ds4_sampler.h"

#include "backend/ops.h"
#include "engine/dist.h"
#include "engine/dist_proto.h"
#include "engine/tp.h"
#include "engine/imatrix.h"
#include "backend/expert_cache.h"
#include "engine/expert_profile.h"
#include "engine/expert_stream.h"
#include "engine/gpu_expert_cache.h"
#include "engine/model_access.h"
#include "engine/model_numa.h"
#include "engine/model_warm.h"
#include "gguf/gguf.h"
#include "engine/session_access.h"
#include "model/dsv4_model.h"
#include "model/dsv4_state.h"
#include "util/error.h"
#if DS4_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#include "backend/cuda/cuda_backend.h"
#endif

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

struct ds4_model {
    dsv4_model *m;
    ds4_expert_cache *experts; /* expert streaming (NULL: off) */
    uint64_t preloaded;
    char *profile_path;        /* expert profile file (NULL: off) */
    int64_t gpu_slots;         /* VRAM expert cache of CUDA sessions (0: off; engine/gpu_expert_cache.h) */
    ds4_expert_evict evict;
    int32_t *gpu_preload;      /* its hot-list pairs, 2 x n_gpu_preload */
    int64_t n_gpu_preload;
    ds4_tp *tp;                /* tensor parallel (NULL: off; engine/tp.h) */
    int gpu_devices[64];       /* the ranks' CUDA devices */
};

/* Logits a greedy pick left on the backend (ds4_session_decode_pick):
 * they are in row 0 of the state's logits buffer, not yet in the host
 * row, which takes them at the first read. A flag behind a pointer, so
 * that the readers that take a const session (ds4_session_logits, the
 * snapshot) can bring them home. */
typedef struct {
    bool on_backend;
} logits_place;

struct ds4_session {
    ds4_model *model;
    ds4_backend *be;
    dsv4_state *st;
    float *logits; /* host, n_vocab */
    bool logits_pinned; /* page-locked by s->be (host_pin): released before the backend goes */
    bool have_logits;
    logits_place *place; /* have_logits: where they are (host unless on_backend) */
    ds4_dist_session *dist; /* rank 0 of a distributed run: the other ranks' part (NULL: none) */
    ds4_tp_session *tp;     /* tensor parallel: every rank's backend and state (be, st are rank 0's) */
    void *edits; /* steering / --power buffers (engine/session_edit.c) */
    void *spec;  /* speculative decoding with the MTP block (engine/spec.c) */
};

/* The streaming and profile options make sense only together as documented. */
static ds4_status check_options(const ds4_model_options *o)
{
    if (!o->ssd_streaming && !o->gpu_cache_experts && !o->gpu_cache_bytes) {
        const char *what = o->cache_experts || o->cache_bytes ? "a cache size"
                           : o->preload_experts                ? "a preload count"
                           : o->cold                           ? "a cold start"
                           : o->hotlist_path                   ? "a hot list"
                           : o->evict                          ? "an eviction policy"
                                                               : NULL;
        if (what) return ds4_fail(DS4_ERR_INVALID, "model: %s is an expert streaming option: it needs ssd streaming on", what);
    }
    if (o->warm_weights && o->ssd_streaming)
        return ds4_fail(DS4_ERR_INVALID, "model: warming the weights reads the whole file into memory; with ssd "
                                         "streaming the experts stay on disk (use one or the other)");
    if (o->numa != DS4_NUMA_OFF && o->numa != DS4_NUMA_INTERLEAVE)
        return ds4_fail(DS4_ERR_INVALID, "model: numa mode %d (0 = off, 1 = interleave)", o->numa);
    if (o->preload_experts < 0)
        return ds4_fail(DS4_ERR_INVALID, "model: preload of %lld experts (0 = the default, or a count)",
                        (long long)o->preload_experts);
    return DS4_OK;
}

/* Check an existing profile now, so that a malformed or mismatched file
 * stops the run before it starts rather than losing its counts at the end. */
static ds4_status profile_open(ds4_model *m, const char *path)
{
    const dsv4_config *c = &m->m->cfg;
    int L, E;
    uint64_t *cnt = NULL;
    ds4_status st = ds4_expert_profile_read(path, &L, &E, &cnt);
    free(cnt);
    if (st == DS4_ERR_NOT_FOUND) ds4_clear_error();
    else if (st != DS4_OK) return st;
    else if (L != c->n_layer || E != c->n_expert)
        return ds4_fail(DS4_ERR_INVALID, "expert profile %s: has %d layers x %d experts, this model %d x %d", path, L, E,
                        c->n_layer, c->n_expert);
    m->profile_path = strdup(path);
    m->m->expert_counts = calloc((size_t)c->n_layer * (size_t)c->n_expert, sizeof(uint64_t));
    if (!m->profile_path || !m->m->expert_counts) return ds4_fail(DS4_ERR_NOMEM, "model: out of memory");
    return DS4_OK;
}

/* "0,1,3": device numbers, one per rank. A device may repeat: ranks that
 * share a GPU exchange through host memory (slow; to test the split on one
 * GPU), ranks on their own GPUs through NCCL (engine/tp.h). */
static ds4_status parse_devices(const char *list, int n, int *dev)
{
    const char *p = list;
    for (int i = 0; i < n; i++) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > 1023 || (*end && *end != ','))
            return ds4_fail(DS4_ERR_INVALID, "model: GPU device list '%s': expected %d device numbers like 0,1", list, n);
        dev[i] = (int)v;
        p = end;
        if (i + 1 < n) {
            if (*p != ',')
                return ds4_fail(DS4_ERR_INVALID, "model: GPU device list '%s' names %d devices, tensor parallel has %d",
                                list, i + 1, n);
            p++;
        }
    }
    if (*p) return ds4_fail(DS4_ERR_INVALID, "model: GPU device list '%s' names more than the %d ranks", list, n);
    return DS4_OK;
}

/* The tensor-parallel group of a model opened with tensor_parallel > 1. */
static ds4_status tp_open(ds4_model *m, const ds4_model_options *o)
{
    int n = o->tensor_parallel;
    if (n < 0 || n > 64) return ds4_fail(DS4_ERR_INVALID, "model: tensor parallel over %d ranks (1..64)", n);
    if (n <= 1) {
        if (o->gpu_devices) return ds4_fail(DS4_ERR_INVALID, "model: a GPU device list needs tensor parallel over 2+ ranks");
        return DS4_OK;
    }
    if (ds4_dist_role() != DIST_NONE)
        return ds4_fail(DS4_ERR_UNSUPPORTED, "model: tensor parallel inside an MPI run is not supported (the layers "
                                             "are already split over the ranks; use one or the other)");
    if (o->ssd_streaming || o->gpu_cache_experts || o->gpu_cache_bytes)
        return ds4_fail(DS4_ERR_UNSUPPORTED, "model: tensor parallel does not take expert streaming or the GPU expert "
                                             "cache (each rank holds only its share of the experts)");
    for (int r = 0; r < n; r++) m->gpu_devices[r] = r;
    if (o->gpu_devices && parse_devices(o->gpu_devices, n, m->gpu_devices) != DS4_OK) return DS4_ERR_INVALID;
    return ds4_tp_open(m->m, n, &m->tp);
}

ds4_model *ds4_model_open(const char *path, const ds4_model_options *opt)
{
    ds4_model_options o;
    if (opt) o = *opt;
    else memset(&o, 0, sizeof o);
    if (check_options(&o) != DS4_OK) return NULL;
    ds4_model *m = calloc(1, sizeof *m);
    if (!m) {
        ds4_fail(DS4_ERR_NOMEM, "model: out of memory");
        return NULL;
    }
    m->m = ds4_dist_model_load(path, &o); /* this rank's layers in a distributed run */
    if (!m->m) {
        free(m);
        return NULL;
    }
    if (o.expert_profile && profile_open(m, o.expert_profile) != DS4_OK) {
        ds4_model_close(m);
        return NULL;
    }
    /* after the profile: rank 0's view counts into its counts */
    if (tp_open(m, &o) != DS4_OK) {
        ds4_model_close(m);
        return NULL;
    }
    m->evict = o.evict;
    if (ds4_gpu_expert_slots(m->m, &o, &m->gpu_slots) != DS4_OK ||
        (m->gpu_slots && ds4_gpu_expert_preload(m->m, &o, m->gpu_slots, &m->gpu_preload, &m->n_gpu_preload) != DS4_OK)) {
        ds4_model_close(m);
        return NULL;
    }
    if (o.ssd_streaming && !(m->experts = ds4_expert_stream_open(m->m, path, &o, &m->preloaded))) {
        ds4_model_close(m);
        return NULL;
    }
    /* before the warm-up, so that the pages it reads in are placed by the policy */
    if (o.numa == DS4_NUMA_INTERLEAVE &&
        ds4_numa_interleave(ds4_gguf_base(m->m->gguf), (size_t)ds4_gguf_file_size(m->m->gguf)) != DS4_OK) {
        ds4_model_close(m);
        return NULL;
    }
    if (o.warm_weights) ds4_model_warm(ds4_gguf_base(m->m->gguf), (size_t)ds4_gguf_file_size(m->m->gguf), 0);
    return m;
}

ds4_status ds4_model_save_expert_profile(ds4_model *m)
{
    if (!m->profile_path) return DS4_OK;
    const dsv4_config *c = &m->m->cfg;
    size_t n = (size_t)c->n_layer * (size_t)c->n_expert;
    uint64_t *snap = calloc(n, sizeof *snap);
    if (!snap) return ds4_fail(DS4_ERR_NOMEM, "expert profile: out of memory");
    for (size_t i = 0; i < n; i++) snap[i] = __atomic_exchange_n(&m->m->expert_counts[i], 0, __ATOMIC_RELAXED);
    ds4_status st = ds4_expert_profile_merge(m->profile_path, c->n_layer, c->n_expert, snap);
    if (st != DS4_OK) /* keep the counts for a later attempt */
        for (size_t i = 0; i < n; i++) __atomic_fetch_add(&m->m->expert_counts[i], snap[i], __ATOMIC_RELAXED);
    free(snap);
    return st;
}

void ds4_model_close(ds4_model *m)
{
    if (!m) return;
    if (m->profile_path && m->m->expert_counts && ds4_model_save_expert_profile(m) != DS4_OK)
        fprintf(stderr, "ds4: %s\n", ds4_last_error());
    ds4_expert_cache_free(m->experts);
    free(m->gpu_preload);
    if (m->m) free(m->m->expert_counts);
    free(m->profile_path);
    ds4_tp_close(m->tp);
    ds4_dist_model_close(m->m);
    dsv4_model_free(m->m);
    free(m);
}

void ds4_model_expert_stream_stats(const ds4_model *m, ds4_expert_stream_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!m->experts) return;
    ds4_expert_cache_stats st;
    ds4_expert_cache_get_stats(m->experts, &st);
    out->hits = st.hits;
    out->misses = st.misses;
    out->bytes_read = st.bytes_read;
    out->cache_experts = st.slots;
    out->cache_bytes = st.slots * st.slot_bytes;
    out->resident = st.resident;
    out->preloaded = m->preloaded;
}

int ds4_model_n_vocab(const ds4_model *m) { return m->m->cfg.n_vocab; }
int ds4_model_n_layer(const ds4_model *m) { return m->m->cfg.n_layer; }

void ds4_session_params_default(ds4_session_params *p)
{
    memset(p, 0, sizeof *p);
    p->n_ctx = 4096;
    p->numerics = DS4_NUMERICS_AUTO;
    p->n_threads = 0;
    p->backend = DS4_BACKEND_AUTO;
    p->max_chunk = 0; /* the backend's (session_chunk_default) */
}

/* Prefill tokens per step when the caller leaves it to the library: the
 * backend's choice, else 512. On the CPU the routed experts of a chunk are
 * run expert by expert over the tokens routed to each: with 256 experts a
 * 128-token chunk gives each ~3 rows, too few for the GEMM to amortize
 * decoding the weights; 512 gives ~12 (docs/BENCHMARKS.md "CPU prefill at
 * 256 experts"). The cost is activation memory, ~1 MB per token of chunk
 * for Flash (the chunk's logits rows are most of it), so never more than
 * the context. CUDA asks for 2048 (cuda_backend.cu: its experts run per
 * group of 16 of an expert's tokens). */
static int session_chunk_default(const ds4_backend *be, int64_t n_ctx)
{
    const int want = be && be->prefill_chunk > 0 ? be->prefill_chunk : 512;
    return n_ctx >= 1 && n_ctx < want ? (int)n_ctx : want;
}

typedef struct {
    ds4_backend *be;
    ds4_status st;
} prep_ctx;

static void prepare_one(void *ctx, const ds4_weight *w)
{
    prep_ctx *p = ctx;
    if (p->st == DS4_OK) p->st = p->be->weight_prepare(p->be, w);
}

/* The backend of a session: CUDA when asked for, or (AUTO) when this build
 * has it and a GPU is present; DS4_BACKEND=cpu|cuda in the environment
 * overrides AUTO (so a test suite can be run on either). */
static ds4_backend_kind backend_requested(const ds4_session_params *p)
{
    ds4_backend_kind kind = p->backend;
    const char *env = getenv("DS4_BACKEND");
    if (kind == DS4_BACKEND_AUTO && env && strcmp(env, "cpu") == 0) kind = DS4_BACKEND_CPU;
    if (kind == DS4_BACKEND_AUTO && env && strcmp(env, "cuda") == 0) kind = DS4_BACKEND_CUDA;
    return kind;
}

ds4_backend_kind ds4_session_params_backend(const ds4_session_params *p)
{
    ds4_backend_kind kind = backend_requested(p);
#if DS4_HAVE_CUDA
    if (kind == DS4_BACKEND_AUTO && ds4_cuda_device_count() > 0) return DS4_BACKEND_CUDA;
#endif
    return kind == DS4_BACKEND_CUDA ? DS4_BACKEND_CUDA : DS4_BACKEND_CPU;
}

static ds4_backend *backend_create(const ds4_session_params *p)
{
    ds4_backend_kind kind = backend_requested(p);
#if DS4_HAVE_CUDA
    if (kind == DS4_BACKEND_CUDA) return ds4_backend_cuda_create(p->gpu_device);
    if (kind == DS4_BACKEND_AUTO && ds4_cuda_device_count() > 0) {
        ds4_backend *be = ds4_backend_cuda_create(p->gpu_device);
        if (be) return be;
    }
#endif
    if (kind != DS4_BACKEND_AUTO && kind != DS4_BACKEND_CPU) {
        ds4_fail(DS4_ERR_INVALID, "session: unknown backend %d", (int)kind);
        return NULL;
    }
    return ds4_backend_cpu_create(p->n_threads);
}

/* A tensor-parallel session: one backend per rank (CUDA: on the rank's
 * device of the model's list), the CPU threads split between them. */
static ds4_status tp_session_create(ds4_session *s, const ds4_session_params *p, const ds4_kv_numerics *nm)
{
    ds4_model *m = s->model;
    int n = ds4_tp_size(m->tp);
    if (p->imatrix)
        return ds4_fail(DS4_ERR_UNSUPPORTED, "session: importance-matrix collection does not run with tensor parallel");
    ds4_session_params q = *p;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = p->n_threads > 0 ? p->n_threads : (int)(cores > 0 ? cores : 1);
    q.n_threads = threads / n > 0 ? threads / n : 1;
    ds4_backend *be[64] = {0};
    ds4_status st = DS4_OK;
    for (int r = 0; r < n && st == DS4_OK; r++) {
        q.gpu_device = m->gpu_devices[r];
        be[r] = backend_create(&q);
        if (!be[r]) st = DS4_ERR_BACKEND;
    }
    if (st != DS4_OK) {
        for (int r = 0; r < n; r++)
            if (be[r]) be[r]->destroy(be[r]);
        return st;
    }
    int chunk = p->max_chunk > 0 ? p->max_chunk : session_chunk_default(be[0], p->n_ctx);
    if (ds4_tp_session_open(m->tp, be, p->n_ctx, chunk, nm, &s->tp) != DS4_OK) return DS4_ERR_INVALID;
    s->be = be[0];
    s->st = ds4_tp_session_state(s->tp, 0);
    return DS4_OK;
}

ds4_session *ds4_session_create(ds4_model *m, const ds4_session_params *params)
{
    ds4_session_params p;
    if (params) p = *params;
    else ds4_session_params_default(&p);
#if !DS4_HAVE_CUDA
    if (p.backend == DS4_BACKEND_CUDA) {
        ds4_fail(DS4_ERR_UNSUPPORTED, "session: this build has no CUDA backend (nvcc was not found at build time)");
        return NULL;
    }
#endif
    if (p.numerics != DS4_NUMERICS_OFFICIAL && p.numerics != DS4_NUMERICS_HF && p.numerics != DS4_NUMERICS_AUTO) {
        ds4_fail(DS4_ERR_INVALID, "session: unknown numerics mode %d", (int)p.numerics);
        return NULL;
    }
    ds4_session *s = calloc(1, sizeof *s);
    if (!s) {
        ds4_fail(DS4_ERR_NOMEM, "session: out of memory");
        return NULL;
    }
    s->model = m;
    if (!(s->place = calloc(1, sizeof *s->place))) {
        ds4_fail(DS4_ERR_NOMEM, "session: out of memory");
        free(s);
        return NULL;
    }
    if (m->tp) {
        ds4_kv_numerics tnm = dsv4_numerics(&m->m->cfg, p.numerics != DS4_NUMERICS_HF);
        if (p.numerics == DS4_NUMERICS_AUTO && dsv4_numerics_check(&m->m->cfg, &tnm) != DS4_OK) {
            ds4_clear_error(); /* as below: shapes without the simulations run the clean math */
            tnm = dsv4_numerics(&m->m->cfg, false);
        }
        s->logits = malloc((size_t)m->m->cfg.n_vocab * sizeof(float));
        if (!s->logits || tp_session_create(s, &p, &tnm) != DS4_OK) {
            if (!s->logits) ds4_fail(DS4_ERR_NOMEM, "session: out of memory");
            ds4_session_free(s);
            return NULL;
        }
        return s;
    }
    /* streaming runs where a backend can take its cache: the CPU for now */
    if (m->experts && p.backend == DS4_BACKEND_AUTO) p.backend = DS4_BACKEND_CPU;
    s->logits = malloc((size_t)m->m->cfg.n_vocab * sizeof(float));
    s->be = s->logits ? backend_create(&p) : NULL;
    if (s->be && p.max_chunk <= 0) p.max_chunk = session_chunk_default(s->be, p.n_ctx);
    if (s->be && p.imatrix) s->be = ds4_imatrix_wrap(p.imatrix, s->be); /* collection only */
    if (!s->be) {
        if (!s->logits) ds4_fail(DS4_ERR_NOMEM, "session: out of memory");
        ds4_session_free(s);
        return NULL;
    }
    if (m->experts) {
        if (!s->be->set_expert_cache) {
            ds4_fail(DS4_ERR_UNSUPPORTED, "session: expert streaming is not available on the %s backend (use the CPU)",
                     s->be->name);
            ds4_session_free(s);
            return NULL;
        }
        s->be->set_expert_cache(s->be, m->experts);
    }
    /* the VRAM expert cache must be set before the weights are uploaded */
    if (m->gpu_slots && ds4_gpu_expert_cache_attach(m->m, s->be, m->gpu_slots, m->evict, m->gpu_preload,
                                                    m->n_gpu_preload) != DS4_OK) {
        ds4_session_free(s);
        return NULL;
    }
    prep_ctx pc = {s->be, DS4_OK};
    dsv4_model_for_each_weight(m->m, prepare_one, &pc);
    ds4_kv_numerics nm = dsv4_numerics(&m->m->cfg, p.numerics != DS4_NUMERICS_HF);
    if (p.numerics == DS4_NUMERICS_AUTO && dsv4_numerics_check(&m->m->cfg, &nm) != DS4_OK) {
        /* The FP8/FP4 simulations are defined on 64-value KV blocks and the
         * 128-wide Hadamard: a model of other shapes runs the clean math. */
        ds4_clear_error();
        nm = dsv4_numerics(&m->m->cfg, false);
    }
    if (pc.st != DS4_OK || dsv4_state_create(m->m, s->be, p.n_ctx, p.max_chunk, &nm, &s->st) != DS4_OK ||
        ds4_dist_session_open(m->m, &p, &s->dist) != DS4_OK) {
        ds4_session_free(s);
        return NULL;
    }
    /* every decode step downloads a logits row into it (batched steps too) */
    if (s->be->host_pin) {
        s->be->host_pin(s->be, s->logits, (size_t)m->m->cfg.n_vocab * sizeof(float), true);
        s->logits_pinned = true;
    }
    return s;
}

void ds4_session_free(ds4_session *s)
{
    if (!s) return;
    ds4_dist_session_close(s->dist);
    if (s->tp) { /* it owns every rank's state and backend, rank 0's too */
        ds4_tp_session_close(s->tp);
        s->st = NULL;
        s->be = NULL;
    }
    dsv4_state_free(s->st);
    ds4_session_edits_free(s->edits);
    ds4_session_spec_free(s->spec);
    if (s->be && s->logits_pinned)
        s->be->host_pin(s->be, s->logits, (size_t)s->model->m->cfg.n_vocab * sizeof(float), false);
    if (s->be) s->be->destroy(s->be);
    free(s->logits);
    free(s->place);
    free(s);
}

/* Whether this session's decode step can leave its logits on the backend
 * and take only the greedy pick (engine/session_access.h). */
bool ds4_session_picks_on_backend(const ds4_session *s)
{
    return !s->dist && !s->tp && dsv4_pick_ready(s->st);
}

/* ds4_session_prefill; keep (with all_logits NULL): the last step's logits
 * stay on the backend (row 0 of the state's buffer) instead of coming
 * into the host row. */
static ds4_status feed(ds4_session *s, const int32_t *tokens, int64_t n, float *all_logits, bool keep)
{
    int V = s->model->m->cfg.n_vocab;
    if (n < 0) return ds4_fail(DS4_ERR_INVALID, "prefill: negative token count %lld", (long long)n);
    if (s->st->n_pos + n > s->st->n_ctx)
        return ds4_fail(DS4_ERR_INVALID, "prefill: %lld tokens after %lld exceed the context length %lld", (long long)n,
                        (long long)s->st->n_pos, (long long)s->st->n_ctx);
    /* the forward overwrites the state's logits buffer: logits a pick
     * left there are replaced now (or lost with a failed step) */
    if (n) s->place->on_backend = false;
    if (s->dist) { /* through the ranks' pipeline (engine/dist.h) */
        ds4_status st = ds4_dist_prefill(s->dist, s->st, tokens, n, all_logits, s->logits);
        if (n) s->have_logits = st == DS4_OK;
        return st;
    }
    if (s->tp) { /* on every rank at once (engine/tp.h) */
        ds4_status st = ds4_tp_prefill(s->tp, tokens, n, all_logits, s->logits);
        if (n) s->have_logits = st == DS4_OK;
        return st;
    }
    for (int64_t i = 0; i < n;) {
        int T = n - i > s->st->max_chunk ? s->st->max_chunk : (int)(n - i);
        bool last = i + T == n;
        ds4_status st;
        if (all_logits) {
            st = dsv4_forward(s->st, tokens + i, T, true, all_logits + (size_t)i * V);
            if (st == DS4_OK && last) memcpy(s->logits, all_logits + (size_t)(n - 1) * V, (size_t)V * sizeof(float));
        } else {
            st = dsv4_forward(s->st, tokens + i, T, false, last && !keep ? s->logits : NULL);
        }
        /* a failed expert read left zeros in the cache: the step is void */
        if (st == DS4_OK && s->model->experts) st = ds4_expert_cache_error(s->model->experts);
        /* the MTP block (when speculating) follows the main model */
        if (st == DS4_OK && s->spec) st = ds4_session_spec_after_forward(s, tokens + i, T);
        if (st != DS4_OK) {
            s->have_logits = false;
            return st;
        }
        i += T;
        if (last) {
            s->have_logits = true;
            s->place->on_backend = keep;
        }
    }
    return DS4_OK;
}

ds4_status ds4_session_prefill(ds4_session *s, const int32_t *tokens, int64_t n, float *all_logits)
{
    return feed(s, tokens, n, all_logits, false);
}

ds4_status ds4_session_decode(ds4_session *s, int32_t token)
{
    return ds4_session_prefill(s, &token, 1, NULL);
}

ds4_status ds4_session_decode_pick(ds4_session *s, int32_t token, int32_t excluded, int32_t *next)
{
    if (!next) return ds4_fail(DS4_ERR_INVALID, "decode_pick: NULL for the picked token");
    *next = -1;
    ds4_status st;
    if (ds4_session_picks_on_backend(s)) {
        st = feed(s, &token, 1, NULL, true);
        if (st == DS4_OK) st = dsv4_logits_pick(s->st, 0, 1, excluded, next);
    } else { /* the host path: the row comes home and is picked here */
        st = ds4_session_decode(s, token);
        if (st == DS4_OK) *next = ds4_argmax_excluding(s->logits, s->model->m->cfg.n_vocab, excluded);
    }
    if (st != DS4_OK) ds4_error_prefix("decode_pick: ");
    return st;
}

/* Logits a pick left on the backend into the host row (engine/session_access.h). */
void ds4_session_logits_home(const ds4_session *s)
{
    if (!s->have_logits || !s->place->on_backend) return;
    s->place->on_backend = false;
    dsv4_logits_download(s->st, 0, s->logits);
}

const float *ds4_session_logits(const ds4_session *s)
{
    if (!s->have_logits) return NULL;
    ds4_session_logits_home(s);
    return s->logits;
}

int64_t ds4_session_n_past(const ds4_session *s) { return s->st->n_pos; }

void ds4_session_reset(ds4_session *s)
{
    dsv4_state_reset(s->st);
    ds4_session_spec_reset(s->spec);
    s->have_logits = false;
    s->place->on_backend = false;
    if (s->tp) ds4_tp_reset_others(s->tp);
    if (s->dist && ds4_dist_reset(s->dist) != DS4_OK) fprintf(stderr, "ds4: %s\n", ds4_last_error());
}

ds4_status ds4_session_warmup(ds4_session *s, int64_t n)
{
    if (n < 0) return ds4_fail(DS4_ERR_INVALID, "warm-up: negative token count %lld", (long long)n);
    if (s->st->n_pos != 0)
        return ds4_fail(DS4_ERR_INVALID, "warm-up: the session holds %lld tokens (it needs an empty one)",
                        (long long)s->st->n_pos);
    if (n == 0) n = s->st->max_chunk;
    if (n > s->st->n_ctx - 1) n = s->st->n_ctx - 1; /* room for the decode */
    if (n < 1) return DS4_OK;
    const int V = s->model->m->cfg.n_vocab;
    int32_t *tok = malloc((size_t)(n + 1) * sizeof *tok);
    if (!tok) return ds4_fail(DS4_ERR_NOMEM, "warm-up: %lld token ids", (long long)n);
    for (int64_t i = 0; i <= n; i++) tok[i] = (int32_t)((i * 7919 + 11) % V); /* varied ids: varied routing */
    const ds4_op_stats keep = s->be ? s->be->stats : (ds4_op_stats){0};
    ds4_status st = ds4_session_prefill(s, tok, n, NULL);
    if (st == DS4_OK) st = ds4_session_decode(s, tok[n]);
    free(tok);
    ds4_session_reset(s);
    if (s->be) s->be->stats = keep;
    return st;
}

/* Snapshot = u32 have_logits, [n_vocab f32 logits], model state bytes. */
size_t ds4_session_snapshot_size(const ds4_session *s)
{
    size_t V = (size_t)s->model->m->cfg.n_vocab;
    return 4 + (s->have_logits ? V * 4 : 0) + dsv4_state_snapshot_size(s->st);
}

ds4_status ds4_session_snapshot(const ds4_session *s, void **out, size_t *len)
{
    size_t V = (size_t)s->model->m->cfg.n_vocab;
    size_t head = 4 + (s->have_logits ? V * 4 : 0);
    size_t n = ds4_session_snapshot_size(s);
    uint8_t *buf = malloc(n);
    if (!buf) return ds4_fail(DS4_ERR_NOMEM, "snapshot: cannot allocate %zu bytes", n);
    uint32_t h = s->have_logits ? 1u : 0u;
    memcpy(buf, &h, 4);
    ds4_session_logits_home(s);
    if (s->have_logits) memcpy(buf + 4, s->logits, V * 4);
    ds4_status st = s->dist ? ds4_dist_snapshot(s->dist, s->st, buf + head, n - head)
                            : dsv4_state_snapshot(s->st, buf + head, n - head);
    if (st != DS4_OK) {
        free(buf);
        return st;
    }
    *out = buf;
    *len = n;
    return DS4_OK;
}

void ds4_session_memory(const ds4_session *s, uint64_t *kv_bytes, uint64_t *work_bytes)
{
    if (kv_bytes) *kv_bytes = s->st->kv_bytes;
    if (work_bytes) *work_bytes = s->st->work_bytes;
}

size_t ds4_session_snapshot_size_max(const ds4_session *s)
{
    size_t V = (size_t)s->model->m->cfg.n_vocab;
    return 4 + V * 4 + dsv4_state_snapshot_size_max(s->st);
}

ds4_status ds4_session_restore(ds4_session *s, const void *data, size_t len)
{
    size_t V = (size_t)s->model->m->cfg.n_vocab;
    const uint8_t *b = data;
    uint32_t h;
    if (len < 4) return ds4_fail(DS4_ERR_FORMAT, "snapshot: %zu bytes is too short", len);
    memcpy(&h, b, 4);
    if (h > 1) return ds4_fail(DS4_ERR_FORMAT, "snapshot: bad logits flag %u", h);
    size_t head = 4 + (h ? V * 4 : 0);
    if (len < head) return ds4_fail(DS4_ERR_FORMAT, "snapshot: %zu bytes, logits need %zu", len, head);
    for (size_t i = 0; h && i < V; i++) {
        float v;
        memcpy(&v, b + 4 + 4 * i, 4);
        if (isnan(v) || v == INFINITY) return ds4_fail(DS4_ERR_INVALID, "snapshot: logit %zu is not finite", i);
    }
    /* a tensor-parallel session's ranks each hold the whole state */
    ds4_status st = s->dist ? ds4_dist_restore(s->dist, s->st, b + head, len - head)
                    : s->tp ? ds4_tp_restore(s->tp, b + head, len - head)
                            : dsv4_state_restore(s->st, b + head, len - head);
    if (st != DS4_OK) return st;
    if (h) memcpy(s->logits, b + 4, V * 4);
    s->have_logits = h != 0;
    s->place->on_backend = false;
    /* the MTP block (when speculating) has no part in a snapshot: it
     * starts over from the next tokens (drafts only, never the output) */
    ds4_session_spec_reset(s->spec);
    return DS4_OK;
}

void ds4_session_get_stats(const ds4_session *s, ds4_session_stats *o)
{
    const ds4_op_stats *t = &s->be->stats;
    o->rows_attended = t->rows_attended;
    o->compressor_pushes = t->compressor_pushes;
    o->rows_emitted = t->rows_emitted;
    o->indexer_keys_scored = t->indexer_keys_scored;
    o->matmul_rows = t->matmul_rows;
}

/* engine/model_access.h: the model for other engine files. */
const dsv4_model *ds4_model_dsv4(const ds4_model *m) { return m->m; }

/* engine/session_access.h: the state and logits for session_batch.c. */
dsv4_state *ds4_session_dsv4(ds4_session *s) { return s->st; }
float *ds4_session_logits_buffer(ds4_session *s) { return s->logits; }
void **ds4_session_edits_slot(ds4_session *s) { return &s->edits; }
void **ds4_session_spec_slot(ds4_session *s) { return &s->spec; }
void ds4_session_set_have_logits(ds4_session *s, bool have)
{
    s->have_logits = have;
    s->place->on_backend = false; /* the caller wrote the host row, or there are none */
}
void ds4_session_set_logits_on_backend(ds4_session *s)
{
    s->have_logits = true;
    s->place->on_backend = true;
}
struct ds4_dist_session *ds4_session_dist(ds4_session *s) { return s->dist; }
struct ds4_tp_session *ds4_session_tp(ds4_session *s) { return s->tp; }
ds4_status ds4_session_stream_error(ds4_session *s)
{
    return s->model->experts ? ds4_expert_cache_error(s->model->experts) : DS4_OK;
}

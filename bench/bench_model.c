/*
 * bench_model.c - ds4-bench's model mode: prefill and decode throughput
 * of one session at context frontiers, with the bandwidth roofline.
 *
 * One fixed token sequence (BOS + the tokenized --prompt-file) is walked
 * to frontiers ctx-start, ..., ctx-max. At each frontier only the tokens
 * added since the previous one are prefilled (that is the timed prefill
 * interval, so a row measures prefill speed *at* that context, not an
 * average from 0), the session is snapshotted, a greedy decode of
 * --gen-tokens tokens runs (EOS excluded so every row decodes the same
 * number of tokens; timed), and the snapshot is restored so the next
 * frontier continues the original sequence. Snapshot and restore are
 * outside both timings. The walk is the same as antirez/ds4's ds4-bench,
 * so rows are comparable; the roofline columns are DwarfStar's: weight
 * bytes per token from the model's tensor table and the copy bandwidth
 * of the backend's memory, measured at each frontier right after the
 * decode probe (bench_model_bandwidth.c).
 *
 * --batch-sessions N adds a second probe per frontier: N more sessions
 * are restored from the same snapshot, each fed a different token so they
 * hold different sequences (and route to different experts), and stepped
 * together through ds4_session_decode_batch for gen_tokens steps; the
 * mean number of distinct tokens picked per step is reported; batch_gen_tps is the
 * aggregate N x gen_tokens / seconds. That call is one forward over the N
 * rows (each weight read once per step). --batch-loop times the same
 * steps again with one ds4_session_decode per session (loop_gen_tps),
 * which is what the batched call replaced, and warns if the two pick
 * different tokens.
 *
 * The greedy steps feed and pick in one call (ds4_session_decode_pick,
 * ds4_session_decode_batch_pick): on a backend that picks on its side
 * (CUDA) only the picked ids cross to the host. --host-pick times the path
 * before it instead (the logits row downloaded each step and picked here),
 * for A/B runs; both pick the same tokens.
 */
#include "bench/bench_model.h"

#include "bench/bench_disk.h"

#include "bench/bench_plot.h"
#include "include/ds4_sampler.h"
#if DS4_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#include "backend/cuda/cuda_expert_cache.h"
#endif
#include "include/ds4_tokenizer.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int64_t bench_model_next_frontier(const bench_model_opts *o, int64_t cur)
{
    if (cur >= o->ctx_max) return o->ctx_max;
    int64_t next;
    if (o->step_mul == 1.0) {
        next = cur + o->step_incr;
    } else {
        double v = ceil((double)cur * o->step_mul);
        next = v >= (double)o->ctx_max ? o->ctx_max : (int64_t)v;
        if (next <= cur) next = cur + 1;
    }
    return next > o->ctx_max ? o->ctx_max : next;
}

int32_t bench_model_argmax_excluding(const float *logits, int n_vocab, int32_t excluded)
{
    return ds4_argmax_excluding(logits, n_vocab, excluded);
}

void bench_model_csv_header(FILE *f, const bench_model_opts *o)
{
    fprintf(f, "%s%s%s%s\n", BENCH_MODEL_CSV_HEADER, o->batch_sessions > 0 ? BENCH_MODEL_CSV_BATCH : "",
            o->batch_sessions > 0 && o->batch_loop ? BENCH_MODEL_CSV_LOOP : "", o->mtp ? BENCH_MODEL_CSV_MTP : "");
    fflush(f);
}

void bench_model_csv_row(FILE *f, const bench_model_row *r)
{
    fprintf(f, "%lld,%lld,%.2f,%d,%.2f,%llu,%llu,%.2f", (long long)r->ctx, (long long)r->prefill_tokens,
            r->prefill_tps, r->gen_tokens, r->gen_tps, (unsigned long long)r->kvcache_bytes,
            (unsigned long long)r->weight_bytes_per_token, r->roofline_tps);
    if (r->batch_sessions > 0) fprintf(f, ",%d,%.2f", r->batch_sessions, r->batch_gen_tps);
    if (r->batch_sessions > 0 && r->batch_loop) fprintf(f, ",%.2f", r->loop_gen_tps);
    if (r->mtp_draft > 0)
        fprintf(f, ",%d,%.2f,%.4f,%.2f,%.1f,%.1f", r->mtp_draft, r->mtp_gen_tps, r->mtp_accept, r->mtp_full_gen_tps,
                r->mtp_rb_us, r->mtp_full_rb_us);
    fprintf(f, "\n");
    fflush(f);
}

void bench_model_session_params(const bench_model_opts *o, ds4_session_params *p)
{
    ds4_session_params_default(p);
    p->n_ctx = o->ctx_alloc;
    p->numerics = o->numerics;
    p->gpu_device = o->gpu_device;
    p->n_threads = o->threads;
    p->backend = o->backend;
    if (o->prefill_chunk) p->max_chunk = o->prefill_chunk;
}

/* The timed greedy probe: gen_tokens decode steps from the current logits.
 * The first token is picked from the logits the prefill brought home; then
 * each step feeds its token and picks the next, on the device where the
 * backend can (ds4_session_decode_pick: the logits row stays there), or
 * with host_pick as before: the row downloaded, picked here. */
static int gen_probe(ds4_session *s, int n_vocab, int32_t eos, int n, int64_t frontier, int host_pick)
{
    const float *lg = ds4_session_logits(s);
    int32_t tok = lg ? bench_model_argmax_excluding(lg, n_vocab, eos) : -1;
    for (int i = 0; i < n; i++) {
        if (tok < 0) {
            fprintf(stderr, "ds4-bench: no token to pick (no logits, or none but EOS usable) at frontier %lld\n",
                    (long long)frontier);
            return 1;
        }
        ds4_status st;
        if (host_pick) {
            st = ds4_session_decode(s, tok);
            lg = st == DS4_OK ? ds4_session_logits(s) : NULL;
            tok = lg ? bench_model_argmax_excluding(lg, n_vocab, eos) : -1;
        } else {
            st = ds4_session_decode_pick(s, tok, eos, &tok);
        }
        if (st != DS4_OK) {
            fprintf(stderr, "ds4-bench: decode step %d at frontier %lld: %s\n", i, (long long)frontier,
                    ds4_last_error());
            return 1;
        }
    }
    return 0;
}

/* The speculative probe (--mtp): the same greedy decode of n tokens
 * with the MTP block drafting; tokens/s and the share of drafts accepted. */
static int mtp_probe(ds4_session *s, int n_vocab, int n, int64_t frontier, double *secs, double *accept,
                     double *rb_us)
{
    ds4_spec_stats a, b;
    ds4_session_spec_stats(s, &a);
    const float *lg = ds4_session_logits(s);
    int32_t tok = lg ? ds4_argmax(lg, n_vocab) : -1, out[17];
    double t0 = now_s();
    for (int done = 0; done < n;) {
        int k = 0;
        if (tok < 0 || ds4_session_decode_spec(s, tok, NULL, NULL, -1, n - done, out, &k) != DS4_OK) {
            fprintf(stderr, "ds4-bench: mtp decode at frontier %lld: %s\n", (long long)frontier, ds4_last_error());
            return 1;
        }
        done += k;
        tok = out[k - 1];
    }
    *secs = now_s() - t0;
    ds4_session_spec_stats(s, &b);
    *accept = b.drafted > a.drafted ? (double)(b.accepted - a.accepted) / (double)(b.drafted - a.drafted) : 0;
    *rb_us = b.steps > a.steps ? 1e6 * (b.rollback_s - a.rollback_s) / (double)(b.steps - a.steps) : 0;
    return 0;
}

/* The batched probe: n sessions restored from the frontier's snapshot,
 * then each fed its own token (diverge[k], untimed) so that the sessions
 * hold different sequences and pick different tokens from then on, as real
 * users' sessions do: restored as they are, all n would pick the same
 * token every step, route to the same 6 experts and overstate the batch's
 * speed. Then gen_tokens steps (each session picks its own greedy token;
 * timed). loop = 0: each step is one ds4_session_decode_batch_pick; loop =
 * 1: one ds4_session_decode_pick per session, whose picks should equal
 * those of the batched run, kept in picks[step * n + k]. The first step's
 * tokens are picked from the logits the untimed decode brought home, the
 * later ones by the steps (on the device where the backend can); host_pick:
 * every step's from the downloaded rows (ds4_session_decode_batch /
 * ds4_session_decode, then ds4_argmax_excluding), the path before them.
 * Seconds in *secs; the mean number of distinct tokens picked per step in
 * *distinct. */
static int batch_probe(ds4_session **bs, int n, const void *snap, size_t snap_len, const int32_t *diverge,
                       int n_vocab, int32_t eos, int gen_tokens, int64_t frontier, int loop, int host_pick,
                       int32_t *picks, double *secs, double *distinct)
{
    int rc = 0;
    int32_t *cur = malloc((size_t)n * sizeof *cur); /* the tokens the last step picked */
    if (!cur) {
        fprintf(stderr, "ds4-bench: out of memory\n");
        return 1;
    }
    for (int k = 0; k < n && !rc; k++)
        if (ds4_session_restore(bs[k], snap, snap_len) != DS4_OK || ds4_session_decode(bs[k], diverge[k]) != DS4_OK) {
            fprintf(stderr, "ds4-bench: restore of batch session %d at %lld: %s\n", k, (long long)frontier,
                    ds4_last_error());
            rc = 1;
        }
    long n_distinct = 0;
    int differ = 0;
    double t0 = now_s();
    for (int i = 0; i < gen_tokens && !rc; i++) {
        int32_t *next = picks + (size_t)i * n;
        for (int k = 0; k < n && !rc; k++) {
            int32_t t = cur[k];
            if (i == 0 || host_pick) {
                const float *lg = ds4_session_logits(bs[k]);
                t = lg ? bench_model_argmax_excluding(lg, n_vocab, eos) : -1;
            }
            if (t < 0) {
                fprintf(stderr, "ds4-bench: batch session %d has no token to pick at %lld\n", k,
                        (long long)frontier);
                rc = 1;
            } else if (!loop) {
                next[k] = t;
            } else {
                differ += t != next[k];
                ds4_status st =
                    host_pick ? ds4_session_decode(bs[k], t) : ds4_session_decode_pick(bs[k], t, eos, &cur[k]);
                if (st != DS4_OK) {
                    fprintf(stderr, "ds4-bench: looped decode step %d, session %d at %lld: %s\n", i, k,
                            (long long)frontier, ds4_last_error());
                    rc = 1;
                }
            }
        }
        for (int k = 0; k < n && !rc; k++) {
            int seen = 0;
            for (int j = 0; j < k; j++) seen |= next[j] == next[k];
            n_distinct += !seen;
        }
        ds4_status st = DS4_OK;
        if (!rc && !loop)
            st = host_pick ? ds4_session_decode_batch(bs, next, n) : ds4_session_decode_batch_pick(bs, next, n, eos, cur);
        if (st != DS4_OK) {
            fprintf(stderr, "ds4-bench: batched decode step %d at %lld: %s\n", i, (long long)frontier,
                    ds4_last_error());
            rc = 1;
        }
    }
    *secs = now_s() - t0;
    free(cur);
    *distinct = gen_tokens > 0 ? (double)n_distinct / gen_tokens : 0;
    /* on the CPU the two are bit-identical; elsewhere a near tie may flip */
    if (!rc && differ)
        fprintf(stderr, "ds4-bench: warning: at %lld the looped decode picked %d tokens other than the batched one\n",
                (long long)frontier, differ);
    return rc;
}

/* Disk read bandwidth (bytes/s) measured before the walk, for the
 * streaming roofline: decode tokens/s <= disk bandwidth / bytes read per
 * token. */
static double g_disk_bw;

static double hit_rate(const ds4_expert_stream_stats *a, const ds4_expert_stream_stats *b)
{
    uint64_t h = b->hits - a->hits, n = h + b->misses - a->misses;
    return n ? 100.0 * (double)h / (double)n : 0.0;
}

/* One line per frontier: hit rates and bytes read for its prefill and its
 * decode probe, and the decode's streaming roofline. */
static void log_stream(const bench_model_opts *o, const bench_model_row *r, const ds4_expert_stream_stats *x0,
                       const ds4_expert_stream_stats *x1, const ds4_expert_stream_stats *x2,
                       const ds4_expert_stream_stats *x3, double prefill_s, double gen_s)
{
    double MiB = 1024.0 * 1024.0;
    double pf_read = (double)(x1->bytes_read - x0->bytes_read), gen_read = (double)(x3->bytes_read - x2->bytes_read);
    double per_tok = o->gen_tokens ? gen_read / o->gen_tokens : 0;
    fprintf(stderr,
            "ds4-bench: ctx %lld: expert cache %llu experts: prefill hit %.1f%%, %.1f MiB read/token, read %.2f GB/s; "
            "decode hit %.1f%%, %.1f MiB read/token, read %.2f GB/s, disk roofline %.2f tok/s (disk %.2f GB/s)\n",
            (long long)r->ctx, (unsigned long long)x3->cache_experts, hit_rate(x0, x1),
            r->prefill_tokens ? pf_read / (double)r->prefill_tokens / MiB : 0, prefill_s > 0 ? pf_read / prefill_s / 1e9 : 0,
            hit_rate(x2, x3), per_tok / MiB, gen_s > 0 ? gen_read / gen_s / 1e9 : 0,
            per_tok > 0 ? g_disk_bw / per_tok : 0, g_disk_bw / 1e9);
}

static int walk_frontiers(ds4_model *m, ds4_session *s, const bench_model_opts *o, const int32_t *tokens,
                          int32_t eos, bench_bw *meter, double bandwidth, FILE *csv, bench_model_hook hook,
                          void *hook_ctx, bench_model_row **rows, int *n_rows, ds4_session **bs, int nb,
                          int64_t prev)
{
    int n_vocab = ds4_model_n_vocab(m);
    int rc = 0;
    for (int64_t frontier = o->ctx_start;; frontier = bench_model_next_frontier(o, frontier)) {
        bench_model_row r = {.ctx = frontier, .prefill_tokens = frontier - prev, .gen_tokens = o->gen_tokens};
        ds4_expert_stream_stats x0, x1, x2, x3;
        ds4_model_expert_stream_stats(m, &x0);
        double t0 = now_s();
        if (ds4_session_prefill(s, tokens + prev, frontier - prev, NULL) != DS4_OK) {
            fprintf(stderr, "ds4-bench: prefill %lld..%lld: %s\n", (long long)prev, (long long)frontier,
                    ds4_last_error());
            return 1;
        }
        double t1 = now_s();
        ds4_model_expert_stream_stats(m, &x1);
        void *snap = NULL;
        size_t snap_len = 0;
        if (ds4_session_snapshot(s, &snap, &snap_len) != DS4_OK) {
            fprintf(stderr, "ds4-bench: snapshot at %lld: %s\n", (long long)frontier, ds4_last_error());
            return 1;
        }
        ds4_model_expert_stream_stats(m, &x2);
        /* --mtp: the plain probe runs without the block following it */
        if (o->mtp && (ds4_session_spec_mark(s) != DS4_OK)) {
            fprintf(stderr, "ds4-bench: mtp mark at %lld: %s\n", (long long)frontier, ds4_last_error());
            return 1;
        }
        ds4_session_spec_pause(s, 1);
        double t2 = now_s();
        rc = gen_probe(s, n_vocab, eos, o->gen_tokens, frontier, o->host_pick);
        double t3 = now_s();
        ds4_session_spec_pause(s, 0);
        /* the phases' bounds on the clock `perf record -k CLOCK_MONOTONIC`
           stamps samples with: bench/cpu_profile.sh splits a profile by them */
        fprintf(stderr, "ds4-bench: ctx %lld: phases (CLOCK_MONOTONIC s): prefill %.6f %.6f decode %.6f %.6f\n",
                (long long)frontier, t0, t1, t2, t3);
        double mtp_secs = 0, mtp_accept = 0, full_secs = 0, full_accept = 0, rb_us[2] = {0, 0};
        /* the speculative probe from the same point, rolling rejected
         * drafts back by the undo record, then again by full snapshots
         * (the same tokens and drafts: only the rollback's cost differs).
         * A restore restarts the MTP block, so its mark comes back too. */
        for (int full = 0; full < 2 && !rc && o->mtp; full++) {
            if (ds4_session_restore(s, snap, snap_len) != DS4_OK || ds4_session_spec_rewind(s) != DS4_OK) {
                fprintf(stderr, "ds4-bench: restore at %lld: %s\n", (long long)frontier, ds4_last_error());
                rc = 1;
            }
            ds4_session_spec_full_snapshot(s, full);
            if (!rc) rc = mtp_probe(s, n_vocab, o->gen_tokens, frontier, full ? &full_secs : &mtp_secs,
                                    full ? &full_accept : &mtp_accept, &rb_us[full]);
            ds4_session_spec_full_snapshot(s, 0);
        }
        ds4_model_expert_stream_stats(m, &x3);
        r.bandwidth = bandwidth;
        if (!rc && meter) rc = bench_bw_measure(meter, &r.bandwidth);
        if (!rc && (ds4_session_restore(s, snap, snap_len) != DS4_OK || ds4_session_spec_rewind(s) != DS4_OK)) {
            fprintf(stderr, "ds4-bench: restore at %lld: %s\n", (long long)frontier, ds4_last_error());
            rc = 1;
        }
        double batch_secs = 0, loop_secs = 0, distinct = 0, distinct_loop = 0;
        int32_t *picks = nb ? malloc(sizeof(int32_t) * (size_t)nb * ((size_t)o->gen_tokens + 1)) : NULL;
        if (nb && !picks) {
            fprintf(stderr, "ds4-bench: out of memory\n");
            rc = 1;
        }
        int32_t *diverge = picks ? picks + (size_t)nb * (size_t)o->gen_tokens : NULL;
        for (int k = 0; k < nb && diverge; k++) /* session k's own token: one from earlier in the text */
            diverge[k] = tokens[(int64_t)(1 + 37 * k) % frontier];
        if (!rc && nb)
            rc = batch_probe(bs, nb, snap, snap_len, diverge, n_vocab, eos, o->gen_tokens, frontier, 0, o->host_pick,
                             picks, &batch_secs, &distinct);
        if (!rc && nb && o->batch_loop)
            rc = batch_probe(bs, nb, snap, snap_len, diverge, n_vocab, eos, o->gen_tokens, frontier, 1, o->host_pick,
                             picks, &loop_secs, &distinct_loop);
        if (!rc && nb)
            fprintf(stderr, "ds4-bench: ctx %lld: %d batched sessions picked %.1f distinct tokens per step\n",
                    (long long)frontier, nb, distinct);
        free(picks);
        free(snap);
        if (rc) return rc;
        r.prefill_tps = t1 > t0 ? (double)r.prefill_tokens / (t1 - t0) : 0;
        r.gen_tps = t3 > t2 ? (double)o->gen_tokens / (t3 - t2) : 0;
        r.kvcache_bytes = snap_len;
        r.weight_bytes_per_token = ds4_model_weight_bytes_per_token(m, frontier + 1);
        r.roofline_tps = r.weight_bytes_per_token ? r.bandwidth / (double)r.weight_bytes_per_token : 0;
        r.batch_sessions = nb;
        r.batch_gen_tps = batch_secs > 0 ? (double)nb * o->gen_tokens / batch_secs : 0;
        r.batch_loop = nb && o->batch_loop;
        r.loop_gen_tps = loop_secs > 0 ? (double)nb * o->gen_tokens / loop_secs : 0;
        r.mtp_draft = o->mtp ? (o->mtp_draft ? o->mtp_draft : 2) : 0;
        r.mtp_gen_tps = mtp_secs > 0 ? (double)o->gen_tokens / mtp_secs : 0;
        r.mtp_accept = mtp_accept;
        r.mtp_full_gen_tps = full_secs > 0 ? (double)o->gen_tokens / full_secs : 0;
        r.mtp_rb_us = rb_us[0];
        r.mtp_full_rb_us = rb_us[1];
        if (o->mtp && full_accept != mtp_accept)
            fprintf(stderr, "ds4-bench: ctx %lld: the two rollback schemes accepted different drafts (%.4f, %.4f)\n",
                    (long long)frontier, mtp_accept, full_accept);
        bench_model_row *grown = realloc(*rows, (size_t)(*n_rows + 1) * sizeof *grown);
        if (!grown) {
            fprintf(stderr, "ds4-bench: out of memory\n");
            return 1;
        }
        *rows = grown;
        (*rows)[(*n_rows)++] = r;
        if (csv) bench_model_csv_row(csv, &r);
        if (meter)
            fprintf(stderr, "ds4-bench: ctx %lld: bandwidth %.2f GB/s, decode at %.0f%% of its roofline\n",
                    (long long)frontier, r.bandwidth / 1e9, r.roofline_tps > 0 ? 100 * r.gen_tps / r.roofline_tps : 0);
        if (o->model_opt.ssd_streaming) log_stream(o, &r, &x0, &x1, &x2, &x3, t1 - t0, t3 - t2);
        if (hook && (rc = hook(hook_ctx, s, &r)) != 0) return rc;
        prev = frontier;
        if (frontier >= o->ctx_max) break;
    }
    return 0;
}

int bench_model_batch_open(ds4_model *m, const bench_model_opts *o, ds4_session ***out)
{
    const int nb = o->batch_sessions > 0 ? o->batch_sessions : 0;
    *out = NULL;
    if (!nb) return 0;
    ds4_session **bs = calloc((size_t)nb, sizeof *bs);
    if (!bs) {
        fprintf(stderr, "ds4-bench: out of memory\n");
        return 1;
    }
    ds4_session_params bp;
    bench_model_session_params(o, &bp);
    /* they are restored from snapshots and decode, never prefill: their
     * activation buffers need the batched step's rows only (nb, in
     * session 0's), not the prefill chunk's (~0.45 MiB a row on the full
     * Flash: 16 sessions at CUDA's 2048 did not fit an 80 GB card beside
     * a 57 GB model) */
    if (bp.max_chunk <= 0 || bp.max_chunk > nb) bp.max_chunk = nb;
    for (int k = 0; k < nb; k++)
        if (!(bs[k] = ds4_session_create(m, &bp))) {
            fprintf(stderr, "ds4-bench: batch session %d of %d (ctx %lld): %s\n", k, nb, (long long)bp.n_ctx,
                    ds4_last_error());
            bench_model_batch_close(o, bs);
            return 1;
        }
    *out = bs;
    return 0;
}

void bench_model_batch_close(const bench_model_opts *o, ds4_session **bs)
{
    if (!bs) return;
    for (int k = 0; k < o->batch_sessions; k++) ds4_session_free(bs[k]);
    free(bs);
}

int bench_model_walk_batch(ds4_model *m, ds4_session *s, ds4_session **bs, const bench_model_opts *o,
                           const int32_t *tokens, int32_t eos, bench_bw *meter, double bandwidth, FILE *csv,
                           bench_model_hook hook, void *hook_ctx, bench_model_row **rows, int *n_rows)
{
    const int nb = bs && o->batch_sessions > 0 ? o->batch_sessions : 0;
    return walk_frontiers(m, s, o, tokens, eos, meter, bandwidth, csv, hook, hook_ctx, rows, n_rows, bs, nb,
                          ds4_session_n_past(s));
}

int bench_model_walk(ds4_model *m, ds4_session *s, const bench_model_opts *o, const int32_t *tokens,
                     int32_t eos, bench_bw *meter, double bandwidth, FILE *csv, bench_model_hook hook,
                     void *hook_ctx, bench_model_row **rows, int *n_rows)
{
    ds4_session **bs = NULL;
    if (bench_model_batch_open(m, o, &bs)) return 1;
    int rc = bench_model_walk_batch(m, s, bs, o, tokens, eos, meter, bandwidth, csv, hook, hook_ctx, rows, n_rows);
    bench_model_batch_close(o, bs);
    return rc;
}

/* BOS + the file's tokens. */
static int load_tokens(const bench_model_opts *o, ds4_tokens *out, int32_t *eos)
{
    ds4_tokenizer *tok = ds4_tokenizer_load(o->model_path);
    if (!tok) {
        fprintf(stderr, "ds4-bench: tokenizer of %s: %s\n", o->model_path, ds4_last_error());
        return 1;
    }
    FILE *f = fopen(o->prompt_path, "rb");
    char *text = NULL;
    size_t len = 0;
    int rc = 1;
    if (!f) {
        fprintf(stderr, "ds4-bench: cannot open %s: %s\n", o->prompt_path, strerror(errno));
        goto done;
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fprintf(stderr, "ds4-bench: %s is not a regular file\n", o->prompt_path);
        goto done;
    }
    len = (size_t)sb.st_size;
    text = malloc(len + 1);
    if (!text || fread(text, 1, len, f) != len) {
        fprintf(stderr, "ds4-bench: cannot read %s (%zu bytes)\n", o->prompt_path, len);
        goto done;
    }
    *eos = ds4_tokenizer_special(tok, DS4_TOK_EOS);
    if (ds4_tokens_push(out, ds4_tokenizer_special(tok, DS4_TOK_BOS)) != DS4_OK ||
        ds4_tokenize(tok, text, len, 0, out) != DS4_OK) {
        fprintf(stderr, "ds4-bench: tokenizing %s: %s\n", o->prompt_path, ds4_last_error());
        goto done;
    }
    rc = 0;
done:
    if (f) fclose(f);
    free(text);
    ds4_tokenizer_free(tok);
    return rc;
}

static int write_plot(const bench_model_opts *o, const bench_model_row *rows, int n, const char *bw_what)
{
    double bw_lo = n ? rows[0].bandwidth : 0, bw_hi = bw_lo;
    for (int i = 1; i < n; i++) {
        if (rows[i].bandwidth < bw_lo) bw_lo = rows[i].bandwidth;
        if (rows[i].bandwidth > bw_hi) bw_hi = rows[i].bandwidth;
    }
    double *x = malloc(sizeof(double) * (size_t)(4 * n + 1));
    if (!x) return 1;
    double *pf = x + n, *gen = pf + n, *roof = gen + n;
    for (int i = 0; i < n; i++) {
        x[i] = (double)rows[i].ctx;
        pf[i] = rows[i].prefill_tps;
        gen[i] = rows[i].gen_tps;
        roof[i] = rows[i].roofline_tps;
    }
    const char *slash = strrchr(o->model_path, '/');
    char title[256], sub[512];
    snprintf(title, sizeof title, "ds4-bench: %s", slash ? slash + 1 : o->model_path);
    snprintf(sub, sizeof sub, "backend %s, %s numerics, %d gen tokens per frontier; roofline = %.1f-%.1f GB/s (%s) / weight bytes per token",
             o->backend == DS4_BACKEND_CUDA ? "cuda" : "cpu", o->numerics == DS4_NUMERICS_HF ? "hf" : o->numerics == DS4_NUMERICS_OFFICIAL ? "official" : "auto",
             o->gen_tokens, bw_lo / 1e9, bw_hi / 1e9, bw_what);
    bench_plot_series s_pf[] = {{"prefill", "#1f77b4", pf, 0}};
    bench_plot_series s_gen[] = {{"decode", "#d62728", gen, 0}, {"roofline", "#555555", roof, 1}};
    bench_plot_panel panels[] = {{"prefill tokens/s", s_pf, 1}, {"decode tokens/s", s_gen, 2}};
    int rc = bench_plot_svg(o->plot_path, title, sub, "context (tokens)", x, n, panels, 2);
    free(x);
    return rc;
}

/* Peak resident set (VmHWM): with plain mmap it counts the model's pages
 * that were touched; with streaming, the cache and the resident weights. */
static void log_peak_rss(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (sscanf(line, "VmHWM: %llu kB", &kb) == 1)
            fprintf(stderr, "ds4-bench: peak RSS %.2f GiB\n", (double)kb / (1024.0 * 1024.0));
    }
    if (f) fclose(f);
}

/* Timings on a shared machine mean little without its load: log it. */
static void log_load(const char *when)
{
    FILE *f = fopen("/proc/loadavg", "r");
    double a = 0, b = 0, c = 0;
    if (f && fscanf(f, "%lf %lf %lf", &a, &b, &c) == 3)
        fprintf(stderr, "ds4-bench: load average %s: %.2f %.2f %.2f\n", when, a, b, c);
    if (f) fclose(f);
}

int ds4_bench_model_main(int argc, char **argv)
{
    bench_model_opts o;
    int rc = bench_model_parse(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;

    ds4_tokens toks = {0};
    int32_t eos = -1;
    ds4_model *m = NULL;
    ds4_session *s = NULL, **bs = NULL;
    FILE *csv = NULL;
    bench_bw *meter = NULL;
    bench_model_row *rows = NULL;
    int n_rows = 0;
    rc = 1;
    if (load_tokens(&o, &toks, &eos)) goto done;
    if ((int64_t)toks.n < o.ctx_max) {
        fprintf(stderr, "ds4-bench: %s gives %zu tokens (with BOS), --ctx-max %lld needs that many\n",
                o.prompt_path, toks.n, (long long)o.ctx_max);
        goto done;
    }
    fprintf(stderr, "ds4-bench: %s: %zu tokens\n", o.prompt_path, toks.n);
    double t0 = now_s();
    if (o.model_opt.ssd_streaming) {
        /* the disk first, before the cache and the model fill memory */
        double bw = bench_disk_read_bw(o.model_path, 8u << 20, 2ull << 30, 8);
        g_disk_bw = bw > 0 ? bw : 0;
        fprintf(stderr, "ds4-bench: disk read bandwidth %.2f GB/s (random 8 MiB reads of %s, 8 in flight, page cache "
                        "dropped)\n", g_disk_bw / 1e9, o.model_path);
    }
#if DS4_HAVE_CUDA
    if (o.backend == DS4_BACKEND_CUDA && (o.model_opt.gpu_cache_experts || o.model_opt.gpu_cache_bytes)) {
        /* the roofline of a VRAM expert cache: what a miss's copy can get */
        double pin = ds4_cuda_h2d_bandwidth(o.gpu_device, 1ull << 30, 1, 5);
        double pag = ds4_cuda_h2d_bandwidth(o.gpu_device, 1ull << 30, 0, 3);
        fprintf(stderr, "ds4-bench: host->device copy bandwidth %.2f GB/s pinned, %.2f GB/s pageable (1 GiB cudaMemcpy, "
                        "median)\n", pin / 1e9, pag / 1e9);
    }
#endif
    if (!(m = ds4_model_open(o.model_path, &o.model_opt))) {
        fprintf(stderr, "ds4-bench: %s: %s\n", o.model_path, ds4_last_error());
        goto done;
    }
    ds4_session_params p;
    bench_model_session_params(&o, &p);
    if (!(s = ds4_session_create(m, &p))) {
        fprintf(stderr, "ds4-bench: session (ctx %lld): %s\n", (long long)o.ctx_alloc, ds4_last_error());
        goto done;
    }
    if (o.mtp && (ds4_model_load_mtp(m, o.mtp) != DS4_OK || ds4_session_set_mtp(s, o.mtp_draft ? o.mtp_draft : 2) != DS4_OK)) {
        fprintf(stderr, "ds4-bench: --mtp %s: %s\n", o.mtp, ds4_last_error());
        goto done;
    }
    /* the batch sessions before the first prefill (warm-up or walk): see
     * bench_model_walk_batch */
    if (bench_model_batch_open(m, &o, &bs)) goto done;
    fprintf(stderr, "ds4-bench: model and session ready in %.1f s\n", now_s() - t0);
    if (o.warmup) {
        double w0 = now_s();
        if (ds4_session_warmup(s, 0) != DS4_OK) {
            fprintf(stderr, "ds4-bench: --warmup: %s\n", ds4_last_error());
            goto done;
        }
        fprintf(stderr, "ds4-bench: warm-up (one prefill step and a decode, untimed): %.3f s\n", now_s() - w0);
    }
    {
        long long huge = ds4_model_weight_huge_bytes(m);
        if (huge >= 0) /* after the open: what --warm-weights or loading mapped in so far */
            fprintf(stderr, "ds4-bench: weights mapped in huge pages: %.2f GiB\n", (double)huge / (1 << 30));
        char numa[256];
        if (ds4_model_weight_numa(m, numa, sizeof numa) >= 0) fprintf(stderr, "ds4-bench: weights' NUMA placement: %s\n", numa);
    }
    const char *bw_what = "";
    if (!(meter = bench_bw_open(o.backend, o.gpu_device, o.threads, &bw_what))) goto done;
    fprintf(stderr, "ds4-bench: bandwidth: %s, measured after each frontier's decode\n", bw_what);
    if (o.csv_path && !(csv = fopen(o.csv_path, "w"))) {
        fprintf(stderr, "ds4-bench: cannot write %s: %s\n", o.csv_path, strerror(errno));
        goto done;
    }
    FILE *out = csv ? csv : stdout;
    bench_model_csv_header(out, &o);
    log_load("before the walk");
    if (bench_model_walk_batch(m, s, bs, &o, toks.ids, eos, meter, 0, out, NULL, NULL, &rows, &n_rows)) goto done;
    log_load("after the walk");
    log_peak_rss();
#if DS4_HAVE_CUDA
    if (ds4_session_params_backend(&p) == DS4_BACKEND_CUDA) {
        /* a prefill without them dequantizes every chunk (docs/CUDA.md) */
        int made = 0, skipped = 0;
        size_t bytes = 0;
        ds4_cuda_bf16copy_stats(&made, &bytes, &skipped);
        fprintf(stderr, "ds4-bench: the prefill GEMM's bf16 weight copies: %d (%.2f GiB), %d weights without (no room)\n",
                made, (double)bytes / (1 << 30), skipped);
    }
#endif
    if (o.plot_path && write_plot(&o, rows, n_rows, bw_what)) {
        fprintf(stderr, "ds4-bench: cannot write the chart %s\n", o.plot_path);
        goto done;
    }
    rc = 0;
done:
    if (csv && fclose(csv) != 0 && rc == 0) {
        fprintf(stderr, "ds4-bench: writing %s failed\n", o.csv_path);
        rc = 1;
    }
    free(rows);
    bench_bw_close(meter);
    bench_model_batch_close(&o, bs);
    ds4_session_free(s);
    ds4_model_close(m);
    ds4_tokens_free(&toks);
    return rc;
}

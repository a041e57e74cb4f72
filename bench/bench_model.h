/*
 * bench_model.h - ds4-bench's model mode (prefill / decode throughput at
 * context frontiers), split by concern:
 *   bench_model_options.c   the command line (antirez/ds4's ds4-bench flags)
 *   bench_model.c           the frontier walk and the mode's entry point
 *   bench_model_bandwidth.c the memory bandwidth of the backend's memory
 *   bench_plot_svg.c        the --plot chart
 * The walk is a library function with a per-row hook so that a test can
 * look at the session after every gen probe + restore.
 */
#ifndef DS4_BENCH_BENCH_MODEL_H
#define DS4_BENCH_BENCH_MODEL_H

#include "include/ds4.h"

#include <stdint.h>
#include <stdio.h>

typedef struct {
    const char *model_path;  /* -m */
    const char *prompt_path; /* --prompt-file */
    const char *csv_path;    /* --csv (NULL: stdout) */
    const char *plot_path;   /* --plot FILE.svg */
    ds4_backend_kind backend;
    int gpu_device; /* --gpu: CUDA device index */
    int threads;
    ds4_numerics numerics;
    int64_t ctx_start, ctx_max, ctx_alloc; /* ctx_alloc 0: ctx_max + gen_tokens + 1 */
    int64_t step_incr;
    double step_mul; /* 1: linear steps of step_incr */
    int gen_tokens;
    int prefill_chunk; /* session max_chunk (0: the library default) */
    int batch_sessions; /* > 0: also time decode steps of this many sessions at once */
    int batch_loop;     /* --batch-loop: also time the same steps session by session */
    int warmup;         /* --warmup: ds4_session_warmup before the walk (untimed, logged) */
    int host_pick;      /* --host-pick: greedy tokens picked on the host from the downloaded
                           logits (ds4_session_decode + ds4_argmax_excluding) instead of
                           ds4_session_decode_pick / _batch_pick (A/B) */
    ds4_model_options model_opt; /* --ssd-streaming*, --expert-profile (cli/cli_stream_options.h) */
    const char *mtp;   /* --mtp FILE|auto: also time speculative decoding (NULL: off) */
    int mtp_draft;     /* --mtp-draft N (default 2) */
} bench_model_opts;

/* Parse argv (everything after the program name is looked at). Returns 0,
 * or 2 after printing the problem (usage error), or 1 for --help (printed). */
int bench_model_parse(int argc, char **argv, bench_model_opts *o);
void bench_model_usage(FILE *f);

typedef struct bench_bw bench_bw; /* bandwidth meter, below */

/* One CSV row: a frontier. */
typedef struct {
    int64_t ctx;            /* frontier: tokens in the session */
    int64_t prefill_tokens; /* tokens prefilled for this row (since the last frontier) */
    double prefill_tps;
    int gen_tokens;
    double gen_tps;
    uint64_t kvcache_bytes;          /* the session snapshot at the frontier */
    uint64_t weight_bytes_per_token; /* ds4_model_weight_bytes_per_token(ctx + 1) */
    double bandwidth;                /* bytes/s behind the roofline (logged, not a CSV column) */
    double roofline_tps;             /* bandwidth / weight_bytes_per_token */
    int batch_sessions;              /* 0: no batched probe */
    double batch_gen_tps;            /* batch_sessions x gen_tokens / seconds */
    int batch_loop;                  /* 0: no loop probe */
    double loop_gen_tps;             /* the same steps, one ds4_session_decode per session */
    int mtp_draft;                   /* 0: no MTP probe */
    double mtp_gen_tps;              /* the greedy probe with speculation */
    double mtp_accept;               /* accepted / drafted tokens in it */
    double mtp_full_gen_tps;         /* the same probe rolling back by full snapshots (the older scheme) */
    double mtp_rb_us, mtp_full_rb_us; /* microseconds per step saving marks and taking chunks back, each scheme */
} bench_model_row;

#define BENCH_MODEL_CSV_HEADER \
    "ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes,weight_bytes_per_token,roofline_tps"
#define BENCH_MODEL_CSV_BATCH ",batch_sessions,batch_gen_tps"
#define BENCH_MODEL_CSV_LOOP ",loop_gen_tps"
#define BENCH_MODEL_CSV_MTP ",mtp_draft,mtp_gen_tps,mtp_accept,mtp_full_gen_tps,mtp_rb_us,mtp_full_rb_us"
/* The header (with the batch columns when o->batch_sessions > 0, the loop
 * column with o->batch_loop) and a row. */
void bench_model_csv_header(FILE *f, const bench_model_opts *o);
void bench_model_csv_row(FILE *f, const bench_model_row *r);

/* Session parameters for these options. */
void bench_model_session_params(const bench_model_opts *o, ds4_session_params *p);

/* Frontier after cur (ctx_max is the last). */
int64_t bench_model_next_frontier(const bench_model_opts *o, int64_t cur);

/* Called after each row, with the session restored to the frontier; a
 * non-zero return stops the walk (and is returned). */
typedef int (*bench_model_hook)(void *ctx, ds4_session *s, const bench_model_row *row);

/* Walk tokens[0 .. ctx_max) through the frontiers on session s (empty,
 * n_ctx >= ctx_max + gen_tokens). eos: the token the gen probe never picks.
 * With o->batch_sessions > 0, batch_sessions more sessions (made with
 * bench_model_session_params) are restored from each frontier's snapshot
 * and stepped together with ds4_session_decode_batch for gen_tokens steps;
 * with o->batch_loop the same steps are timed again, one
 * ds4_session_decode per session (what decode_batch was before it was a
 * batched forward), warning on stderr if the two pick other tokens.
 * meter: measured after each row's decode probe for its roofline; NULL:
 * the fixed bandwidth (bytes/s; 0: roofline 0) is used. Rows are appended
 * to *rows (malloc'd, *n_rows counted) and written to csv (may be NULL) as
 * they are made. Returns 0, or 1 after printing the error. */
int bench_model_walk(ds4_model *m, ds4_session *s, const bench_model_opts *o, const int32_t *tokens,
                     int32_t eos, bench_bw *meter, double bandwidth, FILE *csv, bench_model_hook hook,
                     void *hook_ctx, bench_model_row **rows, int *n_rows);
/* The same with the batch sessions made by the caller (bs: batch_sessions
 * of them, bench_model_batch_open; NULL when there are none): ds4-bench
 * makes them before its first prefill, as a server makes its slots, so the
 * backend's optional copies (CUDA's bf16 weights) take only what they left. */
int bench_model_walk_batch(ds4_model *m, ds4_session *s, ds4_session **bs, const bench_model_opts *o,
                           const int32_t *tokens, int32_t eos, bench_bw *meter, double bandwidth, FILE *csv,
                           bench_model_hook hook, void *hook_ctx, bench_model_row **rows, int *n_rows);
/* o->batch_sessions sessions for the batched probe in *out (NULL when
 * none are asked for); 0, or 1 after printing the error (none left open). */
int bench_model_batch_open(ds4_model *m, const bench_model_opts *o, ds4_session ***out);
void bench_model_batch_close(const bench_model_opts *o, ds4_session **bs);

/* Greedy pick excluding one token (EOS): ds4_argmax_excluding (NaN and
 * -inf never picked); -1 if no other token has a usable logit. */
int32_t bench_model_argmax_excluding(const float *logits, int n_vocab, int32_t excluded);

/* A meter of the memory bandwidth of the device the backend keeps the
 * weights in (copy bandwidth, bytes read + bytes written), holding its
 * buffers. open: NULL after printing why; *what describes the method.
 * measure: bytes/s now; 0, or 1 after printing why. */
bench_bw *bench_bw_open(ds4_backend_kind backend, int gpu_device, int threads, const char **what);
int bench_bw_measure(bench_bw *b, double *bytes_per_s);
void bench_bw_close(bench_bw *b);

/* The mode's entry point: ds4-bench -m FILE --prompt-file FILE [...]. */
int ds4_bench_model_main(int argc, char **argv);

#endif

/*
 * quality_tools.h - the subcommands of `ds4-quality` (docs/QUALITY.md):
 * score a model on a manifest of reference continuations, compare two
 * scores, make a manifest from our own engine's greedy answers, and
 * measure the weight error of quantized experts.
 * Each returns the process exit status (0 ok, 1 error printed).
 */
#ifndef DS4_TOOLS_QUALITY_TOOLS_H
#define DS4_TOOLS_QUALITY_TOOLS_H

#include "include/ds4.h"

#include <stdint.h>

typedef struct {
    int threads;     /* <= 0: all cores */
    int backend;     /* ds4_backend_kind */
    int steps;       /* manifest: tokens per answer (default 32) */
    int top_k;       /* manifest: alternatives per step (default 20) */
    int thinking;    /* manifest: render prompts in thinking mode */
} quality_run_opts;

int quality_score(const quality_run_opts *o, const char *model, const char *manifest, const char *out_tsv);
int quality_compare(const char *a_tsv, const char *b_tsv);
/* Squared error of Q's routed experts against REF's (imatrix-weighted too
 * when imatrix is not NULL); quality_werr.c. */
int quality_weight_error(const char *ref, const char *q, const char *imatrix);
int quality_make_manifest(const quality_run_opts *o, const char *model, const char *prompts_jsonl, const char *out);

/* Model + one session of n_ctx tokens; NULL (message printed) on failure. */
ds4_session *quality_open_session(const quality_run_opts *o, const char *path, int64_t n_ctx, ds4_model **model);

#endif

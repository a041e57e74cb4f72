/*
 * cli_perplexity.h - teacher-forced perplexity of a raw text
 * (`ds4 --perplexity-file FILE [--ctx N] [--chunks N]`, docs/QUALITY.md),
 * and the small helpers the quality commands share.
 */
#ifndef DS4_CLI_PERPLEXITY_H
#define DS4_CLI_PERPLEXITY_H

#include "cli/cli_options.h"
#include "include/ds4.h"

#include <stdint.h>

/* Per-chunk running PPL on stdout ("[1]12.3,[2]..."), progress on stderr,
 * then "Final estimate: PPL = X +/- E". 0 on success, 1 on error (printed). */
int ds4_cli_perplexity(const ds4_cli_options *o);

/* -log softmax(logits)[target], in double. */
double ds4_cli_token_nll(const float *logits, int n_vocab, int32_t target);

/* Open o->model and one session of n_ctx tokens on the options' backend,
 * collecting into imatrix when not NULL (--imatrix-dataset).
 * NULL (message printed, *model NULL) on failure. */
ds4_session *ds4_cli_open_session(const ds4_cli_options *o, ds4_model **model, int64_t n_ctx, ds4_imatrix *imatrix);

#endif

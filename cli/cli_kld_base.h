/*
 * cli_kld_base.h - write a perplexity run's log-probabilities in the file
 * layout that llama.cpp's llama-perplexity reads with
 * `--kl-divergence-base FILE --kl-divergence` (`ds4 --perplexity-file ...
 * --kld-base FILE`, docs/QUALITY.md), so a peer engine can measure its KL
 * divergence from DwarfStar on the same tokens (bench/vs_llamacpp.sh).
 *
 * Layout (little-endian): "_logits_", int32 n_ctx, int32 n_vocab, int32
 * n_chunk, the n_chunk * n_ctx token ids of the text (before any BOS
 * replacement: the reader applies its vocabulary's rule itself), then for
 * every scored position (the second half of each chunk, in order) one row
 * of 2 * ceil(n_vocab / 2) + 4 uint16: the floats scale and min_log_prob,
 * then per token round((logit - min_logit) / scale) where min_logit is the
 * row's smallest logit but at most 16 below its largest, scale =
 * (max_logit - min_logit) / 65535, and min_log_prob = log p of min_logit;
 * a logit at or below min_logit is stored as 0.
 */
#ifndef DS4_CLI_KLD_BASE_H
#define DS4_CLI_KLD_BASE_H

#include <stdint.h>
#include <stdio.h>

/* Create path and write the header. NULL (message printed) on failure. */
FILE *ds4_kld_base_create(const char *path, int32_t n_ctx, int32_t n_vocab, int32_t n_chunk, const int32_t *tokens);

/* Append one scored position's row. 0, or -1 (message printed). */
int ds4_kld_base_row(FILE *f, const float *logits, int n_vocab);

/* Flush and close; 0, or -1 when a write failed (message printed). */
int ds4_kld_base_close(FILE *f, const char *path);

#endif

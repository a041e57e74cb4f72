/*
 * ds4_sampler.h - choosing the next token from logits (public API).
 *
 * Greedy, temperature, top-k, top-p (nucleus), min-p, with a seeded RNG so
 * a run is reproducible bit for bit. The filter order is fixed and
 * documented: temperature scales the logits, then top-k keeps the k most
 * likely, then min-p drops tokens below min_p x the top probability, then
 * top-p keeps the smallest most-likely set whose mass reaches top_p of
 * what is left; one draw picks from the renormalized remainder.
 *
 * DeepSeek's tool-call protocol (dsv4-chat-format.md §6.4): inside a DSML
 * tool block the structure (tags, attribute text, whitespace between tags,
 * JSON punctuation) is decoded greedily while argument payloads (string
 * values and the insides of JSON strings) keep the normal settings. The
 * caller asks the output parser (ds4_gen_parser_structural in
 * ds4_dsml.h) and passes the answer as `greedy` to ds4_sampler_sample.
 */
#ifndef DS4_SAMPLER_H
#define DS4_SAMPLER_H

#include "ds4.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    float temperature; /* <= 0: greedy */
    int top_k;         /* <= 0: off */
    float top_p;       /* >= 1: off */
    float min_p;       /* <= 0: off */
    uint64_t seed;
} ds4_sampler_params;

/* T=1, top_k off, top_p 1, min_p 0.05 (ds4's defaults), seed 0. */
void ds4_sampler_params_default(ds4_sampler_params *p);

typedef struct ds4_sampler ds4_sampler;

/* n_vocab sizes the scratch buffers (allocated once, not per token). */
ds4_sampler *ds4_sampler_new(const ds4_sampler_params *p, int n_vocab);
void ds4_sampler_free(ds4_sampler *s);
/* Change settings; the RNG restarts from the new seed only if reseed. */
void ds4_sampler_set_params(ds4_sampler *s, const ds4_sampler_params *p, bool reseed);

/* The next token. greedy forces argmax (protocol structure). Logits that
 * are NaN or -inf are never chosen; -1 if no logit is usable or n is
 * larger than the sampler's n_vocab. */
int32_t ds4_sampler_sample(ds4_sampler *s, const float *logits, int n, bool greedy);

/* Index of the largest logit (lowest index on ties; NaN skipped), -1 if none. */
int32_t ds4_argmax(const float *logits, int n);

/* The k most likely tokens with their log-probabilities (log-softmax at
 * temperature 1, computed in double), most likely first, ties by lower
 * index. Returns how many were written (min(k, usable logits)). */
int ds4_top_logprobs(const float *logits, int n, int k, int32_t *ids, double *logprobs);

/* The seeded generator (xoshiro256**, seeded through splitmix64). */
typedef struct {
    uint64_t s[4];
} ds4_rng;

void ds4_rng_seed(ds4_rng *r, uint64_t seed);
uint64_t ds4_rng_next(ds4_rng *r);
/* Uniform in [0, 1) with 53 random bits. */
double ds4_rng_uniform(ds4_rng *r);

#ifdef __cplusplus
}
#endif

#endif /* DS4_SAMPLER_H */

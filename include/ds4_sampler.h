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
/* ds4_argmax over every index but `excluded` (out of range: none excluded). */
int32_t ds4_argmax_excluding(const float *logits, int n, int32_t excluded);

/* The k most likely tokens with their log-probabilities (log-softmax at
 * temperature 1, computed in double), most likely first, ties by lower
 * index. Returns how many were written (min(k, usable logits)). */
int ds4_top_logprobs(const float *logits, int n, int k, int32_t *ids, double *logprobs);

/* The seeded generator (xoshiro256**, seeded through splitmix64). */
typedef struct {
    uint64_t s[4];
} ds4_rng;

/* The distribution ds4_sampler_sample draws from with params p (after
 * temperature, top-k, min-p, top-p; one-hot on the argmax when greedy),
 * written densely into probs[n]. Returns the number of candidates, -1 if
 * no logit is usable or memory is short. */
int ds4_sampler_probs(const ds4_sampler_params *p, const float *logits, int n, double *probs);
/* Speculative sampling (engine/spec.c): draft d was drawn from q; accept
 * it with probability min(1, p[d]/q[d]) (*accepted = true, returns d),
 * else return a draw from the residual max(0, p - q) normalised. The
 * token returned is distributed as p. */
int32_t ds4_spec_accept(const double *p, const double *q, int n, int32_t d, ds4_rng *rng, bool *accepted);
/* A draw from the distribution p[n]. */
int32_t ds4_spec_draw(const double *p, int n, ds4_rng *rng);

/* Speculative decoding with the MTP block (engine/spec.c; ds4.h has the
 * rest: ds4_model_load_mtp, ds4_session_set_mtp, ds4_session_spec_stats). */
/* Feed `token` (chosen by the caller from the current logits) and as many
 * drafted tokens as the main model confirms: out receives the confirmed
 * drafts and then the main model's next token, *n_out in all (1..n_draft+1;
 * out needs n_draft + 1 entries). Every token of out but the last has been
 * fed; the last is the caller's next `token`. The session's logits are
 * those after the last fed token. sa NULL or temperature <= 0: greedy,
 * the tokens are exactly plain greedy decoding's; else drafts are drawn
 * from sa's distribution of the block's logits and accepted by the
 * speculative-sampling rule (ds4_spec_accept) with rng, so the output is
 * distributed as plain sampling with sa. A confirmed `stop` token (EOS;
 * -1: none) ends the list unfed, as the last entry; at most max_out
 * tokens are emitted (token included), so at most max_out are fed. */
ds4_status ds4_session_decode_spec(ds4_session *s, int32_t token, const ds4_sampler_params *sa, ds4_rng *rng,
                                   int32_t stop, int max_out, int32_t *out, int *n_out);


void ds4_rng_seed(ds4_rng *r, uint64_t seed);
uint64_t ds4_rng_next(ds4_rng *r);
/* Uniform in [0, 1) with 53 random bits. */
double ds4_rng_uniform(ds4_rng *r);

#ifdef __cplusplus
}
#endif

#endif /* DS4_SAMPLER_H */

/*
 * quality_manifest.h - reference continuations for `ds4-quality`
 * (docs/QUALITY.md).
 *
 * A manifest is one JSON document:
 *   {"schema": "ds4-quality-manifest-v1", "source": ..., "model": ...,
 *    "top_k": K, ["n_vocab": V,]
 *    "items": [{"id": ..., PROMPT, "steps": [STEP, ...]}, ...]}
 * PROMPT is one of "messages" (OpenAI chat messages, rendered with the
 * model's chat format; "thinking": true for thinking mode, default false),
 * "prompt" (one user message), or "prompt_rendered" (already rendered
 * text, special tokens recognised). A STEP is the official API capture's
 * step (shared/data/ds4-vectors): {"token": {"text", "bytes": [u8...]},
 * "logprob", "top_logprobs": [{"token": {...}, "logprob"}, ...]}, so the
 * captures of the official API and the answers of any OpenAI-compatible
 * endpoint become manifests by copying (scripts/quality_collect.py), and
 * `ds4-quality manifest` writes the same from our own engine.
 *
 * Tokens are identified by their bytes, not ids, so a manifest does not
 * depend on an id numbering; loading maps them to the model's ids and
 * refuses a manifest whose tokens are not tokens of this vocabulary (or
 * whose n_vocab differs): it was made with another tokenizer.
 */
#ifndef DS4_TOOLS_QUALITY_MANIFEST_H
#define DS4_TOOLS_QUALITY_MANIFEST_H

#include "include/ds4.h"
#include "include/ds4_tokenizer.h"

#include <stdint.h>

typedef struct {
    char *id;
    ds4_tokens prompt;  /* rendered and tokenized */
    int n_steps;
    int32_t *tok;       /* [n_steps] reference tokens */
    double *lp;         /* [n_steps] their reference log-probabilities */
    int *n_top;         /* [n_steps] alternatives resolved */
    int32_t *top;       /* [n_steps * top_k] reference top-k ids */
    double *top_lp;     /* [n_steps * top_k] their reference log-probabilities */
} quality_item;

typedef struct {
    int top_k;
    int n_items;
    quality_item *items;
} quality_manifest;

/* Load and resolve against tok. DS4_ERR_* + message naming the file, the
 * item and the step. */
ds4_status quality_manifest_load(const char *path, const ds4_tokenizer *tok, quality_manifest *m);
void quality_manifest_free(quality_manifest *m);

/* Render a prompt object (the PROMPT forms above) to tokens. `where`
 * names it in errors. */
ds4_status quality_prompt_tokens(const ds4_tokenizer *tok, const void *json_item, const char *where, ds4_tokens *out);

#endif

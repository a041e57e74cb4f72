/*
 * agent_engine.h - what ds4-agent needs from a model: one live session.
 *
 * Tokenize rendered text, prefill tokens, sample and feed tokens one at a
 * time, snapshot and restore the whole state. Two implementations:
 *   - agent_engine_ds4.c: the real engine (include/ds4.h, the tokenizer
 *     and sampler of the same GGUF);
 *   - agent_engine_script.c: a scripted test engine (`--test-script FILE`)
 *     that replies with given text, DSML included, so whole agent tasks
 *     run end to end in tests without model weights.
 * The agent never sees which one it drives.
 */
#ifndef DS4_AGENT_ENGINE_H
#define DS4_AGENT_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "include/ds4_tokenizer.h"

typedef struct {
    float temperature; /* <= 0: greedy */
    float top_p, min_p;
    int top_k;
    int64_t ctx;
    int threads;       /* <= 0: all cores */
    int backend;       /* ds4_backend_kind */
    int gpu_device;
    const struct ds4_cli_edit_s *edit; /* steering / --power (cli/cli_edit_options.h); NULL: none */
} agent_engine_params;

typedef struct agent_engine agent_engine;
struct agent_engine {
    int64_t ctx;            /* context length in tokens */
    int32_t eos;
    uint8_t quant_bits;     /* written into disk snapshot headers */

    /* Tokenization of rendered chat text, APPENDED to *out (the one place
     * the agent turns text into tokens). tpl holds the byte ranges of text
     * the chat template wrote (ds4_chat_render_spans): a special token is
     * recognised only inside one of them, so a file or command output that
     * spells a marker stays text. tpl NULL: no specials at all. */
    int (*tokenize)(agent_engine *e, const char *text, size_t len, const ds4_spans *tpl, ds4_tokens *out);
    /* Bytes of one token (literal text for special tokens). */
    const char *(*token_bytes)(agent_engine *e, int32_t tok, size_t *len);
    int (*reset)(agent_engine *e);
    int (*prefill)(agent_engine *e, const int32_t *toks, size_t n);
    /* Restart the sampler's random generator (each turn starts from a seed
     * derived from the session, so a resumed session samples the same). */
    void (*reseed)(agent_engine *e, uint64_t seed);
    /* The next token after what was fed; greedy forces argmax (DSML
     * structure, chat-format §6.4). */
    int (*sample)(agent_engine *e, bool greedy, int32_t *tok);
    int (*decode)(agent_engine *e, int32_t tok);
    /* --mtp (NULL without): feed tok and the drafts the model confirms as
     * one verify chunk (ds4_session_decode_spec): out[0..*n-1) were fed
     * after tok, out[*n-1] is the next token (not fed; with sampling it
     * comes from the speculative rule and must be the one used). greedy:
     * argmax acceptance (DSML structure, temperature 0). At most max_out
     * tokens. spec_trim keeps the first `keep` tokens the step fed (tok
     * counts as one), exactly. */
    int (*decode_spec)(agent_engine *e, int32_t tok, bool greedy, int max_out, int32_t *out, int *n);
    int (*spec_trim)(agent_engine *e, int keep);
    int64_t (*n_past)(agent_engine *e);
    int (*snapshot)(agent_engine *e, void **bytes, size_t *len);
    int (*restore)(agent_engine *e, const void *bytes, size_t len);
    void (*close)(agent_engine *e);
    char err[256];          /* why the last call failed */
};

/* NULL with err filled on failure. */
agent_engine *agent_engine_ds4_open(const char *model_path, const agent_engine_params *p, uint64_t seed,
                                    char *err, size_t err_size);
agent_engine *agent_engine_script_open(const char *script_path, int64_t ctx, char *err, size_t err_size);

#endif

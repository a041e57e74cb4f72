/*
 * engine_port.h - what the server needs from a model: the one seam between
 * the HTTP front end and the engine.
 *
 * The server drives n_slots live sessions (`--parallel N`), named by their
 * index 0..n_slots-1: tokenize a rendered prompt, prefill tokens onto a
 * session, sample a session's next token, advance every decoding session by
 * its sampled token in one batched step, snapshot a session to bytes and
 * restore it. Anything that implements these calls can serve: the real
 * engine (include/ds4.h, engine_ds4.c) and the scripted test engine
 * (engine_test.c, `--test-engine`), which lets the HTTP, streaming,
 * tool-call and cache machinery be tested with real SDK clients without
 * model weights.
 *
 * All calls happen on the one worker thread that owns the sessions.
 */
#ifndef DS4_SERVER_ENGINE_PORT_H
#define DS4_SERVER_ENGINE_PORT_H

/* Tokens the worker prefills a call at most (srv_engine.prefill_chunk,
 * one scheduler step, so one long prompt holds up the other slots'
 * decoding for one chunk at a time) unless --prefill-chunk says: on the CPU
 * (a 128-token step of Flash takes seconds there) and on a GPU, where a
 * bigger step reads each weight for more tokens: the backend's own 2048
 * with one slot (nothing else waits), 512 with several (docs/SERVER.md). */
#define SRV_PREFILL_CHUNK_CPU 128
#define SRV_PREFILL_CHUNK_GPU 512
#define SRV_PREFILL_CHUNK_GPU_ALONE 2048

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "include/ds4_tokenizer.h"

typedef struct {
    double temperature;  /* 0 = greedy */
    double top_p;
    double min_p;
    int top_k;           /* 0 = off */
    uint64_t seed;
    bool reseed;         /* first token of a request: restart the RNG */
    bool greedy;         /* DSML structure: argmax (chat-format §6.4) */
    /* When set, only tokens whose bytes it accepts may be sampled (the
     * function name under tool_choice "required"; worker.c). */
    bool (*allow)(void *ud, const char *bytes, size_t len);
    void *allow_ud;
} srv_sampling;

typedef struct srv_engine srv_engine;
struct srv_engine {
    void *ud;
    char model_id[128];      /* what /v1/models reports */
    int ctx;                 /* context length in tokens */
    int prefill_chunk;       /* tokens a prefill call takes at most; the sessions' buffers hold that many */
    int32_t eos;
    uint8_t quant_bits;      /* for the disk cache header */

    /* Tokenization of text the server writes itself (the forced tool-call
     * opening): every special-token string is one. *out is malloc'd. */
    int (*tokenize)(srv_engine *e, const char *text, size_t len, int32_t **out, size_t *n);
    /* Tokenization of a rendered prompt: text is the prompt from byte `base`
     * on, tpl the template ranges of the whole prompt; special tokens only
     * inside them, so request text never becomes control tokens
     * (ds4_tokenize_spans). *out is malloc'd. */
    int (*tokenize_prompt)(srv_engine *e, const char *text, size_t len, const ds4_spans *tpl, size_t base,
                           int32_t **out, size_t *n);
    /* Is the token a special (added) token? */
    bool (*is_special)(srv_engine *e, int32_t tok);
    /* Bytes of one token (may be a partial UTF-8 sequence). Returns length,
     * or -1; writes at most cap bytes. */
    int (*token_bytes)(srv_engine *e, int32_t tok, char *buf, size_t cap);

    /* The live sessions; `slot` is 0..n_slots-1. Each has its own state
     * and its own sampler (RNG). */
    int n_slots;
    int (*reset)(srv_engine *e, int slot);
    int (*prefill)(srv_engine *e, int slot, const int32_t *toks, size_t n);
    int (*sample)(srv_engine *e, int slot, const srv_sampling *s, int32_t *tok);
    /* One decode step: toks[i] is fed to session slots[i] (distinct slots),
     * as one batched forward where the engine has one (the weights are read
     * once for all n). On an error any of them may have advanced. */
    int (*decode_batch)(srv_engine *e, const int *slots, const int32_t *toks, int n);
    /* Speculative decoding with the MTP block (--mtp; NULL without it):
     * feeds tok, then the drafts the model confirms (at most max_out - 1,
     * never the end-of-sentence token) as one verify chunk, judged under
     * s (greedy or temperature 0: argmax; else the speculative-sampling
     * rule with the slot's own random stream, reseeded with the sampler;
     * s->allow must be NULL). fed[0..*n_fed) are those drafts, *next the
     * token after them (not fed; with sampling the rule's draw, which the
     * caller must use rather than sample afresh), *n_drafted how many were
     * drafted. The session's logits are then those after the last fed
     * token. spec_trim keeps only the first `keep` tokens that step fed
     * (tok counts as one): exact, as if the step had fed just those. */
    int (*decode_spec)(srv_engine *e, int slot, int32_t tok, const srv_sampling *s, int max_out, int32_t *fed,
                       int *n_fed, int *n_drafted, int32_t *next);
    int (*spec_trim)(srv_engine *e, int slot, int keep);
    int (*snapshot)(srv_engine *e, int slot, void **bytes, size_t *len);
    /* What snapshot would return now, in bytes, without copying. */
    size_t (*snapshot_size)(srv_engine *e, int slot);
    /* Refuses (nonzero, e->err) a state of another shape or size, or one
     * holding NaN / +inf; the caller then prefills instead. */
    int (*restore)(srv_engine *e, int slot, const void *bytes, size_t len);
    /* The largest snapshot a session can produce (a full context): bounds
     * what a disk-cache file may hold before it is read. */
    size_t (*snapshot_max)(srv_engine *e);
    void (*close)(srv_engine *e);
    /* Last error text of a failed call. */
    char err[256];
    /* What the startup report says about the engine: backend, memory
     * (filled at open; "" when the engine has nothing to say). */
    char info[384];
    /* A digest (hex) of the settings beyond the model that change what a
     * session's state holds: directional steering's directions and scales.
     * "" when none is active. The disk cache keeps the states of each
     * digest apart (worker.c), so a prefix saved under one steering is
     * never restored under another. */
    char state_key[33];
};

/* The scripted engine: byte tokens plus the 7 special tokens; replies with a
 * fixed reasoning / content / tool-call script (see engine_test.c). */
srv_engine *engine_test_open(int ctx, int delay_us, int n_slots);

#endif

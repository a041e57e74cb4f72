/*
 * cli_logprobs.c - greedy continuation with top-K log-probabilities
 * (see cli_logprobs.h). The format mirrors the official API captures in
 * shared/data/ds4-vectors (token text, bytes, logprob, top_logprobs), with
 * token ids added, so runs can be compared with them step by step.
 */
#include "cli/cli_logprobs.h"

#include "cli/cli_sigint.h"
#include "include/ds4_chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *token_json(const ds4_tokenizer *tok, int32_t id, double logprob)
{
    size_t n;
    const char *b = ds4_token_bytes(tok, id, &n);
    char *hex = malloc(2 * n + 1);
    char text[512 * 3 + 16];
    ds4_utf8_stream us = {0};
    size_t tl = 0;
    if (n <= 512) {
        tl = ds4_utf8_stream_feed(&us, b, n, text);
        tl += ds4_utf8_stream_flush(&us, text + tl);
    }
    for (size_t i = 0; hex && i < n; i++) sprintf(hex + 2 * i, "%02x", (unsigned char)b[i]);
    json_t *j = json_pack("{s:i,s:s#,s:s,s:f}", "id", (int)id, "text", text, tl, "bytes", hex ? hex : "", "logprob",
                          logprob);
    free(hex);
    return j;
}

int ds4_cli_dump_logprobs(ds4_cli_chat *c, const char *prompt, size_t len, const ds4_spans *tpl)
{
    ds4_tokens ids = {0};
    ds4_status st = tpl ? ds4_tokenize_spans(c->tok, prompt, len, tpl, 0, &ids)
                        : ds4_tokenize(c->tok, prompt, len, DS4_TOKENIZE_SPECIAL, &ids);
    if (st != DS4_OK) {
        fprintf(stderr, "ds4: %s\n", ds4_last_error());
        return 1;
    }
    int rc = 1;
    int k = c->opt.logprobs_top_k;
    int32_t *top = malloc((size_t)k * sizeof *top);
    double *lp = malloc((size_t)k * sizeof *lp);
    json_t *steps = json_array();
    int32_t eos = ds4_tokenizer_special(c->tok, DS4_TOK_EOS);
    if (!top || !lp || !ds4_cli_chat_prefill(c, ids.ids, ids.n, NULL)) goto done;
    for (int step = 0; step < c->opt.n_predict && !ds4_cli_interrupted; step++) {
        const float *logits = ds4_session_logits(c->session);
        int m = logits ? ds4_top_logprobs(logits, c->n_vocab, k, top, lp) : 0;
        if (m == 0) {
            fprintf(stderr, "ds4: no usable logits at step %d\n", step);
            goto done;
        }
        json_t *alts = json_array();
        for (int i = 0; i < m; i++) json_array_append_new(alts, token_json(c->tok, top[i], lp[i]));
        json_t *s = json_object();
        json_object_set_new(s, "token", token_json(c->tok, top[0], lp[0]));
        json_object_set_new(s, "logprob", json_real(lp[0]));
        json_object_set_new(s, "top_logprobs", alts);
        json_array_append_new(steps, s);
        if (top[0] == eos || (int64_t)(ids.n + step + 1) >= c->opt.ctx) break;
        if (ds4_session_decode(c->session, top[0]) != DS4_OK) {
            fprintf(stderr, "ds4: decode: %s\n", ds4_last_error());
            goto done;
        }
    }
    json_t *pids = json_array();
    for (size_t i = 0; pids && i < ids.n; i++) json_array_append_new(pids, json_integer(ids.ids[i]));
    json_t *doc = json_pack("{s:s,s:i,s:o,s:i,s:O}", "model", c->opt.model, "prompt_tokens", (int)ids.n, "prompt_ids",
                            pids, "top_k", k, "steps", steps);
    if (doc && json_dump_file(doc, c->opt.dump_logprobs, JSON_INDENT(1)) == 0) rc = 0;
    else fprintf(stderr, "ds4: cannot write %s\n", c->opt.dump_logprobs);
    json_decref(doc);
done:
    json_decref(steps);
    free(top);
    free(lp);
    ds4_tokens_free(&ids);
    return rc;
}

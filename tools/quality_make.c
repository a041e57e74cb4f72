/*
 * quality_make.c - `ds4-quality manifest MODEL PROMPTS.jsonl OUT.json`
 * (see quality_tools.h): a manifest from our own engine. Each prompt is
 * answered greedily for up to --steps tokens (stopping after EOS, which is
 * kept as a step: ending the answer is a prediction too), and every step
 * records the chosen token and the --top-k most likely tokens with their
 * log-probabilities, in the step schema of the official API captures
 * (quality_manifest.h). This is the reference when the reference model is
 * one we run (the f32 model in docs/QUALITY.md), and the fallback when an
 * endpoint does not return log-probabilities.
 *
 * PROMPTS.jsonl: one JSON object per line with "id" and one of
 * "prompt" / "messages" / "prompt_rendered" (as in a manifest item); the
 * prompt fields are copied into the manifest item.
 */
#include "tools/quality_tools.h"

#include "include/ds4_sampler.h"
#include "include/ds4_tokenizer.h"
#include "tools/quality_manifest.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *token_json(const ds4_tokenizer *tok, int32_t id)
{
    size_t n;
    const char *b = ds4_token_bytes(tok, id, &n);
    json_t *bytes = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(bytes, json_integer((unsigned char)b[i]));
    /* text: the bytes when they are valid UTF-8 on their own, else "" (a
     * piece of a multi-byte character); bytes are what identify it. */
    json_t *text = json_stringn(b, n);
    return json_pack("{s:o,s:o}", "text", text ? text : json_string(""), "bytes", bytes);
}

int quality_make_manifest(const quality_run_opts *o, const char *model_path, const char *prompts, const char *out)
{
    ds4_tokenizer *tok = ds4_tokenizer_load(model_path);
    if (!tok) {
        fprintf(stderr, "ds4-quality: %s\n", ds4_last_error());
        return 1;
    }
    FILE *f = fopen(prompts, "r");
    if (!f) {
        fprintf(stderr, "ds4-quality: cannot open %s\n", prompts);
        ds4_tokenizer_free(tok);
        return 1;
    }
    /* Read and render every prompt first: a bad line fails before model work. */
    json_t *items = json_array();
    ds4_tokens *ptoks = NULL;
    int n = 0, no = 0, rc = 1;
    int64_t need = 16;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    ds4_model *model = NULL;
    ds4_session *s = NULL;
    while ((len = getline(&line, &cap, f)) >= 0) {
        no++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (len == 0) continue;
        json_error_t je;
        json_t *j = json_loadb(line, (size_t)len, 0, &je);
        char where[300];
        snprintf(where, sizeof where, "%s line %d", prompts, no);
        if (!j || !json_is_object(j) || !json_is_string(json_object_get(j, "id"))) {
            fprintf(stderr, "ds4-quality: %s: %s\n", where,
                    j ? "expected an object with a string \"id\"" : je.text);
            json_decref(j);
            goto done;
        }
        ds4_tokens *p = realloc(ptoks, (size_t)(n + 1) * sizeof *p);
        if (!p) {
            json_decref(j);
            goto done;
        }
        ptoks = p;
        memset(&ptoks[n], 0, sizeof ptoks[n]);
        if (o->thinking && !json_object_get(j, "thinking")) json_object_set_new(j, "thinking", json_true());
        if (quality_prompt_tokens(tok, j, where, &ptoks[n]) != DS4_OK) {
            fprintf(stderr, "ds4-quality: %s\n", ds4_last_error());
            json_decref(j);
            n++;
            goto done;
        }
        if ((int64_t)ptoks[n].n + o->steps + 1 > need) need = (int64_t)ptoks[n].n + o->steps + 1;
        json_array_append_new(items, j);
        n++;
    }
    if (n == 0) {
        fprintf(stderr, "ds4-quality: %s has no prompts\n", prompts);
        goto done;
    }
    s = quality_open_session(o, model_path, need, &model);
    if (!s) goto done;
    const int V = ds4_model_n_vocab(model), K = o->top_k;
    const int32_t eos = ds4_tokenizer_special(tok, DS4_TOK_EOS);
    int32_t *ids = malloc((size_t)K * sizeof *ids);
    double *lp = malloc((size_t)K * sizeof *lp);
    if (!ids || !lp) {
        free(ids);
        free(lp);
        goto done;
    }
    bool ok = true;
    for (int i = 0; ok && i < n; i++) {
        ds4_session_reset(s);
        json_t *steps = json_array();
        ok = ds4_session_prefill(s, ptoks[i].ids, (int64_t)ptoks[i].n, NULL) == DS4_OK;
        for (int st = 0; ok && st < o->steps; st++) {
            const float *l = ds4_session_logits(s);
            int m = l ? ds4_top_logprobs(l, V, K, ids, lp) : 0;
            if (m == 0) {
                ok = false;
                break;
            }
            json_t *alts = json_array();
            for (int a = 0; a < m; a++)
                json_array_append_new(alts, json_pack("{s:o,s:f}", "token", token_json(tok, ids[a]), "logprob", lp[a]));
            json_array_append_new(steps, json_pack("{s:i,s:o,s:f,s:o}", "step", st, "token", token_json(tok, ids[0]),
                                                   "logprob", lp[0], "top_logprobs", alts));
            if (ids[0] == eos || st + 1 == o->steps) break;
            ok = ds4_session_decode(s, ids[0]) == DS4_OK;
        }
        json_object_set_new(json_array_get(items, (size_t)i), "steps", steps);
        fprintf(stderr, "\rds4-quality: answered %d/%d prompts   ", i + 1, n);
    }
    fprintf(stderr, "\n");
    free(ids);
    free(lp);
    if (!ok) {
        fprintf(stderr, "ds4-quality: %s\n", ds4_last_error());
        goto done;
    }
    json_t *doc = json_pack("{s:s,s:s,s:s,s:i,s:i,s:i,s:O}", "schema", "ds4-quality-manifest-v1", "source", "ds4-quality manifest",
                            "model", model_path, "top_k", K, "n_vocab", V, "steps_max", o->steps, "items", items);
    if (!doc || json_dump_file(doc, out, JSON_COMPACT) != 0) fprintf(stderr, "ds4-quality: cannot write %s\n", out);
    else rc = 0;
    json_decref(doc);
done:
    free(line);
    fclose(f);
    for (int i = 0; i < n; i++) ds4_tokens_free(&ptoks[i]);
    free(ptoks);
    json_decref(items);
    ds4_session_free(s);
    ds4_model_close(model);
    ds4_tokenizer_free(tok);
    return rc;
}

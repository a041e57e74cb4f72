/*
 * cli_imatrix.c - `ds4 --imatrix-dataset FILE --imatrix-out OUT.dat
 * [--imatrix-max-prompts N] [--imatrix-max-tokens N] [--ctx N]`
 * (see cli_imatrix.h, docs/QUALITY.md).
 *
 * The dataset has one prompt per line. A line that starts with '{' or '['
 * is JSON: an array of chat messages, or an object with "messages" (and
 * optionally "tools"); it is rendered in the model's chat format, with the
 * assistant turns it contains, so the activations are those of real chat
 * traffic. Any other line is a user message, rendered as a one-turn chat
 * prompt. Blank lines are skipped; a malformed JSON line is an error that
 * names the line, never a silent skip.
 */
#include "cli/cli_imatrix.h"

#include "cli/cli_io.h"
#include "cli/cli_perplexity.h"
#include "cli/cli_progress.h"
#include "include/ds4.h"
#include "include/ds4_chat.h"
#include "include/ds4_tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_IMATRIX_CTX 4096

/* Render dataset line `no` (1-based) to tokens. false + message printed. */
static bool line_tokens(const ds4_cli_options *o, const ds4_tokenizer *tok, const char *line, size_t len, int no,
                        ds4_tokens *out)
{
    json_t *doc = NULL, *msgs = NULL, *tools = NULL;
    if (line[0] == '{' || line[0] == '[') {
        json_error_t je;
        doc = json_loadb(line, len, 0, &je);
        if (!doc) {
            fprintf(stderr, "ds4: %s line %d: malformed JSON (%s at column %d)\n", o->imatrix_dataset, no, je.text,
                    je.column);
            return false;
        }
        msgs = json_is_array(doc) ? doc : json_object_get(doc, "messages");
        tools = json_is_object(doc) ? json_object_get(doc, "tools") : NULL;
        if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
            fprintf(stderr, "ds4: %s line %d: expected a non-empty array of messages or {\"messages\": [...]}\n",
                    o->imatrix_dataset, no);
            json_decref(doc);
            return false;
        }
        json_incref(msgs);
    } else {
        msgs = json_pack("[{s:s,s:s%}]", "role", "user", "content", line, len);
        if (!msgs) {
            fprintf(stderr, "ds4: %s line %d: not valid UTF-8 text\n", o->imatrix_dataset, no);
            return false;
        }
    }
    ds4_chat_options co;
    ds4_chat_options_default(&co);
    co.thinking = o->think != DS4_CLI_NOTHINK;
    /* Rendered and tokenized with the template's spans: only the markers
     * the template writes become control tokens; a dataset line that
     * spells one stays text (it is user content). */
    ds4_status st = ds4_chat_tokenize(tok, msgs, tools, &co, out);
    json_decref(msgs);
    json_decref(doc);
    if (st != DS4_OK) fprintf(stderr, "ds4: %s line %d: %s\n", o->imatrix_dataset, no, ds4_last_error());
    return st == DS4_OK;
}

int ds4_cli_imatrix(const ds4_cli_options *o)
{
    size_t len;
    char *data = ds4_cli_read_file(o->imatrix_dataset, &len);
    if (!data) return 1;
    ds4_tokenizer *tok = ds4_tokenizer_load(o->model);
    if (!tok) {
        fprintf(stderr, "ds4: %s\n", ds4_last_error());
        free(data);
        return 1;
    }
    /* All prompts are rendered and tokenized first, so a bad line fails
     * before any model work. */
    ds4_tokens *prompts = NULL;
    int n_prompts = 0, cap = 0, no = 0;
    bool ok = true;
    for (char *p = data; ok && p < data + len;) {
        char *nl = memchr(p, '\n', (size_t)(data + len - p));
        size_t ll = nl ? (size_t)(nl - p) : (size_t)(data + len - p);
        no++;
        if (ll && p[ll - 1] == '\r') ll--;
        size_t lead = 0;
        while (lead < ll && (p[lead] == ' ' || p[lead] == '\t')) lead++;
        if (lead < ll && (o->imatrix_max_prompts == 0 || n_prompts < o->imatrix_max_prompts)) {
            if (n_prompts == cap) {
                cap = cap ? 2 * cap : 64;
                ds4_tokens *q = realloc(prompts, (size_t)cap * sizeof *q);
                if (!q) {
                    fprintf(stderr, "ds4: out of memory\n");
                    ok = false;
                    break;
                }
                prompts = q;
            }
            memset(&prompts[n_prompts], 0, sizeof prompts[n_prompts]);
            ok = line_tokens(o, tok, p + lead, ll - lead, no, &prompts[n_prompts]);
            n_prompts++;
        }
        p = nl ? nl + 1 : data + len;
    }
    free(data);
    ds4_tokenizer_free(tok);
    ds4_model *model = NULL;
    ds4_session *s = NULL;
    ds4_imatrix *im = NULL;
    int rc = 1;
    if (!ok) goto done;
    if (n_prompts == 0) {
        fprintf(stderr, "ds4: %s has no prompts (empty, or only blank lines)\n", o->imatrix_dataset);
        goto done;
    }
    const int64_t ctx = o->ctx_given ? o->ctx : DEFAULT_IMATRIX_CTX;
    im = ds4_imatrix_create();
    if (!im) {
        fprintf(stderr, "ds4: %s\n", ds4_last_error());
        goto done;
    }
    s = ds4_cli_open_session(o, &model, ctx, im);
    if (!s) goto done;
    int64_t total = 0, truncated = 0;
    int used = 0;
    const double t0 = ds4_cli_now_s();
    for (int i = 0; i < n_prompts; i++) {
        int64_t n = (int64_t)prompts[i].n;
        if (n > ctx) {
            n = ctx;
            truncated++;
        }
        if (o->imatrix_max_tokens > 0 && total + n > o->imatrix_max_tokens) n = o->imatrix_max_tokens - total;
        if (n <= 0) break;
        ds4_session_reset(s);
        if (ds4_session_prefill(s, prompts[i].ids, n, NULL) != DS4_OK) {
            fprintf(stderr, "\nds4: prompt %d: %s\n", i + 1, ds4_last_error());
            goto done;
        }
        ds4_imatrix_add_chunk(im);
        total += n;
        used++;
        const double el = ds4_cli_now_s() - t0;
        fprintf(stderr, "\rimatrix: prompt %d/%d, %lld tokens, %.0f tok/s   ", i + 1, n_prompts, (long long)total,
                el > 0 ? (double)total / el : 0.0);
    }
    fprintf(stderr, "\n");
    if (truncated) fprintf(stderr, "ds4: %lld prompts were cut to --ctx %lld tokens\n", (long long)truncated, (long long)ctx);
    if (ds4_imatrix_save(im, o->imatrix_out, o->imatrix_dataset) != DS4_OK) {
        fprintf(stderr, "ds4: %s\n", ds4_last_error());
        goto done;
    }
    fprintf(stderr, "imatrix: %d tensors from %d prompts (%lld tokens) written to %s", ds4_imatrix_n_entries(im), used,
            (long long)total, o->imatrix_out);
    int64_t unseen = ds4_imatrix_unseen_experts(im);
    if (unseen) fprintf(stderr, "; %lld expert slabs saw no token (given the mean of the others)", (long long)unseen);
    fprintf(stderr, "\n");
    rc = 0;
done:
    for (int i = 0; i < n_prompts; i++) ds4_tokens_free(&prompts[i]);
    free(prompts);
    ds4_session_free(s);
    ds4_model_close(model);
    ds4_imatrix_free(im);
    return rc;
}

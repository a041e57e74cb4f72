/*
 * cli_perplexity.c - `ds4 --perplexity-file FILE [--ctx N] [--chunks N]`
 * (see cli_perplexity.h).
 *
 * The convention is llama.cpp's llama-perplexity, so numbers can be set
 * side by side: the text is tokenized as plain text (no special tokens),
 * cut into consecutive chunks of ctx tokens (a partial last chunk is
 * dropped), the first token of each chunk is replaced by BOS, every chunk
 * starts from an empty context, and only the second half of each chunk is
 * scored (the predictions of tokens first+1 .. ctx-1 with first = ctx/2),
 * so every scored token sees at least ctx/2 tokens of context. The
 * uncertainty is the standard error of the mean NLL, carried to the
 * perplexity: PPL * sqrt(var(nll) / (n - 1)).
 */
#include "cli/cli_perplexity.h"

#include "cli/cli_io.h"
#include "include/ds4.h"
#include "include/ds4_tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_PPL_CTX 512
#define LOGIT_ROWS 64 /* rows of logits fetched per prefill call (memory: rows x vocab floats) */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double ds4_cli_token_nll(const float *logits, int n_vocab, int32_t target)
{
    float mx = logits[0];
    for (int i = 1; i < n_vocab; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0.0;
    for (int i = 0; i < n_vocab; i++) sum += exp((double)logits[i] - mx);
    return log(sum) + mx - (double)logits[target];
}

ds4_session *ds4_cli_open_session(const ds4_cli_options *o, ds4_model **model, int64_t n_ctx)
{
    *model = ds4_model_open(o->model, &o->model_opt);
    if (!*model) {
        fprintf(stderr, "ds4: %s\n", ds4_last_error());
        return NULL;
    }
    ds4_session_params p;
    ds4_session_params_default(&p);
    p.n_ctx = n_ctx;
    p.n_threads = o->threads;
    p.backend = (ds4_backend_kind)o->backend;
    p.gpu_device = o->gpu_device;
    ds4_session *s = ds4_session_create(*model, &p);
    if (!s) {
        fprintf(stderr, "ds4: %s\n", ds4_last_error());
        ds4_model_close(*model);
        *model = NULL;
    }
    return s;
}

int ds4_cli_perplexity(const ds4_cli_options *o)
{
    const int64_t ctx = o->ctx_given ? o->ctx : DEFAULT_PPL_CTX;
    size_t len;
    char *text = ds4_cli_read_file(o->perplexity_file, &len);
    if (!text) return 1;
    if (len == 0) {
        fprintf(stderr, "ds4: --perplexity-file %s is empty\n", o->perplexity_file);
        free(text);
        return 1;
    }
    ds4_tokenizer *tok = ds4_tokenizer_load(o->model);
    if (!tok) {
        fprintf(stderr, "ds4: %s\n", ds4_last_error());
        free(text);
        return 1;
    }
    ds4_tokens ids = {0};
    /* Plain text: a "<｜User｜>" typed in the file stays text (flags 0). */
    ds4_status st = ds4_tokenize(tok, text, len, 0, &ids);
    free(text);
    const int32_t bos = ds4_tokenizer_special(tok, DS4_TOK_BOS);
    ds4_tokenizer_free(tok);
    if (st != DS4_OK) {
        fprintf(stderr, "ds4: tokenize: %s\n", ds4_last_error());
        ds4_tokens_free(&ids);
        return 1;
    }
    int64_t n_chunk = (int64_t)ids.n / ctx;
    if (n_chunk < 1) {
        fprintf(stderr, "ds4: %s has %zu tokens; --ctx %lld needs at least %lld (one chunk)\n",
                o->perplexity_file, ids.n, (long long)ctx, (long long)ctx);
        ds4_tokens_free(&ids);
        return 1;
    }
    if (o->ppl_chunks > 0 && o->ppl_chunks < n_chunk) n_chunk = o->ppl_chunks;

    ds4_model *model = NULL;
    ds4_session *s = ds4_cli_open_session(o, &model, ctx);
    if (!s) {
        ds4_tokens_free(&ids);
        return 1;
    }
    const int n_vocab = ds4_model_n_vocab(model);
    float *logits = malloc((size_t)LOGIT_ROWS * (size_t)n_vocab * sizeof *logits);
    int32_t *chunk = malloc((size_t)ctx * sizeof *chunk);
    int rc = 1;
    if (!logits || !chunk) {
        fprintf(stderr, "ds4: out of memory\n");
        goto done;
    }
    const int64_t first = ctx / 2;
    fprintf(stderr, "perplexity: %zu tokens, %lld chunks of %lld, scoring the last %lld tokens of each\n", ids.n,
            (long long)n_chunk, (long long)ctx, (long long)(ctx - first - 1));
    double nll = 0.0, nll2 = 0.0;
    int64_t count = 0;
    const double t0 = now_s();
    for (int64_t c = 0; c < n_chunk; c++) {
        memcpy(chunk, ids.ids + c * ctx, (size_t)ctx * sizeof *chunk);
        chunk[0] = bos;
        ds4_session_reset(s);
        st = ds4_session_prefill(s, chunk, first, NULL);
        /* logits after token j predict token j+1: rows first .. ctx-2 */
        for (int64_t j = first; st == DS4_OK && j < ctx - 1; j += LOGIT_ROWS) {
            int64_t n = ctx - 1 - j < LOGIT_ROWS ? ctx - 1 - j : LOGIT_ROWS;
            st = ds4_session_prefill(s, chunk + j, n, logits);
            for (int64_t r = 0; st == DS4_OK && r < n; r++) {
                double v = ds4_cli_token_nll(logits + (size_t)r * (size_t)n_vocab, n_vocab, chunk[j + r + 1]);
                nll += v;
                nll2 += v * v;
                count++;
            }
        }
        if (st != DS4_OK) {
            fprintf(stderr, "\nds4: chunk %lld: %s\n", (long long)c + 1, ds4_last_error());
            goto done;
        }
        const double el = now_s() - t0;
        printf("[%lld]%.4f%s", (long long)c + 1, exp(nll / (double)count), c + 1 < n_chunk ? "," : "\n");
        fflush(stdout);
        fprintf(stderr, "\rperplexity: chunk %lld/%lld, %.2f s/chunk, ETA %.0f s   ", (long long)c + 1,
                (long long)n_chunk, el / (double)(c + 1), el / (double)(c + 1) * (double)(n_chunk - c - 1));
    }
    fprintf(stderr, "\n");
    const double mean = nll / (double)count;
    const double var = nll2 / (double)count - mean * mean;
    const double err = count > 1 && var > 0 ? sqrt(var / (double)(count - 1)) : 0.0;
    const double ppl = exp(mean);
    printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, ppl * err);
    printf("mean NLL = %.6f +/- %.6f nats/token over %lld tokens\n", mean, err, (long long)count);
    rc = 0;
done:
    free(logits);
    free(chunk);
    ds4_session_free(s);
    ds4_model_close(model);
    ds4_tokens_free(&ids);
    return rc;
}

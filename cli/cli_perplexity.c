/*
 * cli_perplexity.c - `ds4 --perplexity-file FILE [--ctx N] [--chunks N]`
 * (see cli_perplexity.h).
 *
 * The convention is llama.cpp's llama-perplexity, so numbers can be set
 * side by side: the text is tokenized as plain text (no special tokens),
 * cut into consecutive chunks of ctx tokens (a partial last chunk is
 * dropped), every chunk starts from an empty context, and only the second
 * half of each chunk is scored (the predictions of tokens first+1 .. ctx-1
 * with first = ctx/2), so every scored token sees at least ctx/2 tokens of
 * context. BOS follows the file's tokenizer.ggml.add_bos_token as there:
 * when true, BOS is put before the whole text and then replaces the first
 * token of every chunk; when false (DeepSeek V4's tokenizer) the chunks
 * are the text's tokens alone. Replacing the first token regardless, as
 * this command did before, moved a perplexity on a 4-layer random Flash
 * file 4% away from llama-perplexity's (docs/BENCHMARKS.md, issue 20);
 * --ppl-bos keeps that convention on request. The uncertainty is the
 * standard error of the mean NLL, carried to the perplexity:
 * PPL * sqrt(var(nll) / (n - 1)).
 */
#include "cli/cli_perplexity.h"

#include "cli/cli_io.h"
#include "cli/cli_kld_base.h"
#include "cli/cli_progress.h"
#include "gguf/gguf.h"
#include "include/ds4.h"
#include "include/ds4_tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_PPL_CTX 512
#define LOGIT_ROWS 64 /* rows of logits fetched per prefill call (memory: rows x vocab floats) */

double ds4_cli_token_nll(const float *logits, int n_vocab, int32_t target)
{
    float mx = logits[0];
    for (int i = 1; i < n_vocab; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0.0;
    for (int i = 0; i < n_vocab; i++) sum += exp((double)logits[i] - mx);
    return log(sum) + mx - (double)logits[target];
}

ds4_session *ds4_cli_open_session(const ds4_cli_options *o, ds4_model **model, int64_t n_ctx, ds4_imatrix *imatrix)
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
    p.numerics = (ds4_numerics)o->numerics;
    p.imatrix = imatrix;
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
    ds4_gguf *g = ds4_gguf_open(o->model);
    ds4_tokenizer *tok = g ? ds4_tokenizer_from_gguf(g) : NULL;
    /* a missing key: false, llama.cpp's default for this vocabulary (BPE, pre-tokenizer joyai-llm) */
    bool vocab_bos = false;
    if (g && ds4_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &vocab_bos) != DS4_OK) vocab_bos = false;
    if (g) ds4_gguf_close(g);
    if (!tok) {
        fprintf(stderr, "ds4: %s\n", ds4_last_error());
        free(text);
        return 1;
    }
    const int32_t bos = ds4_tokenizer_special(tok, DS4_TOK_BOS);
    ds4_tokens ids = {0};
    /* llama-perplexity tokenizes with the vocabulary's own BOS in front */
    ds4_status st = vocab_bos ? ds4_tokens_push(&ids, bos) : DS4_OK;
    /* Plain text: a "<｜User｜>" typed in the file stays text (flags 0). */
    ds4_tokens text_ids = {0};
    if (st == DS4_OK) st = ds4_tokenize(tok, text, len, 0, &text_ids);
    for (size_t i = 0; st == DS4_OK && i < text_ids.n; i++) st = ds4_tokens_push(&ids, text_ids.ids[i]);
    ds4_tokens_free(&text_ids);
    free(text);
    ds4_tokenizer_free(tok);
    const bool chunk_bos = vocab_bos || o->ppl_bos;
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
    ds4_session *s = ds4_cli_open_session(o, &model, ctx, NULL);
    if (!s) {
        ds4_tokens_free(&ids);
        return 1;
    }
    const int n_vocab = ds4_model_n_vocab(model);
    float *logits = malloc((size_t)LOGIT_ROWS * (size_t)n_vocab * sizeof *logits);
    int32_t *chunk = malloc((size_t)ctx * sizeof *chunk);
    FILE *kld = NULL;
    int rc = 1;
    if (!logits || !chunk) {
        fprintf(stderr, "ds4: out of memory\n");
        goto done;
    }
    if (o->kld_base && !(kld = ds4_kld_base_create(o->kld_base, (int32_t)ctx, n_vocab, (int32_t)n_chunk, ids.ids)))
        goto done;
    const int64_t first = ctx / 2;
    fprintf(stderr, "perplexity: %zu tokens, %lld chunks of %lld, scoring the last %lld tokens of each; %s\n",
            ids.n, (long long)n_chunk, (long long)ctx, (long long)(ctx - first - 1),
            chunk_bos ? (vocab_bos ? "BOS starts each chunk (tokenizer.ggml.add_bos_token)" : "BOS starts each chunk (--ppl-bos)")
                      : "no BOS (tokenizer.ggml.add_bos_token is false)");
    double nll = 0.0, nll2 = 0.0;
    int64_t count = 0;
    const double t0 = ds4_cli_now_s();
    for (int64_t c = 0; c < n_chunk; c++) {
        memcpy(chunk, ids.ids + c * ctx, (size_t)ctx * sizeof *chunk);
        if (chunk_bos) chunk[0] = bos;
        ds4_session_reset(s);
        st = ds4_session_prefill(s, chunk, first, NULL);
        /* logits after token j predict token j+1: rows first .. ctx-2 */
        for (int64_t j = first; st == DS4_OK && j < ctx - 1; j += LOGIT_ROWS) {
            int64_t n = ctx - 1 - j < LOGIT_ROWS ? ctx - 1 - j : LOGIT_ROWS;
            st = ds4_session_prefill(s, chunk + j, n, logits);
            for (int64_t r = 0; st == DS4_OK && r < n; r++) {
                double v = ds4_cli_token_nll(logits + (size_t)r * (size_t)n_vocab, n_vocab, chunk[j + r + 1]);
                if (kld && ds4_kld_base_row(kld, logits + (size_t)r * (size_t)n_vocab, n_vocab)) goto done;
                nll += v;
                nll2 += v * v;
                count++;
            }
        }
        if (st != DS4_OK) {
            fprintf(stderr, "\nds4: chunk %lld: %s\n", (long long)c + 1, ds4_last_error());
            goto done;
        }
        const double el = ds4_cli_now_s() - t0;
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
    if (kld && ds4_kld_base_close(kld, o->kld_base)) rc = 1;
    free(logits);
    free(chunk);
    ds4_session_free(s);
    ds4_model_close(model);
    ds4_tokens_free(&ids);
    return rc;
}

/*
 * ds4-mtp-data - the training data of an MTP block from our own runs:
 * for each text of a file (texts separated by a line holding only
 * "<<<END>>>", special-token strings recognised, as the demo's renderer
 * writes them), the token ids and the main model's final mHC state at
 * every position.
 *
 *   ds4-mtp-data -m MODEL --texts FILE --out PREFIX [--max-tokens N] [-t N]
 *
 * Writes PREFIX.tokens (i32, a -1 after each text) and PREFIX.hidden
 * (f16 [n_tokens, n_hc, n_embd], the separators excluded), both
 * little-endian. tools/train_demo/train_mtp.py reads them.
 */
#include "include/ds4.h"
#include "include/ds4_tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint16_t to_f16(float f)
{
    /* round to nearest even; the states are small, no inf/nan expected */
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    int32_t e = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t m = x & 0x7fffffu;
    if (e >= 31) return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10) return (uint16_t)sign;
        m |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - e), half = 1u << (shift - 1);
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((uint32_t)e << 10) | (m >> 13), rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1))) r++;
    return (uint16_t)(sign | r);
}

int main(int argc, char **argv)
{
    const char *model = NULL, *texts = NULL, *out = NULL;
    long max_tokens = 0, threads = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-m")) model = argv[i + 1];
        else if (!strcmp(argv[i], "--texts")) texts = argv[i + 1];
        else if (!strcmp(argv[i], "--out")) out = argv[i + 1];
        else if (!strcmp(argv[i], "--max-tokens")) max_tokens = strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "-t")) threads = strtol(argv[i + 1], NULL, 10);
        else {
            fprintf(stderr, "ds4-mtp-data: unknown flag %s\n", argv[i]);
            return 2;
        }
    }
    if (!model || !texts || !out) {
        fprintf(stderr, "usage: ds4-mtp-data -m MODEL --texts FILE --out PREFIX [--max-tokens N] [-t N]\n");
        return 2;
    }
    FILE *f = fopen(texts, "rb");
    ds4_tokenizer *tok = f ? ds4_tokenizer_load(model) : NULL;
    ds4_model *m = tok ? ds4_model_open(model, NULL) : NULL;
    if (!m) {
        fprintf(stderr, "ds4-mtp-data: %s\n", f ? ds4_last_error() : "cannot open the texts");
        return 1;
    }
    ds4_session_params sp;
    ds4_session_params_default(&sp);
    sp.n_ctx = 8192;
    sp.n_threads = (int)threads;
    ds4_session *s = ds4_session_create(m, &sp);
    char path[4096];
    snprintf(path, sizeof path, "%s.tokens", out);
    FILE *ft = fopen(path, "wb");
    snprintf(path, sizeof path, "%s.hidden", out);
    FILE *fh = fopen(path, "wb");
    if (!s || !ft || !fh) {
        fprintf(stderr, "ds4-mtp-data: cannot start (%s)\n", s ? "output files" : ds4_last_error());
        return 1;
    }
    const int row = ds4_model_n_hc(m) * ds4_model_n_embd(m), chunk = sp.max_chunk;
    float *h = malloc((size_t)chunk * row * sizeof(float));
    uint16_t *h16 = malloc((size_t)chunk * row * sizeof(uint16_t));
    char *buf = NULL, *line = NULL;
    size_t len = 0, cap = 0, lcap = 0;
    ssize_t n;
    long total = 0;
    int texts_done = 0, rc = 0;
    for (bool eof = false; !eof && rc == 0 && (!max_tokens || total < max_tokens);) {
        n = getline(&line, &lcap, f);
        eof = n < 0;
        if (!eof && strcmp(line, "<<<END>>>\n") != 0) {
            if (len + (size_t)n + 1 > cap) {
                cap = 2 * (len + (size_t)n + 1);
                buf = realloc(buf, cap);
            }
            memcpy(buf + len, line, (size_t)n);
            len += (size_t)n;
            continue;
        }
        if (len == 0) continue;
        if (buf[len - 1] == '\n') len--; /* the separator's line break */
        ds4_tokens t = {0};
        ds4_tokenize(tok, buf, len, DS4_TOKENIZE_SPECIAL, &t);
        len = 0;
        if (t.n > (size_t)sp.n_ctx) t.n = (size_t)sp.n_ctx;
        ds4_session_reset(s);
        for (size_t i = 0; i < t.n && rc == 0; i += (size_t)chunk) {
            int T = t.n - i < (size_t)chunk ? (int)(t.n - i) : chunk;
            if (ds4_session_prefill(s, t.ids + i, T, NULL) != DS4_OK || ds4_session_hidden(s, T, h) != DS4_OK) {
                fprintf(stderr, "ds4-mtp-data: %s\n", ds4_last_error());
                rc = 1;
                break;
            }
            for (size_t k = 0; k < (size_t)T * row; k++) h16[k] = to_f16(h[k]);
            fwrite(h16, sizeof(uint16_t), (size_t)T * row, fh);
        }
        int32_t sep = -1;
        fwrite(t.ids, sizeof(int32_t), t.n, ft);
        fwrite(&sep, sizeof sep, 1, ft);
        total += (long)t.n;
        texts_done++;
        ds4_tokens_free(&t);
    }
    if (fclose(ft) != 0 || fclose(fh) != 0) rc = 1;
    printf("ds4-mtp-data: %d texts, %ld tokens, %d floats per token\n", texts_done, total, row);
    free(h), free(h16), free(buf), free(line);
    fclose(f);
    ds4_session_free(s);
    ds4_model_close(m);
    ds4_tokenizer_free(tok);
    return rc;
}

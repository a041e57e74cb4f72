/*
 * cli_kld_base.c - llama-perplexity's KL-divergence base file, written
 * from DwarfStar's logits (see cli_kld_base.h for the layout).
 */
#include "cli/cli_kld_base.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

FILE *ds4_kld_base_create(const char *path, int32_t n_ctx, int32_t n_vocab, int32_t n_chunk, const int32_t *tokens)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "ds4: --kld-base %s: %s\n", path, strerror(errno));
        return NULL;
    }
    const int32_t head[3] = {n_ctx, n_vocab, n_chunk};
    if (fwrite("_logits_", 1, 8, f) != 8 || fwrite(head, sizeof head[0], 3, f) != 3 ||
        fwrite(tokens, sizeof *tokens, (size_t)n_ctx * (size_t)n_chunk, f) != (size_t)n_ctx * (size_t)n_chunk) {
        fprintf(stderr, "ds4: --kld-base %s: write failed: %s\n", path, strerror(errno));
        fclose(f);
        return NULL;
    }
    return f;
}

int ds4_kld_base_row(FILE *f, const float *logits, int n_vocab)
{
    const size_t nv = 2 * (((size_t)n_vocab + 1) / 2) + 4;
    uint16_t *row = calloc(nv, sizeof *row);
    if (!row) {
        fprintf(stderr, "ds4: --kld-base: out of memory\n");
        return -1;
    }
    float mx = logits[0], mn = logits[0];
    for (int i = 1; i < n_vocab; i++) {
        if (logits[i] > mx) mx = logits[i];
        if (logits[i] < mn) mn = logits[i];
    }
    /* the reader ignores probabilities below e^-16 of the top one */
    if (mn < mx - 16.0f) mn = mx - 16.0f;
    double sum = 0.0;
    for (int i = 0; i < n_vocab; i++) sum += exp((double)logits[i] - mx);
    const float head[2] = {(mx - mn) / 65535.0f, (float)((double)mn - mx - log(sum))};
    memcpy(row, head, sizeof head);
    if (head[0] > 0.0f) {
        const float inv = 1.0f / head[0];
        for (int i = 0; i < n_vocab; i++) {
            const float q = logits[i] > mn ? nearbyintf(inv * (logits[i] - mn)) : 0.0f;
            row[4 + i] = (uint16_t)(q > 65535.0f ? 65535.0f : q);
        }
    }
    const int ok = fwrite(row, sizeof *row, nv, f) == nv;
    free(row);
    if (!ok) fprintf(stderr, "ds4: --kld-base: write failed: %s\n", strerror(errno));
    return ok ? 0 : -1;
}

int ds4_kld_base_close(FILE *f, const char *path)
{
    const int bad = ferror(f) | fclose(f);
    if (bad) fprintf(stderr, "ds4: --kld-base %s: write failed\n", path);
    return bad ? -1 : 0;
}

/*
 * ds4-steer - build a directional-steering file from two prompt sets.
 *
 *   ds4-steer -m MODEL --target FILE --contrast FILE --out DIR.f32
 *             [--think] [--ctx N] [-t N]
 *
 * Each non-empty line of a set is one user message, rendered with the
 * official chat template and fed to a fresh session. Per prompt the FFN
 * sublayer outputs of every layer (what --dir-steering-ffn edits) are
 * averaged over its tokens; per set the prompts' means are averaged (each
 * prompt weighs the same). The direction of layer l is
 * normalise(mean_target[l] - mean_contrast[l]); written as n_layer x
 * n_embd little-endian f32, the format --dir-steering-file reads. With a
 * positive scale the engine then removes the target set's component
 * (S < 0 adds it).
 */
#include "include/ds4.h"
#include "include/ds4_chat.h"
#include "include/ds4_tokenizer.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(const char *msg)
{
    if (msg) fprintf(stderr, "ds4-steer: %s\n", msg);
    fprintf(msg ? stderr : stdout,
            "usage: ds4-steer -m MODEL --target FILE --contrast FILE --out FILE.f32 [--think] [--ctx N] [-t N]\n"
            "  one prompt per line in each set; the direction per layer is the normalised\n"
            "  difference of the mean FFN outputs (target minus contrast)\n");
    return msg ? 2 : 0;
}

/* Mean over the set's prompts of each prompt's per-layer mean FFN output. */
static int set_mean(const char *path, ds4_session *s, const ds4_tokenizer *tok, bool think, int L, int E, double *mean,
                    int *n_prompts)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "ds4-steer: cannot open %s\n", path);
        return -1;
    }
    double *m = malloc((size_t)L * E * sizeof *m);
    memset(mean, 0, (size_t)L * E * sizeof *mean);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int n = 0, rc = 0, lineno = 0;
    ds4_chat_options co;
    ds4_chat_options_default(&co);
    co.thinking = think;
    while (rc == 0 && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (len == 0) continue;
        json_t *msgs = json_pack("[{s:s, s:s%}]", "role", "user", "content", line, (size_t)len);
        ds4_tokens t = {0};
        if (!msgs || ds4_chat_tokenize(tok, msgs, NULL, &co, &t) != DS4_OK) {
            fprintf(stderr, "ds4-steer: %s:%d: %s\n", path, lineno, msgs ? ds4_last_error() : "not valid UTF-8");
            rc = -1;
        } else {
            ds4_session_reset(s);
            if (ds4_session_prefill(s, t.ids, (int64_t)t.n, NULL) != DS4_OK) {
                fprintf(stderr, "ds4-steer: %s:%d: %s\n", path, lineno, ds4_last_error());
                rc = -1;
            } else {
                ds4_session_capture_take(s, m);
                for (size_t i = 0; i < (size_t)L * E; i++) mean[i] += m[i];
                n++;
            }
        }
        ds4_tokens_free(&t);
        json_decref(msgs);
    }
    free(line);
    free(m);
    fclose(f);
    if (rc == 0 && n == 0) {
        fprintf(stderr, "ds4-steer: %s has no prompts (one per line)\n", path);
        rc = -1;
    }
    for (size_t i = 0; rc == 0 && i < (size_t)L * E; i++) mean[i] /= n;
    *n_prompts = n;
    return rc;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *target = NULL, *contrast = NULL, *out = NULL;
    bool think = false;
    long ctx = 4096, threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(NULL);
        if (!strcmp(a, "--think")) {
            think = true;
            continue;
        }
        if (!v) return usage("a flag is missing its value");
        if (!strcmp(a, "-m")) model = v;
        else if (!strcmp(a, "--target")) target = v;
        else if (!strcmp(a, "--contrast")) contrast = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--ctx")) ctx = strtol(v, NULL, 10);
        else if (!strcmp(a, "-t")) threads = strtol(v, NULL, 10);
        else return usage("unknown flag");
        i++;
    }
    if (!model || !target || !contrast || !out) return usage("-m, --target, --contrast and --out are required");
    if (ctx < 16 || ctx > (1 << 24) || threads < 0 || threads > 4096) return usage("--ctx 16.. or -t 0..4096");
    ds4_tokenizer *tok = ds4_tokenizer_load(model);
    ds4_model *m = tok ? ds4_model_open(model, NULL) : NULL;
    if (!m) {
        fprintf(stderr, "ds4-steer: %s: %s\n", model, ds4_last_error());
        ds4_tokenizer_free(tok);
        return 1;
    }
    ds4_session_params sp;
    ds4_session_params_default(&sp);
    sp.n_ctx = ctx;
    sp.n_threads = (int)threads;
    ds4_session *s = ds4_session_create(m, &sp);
    int L = ds4_model_n_layer(m), E = ds4_model_n_embd(m), rc = 1, na = 0, nb = 0;
    double *a = malloc((size_t)L * E * sizeof *a), *b = malloc((size_t)L * E * sizeof *b);
    float *d = malloc((size_t)L * E * sizeof *d);
    if (!s || ds4_session_capture_ffn(s, 1) != DS4_OK) {
        fprintf(stderr, "ds4-steer: %s\n", ds4_last_error());
    } else if (set_mean(target, s, tok, think, L, E, a, &na) == 0 && set_mean(contrast, s, tok, think, L, E, b, &nb) == 0) {
        rc = 0;
        for (int l = 0; l < L; l++) {
            double nn = 0;
            for (int i = 0; i < E; i++) nn += (a[(size_t)l * E + i] - b[(size_t)l * E + i]) * (a[(size_t)l * E + i] - b[(size_t)l * E + i]);
            double r = sqrt(nn);
            /* identical means: no direction, the layer is left alone */
            for (int i = 0; i < E; i++) d[(size_t)l * E + i] = r > 0 ? (float)((a[(size_t)l * E + i] - b[(size_t)l * E + i]) / r) : 0.0f;
            printf("layer %2d: |mean difference| %.4g\n", l, r);
        }
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", out);
        FILE *f = fopen(tmp, "wb");
        if (!f || fwrite(d, sizeof(float), (size_t)L * E, f) != (size_t)L * E || fclose(f) != 0 || rename(tmp, out) != 0) {
            fprintf(stderr, "ds4-steer: cannot write %s\n", out);
            rc = 1;
        } else {
            printf("wrote %s: %d layers x %d dims from %d target and %d contrast prompts\n", out, L, E, na, nb);
        }
    }
    free(a), free(b), free(d);
    ds4_session_free(s);
    ds4_model_close(m);
    ds4_tokenizer_free(tok);
    return rc;
}

/*
 * ds4_quality_main.c - ds4-quality: how close a model's predictions are to
 * reference continuations (docs/QUALITY.md). Argument parsing only; the
 * work is in quality_score.c, quality_compare.c and quality_make.c.
 */
#include "include/ds4.h"
#include "tools/quality_tools.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fputs("usage: ds4-quality score MODEL MANIFEST OUT.tsv [--threads N] [--cpu|--cuda]\n"
          "       ds4-quality compare A.tsv B.tsv\n"
          "       ds4-quality manifest MODEL PROMPTS.jsonl OUT.json [--steps N] [--top-k K] [--think]\n"
          "       ds4-quality weight-error REF.gguf Q.gguf [--imatrix FILE]\n"
          "\n"
          "score     teacher-force each reference continuation of MANIFEST through MODEL:\n"
          "          per item NLL, first-token match, greedy common-prefix length and\n"
          "          overlap with the reference top-k, one TSV row per item\n"
          "compare   join two score files by item: means, mean difference B-A with its\n"
          "          standard error, and wins per metric\n"
          "manifest  a manifest from MODEL's own greedy answers to PROMPTS.jsonl (one\n"
          "          {\"id\", \"prompt\" | \"messages\" | \"prompt_rendered\"} per line), with\n"
          "          the top-K log-probabilities per step (--steps 32, --top-k 20)\n"
          "weight-error  squared error of Q's routed experts against REF's, also weighted by\n"
          "          the imatrix's column importance (what its quantizer minimises)\n"
          "\n"
          "A manifest from an OpenAI-compatible endpoint (logprobs/top_logprobs):\n"
          "scripts/quality_collect.py. Exit status: 0 ok, 1 error, 2 usage.\n",
          f);
}

static int parse_int(const char *flag, const char *s, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "ds4-quality: %s %s: expected an integer in %ld..%ld\n", flag, s, lo, hi);
        return 0;
    }
    *out = (int)v;
    return 1;
}

ds4_session *quality_open_session(const quality_run_opts *o, const char *path, int64_t n_ctx, ds4_model **model)
{
    *model = ds4_model_open(path, NULL);
    if (!*model) {
        fprintf(stderr, "ds4-quality: %s\n", ds4_last_error());
        return NULL;
    }
    ds4_session_params p;
    ds4_session_params_default(&p);
    p.n_ctx = n_ctx;
    p.n_threads = o->threads;
    p.backend = (ds4_backend_kind)o->backend;
    ds4_session *s = ds4_session_create(*model, &p);
    if (!s) {
        fprintf(stderr, "ds4-quality: %s\n", ds4_last_error());
        ds4_model_close(*model);
        *model = NULL;
    }
    return s;
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    quality_run_opts o = {.steps = 32, .top_k = 20};
    const char *imatrix = NULL;
    const char *pos[3];
    int npos = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--threads") == 0 || strcmp(a, "--steps") == 0 || strcmp(a, "--top-k") == 0) {
            if (!v) {
                fprintf(stderr, "ds4-quality: %s needs a value\n", a);
                return 2;
            }
            i++;
            if (strcmp(a, "--threads") == 0 && !parse_int(a, v, 1, 4096, &o.threads)) return 2;
            if (strcmp(a, "--steps") == 0 && !parse_int(a, v, 1, 1 << 20, &o.steps)) return 2;
            if (strcmp(a, "--top-k") == 0 && !parse_int(a, v, 1, 1000, &o.top_k)) return 2;
        } else if (strcmp(a, "--imatrix") == 0) {
            if (!v) {
                fprintf(stderr, "ds4-quality: %s needs a value\n", a);
                return 2;
            }
            imatrix = v;
            i++;
        } else if (strcmp(a, "--cpu") == 0) {
            o.backend = DS4_BACKEND_CPU;
        } else if (strcmp(a, "--cuda") == 0) {
            o.backend = DS4_BACKEND_CUDA;
        } else if (strcmp(a, "--think") == 0) {
            o.thinking = 1;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "ds4-quality: unknown option '%s'\n", a);
            return 2;
        } else if (npos < 3) {
            pos[npos++] = a;
        } else {
            fprintf(stderr, "ds4-quality: unexpected argument '%s'\n", a);
            return 2;
        }
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "score") == 0 && npos == 3) return quality_score(&o, pos[0], pos[1], pos[2]);
    if (strcmp(cmd, "compare") == 0 && npos == 2) return quality_compare(pos[0], pos[1]);
    if (strcmp(cmd, "weight-error") == 0 && npos == 2) return quality_weight_error(pos[0], pos[1], imatrix);
    if (strcmp(cmd, "manifest") == 0 && npos == 3) return quality_make_manifest(&o, pos[0], pos[1], pos[2]);
    fprintf(stderr, "ds4-quality: bad command or argument count\n\n");
    usage(stderr);
    return 2;
}

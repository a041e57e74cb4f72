/*
 * dump_logits.c - `ds4 -m MODEL --token-ids FILE --dump-logits OUT`.
 *
 * FILE holds whitespace-separated token ids. OUT receives raw little-endian
 * float32 [n_tokens, vocab]: row i = logits after token i. The first K
 * tokens (--decode-from K, default all) are prefilled in chunks of
 * --prefill-chunk N (default 128); the rest go one at a time through the
 * decode path, so every schedule of the same tokens can be compared.
 * --numerics defaults to auto: official where the model's shapes allow the
 * FP8/FP4 simulation (Flash), else hf (the tiny test models).
 */
#include "cli/dump_logits.h"

#include "cli/cli_stream_options.h"

#include "include/ds4.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(const char *msg)
{
    fprintf(stderr,
            "ds4: %s\nusage: ds4 -m MODEL --token-ids FILE --dump-logits OUT [--numerics hf|official|auto]\n"
            "           [--prefill-chunk N] [--decode-from K] [--threads N] [--cpu | --cuda] [--gpu-device N]\n"
            "           [--ssd-streaming [--ssd-streaming-cache-experts N|NGB] ...] [--expert-profile FILE]\n",
            msg);
    return 2;
}

static int parse_int(const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* Whitespace-separated non-negative ids; malloc'd array. */
static int32_t *read_ids(const char *path, int64_t *n_out)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "ds4: cannot open %s: %s\n", path, strerror(errno));
        return NULL;
    }
    int64_t n = 0, cap = 1024;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    char word[64];
    int c, len = 0;
    for (;;) {
        c = fgetc(f);
        if (c == EOF || c == ' ' || c == '\n' || c == '\t' || c == '\r') {
            if (len) {
                word[len] = 0;
                long long v;
                if (parse_int(word, 0, INT32_MAX, &v)) {
                    fprintf(stderr, "ds4: %s: bad token id '%s' (entry %lld)\n", path, word, (long long)n);
                    goto fail;
                }
                if (n == cap) {
                    cap *= 2;
                    int32_t *p = realloc(ids, (size_t)cap * sizeof *ids);
                    if (!p) goto fail;
                    ids = p;
                }
                ids[n++] = (int32_t)v;
                len = 0;
            }
            if (c == EOF) break;
        } else {
            if (len >= (int)sizeof word - 1) {
                fprintf(stderr, "ds4: %s: token entry %lld too long\n", path, (long long)n);
                goto fail;
            }
            word[len++] = (char)c;
        }
    }
    fclose(f);
    *n_out = n;
    return ids;
fail:
    fclose(f);
    free(ids);
    return NULL;
}

int ds4_cli_dump_logits(int argc, char **argv)
{
    const char *model = NULL, *ids_path = NULL, *out_path = NULL;
    long long chunk = 128, decode_from = -1, threads = 0, gpu_device = 0;
    ds4_backend_kind backend = DS4_BACKEND_AUTO;
    ds4_numerics numerics = DS4_NUMERICS_AUTO; /* official where the shapes allow it */
    ds4_model_options mo;
    memset(&mo, 0, sizeof mo);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL, *err = NULL;
        int sr = ds4_cli_stream_option(&mo, argc, argv, &i, &err);
        if (sr < 0) return usage(err);
        if (sr > 0) continue;
        if (!strcmp(a, "--cpu") || !strcmp(a, "--cuda")) {
            backend = !strcmp(a, "--cpu") ? DS4_BACKEND_CPU : DS4_BACKEND_CUDA;
            continue;
        }
        if (!strcmp(a, "--gpu-device")) {
            if (!v || parse_int(v, 0, 1024, &gpu_device)) return usage("--gpu-device takes a device index");
            i++;
            continue;
        }
        if (!strcmp(a, "-m") || !strcmp(a, "--model") || !strcmp(a, "--token-ids") || !strcmp(a, "--dump-logits") ||
            !strcmp(a, "--numerics") || !strcmp(a, "--prefill-chunk") || !strcmp(a, "--decode-from") ||
            !strcmp(a, "--threads") || !strcmp(a, "-t")) {
            if (!v) return usage("missing value after an option");
            i++;
            if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
            else if (!strcmp(a, "--token-ids")) ids_path = v;
            else if (!strcmp(a, "--dump-logits")) out_path = v;
            else if (!strcmp(a, "--numerics")) {
                if (!strcmp(v, "hf")) numerics = DS4_NUMERICS_HF;
                else if (!strcmp(v, "official")) numerics = DS4_NUMERICS_OFFICIAL;
                else if (!strcmp(v, "auto")) numerics = DS4_NUMERICS_AUTO;
                else return usage("--numerics takes hf, official or auto");
            } else if (!strcmp(a, "--prefill-chunk")) {
                if (parse_int(v, 1, 65536, &chunk)) return usage("--prefill-chunk takes 1..65536");
            } else if (!strcmp(a, "--decode-from")) {
                if (parse_int(v, 0, INT32_MAX, &decode_from)) return usage("--decode-from takes a token count");
            } else if (parse_int(v, 0, 4096, &threads)) {
                return usage("--threads takes 0..4096");
            }
        } else {
            return usage("unknown option for --dump-logits");
        }
    }
    if (!model || !ids_path || !out_path) return usage("-m, --token-ids and --dump-logits are required");
    if (ds4_cli_stream_check(&mo)) return usage(ds4_cli_stream_check(&mo));

    int64_t n;
    int32_t *ids = read_ids(ids_path, &n);
    if (!ids) return 1;
    if (n == 0) {
        free(ids);
        fprintf(stderr, "ds4: %s: no token ids\n", ids_path);
        return 1;
    }
    int rc = 1;
    float *logits = NULL;
    ds4_session *s = NULL;
    ds4_model *m = ds4_model_open(model, &mo);
    if (!m) goto done;
    ds4_session_params p;
    ds4_session_params_default(&p);
    p.n_ctx = n;
    p.numerics = numerics;
    p.n_threads = (int)threads;
    p.max_chunk = (int)chunk;
    p.backend = backend;
    p.gpu_device = (int)gpu_device;
    s = ds4_session_create(m, &p);
    if (!s) goto done;
    size_t V = (size_t)ds4_model_n_vocab(m);
    logits = malloc((size_t)n * V * sizeof(float));
    if (!logits) {
        fprintf(stderr, "ds4: out of memory for %lld x %zu logits\n", (long long)n, V);
        goto done;
    }
    int64_t k = decode_from < 0 || decode_from > n ? n : decode_from;
    if (ds4_session_prefill(s, ids, k, logits) != DS4_OK) goto done;
    for (int64_t i = k; i < n; i++) {
        if (ds4_session_decode(s, ids[i]) != DS4_OK) goto done;
        memcpy(logits + (size_t)i * V, ds4_session_logits(s), V * sizeof(float));
    }
    FILE *f = fopen(out_path, "wb");
    if (!f || fwrite(logits, sizeof(float), (size_t)n * V, f) != (size_t)n * V || fclose(f) != 0) {
        fprintf(stderr, "ds4: cannot write %s: %s\n", out_path, strerror(errno));
        free(ids);
        free(logits);
        ds4_session_free(s);
        ds4_model_close(m);
        return 1;
    }
    rc = 0;
    if (mo.ssd_streaming) {
        ds4_expert_stream_stats es;
        ds4_model_expert_stream_stats(m, &es);
        fprintf(stderr, "ds4: expert streaming: cache %llu experts, %llu preloaded, %llu hits, %llu misses, %.1f MiB read\n",
                (unsigned long long)es.cache_experts, (unsigned long long)es.preloaded, (unsigned long long)es.hits,
                (unsigned long long)es.misses, (double)es.bytes_read / (1 << 20));
    }
done:
    if (rc && ds4_last_error()[0]) fprintf(stderr, "ds4: %s\n", ds4_last_error());
    free(ids);
    free(logits);
    ds4_session_free(s);
    ds4_model_close(m);
    return rc;
}

/*
 * make_seeds.c - writes the seed corpora of the fuzz targets that need
 * binary files (run from the repository root after `make`):
 *
 *   cc -std=c11 -D_GNU_SOURCE -I. fuzz/make_seeds.c build/libds4.a \
 *      -ljansson -lcrypto -lutf8proc -lpcre2-8 -lm -pthread -o build/make_seeds && build/make_seeds
 *
 *   fuzz/corpus/model_load/micro.gguf       the micro model (fuzz_support.h)
 *   fuzz/corpus/tokenizer_gguf/mini.gguf    the mini vocabulary
 *   fuzz/corpus/kv_cache/micro-3tok.kv      a real cache file: the micro
 *                                           model after 3 tokens, with a
 *                                           tool map, as kv_disk_save writes it
 * Deterministic: the same files every run.
 */
#include <dirent.h>
#include <sys/stat.h>

#include "engine/kv_disk.h"
#include "fuzz/fuzz_support.h"
#include "include/ds4.h"

static int copy_only_kv(const char *dir, const char *to)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int ok = 0;
    while (d && (de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (n < 4 || strcmp(de->d_name + n - 3, ".kv")) continue;
        char from[512];
        snprintf(from, sizeof from, "%s/%s", dir, de->d_name);
        ok = rename(from, to) == 0;
    }
    if (d) closedir(d);
    return ok;
}

int main(void)
{
    mkdir("fuzz/corpus/model_load", 0755);
    mkdir("fuzz/corpus/tokenizer_gguf", 0755);
    mkdir("fuzz/corpus/kv_cache", 0755);
    const char *model = "fuzz/corpus/model_load/micro.gguf";
    if (!synth_write_gguf(&fuzz_micro_shape, 7, model)) { fprintf(stderr, "model: %s\n", ds4_last_error()); return 1; }
    if (!fuzz_write_mini_vocab("fuzz/corpus/tokenizer_gguf/mini.gguf")) { fprintf(stderr, "vocab failed\n"); return 1; }

    ds4_model *m = ds4_model_open(model, NULL);
    if (!m) { fprintf(stderr, "open: %s\n", ds4_last_error()); return 1; }
    ds4_session_params p;
    ds4_session_params_default(&p);
    p.n_ctx = 32;
    p.n_threads = 1;
    p.backend = DS4_BACKEND_CPU;
    ds4_session *s = ds4_session_create(m, &p);
    int32_t toks[3] = {0, 5, 9};
    void *snap = NULL;
    size_t len = 0;
    if (!s || ds4_session_prefill(s, toks, 3, NULL) != DS4_OK || ds4_session_snapshot(s, &snap, &len) != DS4_OK) {
        fprintf(stderr, "session: %s\n", ds4_last_error());
        return 1;
    }
    size_t pl = 4 + 3 * 4 + len;
    unsigned char *payload = malloc(pl);
    uint32_t n = 3;
    memcpy(payload, &n, 4); /* little-endian hosts only; the layout is LE */
    memcpy(payload + 4, toks, 12);
    memcpy(payload + 16, snap, len);
    char dir[] = "/tmp/ds4-seeds-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    kv_disk_options o = {.dir = dir, .quant_bits = 2, .ctx_size = 32};
    kv_disk *d = kv_disk_open(&o);
    kv_disk_tool t = {(char *)"call_1", (char *)"\n\n<tool block>", 6, 14};
    const char *text = "<bos>hi<Assistant>";
    if (!d || kv_disk_save(d, KV_DISK_REASON_COLD, text, strlen(text), 3, payload, pl, &t, 1) != DS4_OK) {
        fprintf(stderr, "save: %s\n", ds4_last_error());
        return 1;
    }
    kv_disk_close(d);
    if (!copy_only_kv(dir, "fuzz/corpus/kv_cache/micro-3tok.kv")) return 1;
    rmdir(dir);
    free(payload);
    free(snap);
    ds4_session_free(s);
    ds4_model_close(m);
    printf("seeds written\n");
    return 0;
}

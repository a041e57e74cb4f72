/*
 * fuzz_model_load.c - libFuzzer target: a DeepSeek V4 model loaded from a
 * GGUF, up to its first forward pass.
 *
 * The input is the whole file. It is opened with ds4_model_open (metadata
 * bounds, tensor binding and validation, small-tensor widening); a model
 * that loads gets a session of a small context and prefills two tokens, so
 * the state allocation and one forward of whatever shapes the file claims
 * run too. Seeds: fuzz/corpus/model_load/ (fuzz/make_seeds.c).
 */
#include <stddef.h>
#include <stdint.h>

#include "fuzz/fuzz_support.h"
#include "include/ds4.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd;
    char buf[64];
    const char *path = fuzz_mem_path(data, size, &fd, buf);
    if (!path) return 0;
    ds4_model *m = ds4_model_open(path, NULL);
    if (m) {
        ds4_session_params p;
        ds4_session_params_default(&p);
        p.n_ctx = 16;
        p.n_threads = 1;
        p.backend = DS4_BACKEND_CPU;
        ds4_session *s = ds4_session_create(m, &p);
        if (s) {
            int32_t t[2] = {0, 1 % ds4_model_n_vocab(m)};
            ds4_session_prefill(s, t, 2, NULL);
            ds4_session_free(s);
        }
        ds4_model_close(m);
    }
    close(fd);
    return 0;
}

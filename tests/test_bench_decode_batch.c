/*
 * test_bench_decode_batch.c - ds4_session_decode_batch (the step that
 * ds4-bench --batch-sessions times) against one ds4_session_decode per
 * session, on a tiny synthetic model: sessions at different positions
 * with different histories end with bit-identical logits and positions;
 * bad arguments and a session at its context limit are refused, named,
 * before any session moves (tests/test_decode_batch.c covers the batched
 * step in depth on the golden fixtures).
 */
#include "bench/bench_model.h"
#include "include/ds4.h"
#include "tests/test.h"
#include "tools/convert_run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static ds4_session *mk(ds4_model *m, int64_t n_ctx)
{
    ds4_session_params p;
    ds4_session_params_default(&p);
    p.n_ctx = n_ctx;
    p.n_threads = 1;
    return ds4_session_create(m, &p);
}

static void test_batch_equals_single(void)
{
    char dir[] = "/tmp/ds4-test-batch-XXXXXX", path[96];
    REQUIRE(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tiny.gguf", dir);
    convert_options co = {.out = path, .dense = DS4_TYPE_Q8_0, .exp_gate_up = DS4_TYPE_IQ2_XXS,
                          .exp_down = DS4_TYPE_Q2_K, .seed = 9, .quiet = true};
    REQUIRE(convert_synthetic(test_data("bench/synthetic-tiny.json"), &co) == DS4_OK);
    ds4_model *m = ds4_model_open(path, NULL);
    REQUIRE(m);
    int V = ds4_model_n_vocab(m);
    int32_t toks[64];
    for (int i = 0; i < 64; i++) toks[i] = (int32_t)((i * 7919 + 13) % V);
    const int start[3] = {0, 5, 40}, len[3] = {10, 25, 3};
    ds4_session *b[3], *r[3];
    for (int k = 0; k < 3; k++) {
        b[k] = mk(m, 64);
        r[k] = mk(m, 64);
        REQUIRE(b[k] && r[k]);
        REQUIRE(ds4_session_prefill(b[k], toks + start[k], len[k], NULL) == DS4_OK);
        REQUIRE(ds4_session_prefill(r[k], toks + start[k], len[k], NULL) == DS4_OK);
    }
    int mismatched = 0;
    for (int step = 0; step < 4; step++) {
        int32_t next[3];
        for (int k = 0; k < 3; k++) next[k] = bench_model_argmax_excluding(ds4_session_logits(b[k]), V, 1);
        REQUIRE(ds4_session_decode_batch(b, next, 3) == DS4_OK);
        for (int k = 0; k < 3; k++) {
            REQUIRE(ds4_session_decode(r[k], next[k]) == DS4_OK);
            mismatched += ds4_session_n_past(b[k]) != len[k] + step + 1 ||
                          memcmp(ds4_session_logits(b[k]), ds4_session_logits(r[k]), (size_t)V * sizeof(float)) != 0;
        }
    }
    EXPECT_MSG(mismatched == 0, "%d (step, session) pairs differ from single decodes", mismatched);

    /* argument errors: nothing moves */
    int32_t t3[3] = {1, 2, 3};
    ds4_session *with_null[3] = {b[0], NULL, b[2]};
    int64_t p0 = ds4_session_n_past(b[0]);
    EXPECT(ds4_session_decode_batch(b, t3, -1) == DS4_ERR_INVALID);
    EXPECT(ds4_session_decode_batch(with_null, t3, 3) == DS4_ERR_INVALID && strstr(ds4_last_error(), "session 1"));
    EXPECT(ds4_session_decode_batch(b, t3, 0) == DS4_OK);
    EXPECT(ds4_session_n_past(b[0]) == p0);
    /* session 1 at its context limit: named, and no session moved */
    ds4_session *full = mk(m, 4);
    REQUIRE(full && ds4_session_prefill(full, toks, 4, NULL) == DS4_OK);
    ds4_session *mixed[3] = {b[0], full, b[2]};
    int64_t p2 = ds4_session_n_past(b[2]);
    EXPECT(ds4_session_decode_batch(mixed, t3, 3) == DS4_ERR_INVALID && strstr(ds4_last_error(), "session 1 of 3") &&
           strstr(ds4_last_error(), "context full"));
    EXPECT(ds4_session_n_past(b[0]) == p0 && ds4_session_n_past(b[2]) == p2 && ds4_session_n_past(full) == 4);
    ds4_session_free(full);
    for (int k = 0; k < 3; k++) {
        ds4_session_free(b[k]);
        ds4_session_free(r[k]);
    }
    ds4_model_close(m);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    RUN(test_batch_equals_single);
    return test_finish();
}

/*
 * test_snapshot_validate.c - a session state read back from outside (the
 * disk cache) is validated before it is used (issue 13 item 5): a NaN or
 * +inf planted in the logits or the state is refused with a message, the
 * original restores fine, and ds4_session_snapshot_size_max bounds a real
 * snapshot at every length (the bound the disk cache puts on a file before
 * reading it).
 *
 * The model is the golden tiny-a fixture (tests/data/dsv4-tiny-a).
 */
#include "tests/model_fixture.h"
#include "tests/test.h"

#include "include/ds4.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define GGUF_A "build/tests/tiny-a-snapshot-validate.gguf"
#define TINY_A "tests/data/dsv4-tiny-a"
#define CTX 64

static ds4_model *model;

static ds4_session *mk(void)
{
    ds4_session_params p;
    ds4_session_params_default(&p);
    p.n_ctx = CTX;
    p.n_threads = 2;
    ds4_session *s = ds4_session_create(model, &p);
    if (!s) fprintf(stderr, "session: %s\n", ds4_last_error());
    return s;
}

static void test_planted_values_refused(void)
{
    REQUIRE(model);
    ds4_session *s = mk(), *c = mk();
    REQUIRE(s && c);
    int32_t toks[6] = {1, 5, 9, 2, 7, 3};
    REQUIRE(ds4_session_prefill(s, toks, 6, NULL) == DS4_OK);
    void *snap = NULL;
    size_t len = 0;
    REQUIRE(ds4_session_snapshot(s, &snap, &len) == DS4_OK);
    EXPECT(ds4_session_restore(c, snap, len) == DS4_OK); /* the original is fine */
    unsigned char *b = malloc(len);
    REQUIRE(b);
    const float bad[3] = {NAN, INFINITY, NAN};
    const size_t at[3] = {4 + 4 * 3, len - 4, len - 4}; /* a logit; the state's last value (twice) */
    for (int k = 0; k < 3; k++) {
        memcpy(b, snap, len);
        memcpy(b + at[k], &bad[k], 4);
        EXPECT_MSG(ds4_session_restore(c, b, len) == DS4_ERR_INVALID, "planted value %d was accepted", k);
        EXPECT_MSG(strstr(ds4_last_error(), "not finite") || strstr(ds4_last_error(), "NaN") ||
                       strstr(ds4_last_error(), "+inf"),
                   "message: %s", ds4_last_error());
    }
    /* -inf is a legitimate value (the compressor's empty gate) */
    memcpy(b, snap, len);
    float minf = -INFINITY;
    memcpy(b + len - 4, &minf, 4);
    EXPECT(ds4_session_restore(c, b, len) == DS4_OK);
    free(b);
    free(snap);
    ds4_session_free(s);
    ds4_session_free(c);
}

/* ds4_session_snapshot_size_max bounds the snapshot at every length up to
 * the context (a state just short of a compressor boundary is larger than
 * one on it, so the size at a full context is not the maximum), and it is
 * not a loose bound: within 2x of the largest seen. */
static void test_size_max_bounds_every_length(void)
{
    REQUIRE(model);
    ds4_session *s = mk();
    REQUIRE(s);
    size_t max = ds4_session_snapshot_size_max(s), seen = 0;
    for (int i = 0; i < CTX; i++) {
        int32_t t = (int32_t)((i * 7 + 3) % ds4_model_n_vocab(model));
        REQUIRE(ds4_session_prefill(s, &t, 1, NULL) == DS4_OK);
        size_t len = ds4_session_snapshot_size(s);
        EXPECT_MSG(len <= max, "at %d tokens the snapshot is %zu bytes, size_max says %zu", i + 1, len, max);
        if (len > seen) seen = len;
    }
    EXPECT_MSG(max < 2 * seen, "size_max %zu is loose: the largest snapshot was %zu", max, seen);
    ds4_session_free(s);
}

int main(void)
{
    mkdir("build", 0755);
    mkdir("build/tests", 0755);
    if (fixture_write_gguf(TINY_A, GGUF_A, 0)) model = ds4_model_open(GGUF_A, NULL);
    if (!model) fprintf(stderr, "model open: %s\n", ds4_last_error());
    RUN(test_planted_values_refused);
    RUN(test_size_max_bounds_every_length);
    ds4_model_close(model);
    return test_finish();
}

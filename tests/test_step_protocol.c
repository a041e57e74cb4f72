/*
 * test_step_protocol.c - what the model asks of a backend's decode-step
 * hooks (backend/ops.h step_begin / step_end / step_ahead), on the CPU
 * backend with the hooks of a recording stand-in (no GPU needed):
 *  - a T = 1 forward calls step_begin(n_pos, state) and, after the step,
 *    step_ahead(n_pos + 1, state); prefill chunks (T > 1) call neither;
 *    no step_ahead once the context is full;
 *  - hooks that decline (step_begin false, step_ahead false) change no
 *    bit of the logits against the plain CPU backend;
 *  - step_begin answering true (the step already issued, as the CUDA
 *    backend does when its walk ahead matched) makes the model issue no op
 *    of the step and not call step_end, and still advance the position;
 *  - step_ahead answering true makes the model walk the next step's ops
 *    once, at the next position, then call step_end.
 * The stand-in counts the matmul op to see whether ops were issued (during
 * a walk it counts them apart and runs none; its other ops do run on the
 * CPU, so the walked session is not compared after its walk).
 */
#include "include/ds4.h"
#include "model/dsv4_model.h"
#include "model/dsv4_state.h"
#include "tests/model_fixture.h"
#include "tests/test.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TINY_A "tests/data/dsv4-tiny-a"
#define GGUF_A "build/tests/tiny-a-f32-step.gguf"

enum { MAXCALL = 64 };
typedef struct {
    int n_begin, n_end, n_ahead;
    int64_t begin_pos[MAXCALL], ahead_pos[MAXCALL];
    const void *begin_key[MAXCALL], *ahead_key[MAXCALL];
    bool issue_next; /* step_begin answers true once */
    bool walk_next;  /* step_ahead answers true once */
    bool walking;    /* between an accepted step_ahead and its step_end */
    int matmuls, walk_matmuls;
} recorder;

static recorder rec;
static void (*cpu_matmul)(ds4_backend *, const ds4_weight *, const float *, int, float *);

static bool rec_begin(ds4_backend *be, int64_t pos0, const void *key)
{
    (void)be;
    if (rec.n_begin < MAXCALL) rec.begin_pos[rec.n_begin] = pos0, rec.begin_key[rec.n_begin] = key;
    rec.n_begin++;
    const bool issue = rec.issue_next;
    rec.issue_next = false;
    return issue;
}

static bool rec_end(ds4_backend *be)
{
    (void)be;
    rec.n_end++;
    rec.walking = false;
    return false;
}

static bool rec_ahead(ds4_backend *be, int64_t pos0, const void *key)
{
    (void)be;
    if (rec.n_ahead < MAXCALL) rec.ahead_pos[rec.n_ahead] = pos0, rec.ahead_key[rec.n_ahead] = key;
    rec.n_ahead++;
    const bool walk = rec.walk_next;
    rec.walk_next = false;
    rec.walking = walk;
    return walk;
}

/* The matmul op, counted; during a walk counted apart and not run. */
static void rec_matmul(ds4_backend *be, const ds4_weight *w, const float *x, int T, float *y)
{
    if (rec.walking) {
        rec.walk_matmuls++;
        return;
    }
    rec.matmuls++;
    cpu_matmul(be, w, x, T, y);
}

static dsv4_model *m;
static int32_t *tok;
static int64_t n_tok;

static int need(void)
{
    if (!m || n_tok < 200) {
        test_skip("tiny-a fixture model could not be built: %s", ds4_last_error());
        return 0;
    }
    return 1;
}

/* A CPU backend with the recorder's hooks (set in place: the CPU ops find
 * their own data behind the struct they are given). */
static ds4_backend *recording_backend(void)
{
    ds4_backend *be = ds4_backend_cpu_create(2);
    if (!be) return NULL;
    cpu_matmul = be->matmul;
    be->matmul = rec_matmul;
    be->step_begin = rec_begin;
    be->step_end = rec_end;
    be->step_ahead = rec_ahead;
    return be;
}

/* Hooks that decline: the calls the model makes, and the logits of the
 * plain backend bit for bit. */
static void test_declined_hooks_same_logits(void)
{
    if (!need()) return;
    enum { PRE = 150, DEC = 12, CTX = PRE + DEC };
    ds4_backend *cpu = ds4_backend_cpu_create(2), *be = recording_backend();
    REQUIRE(cpu && be);
    dsv4_state *a = NULL, *b = NULL;
    REQUIRE(dsv4_state_create(m, cpu, CTX, 64, NULL, &a) == DS4_OK);
    REQUIRE(dsv4_state_create(m, be, CTX, 64, NULL, &b) == DS4_OK);
    const int V = m->cfg.n_vocab;
    float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V);
    memset(&rec, 0, sizeof rec);
    for (int i = 0; i < PRE; i += 50) {
        REQUIRE(dsv4_forward(a, tok + i, 50, false, la) == DS4_OK);
        REQUIRE(dsv4_forward(b, tok + i, 50, false, lb) == DS4_OK);
    }
    EXPECT_MSG(rec.n_begin == 0 && rec.n_ahead == 0, "prefill chunks called the step hooks (%d, %d)", rec.n_begin,
               rec.n_ahead);
    int same = memcmp(la, lb, sizeof(float) * V) == 0;
    for (int i = 0; i < DEC; i++) {
        REQUIRE(dsv4_forward(a, tok + PRE + i, 1, false, la) == DS4_OK);
        REQUIRE(dsv4_forward(b, tok + PRE + i, 1, false, lb) == DS4_OK);
        same &= memcmp(la, lb, sizeof(float) * V) == 0;
    }
    EXPECT_MSG(same, "declining step hooks changed the logits");
    EXPECT(rec.n_begin == DEC && rec.n_end == DEC);
    /* the last step fills the context: no step after it to walk */
    EXPECT_MSG(rec.n_ahead == DEC - 1, "%d step_ahead calls for %d steps", rec.n_ahead, DEC);
    int order = 1;
    for (int i = 0; i < DEC && i < MAXCALL; i++) {
        order &= rec.begin_pos[i] == PRE + i && rec.begin_key[i] == (const void *)b;
        if (i < DEC - 1) order &= rec.ahead_pos[i] == PRE + i + 1 && rec.ahead_key[i] == (const void *)b;
    }
    EXPECT_MSG(order, "step_begin / step_ahead got other positions or keys than the steps'");
    free(la), free(lb);
    dsv4_state_free(a), dsv4_state_free(b);
    be->destroy(be);
    cpu->destroy(cpu);
}

/* step_ahead answering true: one walk of the next step's ops (as many
 * matmuls as a step issues), then step_end. step_begin answering true: the
 * model issues none of the step's ops and calls no step_end, and the
 * position moves on. */
static void test_issued_and_walked_steps(void)
{
    if (!need()) return;
    enum { PRE = 100, CTX = 200 };
    ds4_backend *cpu = ds4_backend_cpu_create(2), *be = recording_backend();
    REQUIRE(cpu && be);
    dsv4_state *a = NULL, *b = NULL;
    REQUIRE(dsv4_state_create(m, cpu, CTX, 64, NULL, &a) == DS4_OK);
    REQUIRE(dsv4_state_create(m, be, CTX, 64, NULL, &b) == DS4_OK);
    const int V = m->cfg.n_vocab;
    float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V);
    memset(&rec, 0, sizeof rec);
    for (int i = 0; i < PRE; i += 50) {
        REQUIRE(dsv4_forward(a, tok + i, 50, false, la) == DS4_OK);
        REQUIRE(dsv4_forward(b, tok + i, 50, false, lb) == DS4_OK);
    }

    /* a step with a walk of the next one asked */
    rec.walk_next = true;
    int mm0 = rec.matmuls;
    REQUIRE(dsv4_forward(a, tok + PRE, 1, false, la) == DS4_OK);
    REQUIRE(dsv4_forward(b, tok + PRE, 1, false, lb) == DS4_OK);
    const int per_step = rec.matmuls - mm0;
    EXPECT_MSG(per_step > 0, "a decode step issued no matmul");
    EXPECT_MSG(rec.walk_matmuls == per_step, "the walk saw %d matmuls, a step issues %d", rec.walk_matmuls, per_step);
    EXPECT_MSG(rec.n_end == 2, "step_end calls: %d (the step's and the walk's)", rec.n_end);
    EXPECT(rec.n_ahead == 1 && rec.ahead_pos[0] == PRE + 1);

    /* the next step as if issued already: no op, no step_end, position moves */
    rec.issue_next = true;
    mm0 = rec.matmuls;
    const int ends = rec.n_end;
    REQUIRE(dsv4_forward(b, tok + PRE + 1, 1, false, NULL) == DS4_OK);
    EXPECT_MSG(rec.matmuls == mm0, "an issued step's ops were issued again (%d matmuls)", rec.matmuls - mm0);
    EXPECT(rec.n_end == ends);
    EXPECT(b->n_pos == PRE + 2);
    EXPECT(rec.n_ahead == 2 && rec.ahead_pos[1] == PRE + 2);
    free(la), free(lb);
    dsv4_state_free(a), dsv4_state_free(b);
    be->destroy(be);
    cpu->destroy(cpu);
}

int main(void)
{
    mkdir("build", 0755);
    mkdir("build/tests", 0755);
    float *gold = NULL;
    int V = 0;
    if (fixture_write_gguf(TINY_A, GGUF_A, 0)) m = dsv4_model_load(GGUF_A);
    if (m && !fixture_sequence(TINY_A, 0, &tok, &n_tok, &gold, &V)) n_tok = 0;
    free(gold);
    RUN(test_declined_hooks_same_logits);
    RUN(test_issued_and_walked_steps);
    if (m) dsv4_model_free(m);
    free(tok);
    return test_finish();
}

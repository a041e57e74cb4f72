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
 *    once, at the next position, then call step_end;
 *  - a failed op (the status hook) fails the step that follows.
 * The stand-in counts the matmul op to see whether ops were issued (during
 * a walk it counts them apart and runs none; its other ops do run on the
 * CPU, so the walked session is not compared after its walk).
 */
#include "include/ds4.h"
#include "model/dsv4_model.h"
#include "model/dsv4_state.h"
#include "tests/model_fixture.h"
#include "tests/test.h"
#include "util/error.h"

#include <stdlib.h>
#include <string.h>

#define TINY_A "tests/data/dsv4-tiny-a"
#define GGUF_A "build/tests/tiny-a-f32-step.gguf"

enum { MAXCALL = 64 };
/* One hook call of a kind: its position and key noted (the first
 * MAXCALL), the answer asked for it given once. */
typedef struct {
    int n;
    int64_t pos[MAXCALL];
    const void *key[MAXCALL];
} calls;

typedef struct {
    calls begin, ahead;
    int n_end;
    bool issue_next; /* step_begin answers true once */
    bool walk_next;  /* step_ahead answers true once */
    bool walking;    /* between an accepted step_ahead and its step_end */
    int matmuls, walk_matmuls;
} recorder;

static recorder rec;
static void (*cpu_matmul)(ds4_backend *, const ds4_weight *, const float *, int, float *);

static bool note_call(calls *c, int64_t pos0, const void *key, bool *answer)
{
    if (c->n < MAXCALL) c->pos[c->n] = pos0, c->key[c->n] = key;
    c->n++;
    const bool a = *answer;
    *answer = false;
    return a;
}

static bool rec_begin(ds4_backend *be, int64_t pos0, const void *key)
{
    (void)be;
    return note_call(&rec.begin, pos0, key, &rec.issue_next);
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
    rec.walking = note_call(&rec.ahead, pos0, key, &rec.walk_next);
    return rec.walking;
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

/* A plain CPU backend's state (a) and a recording one's (b) of CTX
 * positions, both prefilled with the fixture's first PRE tokens in
 * 50-token chunks; la, lb their logits rows. On failure all is freed. */
typedef struct {
    ds4_backend *cpu, *be;
    dsv4_state *a, *b;
    float *la, *lb;
    int V;
} pair;

static void pair_close(pair *P)
{
    free(P->la), free(P->lb);
    if (P->a) dsv4_state_free(P->a);
    if (P->b) dsv4_state_free(P->b);
    if (P->be) P->be->destroy(P->be);
    if (P->cpu) P->cpu->destroy(P->cpu);
}

static bool pair_open(pair *P, int pre, int64_t ctx)
{
    memset(P, 0, sizeof *P);
    P->cpu = ds4_backend_cpu_create(2);
    P->be = recording_backend();
    if (!P->cpu || !P->be || dsv4_state_create(m, P->cpu, ctx, 64, NULL, &P->a) != DS4_OK ||
        dsv4_state_create(m, P->be, ctx, 64, NULL, &P->b) != DS4_OK) {
        pair_close(P);
        return false;
    }
    P->V = m->cfg.n_vocab;
    P->la = malloc(sizeof(float) * P->V), P->lb = malloc(sizeof(float) * P->V);
    memset(&rec, 0, sizeof rec);
    for (int i = 0; i < pre; i += 50)
        if (dsv4_forward(P->a, tok + i, 50, false, P->la) != DS4_OK ||
            dsv4_forward(P->b, tok + i, 50, false, P->lb) != DS4_OK) {
            pair_close(P);
            return false;
        }
    return true;
}

/* Hooks that decline: the calls the model makes, and the logits of the
 * plain backend bit for bit. */
static void test_declined_hooks_same_logits(void)
{
    if (!need()) return;
    enum { PRE = 150, DEC = 12, CTX = PRE + DEC };
    pair P;
    REQUIRE(pair_open(&P, PRE, CTX));
    dsv4_state *a = P.a, *b = P.b;
    float *la = P.la, *lb = P.lb;
    const int V = P.V;
    EXPECT_MSG(rec.begin.n == 0 && rec.ahead.n == 0, "prefill chunks called the step hooks (%d, %d)", rec.begin.n,
               rec.ahead.n);
    int same = memcmp(la, lb, sizeof(float) * V) == 0;
    for (int i = 0; i < DEC; i++) {
        REQUIRE(dsv4_forward(a, tok + PRE + i, 1, false, la) == DS4_OK);
        REQUIRE(dsv4_forward(b, tok + PRE + i, 1, false, lb) == DS4_OK);
        same &= memcmp(la, lb, sizeof(float) * V) == 0;
    }
    EXPECT_MSG(same, "declining step hooks changed the logits");
    EXPECT(rec.begin.n == DEC && rec.n_end == DEC);
    /* the last step fills the context: no step after it to walk */
    EXPECT_MSG(rec.ahead.n == DEC - 1, "%d step_ahead calls for %d steps", rec.ahead.n, DEC);
    int order = 1;
    for (int i = 0; i < DEC && i < MAXCALL; i++) {
        order &= rec.begin.pos[i] == PRE + i && rec.begin.key[i] == (const void *)b;
        if (i < DEC - 1) order &= rec.ahead.pos[i] == PRE + i + 1 && rec.ahead.key[i] == (const void *)b;
    }
    EXPECT_MSG(order, "step_begin / step_ahead got other positions or keys than the steps'");
    pair_close(&P);
}

/* step_ahead answering true: one walk of the next step's ops (as many
 * matmuls as a step issues), then step_end. step_begin answering true: the
 * model issues none of the step's ops and calls no step_end, and the
 * position moves on. */
static void test_issued_and_walked_steps(void)
{
    if (!need()) return;
    enum { PRE = 100, CTX = 200 };
    pair P;
    REQUIRE(pair_open(&P, PRE, CTX));
    dsv4_state *a = P.a, *b = P.b;
    float *la = P.la, *lb = P.lb;

    /* a step with a walk of the next one asked */
    rec.walk_next = true;
    int mm0 = rec.matmuls;
    REQUIRE(dsv4_forward(a, tok + PRE, 1, false, la) == DS4_OK);
    REQUIRE(dsv4_forward(b, tok + PRE, 1, false, lb) == DS4_OK);
    const int per_step = rec.matmuls - mm0;
    EXPECT_MSG(per_step > 0, "a decode step issued no matmul");
    EXPECT_MSG(rec.walk_matmuls == per_step, "the walk saw %d matmuls, a step issues %d", rec.walk_matmuls, per_step);
    EXPECT_MSG(rec.n_end == 2, "step_end calls: %d (the step's and the walk's)", rec.n_end);
    EXPECT(rec.ahead.n == 1 && rec.ahead.pos[0] == PRE + 1);

    /* the next step as if issued already: no op, no step_end, position moves */
    rec.issue_next = true;
    mm0 = rec.matmuls;
    const int ends = rec.n_end;
    REQUIRE(dsv4_forward(b, tok + PRE + 1, 1, false, NULL) == DS4_OK);
    EXPECT_MSG(rec.matmuls == mm0, "an issued step's ops were issued again (%d matmuls)", rec.matmuls - mm0);
    EXPECT(rec.n_end == ends);
    EXPECT(b->n_pos == PRE + 2);
    EXPECT(rec.ahead.n == 2 && rec.ahead.pos[1] == PRE + 2);
    pair_close(&P);
}

/* ops.h status: a backend whose op failed (a CUDA kernel that did not
 * launch) fails the forward step that follows with that failure, decode,
 * prefill chunk and batched step alike, and the position stays; until
 * then the steps run as before. */
static bool fail_armed;
static ds4_status stand_in_status(ds4_backend *be)
{
    (void)be;
    return fail_armed ? ds4_fail(DS4_ERR_BACKEND, "stand-in: a kernel did not launch") : DS4_OK;
}

static void test_failed_op_fails_the_step(void)
{
    if (!need()) return;
    enum { PRE = 50, CTX = 80 };
    pair P;
    REQUIRE(pair_open(&P, PRE, CTX));
    dsv4_state *b = P.b;
    P.be->status = stand_in_status;
    fail_armed = false;
    EXPECT(dsv4_forward(b, tok + PRE, 1, false, P.lb) == DS4_OK && b->n_pos == PRE + 1);
    fail_armed = true;
    ds4_status st = dsv4_forward(b, tok + PRE + 1, 1, false, P.lb);
    EXPECT_MSG(st == DS4_ERR_BACKEND && strstr(ds4_last_error(), "stand-in"), "decode step: status %d (%s)", (int)st,
               ds4_last_error());
    EXPECT_MSG(b->n_pos == PRE + 1, "a failed step moved the position to %lld", (long long)b->n_pos);
    st = dsv4_forward(b, tok + PRE + 1, 5, false, P.lb);
    EXPECT_MSG(st == DS4_ERR_BACKEND && b->n_pos == PRE + 1, "prefill chunk: status %d, position %lld", (int)st,
               (long long)b->n_pos);
    float *rows[1] = {P.lb};
    st = dsv4_forward_batch(&b, tok + PRE + 1, 1, rows);
    EXPECT_MSG(st == DS4_ERR_BACKEND && b->n_pos == PRE + 1, "batched step: status %d (%s), position %lld", (int)st,
               ds4_last_error(), (long long)b->n_pos);
    fail_armed = false;
    pair_close(&P);
}

int main(void)
{
    m = fixture_model_tokens(TINY_A, GGUF_A, &tok, &n_tok);
    RUN(test_declined_hooks_same_logits);
    RUN(test_issued_and_walked_steps);
    RUN(test_failed_op_fails_the_step);
    if (m) dsv4_model_free(m);
    free(tok);
    return test_finish();
}

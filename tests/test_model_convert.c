/*
 * test_model_convert.c - end to end through the programs, as the issue
 * checks it: `ds4-quantize --hf FIXTURE --type f32 --experts f32`, then
 * `ds4 -m MODEL --token-ids FILE --dump-logits OUT --numerics hf` under
 * every schedule (full prefill, chunks 1/7/64/128/300, decode from
 * 1/100/299), max |dlogit| <= 1e-3 against the golden logits at every
 * position, for both tiny-a sequences and for tiny-c; and the q8_0
 * conversion against the f32 one. Programs are found in $DS4_BIN_DIR.
 */
#include "tests/model_fixture.h"
#include "tests/test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *bin(void)
{
    const char *b = getenv("DS4_BIN_DIR");
    return b && *b ? b : ".";
}

static int sh(const char *cmd)
{
    int rc = system(cmd);
    if (rc != 0) fprintf(stderr, "command failed (%d): %s\n", rc, cmd);
    return rc == 0;
}

static int convert(const char *fixture, const char *out, const char *type, const char *experts)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s/ds4-quantize --hf %s --out %s --type %s --experts %s > build/tests/convert.log 2>&1",
             bin(), fixture, out, type, experts);
    return sh(cmd);
}

typedef struct {
    int32_t *tok;
    int64_t n;
    float *gold;
    int V;
    char ids[256];
} seq;

static int load(const char *dir, int i, seq *s, const char *tag)
{
    if (!fixture_sequence(dir, i, &s->tok, &s->n, &s->gold, &s->V)) return 0;
    snprintf(s->ids, sizeof s->ids, "build/tests/%s-ids%d.txt", tag, i);
    FILE *f = fopen(s->ids, "w");
    if (!f) return 0;
    for (int64_t k = 0; k < s->n; k++) fprintf(f, "%d%c", s->tok[k], k + 1 < s->n ? ' ' : '\n');
    return fclose(f) == 0;
}

/* Dump logits with the ds4 program; malloc'd [n, V] or NULL. */
static float *dump(const char *model, const seq *s, const char *extra)
{
    char cmd[1024];
    const char *out = "build/tests/dump.f32";
    snprintf(cmd, sizeof cmd, "%s/ds4 -m %s --token-ids %s --dump-logits %s --threads 2 %s", bin(), model, s->ids, out,
             extra);
    if (!sh(cmd)) return NULL;
    size_t len;
    float *l = test_read_file(out, &len);
    if (l && len != (size_t)s->n * s->V * 4) {
        fprintf(stderr, "dump: %zu bytes, expected %lld x %d floats\n", len, (long long)s->n, s->V);
        free(l);
        return NULL;
    }
    return l;
}

static seq a0, a1, c0;
static int have_a, have_c;

static void check(const char *model, const seq *s, const char *name, const char *schedule)
{
    char extra[128];
    snprintf(extra, sizeof extra, "--numerics hf %s", schedule);
    float *l = dump(model, s, extra);
    REQUIRE(l);
    double d = test_max_abs_diff(l, s->gold, (size_t)s->n * s->V);
    printf("    %s %s: max|dlogit| = %.3g\n", name, schedule, d);
    EXPECT_MSG(d <= 1e-3, "%s %s: max|dlogit| %.3g > 1e-3", name, schedule, d);
    free(l);
}

static void test_tiny_a_f32_every_schedule(void)
{
    REQUIRE(have_a);
    static const char *sched[] = {"--prefill-chunk 1024", "--prefill-chunk 1", "--prefill-chunk 7",
                                  "--prefill-chunk 64", "--prefill-chunk 128", "--prefill-chunk 300",
                                  "--decode-from 1", "--decode-from 100", "--decode-from 299"};
    for (size_t i = 0; i < sizeof sched / sizeof *sched; i++) {
        check("build/tests/conv-tiny-a-f32.gguf", &a0, "tiny-a seq0", sched[i]);
        check("build/tests/conv-tiny-a-f32.gguf", &a1, "tiny-a seq1", sched[i]);
    }
}

static void test_tiny_c_f32(void)
{
    REQUIRE(have_c);
    check("build/tests/conv-tiny-c-f32.gguf", &c0, "tiny-c", "--prefill-chunk 300");
    check("build/tests/conv-tiny-c-f32.gguf", &c0, "tiny-c", "--decode-from 17 --prefill-chunk 5");
}

/* random checkpoints of other shapes, bf16 source weights */
static void test_random_shapes(void)
{
    static const char *dirs[] = {"tests/data/dsv4-rand-b", "tests/data/dsv4-rand-c"};
    for (int i = 0; i < 2; i++) {
        seq s = {0};
        char tag[16], out[128];
        snprintf(tag, sizeof tag, "rand-%c", 'b' + i);
        snprintf(out, sizeof out, "build/tests/conv-%s.gguf", tag);
        REQUIRE(load(dirs[i], 0, &s, tag));
        REQUIRE(convert(dirs[i], out, "f32", "f32"));
        check(out, &s, tag, "--prefill-chunk 64");
        check(out, &s, tag, "--prefill-chunk 9 --decode-from 40");
        free(s.tok);
        free(s.gold);
    }
}

/* q8_0 dense + q8_0 experts against the f32 conversion (see
 * test_model_golden.c for why the bounds are on the typical position). */
static void test_tiny_a_q8_0_conversion(void)
{
    REQUIRE(have_a);
    REQUIRE(convert("tests/data/dsv4-tiny-a", "build/tests/conv-tiny-a-q8_0.gguf", "q8_0", "q8_0"));
    float *f = dump("build/tests/conv-tiny-a-f32.gguf", &a0, "--numerics hf");
    float *q = dump("build/tests/conv-tiny-a-q8_0.gguf", &a0, "--numerics hf");
    REQUIRE(f && q);
    int agree = 0, V = a0.V;
    double med_sum = 0, worst = 0;
    int under = 0;
    for (int64_t t = 0; t < a0.n; t++) {
        const float *x = f + (size_t)t * V, *y = q + (size_t)t * V;
        int ix = 0, iy = 0;
        for (int v = 1; v < V; v++) {
            if (x[v] > x[ix]) ix = v;
            if (y[v] > y[iy]) iy = v;
        }
        agree += ix == iy;
        double d = test_max_abs_diff(x, y, (size_t)V);
        worst = fmax(worst, d);
        under += d <= 0.3;
        med_sum += d;
    }
    double frac = (double)agree / (double)a0.n;
    printf("    q8_0 conversion vs f32: top-1 %.4f, mean max|dlogit| %.3g, worst %.3g, %d/%lld positions <= 0.3\n",
           frac, med_sum / (double)a0.n, worst, under, (long long)a0.n);
    EXPECT(frac >= 0.80);
    EXPECT(under * 2 >= a0.n); /* median <= 0.3 */
    free(f);
    free(q);
}

int main(void)
{
    mkdir("build", 0755);
    mkdir("build/tests", 0755);
    have_a = load("tests/data/dsv4-tiny-a", 0, &a0, "tiny-a") && load("tests/data/dsv4-tiny-a", 1, &a1, "tiny-a") &&
             convert("tests/data/dsv4-tiny-a", "build/tests/conv-tiny-a-f32.gguf", "f32", "f32");
    have_c = load("tests/data/dsv4-tiny-c", 0, &c0, "tiny-c") &&
             convert("tests/data/dsv4-tiny-c", "build/tests/conv-tiny-c-f32.gguf", "f32", "f32");
    RUN(test_tiny_a_f32_every_schedule);
    RUN(test_tiny_c_f32);
    RUN(test_random_shapes);
    RUN(test_tiny_a_q8_0_conversion);
    seq *all[] = {&a0, &a1, &c0};
    for (int i = 0; i < 3; i++) {
        free(all[i]->tok);
        free(all[i]->gold);
    }
    return test_finish();
}

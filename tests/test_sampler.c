/*
 * test_sampler.c - greedy and stochastic token selection with fixed logits
 * and seeds, plus the DSML greedy-structure rule.
 *
 * Distributions are checked statistically: with a fixed seed, N draws, the
 * count of each token must be within 5 standard deviations of N*p, where p
 * is computed here independently (double-precision softmax and the filter
 * definitions applied by hand). Greedy results are exact.
 */
#include "tests/test.h"

#include "include/ds4_dsml.h"
#include "include/ds4_sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define N_DRAWS 40000

static void counts_match(const char *what, const int *count, const double *p, int n, int draws)
{
    for (int i = 0; i < n; i++) {
        double mean = draws * p[i], sd = sqrt(draws * p[i] * (1 - p[i]));
        if (p[i] == 0) EXPECT_MSG(count[i] == 0, "%s: token %d drawn %d times, probability 0", what, i, count[i]);
        else EXPECT_MSG(fabs(count[i] - mean) <= 5 * sd + 1, "%s: token %d drawn %d times, expected %.1f +- %.1f",
                        what, i, count[i], mean, sd);
    }
}

static void draw(const char *what, const float *logits, int n, const ds4_sampler_params *prm, const double *want)
{
    ds4_sampler *s = ds4_sampler_new(prm, n);
    REQUIRE(s);
    int count[16] = {0};
    for (int k = 0; k < N_DRAWS; k++) {
        int32_t t = ds4_sampler_sample(s, logits, n, false);
        REQUIRE(t >= 0 && t < n);
        count[t]++;
    }
    counts_match(what, count, want, n, N_DRAWS);
    ds4_sampler_free(s);
}

static ds4_sampler_params plain(float temp, uint64_t seed)
{
    ds4_sampler_params p = {temp, 0, 1.0f, 0.0f, seed};
    return p;
}

/* The spec of ds4_argmax_excluding, one comparison at a time: the first
 * index of the largest value, NaN and -inf never chosen, `ex` skipped. */
static int32_t argmax_spec(const float *l, int n, int32_t ex)
{
    int32_t best = -1;
    for (int i = 0; i < n; i++) {
        if (i == ex || isnan(l[i]) || l[i] == -INFINITY) continue;
        if (best < 0 || l[i] > l[best]) best = i;
    }
    return best;
}

/* Vocabulary-sized logits (the lanes of the fast scan and its tail): the
 * maximum planted at the start, the end, in a tie with a later copy,
 * beside NaN and -inf, as -0 beside +0, or excluded; all unusable: -1. */
static void test_argmax_vocab(void)
{
    enum { V = 129280 + 7 };
    float *l = malloc(sizeof(float) * V);
    REQUIRE(l);
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < V; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        l[i] = (float)(x % 20001) / 1000.0f - 10.0f;
    }
    static const int at[] = {0, 5, 16, 4097, V - 1, V - 8};
    for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
        const float keep = l[at[k]];
        l[at[k]] = 50.0f;
        EXPECT_MSG(ds4_argmax(l, V) == at[k], "max at %d", at[k]);
        EXPECT_MSG(ds4_argmax_excluding(l, V, at[k]) == argmax_spec(l, V, at[k]), "max at %d excluded", at[k]);
        l[at[k]] = keep;
    }
    l[100] = 60.0f, l[90000] = 60.0f, l[3] = NAN, l[7] = -INFINITY;
    EXPECT(ds4_argmax(l, V) == 100);                    /* tie: the lower index */
    EXPECT(ds4_argmax_excluding(l, V, 100) == 90000);   /* its copy when excluded */
    EXPECT(ds4_argmax_excluding(l, V, 5) == argmax_spec(l, V, 5));
    EXPECT(ds4_argmax_excluding(l, V, -1) == argmax_spec(l, V, -1));
    EXPECT(ds4_argmax_excluding(l, V, V) == argmax_spec(l, V, V));
    for (int i = 0; i < V; i++) l[i] = i % 2 ? NAN : -INFINITY;
    EXPECT(ds4_argmax(l, V) == -1);
    l[V - 3] = -0.0f, l[V - 1] = 0.0f;
    EXPECT(ds4_argmax(l, V) == V - 3); /* -0 == +0: the first */
    EXPECT(ds4_argmax_excluding(l, V, V - 3) == V - 1);
    EXPECT(ds4_argmax(l, 0) == -1);
    free(l);
}

static void test_greedy_exact(void)
{
    const float l[] = {0.5f, 3.0f, -1.0f, 3.0f, NAN, 2.9f};
    EXPECT(ds4_argmax(l, 6) == 1); /* tie -> lower index, NaN skipped */
    ds4_sampler_params p = plain(0.0f, 7);
    ds4_sampler *s = ds4_sampler_new(&p, 6);
    REQUIRE(s);
    for (int i = 0; i < 100; i++) EXPECT(ds4_sampler_sample(s, l, 6, false) == 1);
    /* temperature > 0 but greedy forced (DSML structure) */
    p = plain(1.5f, 7);
    ds4_sampler_set_params(s, &p, true);
    for (int i = 0; i < 100; i++) EXPECT(ds4_sampler_sample(s, l, 6, true) == 1);
    const float bad[] = {NAN, -INFINITY};
    EXPECT(ds4_sampler_sample(s, bad, 2, false) == -1);
    EXPECT(ds4_sampler_sample(s, l, 7, false) == -1); /* larger than the sampler's vocabulary */
    ds4_sampler_free(s);
}

static void test_seed_reproducible(void)
{
    float l[64];
    for (int i = 0; i < 64; i++) l[i] = (float)sin(i * 1.7) * 3;
    ds4_sampler_params p = plain(1.0f, 42);
    ds4_sampler *a = ds4_sampler_new(&p, 64), *b = ds4_sampler_new(&p, 64);
    p.seed = 43;
    ds4_sampler *c = ds4_sampler_new(&p, 64);
    REQUIRE(a && b && c);
    int same = 0, diff = 0;
    for (int i = 0; i < 500; i++) {
        int32_t x = ds4_sampler_sample(a, l, 64, false), y = ds4_sampler_sample(b, l, 64, false);
        same += x == y;
        diff += x != ds4_sampler_sample(c, l, 64, false);
    }
    EXPECT(same == 500);
    EXPECT(diff > 100);
    /* reseeding restarts the sequence */
    p.seed = 42;
    ds4_sampler_set_params(c, &p, true);
    ds4_sampler_set_params(a, &p, true);
    for (int i = 0; i < 50; i++) EXPECT(ds4_sampler_sample(a, l, 64, false) == ds4_sampler_sample(c, l, 64, false));
    ds4_sampler_free(a);
    ds4_sampler_free(b);
    ds4_sampler_free(c);
    /* the generator itself: first outputs for seed 0 are fixed forever */
    ds4_rng r;
    ds4_rng_seed(&r, 0);
    uint64_t first = ds4_rng_next(&r);
    ds4_rng_seed(&r, 0);
    EXPECT(ds4_rng_next(&r) == first);
    for (int i = 0; i < 1000; i++) {
        double u = ds4_rng_uniform(&r);
        EXPECT(u >= 0 && u < 1);
    }
}

static const double P3[] = {0.5, 0.3, 0.2};

static void logits_of(const double *p, int n, float *l)
{
    for (int i = 0; i < n; i++) l[i] = (float)log(p[i]) + 4.0f; /* a shift changes nothing */
}

static void test_temperature_distribution(void)
{
    float l[3];
    logits_of(P3, 3, l);
    ds4_sampler_params p = plain(1.0f, 1);
    draw("T=1", l, 3, &p, P3);
    /* T=2: p_i ~ p_i^(1/2) */
    double w[3], sum = 0;
    for (int i = 0; i < 3; i++) sum += (w[i] = sqrt(P3[i]));
    for (int i = 0; i < 3; i++) w[i] /= sum;
    p = plain(2.0f, 2);
    draw("T=2", l, 3, &p, w);
    /* T=0.5: p_i ~ p_i^2 */
    sum = 0;
    for (int i = 0; i < 3; i++) sum += (w[i] = P3[i] * P3[i]);
    for (int i = 0; i < 3; i++) w[i] /= sum;
    p = plain(0.5f, 3);
    draw("T=0.5", l, 3, &p, w);
}

static void test_filters(void)
{
    float l[3];
    logits_of(P3, 3, l);
    ds4_sampler_params p = plain(1.0f, 5);
    p.top_k = 2;
    const double k2[] = {0.625, 0.375, 0};
    draw("top_k=2", l, 3, &p, k2);
    p = plain(1.0f, 6);
    p.top_p = 0.7f; /* 0.5 < 0.7 <= 0.8: keeps two */
    draw("top_p=0.7", l, 3, &p, k2);
    p.top_p = 0.5f; /* exactly the first */
    const double k1[] = {1, 0, 0};
    draw("top_p=0.5", l, 3, &p, k1);
    p = plain(1.0f, 8);
    p.min_p = 0.5f; /* keep p >= 0.25 */
    draw("min_p=0.5", l, 3, &p, k2);
    p.min_p = 0.3f; /* keep p >= 0.15: all */
    draw("min_p=0.3", l, 3, &p, P3);
    /* min_p relative to the top probability at the sampling temperature */
    p = plain(2.0f, 9);
    p.min_p = 0.7f; /* at T=2 rel = sqrt(p/0.5): 1, 0.775, 0.632 -> keeps two */
    double w[3] = {sqrt(0.5), sqrt(0.3), 0}, s = w[0] + w[1];
    w[0] /= s;
    w[1] /= s;
    draw("T=2,min_p=0.7", l, 3, &p, w);
    /* -inf is never drawn */
    float li[3] = {0.0f, -INFINITY, 0.0f};
    const double half[] = {0.5, 0, 0.5};
    p = plain(1.0f, 10);
    draw("-inf", li, 3, &p, half);
}

/* A full-size vocabulary with top_p: the sort path. The drawn token must
 * always be within the nucleus computed here in double. */
static void test_large_vocab_top_p(void)
{
    int n = 129280;
    float *l = malloc(n * sizeof *l);
    REQUIRE(l);
    unsigned x = 99;
    for (int i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        l[i] = (float)((x >> 8) % 10000) / 1000.0f;
    }
    double mx = 0, sum = 0;
    for (int i = 0; i < n; i++) mx = l[i] > mx ? l[i] : mx;
    for (int i = 0; i < n; i++) sum += exp(l[i] - mx);
    ds4_sampler_params p = plain(1.0f, 11);
    p.top_p = 0.1f;
    ds4_sampler *s = ds4_sampler_new(&p, n);
    REQUIRE(s);
    /* nucleus threshold (the smallest logit inside it), from a histogram
     * of the logits, which take 10001 distinct values */
    double cum = 0, thresh = 0;
    int hist[10001] = {0};
    for (int i = 0; i < n; i++) hist[(int)lroundf(l[i] * 1000)]++;
    for (int v = 10000; v >= 0 && cum < 0.1 * sum; v--) {
        cum += hist[v] * exp(v / 1000.0 - mx);
        thresh = v / 1000.0;
    }
    for (int k = 0; k < 40; k++) {
        int32_t t = ds4_sampler_sample(s, l, n, false);
        REQUIRE(t >= 0);
        EXPECT_MSG(l[t] >= thresh - 1e-6, "drew logit %f below the nucleus %f", l[t], thresh);
    }
    ds4_sampler_free(s);
    free(l);
}

static void test_top_logprobs(void)
{
    const float l[] = {1.0f, 3.0f, 2.0f, -INFINITY, 3.0f, NAN};
    int32_t ids[4];
    double lp[4];
    int m = ds4_top_logprobs(l, 6, 4, ids, lp);
    EXPECT(m == 4);
    EXPECT(ids[0] == 1 && ids[1] == 4 && ids[2] == 2 && ids[3] == 0);
    double lse = log(exp(1.0) + 2 * exp(3.0) + exp(2.0));
    EXPECT(fabs(lp[0] - (3.0 - lse)) < 1e-12 && fabs(lp[2] - (2.0 - lse)) < 1e-12 && fabs(lp[3] - (1.0 - lse)) < 1e-12);
    int32_t ids10[10];
    double lp10[10];
    EXPECT(ds4_top_logprobs(l, 6, 10, ids10, lp10) == 4); /* only 4 usable logits */
}

/* The DSML rule: structure greedy, payload sampled. Feed a tool call and
 * ask the parser at each point. */
static void test_dsml_structure_is_greedy(void)
{
    ds4_gen_parser *p = ds4_gen_parser_new(false, true, NULL, NULL);
    REQUIRE(p);
    EXPECT(!ds4_gen_parser_structural(p));
#define FEED(s) ds4_gen_parser_feed(p, s, strlen(s))
    FEED("Let me check.");
    EXPECT(!ds4_gen_parser_structural(p));
    FEED("\n\n<\xEF\xBD\x9C" "DS");
    EXPECT(ds4_gen_parser_structural(p)); /* writing the start marker */
    FEED("ML\xEF\xBD\x9Ctool_calls>\n<\xEF\xBD\x9C" "DSML\xEF\xBD\x9Cinvoke name=\"");
    EXPECT(ds4_gen_parser_structural(p));
    FEED("w\">\n<\xEF\xBD\x9C" "DSML\xEF\xBD\x9Cparameter name=\"text\" string=\"true\">");
    EXPECT(!ds4_gen_parser_structural(p)); /* string payload */
    FEED("hello world");
    EXPECT(!ds4_gen_parser_structural(p));
    FEED("</");
    EXPECT(ds4_gen_parser_structural(p)); /* closing tag begun */
    FEED("\xEF\xBD\x9C" "DSML\xEF\xBD\x9Cparameter>\n<\xEF\xBD\x9C" "DSML\xEF\xBD\x9Cparameter name=\"o\" string=\"false\">");
    EXPECT(ds4_gen_parser_structural(p)); /* JSON value: punctuation */
    FEED("{\"k\": \"in");
    EXPECT(!ds4_gen_parser_structural(p)); /* inside a JSON string */
    FEED("side\\\" still");
    EXPECT(!ds4_gen_parser_structural(p)); /* escaped quote keeps it open */
    FEED("\"");
    EXPECT(ds4_gen_parser_structural(p));
#undef FEED
    ds4_gen_parser_free(p);
}

int main(void)
{
    RUN(test_greedy_exact);
    RUN(test_argmax_vocab);
    RUN(test_seed_reproducible);
    RUN(test_temperature_distribution);
    RUN(test_filters);
    RUN(test_large_vocab_top_p);
    RUN(test_top_logprobs);
    RUN(test_dsml_structure_is_greedy);
    return test_finish();
}

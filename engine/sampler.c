/*
 * sampler.c - next-token selection (public API in include/ds4_sampler.h).
 *
 * Work per token is O(n) for the softmax plus a sort of the candidates
 * that survive top-k/min-p; only top-p with both other filters off sorts
 * the whole vocabulary. Probabilities are computed in double from
 * (logit - max) / T so that extreme logits neither overflow nor lose the
 * small tail. Only top-p needs the candidates sorted (descending
 * probability, ties by lower id); otherwise the draw walks them in the
 * order the filters left them, which is deterministic too: same logits +
 * same settings + same seed = same token.
 */
#include "include/ds4_sampler.h"

#include "util/error.h"

#include <math.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <stdlib.h>
#include <string.h>

typedef struct {
    double p;
    int32_t id;
} cand;

struct ds4_sampler {
    ds4_sampler_params prm;
    ds4_rng rng;
    int n_vocab;
    cand *c;
};

/* ---- RNG --------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void ds4_rng_seed(ds4_rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t ds4_rng_next(ds4_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double ds4_rng_uniform(ds4_rng *r) { return (double)(ds4_rng_next(r) >> 11) * 0x1.0p-53; }

/* ---- sampler ----------------------------------------------------------- */

void ds4_sampler_params_default(ds4_sampler_params *p)
{
    p->temperature = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.05f;
    p->seed = 0;
}

ds4_sampler *ds4_sampler_new(const ds4_sampler_params *p, int n_vocab)
{
    if (n_vocab <= 0) {
        ds4_fail(DS4_ERR_INVALID, "sampler: vocabulary size %d", n_vocab);
        return NULL;
    }
    ds4_sampler *s = calloc(1, sizeof *s);
    if (s) s->c = malloc((size_t)n_vocab * sizeof *s->c);
    if (!s || !s->c) {
        free(s);
        ds4_fail(DS4_ERR_NOMEM, "sampler: out of memory for %d candidates", n_vocab);
        return NULL;
    }
    s->n_vocab = n_vocab;
    ds4_sampler_set_params(s, p, true);
    return s;
}

void ds4_sampler_free(ds4_sampler *s)
{
    if (!s) return;
    free(s->c);
    free(s);
}

void ds4_sampler_set_params(ds4_sampler *s, const ds4_sampler_params *p, bool reseed)
{
    s->prm = *p;
    if (reseed) ds4_rng_seed(&s->rng, p->seed);
}

/* m[k] = max(m[k], x[i]) over i = a .. b - 1 in ARGMAX_LANES independent
 * lanes (one compare chain through 129K logits was ~0.5 ms a token on a
 * server core; lanes let many compares be in flight). NaN never wins a
 * comparison, so it is skipped. On x86-64 the lanes are SSE registers:
 * _mm_max_ps(x, m) is x > m ? x : m lane by lane (m when either is NaN or
 * both are zeros), the scalar form's exact rule, which the compiler does
 * not vectorize on its own (it may not assume finite values). */
enum { ARGMAX_LANES = 16 };
static void max_lanes(const float *x, int a, int b, float *m)
{
    int i = a;
#if defined(__SSE2__)
    __m128 v[ARGMAX_LANES / 4];
    for (int k = 0; k < ARGMAX_LANES / 4; k++) v[k] = _mm_loadu_ps(m + 4 * k);
    for (; i + ARGMAX_LANES <= b; i += ARGMAX_LANES)
        for (int k = 0; k < ARGMAX_LANES / 4; k++) v[k] = _mm_max_ps(_mm_loadu_ps(x + i + 4 * k), v[k]);
    for (int k = 0; k < ARGMAX_LANES / 4; k++) _mm_storeu_ps(m + 4 * k, v[k]);
#else
    for (; i + ARGMAX_LANES <= b; i += ARGMAX_LANES)
        for (int k = 0; k < ARGMAX_LANES; k++) m[k] = x[i + k] > m[k] ? x[i + k] : m[k];
#endif
    for (; i < b; i++) m[0] = x[i] > m[0] ? x[i] : m[0];
}

/* The first i in [a, b) with x[i] == v (v is a value of x, not NaN), else -1. */
static int first_equal(const float *x, int a, int b, float v)
{
    int i = a;
#if defined(__SSE2__)
    const __m128 vv = _mm_set1_ps(v);
    for (; i + 16 <= b; i += 16) {
        const __m128 e0 = _mm_cmpeq_ps(_mm_loadu_ps(x + i), vv), e1 = _mm_cmpeq_ps(_mm_loadu_ps(x + i + 4), vv);
        const __m128 e2 = _mm_cmpeq_ps(_mm_loadu_ps(x + i + 8), vv), e3 = _mm_cmpeq_ps(_mm_loadu_ps(x + i + 12), vv);
        if (_mm_movemask_ps(_mm_or_ps(_mm_or_ps(e0, e1), _mm_or_ps(e2, e3)))) break; /* in this 16: find it below */
    }
#endif
    for (; i < b; i++)
        if (x[i] == v) return i;
    return -1;
}

int32_t ds4_argmax_excluding(const float *logits, int n, int32_t excluded)
{
    /* the largest value, then its first index: the lowest index on ties
     * (-0 and +0 compare equal), NaN and -inf never chosen */
    float m[ARGMAX_LANES];
    for (int k = 0; k < ARGMAX_LANES; k++) m[k] = -INFINITY;
    if (excluded >= 0 && excluded < n) {
        max_lanes(logits, 0, excluded, m);
        max_lanes(logits, excluded + 1, n, m);
    } else {
        max_lanes(logits, 0, n, m);
    }
    float best = m[0];
    for (int k = 1; k < ARGMAX_LANES; k++) best = m[k] > best ? m[k] : best;
    if (best == -INFINITY) return -1;
    if (excluded >= 0 && excluded < n) {
        const int i = first_equal(logits, 0, excluded, best);
        return i >= 0 ? i : first_equal(logits, excluded + 1, n, best);
    }
    return first_equal(logits, 0, n, best);
}

int32_t ds4_argmax(const float *logits, int n) { return ds4_argmax_excluding(logits, n, -1); }

static int cand_desc(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Move the k largest to the front (any order), O(n) average. */
static void select_top(cand *c, int n, int k)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        cand pivot = c[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (cand_desc(&c[i], &pivot) < 0) i++;
            while (cand_desc(&c[j], &pivot) > 0) j--;
            if (i <= j) {
                cand t = c[i];
                c[i++] = c[j];
                c[j--] = t;
            }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

int32_t ds4_sampler_sample(ds4_sampler *s, const float *logits, int n, bool greedy)
{
    if (n > s->n_vocab || n <= 0) return -1;
    int32_t top = ds4_argmax(logits, n);
    const ds4_sampler_params *p = &s->prm;
    if (top < 0 || greedy || p->temperature <= 0) return top;

    /* probabilities at temperature T, relative to the top one (p_top = 1) */
    double inv_t = 1.0 / p->temperature, maxl = logits[top];
    double min_rel = p->min_p > 0 ? p->min_p : 0;
    int m = 0;
    for (int i = 0; i < n; i++) {
        float v = logits[i];
        if (isnan(v) || (isinf(v) && v < 0)) continue;
        double rel = exp(((double)v - maxl) * inv_t);
        if (rel <= 0) continue;
        s->c[m].p = rel;
        s->c[m].id = i;
        m++;
    }
    if (p->top_k > 0 && p->top_k < m) {
        select_top(s->c, m, p->top_k);
        m = p->top_k;
    }
    if (min_rel > 0) { /* top kept itself: rel 1 >= min_p <= 1 */
        int w = 0;
        for (int i = 0; i < m; i++)
            if (s->c[i].p >= min_rel) s->c[w++] = s->c[i];
        m = w;
    }
    if (p->top_p < 1.0f) qsort(s->c, (size_t)m, sizeof *s->c, cand_desc);
    double total = 0;
    for (int i = 0; i < m; i++) total += s->c[i].p;
    if (p->top_p < 1.0f) {
        double want = (double)p->top_p * total, cum = 0;
        int keep = 0;
        while (keep < m) {
            cum += s->c[keep++].p;
            if (cum >= want) break;
        }
        m = keep;
        total = cum;
    }
    double u = ds4_rng_uniform(&s->rng) * total, cum = 0;
    for (int i = 0; i < m; i++) {
        cum += s->c[i].p;
        if (u < cum) return s->c[i].id;
    }
    return s->c[m - 1].id; /* rounding at the very end of the range */
}

int ds4_top_logprobs(const float *logits, int n, int k, int32_t *ids, double *logprobs)
{
    int32_t top = ds4_argmax(logits, n);
    if (top < 0 || k <= 0) return 0;
    double maxl = logits[top], sum = 0;
    for (int i = 0; i < n; i++) {
        float v = logits[i];
        if (isnan(v) || (isinf(v) && v < 0)) continue;
        sum += exp((double)v - maxl);
    }
    double lse = maxl + log(sum);
    /* keep the k best by insertion into a small sorted list */
    int m = 0;
    for (int i = 0; i < n; i++) {
        float v = logits[i];
        if (isnan(v) || (isinf(v) && v < 0)) continue;
        if (m == k && v <= logits[ids[m - 1]]) continue;
        int j = m < k ? m++ : k - 1;
        while (j > 0 && logits[ids[j - 1]] < v) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = i;
    }
    for (int i = 0; i < m; i++) logprobs[i] = (double)logits[ids[i]] - lse;
    return m;
}

int ds4_sampler_probs(const ds4_sampler_params *p, const float *logits, int n, double *probs)
{
    int32_t top = ds4_argmax(logits, n);
    if (top < 0) return -1;
    memset(probs, 0, (size_t)n * sizeof *probs);
    if (p->temperature <= 0) {
        probs[top] = 1.0;
        return 1;
    }
    /* the filters of ds4_sampler_sample, in its order, over a copy */
    cand *c = malloc((size_t)n * sizeof *c);
    if (!c) return -1;
    double inv_t = 1.0 / p->temperature, maxl = logits[top];
    double min_rel = p->min_p > 0 ? p->min_p : 0;
    int m = 0;
    for (int i = 0; i < n; i++) {
        float v = logits[i];
        if (isnan(v) || (isinf(v) && v < 0)) continue;
        double rel = exp(((double)v - maxl) * inv_t);
        if (rel <= 0) continue;
        c[m].p = rel;
        c[m].id = i;
        m++;
    }
    if (p->top_k > 0 && p->top_k < m) {
        select_top(c, m, p->top_k);
        m = p->top_k;
    }
    if (min_rel > 0) {
        int w = 0;
        for (int i = 0; i < m; i++)
            if (c[i].p >= min_rel) c[w++] = c[i];
        m = w;
    }
    if (p->top_p < 1.0f) qsort(c, (size_t)m, sizeof *c, cand_desc);
    double total = 0;
    for (int i = 0; i < m; i++) total += c[i].p;
    if (p->top_p < 1.0f) {
        double want = (double)p->top_p * total, cum = 0;
        int keep = 0;
        while (keep < m) {
            cum += c[keep++].p;
            if (cum >= want) break;
        }
        m = keep;
        total = cum;
    }
    for (int i = 0; i < m; i++) probs[c[i].id] = c[i].p / total;
    free(c);
    return m;
}

int32_t ds4_spec_accept(const double *p, const double *q, int n, int32_t d, ds4_rng *rng, bool *accepted)
{
    /* accept d ~ q with probability min(1, p(d) / q(d)) ... */
    double u = ds4_rng_uniform(rng);
    if (q[d] > 0 && u * q[d] < p[d]) {
        *accepted = true;
        return d;
    }
    *accepted = false;
    /* ... else draw from the residual max(0, p - q), normalised: the
     * output is then distributed as p whatever q was */
    double total = 0;
    for (int i = 0; i < n; i++) total += p[i] > q[i] ? p[i] - q[i] : 0;
    if (!(total > 0)) return ds4_spec_draw(p, n, rng);
    double v = ds4_rng_uniform(rng) * total, cum = 0;
    int32_t last = -1;
    for (int i = 0; i < n; i++) {
        double r = p[i] > q[i] ? p[i] - q[i] : 0;
        if (r <= 0) continue;
        cum += r;
        last = i;
        if (v < cum) return i;
    }
    return last;
}

int32_t ds4_spec_draw(const double *p, int n, ds4_rng *rng)
{
    double v = ds4_rng_uniform(rng), cum = 0;
    int32_t last = -1;
    for (int i = 0; i < n; i++) {
        if (p[i] <= 0) continue;
        cum += p[i];
        last = i;
        if (v < cum) return i;
    }
    return last;
}

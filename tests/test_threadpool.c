/*
 * test_threadpool.c - ds4_pool_run() runs every task index exactly once.
 *
 * Counts per index (atomic) over many job sizes (0, 1, fewer tasks than
 * threads, many small tasks), pools of 1, 2, 4 and 16 threads, a NULL pool,
 * back-to-back jobs (workers spinning) and jobs after a pause (workers
 * asleep), nested ds4_pool_run() from inside a task (runs inline, must not
 * deadlock), and that thread_index stays within the pool size.
 */
#include "util/threadpool.h"
#include "tests/test.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#define MAXN 20000

typedef struct {
    atomic_int count[MAXN];
    atomic_int bad_thread;
    int n_threads;
    ds4_threadpool *pool; /* for nested calls */
    int64_t inner;
} counts;

static void count_task(void *arg, int64_t i, int ti)
{
    counts *c = arg;
    atomic_fetch_add(&c->count[i], 1);
    if (ti < 0 || ti >= c->n_threads) atomic_store(&c->bad_thread, 1);
}

static int all_once(counts *c, int64_t n)
{
    for (int64_t i = 0; i < MAXN; i++)
        if (atomic_load(&c->count[i]) != (i < n ? 1 : 0)) return 0;
    return 1;
}

static void reset(counts *c)
{
    for (int i = 0; i < MAXN; i++) atomic_store(&c->count[i], 0);
    atomic_store(&c->bad_thread, 0);
}

static void check_pool(int n_threads)
{
    counts *c = calloc(1, sizeof(*c));
    REQUIRE(c);
    ds4_threadpool *p = n_threads ? ds4_pool_create(n_threads) : NULL;
    if (n_threads) REQUIRE(p);
    c->n_threads = n_threads ? n_threads : 1;
    EXPECT(ds4_pool_size(p) == c->n_threads);
    const int64_t sizes[] = {0, 1, 2, 3, 5, 16, 17, 100, 1000, MAXN};
    for (int rep = 0; rep < 3; rep++) {
        for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
            reset(c);
            ds4_pool_run(p, sizes[k], count_task, c);
            EXPECT_MSG(all_once(c, sizes[k]), "%d threads, n=%lld: not every index once", n_threads,
                       (long long)sizes[k]);
            EXPECT(!atomic_load(&c->bad_thread));
        }
        /* Let the workers fall asleep, then wake them with a job. */
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    /* Many back-to-back small jobs: the spinning path. */
    int ok = 1;
    for (int rep = 0; rep < 2000 && ok; rep++) {
        reset(c);
        ds4_pool_run(p, 7, count_task, c);
        for (int i = 0; i < 7; i++) ok &= atomic_load(&c->count[i]) == 1;
    }
    EXPECT_MSG(ok, "%d threads: back-to-back jobs lost or repeated a task", n_threads);
    ds4_pool_destroy(p);
    free(c);
}

static void test_null_pool(void) { check_pool(0); }
static void test_one_thread(void) { check_pool(1); }
static void test_two_threads(void) { check_pool(2); }
static void test_four_threads(void) { check_pool(4); }
static void test_sixteen_threads(void) { check_pool(16); }

static void test_default_size(void)
{
    ds4_threadpool *p = ds4_pool_create(0);
    REQUIRE(p);
    EXPECT(ds4_pool_size(p) >= 1);
    ds4_pool_destroy(p);
}

/* Each outer task i runs an inner job of `inner` tasks counting into
 * slot i * inner + j. */
static void inner_task(void *arg, int64_t j, int ti);

typedef struct {
    counts *c;
    int64_t base;
} inner_arg;

static void inner_task(void *arg, int64_t j, int ti)
{
    inner_arg *a = arg;
    count_task(a->c, a->base + j, ti);
}

static void outer_task(void *arg, int64_t i, int ti)
{
    counts *c = arg;
    (void)ti;
    inner_arg a = {c, i * c->inner};
    ds4_pool_run(c->pool, c->inner, inner_task, &a);
}

static void test_nested_runs_inline(void)
{
    counts *c = calloc(1, sizeof(*c));
    REQUIRE(c);
    c->n_threads = 4;
    c->pool = ds4_pool_create(4);
    REQUIRE(c->pool);
    const int64_t outer[] = {1, 3, 40}, inner[] = {1, 7, 250};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            reset(c);
            c->inner = inner[b];
            ds4_pool_run(c->pool, outer[a], outer_task, c);
            EXPECT_MSG(all_once(c, outer[a] * inner[b]), "nested %lld x %lld", (long long)outer[a],
                       (long long)inner[b]);
            EXPECT(!atomic_load(&c->bad_thread));
        }
    ds4_pool_destroy(c->pool);
    free(c);
}

int main(void)
{
    RUN(test_null_pool);
    RUN(test_one_thread);
    RUN(test_two_threads);
    RUN(test_four_threads);
    RUN(test_sixteen_threads);
    RUN(test_default_size);
    RUN(test_nested_runs_inline);
    return test_finish();
}

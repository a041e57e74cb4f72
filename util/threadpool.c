/*
 * threadpool.c - persistent worker threads for ds4_pool_run().
 *
 * Shape: n-1 worker threads plus the calling thread. A job is published by
 * bumping `generation`; workers notice it by spinning for a short while
 * (a decode step issues hundreds of small ops back to back, so a sleeping
 * worker would pay a futex wake-up on each) and otherwise sleep on a
 * condition variable. Tasks are claimed one index at a time with an atomic
 * counter, so uneven tasks balance themselves. The caller runs tasks too,
 * then waits until every worker has left the job (`busy` reaches zero)
 * before returning, so no worker can ever see a stale job.
 *
 * Sleep/wake uses the Dekker pattern with sequentially consistent atomics:
 * the sleeper announces itself (n_sleeping++) and then re-checks the
 * condition under the mutex; the waker changes the condition and then
 * looks at n_sleeping, taking the mutex to broadcast only when someone
 * sleeps. One of the two always sees the other's store.
 *
 * A ds4_pool_run() from inside a task (nested parallelism) runs inline on
 * that thread, and concurrent callers from different threads are
 * serialised, so neither can deadlock the pool.
 */
#include "util/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* About 20-50 us of spinning before a thread goes to sleep; every
 * YIELD_EVERY turns the spinner yields, so that with more threads than
 * free cores the thread being waited for gets to run. */
#define SPIN_ITERS (1 << 13)
#define YIELD_EVERY 64

static void spin_pause(int s)
{
    if (s % YIELD_EVERY == YIELD_EVERY - 1) sched_yield();
    else CPU_RELAX();
}

struct ds4_threadpool {
    int n_threads; /* including the caller */
    pthread_t *threads;

    pthread_mutex_t run_mu; /* one job at a time */
    pthread_mutex_t mu;     /* guards the sleeps below */
    pthread_cond_t cv_work;
    pthread_cond_t cv_done;

    atomic_uint_fast64_t generation;
    atomic_int n_sleeping;     /* workers asleep on cv_work */
    atomic_int caller_sleeping;
    atomic_int stop;

    /* The current job, written before `generation` is bumped. */
    ds4_task_fn fn;
    void *arg;
    int64_t n_tasks;
    atomic_int_fast64_t next; /* next unclaimed task index */
    atomic_int busy;          /* workers not yet done with the job */
};

struct worker_arg {
    ds4_threadpool *pool;
    int index;
};

/* 1 + the thread index while this thread runs pool tasks, else 0. */
static _Thread_local int tl_in_task;

static void run_tasks(ds4_threadpool *p, int thread_index)
{
    for (;;) {
        int64_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->n_tasks) break;
        p->fn(p->arg, i, thread_index);
    }
}

static void worker_done(ds4_threadpool *p)
{
    if (atomic_fetch_sub(&p->busy, 1) == 1 && atomic_load(&p->caller_sleeping)) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_signal(&p->cv_done);
        pthread_mutex_unlock(&p->mu);
    }
}

/* Wait until `generation` differs from `seen`; returns the new value. */
static uint64_t wait_for_job(ds4_threadpool *p, uint64_t seen)
{
    for (int s = 0; s < SPIN_ITERS; s++) {
        uint64_t g = atomic_load(&p->generation);
        if (g != seen) return g;
        spin_pause(s);
    }
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->n_sleeping, 1);
    uint64_t g;
    while ((g = atomic_load(&p->generation)) == seen)
        pthread_cond_wait(&p->cv_work, &p->mu);
    atomic_fetch_sub(&p->n_sleeping, 1);
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void *worker_main(void *v)
{
    struct worker_arg wa = *(struct worker_arg *)v;
    free(v);
    ds4_threadpool *p = wa.pool;
    uint64_t seen = 0;
    tl_in_task = 1 + wa.index; /* all this thread runs is inside the pool */
    for (;;) {
        seen = wait_for_job(p, seen);
        if (atomic_load(&p->stop)) break;
        run_tasks(p, wa.index);
        worker_done(p);
    }
    return NULL;
}

static int online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)(n > 1024 ? 1024 : n) : 1;
}

ds4_threadpool *ds4_pool_create(int n_threads)
{
    if (n_threads <= 0) n_threads = online_cpus();
    if (n_threads > 1024) n_threads = 1024;
    ds4_threadpool *p = calloc(1, sizeof(*p));
    if (!p) return NULL;
    p->n_threads = n_threads;
    p->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    if (!p->threads) {
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->run_mu, NULL);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_work, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    atomic_init(&p->generation, 0);
    atomic_init(&p->n_sleeping, 0);
    atomic_init(&p->caller_sleeping, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->next, 0);
    atomic_init(&p->busy, 0);
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *wa = malloc(sizeof(*wa));
        if (wa) {
            wa->pool = p;
            wa->index = i;
        }
        if (!wa || pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            p->n_threads = i; /* destroy joins only the started ones */
            ds4_pool_destroy(p);
            return NULL;
        }
    }
    return p;
}

static void publish(ds4_threadpool *p)
{
    atomic_fetch_add(&p->generation, 1);
    if (atomic_load(&p->n_sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv_work);
        pthread_mutex_unlock(&p->mu);
    }
}

void ds4_pool_destroy(ds4_threadpool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->run_mu);
    atomic_store(&p->stop, 1);
    publish(p);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_unlock(&p->run_mu);
    pthread_cond_destroy(&p->cv_done);
    pthread_cond_destroy(&p->cv_work);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->run_mu);
    free(p->threads);
    free(p);
}

int ds4_pool_size(const ds4_threadpool *p)
{
    return p ? p->n_threads : 1;
}

static void wait_workers(ds4_threadpool *p)
{
    for (int s = 0; s < SPIN_ITERS; s++) {
        if (atomic_load(&p->busy) == 0) return;
        spin_pause(s);
    }
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->caller_sleeping, 1);
    while (atomic_load(&p->busy) != 0) pthread_cond_wait(&p->cv_done, &p->mu);
    atomic_store(&p->caller_sleeping, 0);
    pthread_mutex_unlock(&p->mu);
}

void ds4_pool_run(ds4_threadpool *p, int64_t n, ds4_task_fn fn, void *arg)
{
    if (n <= 0) return;
    if (!p || p->n_threads == 1 || n == 1 || tl_in_task) {
        /* Inline; a nested call keeps its thread's index (per-thread
         * scratch buffers stay private). */
        int ti = tl_in_task ? tl_in_task - 1 : 0;
        for (int64_t i = 0; i < n; i++) fn(arg, i, ti);
        return;
    }
    pthread_mutex_lock(&p->run_mu);
    p->fn = fn;
    p->arg = arg;
    p->n_tasks = n;
    atomic_store(&p->next, 0);
    atomic_store(&p->busy, p->n_threads - 1);
    publish(p);
    tl_in_task = 1;
    run_tasks(p, 0);
    tl_in_task = 0;
    wait_workers(p);
    pthread_mutex_unlock(&p->run_mu);
}

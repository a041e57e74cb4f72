/*
 * threadpool.h - a persistent pool of worker threads for data-parallel ops.
 *
 * The CPU backend splits every heavy op (matmul rows, attention heads,
 * experts) into `n` independent tasks and runs them with ds4_pool_run(); the
 * workers stay alive between calls (spin briefly, then sleep) so that a
 * decode step of hundreds of small ops does not pay thread creation.
 */
#ifndef DS4_UTIL_THREADPOOL_H
#define DS4_UTIL_THREADPOOL_H

#include <stdint.h>

typedef struct ds4_threadpool ds4_threadpool;

/* task(arg, i, thread_index) is called once for every i in [0, n). */
typedef void (*ds4_task_fn)(void *arg, int64_t i, int thread_index);

/* n_threads <= 0: use the number of online CPUs. NULL on failure. */
ds4_threadpool *ds4_pool_create(int n_threads);
void ds4_pool_destroy(ds4_threadpool *pool);
int ds4_pool_size(const ds4_threadpool *pool);

/* Run n tasks on the pool (the caller's thread participates) and wait.
 * pool == NULL runs them inline on the calling thread. */
void ds4_pool_run(ds4_threadpool *pool, int64_t n, ds4_task_fn fn, void *arg);

#endif

/*
 * test_ops.c - the backend op contract (tests/ops_contract.h) on the CPU
 * backend, once with a thread pool and once inline (one thread), so that
 * splitting work over threads cannot change a result beyond the contract.
 */
#include "tests/ops_contract.h"

int main(void)
{
    int threads[2] = {3, 1};
    for (int i = 0; i < 2; i++) {
        ds4_backend *be = ds4_backend_cpu_create(threads[i]);
        if (!be) {
            fprintf(stderr, "cpu backend: %s\n", ds4_last_error());
            return 1;
        }
        printf("-- cpu backend, %d thread(s)\n", threads[i]);
        ops_contract_run(be);
        be->destroy(be);
    }
    return test_finish();
}

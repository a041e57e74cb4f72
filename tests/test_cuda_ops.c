/*
 * test_cuda_ops.c - the backend op contract (tests/ops_contract.h: every
 * op against an independent double-precision computation, with the
 * contract's tolerances) on the CUDA backend. Skips when built without
 * nvcc or when no CUDA device is present.
 */
#include "tests/ops_contract.h"

#if DS4_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#include "backend/cuda/cuda_backend.h"
#endif

static void skip_all(void)
{
#if DS4_HAVE_CUDA
    test_skip("no CUDA device (cudaGetDeviceCount found none)");
#else
    test_skip("built without CUDA (no nvcc)");
#endif
}

int main(void)
{
#if !DS4_HAVE_CUDA
    (void)ops_contract_run; /* the contract runs on the CPU in test_ops.c */
#endif
#if DS4_HAVE_CUDA
    if (ds4_cuda_device_count() > 0) {
        ds4_backend *be = ds4_backend_cuda_create(0);
        if (!be) {
            fprintf(stderr, "cuda backend: %s\n", ds4_last_error());
            return 1;
        }
        printf("-- cuda backend\n");
        ops_contract_run(be);
        be->destroy(be);
        return test_finish();
    }
#endif
    RUN(skip_all);
    return test_finish();
}

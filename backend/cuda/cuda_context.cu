/*
 * cuda_context.cu - the ds4_cuda context: device selection, stream, cuBLAS
 * handle, device memory, copies, timing, and the argument checks shared by
 * the weight kernels.
 *
 * One context owns one stream; every op is queued on it, so the work of a
 * context runs in order without host synchronisation (and can later be
 * captured into a CUDA graph). Failures come back as DS4_ERR_BACKEND with
 * the CUDA error string.
 */
#include "backend/cuda/cuda_internal.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" int ds4_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no device" error */
        return 0;
    }
    return n;
}

int ds4_cuda_pdl_on = 0;
thread_local unsigned long long ds4_launch_seq = 0;

/* Programmatic dependent launch needs sm_90; a process that opens an older
 * device once launches plainly from then on (the flag is process-wide). */
static void ds4_cuda_pdl_decide(const cudaDeviceProp *prop)
{
    static int seen_old = 0;
    if (prop->major < 9) seen_old = 1;
    const char *e = getenv("DS4_CUDA_PDL");
    ds4_cuda_pdl_on = !seen_old && !(e && e[0] == '0');
}

extern "C" ds4_status ds4_cuda_open(int device, ds4_cuda **out)
{
    *out = NULL;
    int n = ds4_cuda_device_count();
    if (n <= 0) return ds4_fail(DS4_ERR_BACKEND, "cuda: no CUDA device found");
    if (device < 0 || device >= n)
        return ds4_fail(DS4_ERR_INVALID, "cuda: device %d out of range (%d devices)", device, n);
    DS4_CUDA_CHECK(cudaSetDevice(device));
    cudaDeviceProp prop;
    DS4_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    ds4_cuda *cu = (ds4_cuda *)calloc(1, sizeof *cu);
    if (!cu) return ds4_fail(DS4_ERR_NOMEM, "cuda: context allocation");
    cu->device = device;
    cu->n_sm = prop.multiProcessorCount;
    cu->cc_major = prop.major;
    ds4_cuda_pdl_decide(&prop);
    cu->gemm_precision = DS4_CUDA_GEMM_BF16;
    const char *occ = getenv("DS4_CUDA_MV_OCC");
    cu->mv_occupancy = occ && atoi(occ) == 2 ? 2 : 3; /* 3 measured faster on the H200 */
    /* split-K below n_sm / 2 row blocks (default); DS4_CUDA_SPLITK=k: below
     * k * n_sm / 2 (k = 4: matrices up to ~2K rows, e.g. q_a, the shared expert) */
    const char *sk = getenv("DS4_CUDA_SPLITK");
    const int k = sk && atoi(sk) > 0 && atoi(sk) <= 16 ? atoi(sk) : 1;
    cu->mv_split_below = k * cu->n_sm / 2;
    snprintf(cu->desc, sizeof cu->desc, "%.160s (sm_%d%d, %d SMs, %.1f GiB)", prop.name,
             prop.major, prop.minor, prop.multiProcessorCount,
             (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    cudaError_t e = cudaStreamCreateWithFlags(&cu->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreate(&cu->ev_start);
    if (e == cudaSuccess) e = cudaEventCreate(&cu->ev_stop);
    if (e != cudaSuccess) {
        ds4_cuda_close(cu);
        return ds4_fail(DS4_ERR_BACKEND, "cuda: stream/event creation failed: %s",
                        cudaGetErrorString(e));
    }
    cublasStatus_t bs = cublasCreate(&cu->blas);
    if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasSetStream(cu->blas, cu->stream);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        ds4_cuda_close(cu);
        return ds4_fail(DS4_ERR_BACKEND, "cuda: cuBLAS initialisation failed (status %d)", (int)bs);
    }
    *out = cu;
    return DS4_OK;
}

extern "C" void ds4_cuda_close(ds4_cuda *cu)
{
    if (!cu) return;
    cudaSetDevice(cu->device);
    if (cu->stream) cudaStreamSynchronize(cu->stream);
    if (cu->blas) cublasDestroy(cu->blas);
    if (cu->scratch) cudaFree(cu->scratch);
    if (cu->split) cudaFree(cu->split);
    if (cu->act) cudaFree(cu->act);
    if (cu->q8o.q) cudaFree(cu->q8o.q);
    if (cu->q8o.d) cudaFree(cu->q8o.d);
    if (cu->q8a.q) cudaFree(cu->q8a.q);
    if (cu->q8a.d) cudaFree(cu->q8a.d);
    if (cu->q8s.q) cudaFree(cu->q8s.q);
    if (cu->q8s.d) cudaFree(cu->q8s.d);
    for (int i = 0; i < 2; i++) {
        if (cu->q8m[i].q) cudaFree(cu->q8m[i].q);
        if (cu->q8m[i].d) cudaFree(cu->q8m[i].d);
    }
    if (cu->q8ms.q) cudaFree(cu->q8ms.q);
    if (cu->q8ms.d) cudaFree(cu->q8ms.d);
    if (cu->ev_start) cudaEventDestroy(cu->ev_start);
    if (cu->ev_stop) cudaEventDestroy(cu->ev_stop);
    if (cu->stream) cudaStreamDestroy(cu->stream);
    free(cu);
}

extern "C" const char *ds4_cuda_device_desc(const ds4_cuda *cu) { return cu->desc; }

extern "C" void ds4_cuda_set_gemm_precision(ds4_cuda *cu, ds4_cuda_gemm_precision p)
{
    cu->gemm_precision = p;
}

extern "C" ds4_status ds4_cuda_malloc(ds4_cuda *cu, size_t bytes, void **d_out)
{
    *d_out = NULL;
    DS4_CUDA_CHECK(cudaSetDevice(cu->device));
    cudaError_t e = cudaMalloc(d_out, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *d_out = NULL;
        return ds4_fail(DS4_ERR_NOMEM, "cuda: cudaMalloc of %zu bytes failed: %s", bytes,
                        cudaGetErrorString(e));
    }
    return DS4_OK;
}

extern "C" void ds4_cuda_free(ds4_cuda *cu, void *d_ptr)
{
    (void)cu;
    if (d_ptr) cudaFree(d_ptr);
}

extern "C" ds4_status ds4_cuda_upload(ds4_cuda *cu, void *d_dst, const void *src, size_t bytes)
{
    ds4_launch_seq++; /* device memory written (ds4_launch_seq) */
    DS4_CUDA_CHECK(cudaMemcpyAsync(d_dst, src, bytes, cudaMemcpyHostToDevice, cu->stream));
    DS4_CUDA_CHECK(cudaStreamSynchronize(cu->stream));
    return DS4_OK;
}

extern "C" ds4_status ds4_cuda_download(ds4_cuda *cu, void *dst, const void *d_src, size_t bytes)
{
    DS4_CUDA_CHECK(cudaMemcpyAsync(dst, d_src, bytes, cudaMemcpyDeviceToHost, cu->stream));
    DS4_CUDA_CHECK(cudaStreamSynchronize(cu->stream));
    return DS4_OK;
}

extern "C" ds4_status ds4_cuda_copy_d2d(ds4_cuda *cu, void *d_dst, const void *d_src, size_t bytes)
{
    ds4_launch_seq++; /* device memory written (ds4_launch_seq) */
    DS4_CUDA_CHECK(cudaMemcpyAsync(d_dst, d_src, bytes, cudaMemcpyDeviceToDevice, cu->stream));
    return DS4_OK;
}

extern "C" ds4_status ds4_cuda_sync(ds4_cuda *cu)
{
    DS4_CUDA_CHECK(cudaStreamSynchronize(cu->stream));
    DS4_CUDA_CHECK(cudaGetLastError());
    return DS4_OK;
}

extern "C" ds4_status ds4_cuda_timer_start(ds4_cuda *cu)
{
    DS4_CUDA_CHECK(cudaEventRecord(cu->ev_start, cu->stream));
    return DS4_OK;
}

extern "C" ds4_status ds4_cuda_timer_stop(ds4_cuda *cu, double *ms)
{
    float f = 0.0f;
    DS4_CUDA_CHECK(cudaEventRecord(cu->ev_stop, cu->stream));
    DS4_CUDA_CHECK(cudaEventSynchronize(cu->ev_stop));
    DS4_CUDA_CHECK(cudaEventElapsedTime(&f, cu->ev_start, cu->ev_stop));
    *ms = f;
    return DS4_OK;
}

extern "C" size_t ds4_cuda_row_bytes(ds4_type type, int64_t cols)
{
    int be = ds4_cuda_block_elems(type);
    if (be == 0 || cols <= 0 || cols % be != 0 || cols % 32 != 0) return 0;
    return (size_t)(cols / be) * (size_t)ds4_cuda_block_bytes(type);
}

ds4_status ds4_cuda_check_weights(const char *op, ds4_type type, const void *d_w,
                                  int64_t rows, int64_t cols)
{
    if (ds4_cuda_block_elems(type) == 0)
        return ds4_fail(DS4_ERR_UNSUPPORTED, "cuda %s: weight type %d not supported", op, (int)type);
    if (rows <= 0 || cols <= 0 || rows > ((int64_t)1 << 40) || cols > ((int64_t)1 << 30))
        return ds4_fail(DS4_ERR_INVALID, "cuda %s: bad shape %lld x %lld", op, (long long)rows,
                        (long long)cols);
    if (ds4_cuda_row_bytes(type, cols) == 0)
        return ds4_fail(DS4_ERR_INVALID, "cuda %s: cols %lld not a multiple of the block of type %d",
                        op, (long long)cols, (int)type);
    if ((uintptr_t)d_w % (uintptr_t)ds4_cuda_type_align(type) != 0)
        return ds4_fail(DS4_ERR_INVALID, "cuda %s: weights at %p not %d-byte aligned", op, d_w,
                        ds4_cuda_type_align(type));
    return DS4_OK;
}

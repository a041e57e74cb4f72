/*
 * cuda_weight_runs.cu - rearranging IQ2_XXS weights into runs of 8 blocks
 * and Q2_K weights into runs of 4 (cuda_weight_runs.cuh) where they are
 * copied to the GPU, and the same on the host (for tests
 * and for callers that stage the bytes themselves).
 *
 * In place on the device: a tensor takes a small fraction of the time of
 * its copy from the host, and needs no second buffer (the routed experts
 * are most of the model's bytes).
 */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_weight_runs.cuh"

enum { WR_RUNS = 8 }; /* runs a block of threads holds at once */

/* The run bytes of a type in runs and the source of a run's byte i. */
template <int T> struct wr_of;
template <> struct wr_of<DS4_TYPE_IQ2_XXS> {
    enum { BYTES = DS4_IQ2_RUN_BYTES };
    static __host__ __device__ int src(int i) { return ds4_iq2_run_src(i); }
};
template <> struct wr_of<DS4_TYPE_Q2_K> {
    enum { BYTES = DS4_Q2K_RUN_BYTES };
    static __host__ __device__ int src(int i) { return ds4_q2k_run_src(i); }
};

/* Each block takes WR_RUNS runs at a time: their words into shared memory,
 * then each output word made of its 4 source bytes. */
template <int T>
__global__ void ds4_weight_runs_kernel(uint32_t *w, int64_t n_runs)
{
    enum { WORDS = wr_of<T>::BYTES / 4 };
    __shared__ uint32_t s[WR_RUNS * WORDS];
    const uint8_t *sb = (const uint8_t *)s;
    for (int64_t r0 = (int64_t)blockIdx.x * WR_RUNS; r0 < n_runs; r0 += (int64_t)gridDim.x * WR_RUNS) {
        const int nr = (int)min((int64_t)WR_RUNS, n_runs - r0);
        uint32_t *g = w + r0 * WORDS;
        __syncthreads(); /* the previous round's reads of s are done */
        for (int i = threadIdx.x; i < nr * WORDS; i += blockDim.x) s[i] = g[i];
        __syncthreads();
        for (int i = threadIdx.x; i < nr * WORDS; i += blockDim.x) {
            const int run = i / WORDS, b0 = 4 * (i - run * WORDS);
            const uint8_t *src = sb + run * wr_of<T>::BYTES;
            uint32_t v = 0;
#pragma unroll
            for (int k = 0; k < 4; k++) v |= (uint32_t)src[wr_of<T>::src(b0 + k)] << (8 * k);
            g[i] = v;
        }
    }
}

extern "C" int ds4_cuda_in_runs(ds4_type type, int64_t cols)
{
    return (type == DS4_TYPE_IQ2_XXS && ds4_iq2_runs(cols)) || (type == DS4_TYPE_Q2_K && ds4_q2k_runs(cols));
}

extern "C" ds4_status ds4_cuda_runs_on(void *stream, void *d_w, size_t bytes, ds4_type type, int64_t cols)
{
    if (!ds4_cuda_in_runs(type, cols) || bytes == 0) return DS4_OK;
    const size_t rb = type == DS4_TYPE_IQ2_XXS ? (size_t)DS4_IQ2_RUN_BYTES : (size_t)DS4_Q2K_RUN_BYTES;
    if (bytes % rb != 0 || ((uintptr_t)d_w & 3u) != 0)
        return ds4_fail(DS4_ERR_INVALID, "cuda: weight runs: %zu bytes at %p are not whole 4-byte aligned runs of %zu",
                        bytes, d_w, rb);
    const int64_t n_runs = (int64_t)(bytes / rb);
    int64_t nb = (n_runs + WR_RUNS - 1) / WR_RUNS;
    if (nb > 4096) nb = 4096;
    ds4_launch_seq++; /* device memory written (ds4_launch_seq) */
    if (type == DS4_TYPE_IQ2_XXS)
        ds4_weight_runs_kernel<DS4_TYPE_IQ2_XXS><<<(unsigned)nb, 256, 0, (cudaStream_t)stream>>>((uint32_t *)d_w, n_runs);
    else
        ds4_weight_runs_kernel<DS4_TYPE_Q2_K><<<(unsigned)nb, 256, 0, (cudaStream_t)stream>>>((uint32_t *)d_w, n_runs);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return ds4_fail(DS4_ERR_BACKEND, "cuda: weight runs: %s", cudaGetErrorString(e));
    return DS4_OK;
}

extern "C" ds4_status ds4_cuda_upload_weight(ds4_cuda *cu, void *d_dst, const void *src, size_t bytes, ds4_type type,
                                             int64_t cols)
{
    ds4_status st = ds4_cuda_upload(cu, d_dst, src, bytes);
    if (st == DS4_OK) st = ds4_cuda_runs_on(cu->stream, d_dst, bytes, type, cols);
    if (st == DS4_OK) st = ds4_cuda_sync(cu);
    return st;
}

template <int T> static void runs_host(uint8_t *dst, const uint8_t *src, size_t bytes)
{
    const size_t rb = wr_of<T>::BYTES;
    for (size_t r = 0; r + rb <= bytes; r += rb)
        for (size_t i = 0; i < rb; i++) dst[r + i] = src[r + (size_t)wr_of<T>::src((int)i)];
}

extern "C" void ds4_runs_host(ds4_type type, uint8_t *dst, const uint8_t *src, size_t bytes)
{
    if (type == DS4_TYPE_IQ2_XXS) runs_host<DS4_TYPE_IQ2_XXS>(dst, src, bytes);
    else if (type == DS4_TYPE_Q2_K) runs_host<DS4_TYPE_Q2_K>(dst, src, bytes);
    else memcpy(dst, src, bytes);
}

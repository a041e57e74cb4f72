/*
 * cuda_iq2_runs.cu - rearranging IQ2_XXS weights into runs of 8 blocks
 * (cuda_iq2_runs.cuh) where they are copied to the GPU, and the same on the
 * host (for tests and for callers that stage the bytes themselves).
 *
 * In place on the device: a tensor takes ~1/300 of the time of its copy
 * from the host, and needs no second buffer (the routed experts are most
 * of the model's bytes).
 */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_iq2_runs.cuh"

enum {
    IR_RUNS = 8,                              /* runs a block of threads holds at once */
    IR_WORDS = DS4_IQ2_RUN_BYTES / 4,         /* 132 */
};

/* Each block takes IR_RUNS runs at a time: their words into shared memory,
 * then each output word made of its 4 source bytes. */
__global__ void ds4_iq2_runs_kernel(uint32_t *w, int64_t n_runs)
{
    __shared__ uint32_t s[IR_RUNS * IR_WORDS];
    const uint8_t *sb = (const uint8_t *)s;
    for (int64_t r0 = (int64_t)blockIdx.x * IR_RUNS; r0 < n_runs; r0 += (int64_t)gridDim.x * IR_RUNS) {
        const int nr = (int)min((int64_t)IR_RUNS, n_runs - r0);
        uint32_t *g = w + r0 * IR_WORDS;
        __syncthreads(); /* the previous round's reads of s are done */
        for (int i = threadIdx.x; i < nr * IR_WORDS; i += blockDim.x) s[i] = g[i];
        __syncthreads();
        for (int i = threadIdx.x; i < nr * IR_WORDS; i += blockDim.x) {
            const int run = i / IR_WORDS, b0 = 4 * (i - run * IR_WORDS);
            const uint8_t *src = sb + run * DS4_IQ2_RUN_BYTES;
            uint32_t v = 0;
#pragma unroll
            for (int k = 0; k < 4; k++) v |= (uint32_t)src[ds4_iq2_run_src(b0 + k)] << (8 * k);
            g[i] = v;
        }
    }
}

extern "C" int ds4_cuda_iq2_in_runs(ds4_type type, int64_t cols)
{
    return type == DS4_TYPE_IQ2_XXS && ds4_iq2_runs(cols);
}

extern "C" ds4_status ds4_cuda_iq2_runs_on(void *stream, void *d_w, size_t bytes, ds4_type type, int64_t cols)
{
    if (!ds4_cuda_iq2_in_runs(type, cols) || bytes == 0) return DS4_OK;
    if (bytes % DS4_IQ2_RUN_BYTES != 0 || ((uintptr_t)d_w & 3u) != 0)
        return ds4_fail(DS4_ERR_INVALID, "cuda: IQ2_XXS runs: %zu bytes at %p are not whole 4-byte aligned runs",
                        bytes, d_w);
    const int64_t n_runs = (int64_t)(bytes / DS4_IQ2_RUN_BYTES);
    int64_t nb = (n_runs + IR_RUNS - 1) / IR_RUNS;
    if (nb > 4096) nb = 4096;
    ds4_launch_seq++; /* device memory written (ds4_launch_seq) */
    ds4_iq2_runs_kernel<<<(unsigned)nb, 256, 0, (cudaStream_t)stream>>>((uint32_t *)d_w, n_runs);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return ds4_fail(DS4_ERR_BACKEND, "cuda: IQ2_XXS runs: %s", cudaGetErrorString(e));
    return DS4_OK;
}

extern "C" ds4_status ds4_cuda_upload_weight(ds4_cuda *cu, void *d_dst, const void *src, size_t bytes, ds4_type type,
                                             int64_t cols)
{
    ds4_status st = ds4_cuda_upload(cu, d_dst, src, bytes);
    if (st == DS4_OK) st = ds4_cuda_iq2_runs_on(cu->stream, d_dst, bytes, type, cols);
    if (st == DS4_OK) st = ds4_cuda_sync(cu);
    return st;
}

extern "C" void ds4_iq2_runs_host(uint8_t *dst, const uint8_t *src, size_t bytes)
{
    for (size_t r = 0; r + DS4_IQ2_RUN_BYTES <= bytes; r += DS4_IQ2_RUN_BYTES)
        for (int i = 0; i < DS4_IQ2_RUN_BYTES; i++) dst[r + i] = src[r + ds4_iq2_run_src(i)];
}

/*
 * cuda_l2_prefetch.cu - bytes of device memory asked into L2 by the copy
 * engine (cp.async.bulk.prefetch.L2, 16 KB a request): the L2 probe's
 * "bulk" cases (cuda_l2_probe.cu) and the prefetch op beside a decode
 * step's attention (cuda_ops_side.cu).
 *
 * Why the copy engine: a request names 16 KB and holds no register, so a
 * few 32-thread blocks ask for tens of megabytes in a few microseconds and
 * leave the SMs to the kernels beside them; the lines arrive at DRAM's
 * pace after the kernel has ended (measured by the probe, thirty-fifth
 * session: 24-48 MB asked this way read back 1.45-1.52x faster).
 */
#include "backend/cuda/cuda_internal.cuh"

enum { L2PF_CHUNK = 16384 /* bytes a request */ };

/* LAST: with the evict_last priority (a policy made in the kernel) */
template <bool LAST> __global__ void __launch_bounds__(32) ds4_l2_prefetch_kernel(const uint8_t *p, size_t bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint64_t pol = 0;
    if (LAST) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
    const size_t chunks = (bytes + L2PF_CHUNK - 1) / L2PF_CHUNK;
    for (size_t c = (size_t)blockIdx.x * 32 + threadIdx.x; c < chunks; c += (size_t)gridDim.x * 32) {
        const size_t off = c * L2PF_CHUNK, left = bytes - off;
        const uint32_t n = left < L2PF_CHUNK ? (uint32_t)left : (uint32_t)L2PF_CHUNK;
        if (LAST)
            asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(p + off), "r"(n), "l"(pol)
                         : "memory");
        else
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(n) : "memory");
    }
#else
    (void)p, (void)bytes;
#endif
}

bool ds4_l2_prefetch_ok(const ds4_cuda *cu)
{
    /* only where this build has sm_90 code for it (a kernel compiled for an
     * older target would prefetch nothing) */
    cudaFuncAttributes fa;
    const bool ok = cu->cc_major >= 9 &&
                    cudaFuncGetAttributes(&fa, (const void *)ds4_l2_prefetch_kernel<false>) == cudaSuccess &&
                    fa.binaryVersion >= 90;
    (void)cudaGetLastError();
    return ok;
}

bool ds4_l2_prefetch(cudaStream_t stream, const void *p, size_t bytes, unsigned blocks, bool last)
{
    if (bytes == 0) return true;
    /* 16 bytes aligned, a multiple of 16 long (the instruction's terms) */
    const uintptr_t a = (uintptr_t)p, e = (a + bytes) & ~(uintptr_t)15, s = (a + 15) & ~(uintptr_t)15;
    if (e <= s) return true;
    if (last)
        ds4_l2_prefetch_kernel<true><<<blocks, 32, 0, stream>>>((const uint8_t *)s, (size_t)(e - s));
    else
        ds4_l2_prefetch_kernel<false><<<blocks, 32, 0, stream>>>((const uint8_t *)s, (size_t)(e - s));
    return cudaPeekAtLastError() == cudaSuccess;
}

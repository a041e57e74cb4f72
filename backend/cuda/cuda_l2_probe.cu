/*
 * cuda_l2_probe.cu - whether weights can wait in L2 (ds4-gpubench
 * --l2probe): the reads of one buffer of a weight matrix's size after
 * different ways of bringing it into L2, and after a layer's worth of
 * other weights streamed past it.
 *
 * Why: a full-size decode layer spends ~45 of its ~150 us in kernels that
 * read almost nothing (the hyper-connection sites, the attention, the
 * router's pick), while the Q8_0 products and the routed experts stream
 * their weights from DRAM after them. Staging the next weights in L2
 * meanwhile was tried once (sixteenth session: the copy engine's bulk
 * prefetch, plain priority) and lost 11-14%, the lines not found by their
 * readers. Whether L2 holds a 36 MB matrix for all SMs at all, whether
 * the copy engine's prefetch lands where the SMs read, and whether an
 * eviction priority keeps the lines through the streaming of other
 * weights are each a few microseconds to measure; each answer decides a
 * design.
 *
 * Every read is one launch over the buffer: all SMs, 16-byte loads that
 * skip L1 (as the decode kernels read weights), xor-folded into one word
 * a block so that nothing is dropped. "Flush" reads a buffer of four
 * times the L2's size first.
 */
#include "backend/cuda/cuda_internal.cuh"

#include <stdint.h>
#include <string.h>
#include <unistd.h>

enum { L2P_THREADS = 256, L2P_CHUNK = 16384 /* bytes a bulk prefetch */ };

/* One 16-byte load that skips L1; POL: 0 plain, 1 evict_first, 2
 * evict_last (the policy made by createpolicy) */
template <int POL> __device__ __forceinline__ uint4 l2p_ld(const uint4 *p, uint64_t pol)
{
    uint4 v = make_uint4(0, 0, 0, 0);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (POL == 0)
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p));
    else
        asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(p), "l"(pol));
#else
    (void)p, (void)pol;
#endif
    return v;
}

/* Read n16 16-byte words of p, L2P_ILP loads in flight a thread (one at a
 * time would cap the read at what the latency allows), xor-folded; a
 * warp stores its fold only if it equals a value the buffer's bytes never
 * give, so that the loads stay and no atomic adds to the time */
enum { L2P_ILP = 8 };
template <int POL> __global__ void __launch_bounds__(L2P_THREADS) l2p_read_kernel(const uint4 *p, size_t n16, uint32_t *out)
{
    uint64_t pol = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (POL == 1) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    if (POL == 2) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
#endif
    const size_t step = (size_t)gridDim.x * blockDim.x;
    uint32_t acc = 0;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (L2P_ILP - 1) * step < n16; i += L2P_ILP * step) {
        uint4 v[L2P_ILP];
#pragma unroll
        for (int k = 0; k < L2P_ILP; k++) v[k] = l2p_ld<POL>(p + i + k * step, pol);
#pragma unroll
        for (int k = 0; k < L2P_ILP; k++) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
    }
    for (; i < n16; i += step) {
        const uint4 v = l2p_ld<POL>(p + i, pol);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0 && acc == 0x2545f491u) *out = acc;
}

/* The copy engine's prefetch of bytes at p into L2, 16 KB a request;
 * LAST: with the evict_last priority */
template <bool LAST> __global__ void __launch_bounds__(32) l2p_bulk_kernel(const uint8_t *p, size_t bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint64_t pol = 0;
    if (LAST) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
    const size_t chunks = (bytes + L2P_CHUNK - 1) / L2P_CHUNK;
    for (size_t c = (size_t)blockIdx.x * 32 + threadIdx.x; c < chunks; c += (size_t)gridDim.x * 32) {
        const size_t off = c * L2P_CHUNK, left = bytes - off;
        const uint32_t n = left < L2P_CHUNK ? (uint32_t)left : (uint32_t)L2P_CHUNK;
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

/* One thread waits ns nanoseconds: queued before the timed read, so that
 * the host has submitted the read when the start event is stamped (from
 * an idle stream the stamp would come a launch's gap before the read) */
__global__ void l2p_spin_kernel(unsigned long long ns)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
#else
    (void)ns;
#endif
}

struct l2p_ctx {
    ds4_cuda *cu;
    const uint8_t *w, *other, *flush;
    size_t w_bytes, other_bytes, flush_bytes;
    uint32_t *out;
    unsigned blocks;
};

template <int POL> static void l2p_read(const l2p_ctx &c, const uint8_t *p, size_t bytes)
{
    l2p_read_kernel<POL><<<c.blocks, L2P_THREADS, 0, c.cu->stream>>>((const uint4 *)p, bytes / 16, c.out);
}

/* The microseconds of reading the weight buffer plainly, after prep */
template <typename F> static ds4_status l2p_time(const l2p_ctx &c, F prep, double *us)
{
    DS4_CUDA_CHECK(cudaStreamSynchronize(c.cu->stream));
    (void)cudaCtxResetPersistingL2Cache(); /* earlier cases' evict_last lines back to normal */
    (void)cudaGetLastError();              /* where it is not supported: nothing to reset */
    l2p_read<0>(c, c.flush, c.flush_bytes); /* L2 holds none of w now */
    prep();
    DS4_CUDA_CHECK(cudaStreamSynchronize(c.cu->stream));
    usleep(200); /* a bulk prefetch's kernel ends before its lines arrive (12 us for 48 MB at 4 TB/s) */
    l2p_spin_kernel<<<1, 1, 0, c.cu->stream>>>(20000);
    DS4_CUDA_CHECK(cudaEventRecord(c.cu->ev_start, c.cu->stream));
    l2p_read<0>(c, c.w, c.w_bytes);
    DS4_CUDA_CHECK(cudaEventRecord(c.cu->ev_stop, c.cu->stream));
    DS4_CUDA_CHECK(cudaEventSynchronize(c.cu->ev_stop));
    float ms = 0.f;
    DS4_CUDA_CHECK(cudaEventElapsedTime(&ms, c.cu->ev_start, c.cu->ev_stop));
    *us = (double)ms * 1e3;
    DS4_CUDA_CHECK(cudaGetLastError());
    return DS4_OK;
}

static ds4_status l2p_cases(const l2p_ctx &c, bool bulk, ds4_cuda_l2probe_times *r)
{
    const unsigned pf_blocks = 32;
    ds4_status st;
#define L2P_CASE(field, body)                                   \
    if ((st = l2p_time(c, [&] { body; }, &r->field)) != DS4_OK) \
        return st
    /* the plain-priority cases first, so that evict_last lines a reset
     * might leave cannot flatter them; cold_after_last tells whether any
     * survive the reset and the flush */
    L2P_CASE(cold_us, (void)0);
    L2P_CASE(warm_us, l2p_read<0>(c, c.w, c.w_bytes));
    L2P_CASE(warm_then_other_us, l2p_read<0>(c, c.w, c.w_bytes); l2p_read<0>(c, c.other, c.other_bytes));
    if (bulk) L2P_CASE(bulk_us, (l2p_bulk_kernel<false><<<pf_blocks, 32, 0, c.cu->stream>>>(c.w, c.w_bytes)));
    L2P_CASE(warm_last_us, l2p_read<2>(c, c.w, c.w_bytes));
    L2P_CASE(warm_last_then_other_first_us, l2p_read<2>(c, c.w, c.w_bytes); l2p_read<1>(c, c.other, c.other_bytes));
    if (bulk) {
        L2P_CASE(bulk_last_us, (l2p_bulk_kernel<true><<<pf_blocks, 32, 0, c.cu->stream>>>(c.w, c.w_bytes)));
        L2P_CASE(bulk_last_then_other_first_us,
                 (l2p_bulk_kernel<true><<<pf_blocks, 32, 0, c.cu->stream>>>(c.w, c.w_bytes));
                 l2p_read<1>(c, c.other, c.other_bytes));
    }
    L2P_CASE(cold_after_last_us, (void)0);
#undef L2P_CASE
    /* evict_last lines left behind would favour the next case's buffer */
    DS4_CUDA_CHECK(cudaStreamSynchronize(c.cu->stream));
    (void)cudaCtxResetPersistingL2Cache();
    (void)cudaGetLastError();
    l2p_read<0>(c, c.flush, c.flush_bytes);
    DS4_CUDA_CHECK(cudaStreamSynchronize(c.cu->stream));
    return DS4_OK;
}

extern "C" ds4_status ds4_cuda_l2_probe(ds4_cuda *cu, size_t w_bytes, size_t other_bytes, size_t persist_bytes,
                                        ds4_cuda_l2probe *out)
{
    memset(out, 0, sizeof *out);
    if (!cu || w_bytes < 16 || other_bytes < 16 || w_bytes % 16 || other_bytes % 16)
        return ds4_fail(DS4_ERR_INVALID, "cuda l2 probe: sizes must be positive multiples of 16 bytes");
    DS4_CUDA_CHECK(cudaSetDevice(cu->device));
    int l2 = 0, persist_max = 0;
    DS4_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, cu->device));
    DS4_CUDA_CHECK(cudaDeviceGetAttribute(&persist_max, cudaDevAttrMaxPersistingL2CacheSize, cu->device));
    out->l2_bytes = (size_t)l2;
    const size_t flush_bytes = ((size_t)4 * (size_t)l2 + 15) / 16 * 16;
    uint8_t *buf = NULL;
    uint32_t *o = NULL;
    const size_t total = w_bytes + other_bytes + flush_bytes;
    if (cudaMalloc(&buf, total) != cudaSuccess || cudaMalloc(&o, sizeof *o) != cudaSuccess) {
        (void)cudaGetLastError();
        if (buf) cudaFree(buf);
        return ds4_fail(DS4_ERR_NOMEM, "cuda l2 probe: %zu bytes of device memory", total);
    }
    ds4_status st = DS4_OK;
    if (cudaMemsetAsync(buf, 0x5a, total, cu->stream) != cudaSuccess) st = ds4_fail(DS4_ERR_BACKEND, "cuda l2 probe: memset");
    l2p_ctx c = {cu, buf, buf + w_bytes, buf + w_bytes + other_bytes, w_bytes, other_bytes, flush_bytes, o,
                 (unsigned)cu->n_sm * 4};
    /* the bulk prefetch only where this build has sm_90 code for it (a
     * kernel compiled for an older target would prefetch nothing) */
    cudaFuncAttributes fa;
    const bool bulk = cu->cc_major >= 9 &&
                      cudaFuncGetAttributes(&fa, (const void *)l2p_bulk_kernel<false>) == cudaSuccess &&
                      fa.binaryVersion >= 90;
    (void)cudaGetLastError();
    out->bulk = bulk;
    if (st == DS4_OK) st = l2p_cases(c, bulk, &out->plain);
    /* the same with an L2 set-aside for persisting lines (evict_last) */
    if (st == DS4_OK && persist_bytes > 0 && persist_max > 0) {
        const size_t set = persist_bytes < (size_t)persist_max ? persist_bytes : (size_t)persist_max;
        if (cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, set) == cudaSuccess) {
            out->persist_bytes = set;
            st = l2p_cases(c, bulk, &out->persist);
            (void)cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 0);
        }
        (void)cudaGetLastError();
    }
    cudaFree(buf);
    cudaFree(o);
    return st;
}

/*
 * cuda_router.cu - one token's MoE router of Flash's shape in one kernel:
 * the F16 gate matvec (256 experts x 4096) and the top-k routing (ops.h
 * moe_route) that were two launches, ~4 us each in a decode step while
 * neither uses more than a few SMs' worth of work.
 *
 * A cluster of 16 blocks of 512 threads (a non-portable cluster size,
 * which sm_90 allows): block q computes the logits of experts 16 q ..
 * 16 q + 15, every weight of them loaded into registers before the wait on
 * the previous kernel (programmatic dependent launch; the hyper-connection
 * site before runs on 8 SMs, so these blocks are usually resident and
 * their loads done before it ends). Rank 0 then reads the 256 logits
 * through distributed shared memory and routes on one warp.
 *
 * Bits: a logit is summed exactly as cuda_fmv.cu's block-per-row kernel
 * sums it (ds4_fmv_kernel<F16, 1, 8>, what the matmul op launches for this
 * shape): virtual lane j of 256 takes 16-byte units j and j + 256 in that
 * order, one fma per value; each virtual warp of 32 lanes a butterfly; the
 * 8 virtual warps' sums added to 0 in order. Here a real warp computes one
 * (expert, virtual warp) pair at a time. The routing is cb_moe_route_kernel's
 * (the same score expressions, the same winner for each pick: the highest
 * key, ties to the lower id, and the weights summed in pick order), so the
 * op gives the matmul + moe_route bits (tests/test_cuda_ops.c).
 */
#include "backend/cuda/cuda_router.cuh"
#include "backend/cuda/cuda_fmv.cuh"

#include <cooperative_groups.h>

namespace cg = cooperative_groups;

#define RT_BLOCKS 16
#define RT_THREADS 512
#define RT_WARPS (RT_THREADS / 32)
#define RT_ROWS (DS4_RT_EXPERTS / RT_BLOCKS) /* 16 experts a block */
#define RT_VW 8                               /* virtual warps of a row (fmv's block of 8 warps) */
#define RT_TASKS (RT_ROWS * RT_VW / RT_WARPS) /* 8 (expert, virtual warp) tasks a warp */
#define RT_UNITS (DS4_RT_COLS / 8)            /* 512 units of 8 halves a row */

__global__ void __launch_bounds__(RT_THREADS, 1) ds4_router_kernel(const ds4_router_args A)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __shared__ float s_vw[RT_ROWS][RT_VW];
    __shared__ float s_logit[RT_ROWS];
    __shared__ float s_sc[DS4_RT_EXPERTS];
    cg::cluster_group cluster = cg::this_cluster();
    const int q = (int)cluster.block_rank(), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* task i of this warp: expert row q * 16 + (task / 8), virtual warp task % 8 */
    uint4 wv[RT_TASKS][2];
#pragma unroll
    for (int i = 0; i < RT_TASKS; i++) {
        const int task = warp * RT_TASKS + i, r = task / RT_VW, vw = task % RT_VW, j = vw * 32 + lane;
        const uint4 *row = (const uint4 *)A.w + (size_t)(q * RT_ROWS + r) * RT_UNITS;
        wv[i][0] = __ldg(row + j);
        wv[i][1] = __ldg(row + j + 256);
    }
    ds4_pdl_enter();
#pragma unroll
    for (int i = 0; i < RT_TASKS; i++) {
        const int task = warp * RT_TASKS + i, r = task / RT_VW, vw = task % RT_VW, j = vw * 32 + lane;
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const int u = j + 256 * k;
            float w[8], x[8];
            ds4_fmv_decode<DS4_TYPE_F16>(wv[i][k], w);
            const float4 a = ds4_ld_f4(A.x + u * 8), b = ds4_ld_f4(A.x + u * 8 + 4);
            x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
            acc = ds4_fmv_dot<DS4_TYPE_F16>(w, x, acc);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) s_vw[r][vw] = acc;
    }
    __syncthreads();
    if (threadIdx.x < RT_ROWS) {
        float s = 0.0f;
#pragma unroll
        for (int v = 0; v < RT_VW; v++) s += s_vw[threadIdx.x][v];
        s_logit[threadIdx.x] = s;
    }
    cluster.sync();
    if (q == 0) {
        for (int e = threadIdx.x; e < DS4_RT_EXPERTS; e += RT_THREADS) {
            const float x = *cluster.map_shared_rank(&s_logit[e % RT_ROWS], e / RT_ROWS);
            A.logits[e] = x;
            const float sp = x > 20.0f ? x : log1pf(expf(x));
            s_sc[e] = sqrtf(sp);
        }
    }
    cluster.sync(); /* rank 0 is done reading the others' logits */
    if (q != 0 || warp != 0) return;
    /* one warp routes: lane l holds experts l + 32 m */
    float key[DS4_RT_EXPERTS / 32];
#pragma unroll
    for (int m = 0; m < DS4_RT_EXPERTS / 32; m++) {
        const int e = lane + 32 * m;
        key[m] = A.bias ? __fadd_rn(s_sc[e], __ldg(A.bias + e)) : s_sc[e];
    }
    int pick[DS4_RT_KMAX];
    for (int j = 0; j < A.k; j++) {
        if (A.tid2eid) {
            pick[j] = A.tid2eid[(size_t)A.token[0] * A.tid_ld + j];
            continue;
        }
        float bv = -INFINITY;
        int bi = -1;
#pragma unroll
        for (int m = 0; m < DS4_RT_EXPERTS / 32; m++) { /* ascending ids: a tie keeps the lower */
            const int e = lane + 32 * m;
            if (key[m] == -INFINITY && bi >= 0) continue;
            if (bi < 0 || key[m] > bv) bv = key[m], bi = e;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
        }
        pick[j] = bi;
#pragma unroll
        for (int m = 0; m < DS4_RT_EXPERTS / 32; m++)
            if (lane + 32 * m == bi) key[m] = -INFINITY; /* taken */
    }
    if (lane == 0) {
        float sum = 0.f;
        for (int j = 0; j < A.k; j++) {
            const int e = pick[j];
            sum += (e >= 0 && e < DS4_RT_EXPERTS) ? s_sc[e] : 0.f;
        }
        for (int j = 0; j < A.k; j++) {
            const int e = pick[j];
            const float v = (e >= 0 && e < DS4_RT_EXPERTS) ? s_sc[e] : 0.f;
            A.sel[j] = e;
            A.w_out[j] = v / (sum + 1e-20f) * A.scale;
        }
    }
#endif
}

bool ds4_router_ok(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows, int64_t cols, int k, const float *x)
{
    static int on = -1;
    if (!ds4_env_switch_on("DS4_CUDA_ROUTER1", &on)) return false;
    if (type != DS4_TYPE_F16 || rows != DS4_RT_EXPERTS || cols != DS4_RT_COLS || k < 1 || k > DS4_RT_KMAX) return false;
    /* the matmul op's kernel for this shape must be the one whose sums this kernel repeats */
    if (!ds4_cuda_fmv_active(type, d_w, cols) || ds4_cuda_fmv_warps_per_row(cu, rows) != RT_VW) return false;
    if ((uintptr_t)x % 16 != 0) return false;
    static int major[32];
    if (cu->device < 0 || cu->device >= 32) return false;
    if (major[cu->device] == 0) {
        int v = 0;
        if (cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, cu->device) != cudaSuccess) v = -1;
        major[cu->device] = v;
    }
    return major[cu->device] >= 9;
}

bool ds4_router_run(ds4_cuda *cu, const ds4_router_args &a)
{
    static bool attr_set = false;
    if (!attr_set) {
        if (cudaFuncSetAttribute(ds4_router_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess)
            return false;
        attr_set = true;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(RT_BLOCKS);
    cfg.blockDim = dim3(RT_THREADS);
    cfg.stream = cu->stream;
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = RT_BLOCKS;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = ds4_cuda_pdl_on ? 2 : 1;
    return cudaLaunchKernelEx(&cfg, ds4_router_kernel, a) == cudaSuccess;
}

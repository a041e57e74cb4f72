/*
 * cuda_q8split_ring.cu - one token's decode matvec on the split-layout
 * Q8_0 copies with each warp's weight batches streamed through a ring of
 * shared-memory stages (cp.async), the activation quantized by each block.
 *
 * Why: the register-pipelined kernel (cuda_q8split_fused.cu) keeps one
 * batch (4 KB a warp, 64 KB an SM at its two blocks of 8 warps) in flight
 * and issues the next only after the current one is computed. For the
 * 563 MB LM head that reaches 4.1 TB/s, but the layer's products of 7-36
 * MB are over after 1-4 batches a warp, each a full DRAM round trip with
 * nothing else in flight: ncu (twenty-first session, caches flushed) put
 * q_b / o_a / o_b (35.7 MB each) at 12.1 / 13.6 / 15.7 us (2.3-2.9 TB/s)
 * and q_a with kv (6.7 MB) at 7.8 us. Here a warp keeps ST - 1 batches in
 * flight (with 8 warps and 5 stages, 139 KB an SM), the first of them
 * issued before ds4_pdl_enter() (weights are read-only for the backend's
 * life), so a product is one ramp to the DRAM's rate instead of a round
 * trip per batch.
 *
 * Each lane takes the same chunks in the same order, with the same float
 * expression, as the register-pipelined kernel, and the warp sums lanes
 * alike, so the two kernels' results are bit for bit the same
 * (tests/test_cuda_kernels compares with the quantizer + split-layout pair;
 * `bench/h200_run.sh same` with q8fr0 the whole model's logits).
 * DS4_CUDA_Q8F_RING=0: the register-pipelined kernel (A/B runs);
 * =16x3 / =8x3: 16 warps and 3 stages / 8 warps and 3 stages (two blocks
 * an SM) instead of 8 warps and 5 stages.
 */
#include "backend/cuda/cuda_blocks.cuh"
#include "backend/cuda/cuda_mmvq.cuh"
#include "backend/cuda/cuda_mq_device.cuh"
#include "backend/cuda/cuda_q8f.cuh"

#include <stdlib.h>
#include <string.h>

enum { Q8R_QB = 4096, Q8R_SB = Q8R_QB + 256 /* a stage: a batch's values, then its 128 scales */ };

/* Copy batch `sidx` of item `it` (row gbase + it * RPB) into dst by
 * cp.async and commit: lane l copies the 16-byte chunks it will read
 * (32 k + l), lanes 0-15 the scales. */
template <int CPL, int NB>
__device__ __forceinline__ void ds4_q8r_fetch(const uint8_t *qs, const uint16_t *d, int64_t row0, int64_t cols,
                                              int j, uint8_t *dst, int lane)
{
    const uint8_t *src = qs + row0 * cols + (int64_t)Q8R_QB * j;
#pragma unroll
    for (int k = 0; k < 8; k++) ds4_mq_cp16(dst + 16 * (32 * k + lane), src + 16 * (32 * k + lane));
    if (lane < 16) ds4_mq_cp16(dst + Q8R_QB + 16 * lane, (const uint8_t *)(d + row0 * (cols / 32) + 128 * j) + 16 * lane);
    ds4_mq_cp_commit();
}

template <int CPL, int EPI, int W, int ST>
__global__ void __launch_bounds__(W * 32, 1) ds4_q8r_kernel(const ds4_q8f_params P)
{
    enum { NM = EPI == DS4_Q8S_SWIGLU ? 2 : 1, RPB = ds4_q8f_shape<CPL>::RPB, NB = ds4_q8f_shape<CPL>::NB,
           NS = NM * NB /* batches per item */ };
    extern __shared__ __align__(16) uint8_t q8r_smem[];
    int8_t *xq = (int8_t *)q8r_smem;
    float *xd = (float *)(q8r_smem + P.cols);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint8_t *mine = q8r_smem + P.cols + P.cols / 8 + (size_t)warp * ST * Q8R_SB;
    const int pm = EPI == DS4_Q8S_PAIR ? (int)blockIdx.y : 0;
    const int64_t s = EPI == DS4_Q8S_PAIR ? 0 : blockIdx.y;
    const int64_t n_items = (pm ? P.rows2 : P.rows) / RPB;
    const int64_t stride = (int64_t)gridDim.x * W;
    const int64_t gbase = P.n_group > 1 ? (s % P.n_group) * P.rows : 0;
    const uint8_t *qs0 = P.qs[pm];
    const uint16_t *d0 = P.d[pm];
    float *yb = pm ? P.y2 : P.y;
    const int64_t item0 = (int64_t)blockIdx.x * W + warp;
    const int64_t n_b = (item0 < n_items ? (n_items - item0 + stride - 1) / stride : 0) * NS;
    /* batch b of this warp: item item0 + (b / NS) stride, batch b % NS
     * (matrix (b % NS) / NB, part (b % NS) % NB) */
    auto fetch = [&](int64_t b, int stage) {
        const int64_t it = item0 + (b / NS) * stride;
        const int sb = (int)(b % NS), m = sb / NB;
        ds4_q8r_fetch<CPL, NB>(m ? P.qs[1] : qs0, m ? P.d[1] : d0, gbase + it * RPB, P.cols, sb % NB,
                                mine + stage * Q8R_SB, lane);
    };
#pragma unroll
    for (int i = 0; i < ST - 1; i++) {
        if (i < n_b) fetch(i, i);
        else ds4_mq_cp_commit();
    }

    ds4_pdl_enter(); /* from here on the activation is the previous kernel's result */

    /* quantize x: 4 values a thread, 8 neighbouring lanes a block of 32 */
    {
        const float *xs = P.x + s * P.x_ld;
        for (int v = threadIdx.x; v < (int)P.cols / 4; v += W * 32) {
            const float4 f = *(const float4 *)(xs + 4 * v);
            float amax = fmaxf(fmaxf(fabsf(f.x), fabsf(f.y)), fmaxf(fabsf(f.z), fabsf(f.w)));
#pragma unroll
            for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
            const float id = ds4_mmvq_q8_0_id(amax);
            const uint32_t p = (uint32_t)(uint8_t)ds4_mmvq_q8_0_q(f.x, id) |
                               (uint32_t)(uint8_t)ds4_mmvq_q8_0_q(f.y, id) << 8 |
                               (uint32_t)(uint8_t)ds4_mmvq_q8_0_q(f.z, id) << 16 |
                               (uint32_t)(uint8_t)ds4_mmvq_q8_0_q(f.w, id) << 24;
            *(uint32_t *)(xq + 4 * v) = p;
            if ((v & 7) == 0) xd[v / 8] = ds4_mmvq_q8_0_d(amax);
        }
    }
    __syncthreads();

    const uint32_t ring = (uint32_t)__cvta_generic_to_shared(mine);
    int sc = 0; /* the stage computed next */
    int64_t b = 0;
    for (int64_t it = item0; it < n_items; it += stride) {
        float acc[NM][RPB];
#pragma unroll
        for (int m = 0; m < NM; m++)
#pragma unroll
            for (int r = 0; r < RPB; r++) acc[m][r] = 0.0f;
#pragma unroll
        for (int st = 0; st < NS; st++, b++) {
            const int m = st / NB, j = st % NB;
            /* batch b + ST - 1 into the stage computed last */
            if (b + ST - 1 < n_b) fetch(b + ST - 1, sc == 0 ? ST - 1 : sc - 1);
            else ds4_mq_cp_commit();
            ds4_mq_cp_wait<ST - 1>();
            __syncwarp();
            const uint32_t w = ring + sc * Q8R_SB;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const int c = lane + 32 * (CPL < 8 ? k % CPL : 8 * j + k);
                const uint4 wv = ds4_lds128(w + 16 * (32 * k + lane));
                const uint4 x = *(const uint4 *)(xq + 16 * c);
                int is = __dp4a((int)wv.x, (int)x.x, 0);
                is = __dp4a((int)wv.y, (int)x.y, is);
                is = __dp4a((int)wv.z, (int)x.z, is);
                is = __dp4a((int)wv.w, (int)x.w, is);
                const uint32_t dc = ds4_lds_u16(w + Q8R_QB + 2 * (16 * k + (lane >> 1)));
                acc[m][CPL < 8 ? k / CPL : 0] += ds4_f16(dc) * xd[c >> 1] * (float)is;
            }
            __syncwarp(); /* the stage is refilled next */
            sc = sc == ST - 1 ? 0 : sc + 1;
        }
#pragma unroll
        for (int r = 0; r < RPB; r++) {
            float v[NM];
#pragma unroll
            for (int m = 0; m < NM; m++) {
                float x = acc[m][r];
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
                v[m] = x;
            }
            if (lane != 0) continue;
            float *yp = yb + s * P.y_slot_stride + it * RPB + r;
            if (EPI == DS4_Q8S_SWIGLU) *yp = ds4_swiglu_clamped(v[0], v[NM - 1], P.clamp);
            else if (EPI == DS4_Q8S_ADD) *yp = P.accumulate ? __fadd_rn(*yp, v[0]) : v[0];
            else *yp = v[0];
        }
    }
}

template <int CPL, int EPI, int W, int ST>
static bool ds4_q8r_go(ds4_cuda *cu, const ds4_q8f_params &P, int64_t n_slots)
{
    const size_t smem = (size_t)P.cols + (size_t)P.cols / 8 + (size_t)W * ST * Q8R_SB;
    static int per_sm[32];
    static size_t attr_smem[32];
    if (cu->device < 0 || cu->device >= 32) return false;
    if (attr_smem[cu->device] < smem) {
        if (cudaFuncSetAttribute(ds4_q8r_kernel<CPL, EPI, W, ST>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem) != cudaSuccess) {
            (void)cudaGetLastError();
            return false;
        }
        attr_smem[cu->device] = smem;
        per_sm[cu->device] = 0;
    }
    if (per_sm[cu->device] == 0) {
        int n = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, ds4_q8r_kernel<CPL, EPI, W, ST>, W * 32, smem) !=
                cudaSuccess ||
            n < 1) {
            (void)cudaGetLastError();
            per_sm[cu->device] = -1;
        } else {
            per_sm[cu->device] = n;
        }
    }
    if (per_sm[cu->device] < 0) return false;
    /* one wave: the slots share the resident blocks, rounded down so that
     * no block waits for a second wave */
    const int64_t items = (EPI == DS4_Q8S_PAIR && P.rows2 > P.rows ? P.rows2 : P.rows) / ds4_q8f_shape<CPL>::RPB;
    const int64_t need = (items + W - 1) / W;
    int64_t full = (int64_t)per_sm[cu->device] * cu->n_sm / n_slots;
    if (full < 1) full = 1;
    const unsigned gx = (unsigned)(need < full ? need : full);
    ds4_launch(ds4_q8r_kernel<CPL, EPI, W, ST>, dim3(gx, (unsigned)n_slots), W * 32, smem, cu->stream, P);
    return true;
}

template <int W, int ST, int EPI>
static bool ds4_q8r_cpl(ds4_cuda *cu, const ds4_q8f_params &P, int64_t n_slots)
{
    switch (P.cols / 512) {
    case 2: return ds4_q8r_go<2, EPI, W, ST>(cu, P, n_slots);
    case 4: return ds4_q8r_go<4, EPI, W, ST>(cu, P, n_slots);
    case 8: return ds4_q8r_go<8, EPI, W, ST>(cu, P, n_slots);
    default: return ds4_q8r_go<16, EPI, W, ST>(cu, P, n_slots);
    }
}

template <int W, int ST>
static bool ds4_q8r_epi(ds4_cuda *cu, const ds4_q8f_params &P, int epi, int64_t n_slots)
{
    switch (epi) {
    case DS4_Q8S_STORE: return ds4_q8r_cpl<W, ST, DS4_Q8S_STORE>(cu, P, n_slots);
    case DS4_Q8S_SWIGLU: return ds4_q8r_cpl<W, ST, DS4_Q8S_SWIGLU>(cu, P, n_slots);
    case DS4_Q8S_ADD: return ds4_q8r_cpl<W, ST, DS4_Q8S_ADD>(cu, P, n_slots);
    default: return ds4_q8r_cpl<W, ST, DS4_Q8S_PAIR>(cu, P, n_slots);
    }
}

bool ds4_q8r_launch(ds4_cuda *cu, const ds4_q8f_params &P, int epi, int64_t n_slots)
{
    static int cfg = -1;
    if (cfg < 0) {
        const char *e = getenv("DS4_CUDA_Q8F_RING");
        cfg = !e ? 1 : e[0] == '0' ? 0 : !strcmp(e, "16x3") ? 2 : !strcmp(e, "8x3") ? 3 : 1;
    }
    if (cfg == 0 || P.cols % 512 != 0 || P.cols / 512 < 2 || P.cols / 512 > 16) return false;
    if (cfg == 2) return ds4_q8r_epi<16, 3>(cu, P, epi, n_slots);
    if (cfg == 3) return ds4_q8r_epi<8, 3>(cu, P, epi, n_slots);
    return ds4_q8r_epi<8, 5>(cu, P, epi, n_slots);
}

/*
 * cuda_q8split.cu - Q8_0 weights in a second device layout for the decode
 * matvec: the int8 values of every block in one run (32 bytes per block,
 * row after row) and the f16 scales in another.
 *
 * Why: a Q8_0 block is 34 bytes (f16 scale + 32 int8), so its int8 run is
 * never 4-byte aligned in the file's layout. The int8 matvec of
 * cuda_mmvq.cu stages rows through shared memory and assembles unaligned
 * words with funnel shifts; ncu (2026-12-02, docs/BENCHMARKS.md) shows that
 * kernel bound by its instruction stream at 12-24% of DRAM peak. In the
 * split layout a lane loads 16 weight bytes and the matching 16 activation
 * bytes with one vector load each and does 4 dp4a: a few instructions per
 * 16 bytes, straight from global memory, no shared memory.
 *
 * The copy is made once per device weight copy (weight_prepare, through
 * ds4_cuda_q8split_register) beside the original, which the other kernels
 * (prefill GEMM, the f32-activation matvec) keep reading: it costs the
 * Q8_0 bytes once more (6.4 GB on the full Flash q2). DS4_CUDA_Q8SPLIT=0
 * makes none (the int8 kernel of cuda_mmvq.cu then runs as before).
 *
 * Arithmetic: as the int8 kernel, each lane adds float terms
 * (d_w * d_x) * (integer dot of its 16 values); the CPU sums whole blocks
 * of 32 first, so results differ from it by float summation order only.
 */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_blocks.cuh"
#include "backend/cuda/cuda_mmvq.cuh"

#include "backend/cuda/cuda_copy_registry.h"

#include <stdlib.h>

/* ---- registry: original device pointer -> split copy ------------------- */

/* copies: qs[rows * cols] then f16 d[rows * cols / 32] */
static ds4_copy_registry q8s_reg = DS4_COPY_REGISTRY_INIT;

static bool q8s_enabled(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_Q8SPLIT", &on);
}

/* One thread per block: scale to the scale run, 32 int8 to the value run. */
__global__ void ds4_q8s_repack_kernel(const uint8_t *src, int64_t n_blocks, uint8_t *qs, uint16_t *d)
{
    ds4_pdl_enter();
    for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < n_blocks;
         b += (int64_t)gridDim.x * blockDim.x) {
        const uint8_t *blk = src + b * 34;
        d[b] = (uint16_t)(blk[0] | (blk[1] << 8));
        uint32_t *o = (uint32_t *)(qs + b * 32);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint8_t *p = blk + 2 + 4 * i;
            o[i] = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
        }
    }
}

extern "C" ds4_status ds4_cuda_q8split_register(ds4_cuda *cu, const void *d_w, int64_t rows, int64_t cols)
{
    if (!q8s_enabled() || !d_w || rows <= 0 || cols <= 0 || cols % 32 != 0) return DS4_OK;
    if (ds4_copy_registry_has(&q8s_reg, cu->device, d_w)) return DS4_OK;
    const int64_t n_blocks = rows * (cols / 32);
    void *split = NULL;
    ds4_status st = ds4_cuda_malloc(cu, (size_t)n_blocks * 34, &split);
    if (st != DS4_OK) return st;
    uint8_t *qs = (uint8_t *)split;
    uint16_t *d = (uint16_t *)(qs + n_blocks * 32);
    const int64_t want = (n_blocks + 255) / 256;
    ds4_launch(ds4_q8s_repack_kernel, (unsigned)(want < 65535 ? want : 65535), 256, 0, cu->stream,
               (const uint8_t *)d_w, n_blocks, qs, d);
    /* waited for: a backend on another stream may share the copy at once */
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaStreamSynchronize(cu->stream);
    if (e != cudaSuccess) {
        ds4_cuda_free(cu, split);
        return ds4_fail(DS4_ERR_BACKEND, "cuda q8split: repack: %s", cudaGetErrorString(e));
    }
    bool added = false;
    st = ds4_copy_registry_add(&q8s_reg, cu->device, d_w, split, rows, cols, &added);
    if (!added) ds4_cuda_free(cu, split); /* the repack was waited for above */
    return st;
}

extern "C" void ds4_cuda_q8split_release(ds4_cuda *cu, const void *d_w)
{
    void *split = ds4_copy_registry_take(&q8s_reg, cu->device, d_w);
    if (!split) return;
    cudaStreamSynchronize(cu->stream); /* no queued kernel may still read it */
    ds4_cuda_free(cu, split);
}

const uint8_t *ds4_q8split_find(int device, const void *d_w, int64_t rows_needed, int64_t cols, int64_t *rows)
{
    *rows = 0;
    if (!q8s_enabled() || !d_w) return NULL;
    ds4_copy_entry e;
    int64_t r0;
    if (!ds4_copy_registry_find(&q8s_reg, device, d_w, cols, 0, &e, &r0) || e.rows < rows_needed) return NULL;
    *rows = e.rows;
    return (const uint8_t *)e.copy;
}

/* ---- the matvec ----------------------------------------------------------- */

#define Q8S_WARPS 8
#define Q8S_UNROLL 4

struct ds4_q8s_params {
    const uint8_t *qs[2];   /* value runs of the matrices (gate, up for SwiGLU) */
    const uint16_t *d[2];   /* their scale runs */
    int64_t rows, cols, n_group;
    const uint8_t *act;
    int64_t act_ld;
    float *y;
    int64_t y_tok_stride, y_slot_stride, n_slots;
    float clamp;
    int accumulate;
};

template <int NT, int EPI>
__global__ void __launch_bounds__(Q8S_WARPS * 32) ds4_q8s_kernel(const ds4_q8s_params P)
{
    ds4_pdl_enter();
    enum { NMAT = EPI == DS4_Q8S_SWIGLU ? 2 : 1 };
    const int lane = threadIdx.x & 31;
    const int64_t n_items = P.n_slots * P.rows;
    const int64_t stride = (int64_t)gridDim.x * Q8S_WARPS;
    const int nch = (int)(P.cols / 16); /* 16-byte chunks of a row (even: cols % 32 == 0) */
    const int nblk_row = (int)(P.cols / 32);
    for (int64_t item = (int64_t)blockIdx.x * Q8S_WARPS + (threadIdx.x >> 5); item < n_items; item += stride) {
        const int64_t s = item / P.rows, r = item - s * P.rows;
        const int64_t grow = (P.n_group > 1 ? (s % P.n_group) * P.rows : 0) + r;
        const uint8_t *act0 = P.act + s * P.act_ld;
        float acc[NMAT][NT];
#pragma unroll
        for (int m = 0; m < NMAT; m++)
#pragma unroll
            for (int t = 0; t < NT; t++) acc[m][t] = 0.0f;
#pragma unroll
        for (int m = 0; m < NMAT; m++) {
            const uint8_t *wq = P.qs[m] + grow * P.cols;
            const uint16_t *wd = P.d[m] + grow * nblk_row;
            for (int c0 = lane; c0 < nch; c0 += 32 * Q8S_UNROLL) {
                uint4 w[Q8S_UNROLL];
                uint16_t dw[Q8S_UNROLL];
#pragma unroll
                for (int u = 0; u < Q8S_UNROLL; u++) {
                    const int c = c0 + 32 * u;
                    if (c < nch) {
                        w[u] = ds4_ld_stream16(wq + 16 * (int64_t)c);
                        dw[u] = __ldg(wd + (c >> 1));
                    }
                }
#pragma unroll
                for (int u = 0; u < Q8S_UNROLL; u++) {
                    const int c = c0 + 32 * u;
                    if (c >= nch) break;
                    const float fw = ds4_f16(dw[u]);
#pragma unroll
                    for (int t = 0; t < NT; t++) {
                        const uint8_t *a = act0 + t * P.act_ld;
                        const uint4 x = __ldg((const uint4 *)(a + 16 * c));
                        const float dx = __ldg((const float *)(a + P.cols) + (c >> 1));
                        int is = __dp4a((int)w[u].x, (int)x.x, 0);
                        is = __dp4a((int)w[u].y, (int)x.y, is);
                        is = __dp4a((int)w[u].z, (int)x.z, is);
                        is = __dp4a((int)w[u].w, (int)x.w, is);
                        acc[m][t] += fw * dx * (float)is;
                    }
                }
            }
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v[NMAT];
#pragma unroll
            for (int m = 0; m < NMAT; m++) {
                float x = acc[m][t];
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
                v[m] = x;
            }
            if (lane != 0) continue;
            float *yp = P.y + s * P.y_slot_stride + t * P.y_tok_stride + r;
            if (EPI == DS4_Q8S_SWIGLU) *yp = ds4_swiglu_clamped(v[0], v[NMAT - 1], P.clamp);
            else if (EPI == DS4_Q8S_ADD) *yp = P.accumulate ? __fadd_rn(*yp, v[0]) : v[0];
            else *yp = v[0];
        }
    }
}

template <int NT, int EPI>
static void ds4_q8s_launch(ds4_cuda *cu, const ds4_q8s_params &P)
{
    static int per_sm = 0;
    if (per_sm == 0) {
        int n = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, ds4_q8s_kernel<NT, EPI>, Q8S_WARPS * 32, 0) !=
                cudaSuccess || n < 1)
            n = 1;
        per_sm = n;
    }
    const int64_t items = P.n_slots * P.rows, need = (items + Q8S_WARPS - 1) / Q8S_WARPS;
    const int64_t full = (int64_t)per_sm * cu->n_sm;
    const unsigned grid = (unsigned)(need < full ? (need < 1 ? 1 : need) : full);
    ds4_launch(ds4_q8s_kernel<NT, EPI>, grid, Q8S_WARPS * 32, 0, cu->stream, P);
}

template <int EPI>
static void ds4_q8s_launch_nt(ds4_cuda *cu, const ds4_q8s_params &P, int nt)
{
    switch (nt) {
    case 1: ds4_q8s_launch<1, EPI>(cu, P); break;
    case 2: ds4_q8s_launch<2, EPI>(cu, P); break;
    case 3: ds4_q8s_launch<3, EPI>(cu, P); break;
    case 4: ds4_q8s_launch<4, EPI>(cu, P); break;
    default: ds4_q8s_launch<8, EPI>(cu, P); break;
    }
}

int ds4_q8split_run(ds4_cuda *cu, const ds4_q8s_args *a, int nt, int epi)
{
    if (nt < 1 || (nt > 4 && nt != 8) || (epi != DS4_Q8S_STORE && epi != DS4_Q8S_ADD && epi != DS4_Q8S_SWIGLU)) return 0;
    if (a->cols % 32 != 0 || a->act_ld % 16 != 0 || ((uintptr_t)a->act & 15u) != 0) return 0;
    if (nt > 1 && a->n_slots != 1) return 0;
    const int nmat = epi == DS4_Q8S_SWIGLU ? 2 : 1;
    const int64_t rows_needed = a->rows * (a->n_group > 1 ? a->n_group : 1);
    ds4_q8s_params P;
    for (int m = 0; m < nmat; m++) {
        int64_t total_rows = 0;
        const uint8_t *split = ds4_q8split_find(cu->device, a->w[m], rows_needed, a->cols, &total_rows);
        if (!split) return 0;
        P.qs[m] = split;
        P.d[m] = (const uint16_t *)(split + total_rows * a->cols); /* the scale run follows the values */
    }
    if (nmat == 1) {
        P.qs[1] = P.qs[0];
        P.d[1] = P.d[0];
    }
    P.rows = a->rows;
    P.cols = a->cols;
    P.n_group = a->n_group;
    P.act = a->act;
    P.act_ld = a->act_ld;
    P.y = a->y;
    P.y_tok_stride = a->y_tok_stride;
    P.y_slot_stride = a->y_slot_stride;
    P.n_slots = a->n_slots;
    P.clamp = a->clamp;
    P.accumulate = a->accumulate;
    switch (epi) {
    case DS4_Q8S_STORE: ds4_q8s_launch_nt<DS4_Q8S_STORE>(cu, P, nt); break;
    case DS4_Q8S_ADD: ds4_q8s_launch_nt<DS4_Q8S_ADD>(cu, P, nt); break;
    default: ds4_q8s_launch_nt<DS4_Q8S_SWIGLU>(cu, P, nt); break;
    }
    return 1;
}

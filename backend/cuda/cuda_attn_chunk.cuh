/*
 * cuda_attn_chunk.cuh - one chunk of a query's attention rows, as the
 * split kernels (cuda_attn_split.cu: a chunk per block, partials through
 * memory) and the prefill kernel (cuda_attn_prefill.cu: a block walks all
 * of a query's chunks) compute it: the rows staged in shared memory once
 * for a group of heads, each warp scoring them for its CB_AS_HPW heads.
 */
#ifndef DS4_CUDA_ATTN_CHUNK_CUH
#define DS4_CUDA_ATTN_CHUNK_CUH

#include "backend/cuda/cuda_attention.cuh"

#define CB_AS_ROWS 32 /* rows per chunk: one per lane in the chunk softmax (must be 32) */
#define CB_AS_HPW 2   /* heads per warp (a staged row is read once for both) */
#define CB_AS_WARPS 8
#define CB_AS_HEADS (CB_AS_HPW * CB_AS_WARPS)
#define CB_AS_J 4 /* float4 per lane and head: hd <= 4 * 4 * 32 = 512 */

/* Rows visible to query t (whole block; every thread gets the count):
 * the raw window lo .. p, then the compressed rows (the selected ids up to
 * the first -1, or all causal ones). Two barriers. */
__device__ __forceinline__ int64_t cb_as_rows(const cb_attn_args &a, int t, int64_t *lo_out, int64_t *n_raw_out)
{
    __shared__ int s_nc;
    const int64_t p = a.pos0 + t;
    const int64_t lo = p - a.window + 1 < 0 ? 0 : p - a.window + 1;
    if (threadIdx.x == 0) s_nc = a.ratio ? (a.sel ? a.topk : (int)((p + 1) / a.ratio)) : 0;
    __syncthreads();
    if (a.ratio && a.sel)
        for (int i = threadIdx.x; i < a.topk; i += blockDim.x)
            if (a.sel[(size_t)t * a.topk + i] < 0) atomicMin(&s_nc, i);
    __syncthreads();
    *lo_out = lo;
    *n_raw_out = p - lo + 1;
    return p - lo + 1 + s_nc;
}

/* The addresses of this warp's rows of the chunk (rows warp, warp + 8,
 * ... of r0 .. r0 + nr - 1; NULL past nr), all before any row load: a
 * selected row's id is itself a load. */
__device__ __forceinline__ void cb_as_row_ptrs(const cb_attn_args &a, int t, int64_t lo, int64_t n_raw, int64_t r0,
                                               int nr, const float4 *(&src)[CB_AS_ROWS / CB_AS_WARPS])
{
    const int warp = threadIdx.x >> 5;
#pragma unroll
    for (int i = 0; i < CB_AS_ROWS / CB_AS_WARPS; i++) {
        const int r = warp + i * CB_AS_WARPS;
        src[i] = r < nr ? (const float4 *)cb_attn_row(a, t, lo, n_raw, r0 + r) : NULL;
    }
}

/* Rows r0 .. r0 + nr - 1 of query t into s_kv (nr <= CB_AS_ROWS), every
 * load of the block in flight at once. No barrier. */
__device__ __forceinline__ void cb_as_stage(const cb_attn_args &a, int t, int64_t lo, int64_t n_raw, int64_t r0,
                                            int nr, float4 *s_kv)
{
    const int hd4 = a.hd >> 2, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float4 *src[CB_AS_ROWS / CB_AS_WARPS];
    cb_as_row_ptrs(a, t, lo, n_raw, r0, nr, src);
    float4 v[CB_AS_ROWS / CB_AS_WARPS][CB_AS_J];
#pragma unroll
    for (int i = 0; i < CB_AS_ROWS / CB_AS_WARPS; i++)
#pragma unroll
        for (int j = 0; j < CB_AS_J; j++) {
            const int c = lane + 32 * j;
            if (src[i] && c < hd4) v[i][j] = src[i][c];
        }
#pragma unroll
    for (int i = 0; i < CB_AS_ROWS / CB_AS_WARPS; i++)
#pragma unroll
        for (int j = 0; j < CB_AS_J; j++) {
            const int c = lane + 32 * j;
            if (src[i] && c < hd4) s_kv[(warp + i * CB_AS_WARPS) * hd4 + c] = v[i][j];
        }
}

/* The warp's heads hb, hb + 1 of query t: lane l holds the float4 l + 32 j
 * (zeros past the heads or the row) */
__device__ __forceinline__ void cb_as_load_q(const cb_attn_args &a, int t, int hb, float4 (&q)[CB_AS_HPW][CB_AS_J])
{
    const int hd4 = a.hd >> 2, lane = threadIdx.x & 31;
#pragma unroll
    for (int hh = 0; hh < CB_AS_HPW; hh++) {
        const float4 *qh = (const float4 *)(a.q + ((size_t)t * a.n_heads + hb + hh) * a.hd);
#pragma unroll
        for (int j = 0; j < CB_AS_J; j++) {
            const int c = lane + 32 * j;
            q[hh][j] = hb + hh < a.n_heads && c < hd4 ? qh[c] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
}

/* One step of the transposing warp reduction: lanes with bit O set keep
 * the upper O of their first 2 O sums and send the lower ones, the others
 * the reverse; after the steps 16 .. 1 (N = 32 sums), x[hh][0] on lane r
 * is row r's sum over all lanes. */
template <int O, int N> __device__ __forceinline__ void cb_as_transpose_step(float (&x)[CB_AS_HPW][N], int lane)
{
    const bool upper = (lane & O) != 0;
#pragma unroll
    for (int k = 0; k < O; k++)
#pragma unroll
        for (int hh = 0; hh < CB_AS_HPW; hh++) {
            const float send = upper ? x[hh][k] : x[hh][k + O], keep = upper ? x[hh][k + O] : x[hh][k];
            x[hh][k] = keep + __shfl_xor_sync(0xffffffffu, send, O);
        }
}

/* x[hh][k] = this lane's part of the dot of staged row r with head hh's
 * q (its float4 columns lane + 32 j), 0 for a row past nr */
template <int N>
__device__ __forceinline__ void cb_as_row_dot(const float4 *s_kv, int r, int nr, int hd4,
                                              const float4 (&q)[CB_AS_HPW][CB_AS_J], float (&x)[CB_AS_HPW][N], int k)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int hh = 0; hh < CB_AS_HPW; hh++) x[hh][k] = 0.f;
    if (r < nr) {
#pragma unroll
        for (int j = 0; j < CB_AS_J; j++) {
            const int c = lane + 32 * j;
            if (c < hd4) {
                const float4 kv = s_kv[r * hd4 + c];
#pragma unroll
                for (int hh = 0; hh < CB_AS_HPW; hh++)
                    x[hh][k] += q[hh][j].x * kv.x + q[hh][j].y * kv.y + q[hh][j].z * kv.z + q[hh][j].w * kv.w;
            }
        }
    }
}

/* The staged chunk's scores: lane r gets row r's scaled score for each
 * of the warp's heads, -inf past the nr rows. Each lane's partial dots of
 * all rows, then the transposing reduction (31 shuffles a head instead of
 * 5 per row). */
__device__ __forceinline__ void cb_as_scores(const float4 *s_kv, int nr, int hd4, float scale,
                                             const float4 (&q)[CB_AS_HPW][CB_AS_J], float (&mine)[CB_AS_HPW])
{
    const int lane = threadIdx.x & 31;
    float x[CB_AS_HPW][CB_AS_ROWS];
#pragma unroll
    for (int r = 0; r < CB_AS_ROWS; r++) cb_as_row_dot(s_kv, r, nr, hd4, q, x, r);
    cb_as_transpose_step<16>(x, lane);
    cb_as_transpose_step<8>(x, lane);
    cb_as_transpose_step<4>(x, lane);
    cb_as_transpose_step<2>(x, lane);
    cb_as_transpose_step<1>(x, lane);
#pragma unroll
    for (int hh = 0; hh < CB_AS_HPW; hh++) mine[hh] = lane < nr ? x[hh][0] * scale : -INFINITY;
}

/* o[hh] += sum over the nr staged rows r of pw[hh] (lane r's) * row r */
__device__ __forceinline__ void cb_as_accumulate(const float4 *s_kv, int nr, int hd4, const float (&pw)[CB_AS_HPW],
                                                 float4 (&o)[CB_AS_HPW][CB_AS_J])
{
    const int lane = threadIdx.x & 31;
    for (int r = 0; r < nr; r++) {
        float pr[CB_AS_HPW];
#pragma unroll
        for (int hh = 0; hh < CB_AS_HPW; hh++) pr[hh] = __shfl_sync(0xffffffffu, pw[hh], r);
#pragma unroll
        for (int j = 0; j < CB_AS_J; j++) {
            const int c = lane + 32 * j;
            if (c < hd4) {
                const float4 k = s_kv[r * hd4 + c];
#pragma unroll
                for (int hh = 0; hh < CB_AS_HPW; hh++) {
                    o[hh][j].x += pr[hh] * k.x;
                    o[hh][j].y += pr[hh] * k.y;
                    o[hh][j].z += pr[hh] * k.z;
                    o[hh][j].w += pr[hh] * k.w;
                }
            }
        }
    }
}

#endif

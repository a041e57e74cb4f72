/*
 * cuda_attn_prefill.cu - a prefill chunk's sparse attention with sinks
 * (§3.4) in one pass: a block per (query, group of CB_AS_HEADS heads)
 * walks all of the query's rows, a chunk of CB_AS_ROWS at a time staged in
 * shared memory as the split kernels stage it (cuda_attn_chunk.cuh), and
 * keeps each head's running softmax (max M, sum L, the weighted row sum o)
 * in registers: o and L are rescaled by exp(M_old - M_new) when a chunk
 * raises the max, and the sink joins at the end, out = o / (exp(sink - M)
 * + L), M starting at the sink.
 *
 * The split kernels (flash decoding) exist for few queries: they spread a
 * query's chunks over blocks and write every chunk's partials (~2.6 MB a
 * query at Flash's 64 heads of 512 and 640 rows) to memory for a second
 * kernel to merge, and at 64 MB of partials a launch a 2048-token chunk
 * took ~85 launches of each. A prefill chunk has queries enough to fill
 * the GPU with one block per query and head group, so here nothing goes
 * through memory but the output, in one launch.
 *
 * Two heads a warp, as the split kernels: four (a staged float4 feeding 16
 * fmas instead of 8, 32 heads a staging) needed 212 registers, one block
 * an SM, and took 9.0 ms a layer of a 2048-token step against 3.8
 * (docs/BENCHMARKS.md, twelfth session, run p).
 *
 * The rescaling orders the sums differently from the split kernels' merge,
 * so a prefilled token's attention differs from its decode in the last
 * bits (as its bf16 GEMMs and tall float products already make it); the
 * output's inverse RoPE (attention_out) is the combine kernel's. The ring
 * push is not done here: the chunk's last window of rows overwrites ring
 * rows that earlier queries of the same launch read.
 */
#include "backend/cuda/cuda_attn_chunk.cuh"
#include "backend/cuda/cuda_mq_device.cuh"

/* Rows r0 .. r0 + nr - 1 of query t into s_kv by cp.async (the split
 * kernels' staging holds a warp's four rows in registers, which here would
 * sit beside the running sums); waited for by the caller. */
__device__ __forceinline__ void cb_ap_stage(const cb_attn_args &a, int t, int64_t lo, int64_t n_raw, int64_t r0,
                                            int nr, float4 *s_kv)
{
    const int hd4 = a.hd >> 2, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float4 *src[CB_AS_ROWS / CB_AS_WARPS];
    cb_as_row_ptrs(a, t, lo, n_raw, r0, nr, src);
#pragma unroll
    for (int i = 0; i < CB_AS_ROWS / CB_AS_WARPS; i++)
        if (src[i])
            for (int c = lane; c < hd4; c += 32) ds4_mq_cp16(s_kv + (warp + i * CB_AS_WARPS) * hd4 + c, src[i] + c);
    ds4_mq_cp_commit();
}

/* The staged chunk's scores as cb_as_scores gives them (lane r: row r's,
 * -inf past nr), in two halves of 16 rows so that 16 partial sums a head
 * are live instead of 32: the lanes' halves of the columns meet first
 * (xor 16), then the transposing steps 8 .. 1 leave row 16 h + (r & 15)
 * on lanes r of half h's pass. */
__device__ __forceinline__ void cb_ap_scores(const float4 *s_kv, int nr, int hd4, float scale,
                                             const float4 (&q)[CB_AS_HPW][CB_AS_J], float (&mine)[CB_AS_HPW])
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int hh = 0; hh < CB_AS_HPW; hh++) mine[hh] = -INFINITY;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        if (half * 16 >= nr) break; /* uniform: nr is the block's */
        float x[CB_AS_HPW][16];
#pragma unroll
        for (int k = 0; k < 16; k++) cb_as_row_dot(s_kv, half * 16 + k, nr, hd4, q, x, k);
#pragma unroll
        for (int k = 0; k < 16; k++)
#pragma unroll
            for (int hh = 0; hh < CB_AS_HPW; hh++) x[hh][k] += __shfl_xor_sync(0xffffffffu, x[hh][k], 16);
        cb_as_transpose_step<8>(x, lane);
        cb_as_transpose_step<4>(x, lane);
        cb_as_transpose_step<2>(x, lane);
        cb_as_transpose_step<1>(x, lane);
        if ((lane >> 4) == half && lane < nr)
#pragma unroll
            for (int hh = 0; hh < CB_AS_HPW; hh++) mine[hh] = x[hh][0] * scale;
    }
}

/* grid (query t of the chunk, head group); dynamic shared memory:
 * CB_AS_ROWS * hd floats */
__global__ void __launch_bounds__(CB_AS_WARPS * 32, 2) cb_attn_prefill_kernel(cb_attn_args a)
{
    extern __shared__ float4 s_kv[];
    ds4_pdl_enter();
    a.pos0 = cb_pos(a.d_pos, a.pos0);
    const int t = (int)blockIdx.x;
    int64_t lo, n_raw;
    const int64_t n = cb_as_rows(a, t, &lo, &n_raw);
    const int hd4 = a.hd >> 2, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int hb = blockIdx.y * CB_AS_HEADS + warp * CB_AS_HPW;
    const bool has_heads = hb < a.n_heads; /* warp-uniform; such warps still stage rows */
    const float scale = 1.0f / sqrtf((float)a.hd);

    float4 q[CB_AS_HPW][CB_AS_J], o[CB_AS_HPW][CB_AS_J];
    float M[CB_AS_HPW], L[CB_AS_HPW];
    cb_as_load_q(a, t, hb, q);
#pragma unroll
    for (int hh = 0; hh < CB_AS_HPW; hh++) {
        M[hh] = hb + hh < a.n_heads ? a.sinks[hb + hh] : 0.f;
        L[hh] = 0.f;
#pragma unroll
        for (int j = 0; j < CB_AS_J; j++) o[hh][j] = make_float4(0.f, 0.f, 0.f, 0.f);
    }

    for (int64_t r0 = 0; r0 < n; r0 += CB_AS_ROWS) { /* n is the block's: every thread walks the same chunks */
        const int nr = n - r0 < CB_AS_ROWS ? (int)(n - r0) : CB_AS_ROWS;
        if (r0) __syncthreads(); /* every warp is done with the previous chunk */
        cb_ap_stage(a, t, lo, n_raw, r0, nr, s_kv);
        ds4_mq_cp_wait<0>();
        __syncthreads();
        if (!has_heads) continue;
        float mine[CB_AS_HPW], pw[CB_AS_HPW];
        cb_ap_scores(s_kv, nr, hd4, scale, q, mine);
#pragma unroll
        for (int hh = 0; hh < CB_AS_HPW; hh++) {
            float v = mine[hh];
            for (int s = 16; s > 0; s >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, s));
            const float mn = fmaxf(M[hh], v), alpha = expf(M[hh] - mn);
            pw[hh] = lane < nr ? expf(mine[hh] - mn) : 0.f;
            float sum = pw[hh];
            for (int s = 16; s > 0; s >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, s);
            L[hh] = L[hh] * alpha + sum;
            M[hh] = mn;
#pragma unroll
            for (int j = 0; j < CB_AS_J; j++) {
                o[hh][j].x *= alpha;
                o[hh][j].y *= alpha;
                o[hh][j].z *= alpha;
                o[hh][j].w *= alpha;
            }
        }
        cb_as_accumulate(s_kv, nr, hd4, pw, o);
    }
    if (!has_heads) return;

    const int rot4 = (a.hd - a.n_rot) >> 2; /* rope_om: (hd - n_rot) % 4 == 0 */
#pragma unroll
    for (int hh = 0; hh < CB_AS_HPW; hh++) {
        const int h = hb + hh;
        if (h >= a.n_heads) break;
        const float den = expf(a.sinks[h] - M[hh]) + L[hh];
        float4 *out = (float4 *)(a.out + ((size_t)t * a.n_heads + h) * a.hd);
#pragma unroll
        for (int j = 0; j < CB_AS_J; j++) {
            const int c4 = lane + 32 * j;
            if (c4 >= hd4) continue;
            float v[4] = {o[hh][j].x / den, o[hh][j].y / den, o[hh][j].z / den, o[hh][j].w / den};
            if (a.rope_om && c4 >= rot4) { /* rope(inverse)'s pairs k, k + 1 of the rotated dims */
                const int k = 2 * (c4 - rot4);
                cb_rope_pair(v, a.pos0 + t, __ldg(a.rope_om + k), 1);
                cb_rope_pair(v + 2, a.pos0 + t, __ldg(a.rope_om + k + 1), 1);
            }
            out[c4] = make_float4(v[0], v[1], v[2], v[3]);
        }
    }
}

bool cb_attention_prefill_takes(ds4_backend *be, const cb_attn_args &a)
{
    const cuda_backend *c = cb_of(be);
    return c->attn_split && c->attn_prefill_min > 0 && a.T >= c->attn_prefill_min && a.sinks &&
           cb_attention_split_fits(a);
}

void cb_attention_prefill(ds4_backend *be, const cb_attn_args &a)
{
    cuda_backend *c = cb_of(be);
    const bool tc = cb_attention_prefill_tc_takes(be, a);
    const size_t smem = (size_t)CB_AS_ROWS * a.hd * sizeof(float);
    if (!tc && smem > 48 * 1024 && c->attn_prefill_smem < smem) {
        cudaError_t e = cudaFuncSetAttribute((const void *)cb_attn_prefill_kernel,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) {
            cb_fail_status(be, ds4_fail(DS4_ERR_BACKEND, "cuda attention: %zu bytes of shared memory: %s", smem,
                                        cudaGetErrorString(e)),
                           "attention");
            return;
        }
        c->attn_prefill_smem = smem;
    }
    cb_graph_note(be, 42, a.q, a.kv, a.ring, a.comp, a.sinks, a.sel, a.T, a.n_heads, a.hd, a.window, a.ratio, a.topk,
                  a.pos0, a.out, a.rope_om, a.n_rot);
    if (cb_graph_dry(be)) return;
    if (tc) {
        cb_attention_prefill_tc(be, a);
        return;
    }
    const unsigned groups = (unsigned)((a.n_heads + CB_AS_HEADS - 1) / CB_AS_HEADS);
    ds4_launch(cb_attn_prefill_kernel, dim3((unsigned)a.T, groups), CB_AS_WARPS * 32, smem, cb_stream(be), a);
    cb_check_launch(be, "attention");
}

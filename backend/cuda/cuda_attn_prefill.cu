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
#pragma unroll
    for (int i = 0; i < CB_AS_ROWS / CB_AS_WARPS; i++) {
        const int r = warp + i * CB_AS_WARPS;
        src[i] = r < nr ? (const float4 *)cb_attn_row(a, t, lo, n_raw, r0 + r) : NULL;
    }
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
        for (int k = 0; k < 16; k++) {
            const int r = half * 16 + k;
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

/* Head h's output row of query t: o / den, its last n_rot dims rotated
 * back (rope_om: attention_out's epilogue, as the combine kernel does) */
__device__ __forceinline__ void cb_ap_store(const cb_attn_args &a, int t, int h, const float4 (&oh)[CB_AS_J], float den)
{
    const int hd4 = a.hd >> 2, lane = threadIdx.x & 31, rot4 = (a.hd - a.n_rot) >> 2; /* (hd - n_rot) % 4 == 0 */
    float4 *out = (float4 *)(a.out + ((size_t)t * a.n_heads + h) * a.hd);
#pragma unroll
    for (int j = 0; j < CB_AS_J; j++) {
        const int c4 = lane + 32 * j;
        if (c4 >= hd4) continue;
        float v[4] = {oh[j].x / den, oh[j].y / den, oh[j].z / den, oh[j].w / den};
        if (a.rope_om && c4 >= rot4) { /* rope(inverse)'s pairs k, k + 1 of the rotated dims */
            const int k = 2 * (c4 - rot4);
            cb_rope_pair(v, a.pos0 + t, __ldg(a.rope_om + k), 1);
            cb_rope_pair(v + 2, a.pos0 + t, __ldg(a.rope_om + k + 1), 1);
        }
        out[c4] = make_float4(v[0], v[1], v[2], v[3]);
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

#pragma unroll
    for (int hh = 0; hh < CB_AS_HPW; hh++)
        if (hb + hh < a.n_heads) cb_ap_store(a, t, hb + hh, o[hh], expf(a.sinks[hb + hh] - M[hh]) + L[hh]);
}

/* Four heads a warp (cb_attn_prefill4_kernel, DS4_CUDA_ATTN_PREFILL_HPW=4):
 * a staged row's float4 feeds 16 fmas instead of 8, so the kernel is no
 * longer bound by shared-memory loads (a 16-byte load a lane takes 4
 * cycles of the SM's 128 bytes a cycle, the 8 fmas 2), and a block's 8
 * warps serve 32 heads of one staging. Registers: q and o of 4 heads (128),
 * so one block an SM. Scores by quarters of 8 rows: 4 heads x 8 rows = 32
 * partial sums a lane, which the transposing reduction leaves one a lane:
 * lane r holds head r / 8, row 8 qq + r % 8 of quarter qq. */
#define CB_AP4_HPW 4
#define CB_AP4_HEADS (CB_AP4_HPW * CB_AS_WARPS)

template <int O> __device__ __forceinline__ void cb_ap4_transpose_step(float (&x)[32], int lane)
{
    const bool upper = (lane & O) != 0;
#pragma unroll
    for (int k = 0; k < O; k++) {
        const float send = upper ? x[k] : x[k + O], keep = upper ? x[k + O] : x[k];
        x[k] = keep + __shfl_xor_sync(0xffffffffu, send, O);
    }
}

/* max (is_max) or sum over the 8 lanes of a head group (lanes 8 h .. 8 h + 7) */
__device__ __forceinline__ float cb_ap4_group(float v, bool is_max)
{
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) {
        const float x = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, x) : v + x;
    }
    return v;
}

__global__ void __launch_bounds__(CB_AS_WARPS * 32, 1) cb_attn_prefill4_kernel(cb_attn_args a)
{
    extern __shared__ float4 s_kv[];
    ds4_pdl_enter();
    a.pos0 = cb_pos(a.d_pos, a.pos0);
    const int t = (int)blockIdx.x;
    int64_t lo, n_raw;
    const int64_t n = cb_as_rows(a, t, &lo, &n_raw);
    const int hd4 = a.hd >> 2, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int hb = blockIdx.y * CB_AP4_HEADS + warp * CB_AP4_HPW;
    const int my_h = lane >> 3; /* the head of this lane's scores */
    const bool has_heads = hb < a.n_heads;
    const float scale = 1.0f / sqrtf((float)a.hd);

    float4 q[CB_AP4_HPW][CB_AS_J], o[CB_AP4_HPW][CB_AS_J];
    float M[CB_AP4_HPW], L[CB_AP4_HPW];
#pragma unroll
    for (int hh = 0; hh < CB_AP4_HPW; hh++) {
        const float4 *qh = (const float4 *)(a.q + ((size_t)t * a.n_heads + hb + hh) * a.hd);
#pragma unroll
        for (int j = 0; j < CB_AS_J; j++) {
            const int c = lane + 32 * j;
            q[hh][j] = hb + hh < a.n_heads && c < hd4 ? qh[c] : make_float4(0.f, 0.f, 0.f, 0.f);
            o[hh][j] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
        M[hh] = hb + hh < a.n_heads ? a.sinks[hb + hh] : 0.f;
        L[hh] = 0.f;
    }

    for (int64_t r0 = 0; r0 < n; r0 += CB_AS_ROWS) {
        const int nr = n - r0 < CB_AS_ROWS ? (int)(n - r0) : CB_AS_ROWS;
        if (r0) __syncthreads();
        cb_ap_stage(a, t, lo, n_raw, r0, nr, s_kv);
        ds4_mq_cp_wait<0>();
        __syncthreads();
        if (!has_heads) continue;
        /* sc[qq]: this lane's score (head my_h, row 8 qq + lane % 8) */
        float sc[4];
#pragma unroll
        for (int qq = 0; qq < 4; qq++) {
            sc[qq] = -INFINITY;
            if (qq * 8 >= nr) continue; /* uniform */
            float x[32];
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const int r = qq * 8 + k;
#pragma unroll
                for (int hh = 0; hh < CB_AP4_HPW; hh++) x[hh * 8 + k] = 0.f;
                if (r < nr) {
#pragma unroll
                    for (int j = 0; j < CB_AS_J; j++) {
                        const int c = lane + 32 * j;
                        if (c < hd4) {
                            const float4 kv = s_kv[r * hd4 + c];
#pragma unroll
                            for (int hh = 0; hh < CB_AP4_HPW; hh++)
                                x[hh * 8 + k] += q[hh][j].x * kv.x + q[hh][j].y * kv.y + q[hh][j].z * kv.z +
                                                 q[hh][j].w * kv.w;
                        }
                    }
                }
            }
            cb_ap4_transpose_step<16>(x, lane);
            cb_ap4_transpose_step<8>(x, lane);
            cb_ap4_transpose_step<4>(x, lane);
            cb_ap4_transpose_step<2>(x, lane);
            cb_ap4_transpose_step<1>(x, lane);
            if (qq * 8 + (lane & 7) < nr) sc[qq] = x[0] * scale;
        }
        /* the chunk's max and sum per head, in every lane for all four */
        const float mine = cb_ap4_group(fmaxf(fmaxf(sc[0], sc[1]), fmaxf(sc[2], sc[3])), true);
        float mn[CB_AP4_HPW];
#pragma unroll
        for (int hh = 0; hh < CB_AP4_HPW; hh++) mn[hh] = fmaxf(M[hh], __shfl_sync(0xffffffffu, mine, hh * 8));
        float my_mn = mn[0];
#pragma unroll
        for (int hh = 1; hh < CB_AP4_HPW; hh++)
            if (my_h == hh) my_mn = mn[hh];
        float pw[4];
#pragma unroll
        for (int qq = 0; qq < 4; qq++) pw[qq] = sc[qq] == -INFINITY ? 0.f : expf(sc[qq] - my_mn);
        const float sum = cb_ap4_group((pw[0] + pw[1]) + (pw[2] + pw[3]), false);
#pragma unroll
        for (int hh = 0; hh < CB_AP4_HPW; hh++) {
            const float alpha = expf(M[hh] - mn[hh]);
            L[hh] = L[hh] * alpha + __shfl_sync(0xffffffffu, sum, hh * 8);
            M[hh] = mn[hh];
#pragma unroll
            for (int j = 0; j < CB_AS_J; j++) {
                o[hh][j].x *= alpha;
                o[hh][j].y *= alpha;
                o[hh][j].z *= alpha;
                o[hh][j].w *= alpha;
            }
        }
        /* o += p x rows: row 8 qq + k's weights sit on lanes 8 h + k */
#pragma unroll
        for (int qq = 0; qq < 4; qq++) {
            if (qq * 8 >= nr) break; /* uniform */
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const int r = qq * 8 + k;
                float pr[CB_AP4_HPW];
#pragma unroll
                for (int hh = 0; hh < CB_AP4_HPW; hh++) pr[hh] = __shfl_sync(0xffffffffu, pw[qq], hh * 8 + k);
                if (r >= nr) continue; /* uniform; the shuffles above stay warp-wide */
#pragma unroll
                for (int j = 0; j < CB_AS_J; j++) {
                    const int c = lane + 32 * j;
                    if (c < hd4) {
                        const float4 kv = s_kv[r * hd4 + c];
#pragma unroll
                        for (int hh = 0; hh < CB_AP4_HPW; hh++) {
                            o[hh][j].x += pr[hh] * kv.x;
                            o[hh][j].y += pr[hh] * kv.y;
                            o[hh][j].z += pr[hh] * kv.z;
                            o[hh][j].w += pr[hh] * kv.w;
                        }
                    }
                }
            }
        }
    }
    if (!has_heads) return;
#pragma unroll
    for (int hh = 0; hh < CB_AP4_HPW; hh++)
        if (hb + hh < a.n_heads) cb_ap_store(a, t, hb + hh, o[hh], expf(a.sinks[hb + hh] - M[hh]) + L[hh]);
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
    const size_t smem = (size_t)CB_AS_ROWS * a.hd * sizeof(float);
    if (smem > 48 * 1024 && c->attn_prefill_smem < smem) {
        const void *k[2] = {(const void *)cb_attn_prefill_kernel, (const void *)cb_attn_prefill4_kernel};
        for (int i = 0; i < 2; i++) {
            cudaError_t e = cudaFuncSetAttribute(k[i], cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
            if (e != cudaSuccess) {
                cb_fail_status(be, ds4_fail(DS4_ERR_BACKEND, "cuda attention: %zu bytes of shared memory: %s", smem,
                                            cudaGetErrorString(e)),
                               "attention");
                return;
            }
        }
        c->attn_prefill_smem = smem;
    }
    cb_graph_note(be, 42, a.q, a.kv, a.ring, a.comp, a.sinks, a.sel, a.T, a.n_heads, a.hd, a.window, a.ratio, a.topk,
                  a.pos0, a.out, a.rope_om, a.n_rot);
    if (cb_graph_dry(be)) return;
    if (c->attn_prefill_hpw == 4) {
        const unsigned groups = (unsigned)((a.n_heads + CB_AP4_HEADS - 1) / CB_AP4_HEADS);
        ds4_launch(cb_attn_prefill4_kernel, dim3((unsigned)a.T, groups), CB_AS_WARPS * 32, smem, cb_stream(be), a);
    } else {
        const unsigned groups = (unsigned)((a.n_heads + CB_AS_HEADS - 1) / CB_AS_HEADS);
        ds4_launch(cb_attn_prefill_kernel, dim3((unsigned)a.T, groups), CB_AS_WARPS * 32, smem, cb_stream(be), a);
    }
    cb_check_launch(be, "attention");
}

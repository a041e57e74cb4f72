/*
 * cuda_attn_split.cu - sparse attention with sinks (§3.4) split across
 * blocks (flash decoding), the default attention kernel (DS4_CUDA_ATTN=0
 * selects the one-block-per-(query, head) kernel of cuda_ops_attention.cu).
 *
 * All heads read the same KV rows (MQA), so a block takes a chunk of
 * CB_AS_ROWS rows for a group of CB_AS_HEADS heads: it stages the rows in
 * shared memory once, each warp scores them for its CB_AS_HPW heads (q in
 * registers), and writes the chunk's softmax partials (max m, sum l of
 * exp(s - m), o = sum exp(s - m) * row) to scratch. A second kernel, one
 * block per (query, head), merges the chunks in index order with the sink
 * logit: out = sum_c exp(m_c - M) o_c / (exp(sink - M) + sum_c exp(m_c - M)
 * l_c), M = max(sink, m_c). Fixed order everywhere, so results are
 * deterministic; the sums are reordered against the CPU (within the
 * contract's tolerance, like the kernel it replaces).
 *
 * The grid is sized for the planned maximum row count (a.max_rows) and
 * blocks past the query's rows exit at once, so a recorded decode graph
 * serves every position (the row count comes from the device position).
 */
#include "backend/cuda/cuda_attn_chunk.cuh"
#include "backend/cuda/cuda_mmvq.cuh"
#include "backend/cuda/cuda_q8m.cuh"

#define CB_AS_COMBINE_THREADS 128
/* partial bytes per launch at 32 rows a chunk (prefill slices its tokens) */
#define CB_AS_SCRATCH_MAX ((size_t)64 << 20)

/* The partials' cap for chunks of rpc rows: scaled so that shorter chunks
 * (DS4_CUDA_ATTN_R16) take as many queries a launch as 32-row ones (16
 * sessions at a 2K frontier: 84 MB at 16 rows, which the unscaled cap
 * would send to one launch a sequence). */
static size_t cb_as_scratch_cap(int rpc)
{
    return rpc < CB_AS_ROWS ? CB_AS_SCRATCH_MAX / rpc * CB_AS_ROWS : CB_AS_SCRATCH_MAX;
}

/* grid (chunk, head group, z); query t of a's chunk, its partials at slot
 * tl = blockIdx.z of part [tl][head][chunk][hd] and ml [tl][head][chunk] =
 * (m, l). Dynamic shared memory: CB_AS_ROWS * hd floats. a.pos0 is the
 * effective position. */
__device__ __forceinline__ void cb_attn_split_body(const cb_attn_args &a, int t, int max_chunks, float4 *part,
                                                   float2 *ml)
{
    extern __shared__ float4 s_kv[];
    const int tl = blockIdx.z, chunk = blockIdx.x;
    int64_t lo, n_raw;
    const int64_t n = cb_as_rows(a, t, &lo, &n_raw);
    const int64_t r0 = (int64_t)chunk * CB_AS_ROWS;
    if (r0 >= n) { /* uniform over the block; empty partials (-inf, 0): the combine's early form merges every chunk */
        const int h = (int)blockIdx.y * CB_AS_HEADS + (int)threadIdx.x;
        if ((int)threadIdx.x < CB_AS_HEADS && h < a.n_heads)
            ml[((size_t)tl * a.n_heads + h) * max_chunks + chunk] = make_float2(-INFINITY, 0.f);
        return;
    }
    const int nr = n - r0 < CB_AS_ROWS ? (int)(n - r0) : CB_AS_ROWS;
    const int hd4 = a.hd >> 2, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int hb = blockIdx.y * CB_AS_HEADS + warp * CB_AS_HPW;

    cb_as_stage(a, t, lo, n_raw, r0, nr, s_kv);
    float4 q[CB_AS_HPW][CB_AS_J];
    cb_as_load_q(a, t, hb, q);
    __syncthreads(); /* the last barrier: warps without heads may leave */
    if (hb >= a.n_heads) return;

    float mine[CB_AS_HPW];
    cb_as_scores(s_kv, nr, hd4, 1.0f / sqrtf((float)a.hd), q, mine);

    /* the chunk's softmax: m = max, pw = exp(s - m) (0 past the rows), l = sum */
    float m[CB_AS_HPW], l[CB_AS_HPW], pw[CB_AS_HPW];
#pragma unroll
    for (int hh = 0; hh < CB_AS_HPW; hh++) {
        float v = mine[hh];
        for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
        m[hh] = v;
        pw[hh] = lane < nr ? expf(mine[hh] - v) : 0.f;
        float sum = pw[hh];
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        l[hh] = sum;
    }

    float4 o[CB_AS_HPW][CB_AS_J];
#pragma unroll
    for (int hh = 0; hh < CB_AS_HPW; hh++)
#pragma unroll
        for (int j = 0; j < CB_AS_J; j++) o[hh][j] = make_float4(0.f, 0.f, 0.f, 0.f);
    cb_as_accumulate(s_kv, nr, hd4, pw, o);
#pragma unroll
    for (int hh = 0; hh < CB_AS_HPW; hh++) {
        if (hb + hh >= a.n_heads) break;
        const size_t at = ((size_t)tl * a.n_heads + hb + hh) * max_chunks + chunk;
#pragma unroll
        for (int j = 0; j < CB_AS_J; j++) {
            const int c = lane + 32 * j;
            if (c < hd4) part[at * hd4 + c] = o[hh][j];
        }
        if (lane == 0) ml[at] = make_float2(m[hh], l[hh]);
    }
}

/* z: the token of the slice t0 .. of one sequence's chunk */
__global__ void __launch_bounds__(CB_AS_WARPS * 32)
    cb_attn_split_kernel(cb_attn_args a, int t0, int max_chunks, float4 *part, float2 *ml)
{
    ds4_pdl_enter();
    a.pos0 = cb_pos(a.d_pos, a.pos0);
    cb_attn_split_body(a, t0 + (int)blockIdx.z, max_chunks, part, ml);
}

/* z: sequence z's one query (attention_out_seqs) */
__global__ void __launch_bounds__(CB_AS_WARPS * 32)
    cb_attn_split_seqs_kernel(const __grid_constant__ cb_attn_seqs S, int max_chunks, float4 *part, float2 *ml)
{
    ds4_pdl_enter();
    cb_attn_args a = S.a[blockIdx.z];
    a.pos0 = cb_pos(a.d_pos, a.pos0);
    cb_attn_split_body(a, 0, max_chunks, part, ml);
}

/* max (is_max) or sum of v over the block, in a fixed order; every thread
 * gets it. red: 32 floats of shared memory. */
__device__ float cb_as_block_fold(float v, bool is_max, float *red)
{
    for (int o = 16; o > 0; o >>= 1) {
        const float x = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, x) : v + x;
    }
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    v = red[0];
    for (int k = 1; k < (int)(blockDim.x >> 5); k++) v = is_max ? fmaxf(v, red[k]) : v + red[k];
    __syncthreads(); /* red is reused */
    return v;
}

/* The rotation of column c4's two pairs (rope(inverse) of the rotated
 * dims), made before the combine's dependency wait (PRE); on = 0 where
 * the column is not rotated. */
struct cb_as_rot {
    float c[2], s[2];
    int on;
};
__device__ __forceinline__ cb_as_rot cb_as_rot_of(const cb_attn_args &a, int t, int c4)
{
    cb_as_rot r = {};
    const int rot4 = (a.hd - a.n_rot) >> 2;
    if (!a.rope_om || c4 < rot4 || c4 >= (a.hd >> 2)) return r;
    const int k = 2 * (c4 - rot4);
    cb_rope_cs(a.pos0 + t, __ldg(a.rope_om + k), 1, &r.c[0], &r.s[0]);
    cb_rope_cs(a.pos0 + t, __ldg(a.rope_om + k + 1), 1, &r.c[1], &r.s[1]);
    r.on = 1;
    return r;
}

/* out[c4] of head h, query t: acc / den, the rotated dims turned back
 * (rope_om: (hd - n_rot) % 4 == 0), by rot where it is given (PRE) */
__device__ __forceinline__ void cb_as_combine_out(const cb_attn_args &a, int t, int h, int c4, float4 acc, float den,
                                                  const cb_as_rot *rot = NULL)
{
    const int rot4 = (a.hd - a.n_rot) >> 2;
    float4 *out = (float4 *)(a.out + ((size_t)t * a.n_heads + h) * a.hd);
    float v[4] = {acc.x / den, acc.y / den, acc.z / den, acc.w / den};
    if (rot) {
        if (rot->on) cb_rope_rot(v, rot->c[0], rot->s[0]), cb_rope_rot(v + 2, rot->c[1], rot->s[1]);
    } else if (a.rope_om && c4 >= rot4) { /* rope(inverse)'s pairs k, k + 1 of the rotated dims */
        const int k = 2 * (c4 - rot4);
        cb_rope_pair(v, a.pos0 + t, __ldg(a.rope_om + k), 1);
        cb_rope_pair(v + 2, a.pos0 + t, __ldg(a.rope_om + k + 1), 1);
    }
    out[c4] = make_float4(v[0], v[1], v[2], v[3]);
    if (a.q8) { /* every lane of the warp is here (cb_attention_split_q8_fits): 8 lanes a block of 32 */
        float amax = fmaxf(fmaxf(fmaxf(0.0f, fabsf(v[0])), fmaxf(fabsf(v[1]), fabsf(v[2]))), fabsf(v[3]));
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const float id = ds4_mmvq_q8_0_id(amax);
        const size_t at = ((size_t)t * a.n_heads + h) * a.hd + 4 * (size_t)c4;
        *(uint32_t *)(a.q8 + at) = (uint32_t)(uint8_t)ds4_mmvq_q8_0_q(v[0], id) |
                                   (uint32_t)(uint8_t)ds4_mmvq_q8_0_q(v[1], id) << 8 |
                                   (uint32_t)(uint8_t)ds4_mmvq_q8_0_q(v[2], id) << 16 |
                                   (uint32_t)(uint8_t)ds4_mmvq_q8_0_q(v[3], id) << 24;
        if ((c4 & 7) == 0) a.q8d[at / 32] = ds4_mmvq_q8_0_d(amax);
    }
    if (a.q8m) { /* the same, with the lanes as above (cb_attention_split_q8_fits), in the fragment order */
        float amax = fmaxf(fmaxf(fmaxf(0.0f, fabsf(v[0])), fmaxf(fabsf(v[1]), fabsf(v[2]))), fabsf(v[3]));
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const float id = ds4_mmvq_q8_0_id(amax);
        const int64_t at = (int64_t)h * a.hd + 4 * c4, blk = at >> 5; /* in the token's row */
        *(uint32_t *)(a.q8m + qm_frag_at(a.q8m_tok, blk, (int)(at & 31))) =
            (uint32_t)(uint8_t)ds4_mmvq_q8_0_q(v[0], id) | (uint32_t)(uint8_t)ds4_mmvq_q8_0_q(v[1], id) << 8 |
            (uint32_t)(uint8_t)ds4_mmvq_q8_0_q(v[2], id) << 16 | (uint32_t)(uint8_t)ds4_mmvq_q8_0_q(v[3], id) << 24;
        if ((c4 & 7) == 0) a.q8md[blk * QM_TOK + a.q8m_tok] = ds4_mmvq_q8_0_d(amax);
    }
}

__device__ __forceinline__ void cb_as_fma4(float4 &acc, float w, const float4 v)
{
    acc.x += w * v.x;
    acc.y += w * v.y;
    acc.z += w * v.z;
    acc.w += w * v.w;
}

/* grid (head, y); query t of a's chunk, its partials at slot tl =
 * blockIdx.y; dynamic shared memory: max_chunks floats. P = 1: a thread a
 * float4 column sums the chunks in order. P = 4 (DS4_CUDA_ATTN_COMB4):
 * 4 x 128 threads, part p of a column sums chunks p, p + 4, ... in order
 * and the parts are added as (0 + 1) + (2 + 3): a quarter of the
 * dependent loads a thread when a query has many chunks. EARLY
 * (DS4_CUDA_ATTN_COMB_EARLY, below): the caller read the sink and the
 * position before its dependency wait, and the query's row count is not
 * taken: every chunk of max_chunks is merged, those past the rows by their
 * (-inf, 0) partials (written by the split kernels' blocks that leave
 * early), and a chunk of weight 0 is skipped, which adds nothing the sum
 * would not (0 x a finite value): the same bits, without the selected ids'
 * scan and its two barriers on the kernel's path. */
/* PRE (DS4_CUDA_ATTN_COMB_PRE, with EARLY and P = 1, a column a thread):
 * the thread's rotation made before the wait (rot), and every chunk's
 * partial loaded with no branch between the loads, a chunk of weight 0
 * keeping the sum as it was (a select, where EARLY's skip was a branch
 * around each load): the same sums, so the same bits. A chunk past the
 * query's rows may hold an earlier step's partial; it is loaded (inside
 * the buffer) and not used. */
template <int P, bool EARLY, bool PRE = false>
__device__ __forceinline__ void cb_attn_combine_body(const cb_attn_args &a, int t, int max_chunks, int rpc,
                                                     const float4 *part, const float2 *ml, float sink,
                                                     const cb_as_rot &rot)
{
    static_assert(P == 1 || P == 4, "one part or four");
    static_assert(!PRE || (EARLY && P == 1), "the early form's columns a thread");
    extern __shared__ float s_w[];
    __shared__ float red[32];
    const int h = blockIdx.x, tl = blockIdx.y;
    int nch = max_chunks;
    if (!EARLY) {
        int64_t lo, n_raw;
        const int64_t n = cb_as_rows(a, t, &lo, &n_raw);
        nch = (int)((n + rpc - 1) / rpc);
    }
    const size_t at = ((size_t)tl * a.n_heads + h) * max_chunks;
    float mx = sink;
    for (int c = threadIdx.x; c < nch; c += blockDim.x) mx = fmaxf(mx, ml[at + c].x);
    mx = cb_as_block_fold(mx, true, red);
    const bool kt = (blockIdx.x | blockIdx.y | threadIdx.x) == 0;
    ds4_kt_phase(kt, DS4_KT_ATTN_COMBINE, 0);
    float l = 0.f;
    for (int c = threadIdx.x; c < nch; c += blockDim.x) {
        const float2 v = ml[at + c];
        const float w = expf(v.x - mx);
        s_w[c] = w;
        l += v.y * w;
    }
    l = cb_as_block_fold(l, false, red); /* its barriers also publish s_w */
    ds4_kt_phase(kt, DS4_KT_ATTN_COMBINE, 1);
    const float den = expf(sink - mx) + l;
    const int hd4 = a.hd >> 2;
    if (a.ring_w && h == 0 && t >= a.T - a.window) { /* ring_push's rows: the last `window` of the chunk */
        const float4 *src = (const float4 *)(a.kv + (size_t)t * a.hd);
        float4 *dst = (float4 *)(a.ring_w + (size_t)((a.pos0 + t) % a.window) * a.hd);
        for (int c4 = threadIdx.x; c4 < hd4; c4 += blockDim.x) dst[c4] = src[c4];
    }
    if (PRE) { /* hd4 <= blockDim.x (the launch's check): one column a thread */
        const int c4 = threadIdx.x;
        if (c4 < hd4) {
            float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
            const float4 *src = part + at * hd4 + c4;
#pragma unroll 8
            for (int c = 0; c < nch; c++) {
                const float w = s_w[c];
                float4 n = acc;
                cb_as_fma4(n, w, src[(size_t)c * hd4]);
                acc = w != 0.f ? n : acc;
            }
            cb_as_combine_out(a, t, h, c4, acc, den, &rot);
        }
        ds4_kt_phase(kt, DS4_KT_ATTN_COMBINE, 2);
        return;
    }
    if (P == 1) {
        for (int c4 = threadIdx.x; c4 < hd4; c4 += blockDim.x) {
            float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
            const float4 *src = part + at * hd4 + c4;
#pragma unroll 8
            for (int c = 0; c < nch; c++)
                if (!EARLY || s_w[c] != 0.f) cb_as_fma4(acc, s_w[c], src[(size_t)c * hd4]);
            cb_as_combine_out(a, t, h, c4, acc, den);
        }
        ds4_kt_phase(kt, DS4_KT_ATTN_COMBINE, 2);
        return;
    }
    /* hd4 <= 128 (cb_attention_split_fits) */
    __shared__ float4 s_acc[P > 1 ? P - 1 : 1][CB_AS_COMBINE_THREADS];
    const int c4 = threadIdx.x % CB_AS_COMBINE_THREADS, pt = threadIdx.x / CB_AS_COMBINE_THREADS;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (c4 < hd4) {
        const float4 *src = part + at * hd4 + c4;
#pragma unroll 4
        for (int c = pt; c < nch; c += P)
            if (!EARLY || s_w[c] != 0.f) cb_as_fma4(acc, s_w[c], src[(size_t)c * hd4]);
    }
    if (pt > 0) s_acc[pt - 1][c4] = acc;
    __syncthreads();
    if (pt > 0 || c4 >= hd4) return;
    const float4 a1 = s_acc[0][c4], a2 = s_acc[1][c4], a3 = s_acc[2][c4];
    acc = make_float4((acc.x + a1.x) + (a2.x + a3.x), (acc.y + a1.y) + (a2.y + a3.y), (acc.z + a1.z) + (a2.z + a3.z),
                      (acc.w + a1.w) + (a2.w + a3.w));
    cb_as_combine_out(a, t, h, c4, acc, den);
    ds4_kt_phase(kt, DS4_KT_ATTN_COMBINE, 2);
}

/* The combine's entry: the dependency wait, and the position and the
 * sink (a weight) read after it or (EARLY) before it, beside the split
 * kernel's last blocks (the position is copied before the step's first
 * kernel). */
template <bool EARLY, bool PRE = false>
__device__ __forceinline__ float cb_as_combine_enter(cb_attn_args &a, int t, cb_as_rot *rot)
{
    float sink = 0.f;
    if (EARLY) {
        a.pos0 = cb_pos(a.d_pos, a.pos0);
        sink = a.sinks[blockIdx.x];
    }
    if (PRE) *rot = cb_as_rot_of(a, t, (int)threadIdx.x); /* its double sine and cosine beside the split's tail */
    ds4_pdl_enter();
    ds4_kt_start((blockIdx.x | blockIdx.y | threadIdx.x) == 0, DS4_KT_ATTN_COMBINE); /* phase times (DS4_CUDA_KTIME) */
    if (!EARLY) {
        a.pos0 = cb_pos(a.d_pos, a.pos0);
        sink = a.sinks[blockIdx.x];
    }
    return sink;
}

/* y: the token of the slice t0 .. of one sequence's chunk */
template <int P, bool EARLY, bool PRE = false>
__global__ void __launch_bounds__(CB_AS_COMBINE_THREADS * P)
    cb_attn_combine_kernel(cb_attn_args a, int t0, int max_chunks, int rpc, const float4 *part, const float2 *ml)
{
    cb_as_rot rot = {};
    const float sink = cb_as_combine_enter<EARLY, PRE>(a, t0 + (int)blockIdx.y, &rot);
    cb_attn_combine_body<P, EARLY, PRE>(a, t0 + (int)blockIdx.y, max_chunks, rpc, part, ml, sink, rot);
}

/* y: sequence y's one query (attention_out_seqs) */
template <int P, bool EARLY, bool PRE = false>
__global__ void __launch_bounds__(CB_AS_COMBINE_THREADS * P)
    cb_attn_combine_seqs_kernel(const __grid_constant__ cb_attn_seqs S, int max_chunks, int rpc, const float4 *part,
                                const float2 *ml)
{
    cb_attn_args a = S.a[blockIdx.y];
    cb_as_rot rot = {};
    const float sink = cb_as_combine_enter<EARLY, PRE>(a, 0, &rot);
    cb_attn_combine_body<P, EARLY, PRE>(a, 0, max_chunks, rpc, part, ml, sink, rot);
}

/* The combine above (DS4_CUDA_ATTN_COMB_EARLY=0: the one that takes the
 * row count, for A/B; the same bits) without the row count, its constants read before the
 * wait. Why: at full size the combine takes 7.6 us a layer in the
 * replayed step for ~1 us of loads, a chain of dependent round trips
 * (position, selected ids, two barriers, partials' weights, two more,
 * partials, RoPE table) after the split kernel's last block. */
static bool cb_comb_early_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_ATTN_COMB_EARLY", &on);
}

/* DS4_CUDA_ATTN_COMB4=1 (opt-in until measured): the combine in four parts
 * a column (above); the same for a batched step and a single decode, so
 * their numbers agree. */
static bool cb_comb4_on(void)
{
    static int on = -1;
    return ds4_env_flag_on("DS4_CUDA_ATTN_COMB4", &on);
}

/* DS4_CUDA_ATTN_COMB_PRE=1 (opt-in: one H100 run below the defaults; the same numbers;
 * read once): the early combine's PRE form (above), where the heads are at
 * most a block's columns. Why: in-graph its output phase took ~4.4 us
 * after the weights were folded (forty-first session's phase times, H100,
 * 2K), for a few loads of partials a column and the rotated columns'
 * double sines and cosines. */
static bool cb_comb_pre_on(void)
{
    static int on = -1;
    return ds4_env_flag_on("DS4_CUDA_ATTN_COMB_PRE", &on);
}

/* The combine kernels the switches pick (hd: the heads' width, for PRE),
 * and their threads a block */
typedef void (*cb_as_combine_fn)(cb_attn_args, int, int, int, const float4 *, const float2 *);
typedef void (*cb_as_combine_seqs_fn)(cb_attn_seqs, int, int, const float4 *, const float2 *);
static bool cb_comb_pre(int hd)
{
    return cb_comb_pre_on() && cb_comb_early_on() && !cb_comb4_on() && hd <= 4 * CB_AS_COMBINE_THREADS;
}
static cb_as_combine_fn cb_as_combine_pick(int hd)
{
    if (cb_comb_pre(hd)) return cb_attn_combine_kernel<1, true, true>;
    if (cb_comb4_on()) return cb_comb_early_on() ? cb_attn_combine_kernel<4, true> : cb_attn_combine_kernel<4, false>;
    return cb_comb_early_on() ? cb_attn_combine_kernel<1, true> : cb_attn_combine_kernel<1, false>;
}
static cb_as_combine_seqs_fn cb_as_combine_seqs_pick(int hd)
{
    if (cb_comb_pre(hd)) return cb_attn_combine_seqs_kernel<1, true, true>;
    if (cb_comb4_on())
        return cb_comb_early_on() ? cb_attn_combine_seqs_kernel<4, true> : cb_attn_combine_seqs_kernel<4, false>;
    return cb_comb_early_on() ? cb_attn_combine_seqs_kernel<1, true> : cb_attn_combine_seqs_kernel<1, false>;
}
static unsigned cb_as_combine_threads(void) { return CB_AS_COMBINE_THREADS * (cb_comb4_on() ? 4 : 1); }

/* The combine of queries t0 .. t0 + tn - 1 (grid y) */
static void cb_as_combine_launch(ds4_backend *be, const cb_attn_args &a, int t0, unsigned tn, int max_chunks, int rpc,
                                 const float4 *part, const float2 *ml)
{
    ds4_launch(cb_as_combine_pick(a.hd), dim3((unsigned)a.n_heads, tn), cb_as_combine_threads(),
               (size_t)max_chunks * sizeof(float), cb_stream(be), a, t0, max_chunks, rpc, part, ml);
}

static bool cb_as_aligned(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* hd / 4 == the combine's threads: with one part (P = 1) each thread takes
 * one float4 column, with four the first 128 threads do the stores; either
 * way whole warps reach the shuffles */
bool cb_attention_split_q8_fits(const cb_attn_args &a) { return a.T == 1 && a.hd == 4 * CB_AS_COMBINE_THREADS; }

bool cb_attention_split_fits(const cb_attn_args &a)
{
    return a.hd > 0 && a.hd % 4 == 0 && a.hd <= 4 * 32 * CB_AS_J && a.n_heads > 0 && cb_as_aligned(a.q) &&
           cb_as_aligned(a.kv) && cb_as_aligned(a.ring) && cb_as_aligned(a.comp) && cb_as_aligned(a.out);
}

/* The kernels' shared memory beyond 48 KB (once per backend). */
static bool cb_as_smem(ds4_backend *be, size_t smem)
{
    cuda_backend *c = cb_of(be);
    if (smem <= 48 * 1024 || c->attn_split_smem >= smem) return true;
    const void *k[2] = {(const void *)cb_attn_split_kernel, (const void *)cb_attn_split_seqs_kernel};
    for (int i = 0; i < 2; i++) {
        cudaError_t e = cudaFuncSetAttribute(k[i], cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) {
            cb_fail_status(be, ds4_fail(DS4_ERR_BACKEND, "cuda attention: %zu bytes of shared memory: %s", smem,
                                        cudaGetErrorString(e)),
                           "attention");
            return false;
        }
    }
    c->attn_split_smem = smem;
    return true;
}

static_assert(sizeof(cb_attn_seqs) <= 4000, "the sequences' arguments must fit a kernel's parameters");

bool cb_attention_split_seqs(ds4_backend *be, const cb_attn_args *as, int n)
{
    if (n < 1 || n > CB_ATTN_SEQS_MAX) return false;
    cb_attn_seqs S;
    memset(&S, 0, sizeof S);
    int64_t max_rows = 0;
    for (int i = 0; i < n; i++) {
        if (as[i].T != 1 || as[i].n_heads != as[0].n_heads || as[i].hd != as[0].hd || !cb_attention_split_fits(as[i]))
            return false;
        max_rows = as[i].max_rows > max_rows ? as[i].max_rows : max_rows;
        S.a[i] = as[i];
    }
    const int n_heads = as[0].n_heads, hd = as[0].hd;
    /* rows a chunk: the tensor-core walk's (cb_attention_tc_split_rows) or 32 */
    const int tc_rows = cb_attention_tc_split_rows(be, as[0]);
    const int rpc = tc_rows ? tc_rows : CB_AS_ROWS;
    const int max_chunks = (int)((max_rows + rpc - 1) / rpc);
    const size_t per_tok = (size_t)n_heads * (size_t)max_chunks * ((size_t)hd + 2) * sizeof(float);
    if (per_tok * (size_t)n > cb_as_scratch_cap(rpc)) return false;
    float *scratch = (float *)cb_scratch(be, 2, (size_t)n * per_tok);
    if (!scratch) return true;
    float4 *part = (float4 *)scratch;
    float2 *ml = (float2 *)(scratch + (size_t)n * n_heads * max_chunks * hd);
    const size_t smem = (size_t)CB_AS_ROWS * hd * sizeof(float);
    if (!tc_rows && !cb_as_smem(be, smem)) return true;
    for (int i = 0; i < n; i++) {
        const cb_attn_args &a = as[i];
        cb_graph_note(be, 41, a.q, a.kv, a.ring, a.comp, a.sinks, a.sel, a.n_heads, a.hd, a.window, a.ratio, a.topk,
                      a.pos0, a.out, a.ring_w, a.rope_om, a.n_rot);
    }
    cb_graph_note(be, 41, n, scratch, max_chunks, rpc);
    if (cb_graph_dry(be)) return true;
    if (tc_rows) {
        if (!cb_attention_tc_split_seqs(be, S, n, rpc, max_chunks, (float *)part, ml)) return true;
    } else {
        const unsigned groups = (unsigned)((n_heads + CB_AS_HEADS - 1) / CB_AS_HEADS);
        ds4_launch(cb_attn_split_seqs_kernel, dim3((unsigned)max_chunks, groups, (unsigned)n), CB_AS_WARPS * 32, smem,
                   cb_stream(be), S, max_chunks, part, ml);
    }
    ds4_launch(cb_as_combine_seqs_pick(hd), dim3((unsigned)n_heads, (unsigned)n), cb_as_combine_threads(),
               (size_t)max_chunks * sizeof(float), cb_stream(be), S, max_chunks, rpc, (const float4 *)part,
               (const float2 *)ml);
    cb_check_launch(be, "attention_out_seqs");
    return true;
}

static bool cb_attn_twice(void)
{
    static int on = -1;
    return ds4_env_flag_on("DS4_CUDA_ATTN_TWICE", &on);
}

bool cb_attention_split(ds4_backend *be, const cb_attn_args &a)
{
    cuda_backend *c = cb_of(be);
    /* rows a chunk: the tensor-core walk's (cb_attention_tc_split_rows) or 32 */
    const int tc_rows = cb_attention_tc_split_rows(be, a);
    const int rpc = tc_rows ? tc_rows : CB_AS_ROWS;
    const int max_chunks = (int)((a.max_rows + rpc - 1) / rpc);
    const size_t per_tok = (size_t)a.n_heads * (size_t)max_chunks * ((size_t)a.hd + 2) * sizeof(float);
    size_t ts = cb_as_scratch_cap(rpc) / per_tok;
    if (ts < 1) ts = 1;
    if (ts > (size_t)a.T) ts = (size_t)a.T;
    if (ts > 65535) ts = 65535;
    if ((a.ring_w || a.rope_om) && ts < (size_t)a.T) return false;
    float *scratch = (float *)cb_scratch(be, 2, ts * per_tok);
    if (!scratch || !a.sinks) return true;
    float4 *part = (float4 *)scratch;
    float2 *ml = (float2 *)(scratch + ts * (size_t)a.n_heads * max_chunks * a.hd);
    const size_t smem = (size_t)CB_AS_ROWS * a.hd * sizeof(float);
    if (!tc_rows && !cb_as_smem(be, smem)) return true;
    cb_graph_note(be, 40, a.q, a.kv, a.ring, a.comp, a.sinks, a.sel, a.T, a.n_heads, a.hd, a.window, a.ratio, a.topk,
                  a.pos0, a.out, scratch, max_chunks, (long long)ts, a.ring_w, a.rope_om, a.n_rot, rpc, a.q8, a.q8d);
    if (cb_graph_dry(be)) return true;
    const unsigned groups = (unsigned)((a.n_heads + CB_AS_HEADS - 1) / CB_AS_HEADS);
    for (int t0 = 0; t0 < a.T; t0 += (int)ts) {
        const unsigned tn = (unsigned)(a.T - t0 < (int)ts ? a.T - t0 : (int)ts);
        if (tc_rows) {
            if (!cb_attention_tc_split(be, a, t0, (int)tn, rpc, max_chunks, (float *)part, ml)) return true;
            /* DS4_CUDA_ATTN_TWICE=1 (a diagnostic, same results): the split
             * kernel and the combine again on the same inputs, so that the
             * in-graph times (DS4_CUDA_KTIME) show what a second launch,
             * its code and constants warm, costs */
            if (cb_attn_twice() && !cb_attention_tc_split(be, a, t0, (int)tn, rpc, max_chunks, (float *)part, ml))
                return true;
        } else {
            ds4_launch(cb_attn_split_kernel, dim3((unsigned)max_chunks, groups, tn), CB_AS_WARPS * 32, smem,
                       cb_stream(be), a, t0, max_chunks, part, ml);
        }
        for (int k = 0; k < (tc_rows && cb_attn_twice() ? 2 : 1); k++) /* twice: its ring push writes the same row */
            cb_as_combine_launch(be, a, t0, tn, max_chunks, rpc, part, ml);
    }
    cb_check_launch(be, "attention");
    return true;
}

/*
 * cuda_attn_prefill_tc.cu - a prefill chunk's sparse attention with sinks
 * (§3.4) on the tensor cores: the one-pass walk of cuda_attn_prefill.cu
 * (a block per query and head group, a query's rows 32 at a time, each
 * head's running max M, sum L and weighted row sum o kept in registers),
 * with the scores and the weighted sum as tf32 mma.
 *
 * Why: the CUDA-core kernel does 172 GFLOP a 2048-token layer of Flash (64
 * heads of 512 over ~640 rows a query) at ~45 TFLOPS, near the fp32 FMA
 * peak: 3.8 ms, 27% of the prefill step (docs/BENCHMARKS.md, thirteenth
 * session). Scores are a 16-head x 8-row x 8-dim mma (A = the queries,
 * B = the staged rows), the weighted sum a 16-head x 8-dim x 8-row one
 * (A = the probabilities, B = the same rows: K = V).
 *
 * Exactness (fp32-grade, as the CUDA-core kernel; cuda_tf32.cuh says
 * why): the KV rows are tf32 values in the official numerics (f16
 * storage, dsv4-model.md §4.1 D3) and go in as they are; the queries and
 * the probabilities are fp32 and go in as two tf32 terms. A row value
 * that is not tf32 (reference numerics, or the tests' random
 * rows) is split the same way and its lo term takes a third mma. Each
 * warp checks its quarter of a chunk once (the low 13 bits of every
 * value, 16-byte loads) and takes the split form only where it must, so
 * both numerics get fp32-grade results and the official one pays for two
 * terms and no split work on the rows (a vote per fragment pair instead,
 * with the split work always done, took 1.93 ms a 2048-token layer of the
 * 8-layer model against 1.69: docs/BENCHMARKS.md, fourteenth session).
 *
 * Layout: a block is one query and 64 heads in 16 warps (Flash; heads in
 * 32s but not 64s, or DS4_CUDA_ATTN_TC64=0: 32 heads in 8 warps), warp
 * (ht, qd) the heads 16 ht .. 16 ht + 15 and the dims 128 qd .. 128 qd +
 * 127. Each warp scores its 16 heads over its 128 dims for all rows of a
 * chunk (16 rows at 64 heads, 32 at 32: the queries' shared memory grows
 * by what the stages give up); the
 * four quarters' partial scores meet through shared memory (added in
 * quarter order, so all four warps hold the same scores and the same
 * softmax), and each warp then adds p x row over its 128 dims of o (64
 * accumulators a thread). The block's queries sit in shared memory (in
 * registers, 64 a thread beside o, they made the loop spill). Rows are
 * staged by cp.async two chunks deep (the next chunk lands during this
 * one's math), 516 floats apart so the fragment loads are free of bank
 * conflicts. Why 64 heads: at 32 a block each query's rows were staged
 * twice from L2 (~5.4 GB a 2048-token CSA layer at an 8K frontier) by one
 * 8-warp block an SM; 64 heads stage them once with 16 warps an SM. The probabilities go from the scores' accumulators to the
 * weighted sum's A operand without a shuffle: the A operand's column k
 * stands for row 2k (k < 4) or 2 (k - 4) + 1 of the 8, so thread (g, t)'s
 * scores of rows 2t, 2t + 1 are its A values of columns t, t + 4, and the
 * B operand loads rows 2t, 2t + 1 to match.
 *
 * Served: head dim 512, heads a multiple of 32 (Flash); other shapes take
 * cuda_attn_prefill.cu. DS4_CUDA_ATTN_TC=0 keeps that kernel (A/B).
 */
#include "backend/cuda/cuda_attn_chunk.cuh"
#include "backend/cuda/cuda_mq_device.cuh"
#include "backend/cuda/cuda_tf32.cuh"

#define AT_HD 512             /* head dim served */
#define AT_QD (AT_HD / 4)     /* dims a warp */
#define AT_KS (AT_QD / 8)     /* 8-dim mma steps a warp's quarter */
#define AT_NT (AT_QD / 8)     /* 8-dim tiles of a warp's o */
#define AT_LD (AT_HD + 4)     /* floats from one staged row to the next */

/* A block's shape: HT head tiles of 16 (4 HT warps, each head tile's four
 * dim quarters) and R rows a staged chunk. HT = 2, R = 32: 32 heads, two
 * 32-row stages, one block an SM (214 KB of shared memory). HT = 4, R =
 * 16: all 64 of Flash's heads, so a query's rows are staged once instead
 * of twice and 16 warps share an SM; the queries take 132 KB, so the
 * stages hold 16 rows (214 KB in all). */
template <int HT, int R> struct at_shape {
    static constexpr int heads = 16 * HT, warps = 4 * HT, threads = 32 * warps;
    static constexpr int nt = R / 8;                           /* 8-row score tiles a chunk */
    static constexpr int stage = R * AT_LD;                    /* floats a stage */
    static constexpr int part = warps * nt * 32 * 4;           /* floats of the partial scores: [warp][tile][lane] float4 */
    static constexpr int qs = heads * AT_LD;                   /* floats of the block's queries, AT_LD apart */
    static constexpr size_t smem = (2 * stage + part + qs) * sizeof(float);
    static_assert(R % warps == 0 && R >= 8 && R <= 32, "whole rows a warp, whole 8-row tiles");
};

/* Rows r0 .. r0 + nr - 1 of query t into dst (AT_LD floats apart) by
 * cp.async, rows past nr zeroed (they meet a zero probability, which must
 * not multiply a NaN left in shared memory). The row addresses first (a
 * selected row's id is itself a load). Waited for by the caller. */
template <int HT, int R>
__device__ __forceinline__ void at_stage(const cb_attn_args &a, int t, int64_t lo, int64_t n_raw, int64_t r0, int nr,
                                         float *dst)
{
    constexpr int W = at_shape<HT, R>::warps, RPW = R / W;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float4 *src[RPW];
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        const int r = warp + i * W;
        src[i] = r < nr ? (const float4 *)cb_attn_row(a, t, lo, n_raw, r0 + r) : NULL;
    }
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        float *row = dst + (warp + i * W) * AT_LD;
#pragma unroll
        for (int c = lane; c < AT_HD / 4; c += 32) {
            if (src[i]) ds4_mq_cp16(row + 4 * c, src[i] + c);
            else *(float4 *)(row + 4 * c) = make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
    ds4_mq_cp_commit();
}

/* s += the warp's partial scores: heads g, g + 8 (qa: the A values of
 * step 0) x rows 8 nt + 2 tq, + 1 of the chunk over the warp's quarter
 * (kq: row 0's dim d0). SPLIT: the rows' values are not all tf32 values,
 * each goes in as two terms (a third mma); else as they are. */
template <bool SPLIT, int NT>
__device__ __forceinline__ void at_scores(const float *qa, const float *kq, float (&s)[NT][4])
{
    const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
#pragma unroll 4
    for (int ks = 0; ks < AT_KS; ks++) {
        uint32_t qh[4], ql[4];
        const float *qk = qa + 8 * ks;
        ds4_tf32_split(qk[0], qh[0], ql[0]);
        ds4_tf32_split(qk[8 * AT_LD], qh[1], ql[1]);
        ds4_tf32_split(qk[4], qh[2], ql[2]);
        ds4_tf32_split(qk[8 * AT_LD + 4], qh[3], ql[3]);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            /* B: rows 8 nt + g x dims d0 + 8 ks + tq, + 4 */
            const float *kr = kq + (8 * nt + g) * AT_LD + 8 * ks + tq;
            if (SPLIT) {
                uint32_t kh0, kl0, kh1, kl1;
                ds4_tf32_split(kr[0], kh0, kl0);
                ds4_tf32_split(kr[4], kh1, kl1);
                ds4_mma_tf32(s[nt], ql, kh0, kh1);
                ds4_mma_tf32(s[nt], qh, kh0, kh1);
                ds4_mma_tf32(s[nt], qh, kl0, kl1);
            } else {
                const uint32_t b0 = __float_as_uint(kr[0]), b1 = __float_as_uint(kr[4]);
                ds4_mma_tf32(s[nt], ql, b0, b1);
                ds4_mma_tf32(s[nt], qh, b0, b1);
            }
        }
    }
}

/* Whether a value of the chunk's R rows in the warp's quarter (kq: row 0's
 * dim d0) is not a tf32 value (low 13 bits set): R 16-byte loads a lane. */
template <int R> __device__ __forceinline__ bool at_inexact(const float *kq)
{
    const int lane = threadIdx.x & 31;
    uint32_t bits = 0;
#pragma unroll 8
    for (int r = 0; r < R; r++) {
        const uint4 v = *(const uint4 *)(kq + r * AT_LD + 4 * lane);
        bits |= v.x | v.y | v.z | v.w;
    }
    return __any_sync(0xffffffffu, (bits & 0x1fffu) != 0u);
}

/* Where a split walk (decode: PART) leaves a block's softmax partials, as
 * cuda_attn_split.cu's combine reads them: chunk rb of the query's rows
 * (rows_per_chunk = the block's rows), at slot tl; part [tl][head][chunk]
 * [hd] floats, ml [tl][head][chunk] = (m, l). */
struct at_partials {
    int64_t rb;     /* the block's chunk */
    int rows;       /* rows a chunk (a multiple of R) */
    int max_chunks; /* chunks a (slot, head) */
    int tl;         /* slot */
    float *part;
    float2 *ml;
};

/* Query t's rows (all of them, or with PART chunk P.rb's) for the block's
 * heads (group blockIdx.y of 16 HT) on the tensor cores: the running max
 * M from the sink, the sum L and o; then out = o / (exp(sink - M) + L),
 * or (PART) the partials (M, L, o) for the combine. Dynamic shared memory
 * at_shape<HT, R>::smem. */
template <int HT, int R, bool PART>
__device__ __forceinline__ void at_walk(const cb_attn_args &a, int t, const at_partials &P)
{
    typedef at_shape<HT, R> S;
    constexpr int NT = S::nt;
    extern __shared__ float4 at_smem[];
    float *s_kv = (float *)at_smem;
    float4 *s_part = at_smem + 2 * S::stage / 4;
    float *s_q = (float *)(s_part + S::part / 4);
    int64_t lo, n_raw;
    int64_t n = cb_as_rows(a, t, &lo, &n_raw);
    int64_t rbeg = 0;
    /* in-graph phase times (DS4_CUDA_KTIME): the split's first block */
#define AT_KT (PART && (blockIdx.x | blockIdx.y | blockIdx.z | threadIdx.x) == 0)
    ds4_kt_start(AT_KT, DS4_KT_ATTN_SPLIT);
    if (PART) { /* the block's rows rbeg .. n - 1; none: leave (uniform over the block) */
        rbeg = P.rb * P.rows;
        if (rbeg >= n) { /* empty partials (-inf, 0): the combine's early form merges every chunk */
            const int h = (int)blockIdx.y * S::heads + (int)threadIdx.x;
            if ((int)threadIdx.x < S::heads && h < a.n_heads)
                P.ml[((size_t)P.tl * a.n_heads + h) * P.max_chunks + P.rb] = make_float2(-INFINITY, 0.f);
            return;
        }
        if (n > rbeg + P.rows) n = rbeg + P.rows;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
    const int ht = warp >> 2, qd = warp & 3, d0 = qd * AT_QD;
    const int h0 = (int)blockIdx.y * S::heads + 16 * ht; /* the warp's first head */
    const float scale = 1.0f / sqrtf((float)a.hd);

    /* the block's query heads into shared memory with chunk 0 (held in
     * registers they left the loop 255 registers and spills) */
    {
        const float4 *qb = (const float4 *)(a.q + ((size_t)t * a.n_heads + blockIdx.y * S::heads) * a.hd);
        for (int i = threadIdx.x; i < S::heads * AT_HD / 4; i += S::threads)
            ds4_mq_cp16(s_q + (i / (AT_HD / 4)) * AT_LD + 4 * (i % (AT_HD / 4)), qb + i);
    }
    /* the A operand of step ks: heads g, g + 8 x dims d0 + 8 ks + tq, + 4 */
    const float *qa = s_q + (16 * ht + g) * AT_LD + d0 + tq;
    /* rows g, g + 8 of the warp's heads: running max (from the sink), sum, o */
    float M[2] = {a.sinks[h0 + g], a.sinks[h0 + g + 8]}, L[2] = {0.f, 0.f};
    float o[AT_NT][4];
#pragma unroll
    for (int j = 0; j < AT_NT; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;

    const int64_t n_chunks = (n - rbeg + R - 1) / R;
    at_stage<HT, R>(a, t, lo, n_raw, rbeg, n - rbeg < R ? (int)(n - rbeg) : R, s_kv);
    for (int64_t ch = 0; ch < n_chunks; ch++) {
        const int64_t r0 = rbeg + ch * R;
        const int nr = n - r0 < R ? (int)(n - r0) : R;
        ds4_mq_cp_wait<0>();
        __syncthreads(); /* chunk ch is in; every warp is done with chunk ch - 1 and the partial scores */
        ds4_kt_phase(AT_KT && ch == 0, DS4_KT_ATTN_SPLIT, 0);
        if (ch + 1 < n_chunks) {
            const int64_t r1 = r0 + R;
            at_stage<HT, R>(a, t, lo, n_raw, r1, n - r1 < R ? (int)(n - r1) : R, s_kv + ((ch + 1) & 1) * S::stage);
        }
        const float *kb = s_kv + (ch & 1) * S::stage;

        /* partial scores of the warp's 16 heads x R rows over its quarter */
        float s[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
        const bool inexact = at_inexact<R>(kb + d0); /* a row value of the warp's quarter is not tf32 */
        if (inexact) at_scores<true, NT>(qa, kb + d0, s);
        else at_scores<false, NT>(qa, kb + d0, s);
        float4 *pw = s_part + warp * NT * 32;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) pw[nt * 32 + lane] = make_float4(s[nt][0], s[nt][1], s[nt][2], s[nt][3]);
        /* the head tile's four warps (named barrier 1 + ht, 128 threads) */
        asm volatile("bar.sync %0, %1;" ::"r"(1 + ht), "r"(128) : "memory");
        const float4 *pt = s_part + (4 * ht) * NT * 32;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const float4 p0 = pt[(0 * NT + nt) * 32 + lane], p1 = pt[(1 * NT + nt) * 32 + lane];
            const float4 p2 = pt[(2 * NT + nt) * 32 + lane], p3 = pt[(3 * NT + nt) * 32 + lane];
            s[nt][0] = ((p0.x + p1.x) + (p2.x + p3.x)) * scale;
            s[nt][1] = ((p0.y + p1.y) + (p2.y + p3.y)) * scale;
            s[nt][2] = ((p0.z + p1.z) + (p2.z + p3.z)) * scale;
            s[nt][3] = ((p0.w + p1.w) + (p2.w + p3.w)) * scale;
            const int r = 8 * nt + 2 * tq; /* c0 / c2: row r, c1 / c3: row r + 1 */
            if (r >= nr) s[nt][0] = s[nt][2] = -INFINITY;
            if (r + 1 >= nr) s[nt][1] = s[nt][3] = -INFINITY;
        }

        /* online softmax of rows g (e = 0) and g + 8 (e = 1): a quad holds a head's R scores */
        float alpha[2];
#pragma unroll
        for (int e = 0; e < 2; e++) {
            float mx = M[e];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) mx = fmaxf(mx, fmaxf(s[nt][2 * e], s[nt][2 * e + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            alpha[e] = expf(M[e] - mx);
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                s[nt][2 * e] = expf(s[nt][2 * e] - mx);
                s[nt][2 * e + 1] = expf(s[nt][2 * e + 1] - mx);
                sum += s[nt][2 * e] + s[nt][2 * e + 1];
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            L[e] = L[e] * alpha[e] + sum;
            M[e] = mx;
        }
#pragma unroll
        for (int j = 0; j < AT_NT; j++) {
            o[j][0] *= alpha[0];
            o[j][1] *= alpha[0];
            o[j][2] *= alpha[1];
            o[j][3] *= alpha[1];
        }

        /* o += p x rows: 8 rows a step, A column tq / tq + 4 = row 2 tq / 2 tq + 1 */
#pragma unroll
        for (int kj = 0; kj < NT; kj++) {
            uint32_t ph[4], pl[4];
            ds4_tf32_split(s[kj][0], ph[0], pl[0]); /* head g, row 2 tq */
            ds4_tf32_split(s[kj][2], ph[1], pl[1]); /* head g + 8, row 2 tq */
            ds4_tf32_split(s[kj][1], ph[2], pl[2]); /* head g, row 2 tq + 1 */
            ds4_tf32_split(s[kj][3], ph[3], pl[3]); /* head g + 8, row 2 tq + 1 */
            const float *v0 = kb + (8 * kj + 2 * tq) * AT_LD + d0 + g, *v1 = v0 + AT_LD;
            if (!inexact) {
#pragma unroll
                for (int j = 0; j < AT_NT; j++) {
                    const uint32_t b0 = __float_as_uint(v0[8 * j]), b1 = __float_as_uint(v1[8 * j]);
                    ds4_mma_tf32(o[j], pl, b0, b1);
                    ds4_mma_tf32(o[j], ph, b0, b1);
                }
            } else {
#pragma unroll
                for (int j = 0; j < AT_NT; j++) {
                    uint32_t bh0, bl0, bh1, bl1;
                    ds4_tf32_split(v0[8 * j], bh0, bl0);
                    ds4_tf32_split(v1[8 * j], bh1, bl1);
                    ds4_mma_tf32(o[j], pl, bh0, bh1);
                    ds4_mma_tf32(o[j], ph, bl0, bl1);
                    ds4_mma_tf32(o[j], ph, bh0, bh1);
                }
            }
        }
    }

    ds4_kt_phase(AT_KT, DS4_KT_ATTN_SPLIT, 1);
    if (PART) { /* the partials: o as it is, (M, L) once a head (the quad and the quarters agree) */
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int h = h0 + g + 8 * e;
            const size_t at = ((size_t)P.tl * a.n_heads + h) * P.max_chunks + P.rb;
            float *op = P.part + at * a.hd;
#pragma unroll
            for (int j = 0; j < AT_NT; j++)
                *(float2 *)(op + d0 + 8 * j + 2 * tq) = make_float2(o[j][2 * e], o[j][2 * e + 1]);
            if (qd == 0 && tq == 0) P.ml[at] = make_float2(M[e], L[e]);
        }
        ds4_kt_phase(AT_KT, DS4_KT_ATTN_SPLIT, 2);
        return;
    }
#undef AT_KT

    /* out = o / (exp(sink - M) + L), the rotated dims turned back (rope_om) */
    const int rot = a.hd - a.n_rot;
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int h = h0 + g + 8 * e;
        const float den = expf(a.sinks[h] - M[e]) + L[e];
        float *out = a.out + ((size_t)t * a.n_heads + h) * a.hd;
#pragma unroll
        for (int j = 0; j < AT_NT; j++) {
            const int d = d0 + 8 * j + 2 * tq;
            float v[2] = {o[j][2 * e] / den, o[j][2 * e + 1] / den};
            if (a.rope_om && d >= rot) cb_rope_pair(v, a.pos0 + t, __ldg(a.rope_om + (d - rot) / 2), 1);
            *(float2 *)(out + d) = make_float2(v[0], v[1]);
        }
    }
}

/* grid (query t of the chunk, group of 16 HT heads) */
template <int HT, int R>
__global__ void __launch_bounds__(at_shape<HT, R>::threads, 1) cb_attn_tc_kernel(cb_attn_args a)
{
    ds4_pdl_enter();
    a.pos0 = cb_pos(a.d_pos, a.pos0);
    at_walk<HT, R, false>(a, (int)blockIdx.x, at_partials{});
}

/* Decode, split: grid (chunk, head group, z: token t0 + z of the call, its
 * partials at slot z) */
template <int HT, int R>
__global__ void __launch_bounds__(at_shape<HT, R>::threads, 1)
    cb_attn_tc_split_kernel(cb_attn_args a, int t0, int rows, int max_chunks, float *part, float2 *ml)
{
    ds4_pdl_enter();
    a.pos0 = cb_pos(a.d_pos, a.pos0);
    const at_partials P = {(int64_t)blockIdx.x, rows, max_chunks, (int)blockIdx.z, part, ml};
    at_walk<HT, R, true>(a, t0 + (int)blockIdx.z, P);
}

/* The same for a batched step: z is sequence z's one query */
template <int HT, int R>
__global__ void __launch_bounds__(at_shape<HT, R>::threads, 1)
    cb_attn_tc_split_seqs_kernel(const __grid_constant__ cb_attn_seqs S, int rows, int max_chunks, float *part,
                                 float2 *ml)
{
    ds4_pdl_enter();
    cb_attn_args a = S.a[blockIdx.z];
    a.pos0 = cb_pos(a.d_pos, a.pos0);
    const at_partials P = {(int64_t)blockIdx.x, rows, max_chunks, (int)blockIdx.z, part, ml};
    at_walk<HT, R, true>(a, 0, P);
}

static bool at_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_ATTN_TC", &on);
}

/* All 64 heads a block where the heads come in 64s; DS4_CUDA_ATTN_TC64=0
 * keeps the 32-head blocks (A/B). */
static bool at64_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_ATTN_TC64", &on);
}

bool cb_attention_prefill_tc_takes(ds4_backend *be, const cb_attn_args &a)
{
    return cb_of(be)->cu->cc_major >= 8 && at_on() && a.hd == AT_HD && a.n_heads % 32 == 0 &&
           a.n_heads / 32 <= 65535 && (!a.rope_om || (a.n_rot % 2 == 0 && a.n_rot <= a.hd));
}

/* A kernel's shared memory granted once a backend (bit 1 << which). */
template <int HT, int R> static bool at_grant(ds4_backend *be, int which, const void *kernel)
{
    cuda_backend *c = cb_of(be);
    if (c->attn_tc_smem & (1 << which)) return true;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)at_shape<HT, R>::smem);
    if (e != cudaSuccess) {
        cb_fail_status(be, ds4_fail(DS4_ERR_BACKEND, "cuda attention: %zu bytes of shared memory: %s",
                                    at_shape<HT, R>::smem, cudaGetErrorString(e)),
                       "attention");
        return false;
    }
    c->attn_tc_smem |= 1 << which;
    return true;
}

void cb_attention_prefill_tc(ds4_backend *be, const cb_attn_args &a)
{
    if (a.n_heads % 64 == 0 && at64_on()) {
        typedef at_shape<4, 16> S;
        if (!at_grant<4, 16>(be, 1, (const void *)cb_attn_tc_kernel<4, 16>)) return;
        ds4_launch(cb_attn_tc_kernel<4, 16>, dim3((unsigned)a.T, (unsigned)(a.n_heads / S::heads)), S::threads,
                   S::smem, cb_stream(be), a);
    } else {
        typedef at_shape<2, 32> S;
        if (!at_grant<2, 32>(be, 0, (const void *)cb_attn_tc_kernel<2, 32>)) return;
        ds4_launch(cb_attn_tc_kernel<2, 32>, dim3((unsigned)a.T, (unsigned)(a.n_heads / S::heads)), S::threads,
                   S::smem, cb_stream(be), a);
    }
    cb_check_launch(be, "attention");
}

/* ---- decode: the split walk ------------------------------------------- */

/* DS4_CUDA_ATTN_R16=1 (opt-in until measured): a split walk's chunk is
 * one 16-row stage instead of two. Why: a decode block's warps are
 * instruction-bound (ncu: ~4K instructions a warp for 32 rows at 1.7 IPC
 * an SM, 18 us for a 4-block launch, docs/CUDA.md), so half the rows a
 * block halve its time and double the blocks that share the query. The
 * combine then merges twice the chunks, so the sums change order (not
 * the bits of the two-stage walk). */
static bool at_r16_on(void)
{
    static int on = -1;
    return ds4_env_flag_on("DS4_CUDA_ATTN_R16", &on);
}

static bool at_split_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_ATTN_TC_SPLIT", &on);
}

int cb_attention_tc_split_rows(ds4_backend *be, const cb_attn_args &a)
{
    if (!at_split_on() || !at64_on() || a.n_heads % 64 != 0 || !cb_attention_prefill_tc_takes(be, a)) return 0;
    /* Two 16-row stages a block, or with DS4_CUDA_ATTN_R16=1 one. The
     * same for every call, so that a sequence's numbers do not depend on
     * how many queries share the launch (a batched step's against its own
     * decode): at a 2K frontier a CSA layer's ~640 rows are 20 blocks for
     * one query (40 at 16 rows), 320 for 16 (one 64-head block an SM fits:
     * 214 KB of shared memory). */
    return at_r16_on() ? 16 : 2 * 16;
}

/* A split walk whose 64-head blocks would fit in one wave (leaving SMs
 * idle) takes blocks of 16 heads (4 warps) instead; two fit an SM (103 KB
 * of shared memory). DS4_CUDA_ATTN_NARROW=0 keeps the 64-head blocks
 * (A/B). Why: one decode query at a 2K frontier is 20 blocks of 16 warps
 * (4 for a window layer's 128 rows), each warp's 16 heads x 128 dims the
 * same work at either width, and a block's warps are instruction-bound
 * (ncu: ~4K instructions a warp for 32 rows at ~1.7 IPC an SM, 18 us for
 * a 4-block launch, 10 us in 16 narrow blocks). With 16 heads a block the
 * same warps spread over 4 times as many SMs: at full size the split
 * kernel went from 17.7 to 9.4 us a layer and decode from 138.2 / 138.4
 * to 143.5 / 145.7 tokens/s (docs/BENCHMARKS.md, twenty-third session).
 * A head's numbers do not change: its scores are summed over the same
 * quarters in the same order, its rows come in the same chunks. */
static bool at_narrow_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_ATTN_NARROW", &on);
}

bool cb_attention_tc_split(ds4_backend *be, const cb_attn_args &a, int t0, int tn, int rows, int max_chunks,
                           float *part, float2 *ml)
{
    const int n_sm = cb_of(be)->cu->n_sm;
    if (at_narrow_on() && (int64_t)max_chunks * tn <= (int64_t)n_sm) {
        typedef at_shape<1, 16> S;
        if (!at_grant<1, 16>(be, 4, (const void *)cb_attn_tc_split_kernel<1, 16>)) return false;
        ds4_launch(cb_attn_tc_split_kernel<1, 16>,
                   dim3((unsigned)max_chunks, (unsigned)(a.n_heads / S::heads), (unsigned)tn), S::threads, S::smem,
                   cb_stream(be), a, t0, rows, max_chunks, part, ml);
        return true;
    }
    typedef at_shape<4, 16> S;
    if (!at_grant<4, 16>(be, 2, (const void *)cb_attn_tc_split_kernel<4, 16>)) return false;
    ds4_launch(cb_attn_tc_split_kernel<4, 16>, dim3((unsigned)max_chunks, (unsigned)(a.n_heads / S::heads), (unsigned)tn),
               S::threads, S::smem, cb_stream(be), a, t0, rows, max_chunks, part, ml);
    return true;
}

bool cb_attention_tc_split_seqs(ds4_backend *be, const cb_attn_seqs &Sq, int n, int rows, int max_chunks, float *part,
                                float2 *ml)
{
    typedef at_shape<4, 16> S;
    if (!at_grant<4, 16>(be, 3, (const void *)cb_attn_tc_split_seqs_kernel<4, 16>)) return false;
    ds4_launch(cb_attn_tc_split_seqs_kernel<4, 16>,
               dim3((unsigned)max_chunks, (unsigned)(Sq.a[0].n_heads / S::heads), (unsigned)n), S::threads, S::smem,
               cb_stream(be), Sq, rows, max_chunks, part, ml);
    return true;
}

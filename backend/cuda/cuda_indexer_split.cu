/*
 * cuda_indexer_split.cu - the lightning indexer's top-k (§3.6) scored
 * across many blocks, the default (DS4_CUDA_INDEXER=0 selects the
 * one-block-per-query kernel of cuda_ops_attention.cu).
 *
 * Scores: a block takes CB_IS_KEYS keys of one query, with the query's
 * heads (n_heads x dim) and its keys staged in shared memory; one thread
 * per (key, head) dot product, then one thread per key folds the heads in
 * order. Every step is the CPU's float operation (backend/cpu's dot_f32:
 * 16 running sums over dim, summed in order, then the tail; acc += w * dot
 * for dot > 0), with __fmul_rn / __fadd_rn so nothing is contracted into
 * an FMA: the scores are the CPU's bit for bit, which the tie rule needs.
 *
 * A decode step scores few keys (512 at a 2K frontier: 16 blocks of 32
 * keys, each thread 8 heads of 128 products, ~13 us at full size on 16
 * SMs). So (DS4_CUDA_IS_NARROW=0: blocks of 32, for A/B) it takes blocks of 8 or
 * 4 keys when blocks of 32 would leave SMs idle (cb_is_kpb): a lane is a
 * (key, head slot), each thread 2 or 1 heads, 4 or 8 times the blocks,
 * and the head weights staged in shared memory for the fold. Each (key,
 * head) dot and each key's fold are the same operations in the same
 * order whichever thread makes them, so the scores are the same bits.
 *
 * Selection: one block of 1024 threads per query finds the top-k-th key
 * by a radix select on the order-preserving 32-bit image of the score
 * (up to four 8-bit passes of a shared-memory histogram), then takes every
 * key above it and, of the keys equal to it, the lowest indices, writing
 * the ids in ascending order: the set of "score descending, index
 * ascending". Any correct selection writes the same ids.
 *
 * The selection reads the scores into registers (cb_is_select_kernel):
 * a thread holds a contiguous run of up to CB_IS_SEL_R keys of a tile of
 * 16,384 (a 64K context at ratio 4: one tile, read once for every pass),
 * all its loads in flight at once; a pass stops the walk early when the
 * chosen bin holds exactly the keys still needed; the ids go out in one
 * block scan a tile. Why: in-graph times at a 32K frontier (8,192 keys;
 * thirty-first session, docs/CUDA.md) put the first form, which read a
 * key at a time from L2 in each of its four passes and its final scan (a
 * dependent round trip each), at 27.6 us a CSA layer against 6.3 at 2K;
 * full size at 32K, 30 layers on an H100: 193.6 tokens/s against 184.2
 * with the first form (thirty-fifth session), which is gone since.
 */
#include "backend/cuda/cuda_attention.cuh"

#define CB_IS_KEYS 32 /* keys per scoring block: one per lane */
#define CB_IS_WARPS 8
#define CB_IS_HPT 4 /* heads a thread scores at once */
#define CB_IS_SELECT_THREADS 1024
#define CB_IS_SEL_R 16 /* keys a selecting thread holds in registers */

/* Keys are compared as ds4_order_key images (cuda_internal.cuh): larger =
 * better score, -0 as +0 (the CPU's comparisons agree). */

/* Shared memory of a scoring block of kpb keys: the query heads (rows
 * padded by 4 floats below 32 keys, where a warp reads several heads at
 * once), the keys (padded), the dots and (below 32 keys) the head weights. */
static size_t cb_is_score_smem(int n_heads, int dim, int kpb)
{
    const size_t qrow = (size_t)dim + (kpb < CB_IS_KEYS ? 4 : 0), wts = kpb < CB_IS_KEYS ? (size_t)n_heads : 0;
    return ((size_t)n_heads * qrow + (size_t)kpb * (dim + 4) + (size_t)n_heads * kpb + wts) * sizeof(float);
}

/* Query t's position and keys: one sequence's (pos0 + t, keys) or, in a
 * batched decode step (n_seq > 0), sequence t's own (pos[t], seq_keys[t]).
 * Positions as cb_graph_pos gives them (d_pos added in a graph step). */
struct cb_is_src {
    const float *keys;
    const int64_t *d_pos;
    int64_t pos_arg;
    int n_seq;
    int64_t pos[CB_IS_SEQS_MAX];
    const float *seq_keys[CB_IS_SEQS_MAX];
};
__device__ __forceinline__ int64_t cb_is_pos(const cb_is_src &S, int t)
{
    return S.n_seq ? cb_pos(S.d_pos, S.pos[t]) : cb_pos(S.d_pos, S.pos_arg) + t;
}
__device__ __forceinline__ const float *cb_is_keys(const cb_is_src &S, int t)
{
    return S.n_seq ? S.seq_keys[t] : S.keys;
}

/* grid (key block, query); scores [T][max_n]. KPB keys a block: lane l of
 * warp w takes key l % KPB and head slot w (32 / KPB) + l / KPB, heads
 * slot, slot + NSLOT, ... HPT at a time (KPB = 32: warp w, heads w, w + 8,
 * ..., the kernel's first form). */
template <int KPB>
__global__ void __launch_bounds__(CB_IS_WARPS * 32)
    cb_is_score_kernel(const float *qi, const float *w, int n_heads, int dim, const __grid_constant__ cb_is_src S,
                       int ratio, int topk, float *scores, int64_t max_n)
{
    static_assert(KPB == 32 || KPB == 8 || KPB == 4, "keys a block: 32, 8 or 4");
    enum { NSLOT = CB_IS_WARPS * 32 / KPB, HPT = KPB == 32 ? CB_IS_HPT : KPB == 8 ? 2 : 1, NARROW = KPB < 32 };
    ds4_pdl_enter();
    extern __shared__ float4 s_mem[];
    /* key rows padded by 4 floats: no bank conflicts across lanes; query
     * rows too where a warp reads several heads */
    const int dim4 = dim >> 2, kst4 = dim4 + 1, qst4 = NARROW ? dim4 + 1 : dim4;
    float4 *s_q = s_mem;
    float4 *s_k = s_q + (size_t)n_heads * qst4;
    float *s_dot = (float *)(s_k + (size_t)KPB * kst4);
    float *s_w = s_dot + (size_t)n_heads * KPB; /* NARROW: the query's head weights */
    const int t = blockIdx.y;
    const int64_t n = (cb_is_pos(S, t) + 1) / ratio;
    const float *keys = cb_is_keys(S, t);
    const int64_t k0 = (int64_t)blockIdx.x * KPB;
    if (n <= topk || k0 >= n) return; /* uniform over the block */
    const int nk = n - k0 < KPB ? (int)(n - k0) : KPB;
    const float4 *q4 = (const float4 *)(qi + (size_t)t * n_heads * dim);
    for (int i = threadIdx.x; i < n_heads * dim4; i += blockDim.x) {
        if (NARROW) {
            const int r = i / dim4;
            s_q[r * qst4 + (i - r * dim4)] = q4[i];
        } else {
            s_q[i] = q4[i];
        }
    }
    const float4 *k4 = (const float4 *)(keys + (size_t)k0 * dim);
    for (int i = threadIdx.x; i < nk * dim4; i += blockDim.x) {
        const int r = i / dim4;
        s_k[r * kst4 + (i - r * dim4)] = k4[i];
    }
    if (NARROW)
        for (int h = threadIdx.x; h < n_heads; h += blockDim.x) s_w[h] = w[(size_t)t * n_heads + h];
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int key_i = lane % KPB, slot = warp * (32 / KPB) + lane / KPB;
    if (key_i < nk) {
        /* HPT heads at a time share each load of the key from shared
         * memory (a key load costs 4 times a broadcast q load) */
        const float4 *key = s_k + key_i * kst4;
        for (int h0 = slot; h0 < n_heads; h0 += HPT * NSLOT) {
            const float4 *qh[HPT];
#pragma unroll
            for (int e = 0; e < HPT; e++) {
                const int h = h0 + e * NSLOT;
                qh[e] = s_q + (size_t)(h < n_heads ? h : 0) * qst4;
            }
            float acc[HPT][16];
#pragma unroll
            for (int e = 0; e < HPT; e++)
#pragma unroll
                for (int k = 0; k < 16; k++) acc[e][k] = 0.f;
            int i4 = 0;
            for (; 4 * i4 + 16 <= dim; i4 += 4) {
#pragma unroll
                for (int g = 0; g < 4; g++) {
                    const float4 b = key[i4 + g];
#pragma unroll
                    for (int e = 0; e < HPT; e++) {
                        const float4 a = qh[e][i4 + g];
                        acc[e][4 * g + 0] = __fadd_rn(acc[e][4 * g + 0], __fmul_rn(a.x, b.x));
                        acc[e][4 * g + 1] = __fadd_rn(acc[e][4 * g + 1], __fmul_rn(a.y, b.y));
                        acc[e][4 * g + 2] = __fadd_rn(acc[e][4 * g + 2], __fmul_rn(a.z, b.z));
                        acc[e][4 * g + 3] = __fadd_rn(acc[e][4 * g + 3], __fmul_rn(a.w, b.w));
                    }
                }
            }
            float s[HPT];
#pragma unroll
            for (int e = 0; e < HPT; e++) {
                s[e] = 0.f;
#pragma unroll
                for (int k = 0; k < 16; k++) s[e] = __fadd_rn(s[e], acc[e][k]);
            }
            for (; i4 < dim4; i4++) {
                const float4 b = key[i4];
#pragma unroll
                for (int e = 0; e < HPT; e++) {
                    const float4 a = qh[e][i4];
                    s[e] = __fadd_rn(s[e], __fmul_rn(a.x, b.x));
                    s[e] = __fadd_rn(s[e], __fmul_rn(a.y, b.y));
                    s[e] = __fadd_rn(s[e], __fmul_rn(a.z, b.z));
                    s[e] = __fadd_rn(s[e], __fmul_rn(a.w, b.w));
                }
            }
#pragma unroll
            for (int e = 0; e < HPT; e++) {
                const int h = h0 + e * NSLOT;
                if (h < n_heads) s_dot[h * KPB + key_i] = s[e];
            }
        }
    }
    __syncthreads();
    if ((int)threadIdx.x < nk) {
        /* the heads in order (a dependent chain of adds): NARROW reads the
         * weights from shared memory, 8 heads' loads ahead of their adds */
        const float *wt = NARROW ? s_w : w + (size_t)t * n_heads;
        float acc = 0.f;
        if (NARROW) {
            int h = 0;
            for (; h + 8 <= n_heads; h += 8) {
                float d[8], wv[8];
#pragma unroll
                for (int i = 0; i < 8; i++) d[i] = s_dot[(h + i) * KPB + threadIdx.x], wv[i] = wt[h + i];
#pragma unroll
                for (int i = 0; i < 8; i++)
                    if (d[i] > 0) acc = __fadd_rn(acc, __fmul_rn(wv[i], d[i]));
            }
            for (; h < n_heads; h++) {
                const float d = s_dot[h * KPB + threadIdx.x];
                if (d > 0) acc = __fadd_rn(acc, __fmul_rn(wt[h], d));
            }
        } else {
            for (int h = 0; h < n_heads; h++) {
                const float d = s_dot[h * KPB + threadIdx.x];
                if (d > 0) acc = __fadd_rn(acc, __fmul_rn(wt[h], d));
            }
        }
        scores[(size_t)t * max_n + k0 + threadIdx.x] = acc;
    }
}

/* A query of n <= topk keys takes them all: ids 0 .. n - 1, then -1 (true:
 * the block is done). */
__device__ __forceinline__ bool cb_is_take_all(int64_t n, int topk, int32_t *out)
{
    if (n > topk) return false;
    for (int i = threadIdx.x; i < topk; i += blockDim.x) out[i] = i < n ? i : -1;
    return true;
}

/* Warp 0 of a selecting block, after a pass's histogram (bins of the
 * 8 bits at shift among the keys matching prefix): the bin that holds the
 * top-k-th key. Writes the longer prefix, how many of its keys are still
 * needed, and whether the bin holds exactly those (then every key matching
 * the longer prefix is taken and no further pass can change the set). */
__device__ __forceinline__ void cb_is_find_bin(const unsigned *hist, int lane, uint32_t prefix, unsigned need,
                                               int shift, unsigned *s_prefix, unsigned *s_need, unsigned *s_done)
{
    /* lane l holds bins 255 - 8l down to 248 - 8l; above = keys in higher bins */
    unsigned cnt[8], tot = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) tot += cnt[i] = hist[255 - 8 * lane - i];
    unsigned incl = tot;
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned x = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += x;
    }
    unsigned above = incl - tot;
    if (above < need && need <= incl) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            if (above + cnt[i] >= need) {
                *s_prefix = prefix | ((uint32_t)(255 - 8 * lane - i) << shift);
                *s_need = need - above;
                *s_done = above + cnt[i] == need;
                break;
            }
            above += cnt[i];
        }
    }
}

/* A selecting block's exclusive scan of each thread's v: before = the sum
 * over the lower threads, total = the block's. One barrier inside; s_wsum
 * (32 words) may be rewritten only after the next barrier. */
__device__ __forceinline__ void cb_is_block_scan(unsigned v, int lane, int warp, int nw, unsigned *s_wsum,
                                                 unsigned &before, unsigned &total)
{
    unsigned incl = v;
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned x = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += x;
    }
    if (lane == 31) s_wsum[warp] = incl;
    __syncthreads();
    before = incl - v, total = 0;
    for (int k = 0; k < nw; k++) {
        const unsigned x = s_wsum[k];
        if (k < warp) before += x;
        total += x;
    }
}

/* Keys s0 .. s0 + r - 1 (those below n) of a score row into u as their
 * order images: four 16-byte loads where the run is whole and aligned */
__device__ __forceinline__ void cb_is_sel_load(const float *sc, int64_t n, int64_t s0, int r, uint32_t (&u)[CB_IS_SEL_R])
{
    if (r == CB_IS_SEL_R && s0 + CB_IS_SEL_R <= n && (((uintptr_t)(sc + s0)) & 15u) == 0) {
#pragma unroll
        for (int j = 0; j < CB_IS_SEL_R; j += 4) {
            const float4 v = *(const float4 *)(sc + s0 + j);
            u[j] = ds4_order_key(v.x), u[j + 1] = ds4_order_key(v.y);
            u[j + 2] = ds4_order_key(v.z), u[j + 3] = ds4_order_key(v.w);
        }
        return;
    }
#pragma unroll
    for (int j = 0; j < CB_IS_SEL_R; j++) u[j] = j < r && s0 + j < n ? ds4_order_key(sc[s0 + j]) : 0u;
}

/* grid (query), CB_IS_SELECT_THREADS threads. A tile is the keys base ..
 * base + rpt * CB_IS_SELECT_THREADS - 1, thread i's run of rpt of them at
 * base + rpt i (rpt = the keys a thread needs, at most CB_IS_SEL_R). */
__global__ void __launch_bounds__(CB_IS_SELECT_THREADS)
    cb_is_select_kernel(const __grid_constant__ cb_is_src S, int ratio, int topk, const float *scores, int64_t max_n,
                        int32_t *sel)
{
    ds4_pdl_enter();
    __shared__ unsigned hist[256];
    __shared__ unsigned s_prefix, s_need, s_done, s_wsum[32];
    const int t = blockIdx.x;
    const int64_t n = (cb_is_pos(S, t) + 1) / ratio;
    int32_t *out = sel + (size_t)t * topk;
    if (cb_is_take_all(n, topk, out)) return;
    const float *sc = scores + (size_t)t * max_n;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int64_t per = (n + CB_IS_SELECT_THREADS - 1) / CB_IS_SELECT_THREADS;
    const int rpt = per < CB_IS_SEL_R ? (int)per : CB_IS_SEL_R; /* the same on every thread */
    const int64_t tile = (int64_t)rpt * CB_IS_SELECT_THREADS, mine = (int64_t)rpt * threadIdx.x;
    const bool one = n <= tile; /* one tile: read once, held through every pass */
    uint32_t u[CB_IS_SEL_R];
    if (one) cb_is_sel_load(sc, n, mine, rpt, u);

    /* radix select: prefix = the top-k-th key's image under mask, need =
     * how many of the keys matching it belong to the top k. Invariant: at
     * least need keys match the prefix found so far, and need >= 1. */
    uint32_t prefix = 0, mask = 0;
    unsigned need = (unsigned)topk;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        for (int64_t base = 0; base < n; base += tile) {
            if (!one) cb_is_sel_load(sc, n, base + mine, rpt, u);
#pragma unroll
            for (int j = 0; j < CB_IS_SEL_R; j++) {
                if (j >= rpt) break; /* uniform */
                unsigned bin = 256; /* none */
                if (base + mine + j < n && (u[j] & mask) == prefix) bin = (u[j] >> shift) & 255u;
                if (!__any_sync(0xffffffffu, bin < 256)) continue; /* later passes: most warps hold none */
                /* one atomic per distinct bin of the warp */
                const unsigned peers = __match_any_sync(0xffffffffu, bin);
                if (bin < 256 && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], (unsigned)__popc(peers));
            }
        }
        __syncthreads();
        if (warp == 0) cb_is_find_bin(hist, lane, prefix, need, shift, &s_prefix, &s_need, &s_done);
        __syncthreads();
        prefix = s_prefix;
        need = s_need;
        mask |= 255u << shift;
        const bool done = s_done != 0;
        __syncthreads(); /* s_prefix, s_need, s_done and hist are rewritten by the next pass */
        if (done) break;
    }

    /* every key above prefix (under mask), and the first `need` keys
     * matching it, in index order: a key's place is the number of taken
     * keys before it; one block scan a tile of the thread's (above,
     * matching) counts packed 16 + 16 bits (at most 16,384 of each) */
    int base_gt = 0, base_eq = 0;
    for (int64_t base = 0; base < n; base += tile) {
        if (!one) cb_is_sel_load(sc, n, base + mine, rpt, u);
        unsigned cg = 0, ce = 0;
#pragma unroll
        for (int j = 0; j < CB_IS_SEL_R; j++) {
            if (j >= rpt) break;
            const bool in = base + mine + j < n;
            const uint32_t v = u[j] & mask;
            cg += in && v > prefix;
            ce += in && v == prefix;
        }
        unsigned before, total;
        cb_is_block_scan(cg | (ce << 16), lane, warp, nw, s_wsum, before, total);
        int gt_before = base_gt + (int)(before & 0xffffu), eq_before = base_eq + (int)(before >> 16);
#pragma unroll
        for (int j = 0; j < CB_IS_SEL_R; j++) {
            if (j >= rpt) break;
            const int64_t s = base + mine + j;
            const uint32_t v = u[j] & mask;
            if (s >= n) break;
            if (v > prefix) {
                out[gt_before + (eq_before < (int)need ? eq_before : (int)need)] = (int32_t)s;
                gt_before++;
            } else if (v == prefix) {
                if (eq_before < (int)need) out[gt_before + eq_before] = (int32_t)s;
                eq_before++;
            }
        }
        base_gt += (int)(total & 0xffffu);
        base_eq += (int)(total >> 16);
        __syncthreads(); /* s_wsum is rewritten by the next tile */
        if (base_gt + (base_eq < (int)need ? base_eq : (int)need) >= topk) break; /* same on every thread */
    }
}

static bool cb_is_aligned(const void *p) { return ((uintptr_t)p & 15u) == 0; }

bool cb_indexer_split_fits(int T, int n_heads, int dim, const float *qi, const float *keys)
{
    return T > 0 && T <= 65535 && n_heads > 0 && dim > 0 && dim % 4 == 0 && cb_is_aligned(qi) &&
           cb_is_aligned(keys) && cb_is_score_smem(n_heads, dim, CB_IS_KEYS) <= 200 * 1024 &&
           cb_is_score_smem(n_heads, dim, 4) <= 200 * 1024;
}

static bool cb_is_narrow_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_IS_NARROW", &on);
}

/* Keys a scoring block: 32, or (DS4_CUDA_IS_NARROW=1) 8 or 4 where the
 * queries' keys now (n_now, the most any query has) give fewer blocks of
 * 32 than SMs. A recorded graph keeps its choice as the keys grow: any
 * choice gives the same scores. */
static int cb_is_kpb(ds4_backend *be, int64_t n_now, int T)
{
    if (!cb_is_narrow_on()) return CB_IS_KEYS;
    const int64_t n_sm = cb_of(be)->cu->n_sm;
    if ((n_now + CB_IS_KEYS - 1) / CB_IS_KEYS * T >= n_sm) return CB_IS_KEYS;
    if ((n_now + 7) / 8 * T >= n_sm) return 8;
    return 4;
}

typedef void (*cb_is_score_fn)(const float *, const float *, int, int, cb_is_src, int, int, float *, int64_t);
static cb_is_score_fn cb_is_score_pick(int kpb)
{
    return kpb == 4 ? cb_is_score_kernel<4> : kpb == 8 ? cb_is_score_kernel<8> : cb_is_score_kernel<CB_IS_KEYS>;
}

/* The two launches for T queries whose keys and positions S gives; max_n
 * bounds every query's key count, scoring: whether any query may have
 * more than top-k keys. */
static void cb_is_launch(ds4_backend *be, const float *qi, const float *w, int T, int n_heads, int dim,
                         const cb_is_src &S, int ratio, int topk, int32_t *sel, int64_t max_n, int64_t n_now,
                         bool scoring, bool qat_queries)
{
    cuda_backend *c = cb_of(be);
    /* a prefill chunk of FP4 round-trip rows: the tensor cores score it
     * (cuda_indexer_tc.cu), its prepared rows past the scores */
    const size_t sbytes = ((size_t)T * (size_t)max_n * sizeof(float) + 255) & ~(size_t)255;
    const size_t tc = scoring && !S.n_seq && !S.d_pos
                          ? cb_indexer_tc_bytes(be, qi, T, n_heads, dim, S.keys, S.pos_arg, ratio, qat_queries)
                          : 0;
    float *scores = (float *)cb_scratch(be, 2, sbytes + tc);
    if (!scores) return;
    if (tc) {
        CB_GRAPH_SKIP(be, 43, qi, w, T, n_heads, dim, S.keys, S.pos_arg, ratio, topk, sel, scores, max_n);
        cb_indexer_tc_score(be, qi, w, T, S.keys, S.pos_arg, ratio, topk, scores, max_n, (uint8_t *)scores + sbytes);
        ds4_launch(cb_is_select_kernel, (unsigned)T, CB_IS_SELECT_THREADS, 0, cb_stream(be), S, ratio, topk,
                   (const float *)scores, max_n, sel);
        cb_check_launch(be, "indexer_topk");
        return;
    }
    /* one decode query of rounded rows: the tensor cores, rows prepared in
     * each scoring block (cuda_indexer_tc.cu) */
    if (scoring && T == 1 && !S.n_seq && cb_indexer_tc_decode_fits(be, qi, n_heads, dim, S.keys, ratio, qat_queries)) {
        CB_GRAPH_SKIP(be, 44, qi, w, n_heads, dim, S.keys, S.pos_arg, ratio, topk, sel, scores, max_n);
        if (!cb_indexer_tc_decode(be, qi, w, S.keys, S.d_pos, S.pos_arg, ratio, topk, scores, max_n)) return;
        ds4_launch(cb_is_select_kernel, 1, CB_IS_SELECT_THREADS, 0, cb_stream(be), S, ratio, topk,
                   (const float *)scores, max_n, sel);
        cb_check_launch(be, "indexer_topk");
        return;
    }
    const int kpb = cb_is_kpb(be, n_now, T), ki = kpb == 4 ? 0 : kpb == 8 ? 1 : 2;
    const size_t smem = cb_is_score_smem(n_heads, dim, kpb);
    if (smem > 48 * 1024 && c->indexer_split_smem[ki] < smem) {
        cudaError_t e = cudaFuncSetAttribute(cb_is_score_pick(kpb), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem);
        if (e != cudaSuccess) {
            cb_fail_status(be, ds4_fail(DS4_ERR_BACKEND, "cuda indexer: %zu bytes of shared memory: %s", smem,
                                        cudaGetErrorString(e)),
                           "indexer_topk");
            return;
        }
        c->indexer_split_smem[ki] = smem;
    }
    CB_GRAPH_SKIP(be, 41, qi, w, T, n_heads, dim, S.keys, S.pos_arg, S.n_seq, ratio, topk, sel, scores, max_n);
    if (scoring)
        ds4_launch(cb_is_score_pick(kpb), dim3((unsigned)((max_n + kpb - 1) / kpb), (unsigned)T), CB_IS_WARPS * 32,
                   smem, cb_stream(be), qi, w, n_heads, dim, S, ratio, topk, scores, max_n);
    ds4_launch(cb_is_select_kernel, (unsigned)T, CB_IS_SELECT_THREADS, 0, cb_stream(be), S, ratio, topk,
               (const float *)scores, max_n, sel);
    cb_check_launch(be, "indexer_topk");
}

void cb_indexer_split(ds4_backend *be, const float *qi, const float *w, int T, int n_heads, int dim,
                      const float *keys, int64_t pos0, int ratio, int topk, int32_t *sel, bool qat_queries)
{
    cb_is_src S;
    memset(&S, 0, sizeof S);
    S.keys = keys;
    S.d_pos = cb_graph_pos(be, pos0, &S.pos_arg);
    const int64_t max_n = cb_graph_pos_bound(be, pos0 + T) / ratio + 1;
    /* plain launches know whether any query has more than top-k keys */
    cb_is_launch(be, qi, w, T, n_heads, dim, S, ratio, topk, sel, max_n, (pos0 + T) / ratio,
                 S.d_pos || (pos0 + T) / ratio > topk, qat_queries);
}

bool cb_indexer_split_seqs(ds4_backend *be, const float *qi, const float *w, int n_seq, int n_heads, int dim,
                           const float *const *keys, const int64_t *pos0, int ratio, int topk, int32_t *sel)
{
    if (n_seq < 1 || n_seq > CB_IS_SEQS_MAX || !cb_indexer_split_fits(n_seq, n_heads, dim, qi, keys[0])) return false;
    for (int i = 1; i < n_seq; i++)
        if (!cb_is_aligned(keys[i])) return false;
    cb_is_src S;
    memset(&S, 0, sizeof S);
    S.n_seq = n_seq;
    int64_t max_n = 1, n_now = 0;
    bool scoring = false;
    for (int i = 0; i < n_seq; i++) {
        S.seq_keys[i] = keys[i];
        S.d_pos = cb_graph_pos(be, pos0[i], &S.pos[i]);
        const int64_t m = cb_graph_pos_bound(be, pos0[i] + 1) / ratio + 1;
        if (m > max_n) max_n = m;
        scoring |= (pos0[i] + 1) / ratio > topk;
        if ((pos0[i] + 1) / ratio > n_now) n_now = (pos0[i] + 1) / ratio;
        cb_graph_note(be, 41, S.seq_keys[i], S.pos[i]);
    }
    cb_is_launch(be, qi, w, n_seq, n_heads, dim, S, ratio, topk, sel, max_n, n_now, S.d_pos || scoring, false);
    return true;
}

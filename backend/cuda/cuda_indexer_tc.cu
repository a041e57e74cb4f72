/*
 * cuda_indexer_tc.cu - a prefill chunk's lightning-indexer scores (§3.6) on
 * the int8 tensor cores, bit for bit the CPU's.
 *
 * Why: cb_is_score_kernel (cuda_indexer_split.cu) makes every product and
 * sum in the CPU's float order on the CUDA cores: a 2048-token chunk at an
 * 8K frontier is 2048 x ~1800 keys x 64 heads x 128 = 30 G multiply-adds,
 * ~2.9 ms a call on the H200 (the 8-layer model's ncu profile,
 * docs/BENCHMARKS.md), and past 2048 positions the CSA layers' scoring was
 * the largest part of what a prefill step adds.
 *
 * When the numbers allow it: in the official numerics (dsv4-model.md §4.1
 * D2) the queries and keys are FP4-E2M1 round-trip values, each a grid
 * value {0, .5, 1, 1.5, 2, 3, 4, 6} times a power of two per 32-value
 * block. Such a row is an int8 vector times one power of two per block:
 * v = i 2^e, e the lowest set bit of the block's values. Then a product
 * q_d k_d is exact in fp32, and every term of a dot is a multiple of u =
 * 2^(eq + ek) (eq, ek: the rows' lowest exponents). If the sum of the
 * terms' magnitudes stays below 2^24 u, every partial sum the CPU forms,
 * in any order, is exactly representable, so its dot is the exact value;
 * the tensor cores give that value from integer block sums. The bound
 * holds when Mq Mk < 2^17, M = max|v| / 2^e_row (128 products of at most
 * max|q| max|k| each); a pair where it fails (and a row that is not such a
 * vector: M = inf) takes the CPU's float loop instead (cb_ist_dot_cpu).
 * The head fold (acc += w_h dot_h for dot_h > 0, heads in order, no fused
 * multiply-add) is the CPU's, so the scores are its bits and the selection
 * (cb_is_select_kernel) its ids, ties included.
 *
 * Layout: cb_ist_prep_kernel writes each query head row and each key as
 * 128 int8 in fragment order (lane quad c's 32 bytes together: physical
 * dims 32 b + 8 c .. + 7 of block b at byte 32 c + 8 b; the mma's k order
 * is free, cuda_mma_s8.cuh), the blocks' powers of two and M. A row whose
 * values all fit int8 at its lowest exponent (M <= 127, "uniform": the
 * usual case, the blocks' FP4 scales within a factor 8) is stored at that
 * one exponent. cb_ist_score_kernel: a block takes 128 keys (staged in
 * shared memory) and 8 queries; warp w the heads 16 w .. 16 w + 15, an
 * 8-key tile a step: where the warp's 16 rows and the tile's keys are all
 * uniform, the 4 blocks accumulate in one mma chain and a dot is one
 * integer times 2^(eq + ek) (M <= 127 on both sides keeps the bound);
 * otherwise each block's integer is scaled by its own powers and the four
 * exact terms added. The dots go to shared memory, then a thread per key
 * folds the heads.
 */
#include "backend/cuda/cuda_attention.cuh"
#include "backend/cuda/cuda_mma_s8.cuh"

#define IST_HEADS 64
#define IST_DIM 128
#define IST_KT 128         /* keys a block */
#define IST_QPB 8          /* queries a block */
#define IST_KROW 144       /* staged key row stride, bytes: conflict-free 16-byte fragment loads */
#define IST_DS (IST_KT + 4) /* s_dot row (a head's dots) stride, floats */
#define IST_MIN_T 16       /* chunks of fewer queries keep the float kernel */
#define IST_EMIN (-63)     /* block exponents kept: products and sums stay normal floats */
#define IST_EMAX 50
#define IST_SMEM (IST_KT * IST_KROW + IST_KT * 16 + IST_KT * 4 + IST_HEADS * 4 + IST_HEADS * IST_DS * 4 + (IST_KT / 8) * 4)

/* bytes of `rows` prepared rows (a chunk's query heads, or its keys):
 * the int8 rows, then the blocks' powers (a float4 a row), then M (a
 * float a row) */
static size_t ist_prep_bytes(int64_t rows) { return (size_t)rows * (IST_DIM + 16 + 4); }

struct ist_rows {
    uint8_t *i8;
    float4 *pw;
    float *m;
};
static ist_rows ist_rows_at(uint8_t *base, int64_t rows)
{
    ist_rows r;
    r.i8 = base;
    r.pw = (float4 *)(base + (size_t)rows * IST_DIM);
    r.m = (float *)(base + (size_t)rows * (IST_DIM + 16));
    return r;
}

/* A warp prepares a row of 128 floats (lane l holds v4 = dims 4 l .. 4 l +
 * 3, block l / 8): its 128 int8 in fragment order at i8, its blocks'
 * powers at *pw and M at *m (global or shared memory). The row comes as
 * values, so that a caller can have several rows' loads in flight. */
__device__ __forceinline__ void ist_prep_row(float4 v4, uint8_t *i8, float4 *pw_out, float *m_out, int lane)
{
    const float v[4] = {v4.x, v4.y, v4.z, v4.w};
    const int NONE = 1 << 20;
    int low = NONE, bad = 0;
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t u = __float_as_uint(v[i]);
        const int ex = (int)((u >> 23) & 255u);
        const uint32_t mant = u & 0x7fffffu;
        if (ex == 255) bad = 1;
        else if (ex != 0 || mant != 0) {
            const uint32_t full = ex ? (mant | 0x800000u) : mant;
            const int lb = (ex ? ex : 1) - 150 + (__ffs((int)full) - 1); /* the lowest set bit's exponent */
            low = min(low, lb);
            amax = fmaxf(amax, fabsf(v[i]));
        }
    }
    int eb = low; /* the block's lowest exponent: lanes 8 b .. 8 b + 7 */
    for (int o = 1; o < 8; o <<= 1) eb = min(eb, __shfl_xor_sync(0xffffffffu, eb, o));
    int er = eb; /* the row's */
    for (int o = 8; o < 32; o <<= 1) er = min(er, __shfl_xor_sync(0xffffffffu, er, o));
    for (int o = 1; o < 32; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (er == NONE) er = 0;  /* a zero row */
    if (eb == NONE) eb = er; /* a zero block */
    bad = __any_sync(0xffffffffu, bad || er < IST_EMIN || eb > IST_EMAX);
    /* M: the row's largest value at its lowest exponent (exact: a power of two) */
    const float m = bad ? __int_as_float(0x7f800000) : __fmul_rn(amax, __int_as_float((127 - er) << 23));
    const bool uniform = m <= 127.f; /* the same on every lane */
    const int e = uniform ? er : eb;
    const float inv = bad ? 0.f : __int_as_float((127 - e) << 23);
    uint32_t packed = 0;
    int big = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float x = __fmul_rn(v[i], inv); /* an integer: every value's lowest bit is at or above 2^e */
        big |= fabsf(x) > 127.f;
        packed |= (uint32_t)(uint8_t)(int8_t)__float2int_rn(fminf(fmaxf(x, -127.f), 127.f)) << (8 * i);
    }
    bad = __any_sync(0xffffffffu, bad || big);
    const int b = lane >> 3, c = (lane & 7) >> 1;
    *(uint32_t *)(i8 + 32 * c + 8 * b + 4 * (lane & 1)) = bad ? 0u : packed;
    /* the blocks' powers: lane 8 b has block b's */
    const float pw = bad ? 0.f : __int_as_float((e + 127) << 23);
    const float p1 = __shfl_sync(0xffffffffu, pw, 8), p2 = __shfl_sync(0xffffffffu, pw, 16),
                p3 = __shfl_sync(0xffffffffu, pw, 24);
    if (lane == 0) {
        *pw_out = make_float4(pw, p1, p2, p3);
        *m_out = bad ? __int_as_float(0x7f800000) : m;
    }
}

/* A warp a row: the chunk's query head rows, then its keys. */
__global__ void __launch_bounds__(256) cb_ist_prep_kernel(const float *q, int64_t n_q, const float *k, int64_t n_k,
                                                           ist_rows Q, ist_rows K)
{
    ds4_pdl_enter();
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (row >= n_q + n_k) return;
    const bool is_q = row < n_q;
    const int64_t r = is_q ? row : row - n_q;
    const ist_rows &D = is_q ? Q : K;
    ist_prep_row(((const float4 *)((is_q ? q : k) + (size_t)r * IST_DIM))[lane], D.i8 + (size_t)r * IST_DIM, D.pw + r,
                 D.m + r, lane);
}

/* The CPU's dot (backend/cpu: 16 running sums over the dims, added in
 * order), for the pairs the exact bound does not cover. */
__device__ __noinline__ float cb_ist_dot_cpu(const float *q, const float *k)
{
    float acc[16];
#pragma unroll
    for (int j = 0; j < 16; j++) acc[j] = 0.f;
    for (int d = 0; d < IST_DIM; d += 16)
#pragma unroll
        for (int j = 0; j < 16; j++) acc[j] = __fadd_rn(acc[j], __fmul_rn(q[d + j], k[d + j]));
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < 16; j++) s = __fadd_rn(s, acc[j]);
    return s;
}

/* Tile j (8 keys) of the staged keys against the warp's two query rows
 * (heads h0 = row g and h1 = g + 8 of its 16: fragments qa / qb, powers,
 * M, qfast = every row of the warp uniform): the lane's four dots, exact,
 * into d0 (h0's s_dot row) and d1 (h1's). A pair the integer bound does
 * not cover takes the CPU's float loop on the float rows (q0 / q1, the
 * keys kf from key 0 of the block at k0; n_t keys in all). */
__device__ __forceinline__ void ist_tile_dots(const uint32_t (&qa)[8], const uint32_t (&qb)[8], float4 pq0, float4 pq1,
                                              float mq0, float mq1, bool qfast, const uint8_t *s_kb,
                                              const float4 *s_kp, const float *s_km, const int *s_tfast, int j, int g,
                                              int c, int64_t k0, int64_t n_t, const float *q0, const float *q1,
                                              const float *kf, float *d0, float *d1)
{
    const uint4 *kr = (const uint4 *)(s_kb + (8 * j + g) * IST_KROW + 32 * c);
    const uint4 k0v = kr[0], k1v = kr[1];
    const uint32_t kw[8] = {k0v.x, k0v.y, k0v.z, k0v.w, k1v.x, k1v.y, k1v.z, k1v.w};
    const int kc = 8 * j + 2 * c;
    const float4 pk0 = s_kp[kc], pk1 = s_kp[kc + 1];
    float d[4];
    if (qfast && s_tfast[j]) {
        /* one power a row: the four blocks' integers add in the mma */
        int acc[4] = {0, 0, 0, 0};
#pragma unroll
        for (int b = 0; b < 4; b++) {
            const uint32_t af[4] = {qa[2 * b], qb[2 * b], qa[2 * b + 1], qb[2 * b + 1]};
            ds4_mmc_s8(acc, af, kw[2 * b], kw[2 * b + 1]);
        }
        d[0] = __fmul_rn(__fmul_rn((float)acc[0], pq0.x), pk0.x);
        d[1] = __fmul_rn(__fmul_rn((float)acc[1], pq0.x), pk1.x);
        d[2] = __fmul_rn(__fmul_rn((float)acc[2], pq1.x), pk0.x);
        d[3] = __fmul_rn(__fmul_rn((float)acc[3], pq1.x), pk1.x);
    } else {
        /* a block's integer times its powers: four exact terms */
        int acc[4][4];
#pragma unroll
        for (int b = 0; b < 4; b++) {
            acc[b][0] = acc[b][1] = acc[b][2] = acc[b][3] = 0;
            const uint32_t af[4] = {qa[2 * b], qb[2 * b], qa[2 * b + 1], qb[2 * b + 1]};
            ds4_mmc_s8(acc[b], af, kw[2 * b], kw[2 * b + 1]);
        }
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float4 pq = e < 2 ? pq0 : pq1, pk = (e & 1) ? pk1 : pk0;
            float s = __fmul_rn(__fmul_rn((float)acc[0][e], pq.x), pk.x);
            s = __fmaf_rn(__fmul_rn((float)acc[1][e], pq.y), pk.y, s);
            s = __fmaf_rn(__fmul_rn((float)acc[2][e], pq.z), pk.z, s);
            d[e] = __fmaf_rn(__fmul_rn((float)acc[3][e], pq.w), pk.w, s);
        }
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int key = kc + (e & 1);
            const float mq = e < 2 ? mq0 : mq1;
            if (!(__fmul_rn(mq, s_km[key]) < 131072.f) && k0 + key < n_t)
                d[e] = cb_ist_dot_cpu(e < 2 ? q0 : q1, kf + (size_t)(k0 + key) * IST_DIM);
        }
    }
    d0[kc] = d[0];
    d0[kc + 1] = d[1];
    d1[kc] = d[2];
    d1[kc + 1] = d[3];
}

struct ist_args {
    ist_rows Q, K;
    const float *qf, *kf, *w; /* the float rows (for the fallback) and head weights */
    int T, ratio, topk;
    int64_t pos0, n_keys, max_n;
    float *scores;
};

/* grid (key block of 128, query block of 8), 128 threads */
__global__ void __launch_bounds__(128, 4) cb_ist_score_kernel(const ist_args a)
{
    extern __shared__ __align__(16) uint8_t ist_smem[];
    uint8_t *s_kb = ist_smem;                                   /* keys, IST_KROW bytes apart */
    float4 *s_kp = (float4 *)(s_kb + IST_KT * IST_KROW);        /* their blocks' powers */
    float *s_km = (float *)(s_kp + IST_KT);                     /* their M */
    float *s_w = s_km + IST_KT;                                 /* the query's head weights */
    float *s_dot = s_w + IST_HEADS;                             /* [head][key] */
    int *s_tfast = (int *)(s_dot + IST_HEADS * IST_DS);         /* per 8-key tile: all uniform */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
    const int64_t k0 = (int64_t)blockIdx.x * IST_KT;
    const int t0 = blockIdx.y * IST_QPB, tl = min(a.T, t0 + IST_QPB) - 1;
    ds4_pdl_enter();
    {
        const int64_t n_last = (a.pos0 + tl + 1) / a.ratio; /* the block's largest key count */
        if (n_last <= a.topk || k0 >= n_last) return;       /* uniform over the block */
    }
    const int nk = (int)min((int64_t)IST_KT, a.n_keys - k0);
    for (int i = tid; i < IST_KT * (IST_DIM / 16); i += 128) {
        const int r = i >> 3, p = i & 7;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < nk) v = *(const uint4 *)(a.K.i8 + (size_t)(k0 + r) * IST_DIM + 16 * p);
        *(uint4 *)(s_kb + r * IST_KROW + 16 * p) = v;
    }
    {
        const bool in = tid < nk;
        s_kp[tid] = in ? a.K.pw[k0 + tid] : make_float4(0.f, 0.f, 0.f, 0.f);
        const float m = in ? a.K.m[k0 + tid] : 0.f;
        s_km[tid] = m;
        /* warp w's lanes 0..31 = keys 32 w ..: 8-key tile (4 w + lane / 8) */
        const unsigned u = __ballot_sync(0xffffffffu, m <= 127.f);
        if ((lane & 7) == 0) s_tfast[4 * warp + (lane >> 3)] = ((u >> (lane & 24)) & 0xffu) == 0xffu;
    }
    __syncthreads();
    const int h0 = 16 * warp + g, h1 = h0 + 8;
    for (int tq = t0; tq <= tl; tq++) {
        const int64_t n_t = (a.pos0 + tq + 1) / a.ratio;
        if (n_t <= a.topk || k0 >= n_t) continue; /* uniform over the block */
        const size_t r0 = (size_t)tq * IST_HEADS + h0, r1 = r0 + 8;
        const uint4 *q0 = (const uint4 *)(a.Q.i8 + r0 * IST_DIM + 32 * c), *q1 = (const uint4 *)(a.Q.i8 + r1 * IST_DIM + 32 * c);
        const uint4 x0 = q0[0], x1 = q0[1], y0 = q1[0], y1 = q1[1];
        const uint32_t qa[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        const uint32_t qb[8] = {y0.x, y0.y, y0.z, y0.w, y1.x, y1.y, y1.z, y1.w};
        const float4 pq0 = a.Q.pw[r0], pq1 = a.Q.pw[r1];
        const float mq0 = a.Q.m[r0], mq1 = a.Q.m[r1];
        const bool qfast = __all_sync(0xffffffffu, mq0 <= 127.f && mq1 <= 127.f);
        if (tid < IST_HEADS) s_w[tid] = a.w[(size_t)tq * IST_HEADS + tid];
        const int tiles = (int)min((int64_t)(IST_KT / 8), (n_t - k0 + 7) / 8);
        for (int j = 0; j < tiles; j++)
            ist_tile_dots(qa, qb, pq0, pq1, mq0, mq1, qfast, s_kb, s_kp, s_km, s_tfast, j, g, c, k0, n_t,
                          a.qf + r0 * IST_DIM, a.qf + r1 * IST_DIM, a.kf, s_dot + h0 * IST_DS, s_dot + h1 * IST_DS);
        __syncthreads();
        if (k0 + tid < n_t) {
            float acc = 0.f;
            for (int h = 0; h < IST_HEADS; h++) {
                const float dd = s_dot[h * IST_DS + tid];
                if (dd > 0) acc = __fadd_rn(acc, __fmul_rn(s_w[h], dd));
            }
            a.scores[(size_t)tq * a.max_n + k0 + tid] = acc;
        }
        __syncthreads(); /* s_dot and s_w are rewritten by the next query */
    }
}

/* One decode query (T = 1) scored on the int8 tensor cores: the chunk
 * kernel's dots and fold, with the rows prepared inside each block (the
 * query's 64 head rows and the block's 128 keys, by ist_prep_row, the
 * prep kernel's operations) instead of by a launch of their own, and the
 * position read where the kernel runs (d_pos: a recorded graph's step), so
 * one recording serves every position below its bound.
 *
 * Why: in-graph at a 32K frontier (8,192 keys) the CUDA-core scores
 * (cb_is_score_kernel: every product and sum a float operation in the
 * CPU's order) took 15.5 us a CSA layer, 9 more than at 2K, the largest
 * part of what a 32K step still adds (thirty-first session, docs/CUDA.md);
 * a key's 64 x 128 products are here 16 int8 mma a warp's tile.
 * Opt-in, DS4_CUDA_IS_DEC_TC=1 (read once): its first GPU call gave the
 * CUDA-core kernel's logits bit for bit over 2560 decoded positions of the
 * 8-layer synthetic, but no gain at 32K (one A/B pair, H100: 188.9
 * against 190.6 tokens/s), and its test_cuda_ops cases did not run to
 * their end in that call; the in-graph times of both forms decide. */
struct ist_dec_args {
    const float *qf, *kf, *w; /* the query's head rows, the keys, the head weights */
    const int64_t *d_pos;     /* position: *d_pos + pos_arg, or pos_arg */
    int64_t pos_arg;
    int ratio, topk;
    float *scores;
};
/* the chunk kernel's shared memory, then the query's prepared rows */
#define IST_DEC_SMEM (IST_SMEM + IST_HEADS * IST_DIM + IST_HEADS * 16 + IST_HEADS * 4)

/* grid: key blocks of 128 over the planned keys; 256 threads: warps w and
 * w + 4 take heads 16 w .. 16 w + 15, tiles 0-7 and 8-15 of the keys */
__global__ void __launch_bounds__(256) cb_ist_dec_kernel(const ist_dec_args a)
{
    extern __shared__ __align__(16) uint8_t ist_smem[];
    uint8_t *s_kb = ist_smem;
    float4 *s_kp = (float4 *)(s_kb + IST_KT * IST_KROW);
    float *s_km = (float *)(s_kp + IST_KT);
    float *s_w = s_km + IST_KT;
    float *s_dot = s_w + IST_HEADS;
    int *s_tfast = (int *)(s_dot + IST_HEADS * IST_DS);
    uint8_t *s_qb = ist_smem + IST_SMEM;                 /* the query's rows, IST_DIM bytes apart */
    float4 *s_qp = (float4 *)(s_qb + IST_HEADS * IST_DIM); /* their blocks' powers */
    float *s_qm = (float *)(s_qp + IST_HEADS);             /* their M */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
    const int64_t k0 = (int64_t)blockIdx.x * IST_KT;
    ds4_pdl_enter();
    const int64_t n = (cb_pos(a.d_pos, a.pos_arg) + 1) / a.ratio;
    if (n <= a.topk || k0 >= n) return; /* uniform over the block */
    const int nk = (int)min((int64_t)IST_KT, n - k0);
    /* the rows a warp prepares, 8 apart, their loads in flight together
     * (each row's preparation is a chain of shuffles); a key row past the
     * keys is prepared from zeros, its dots never folded */
    {
        float4 v[IST_HEADS / 8];
#pragma unroll
        for (int i = 0; i < IST_HEADS / 8; i++) v[i] = ((const float4 *)(a.qf + (size_t)(warp + 8 * i) * IST_DIM))[lane];
#pragma unroll
        for (int i = 0; i < IST_HEADS / 8; i++) {
            const int r = warp + 8 * i;
            ist_prep_row(v[i], s_qb + r * IST_DIM, s_qp + r, s_qm + r, lane);
        }
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float4 v[IST_KT / 16];
#pragma unroll
        for (int i = 0; i < IST_KT / 16; i++) {
            const int r = warp + 8 * (i + IST_KT / 16 * h);
            v[i] = r < nk ? ((const float4 *)(a.kf + (size_t)(k0 + r) * IST_DIM))[lane] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int i = 0; i < IST_KT / 16; i++) {
            const int r = warp + 8 * (i + IST_KT / 16 * h);
            ist_prep_row(v[i], s_kb + r * IST_KROW, s_kp + r, s_km + r, lane);
        }
    }
    if (tid < IST_HEADS) s_w[tid] = a.w[tid];
    __syncthreads();
    if (tid < IST_KT) {
        /* warp w's lanes = keys 32 w ..: 8-key tile (4 w + lane / 8) all uniform */
        const unsigned u = __ballot_sync(0xffffffffu, s_km[tid] <= 127.f);
        if ((lane & 7) == 0) s_tfast[4 * warp + (lane >> 3)] = ((u >> (lane & 24)) & 0xffu) == 0xffu;
    }
    __syncthreads();
    {
        const int h0 = 16 * (warp & 3) + g, h1 = h0 + 8;
        const uint4 *q0 = (const uint4 *)(s_qb + h0 * IST_DIM + 32 * c), *q1 = (const uint4 *)(s_qb + h1 * IST_DIM + 32 * c);
        const uint4 x0 = q0[0], x1 = q0[1], y0 = q1[0], y1 = q1[1];
        const uint32_t qa[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        const uint32_t qb[8] = {y0.x, y0.y, y0.z, y0.w, y1.x, y1.y, y1.z, y1.w};
        const float4 pq0 = s_qp[h0], pq1 = s_qp[h1];
        const float mq0 = s_qm[h0], mq1 = s_qm[h1];
        const bool qfast = __all_sync(0xffffffffu, mq0 <= 127.f && mq1 <= 127.f);
        const int tiles = (int)min((int64_t)(IST_KT / 8), (n - k0 + 7) / 8), j1 = min(tiles, 8 * (warp >> 2) + 8);
        for (int j = 8 * (warp >> 2); j < j1; j++)
            ist_tile_dots(qa, qb, pq0, pq1, mq0, mq1, qfast, s_kb, s_kp, s_km, s_tfast, j, g, c, k0, n,
                          a.qf + (size_t)h0 * IST_DIM, a.qf + (size_t)h1 * IST_DIM, a.kf, s_dot + h0 * IST_DS,
                          s_dot + h1 * IST_DS);
    }
    __syncthreads();
    if (tid < nk) {
        float acc = 0.f;
        for (int h = 0; h < IST_HEADS; h++) {
            const float dd = s_dot[h * IST_DS + tid];
            if (dd > 0) acc = __fadd_rn(acc, __fmul_rn(s_w[h], dd));
        }
        a.scores[k0 + tid] = acc;
    }
}

static bool ist_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_INDEXER_TC", &on);
}

size_t cb_indexer_tc_bytes(ds4_backend *be, const float *qi, int T, int n_heads, int dim, const float *keys,
                           int64_t pos0, int ratio, bool qat_queries)
{
    cuda_backend *c = cb_of(be);
    if (!qat_queries || c->cu->cc_major < 8 || !ist_on() || T < IST_MIN_T || n_heads != IST_HEADS ||
        dim != IST_DIM || ratio < 1 || ((uintptr_t)qi & 15u) != 0 || ((uintptr_t)keys & 15u) != 0 ||
        (T + IST_QPB - 1) / IST_QPB > 65535)
        return 0;
    const int64_t n_keys = (pos0 + T) / ratio;
    return ist_prep_bytes((int64_t)T * IST_HEADS) + ist_prep_bytes(n_keys) + 16;
}

/* A kernel's dynamic shared memory past 48 KB, asked once a backend (bit:
 * its flag in ist_smem); false after failing the backend when refused. */
template <typename K> static bool ist_grant_smem(ds4_backend *be, K *kernel, size_t bytes, int bit)
{
    cuda_backend *c = cb_of(be);
    if (c->ist_smem & bit) return true;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess) {
        cb_fail_status(be, ds4_fail(DS4_ERR_BACKEND, "cuda indexer: %zu bytes of shared memory: %s", bytes,
                                    cudaGetErrorString(e)),
                       "indexer_topk");
        return false;
    }
    c->ist_smem |= bit;
    return true;
}

void cb_indexer_tc_score(ds4_backend *be, const float *qi, const float *w, int T, const float *keys, int64_t pos0,
                         int ratio, int topk, float *scores, int64_t max_n, void *prep)
{
    if (!ist_grant_smem(be, cb_ist_score_kernel, IST_SMEM, 1)) return;
    const int64_t n_q = (int64_t)T * IST_HEADS, n_keys = (pos0 + T) / ratio;
    uint8_t *base = (uint8_t *)(((uintptr_t)prep + 15u) & ~(uintptr_t)15u);
    ist_args a;
    a.Q = ist_rows_at(base, n_q);
    a.K = ist_rows_at(base + ist_prep_bytes(n_q), n_keys);
    a.qf = qi, a.kf = keys, a.w = w;
    a.T = T, a.ratio = ratio, a.topk = topk;
    a.pos0 = pos0, a.n_keys = n_keys, a.max_n = max_n;
    a.scores = scores;
    ds4_launch(cb_ist_prep_kernel, (unsigned)((n_q + n_keys + 7) / 8), 256, 0, cb_stream(be), qi, n_q, keys, n_keys,
               a.Q, a.K);
    ds4_launch(cb_ist_score_kernel, dim3((unsigned)((n_keys + IST_KT - 1) / IST_KT), (unsigned)((T + IST_QPB - 1) / IST_QPB)),
               128, IST_SMEM, cb_stream(be), a);
}

static bool ist_dec_on(void)
{
    static int on = -1;
    return ds4_env_flag_on("DS4_CUDA_IS_DEC_TC", &on);
}

bool cb_indexer_tc_decode_fits(ds4_backend *be, const float *qi, int n_heads, int dim, const float *keys, int ratio,
                               bool qat_queries)
{
    cuda_backend *c = cb_of(be);
    return qat_queries && c->cu->cc_major >= 8 && ist_dec_on() && n_heads == IST_HEADS && dim == IST_DIM &&
           ratio >= 1 && ((uintptr_t)qi & 15u) == 0 && ((uintptr_t)keys & 15u) == 0;
}

bool cb_indexer_tc_decode(ds4_backend *be, const float *qi, const float *w, const float *keys, const int64_t *d_pos,
                          int64_t pos_arg, int ratio, int topk, float *scores, int64_t max_n)
{
    if (!ist_grant_smem(be, cb_ist_dec_kernel, IST_DEC_SMEM, 2)) return false;
    ist_dec_args a;
    a.qf = qi, a.kf = keys, a.w = w;
    a.d_pos = d_pos, a.pos_arg = pos_arg;
    a.ratio = ratio, a.topk = topk;
    a.scores = scores;
    ds4_launch(cb_ist_dec_kernel, (unsigned)((max_n + IST_KT - 1) / IST_KT), 256, IST_DEC_SMEM, cb_stream(be), a);
    return true;
}

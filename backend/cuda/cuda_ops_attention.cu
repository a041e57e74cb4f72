/*
 * cuda_ops_attention.cu - CUDA ops for the attention state and math: KV
 * rounding (official numerics), the compressor frontier, the lightning
 * indexer's top-k, mixed sparse attention with sinks, the ring update.
 * Math: dsv4-model.md §3.4-§3.6, §4.1, §5.1; the CPU twin is
 * backend/cpu/ops_cpu_attention.c, whose float operation order these
 * kernels keep where it decides rounding (pooling, norms, RoPE, scores).
 *
 * Shapes are small per token (head_dim 512, a window of 128 raw rows, at
 * most top-k compressed rows), so the kernels favour simple, exact
 * structure: one thread block per (query, head) for attention, one per
 * query for the indexer, one block walking the chunk's tokens in order for
 * the compressor (its state is a sequential recurrence).
 */
#include "backend/cuda/cuda_attention.cuh"
#include "backend/cuda/cuda_numerics.cuh"
#include "backend/cuda/cuda_q8m.cuh"

/* ---- official rounding ------------------------------------------------- */

__global__ void cb_kv_round_kernel(float *x, int row_len, int fp8_nope, int f16_store)
{
    ds4_pdl_enter();
    cb_kv_round_row_block(x + (size_t)blockIdx.x * row_len, row_len, fp8_nope, f16_store);
}

static void op_kv_round(ds4_backend *be, float *x, int64_t n_rows, int row_len, const ds4_kv_numerics *nm)
{
    cb_prof_scope prof_(be, "kv_round");
    CB_GRAPH_SKIP(be, 20, x, n_rows, row_len, nm->fp8_nope, nm->f16_store);
    for (int64_t r0 = 0; r0 < n_rows; r0 += 65535) {
        int64_t n = n_rows - r0 < 65535 ? n_rows - r0 : 65535;
        ds4_launch(cb_kv_round_kernel, (unsigned)n, 128, 0, cb_stream(be), x + r0 * row_len, row_len, nm->fp8_nope,
                                                                   nm->f16_store ? 1 : 0);
    }
    cb_check_launch(be, "kv_round");
}

__global__ void cb_indexer_qat_kernel(float *x, int row_len)
{
    ds4_pdl_enter();
    __shared__ float row[128];
    float *g = x + (size_t)blockIdx.x * row_len;
    for (int i = threadIdx.x; i < 128; i += blockDim.x) row[i] = g[i];
    cb_indexer_qat_row<false>(row);
    for (int i = threadIdx.x; i < 128; i += blockDim.x) g[i] = row[i];
}

/* The same for rows of 128 (the model's), a warp a row, 8 rows a block:
 * the block-per-row kernel's ~12 block barriers a row took 188 us for a
 * 2048-token chunk's 131072 query rows (ncu, 8-layer prefill). */
#define CB_QAT_WARPS 8
__global__ void __launch_bounds__(32 * CB_QAT_WARPS) cb_indexer_qat_warp_kernel(float *x, int64_t n_rows)
{
    ds4_pdl_enter();
    __shared__ float rows[CB_QAT_WARPS][128];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * CB_QAT_WARPS + warp;
    if (r >= n_rows) return; /* whole warps; no block barrier below */
    float *g = x + (size_t)r * 128, *row = rows[warp];
    for (int i = lane; i < 128; i += 32) row[i] = g[i];
    cb_indexer_qat_row<true>(row);
    for (int i = lane; i < 128; i += 32) g[i] = row[i];
}

static void op_indexer_qat(ds4_backend *be, float *x, int64_t n_rows, int row_len)
{
    cb_prof_scope prof_(be, "indexer_qat");
    /* the next indexer_topk on these rows may score them on the tensor
     * cores (cuda_indexer_tc.cu: exact for any rows, fast for these) */
    cb_of(be)->idx_qat_rows = x, cb_of(be)->idx_qat_len = n_rows * row_len;
    CB_GRAPH_SKIP(be, 21, x, n_rows, row_len);
    static int warp_on = -1; /* DS4_CUDA_QAT_WARP=0: the block-per-row kernel (A/B) */
    if (row_len == 128 && ds4_env_switch_on("DS4_CUDA_QAT_WARP", &warp_on)) {
        const int64_t nb = (n_rows + CB_QAT_WARPS - 1) / CB_QAT_WARPS;
        for (int64_t b0 = 0; b0 < nb; b0 += 65535) {
            const int64_t n = nb - b0 < 65535 ? nb - b0 : 65535;
            ds4_launch(cb_indexer_qat_warp_kernel, (unsigned)n, 32 * CB_QAT_WARPS, 0, cb_stream(be),
                       x + b0 * CB_QAT_WARPS * 128, n_rows - b0 * CB_QAT_WARPS);
        }
        cb_check_launch(be, "indexer_qat");
        return;
    }
    for (int64_t r0 = 0; r0 < n_rows; r0 += 65535) {
        int64_t n = n_rows - r0 < 65535 ? n_rows - r0 : 65535;
        ds4_launch(cb_indexer_qat_kernel, (unsigned)n, 128, 0, cb_stream(be), x + r0 * row_len, row_len);
    }
    cb_check_launch(be, "indexer_qat");
}

/* ---- compressor (§3.5) ------------------------------------------------- */

struct cb_comp_args {
    int r, od, overlap;
    int64_t cap_rows;
    float *buf_c, *buf_z, *prev_c, *prev_z, *rows;
    const float *c, *z, *ape, *nw, *om;
    int T, n_rot;
    int64_t pos0; /* plus *d_pos when d_pos is set (graph step) */
    const int64_t *d_pos;
    float eps;
    int fp8_nope, f16_store, qat, is_indexer;
    int warp; /* small-kernel v2: a warp per rounding block */
};

/* The pending window's tokens and the previous window as the sequential
 * kernel holds them: slot k of buf, prev. (Pointers by value: a kernel
 * parameter whose address is taken is copied to local memory.) */
struct cb_comp_seq {
    const float *bc, *bz, *prc, *prz;
    int win, od;
    __device__ float c(int k, int j) const { return bc[(size_t)k * win + j]; }
    __device__ float z(int k, int j) const { return bz[(size_t)k * win + j]; }
    __device__ float pc(int k, int d) const { return prc[(size_t)k * od + d]; }
    __device__ float pz(int k, int d) const { return prz[(size_t)k * od + d]; }
};
__device__ __forceinline__ cb_comp_seq cb_comp_seq_of(const cb_comp_args &a)
{
    return cb_comp_seq{a.buf_c, a.buf_z, a.prev_c, a.prev_z, a.overlap ? 2 * a.od : a.od, a.od};
}

/* The same values for window w of a chunk (positions pos0 .. pos0 + T - 1),
 * read where they are before the chunk is pushed: a position in the chunk
 * from its inputs (the gate plus ape, as buf_z stores it), an earlier one
 * from buf (the window the chunk starts in), and the window before w from
 * prev when it was emitted before the chunk. */
struct cb_comp_par {
    const float *in_c, *in_z, *ape, *bc, *bz, *prc, *prz;
    int win, od, r;
    int64_t w, pos0;
    __device__ float tok_c(int64_t pos, int k, int j) const
    {
        return pos >= pos0 ? in_c[(size_t)(pos - pos0) * win + j] : bc[(size_t)k * win + j];
    }
    __device__ float tok_z(int64_t pos, int k, int j) const
    {
        return pos >= pos0 ? __fadd_rn(in_z[(size_t)(pos - pos0) * win + j], ape[(size_t)k * win + j])
                           : bz[(size_t)k * win + j];
    }
    __device__ float c(int k, int j) const { return tok_c(w * r + k, k, j); }
    __device__ float z(int k, int j) const { return tok_z(w * r + k, k, j); }
    __device__ bool prev_in_chunk() const { return w * r - 1 >= pos0; } /* window w - 1 emitted here */
    __device__ float pc(int k, int d) const
    {
        return prev_in_chunk() ? tok_c((w - 1) * r + k, k, d) : prc[(size_t)k * od + d];
    }
    __device__ float pz(int k, int d) const
    {
        return prev_in_chunk() ? tok_z((w - 1) * r + k, k, d) : prz[(size_t)k * od + d];
    }
};
__device__ __forceinline__ cb_comp_par cb_comp_par_of(const cb_comp_args &a, int64_t w)
{
    return cb_comp_par{a.c,      a.z,        a.ape, a.buf_c, a.buf_z, a.prev_c, a.prev_z, a.overlap ? 2 * a.od : a.od,
                       a.od,     a.r,        w,     a.pos0};
}

/* Dim d of window w's softmax-pooled row (src: the window's tokens and,
 * with the overlap, the window before): the max over the gates, then the
 * exp-weighted sums in token order. The loads of CB_POOL_B tokens are
 * issued before their arithmetic, whose operations and order are the same
 * (an HCA window pools 128 tokens, and one dependent load after another
 * left it latency-bound): 16 for HCA's windows, 4 for CSA's. */
template <int CB_POOL_B, typename Src>
__device__ __forceinline__ float cb_comp_pool(const cb_comp_args &a, const Src &src, int d)
{
    const int off = a.overlap ? a.od : 0;
    float m = -INFINITY;
    for (int k0 = 0; k0 < a.r; k0 += CB_POOL_B) {
        float zb[CB_POOL_B], pz[CB_POOL_B];
#pragma unroll
        for (int i = 0; i < CB_POOL_B; i++)
            if (k0 + i < a.r) {
                zb[i] = src.z(k0 + i, off + d);
                if (a.overlap) pz[i] = src.pz(k0 + i, d);
            }
#pragma unroll
        for (int i = 0; i < CB_POOL_B; i++)
            if (k0 + i < a.r) {
                if (zb[i] > m) m = zb[i];
                if (a.overlap && pz[i] > m) m = pz[i];
            }
    }
    float den = 0.f, num = 0.f;
    for (int k0 = 0; k0 < a.r; k0 += CB_POOL_B) {
        float zb[CB_POOL_B], cb[CB_POOL_B], pz[CB_POOL_B], pc[CB_POOL_B];
#pragma unroll
        for (int i = 0; i < CB_POOL_B; i++)
            if (k0 + i < a.r) {
                zb[i] = src.z(k0 + i, off + d);
                cb[i] = src.c(k0 + i, off + d);
                if (a.overlap) pz[i] = src.pz(k0 + i, d), pc[i] = src.pc(k0 + i, d);
            }
#pragma unroll
        for (int i = 0; i < CB_POOL_B; i++)
            if (k0 + i < a.r) {
                if (a.overlap) {
                    const float e = expf(__fsub_rn(pz[i], m));
                    den = __fadd_rn(den, e);
                    num = __fadd_rn(num, __fmul_rn(e, pc[i]));
                }
                const float e = expf(__fsub_rn(zb[i], m));
                den = __fadd_rn(den, e);
                num = __fadd_rn(num, __fmul_rn(e, cb[i]));
            }
    }
    return __fdiv_rn(num, den);
}

/* Window w's row from its pooled values in s_row (ss: this thread's sum
 * of their squares, its dims d = threadIdx.x + k blockDim.x in order):
 * RMS norm, RoPE at the window's first position, the KV rounding (or the
 * indexer's QAT), stored as row w. Every thread of the block calls it. */
__device__ __forceinline__ void cb_comp_finish(const cb_comp_args &a, int64_t p, float *s_row, double *red, double ss)
{
    const int od = a.od;
    const int64_t w = p / a.r;
    const float rs = (float)(1.0 / sqrt(cb_block_sum_double_serial(ss, red) / od + a.eps));
    for (int d = threadIdx.x; d < od; d += blockDim.x) s_row[d] = __fmul_rn(__fmul_rn(s_row[d], rs), a.nw[d]);
    __syncthreads();
    /* RoPE at the window's first position */
    for (int i = threadIdx.x; i < a.n_rot / 2; i += blockDim.x) {
        const float theta = __fmul_rn((float)(p + 1 - a.r), a.om[i]);
        const float cs = (float)cos((double)theta), sn = (float)sin((double)theta);
        float *e = s_row + od - a.n_rot + 2 * i;
        const float x0 = e[0], x1 = e[1];
        e[0] = __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
        e[1] = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, cs));
    }
    __syncthreads();
    if (a.is_indexer) {
        if (a.qat) cb_indexer_qat_row<false>(s_row);
    } else {
        cb_kv_round_row_block(s_row, od, a.fp8_nope, a.f16_store);
    }
    __syncthreads();
    if (w < a.cap_rows)
        for (int d = threadIdx.x; d < od; d += blockDim.x) a.rows[(size_t)w * od + d] = s_row[d];
}

/* Window w's row (its last token at position p): the softmax-pooled
 * values, then cb_comp_finish. Every thread of the block calls it. s_row:
 * od floats of shared memory. */
template <int B, typename Src>
__device__ __forceinline__ void cb_comp_emit(const cb_comp_args &a, const Src &src, int64_t p, float *s_row,
                                             double *red)
{
    double ss = 0.0;
    for (int d = threadIdx.x; d < a.od; d += blockDim.x) {
        const float zs = cb_comp_pool<B>(a, src, d);
        s_row[d] = zs;
        ss += (double)zs * zs;
    }
    cb_comp_finish(a, p, s_row, red, ss);
}

/* One block walks the chunk's tokens in order (decode: one token, its
 * position possibly on the device); dynamic shared memory holds the pooled
 * row (od floats). Every thread of the block calls it. */
__device__ __forceinline__ void cb_compressor_walk(const cb_comp_args &a, float *s_row, double *red)
{
    const int win = a.overlap ? 2 * a.od : a.od, od = a.od;
    const int64_t pos0 = cb_pos(a.d_pos, a.pos0);
    const cb_comp_seq src = cb_comp_seq_of(a);
    for (int t = 0; t < a.T; t++) {
        const int64_t p = pos0 + t;
        const int s = (int)(p % a.r);
        for (int j = threadIdx.x; j < win; j += blockDim.x) {
            a.buf_c[(size_t)s * win + j] = a.c[(size_t)t * win + j];
            a.buf_z[(size_t)s * win + j] = __fadd_rn(a.z[(size_t)t * win + j], a.ape[(size_t)s * win + j]);
        }
        __syncthreads();
        if (s != a.r - 1) continue;
        cb_comp_emit<16>(a, src, p, s_row, red);
        if (a.overlap)
            for (int i = threadIdx.x; i < a.r * od; i += blockDim.x) {
                const int k = i / od, d = i % od;
                a.prev_c[i] = a.buf_c[(size_t)k * win + d];
                a.prev_z[i] = a.buf_z[(size_t)k * win + d];
            }
        __syncthreads();
    }
}

__global__ void cb_compressor_kernel(cb_comp_args a)
{
    ds4_pdl_enter();
    extern __shared__ float s_row[];
    __shared__ double red[32];
    cb_compressor_walk(a, s_row, red);
}

/* Batched decode: sequence i's one token pushed into its own state by
 * block i, the walk above on table entry i (same operations, same bits). */
#define CB_COMP_SEQS_MAX 16
struct cb_comp_seqs {
    cb_comp_args a[CB_COMP_SEQS_MAX];
};
static_assert(sizeof(cb_comp_seqs) <= 4000, "the sequences' arguments must fit a kernel's parameters");

__global__ void cb_compressor_seqs_kernel(const __grid_constant__ cb_comp_seqs S)
{
    ds4_pdl_enter();
    extern __shared__ float s_row[];
    __shared__ double red[32];
    cb_compressor_walk(S.a[blockIdx.x], s_row, red);
}

/* Prefill: the chunk's windows at once (the first window ends at position
 * p_first), in two kernels: each pooled value by its own thread, grid
 * (dim blocks, windows), into the window's row of the state (rows past
 * cap_rows are not kept, so not pooled), then a block a window finishes
 * its row there (cb_comp_finish, with each thread's squares summed over
 * the same dims in the same order as cb_comp_emit). The state kernels
 * below then leave buf and prev as the sequential walk would. Same
 * operations in the same order per row, so the same bits. Why two
 * kernels: an HCA chunk of 2048 tokens emits 16 windows, and a block per
 * window pooling 128 tokens for each of 512 dims took 265 us (ncu; now
 * 84 + 6 us). Windows of fewer than CB_POOL_MIN_R tokens keep a block a
 * window (cb_compressor_rows_kernel below). */
#define CB_POOL_THREADS 128
__global__ void __launch_bounds__(CB_POOL_THREADS) cb_compressor_pool_kernel(cb_comp_args a, int64_t p_first)
{
    ds4_pdl_enter();
    const int64_t w = (p_first + (int64_t)blockIdx.y * a.r) / a.r;
    const int d = (int)(blockIdx.x * CB_POOL_THREADS + threadIdx.x);
    if (d >= a.od || w >= a.cap_rows) return;
    const cb_comp_par src = cb_comp_par_of(a, w);
    a.rows[(size_t)w * a.od + d] = cb_comp_pool<16>(a, src, d);
}

__global__ void cb_compressor_finish_kernel(cb_comp_args a, int64_t p_first)
{
    ds4_pdl_enter();
    extern __shared__ float s_row[];
    __shared__ double red[32];
    const int64_t p = p_first + (int64_t)blockIdx.x * a.r, w = p / a.r;
    if (w >= a.cap_rows) return; /* the whole block */
    double ss = 0.0;
    for (int d = threadIdx.x; d < a.od; d += blockDim.x) {
        const float zs = a.rows[(size_t)w * a.od + d];
        s_row[d] = zs;
        ss += (double)zs * zs;
    }
    cb_comp_finish(a, p, s_row, red, ss);
}

/* The same rows with few tokens a window (CSA's 4, the indexer's): a
 * block a window pools and finishes its row (cb_comp_emit), which took
 * half the two kernels' time there (22 against 51 us a 2048-token chunk,
 * ncu). */
__global__ void cb_compressor_rows_kernel(cb_comp_args a, int64_t p_first)
{
    ds4_pdl_enter();
    extern __shared__ float s_row[];
    __shared__ double red[32];
    const int64_t p = p_first + (int64_t)blockIdx.x * a.r;
    const cb_comp_par src = cb_comp_par_of(a, p / a.r);
    cb_comp_emit<4>(a, src, p, s_row, red);
}
#define CB_POOL_MIN_R 16 /* windows of this many tokens or more take the pool and finish kernels */

/* prev = the last emitted window's tokens (p_last: its last position),
 * read where they are (the chunk or buf) before buf is written: a thread a
 * value. */
__global__ void cb_compressor_prev_kernel(cb_comp_args a, int64_t p_last)
{
    ds4_pdl_enter();
    const int od = a.od;
    const cb_comp_par src = cb_comp_par_of(a, p_last / a.r);
    const int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= a.r * od) return;
    const int k = i / od, d = i % od;
    a.prev_c[i] = src.c(k, d);
    a.prev_z[i] = src.z(k, d);
}

/* buf slot s = the chunk's last token in slot s (others untouched): a
 * thread a value (one block walked the 64K values of an HCA state: 268 us
 * a 2048-token chunk, ncu). */
__global__ void cb_compressor_buf_kernel(cb_comp_args a)
{
    ds4_pdl_enter();
    const int win = a.overlap ? 2 * a.od : a.od;
    const int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= a.r * win) return;
    const int64_t end = a.pos0 + a.T - 1;
    const int s = i / win, j = i % win;
    if (end < s) return; /* no position of the chunk in slot s */
    const int64_t t = (int64_t)a.T - 1 - (end - s) % a.r; /* its last token in slot s */
    if (t < 0) return;
    a.buf_c[i] = a.c[(size_t)t * win + j];
    a.buf_z[i] = __fadd_rn(a.z[(size_t)t * win + j], a.ape[i]);
}

static bool cb_comp_par_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_COMP_PAR", &on);
}

/* The kernels' arguments for one push of T tokens at pos0 into st;
 * false (the op failed, named) when the weights are missing or of a type
 * the kernels do not take. */
static bool cb_comp_args_of(ds4_backend *be, ds4_comp_state *st, const float *c, const float *z, int T, int64_t pos0,
                            const ds4_weight *ape, const ds4_weight *norm, float eps, const ds4_weight *omega,
                            int n_rot, const ds4_kv_numerics *nm, bool is_indexer, cb_comp_args *out)
{
    cb_comp_args a;
    a.r = st->ratio;
    a.od = st->out_dim;
    a.overlap = st->overlap ? 1 : 0;
    a.cap_rows = st->cap_rows;
    a.buf_c = st->buf_c, a.buf_z = st->buf_z, a.prev_c = st->prev_c, a.prev_z = st->prev_z, a.rows = st->rows;
    a.c = c, a.z = z;
    a.ape = (const float *)cb_weight(be, ape);
    a.nw = (const float *)cb_weight(be, norm);
    a.om = (const float *)cb_weight(be, omega);
    a.T = T, a.n_rot = n_rot, a.eps = eps;
    a.d_pos = cb_graph_pos(be, pos0, &a.pos0);
    a.fp8_nope = nm->fp8_nope, a.f16_store = nm->f16_store ? 1 : 0, a.qat = nm->indexer_qat ? 1 : 0;
    a.is_indexer = is_indexer ? 1 : 0;
    a.warp = 0;
    if (!a.ape || !a.nw || !a.om) return false;
    if (ape->type != DS4_TYPE_F32 || norm->type != DS4_TYPE_F32 || (is_indexer && a.qat && a.od != 128)) {
        cb_fail_status(be, ds4_fail(DS4_ERR_UNSUPPORTED, "cuda compressor: ape/norm must be F32 (indexer width 128)"),
                       "compressor_push");
        return false;
    }
    be->stats.compressor_pushes += (uint64_t)T;
    for (int t = 0; t < T; t++)
        if ((pos0 + t) % a.r == a.r - 1) be->stats.rows_emitted++;
    *out = a;
    return true;
}

static void cb_comp_note(ds4_backend *be, const cb_comp_args &a)
{
    cb_graph_note(be, 22, a.r, a.od, a.overlap, a.cap_rows, a.buf_c, a.buf_z, a.prev_c, a.prev_z, a.rows, a.c, a.z,
                  a.ape, a.nw, a.om, a.T, a.n_rot, a.pos0, a.eps, a.fp8_nope, a.f16_store, a.qat, a.is_indexer);
}

static void op_compressor_push(ds4_backend *be, ds4_comp_state *st, const float *c, const float *z, int T,
                               int64_t pos0, const ds4_weight *ape, const ds4_weight *norm, float eps,
                               const ds4_weight *omega, int n_rot, const ds4_kv_numerics *nm, bool is_indexer)
{
    cb_prof_scope prof_(be, "compressor_push");
    cb_comp_args a;
    if (!cb_comp_args_of(be, st, c, z, T, pos0, ape, norm, eps, omega, n_rot, nm, is_indexer, &a)) return;
    cb_comp_note(be, a);
    if (cb_graph_dry(be)) return;
    if (!a.d_pos && T > 1 && pos0 >= 0 && cb_comp_par_on()) {
        /* prefill: the chunk's windows in parallel, then the state */
        const int64_t p_first = pos0 + (a.r - 1 - pos0 % a.r), end = pos0 + T - 1;
        const int64_t n_emit = p_first <= end ? (end - p_first) / a.r + 1 : 0;
        for (int64_t e0 = 0; e0 < n_emit; e0 += 65535) {
            const int64_t n = n_emit - e0 < 65535 ? n_emit - e0 : 65535;
            if (a.r < CB_POOL_MIN_R) {
                ds4_launch(cb_compressor_rows_kernel, (unsigned)n, 256, (size_t)a.od * sizeof(float), cb_stream(be),
                           a, p_first + e0 * a.r);
                continue;
            }
            ds4_launch(cb_compressor_pool_kernel, dim3((unsigned)((a.od + CB_POOL_THREADS - 1) / CB_POOL_THREADS),
                                                       (unsigned)n),
                       CB_POOL_THREADS, 0, cb_stream(be), a, p_first + e0 * a.r);
            ds4_launch(cb_compressor_finish_kernel, (unsigned)n, 256, (size_t)a.od * sizeof(float), cb_stream(be), a,
                       p_first + e0 * a.r);
        }
        const int win = a.overlap ? 2 * a.od : a.od;
        if (a.overlap && n_emit)
            ds4_launch(cb_compressor_prev_kernel, (unsigned)((a.r * a.od + 255) / 256), 256, 0, cb_stream(be), a,
                       p_first + (n_emit - 1) * a.r);
        ds4_launch(cb_compressor_buf_kernel, (unsigned)((a.r * win + 255) / 256), 256, 0, cb_stream(be), a);
    } else {
        ds4_launch(cb_compressor_kernel, 1, 256, (size_t)a.od * sizeof(float), cb_stream(be), a);
    }
    cb_check_launch(be, "compressor_push");
}

/* Batched decode: the sequences' pushes (one token each, row i of c and
 * z into st[i] at pos0[i]) in one launch per CB_COMP_SEQS_MAX of them.
 * Every state of one call belongs to the same layer (same widths). */
static void op_compressor_push_seqs(ds4_backend *be, ds4_comp_state *const *st, const float *c, const float *z,
                                    int n_seq, const int64_t *pos0, const ds4_weight *ape, const ds4_weight *norm,
                                    float eps, const ds4_weight *omega, int n_rot, const ds4_kv_numerics *nm,
                                    bool is_indexer)
{
    cb_prof_scope prof_(be, "compressor_push_seqs");
    for (int g = 0; g < n_seq; g += CB_COMP_SEQS_MAX) {
        const int n = n_seq - g < CB_COMP_SEQS_MAX ? n_seq - g : CB_COMP_SEQS_MAX;
        cb_comp_seqs S;
        memset(&S, 0, sizeof S);
        for (int i = 0; i < n; i++) {
            const int64_t w = st[g + i]->overlap ? 2 * st[g + i]->out_dim : st[g + i]->out_dim;
            if (st[g + i]->out_dim != st[g]->out_dim || st[g + i]->overlap != st[g]->overlap) {
                cb_fail_status(be, ds4_fail(DS4_ERR_INVALID, "cuda compressor_push_seqs: states of different widths"),
                               "compressor_push_seqs");
                return;
            }
            if (!cb_comp_args_of(be, st[g + i], c + (size_t)(g + i) * w, z + (size_t)(g + i) * w, 1, pos0[g + i], ape,
                                 norm, eps, omega, n_rot, nm, is_indexer, &S.a[i]))
                return;
            cb_comp_note(be, S.a[i]);
        }
        if (cb_graph_dry(be)) continue;
        ds4_launch(cb_compressor_seqs_kernel, (unsigned)n, 256, (size_t)S.a[0].od * sizeof(float), cb_stream(be), S);
        cb_check_launch(be, "compressor_push_seqs");
    }
}

/* ops.h compress_two, a CSA layer's two compressors of one token in two
 * launches (their four products in one, their pushes in one) instead of
 * four; DS4_CUDA_COMP_TWO=0 keeps the four, for A/B (the same numbers;
 * read at backend creation). Why: they run one after another on the side
 * stream, the products 7.95 and 2.96 us and the pushes 6.72 and 3.52
 * (one-stream kernel times, H100, 30 layers, forty-first session), and
 * with the indexer's queries in one launch the side is the longer path.
 * With those: full size 2K +1.8% (H100, forty-fourth session). */
static bool cb_comp_two_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_COMP_TWO", &on);
}

/* compress_two's products: one launch where the float matvec takes all
 * four a block a row (each row as its own launch computes it), else the
 * two pairs as the model would call them */
static void comp_two_products(ds4_backend *be, const ds4_weight *const kv[2], const ds4_weight *const gate[2],
                              const float *x, int T, float *const c[2], float *const z[2])
{
    const ds4_weight *w[4] = {kv[0], gate[0], kv[1], gate[1]};
    float *const y[4] = {c[0], z[0], c[1], z[1]};
    const void *dw[4];
    int64_t rows[4];
    bool same = T == 1;
    for (int k = 0; k < 4; k++) {
        dw[k] = cb_weight(be, w[k]);
        rows[k] = w[k]->ne[1];
        same = same && dw[k] && w[k]->n_dims == 2 && w[k]->type == w[0]->type && w[k]->ne[0] == w[0]->ne[0];
    }
    ds4_cuda *cu = cb_of(be)->cu;
    if (!same || !ds4_cuda_fmv_multi(cu, w[0]->type, 4, dw, rows, y, w[0]->ne[0], x, 0)) {
        for (int k = 0; k < 2; k++) {
            if (be->matmul_pair) {
                be->matmul_pair(be, kv[k], gate[k], x, T, c[k], z[k]);
            } else {
                be->matmul(be, kv[k], x, T, c[k]);
                be->matmul(be, gate[k], x, T, z[k]);
            }
        }
        return;
    }
    be->stats.matmul_rows += (uint64_t)(rows[0] + rows[1] + rows[2] + rows[3]);
    cb_graph_note(be, 27, dw[0], dw[1], dw[2], dw[3], rows[0], rows[1], rows[2], rows[3], w[0]->ne[0], x, y[0], y[1],
                  y[2], y[3]);
    if (cb_graph_dry(be)) return;
    /* covered a moment ago: a refusal now is a device failure, reported */
    if (!ds4_cuda_fmv_multi(cu, w[0]->type, 4, dw, rows, y, w[0]->ne[0], x, 1))
        cb_fail_status(be, ds4_fail(DS4_ERR_BACKEND, "cuda compress_two: the covered product launch was refused"),
                       "compress_two");
    cb_check_launch(be, "compress_two");
}

/* compress_two: the four products (comp_two_products), then, for one
 * token, both pushes in one launch (block k the walk on state k, as
 * compressor_push_seqs runs it: the same operations, so the same bits),
 * else the two compressor_push ops */
static void op_compress_two(ds4_backend *be, const ds4_weight *const kv[2], const ds4_weight *const gate[2],
                            const float *x, int T, float *const c[2], float *const z[2], ds4_comp_state *const st[2],
                            int64_t pos0, const ds4_weight *const ape[2], const ds4_weight *const norm[2], float eps,
                            const ds4_weight *omega, int n_rot, const ds4_kv_numerics *nm)
{
    cb_prof_scope prof_(be, "compress_two");
    comp_two_products(be, kv, gate, x, T, c, z);
    if (T != 1) {
        for (int k = 0; k < 2; k++)
            op_compressor_push(be, st[k], c[k], z[k], T, pos0, ape[k], norm[k], eps, omega, n_rot, nm, k == 1);
        return;
    }
    cb_comp_seqs S;
    memset(&S, 0, sizeof S);
    for (int k = 0; k < 2; k++) {
        if (!cb_comp_args_of(be, st[k], c[k], z[k], 1, pos0, ape[k], norm[k], eps, omega, n_rot, nm, k == 1, &S.a[k]))
            return;
        cb_comp_note(be, S.a[k]);
    }
    if (cb_graph_dry(be)) return;
    const int od = S.a[0].od > S.a[1].od ? S.a[0].od : S.a[1].od;
    ds4_launch(cb_compressor_seqs_kernel, 2u, 256, (size_t)od * sizeof(float), cb_stream(be), S);
    cb_check_launch(be, "compress_two");
}

/* ---- indexer top-k (§3.6) ---------------------------------------------- */

/* larger key = better: score descending, then index ascending */
__device__ __forceinline__ uint64_t cb_topk_key(float score, int64_t s)
{
    return ((uint64_t)ds4_order_key(score) << 32) | (uint32_t)(0xFFFFFFFFu - (uint32_t)s); /* -0 as +0 */
}

__global__ void cb_indexer_topk_kernel(const float *qi, const float *w, int n_heads, int dim, const float *keys,
                                       const int64_t *d_pos, int64_t pos_arg, int ratio, int topk, int32_t *sel,
                                       float *scores, int64_t max_n)
{
    ds4_pdl_enter();
    const int t = blockIdx.x;
    const int64_t pos0 = cb_pos(d_pos, pos_arg);
    const int64_t n = (pos0 + t + 1) / ratio;
    int32_t *out = sel + (size_t)t * topk;
    if (n <= topk) {
        for (int i = threadIdx.x; i < topk; i += blockDim.x) out[i] = i < n ? i : -1;
        return;
    }
    float *sc = scores + (size_t)t * max_n;
    const float *q = qi + (size_t)t * n_heads * dim, *wt = w + (size_t)t * n_heads;
    /* scores in the CPU's operation order (no FMA contraction) */
    for (int64_t s = threadIdx.x; s < n; s += blockDim.x) {
        const float *key = keys + (size_t)s * dim;
        float acc = 0.f;
        for (int h = 0; h < n_heads; h++) {
            const float *qh = q + (size_t)h * dim;
            float dot = 0.f;
            for (int d = 0; d < dim; d++) dot = __fadd_rn(dot, __fmul_rn(qh[d], key[d]));
            if (dot > 0) acc = __fadd_rn(acc, __fmul_rn(wt[h], dot));
        }
        sc[s] = acc;
    }
    __syncthreads();
    /* the topk-th best key by binary search on its 64-bit value */
    __shared__ int cnt_sh;
    __shared__ int32_t base_sh;
    uint64_t lo = 0, hi = ~0ull; /* invariant: count(key >= lo) >= topk, count(key > hi) < topk */
    while (lo < hi) {
        const uint64_t mid = lo + (hi - lo) / 2 + 1;
        if (threadIdx.x == 0) cnt_sh = 0;
        __syncthreads();
        int c = 0;
        for (int64_t s = threadIdx.x; s < n; s += blockDim.x) c += cb_topk_key(sc[s], s) >= mid;
        atomicAdd(&cnt_sh, c);
        __syncthreads();
        if (cnt_sh >= topk) lo = mid;
        else hi = mid - 1;
        __syncthreads();
    }
    /* keys >= lo are exactly the topk best; write them in ascending index order */
    if (threadIdx.x == 0) base_sh = 0;
    __syncthreads();
    for (int64_t s0 = 0; s0 < n; s0 += blockDim.x) {
        const int64_t s = s0 + threadIdx.x;
        const int flag = s < n && cb_topk_key(sc[s], s) >= lo;
        const unsigned ballot = __ballot_sync(0xffffffffu, flag);
        __shared__ int warp_cnt[32];
        const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
        if (lane == 0) warp_cnt[wid] = __popc(ballot);
        __syncthreads();
        int before = base_sh;
        for (int k = 0; k < wid; k++) before += warp_cnt[k];
        before += __popc(ballot & ((1u << lane) - 1));
        if (flag && before < topk) out[before] = (int32_t)s;
        __syncthreads();
        if (threadIdx.x == 0) {
            int tot = 0;
            for (int k = 0; k < (int)(blockDim.x >> 5); k++) tot += warp_cnt[k];
            base_sh += tot;
        }
        __syncthreads();
    }
}

static void op_indexer_topk(ds4_backend *be, const float *qi, const float *w, int T, int n_heads, int dim,
                            const float *keys, int64_t pos0, int ratio, int topk, int32_t *sel)
{
    cb_prof_scope prof_(be, "indexer_topk");
    cuda_backend *c = cb_of(be);
    /* the queries are rows the last indexer_qat op rounded (a pass of
     * several sequences calls this once for each, in row order) */
    const uintptr_t base = (uintptr_t)c->idx_qat_rows, at = (uintptr_t)qi;
    const int64_t off = base && at >= base ? (int64_t)((at - base) / sizeof(float)) : -1,
                  len = (int64_t)T * n_heads * dim;
    const bool qat = off >= 0 && off + len <= c->idx_qat_len;
    if (!qat || off + len == c->idx_qat_len) c->idx_qat_rows = NULL;
    if (c->indexer_split && cb_indexer_split_fits(T, n_heads, dim, qi, keys)) {
        for (int t = 0; t < T; t++) {
            int64_t n = (pos0 + t + 1) / ratio;
            if (n > topk) be->stats.indexer_keys_scored += (uint64_t)n;
        }
        cb_indexer_split(be, qi, w, T, n_heads, dim, keys, pos0, ratio, topk, sel, qat);
        return;
    }
    const int64_t max_n = cb_graph_pos_bound(be, pos0 + T) / ratio + 1;
    float *scores = (float *)cb_scratch(be, 2, (size_t)T * (size_t)max_n * sizeof(float));
    if (!scores) return;
    for (int t = 0; t < T; t++) {
        int64_t n = (pos0 + t + 1) / ratio;
        if (n > topk) be->stats.indexer_keys_scored += (uint64_t)n;
    }
    int64_t pa;
    const int64_t *dp = cb_graph_pos(be, pos0, &pa);
    CB_GRAPH_SKIP(be, 23, qi, w, T, n_heads, dim, keys, pa, ratio, topk, sel, scores, max_n);
    ds4_launch(cb_indexer_topk_kernel, T, 256, 0, cb_stream(be), qi, w, n_heads, dim, keys, dp, pa, ratio, topk, sel,
                                                         scores, max_n);
    cb_check_launch(be, "indexer_topk");
}

/* Batched decode: the sequences' one query each (row i of qi, w and sel,
 * keys[i] at pos0[i]) scored and selected in one launch of each split
 * kernel per CB_IS_SEQS_MAX of them; else query by query. */
static void op_indexer_topk_seqs(ds4_backend *be, const float *qi, const float *w, int n_seq, int n_heads, int dim,
                                 const float *const *keys, const int64_t *pos0, int ratio, int topk, int32_t *sel)
{
    for (int g = 0; g < n_seq; g += CB_IS_SEQS_MAX) {
        const int n = n_seq - g < CB_IS_SEQS_MAX ? n_seq - g : CB_IS_SEQS_MAX;
        const float *q = qi + (size_t)g * n_heads * dim, *wg = w + (size_t)g * n_heads;
        int32_t *sg = sel + (size_t)g * topk;
        if (cb_of(be)->indexer_split) {
            cb_prof_scope prof_(be, "indexer_topk_seqs");
            if (cb_indexer_split_seqs(be, q, wg, n, n_heads, dim, keys + g, pos0 + g, ratio, topk, sg)) {
                for (int i = g; i < g + n; i++)
                    if ((pos0[i] + 1) / ratio > topk) be->stats.indexer_keys_scored += (uint64_t)((pos0[i] + 1) / ratio);
                continue;
            }
        }
        for (int i = 0; i < n; i++)
            op_indexer_topk(be, q + (size_t)i * n_heads * dim, wg + (size_t)i * n_heads, 1, n_heads, dim, keys[g + i],
                            pos0[g + i], ratio, topk, sg + (size_t)i * topk);
    }
}

/* ---- mixed attention with sinks (§3.4) -------------------------------- */

/* one block per (token, head); q in shared memory (hd floats) */
__global__ void cb_attention_kernel(cb_attn_args a)
{
    ds4_pdl_enter();
    a.pos0 = cb_pos(a.d_pos, a.pos0);
    extern __shared__ float s_q[];
    __shared__ float red[32];
    __shared__ int64_t n_comp_sh;
    const int t = blockIdx.x / a.n_heads, h = blockIdx.x % a.n_heads;
    const int64_t p = a.pos0 + t;
    const int64_t lo = p - a.window + 1 < 0 ? 0 : p - a.window + 1, n_raw = p - lo + 1;
    if (threadIdx.x == 0) {
        int64_t nc = 0;
        if (a.ratio) {
            if (a.sel) {
                while (nc < a.topk && a.sel[(size_t)t * a.topk + nc] >= 0) nc++;
            } else {
                nc = (p + 1) / a.ratio;
            }
        }
        n_comp_sh = nc;
    }
    const float *q = a.q + ((size_t)t * a.n_heads + h) * a.hd;
    for (int j = threadIdx.x; j < a.hd; j += blockDim.x) s_q[j] = q[j];
    __syncthreads();
    const int64_t n = n_raw + n_comp_sh;
    float *sc = a.scores + (size_t)blockIdx.x * a.max_rows;
    const float scale = 1.0f / sqrtf((float)a.hd), sink = a.sinks[h];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float m = sink;
    for (int64_t i = wid; i < n; i += nw) {
        const float *k = cb_attn_row(a, t, lo, n_raw, i);
        float d = 0.f;
        for (int j = lane; j < a.hd; j += 32) d += s_q[j] * k[j];
        for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        const float v = d * scale;
        if (lane == 0) sc[i] = v;
        m = fmaxf(m, v);
    }
    if (lane == 0) red[wid] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        float mm = red[0];
        for (int k = 1; k < nw; k++) mm = fmaxf(mm, red[k]);
        red[0] = mm;
    }
    __syncthreads();
    m = red[0];
    __syncthreads();
    float den = 0.f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float e = expf(sc[i] - m);
        sc[i] = e;
        den += e;
    }
    for (int o = 16; o > 0; o >>= 1) den += __shfl_xor_sync(0xffffffffu, den, o);
    if (lane == 0) red[wid] = den;
    __syncthreads();
    if (threadIdx.x == 0) {
        float dd = expf(sink - m);
        for (int k = 0; k < nw; k++) dd += red[k];
        red[0] = dd;
    }
    __syncthreads();
    den = red[0];
    float *o = a.out + ((size_t)t * a.n_heads + h) * a.hd;
    for (int j = threadIdx.x; j < a.hd; j += blockDim.x) {
        float acc = 0.f;
        for (int64_t i = 0; i < n; i++) acc += (sc[i] / den) * cb_attn_row(a, t, lo, n_raw, i)[j];
        o[j] = acc;
    }
}

/* The kernels' arguments for a chunk of T queries at pos0 (the attention
 * op's rows; sinks a device pointer; ring_w / rope_om: the attention_out
 * epilogue, or NULL). */
static cb_attn_args cb_attn_args_of(ds4_backend *be, const float *q, int T, int n_heads, int hd, const float *kv,
                                    const float *ring, int window, int64_t pos0, const float *comp, int ratio,
                                    const int32_t *sel, int topk, const float *sinks, float *out, float *ring_w,
                                    const float *rope_om, int n_rot)
{
    cb_attn_args a = {};
    a.ring_w = ring_w, a.rope_om = rope_om, a.n_rot = n_rot;
    a.q = q, a.kv = kv, a.ring = ring, a.comp = comp, a.sel = sel, a.sinks = sinks;
    a.T = T, a.n_heads = n_heads, a.hd = hd, a.window = window, a.ratio = ratio, a.topk = topk;
    a.d_pos = cb_graph_pos(be, pos0, &a.pos0);
    a.out = out;
    const int64_t max_comp = ratio ? (sel ? topk : cb_graph_pos_bound(be, pos0 + T) / ratio) : 0;
    a.max_rows = window + max_comp;
    return a;
}

/* The rows the chunk's queries attend, for the op stats: the raw window up
 * to each query's position and its visible compressed rows (at most top-k
 * where the indexer selects). */
static uint64_t cb_rows_attended(int64_t pos0, int T, int window, int ratio, bool sel, int topk)
{
    uint64_t n = 0;
    for (int t = 0; t < T; t++) {
        int64_t p = pos0 + t, raw = p + 1 < window ? p + 1 : window, nc = 0;
        if (ratio) {
            nc = (p + 1) / ratio;
            if (sel && nc > topk) nc = topk;
        }
        n += (uint64_t)(raw + nc);
    }
    return n;
}

static void ring_push_run(ds4_backend *be, float *ring, int window, int hd, const float *kv, int T, int64_t pos0);

/* The attention op; with ring_w / rope_om (attention_out) the split
 * kernels' epilogue too (the prefill kernel's: the rope, then the ring
 * push's own launch). False: the epilogue could not be taken and nothing
 * was done (the caller runs the separate ops). */
static bool attention_run(ds4_backend *be, const float *q, int T, int n_heads, int hd, const float *kv,
                          const float *ring, int window, int64_t pos0, const float *comp, int ratio,
                          const int32_t *sel, int topk, const ds4_weight *sinks, float *out, float *ring_w,
                          const float *rope_om, int n_rot)
{
    const bool epi = ring_w || rope_om;
    cb_attn_args a = cb_attn_args_of(be, q, T, n_heads, hd, kv, ring, window, pos0, comp, ratio, sel, topk,
                                     (const float *)cb_weight(be, sinks), out, ring_w, rope_om, n_rot);
    if (!a.sinks) return true;
    if (cb_attention_prefill_takes(be, a)) {
        a.ring_w = NULL;
        cb_attention_prefill(be, a);
        if (ring_w) ring_push_run(be, ring_w, window, hd, kv, T, pos0);
        be->stats.rows_attended += cb_rows_attended(pos0, T, window, ratio, sel != NULL, topk);
        return true;
    }
    if (epi && !(cb_of(be)->attn_split && cb_attention_split_fits(a))) return false;
    ds4_cuda *cu = cb_of(be)->cu;
    const int64_t n_out = (int64_t)n_heads * hd;
    if (epi && cu->q8a.want && cb_attention_split_q8_fits(a) && ds4_q8_handoff_reserve(cu, &cu->q8a, n_out)) {
        a.q8 = cu->q8a.q; /* the combine stores out's Q8_0 blocks for o_a */
        a.q8d = cu->q8a.d;
    }
    if (epi && !cb_attention_split(be, a)) return false;
    if (a.q8) { /* offered to the next product that reads out */
        cu->q8a.y = out;
        cu->q8a.n = n_out;
    }
    be->stats.rows_attended += cb_rows_attended(pos0, T, window, ratio, sel != NULL, topk);
    if (epi) return true;
    if (cb_of(be)->attn_split && cb_attention_split_fits(a)) {
        cb_attention_split(be, a);
        return true;
    }
    a.scores = (float *)cb_scratch(be, 2, (size_t)T * n_heads * (size_t)a.max_rows * sizeof(float));
    if (!a.scores) return true;
    cb_graph_note(be, 24, a.q, a.kv, a.ring, a.comp, a.sinks, a.sel, T, n_heads, hd, window, ratio, topk, a.pos0, a.out,
                  a.scores, a.max_rows);
    if (cb_graph_dry(be)) return true;
    ds4_launch(cb_attention_kernel, (unsigned)(T * n_heads), 256, (size_t)hd * sizeof(float), cb_stream(be), a);
    cb_check_launch(be, "attention");
    return true;
}

static void op_attention(ds4_backend *be, const float *q, int T, int n_heads, int hd, const float *kv,
                         const float *ring, int window, int64_t pos0, const float *comp, int ratio,
                         const int32_t *sel, int topk, const ds4_weight *sinks, float *out)
{
    cb_prof_scope prof_(be, "attention");
    attention_run(be, q, T, n_heads, hd, kv, ring, window, pos0, comp, ratio, sel, topk, sinks, out, NULL, NULL, 0);
}

__global__ void cb_ring_push_kernel(float *ring, int window, int hd, const float *kv, int T, int first,
                                    const int64_t *d_pos, int64_t pos_arg)
{
    ds4_pdl_enter();
    const int64_t pos0 = cb_pos(d_pos, pos_arg);
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t n = (int64_t)(T - first) * hd;
    if (i >= n) return;
    const int t = first + (int)(i / hd), j = (int)(i % hd);
    ring[(size_t)((pos0 + t) % window) * hd + j] = kv[(size_t)t * hd + j];
}

static void ring_push_run(ds4_backend *be, float *ring, int window, int hd, const float *kv, int T, int64_t pos0)
{
    const int first = T > window ? T - window : 0;
    int64_t pa;
    const int64_t *dp = cb_graph_pos(be, pos0, &pa);
    CB_GRAPH_SKIP(be, 25, ring, window, hd, kv, T, pa);
    ds4_launch(cb_ring_push_kernel, cb_blocks((int64_t)(T - first) * hd, 256), 256, 0, cb_stream(be), ring, window, hd, kv,
                                                                                             T, first, dp, pa);
    cb_check_launch(be, "ring_push");
}

static void op_ring_push(ds4_backend *be, float *ring, int window, int hd, const float *kv, int T, int64_t pos0)
{
    cb_prof_scope prof_(be, "ring_push");
    ring_push_run(be, ring, window, hd, kv, T, pos0);
}

/* attention, ring_push, rope(out, inverse) in the split kernels' two
 * launches where they take the call (one launch of partials for the
 * chunk), else the three ops. */
static void op_attention_out(ds4_backend *be, const float *q, int T, int n_heads, int hd, const float *kv, float *ring,
                             int window, int64_t pos0, const float *comp, int ratio, const int32_t *sel, int topk,
                             const ds4_weight *sinks, int n_rot, const ds4_weight *omega, float *out)
{
    {
        cb_prof_scope prof_(be, "attention_out");
        const float *om = (const float *)cb_weight(be, omega);
        if (!om) return;
        if (n_rot >= 2 && n_rot <= hd && (hd - n_rot) % 4 == 0 && n_rot % 4 == 0 &&
            attention_run(be, q, T, n_heads, hd, kv, ring, window, pos0, comp, ratio, sel, topk, sinks, out, ring,
                          om, n_rot))
            return;
    }
    op_attention(be, q, T, n_heads, hd, kv, ring, window, pos0, comp, ratio, sel, topk, sinks, out);
    op_ring_push(be, ring, window, hd, kv, T, pos0);
    be->rope(be, out, T, n_heads, hd, n_rot, omega, pos0, true);
}

/* attention_out, then o_a and o_b (ops.h attention_out_project): unless
 * DS4_CUDA_Q8_HANDOFF_A=0, one token's combine also stores the output's
 * Q8_0 blocks (cuda_attn_split.cu) and o_a's blocks copy them instead of
 * quantizing their 4096 floats each (ds4_cuda's q8a): the same values, so
 * the ops' bits. */
static void op_attention_out_project(ds4_backend *be, const float *q, int T, int n_heads, int hd, const float *kv,
                                     float *ring, int window, int64_t pos0, const float *comp, int ratio,
                                     const int32_t *sel, int topk, const ds4_weight *sinks, int n_rot,
                                     const ds4_weight *omega, float *out, const ds4_weight *wa, int groups, float *u,
                                     const ds4_weight *wb, float *y)
{
    ds4_cuda *cu = cb_of(be)->cu;
    cu->q8a.want = T == 1 && ds4_q8_handoff_a_on();
    op_attention_out(be, q, T, n_heads, hd, kv, ring, window, pos0, comp, ratio, sel, topk, sinks, n_rot, omega, out);
    cu->q8a.want = 0;
    if (be->matmul_grouped_chain) {
        be->matmul_grouped_chain(be, wa, groups, out, T, u, wb, y);
    } else {
        be->matmul_grouped(be, wa, groups, out, T, u);
        be->matmul(be, wb, u, T, y);
    }
    cu->q8a.y = NULL; /* a copy o_a did not take is not offered to anyone else */
}

/* The sequences' split attention in one launch of each kernel
 * (cb_attention_split_seqs), each sequence's numbers those of its own
 * attention_out; otherwise (shapes, more than CB_ATTN_SEQS_MAX sequences,
 * DS4_CUDA_ATTN=0) one attention_out per sequence. */
static void op_attention_out_seqs(ds4_backend *be, const float *q, int n_seq, int n_heads, int hd, const float *kv,
                                  float *const *ring, int window, const int64_t *pos0, const float *const *comp,
                                  int ratio, const int32_t *sel, int topk, const ds4_weight *sinks, int n_rot,
                                  const ds4_weight *omega, float *out)
{
    cb_attn_args as[CB_ATTN_SEQS_MAX];
    bool batched = n_seq >= 1 && n_seq <= CB_ATTN_SEQS_MAX && cb_of(be)->attn_split && n_rot >= 2 && n_rot <= hd &&
                   (hd - n_rot) % 4 == 0 && n_rot % 4 == 0;
    if (batched) {
        cb_prof_scope prof_(be, "attention_out_seqs");
        const float *om = (const float *)cb_weight(be, omega), *sk = (const float *)cb_weight(be, sinks);
        if (!om || !sk) return;
        const size_t qrow = (size_t)n_heads * hd;
        for (int i = 0; i < n_seq && batched; i++) {
            as[i] = cb_attn_args_of(be, q + i * qrow, 1, n_heads, hd, kv + (size_t)i * hd, ring[i], window, pos0[i],
                                    comp ? comp[i] : NULL, ratio, sel ? sel + (size_t)i * topk : NULL, topk, sk,
                                    out + i * qrow, ring[i], om, n_rot);
            batched = cb_attention_split_fits(as[i]);
        }
        /* the combine's outputs in the fragment order for o_a (9-16
         * sequences: the tensor-core product's), offered as the q_a
         * norm offers its rows (ds4_cuda's q8m) */
        ds4_cuda *cu = cb_of(be)->cu;
        const int64_t width = (int64_t)n_heads * hd;
        ds4_q8_handoff *h = batched && cb_attention_split_q8_fits(as[0]) && ds4_q8m_comb_takes(cu, n_seq, width)
                                ? ds4_q8m_maker(cu, width)
                                : NULL;
        for (int i = 0; h && i < n_seq; i++) as[i].q8m = (uint8_t *)h->q, as[i].q8md = h->d, as[i].q8m_tok = i;
        if (batched && cb_attention_split_seqs(be, as, n_seq)) {
            for (int i = 0; i < n_seq; i++)
                be->stats.rows_attended += cb_rows_attended(pos0[i], 1, window, ratio, sel != NULL, topk);
            if (h) ds4_q8m_offer(cu, h, out, width, n_seq);
            return;
        }
    }
    for (int i = 0; i < n_seq; i++)
        op_attention_out(be, q + (size_t)i * n_heads * hd, 1, n_heads, hd, kv + (size_t)i * hd, ring[i], window,
                         pos0[i], comp ? comp[i] : NULL, ratio, sel ? sel + (size_t)i * topk : NULL, topk, sinks,
                         n_rot, omega, out + (size_t)i * n_heads * hd);
}

void cb_install_attention(ds4_backend *be)
{
    be->kv_round = op_kv_round;
    be->indexer_qat = op_indexer_qat;
    be->compressor_push = op_compressor_push;
    if (cb_comp_two_on()) be->compress_two = op_compress_two;
    be->indexer_topk = op_indexer_topk;
    /* DS4_CUDA_STATE_SEQS=0: a batched step's compressor pushes and
     * indexer selections one launch per session, as before them */
    static int state_seqs = -1;
    if (ds4_env_switch_on("DS4_CUDA_STATE_SEQS", &state_seqs)) {
        be->compressor_push_seqs = op_compressor_push_seqs;
        be->indexer_topk_seqs = op_indexer_topk_seqs;
    }
    be->attention = op_attention;
    be->ring_push = op_ring_push;
    if (cb_fuse_attn_on()) {
        be->attention_out = op_attention_out;
        be->attention_out_project = op_attention_out_project;
        be->attention_out_seqs = op_attention_out_seqs;
    }
}

/*
 * cuda_matvec.cu - fused dequantize-matvec kernels: the decode hot path.
 *
 * Decode reads every weight once per token, so these kernels are bound by
 * memory bandwidth, and their shape follows from that:
 *  - a thread block of 256 threads owns 8 consecutive rows. It streams the
 *    rows' bytes (a column chunk at a time) into shared memory with 16-byte
 *    coalesced loads issued back to back (several in flight per thread,
 *    evict-first so weights do not flush the L2). Block sizes that are not
 *    multiples of 16 bytes (34, 84, 66, 17) are why the bytes go through
 *    shared memory rather than straight into registers.
 *  - then thread i takes the 8-value octets i, i+256, ... of the chunk and,
 *    for each, loads x once (consecutive threads read consecutive x, so the
 *    loads coalesce) and uses it for all 8 rows: x is read from L1/L2 once
 *    per 8 rows, which matters for the 2-bit types, whose weights are 16x
 *    smaller than the f32 x they multiply.
 *  - partial sums are added across the block at the end (warp shuffles,
 *    then shared memory).
 *  - NT tokens (template parameter 1, 2 or 4) share each decoded weight:
 *    the batched-decode variant reads the weights once per 4 tokens.
 *  - the routed-MoE variant is the same kernel with blockIdx.y = slot: the
 *    slot's expert id is read on the device and only that expert's rows
 *    are read, so no host round trip is needed to route.
 * Weights that are not 16-byte aligned (or whose row is not a multiple of
 * 16 bytes) are read in place instead of staged; slower but correct.
 */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_tables.cuh"

#define MV_ROWS 8
#define MV_THREADS (MV_ROWS * 32)
#define MV_TILE_ROW_BYTES 4608 /* shared-memory bytes per row slot, at most */

struct ds4_mv_params {
    const uint8_t *w;
    int64_t rows, cols, row_bytes;
    const float *x;
    float *y;
    int64_t x_tok_stride, y_tok_stride; /* between the NT tokens of a launch */
    const int32_t *ids;                 /* MoE: expert of each slot (or NULL) */
                                        /* ids NULL, n_expert = G > 1: slot s uses block s mod G */
    int64_t n_expert, expert_bytes;
    int64_t x_share, x_slot_stride, y_slot_stride;
    int64_t chunk_cols;
    int64_t split_cols; /* split-K: slot s takes columns [s*split_cols, ...) (0 = off) */
    int stage;
};

template <int T, int NT, int MINB>
__global__ void __launch_bounds__(MV_THREADS, MINB) ds4_matvec_kernel(const ds4_mv_params P)
{
    ds4_pdl_enter();
    typedef ds4_qt<T> Q;
    extern __shared__ uint4 s_tile[];
    __shared__ ds4_block_luts<T> s_luts;
    __shared__ float s_red[MV_THREADS / 32][NT * MV_ROWS];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int64_t row0 = (int64_t)blockIdx.x * MV_ROWS;
    const int nrows = (int)min((int64_t)MV_ROWS, P.rows - row0);
    const int64_t slot = blockIdx.y;
    const uint8_t *w = P.w;
    if (P.ids) {
        const int32_t e = P.ids[slot]; /* same for the whole block */
        if (e < 0 || e >= P.n_expert) {
            if (tid < nrows) P.y[slot * P.y_slot_stride + row0 + tid] = __int_as_float(0x7fc00000);
            return;
        }
        w += (int64_t)e * P.expert_bytes;
    } else if (P.n_expert > 1) {
        w += (slot % P.n_expert) * P.expert_bytes; /* block-diagonal: group = slot mod G */
    }
    int64_t ncols = P.cols;
    if (P.split_cols) { /* split-K: this slot's column range; partial sums */
        w += slot * (P.split_cols / Q::BE * Q::BB);
        ncols = min(P.split_cols, P.cols - slot * P.split_cols);
    }
    const float *x = P.x + (slot / P.x_share) * P.x_slot_stride;
    float *y = P.y + slot * P.y_slot_stride;
    const ds4_luts L = s_luts.fill(P.cols); /* a chunk or segment starts a run: 2048 columns */

    float acc[NT][MV_ROWS];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int r = 0; r < MV_ROWS; r++) acc[t][r] = 0.0f;

    const int slot16 = (int)(P.chunk_cols / Q::BE * Q::BB / 16);
    for (int64_t c0 = 0; c0 < ncols; c0 += P.chunk_cols) {
        const int64_t cc = min(P.chunk_cols, ncols - c0);
        const int64_t boff = c0 / Q::BE * Q::BB;
        const uint8_t *base;
        int64_t stride;
        if (P.stage) {
            const int n16 = (int)(cc / Q::BE * Q::BB / 16);
            __syncthreads(); /* tables filled / the previous chunk consumed */
            for (int i = tid; i < nrows * n16; i += MV_THREADS) {
                const int r = i / n16, o = i - r * n16;
                s_tile[r * slot16 + o] =
                    __ldcs((const uint4 *)(w + (row0 + r) * P.row_bytes + boff) + o);
            }
            __syncthreads();
            base = (const uint8_t *)s_tile;
            stride = (int64_t)slot16 * 16;
        } else {
            if (c0 == 0) __syncthreads(); /* tables filled */
            base = w + row0 * P.row_bytes + boff;
            stride = P.row_bytes;
        }
        const int64_t n_oct = cc / 8;
        const float *xc = x + c0;
        for (int64_t o = tid; o < n_oct; o += MV_THREADS) {
            float xv[NT][8], xs[NT];
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const float4 a = ds4_ld_f4(xc + t * P.x_tok_stride + 8 * o);
                const float4 b = ds4_ld_f4(xc + t * P.x_tok_stride + 8 * o + 4);
                xv[t][0] = a.x; xv[t][1] = a.y; xv[t][2] = a.z; xv[t][3] = a.w;
                xv[t][4] = b.x; xv[t][5] = b.y; xv[t][6] = b.z; xv[t][7] = b.w;
                xs[t] = Q::MIN ? ((a.x + a.y) + (a.z + a.w)) + ((b.x + b.y) + (b.z + b.w)) : 0.0f;
            }
#pragma unroll
            for (int r = 0; r < MV_ROWS; r++) {
                const int rr = r < nrows ? r : nrows - 1; /* past the end: reread, discard */
                float wv[8], sc, mn;
                ds4_decode_octet<T>(base + rr * stride, o, wv, sc, mn, L);
#pragma unroll
                for (int t = 0; t < NT; t++) acc[t][r] += ds4_octet_dot<T>(wv, sc, mn, xv[t], xs[t]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int r = 0; r < MV_ROWS; r++) {
            float v = acc[t][r];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0) s_red[warp][t * MV_ROWS + r] = v;
        }
    __syncthreads();
    if (tid < NT * MV_ROWS) {
        const int t = tid / MV_ROWS, r = tid % MV_ROWS;
        if (r < nrows) {
            float v = 0.0f;
#pragma unroll
            for (int k = 0; k < MV_THREADS / 32; k++) v += s_red[k][tid];
            y[t * P.y_tok_stride + row0 + r] = v;
        }
    }
}

/* y[t * y_ld + r] = sum over the S split-K partials part[s][t][r] */
__global__ void ds4_split_reduce_kernel(const float *part, int S, int nt, int64_t rows, float *y, int64_t y_ld)
{
    ds4_pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nt * rows) return;
    const int64_t t = i / rows, r = i % rows;
    float v = 0.0f;
    for (int s = 0; s < S; s++) v += part[(int64_t)s * nt * rows + i];
    y[t * y_ld + r] = v;
}

struct ds4_mv_launch {
    template <int T>
    static ds4_status run(ds4_cuda *cu, const ds4_mv_params &P, int nt, int64_t n_slots)
    {
        typedef ds4_qt<T> Q;
        dim3 grid((unsigned)((P.rows + MV_ROWS - 1) / MV_ROWS), (unsigned)n_slots);
        size_t smem = P.stage ? (size_t)MV_ROWS * (size_t)(P.chunk_cols / Q::BE * Q::BB) : 0;
        /* MINB = thread blocks per SM the register budget must allow:
         * 3 (default: occupancy; measured faster on the H200), or 2, which
         * lets the compiler keep all 8 rows' loads in flight (ILP;
         * DS4_CUDA_MV_OCC=2 to compare). */
        const bool occ3 = cu->mv_occupancy == 3;
        switch (nt * 10 + (occ3 ? 3 : 2)) {
        case 12: ds4_launch(ds4_matvec_kernel<T, 1, 2>, grid, MV_THREADS, smem, cu->stream, P); break;
        case 22: ds4_launch(ds4_matvec_kernel<T, 2, 2>, grid, MV_THREADS, smem, cu->stream, P); break;
        case 42: ds4_launch(ds4_matvec_kernel<T, 4, 2>, grid, MV_THREADS, smem, cu->stream, P); break;
        case 13: ds4_launch(ds4_matvec_kernel<T, 1, 3>, grid, MV_THREADS, smem, cu->stream, P); break;
        case 23: ds4_launch(ds4_matvec_kernel<T, 2, 3>, grid, MV_THREADS, smem, cu->stream, P); break;
        case 43: ds4_launch(ds4_matvec_kernel<T, 4, 3>, grid, MV_THREADS, smem, cu->stream, P); break;
        default: return ds4_fail(DS4_ERR_INVALID, "cuda matvec: bad token group %d", nt);
        }
        DS4_CUDA_CHECK(cudaGetLastError());
        return DS4_OK;
    }
};

static ds4_status ds4_mv_run(ds4_cuda *cu, ds4_type type, const ds4_mv_params &P, int nt,
                             int64_t n_slots)
{
    DS4_CUDA_FOR_TYPE(type, ds4_mv_launch, cu, P, nt, n_slots);
    return ds4_fail(DS4_ERR_UNSUPPORTED, "cuda matvec: weight type %d", (int)type);
}

/* Choose staging and the column chunk: a chunk must be a whole number of
 * blocks, of 32 values and of 16-byte units. */
static void ds4_mv_plan(ds4_type type, const void *d_w, int64_t cols, int64_t row_bytes,
                        int64_t expert_bytes, ds4_mv_params *P)
{
    const int64_t be = ds4_cuda_block_elems(type), bb = ds4_cuda_block_bytes(type);
    int64_t a = be;
    while (a % 32 != 0 || (a / be * bb) % 16 != 0) a += be;
    P->stage = cols % a == 0 && (uintptr_t)d_w % 16 == 0 && expert_bytes % 16 == 0;
    P->chunk_cols = cols;
    if (P->stage && row_bytes > MV_TILE_ROW_BYTES) {
        int64_t per = a / be * bb;
        P->chunk_cols = (MV_TILE_ROW_BYTES / per) * a;
    }
}

static ds4_status ds4_mv_check(const char *op, ds4_type type, const void *d_w, int64_t rows,
                               int64_t cols, const float *d_x, const float *d_y)
{
    ds4_status st = ds4_cuda_check_weights(op, type, d_w, rows, cols);
    if (st != DS4_OK) return st;
    if (rows > ((int64_t)1 << 33))
        return ds4_fail(DS4_ERR_INVALID, "cuda %s: %lld rows is too many", op, (long long)rows);
    if (!d_x || !d_y || (uintptr_t)d_x % 16 != 0 || (uintptr_t)d_y % 4 != 0)
        return ds4_fail(DS4_ERR_INVALID, "cuda %s: x (%p) must be 16-byte and y (%p) 4-byte aligned",
                        op, (const void *)d_x, (const void *)d_y);
    return DS4_OK;
}

ds4_status ds4_cuda_grow(ds4_cuda *cu, void **buf, size_t *have, size_t need, const char *what)
{
    if (*have >= need) return DS4_OK;
    if (*buf) {
        DS4_CUDA_CHECK(cudaStreamSynchronize(cu->stream)); /* no queued kernel may still use it */
        cudaFree(*buf);
        *buf = NULL;
        *have = 0;
    }
    cu->mem_gen++; /* recorded graphs hold the old pointer */
    cudaError_t e = cudaMalloc(buf, need);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *buf = NULL;
        return ds4_fail(DS4_ERR_NOMEM, "cuda %s: %zu bytes: %s", what, need, cudaGetErrorString(e));
    }
    *have = need;
    return DS4_OK;
}

ds4_status ds4_cuda_split_reserve(ds4_cuda *cu, size_t need)
{
    return ds4_cuda_grow(cu, &cu->split, &cu->split_bytes, need, "split-K partials");
}

ds4_status ds4_cuda_matvec_ld(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows,
                              int64_t cols, const float *d_x, int64_t x_ld, int64_t n_tok,
                              float *d_y, int64_t y_ld)
{
    ds4_status st = ds4_mv_check("matvec", type, d_w, rows, cols, d_x, d_y);
    if (st != DS4_OK) return st;
    if (n_tok <= 0 || x_ld < cols || y_ld < rows || x_ld % 4 != 0)
        return ds4_fail(DS4_ERR_INVALID, "cuda matvec: n_tok %lld, x_ld %lld, y_ld %lld", (long long)n_tok,
                        (long long)x_ld, (long long)y_ld);
    if (ds4_cuda_mmvq_active(type, d_w, cols, 16))
        return ds4_cuda_mmvq_dense(cu, type, d_w, rows, cols, d_x, x_ld, n_tok, d_y, y_ld);
    if (ds4_cuda_fmv_active(type, d_w, cols)) /* float weights: cuda_fmv.cu */
        return ds4_cuda_fmv_dense(cu, type, d_w, rows, cols, d_x, x_ld, n_tok, d_y, y_ld);
    ds4_mv_params P;
    memset(&P, 0, sizeof P);
    P.w = (const uint8_t *)d_w;
    P.rows = rows;
    P.cols = cols;
    P.row_bytes = (int64_t)ds4_cuda_row_bytes(type, cols);
    P.x_tok_stride = x_ld;
    P.y_tok_stride = y_ld;
    P.x_share = 1;
    /* Few rows (mixing weights, routers: 4..24 rows of up to 16K columns)
     * would leave most SMs idle: split the columns, sum the partials. */
    const int64_t row_blocks = (rows + MV_ROWS - 1) / MV_ROWS;
    int S = 1;
    int64_t seg = cols;
    if (row_blocks < cu->mv_split_below && cols >= 1024) {
        const int64_t be = ds4_cuda_block_elems(type), bb = ds4_cuda_block_bytes(type);
        int64_t a = be;
        while (a % 32 != 0 || (a / be * bb) % 16 != 0) a += be;
        int64_t want = (2 * cu->n_sm + row_blocks - 1) / row_blocks;
        seg = (cols + want - 1) / want;
        if (seg < 512) seg = 512;
        seg = (seg + a - 1) / a * a;
        S = (int)((cols + seg - 1) / seg);
    }
    if (S > 1) {
        st = ds4_cuda_split_reserve(cu, (size_t)S * 4 * (size_t)rows * sizeof(float));
        if (st != DS4_OK) return st;
        P.split_cols = seg;
        P.x_slot_stride = seg;
        ds4_mv_plan(type, d_w, seg, P.row_bytes, 16, &P);
        {
            const int64_t be = ds4_cuda_block_elems(type), bb = ds4_cuda_block_bytes(type);
            int64_t a = be;
            while (a % 32 != 0 || (a / be * bb) % 16 != 0) a += be;
            if (cols % a != 0 || P.row_bytes % 16 != 0) { /* a short last segment: read in place */
                P.stage = 0;
                P.chunk_cols = seg;
            }
        }
        for (int64_t t0 = 0; t0 < n_tok;) {
            int64_t left = n_tok - t0;
            int nt = left >= 4 ? 4 : left >= 2 ? 2 : 1;
            P.x = d_x + t0 * x_ld;
            P.y = (float *)cu->split;
            P.y_tok_stride = rows;
            P.y_slot_stride = nt * rows;
            st = ds4_mv_run(cu, type, P, nt, S);
            if (st != DS4_OK) return st;
            ds4_launch(ds4_split_reduce_kernel, (unsigned)((nt * rows + 255) / 256), 256, 0, cu->stream,
                (const float *)cu->split, S, nt, rows, d_y + t0 * y_ld, y_ld);
            DS4_CUDA_CHECK(cudaGetLastError());
            t0 += nt;
        }
        return DS4_OK;
    }
    ds4_mv_plan(type, d_w, cols, P.row_bytes, 16, &P);
    for (int64_t t0 = 0; t0 < n_tok;) {
        int64_t left = n_tok - t0;
        int nt = left >= 4 ? 4 : left >= 2 ? 2 : 1;
        P.x = d_x + t0 * x_ld;
        P.y = d_y + t0 * y_ld;
        st = ds4_mv_run(cu, type, P, nt, 1);
        if (st != DS4_OK) return st;
        t0 += nt;
    }
    return DS4_OK;
}

extern "C" ds4_status ds4_cuda_matvec(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows,
                                      int64_t cols, const float *d_x, int64_t n_tok, float *d_y)
{
    return ds4_cuda_matvec_ld(cu, type, d_w, rows, cols, d_x, cols, n_tok, d_y, rows);
}

ds4_status ds4_cuda_matvec_grouped(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t groups,
                                   int64_t rows_g, int64_t cols, const float *d_x, int64_t n_tok,
                                   float *d_y)
{
    ds4_status st = ds4_mv_check("grouped matvec", type, d_w, rows_g, cols, d_x, d_y);
    if (st != DS4_OK) return st;
    if (groups < 2 || n_tok <= 0 || n_tok * groups > 65535)
        return ds4_fail(DS4_ERR_INVALID, "cuda grouped matvec: %lld groups x %lld tokens", (long long)groups,
                        (long long)n_tok);
    const int64_t rb = (int64_t)ds4_cuda_row_bytes(type, cols);
    if (ds4_cuda_mmvq_active(type, d_w, cols, rows_g * rb))
        return ds4_cuda_mmvq_slots(cu, type, d_w, rows_g, cols, NULL, groups, rows_g * rb, n_tok * groups, 1,
                                   d_x, d_y);
    ds4_mv_params P;
    memset(&P, 0, sizeof P);
    P.w = (const uint8_t *)d_w;
    P.rows = rows_g;
    P.cols = cols;
    P.row_bytes = (int64_t)ds4_cuda_row_bytes(type, cols);
    P.x = d_x;
    P.y = d_y;
    P.x_tok_stride = cols;
    P.y_tok_stride = rows_g;
    P.n_expert = groups;
    P.expert_bytes = rows_g * P.row_bytes;
    P.x_share = 1;
    P.x_slot_stride = cols;
    P.y_slot_stride = rows_g;
    ds4_mv_plan(type, d_w, cols, P.row_bytes, P.expert_bytes, &P);
    return ds4_mv_run(cu, type, P, 1, n_tok * groups);
}

extern "C" ds4_status ds4_cuda_moe_matvec(ds4_cuda *cu, ds4_type type, const void *d_w,
                                          int64_t n_expert, int64_t rows, int64_t cols,
                                          const int32_t *d_ids, int64_t n_slots, int64_t x_share,
                                          const float *d_x, float *d_y)
{
    ds4_status st = ds4_mv_check("moe matvec", type, d_w, rows, cols, d_x, d_y);
    if (st != DS4_OK) return st;
    if (n_expert <= 0 || n_slots <= 0 || n_slots > 65535 || x_share <= 0 || !d_ids)
        return ds4_fail(DS4_ERR_INVALID,
                        "cuda moe matvec: n_expert %lld, n_slots %lld (max 65535), x_share %lld",
                        (long long)n_expert, (long long)n_slots, (long long)x_share);
    const int64_t rb = (int64_t)ds4_cuda_row_bytes(type, cols);
    if (ds4_cuda_mmvq_active(type, d_w, cols, rows * rb))
        return ds4_cuda_mmvq_slots(cu, type, d_w, rows, cols, d_ids, n_expert, rows * rb, n_slots, x_share, d_x,
                                   d_y);
    ds4_mv_params P;
    memset(&P, 0, sizeof P);
    P.w = (const uint8_t *)d_w;
    P.rows = rows;
    P.cols = cols;
    P.row_bytes = (int64_t)ds4_cuda_row_bytes(type, cols);
    P.x = d_x;
    P.y = d_y;
    P.x_tok_stride = cols;
    P.y_tok_stride = rows;
    P.ids = d_ids;
    P.n_expert = n_expert;
    P.expert_bytes = rows * P.row_bytes;
    P.x_share = x_share;
    P.x_slot_stride = cols;
    P.y_slot_stride = rows;
    ds4_mv_plan(type, d_w, cols, P.row_bytes, P.expert_bytes, &P);
    return ds4_mv_run(cu, type, P, 1, n_slots);
}

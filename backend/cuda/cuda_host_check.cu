/*
 * cuda_host_check.cu - the kernels' block decoding, run on the host.
 *
 * The decoders of cuda_blocks.cuh are __host__ __device__; running them
 * here lets `make test` on a machine without a GPU prove that they decode
 * ggml's bytes exactly (tests/test_cuda_decode.c) before any kernel runs.
 */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_fmv.cuh"
#include "backend/cuda/cuda_weight_runs.cuh"
#include "backend/cuda/cuda_mmvq.cuh"
#include "backend/cuda/cuda_tables.cuh"

#include <math.h>

static const uint64_t ds4_iq2xxs_grid_host[256] = {DS4_IQ2XXS_GRID_VALUES};
static const float ds4_mxfp4_host[16] = {DS4_MXFP4_VALUES};

struct ds4_host_rows {
    template <int T>
    static ds4_status run(const void *row, int64_t cols, const float *x, float *out, bool gpu_layout)
    {
        const ds4_luts L = {ds4_iq2xxs_grid_host, ds4_mxfp4_host,
                            gpu_layout && T == DS4_TYPE_IQ2_XXS && ds4_iq2_runs(cols),
                            gpu_layout && T == DS4_TYPE_Q2_K && ds4_q2k_runs(cols)};
        const uint8_t *r = (const uint8_t *)row;
        float acc = 0.0f;
        for (int64_t o = 0; o < cols / 8; o++) {
            float v[8], sc, mn;
            ds4_decode_octet<T>(r, o, v, sc, mn, L);
            if (x) {
                float xv[8], xs = 0.0f;
                for (int k = 0; k < 8; k++) xs += (xv[k] = x[o * 8 + k]);
                acc += ds4_octet_dot<T>(v, sc, mn, xv, xs);
            } else {
                for (int k = 0; k < 8; k++) {
                    volatile float prod = sc * v[k]; /* round before the subtraction */
                    out[o * 8 + k] = prod - mn;
                }
            }
        }
        if (x) out[0] = acc;
        return DS4_OK;
    }
};

static ds4_status ds4_host_rows_any(ds4_type type, const void *row, int64_t cols, const float *x,
                                    float *out, bool gpu_layout = false)
{
    if (ds4_cuda_row_bytes(type, cols) == 0)
        return ds4_fail(DS4_ERR_INVALID, "cuda host check: type %d with %lld cols", (int)type,
                        (long long)cols);
    DS4_CUDA_FOR_TYPE(type, ds4_host_rows, row, cols, x, out, gpu_layout);
    return ds4_fail(DS4_ERR_UNSUPPORTED, "cuda host check: weight type %d", (int)type);
}

extern "C" ds4_status ds4_cuda_host_dequantize_row(ds4_type type, const void *row, int64_t cols,
                                                   float *out)
{
    return ds4_host_rows_any(type, row, cols, NULL, out);
}

extern "C" ds4_status ds4_cuda_host_dequantize_gpu_row(ds4_type type, const void *row, int64_t cols, float *out)
{
    return ds4_host_rows_any(type, row, cols, NULL, out, true);
}

extern "C" ds4_status ds4_cuda_host_dot_row(ds4_type type, const void *row, int64_t cols,
                                            const float *x, float *out)
{
    return ds4_host_rows_any(type, row, cols, x, out);
}

/* ---- the int8-activation matvec's pieces (cuda_mmvq.cuh) on the host ---- */

static bool ds4_host_mmvq_type(ds4_type type)
{
    return type == DS4_TYPE_Q8_0 || type == DS4_TYPE_Q2_K || type == DS4_TYPE_IQ2_XXS;
}

extern "C" ds4_status ds4_cuda_host_mmvq_quantize(ds4_type type, const float *x, int64_t cols, void *act_out)
{
    const int k = type == DS4_TYPE_Q8_0 ? 0 : 1, be = k ? 256 : 32;
    if (!ds4_host_mmvq_type(type) || cols <= 0 || cols % be != 0)
        return ds4_fail(DS4_ERR_INVALID, "cuda host mmvq: type %d with %lld cols", (int)type, (long long)cols);
    uint8_t *row = (uint8_t *)act_out;
    memset(row, 0, (size_t)ds4_mmvq_act_row_bytes(k, cols));
    int8_t *q = (int8_t *)row;
    float *d = (float *)(row + cols);
    int16_t *bs = (int16_t *)(d + cols / be);
    for (int64_t b = 0; b < cols / be; b++) {
        const float *xb = x + b * be;
        float amax = 0.0f, mx = 0.0f;
        for (int j = 0; j < be; j++) {
            const float a = fabsf(xb[j]);
            if (a > amax) amax = a, mx = xb[j];
        }
        if (!k) {
            const float id = ds4_mmvq_q8_0_id(amax);
            for (int j = 0; j < 32; j++) q[b * 32 + j] = ds4_mmvq_q8_0_q(xb[j], id);
            d[b] = ds4_mmvq_q8_0_d(amax);
            continue;
        }
        const float iscale = amax == 0.0f ? 0.0f : -127.0f / mx;
        for (int j = 0; j < 256; j++) q[b * 256 + j] = amax == 0.0f ? 0 : ds4_mmvq_q8_k_q(xb[j], iscale);
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += q[b * 256 + 16 * g + j];
            bs[b * 16 + g] = (int16_t)s;
        }
        d[b] = amax == 0.0f ? 0.0f : 1.0f / iscale;
    }
    return DS4_OK;
}

/* The grid in the 16 interleaved copies the decode kernels keep in shared
 * memory (ds4_mq_decode_iq2 with r = 4): the host check decodes from it,
 * each task as the lane that takes it on the device. */
static const uint64_t *ds4_iq2xxs_grid_host_rep(void)
{
    static uint64_t rep[256 * 16];
    if (!rep[16 * 255]) /* every grid row is nonzero */
        for (int i = 0; i < 256 * 16; i++) rep[i] = ds4_iq2xxs_grid_host[i >> 4];
    return rep;
}

/* The lean IQ2_XXS form's tables (ds4_mq_iq2_lean_group): the grid, then
 * the 128 sign masks, each in 16 interleaved copies. */
static const uint8_t *ds4_iq2_lean_tables_host(void)
{
    static uint64_t tab[(256 + 128) * 16];
    if (!tab[16 * 255]) {
        for (int i = 0; i < 128 * 16; i++) tab[256 * 16 + i] = ds4_mmvq_sign_masks((uint32_t)(i >> 4));
        for (int i = 0; i < 256 * 16; i++) tab[i] = ds4_iq2xxs_grid_host[i >> 4];
    }
    return (const uint8_t *)tab;
}

/* The selector form's tables (ds4_mq_iq2_sel_group): the 256 grid
 * selectors, then the 128 sign selectors, each in 32 interleaved copies. */
static const uint8_t *ds4_iq2_sel_tables_host(void)
{
    static uint32_t tab[(256 + 128) * 32];
    if (!tab[32 * 255]) { /* grid row 255 has a byte other than 8 */
        for (int i = 0; i < 128 * 32; i++) tab[256 * 32 + i] = ds4_iq2_sign_sel((uint32_t)(i >> 5));
        for (int i = 0; i < 256 * 32; i++) tab[i] = ds4_iq2_grid_sel(ds4_iq2xxs_grid_host[i >> 5]);
    }
    return (const uint8_t *)tab;
}

/* The selector tables as ds4_gb256_kernel lays them out (cuda_moe_g1.cuh,
 * SEL 3): grid rows 256 bytes apart, then the sign rows; with 64 KiB in
 * front, so that the offsets carry an address as the kernel's do (an
 * offset or'ed with 65536 reads from the buffer's start). */
static const uint8_t *ds4_iq2_sel256_buf_host(void)
{
    static uint32_t buf[(65536 + 256 * 256 + 128 * 128) / 4];
    uint32_t *t = buf + 65536 / 4;
    if (!t[64 * 255]) {
        for (int i = 0; i < 128 * 32; i++) t[256 * 64 + i] = ds4_iq2_sign_sel((uint32_t)(i >> 5));
        for (int i = 0; i < 256 * 32; i++) t[(i >> 5) * 64 + (i & 31)] = ds4_iq2_grid_sel(ds4_iq2xxs_grid_host[i >> 5]);
    }
    return (const uint8_t *)buf;
}

/* w: the row in the layout the GPU keeps (IQ2_XXS and Q2_K in runs where
 * ds4_cuda_in_runs: cuda_weight_runs.cuh). */
template <int T>
static float ds4_host_mmvq_row(const uint8_t *w, int64_t cols, const uint8_t *a)
{
    const bool runs = ds4_cuda_in_runs((ds4_type)T, cols);
    typedef ds4_mmvq_t<T> M;
    typedef typename ds4_mq_task_of<T>::type Task;
    const float *dx = (const float *)(a + cols);
    const int16_t *bsums = (const int16_t *)(dx + cols / M::BE);
    float acc = 0.0f;
    for (int64_t b = 0; b < cols / M::BE; b++) {
        int is = 0, ms = 0;
        Task t0;
        const uint8_t *dp = w + ds4_iq2_d_ofs(b, runs), *qs = w + ds4_iq2_qs_ofs(b, runs); /* IQ2_XXS */
        const uint8_t *ksc = w + ds4_q2k_sc_ofs(b, runs), *kqs = w + ds4_q2k_qs_ofs(b, runs); /* Q2_K */
        if constexpr (T == DS4_TYPE_IQ2_XXS) ds4_mq_decode_iq2(dp, qs, 0, ds4_iq2xxs_grid_host, 0, 0, NULL, t0);
        else if constexpr (T == DS4_TYPE_Q2_K) ds4_mq_decode_q2k(ksc, kqs, w + ds4_q2k_dd_ofs(b, runs), 0, t0);
        else ds4_mq_decode(w + b * M::BB, 0, ds4_iq2xxs_grid_host, NULL, t0);
        for (int part = 0; part < M::TPB; part++) { /* the block's lanes, summed as integers (the CPU's order) */
            Task t;
            if constexpr (T == DS4_TYPE_IQ2_XXS)
                ds4_mq_decode_iq2(dp, qs, part, ds4_iq2xxs_grid_host_rep(), 4, (int)((b * M::TPB + part) & 31), NULL,
                                  t);
            else if constexpr (T == DS4_TYPE_Q2_K)
                ds4_mq_decode_q2k(ksc, kqs, w + ds4_q2k_dd_ofs(b, runs), part, t);
            else
                ds4_mq_decode(w + b * M::BB, part, ds4_iq2xxs_grid_host, NULL, t);
            int m = 0;
            const int it = ds4_mq_dot(t, a + b * M::BE, bsums + b * 16, part, &m);
            if constexpr (T == DS4_TYPE_IQ2_XXS) { /* the lean form's integer must be this one */
                uint32_t qa, qb, xw[8];
                ds4_mq_iq2_words(qs, part, &qa, &qb);
                memcpy(xw, a + b * M::BE + 32 * part, 32);
                const uint8_t *tabs = ds4_iq2_lean_tables_host();
                if (ds4_mq_iq2_lean_group(qa, qb, xw, tabs, tabs + 256 * 16 * 8,
                                          (uint32_t)((b * M::TPB + part) & 15) * 8u) != it)
                    return NAN;
                const uint8_t *sel = ds4_iq2_sel_tables_host(); /* and the selector form's */
                if (ds4_mq_iq2_sel_group(qa, qb, xw, sel, sel + 256 * 32 * 4,
                                         (uint32_t)((b * M::TPB + part) & 31) * 4u) != it)
                    return NAN;
                const uint8_t *b256 = ds4_iq2_sel256_buf_host(); /* and SEL 3's */
                if (ds4_mq_iq2_sel_group_t<false, true>(qa, qb, xw, ds4_iq2_sel_ptrs{b256, b256 + 65536},
                                                        65536u | (uint32_t)((b * M::TPB + part) & 31) * 4u) != it)
                    return NAN;
            }
            if constexpr (T == DS4_TYPE_Q2_K) { /* and the lean Q2_K form's integers these */
                int m2 = 0;
                if (ds4_mq_q2k_lean(ksc, kqs, part, a + b * M::BE, bsums + b * 16, &m2) != it || m2 != m)
                    return NAN;
            }
            is += it;
            ms += m;
        }
        acc += ds4_mq_term(t0, dx[b], is, ms);
    }
    return T == DS4_TYPE_IQ2_XXS ? 0.125f * acc : acc;
}

extern "C" ds4_status ds4_cuda_host_mmvq_dot(ds4_type type, const void *row, int64_t cols, const void *act,
                                             float *out)
{
    const int64_t be = ds4_cuda_block_elems(type);
    if (!ds4_host_mmvq_type(type) || cols <= 0 || cols % be != 0)
        return ds4_fail(DS4_ERR_INVALID, "cuda host mmvq: type %d with %lld cols", (int)type, (long long)cols);
    const uint8_t *w = (const uint8_t *)row, *a = (const uint8_t *)act;
    /* from the GPU's layout of the row */
    const size_t rb = ds4_cuda_row_bytes(type, cols);
    uint8_t *g = ds4_cuda_in_runs(type, cols) ? (uint8_t *)malloc(rb) : NULL;
    if (g) ds4_runs_host(type, g, w, rb);
    else if (ds4_cuda_in_runs(type, cols)) return ds4_fail(DS4_ERR_NOMEM, "cuda host mmvq: a row of %zu bytes", rb);
    if (g) w = g;
    if (type == DS4_TYPE_Q8_0) *out = ds4_host_mmvq_row<DS4_TYPE_Q8_0>(w, cols, a);
    else if (type == DS4_TYPE_Q2_K) *out = ds4_host_mmvq_row<DS4_TYPE_Q2_K>(w, cols, a);
    else *out = ds4_host_mmvq_row<DS4_TYPE_IQ2_XXS>(w, cols, a);
    free(g);
    return DS4_OK;
}

/* ---- the float-weight matvec (cuda_fmv.cuh) on the host ------------------ */

extern "C" ds4_status ds4_cuda_host_fmv_dot(ds4_type type, const void *row, int64_t cols, const float *x,
                                            int warps_per_row, float *out)
{
    if ((type != DS4_TYPE_F16 && type != DS4_TYPE_BF16 && type != DS4_TYPE_F32) || cols <= 0 || cols % 8 != 0 ||
        (warps_per_row != 1 && warps_per_row != 8))
        return ds4_fail(DS4_ERR_INVALID, "cuda host fmv: type %d, %lld cols, %d warps per row", (int)type,
                        (long long)cols, warps_per_row);
    float partial[8 * 32];
    const uint8_t *r = (const uint8_t *)row;
    const int G = 32 * warps_per_row;
    if (type == DS4_TYPE_F16) *out = ds4_fmv_row_host<DS4_TYPE_F16>(r, cols / 8, x, G, partial);
    else if (type == DS4_TYPE_BF16) *out = ds4_fmv_row_host<DS4_TYPE_BF16>(r, cols / 8, x, G, partial);
    else *out = ds4_fmv_row_host<DS4_TYPE_F32>(r, cols / 4, x, G, partial);
    return DS4_OK;
}

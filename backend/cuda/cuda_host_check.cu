/*
 * cuda_host_check.cu - the kernels' block decoding, run on the host.
 *
 * The decoders of cuda_blocks.cuh are __host__ __device__; running them
 * here lets `make test` on a machine without a GPU prove that they decode
 * ggml's bytes exactly (tests/test_cuda_decode.c) before any kernel runs.
 */
#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/cuda_tables.cuh"

static const uint64_t ds4_iq2xxs_grid_host[256] = {DS4_IQ2XXS_GRID_VALUES};
static const float ds4_mxfp4_host[16] = {DS4_MXFP4_VALUES};

struct ds4_host_rows {
    template <int T>
    static ds4_status run(const void *row, int64_t cols, const float *x, float *out)
    {
        const ds4_luts L = {ds4_iq2xxs_grid_host, ds4_mxfp4_host};
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
                                    float *out)
{
    if (ds4_cuda_row_bytes(type, cols) == 0)
        return ds4_fail(DS4_ERR_INVALID, "cuda host check: type %d with %lld cols", (int)type,
                        (long long)cols);
    DS4_CUDA_FOR_TYPE(type, ds4_host_rows, row, cols, x, out);
    return ds4_fail(DS4_ERR_UNSUPPORTED, "cuda host check: weight type %d", (int)type);
}

extern "C" ds4_status ds4_cuda_host_dequantize_row(ds4_type type, const void *row, int64_t cols,
                                                   float *out)
{
    return ds4_host_rows_any(type, row, cols, NULL, out);
}

extern "C" ds4_status ds4_cuda_host_dot_row(ds4_type type, const void *row, int64_t cols,
                                            const float *x, float *out)
{
    return ds4_host_rows_any(type, row, cols, x, out);
}

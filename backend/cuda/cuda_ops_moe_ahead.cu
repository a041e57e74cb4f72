/*
 * cuda_ops_moe_ahead.cu - the shared expert of a decode step on a second
 * stream, beside the router and the routed experts (ops.h
 * ffn_swiglu_ahead, then moe_shared).
 *
 * Why: a decode layer's MoE is the router (one small matvec whose last
 * block picks the experts: a few SMs busy for ~9 us), the routed experts'
 * gate+up and down, and the shared expert's two Q8_0 products (~15 us;
 * ncu, the 8-layer model), each waiting for the one before although the
 * shared expert needs only the sublayer input. Started first on its own
 * stream, it can take the SMs the router leaves idle. Measured: decode
 * +1.5-2% on the 8-layer model, +1.3% at full size in one run and within
 * the machine's spread in another (docs/BENCHMARKS.md, nineteenth
 * session).
 *
 * How: ffn_swiglu_ahead records an event on the backend's stream, makes
 * the side stream (a second ds4_cuda context on the same device: its own
 * stream, activation and split-K buffers) wait for it, and issues the
 * shared expert's decode kernels there into the side's buffer; an event
 * marks their end. moe_shared then runs the routed experts on the main
 * stream (writing out), waits for that event and adds the shared result,
 * out = routed + shared: the same float additions as moe_experts followed
 * by ffn_swiglu with accumulate (what the model calls otherwise), so the
 * same bits. In a recorded decode graph the two events become a fork and
 * a join of the graph. Only the decode forms (ffn_swiglu's int8 kernels:
 * 1-16 tokens) go ahead; otherwise, or with DS4_CUDA_MOE_AHEAD=0 (read at
 * backend creation) or per-op profiling, nothing does and moe_shared is
 * the two ops in order.
 */
#include "backend/cuda/cuda_backend.cuh"

#include <stdlib.h>

struct cb_ahead {
    ds4_cuda *cu;              /* the side context (stream, buffers) */
    cudaEvent_t fork, join;
    float *buf;                /* T x F SwiGLU values, then T x D results */
    size_t bytes;
    /* the pending product: moe_shared adds it when its arguments match */
    int pending;
    const void *gate;
    const float *x;
    int T;
    int64_t D;
};

static bool cb_ahead_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_MOE_AHEAD", &on);
}

/* The shared expert's result added in the routed down's store (its join
 * there, one launch a layer less): full size, 2K, 150.4 -> 152.2 tokens/s
 * alone, with DS4_CUDA_HC_SINK_LATE 156.0 / 156.5 (twenty-sixth session).
 * DS4_CUDA_SHARED_FOLD=0: by a kernel of its own after the down (A/B;
 * read once). */
static bool cb_fold_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_SHARED_FOLD", &on);
}

void cb_ahead_free(cuda_backend *c)
{
    cb_ahead *a = c->ahead;
    if (!a) return;
    if (a->cu) cudaStreamSynchronize(a->cu->stream);
    if (a->buf) cudaFree(a->buf);
    cb_side_close(a->cu, a->fork, a->join);
    free(a);
    c->ahead = NULL;
}

/* The side context and buffer (created at the first use; a growth bumps
 * mem_gen, as every buffer a recorded graph holds does). */
static cb_ahead *ahead_ready(ds4_backend *be, size_t bytes)
{
    cuda_backend *c = cb_of(be);
    if (!c->ahead) {
        cb_ahead *a = (cb_ahead *)calloc(1, sizeof *a);
        if (!a) return NULL;
        c->ahead = a;
        if (!cb_side_open(be, &a->cu, &a->fork, &a->join, "the shared expert's side stream", "moe_ahead")) return NULL;
    }
    cb_ahead *a = c->ahead;
    if (!a->cu || !a->join) return NULL; /* creation failed before */
    if (a->bytes < bytes) {
        cb_mem_changed(be);
        cudaStreamSynchronize(a->cu->stream);
        if (a->buf) cudaFree(a->buf);
        a->buf = NULL;
        a->bytes = 0;
        if (ds4_cuda_malloc(a->cu, bytes, (void **)&a->buf) != DS4_OK) {
            cb_fail_status(be, DS4_ERR_NOMEM, "moe_ahead");
            return NULL;
        }
        a->bytes = bytes;
    }
    return a;
}

static void op_ffn_swiglu_ahead(ds4_backend *be, const ds4_weight *gate, const ds4_weight *up, const ds4_weight *down,
                                const float *x, int T, float clamp)
{
    cuda_backend *c = cb_of(be);
    if (c->ahead) c->ahead->pending = 0;
    const void *dg = NULL, *du = NULL, *dd = NULL;
    if (c->profile || !cb_ahead_on() || !cb_ffn_decode_form(be, gate, up, down, x, T, &dg, &du, &dd)) return;
    const int64_t D = gate->ne[0], F = gate->ne[1];
    cb_ahead *a = ahead_ready(be, (size_t)T * (size_t)(F + D) * sizeof(float));
    if (!a) return;
    float *g = a->buf, *y = a->buf + (int64_t)T * F;
    a->pending = 1;
    a->gate = dg;
    a->x = x;
    a->T = T;
    a->D = D;
    be->stats.matmul_rows += (uint64_t)T * (uint64_t)(2 * F + D);
    /* the side's own buffers are part of what a recording holds */
    const unsigned gen0 = a->cu->mem_gen;
    CB_GRAPH_SKIP(be, 61, dg, du, dd, x, T, F, D, clamp, g);
    ds4_status st = cudaEventRecord(a->fork, c->cu->stream) == cudaSuccess &&
                            cudaStreamWaitEvent(a->cu->stream, a->fork, 0) == cudaSuccess
                        ? DS4_OK
                        : ds4_fail(DS4_ERR_BACKEND, "cuda: fork to the side stream failed");
    if (st == DS4_OK) st = ds4_cuda_mmvq_swiglu(a->cu, gate->type, dg, du, F, D, NULL, 1, T, 1, x, clamp, g);
    if (st == DS4_OK) st = ds4_cuda_mmvq_down(a->cu, down->type, dd, D, F, NULL, 1, NULL, 1, T, g, y, 0);
    if (st == DS4_OK && cudaEventRecord(a->join, a->cu->stream) != cudaSuccess)
        st = ds4_fail(DS4_ERR_BACKEND, "cuda: the side stream's end event failed");
    if (a->cu->mem_gen != gen0) cb_mem_changed(be);
    if (st != DS4_OK) {
        a->pending = 0;
        cb_fail_status(be, st, "moe_ahead");
    }
}

__global__ void cb_ahead_add_kernel(float *out, const float *y, int64_t n)
{
    ds4_pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = out[i] + y[i];
}

static void op_moe_shared(ds4_backend *be, const ds4_weight *gate, const ds4_weight *up, const ds4_weight *down,
                          const ds4_weight *gsh, const ds4_weight *ush, const ds4_weight *dsh, const float *x, int T,
                          const int32_t *sel, const float *w, int k, float clamp, float *out)
{
    cuda_backend *c = cb_of(be);
    cb_ahead *a = c->ahead;
    const bool ahead = a && a->pending && a->x == x && a->T == T && a->gate == cb_weight(be, gsh);
    /* a product started for other arguments is joined all the same: a
     * recorded graph must not end with the side stream forked */
    if (a && a->pending && !ahead && !cb_graph_dry(be)) cudaStreamWaitEvent(c->cu->stream, a->join, 0);
    if (a) a->pending = 0;
    const int64_t n = ahead ? (int64_t)T * a->D : 0;
    const float *y = ahead ? a->buf + (int64_t)T * gsh->ne[1] : NULL;
    /* offered to the routed down: it adds y in its store, waiting for the
     * side stream only there (not before the router's and gate+up's
     * launches) and saving this op's add launch */
    const bool fold = ahead && cb_fold_on();
    if (fold) c->cu->down_add = {y, a->join, 0};
    be->moe_experts(be, gate, up, down, x, T, sel, w, k, clamp, out, false);
    const bool taken = fold && c->cu->down_add.taken;
    c->cu->down_add = {NULL, NULL, 0};
    if (!ahead) {
        be->ffn_swiglu(be, gsh, ush, dsh, x, T, clamp, out, true);
        return;
    }
    /* in a DRY step no kernel ran and taken is 0; the recording's down took
     * the offer or not by the arguments the ops noted (the same path each
     * step), so returning here is what the recording did */
    CB_GRAPH_SKIP(be, 62, out, y, n, fold);
    if (taken) return;
    if (cudaStreamWaitEvent(c->cu->stream, a->join, 0) != cudaSuccess) {
        cb_fail_status(be, ds4_fail(DS4_ERR_BACKEND, "cuda: join of the side stream failed"), "moe_shared");
        return;
    }
    ds4_launch(cb_ahead_add_kernel, cb_blocks(n, 256) > 8192 ? 8192 : cb_blocks(n, 256), 256, 0, c->cu->stream, out,
               y, n);
    cb_check_launch(be, "moe_shared");
}

void cb_install_moe_ahead(ds4_backend *be)
{
    if (!cb_ahead_on()) return;
    be->ffn_swiglu_ahead = op_ffn_swiglu_ahead;
    be->moe_shared = op_moe_shared;
}

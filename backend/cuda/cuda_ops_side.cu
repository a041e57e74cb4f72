/*
 * cuda_ops_side.cu - ops run beside others on a second stream (ops.h
 * side_begin, side_end, side_join): a decode step's compressors beside
 * its query path.
 *
 * Why: in a compressed layer the attention's inputs come from two chains
 * that share only the sublayer input: the query path (q_a and kv, the q_a
 * norm, q_b, the head norms and RoPE: four launches, ~27 us of a
 * full-size layer's ~175, ncu) and the compressors (the kv and gate float
 * products, the push that pools a finished window: ~12 us, twice that in a
 * CSA layer with the indexer's). In one stream they run one after the
 * other, and the compressors' push, a latency-bound kernel on a few SMs,
 * leaves DRAM idle.
 *
 * How: side_begin records an event on the backend's stream, makes a side
 * context's stream (a second ds4_cuda on the same device: its own stream,
 * activation and split-K buffers, cuBLAS handle) wait for it, and points
 * the backend at that context, so the ops that follow launch there;
 * side_end records the side's end event and points the backend back;
 * side_join makes the backend's stream wait for that event. In a recorded
 * decode graph the two events become a fork and a join. The ops are the
 * same calls with the same arguments, so the same bits. Nothing forks
 * under per-op profiling (which times ops on the backend's stream) or with
 * DS4_CUDA_SIDE=0 (read at backend creation: the ops are then not
 * installed and the model calls them in order).
 */
#include "backend/cuda/cuda_backend.cuh"

#include <stdlib.h>

struct cb_side {
    ds4_cuda *cu;   /* the side context */
    ds4_cuda *main; /* the backend's own, while the side is current */
    cudaEvent_t fork, join;
    int state;      /* 0 idle, 1 side current, 2 ended (join pending) */
    unsigned gen0;  /* the side's memory generation at side_begin */
};

static bool cb_side_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_SIDE", &on);
}

bool cb_side_open(ds4_backend *be, ds4_cuda **cu, cudaEvent_t *fork, cudaEvent_t *join, const char *what,
                  const char *op)
{
    cuda_backend *c = cb_of(be);
    if (ds4_cuda_open(c->cu->device, cu) != DS4_OK ||
        cudaEventCreateWithFlags(fork, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(join, cudaEventDisableTiming) != cudaSuccess) {
        cb_fail_status(be, ds4_fail(DS4_ERR_BACKEND, "cuda: %s", what), op);
        return false;
    }
    (*cu)->gemm_precision = c->cu->gemm_precision;
    (*cu)->parent = c->cu; /* its products may take the main context's sublayer input (q8ms) */
    return true;
}

void cb_side_close(ds4_cuda *cu, cudaEvent_t fork, cudaEvent_t join)
{
    if (cu) cudaStreamSynchronize(cu->stream);
    if (fork) cudaEventDestroy(fork);
    if (join) cudaEventDestroy(join);
    ds4_cuda_close(cu);
}

bool cb_side_current(const cuda_backend *c) { return c->side && c->side->state == 1; }

void cb_side_free(cuda_backend *c)
{
    cb_side *s = c->side;
    if (!s) return;
    if (s->state == 1) c->cu = s->main; /* never left current: the backend's own context back */
    cb_side_close(s->cu, s->fork, s->join);
    free(s);
    c->side = NULL;
}

static cb_side *side_ready(ds4_backend *be)
{
    cuda_backend *c = cb_of(be);
    if (!c->side) {
        cb_side *s = (cb_side *)calloc(1, sizeof *s);
        if (!s) return NULL;
        c->side = s;
        if (!cb_side_open(be, &s->cu, &s->fork, &s->join, "the side stream", "side_begin")) return NULL;
    }
    cb_side *s = c->side;
    return s->cu && s->join ? s : NULL; /* NULL: creation failed before */
}

static void op_side_begin(ds4_backend *be)
{
    cuda_backend *c = cb_of(be);
    if (c->profile || (c->side && c->side->state == 1)) return;
    cb_side *s = side_ready(be);
    if (!s) return;
    cb_graph_note(be, 63);
    /* after a side_end without its join (state 2) the side stream still
     * holds that work, ahead of what follows: one join waits for both */
    const int was = s->state;
    s->main = c->cu;
    s->state = 1;
    if (cb_graph_dry(be)) return; /* a replayed step: its ops launch nothing, the context stays */
    if (cudaEventRecord(s->fork, c->cu->stream) != cudaSuccess ||
        cudaStreamWaitEvent(s->cu->stream, s->fork, 0) != cudaSuccess) {
        s->state = was;
        cb_fail_status(be, ds4_fail(DS4_ERR_BACKEND, "cuda: fork to the side stream failed"), "side_begin");
        return;
    }
    s->gen0 = s->cu->mem_gen;
    c->cu = s->cu;
}

static void op_side_end(ds4_backend *be)
{
    cuda_backend *c = cb_of(be);
    cb_side *s = c->side;
    if (!s || s->state != 1) return;
    const bool swapped = c->cu == s->cu;
    c->cu = s->main;
    s->state = 2;
    /* a side buffer that grew is one a recorded graph holds */
    if (swapped && s->cu->mem_gen != s->gen0) cb_mem_changed(be);
    cb_graph_note(be, 64);
    if (swapped && cudaEventRecord(s->join, s->cu->stream) != cudaSuccess)
        cb_fail_status(be, ds4_fail(DS4_ERR_BACKEND, "cuda: the side stream's end event failed"), "side_end");
}

static void op_side_join(ds4_backend *be)
{
    cuda_backend *c = cb_of(be);
    cb_side *s = c->side;
    if (!s || s->state != 2) return;
    s->state = 0;
    cb_graph_note(be, 65);
    if (!cb_graph_dry(be) && cudaStreamWaitEvent(c->cu->stream, s->join, 0) != cudaSuccess)
        cb_fail_status(be, ds4_fail(DS4_ERR_BACKEND, "cuda: join of the side stream failed"), "side_join");
}

/* DS4_CUDA_SIDE_IDXQ (on; =0 for A/B; the same bits): a CSA
 * layer's indexer query products before the fork (ops.h
 * side_indexer_query_first). Why: the side stream runs the compressors
 * (~20 us in a CSA layer at full size, 2K) and then the whole indexer
 * (~33 us: its q_b 6.2, RoPE 2.0, QAT 3.5, head weights 2.2, scores 12.8,
 * selection 6.3), ~53 us against ~20 for the query path beside it, so the
 * join waits for the side; the indexer's query products need only the q_a
 * norm, not the compressors, and on the backend's stream they run beside
 * them. */
static bool cb_side_idxq_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_SIDE_IDXQ", &on);
}

/* DS4_CUDA_SIDE_IDXW=1 (opt-in: 2K -0.9% on an H100; the same bits): with the
 * query products first, a CSA layer's indexer head weights (the product
 * of the sublayer input into one weight a head, ~2.2 us at full size) beside the
 * compressors instead of on the query path before the fork (ops.h
 * side_indexer_weights_beside). Why: in a CSA layer the query path from
 * q_a to the join is q_a, the indexer's q_b, RoPE, QAT and head weights,
 * then q_b (~38 us, H100, one stream's kernel times), while the side
 * stream's compressors and selection take ~34: the head weights are the
 * one product of the query path that only the side reads. */
static bool cb_side_idxw_on(void)
{
    static int on = -1;
    return ds4_env_flag_on("DS4_CUDA_SIDE_IDXW", &on);
}

void cb_install_side(ds4_backend *be)
{
    if (!cb_side_on()) return;
    be->side_begin = op_side_begin;
    be->side_end = op_side_end;
    be->side_join = op_side_join;
    be->side_indexer_query_first = cb_side_idxq_on() ? 1 : 0;
    be->side_indexer_weights_beside = cb_side_idxw_on() ? 1 : 0;
}

/*
 * cuda_graph.cu - the decode step recorded once as a CUDA graph and
 * replayed (backend/ops.h step_begin / step_end).
 *
 * Why: a decode step of the model is ~220 ops (~400 kernel launches); at
 * T = 1 each kernel is short, so launch latency dominates. One graph
 * launch replaces them.
 *
 * How one recording serves every step: the kernels that depend on the
 * position (rope, compressor, indexer top-k, attention, ring push) read it
 * from device memory (g.d_pos, set by a one-thread kernel before each
 * step); sizes and strides that grow with the position (score scratch)
 * are planned for every position below g.pos_max. Everything else an op
 * passes to its kernels (pointers, shapes, flags) is mixed into a
 * signature. A step runs in one of these modes (cuda_backend.cuh):
 *   WARM     plain launches with the device position and planned sizes, so
 *            every scratch buffer reaches its final size before recording;
 *   CAPTURE  the next step: the launches are recorded (stream capture),
 *            then the graph is instantiated and launched;
 *   DRY      later steps: ops do only their host bookkeeping (stats) and
 *            note their arguments; if the signature equals the recorded
 *            one, step_end launches the graph; otherwise the step is
 *            issued once more as WARM (step_end returns true) and the one
 *            after it is recorded anew;
 *   AHEAD    the walk of a DRY step done one step early (step_ahead), right
 *            after the graph of the step before was launched: the host
 *            walks while the device computes. Its signature, stats and
 *            memory generation are kept; the next step_begin of the same
 *            key and position launches the graph at once when they still
 *            match (the model then skips the step's ops), and walks as
 *            DRY otherwise. The walk sat between a step's logits and the
 *            next launch: 75-230 us of a ~7 ms full-size step (twentieth
 *            session). DS4_CUDA_STEP_AHEAD=0 switches it off.
 * A recording is dropped when a scratch or weight buffer is reallocated
 * (mem_gen), when the position reaches pos_max, or when the model's op
 * sequence changes (signature: e.g. the indexer starts scoring once more
 * than top-k rows exist). A failed capture falls back to plain launches
 * for the rest of the backend's life. DS4_CUDA_GRAPH=0 switches it off.
 */
#include "backend/cuda/cuda_backend.cuh"
#include "backend/cuda/cuda_ktrace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* positions a recording covers past the one it was planned at */
#define CB_GRAPH_SPAN 4096

__global__ void cb_set_pos_kernel(int64_t *d_pos, int64_t pos) {
    ds4_pdl_enter(); *d_pos = pos; }

void cb_graph_note_v(ds4_backend *be, const uint64_t *v, int n)
{
    cuda_backend *c = cb_of(be);
    uint64_t h = c->g.sig;
    for (int i = 0; i < n; i++) {
        h ^= v[i];
        h *= 0x100000001b3ull;
        h ^= h >> 29;
    }
    c->g.sig = h;
}

static void drop_graph(cuda_backend *c)
{
    if (c->g.exec) cudaGraphExecDestroy(c->g.exec);
    c->g.exec = NULL;
}

static void set_pos(cuda_backend *c)
{
    ds4_launch(cb_set_pos_kernel, 1, 1, 0, c->cu->stream, c->g.d_pos, c->g.pos);
}

static void start_warm(cuda_backend *c)
{
    c->g.mode = CB_STEP_WARM;
    c->g.pos_max = c->g.pos + CB_GRAPH_SPAN;
    set_pos(c);
}

static bool launch_graph(cuda_backend *c);
static bool give_up(ds4_backend *be, const char *why);

/* steps launched on a walk ahead, all backends of the process (tests) */
static unsigned long long g_steps_ahead;
extern "C" uint64_t ds4_cuda_graph_steps_ahead(void) { return __atomic_load_n(&g_steps_ahead, __ATOMIC_RELAXED); }

/* Whether the walk ahead held for (key, pos0) stands for this step: the
 * same recording, memory and signature it was walked against. */
static bool ahead_holds(const cuda_backend *c, int64_t pos0, const void *key)
{
    return c->g.ahead_ok && c->g.exec && c->g.ahead_key == key && c->g.ahead_pos == pos0 &&
           c->g.ahead_gen == c->cu->mem_gen && c->g.graph_gen == c->cu->mem_gen && c->g.ahead_sig == c->g.graph_sig &&
           pos0 + 1 < c->g.pos_max;
}

static bool step_begin(ds4_backend *be, int64_t pos0, const void *key)
{
    cuda_backend *c = cb_of(be);
    c->g.mode = CB_STEP_NONE;
    cb_sink_flush(be, NULL); /* a step starts with no site's Sinkhorn pending */
    if (c->g.off) return false;
    const bool ahead = ahead_holds(c, pos0, key);
    c->g.ahead_ok = 0; /* good for one step_begin */
    if (ahead) {
        c->g.pos = pos0;
        if (!launch_graph(c)) return !give_up(be, "graph launch failed");
        ds4_op_stats_add(&be->stats, &c->g.ahead_stats);
        c->g.n_replays++;
        c->g.n_ahead++;
        __atomic_fetch_add(&g_steps_ahead, 1ull, __ATOMIC_RELAXED);
        return true;
    }
    c->g.pos = pos0;
    c->g.sig = 0xcbf29ce484222325ull;
    c->g.stats0 = be->stats;
    c->g.n_transient0 = c->n_transient;
    const unsigned gen = c->cu->mem_gen;
    if (c->g.exec && (c->g.graph_gen != gen || pos0 + 1 >= c->g.pos_max)) drop_graph(c);
    if (c->g.exec) {
        c->g.mode = CB_STEP_DRY;
        c->g.t_begin = now_s();
        return false;
    }
    if (c->g.warm_ok && c->g.warm_gen == gen && pos0 + 1 < c->g.pos_max) {
        set_pos(c);
        cudaGetLastError();
        if (cudaStreamBeginCapture(c->cu->stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
            c->g.mode = CB_STEP_CAPTURE;
            ds4_kt_record_begin();
            return false;
        }
        cudaGetLastError();
        c->g.off = 1; /* cannot record on this device: plain launches from now on */
        c->g.mode = CB_STEP_NONE;
        return false;
    }
    start_warm(c);
    return false;
}

/* The next step's walk, now (see AHEAD above): only beside a recording
 * that the step just issued used, and for a position it covers. */
static bool step_ahead(ds4_backend *be, int64_t pos0, const void *key)
{
    cuda_backend *c = cb_of(be);
    c->g.ahead_ok = 0;
    if (c->g.mode == CB_STEP_NONE) cb_sink_flush(be, NULL);
    if (c->g.off || !c->g.ahead_on || !c->g.exec || c->g.mode != CB_STEP_NONE || c->failed ||
        c->g.graph_gen != c->cu->mem_gen || pos0 + 1 >= c->g.pos_max)
        return false;
    c->g.mode = CB_STEP_AHEAD;
    c->g.pos = pos0;
    c->g.sig = 0xcbf29ce484222325ull;
    c->g.stats0 = be->stats;
    memset(&be->stats, 0, sizeof be->stats); /* the walk counts its own ops from zero */
    c->g.n_transient0 = c->n_transient;
    c->g.ahead_key = key;
    c->g.ahead_pos = pos0;
    c->g.ahead_gen = c->cu->mem_gen;
    c->g.t_begin = now_s();
    return true;
}

static bool launch_graph(cuda_backend *c)
{
    set_pos(c);
    ds4_kt_before_replay(c->cu->stream);
    if (cudaGraphLaunch(c->g.exec, c->cu->stream) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return true;
}

/* Redo the step with plain launches and no more graphs. */
static bool give_up(ds4_backend *be, const char *why)
{
    cuda_backend *c = cb_of(be);
    if (getenv("DS4_CUDA_GRAPH_VERBOSE")) fprintf(stderr, "cuda graph: %s; plain launches from now on\n", why);
    cudaGetLastError();
    drop_graph(c);
    c->g.off = 1;
    c->g.mode = CB_STEP_NONE;
    be->stats = c->g.stats0;
    return true;
}

static bool step_end(ds4_backend *be)
{
    cuda_backend *c = cb_of(be);
    /* a Sinkhorn still pending runs inside the step (recorded in a
     * capture, noted in a walk), so that a step ends with none */
    cb_sink_flush(be, NULL);
    switch (c->g.mode) {
    case CB_STEP_AHEAD:
        /* keep what the walk found; its counters count when it is launched */
        c->g.ahead_host_s += now_s() - c->g.t_begin;
        c->g.ahead_sig = c->g.sig;
        c->g.ahead_stats = be->stats;
        be->stats = c->g.stats0;
        c->g.ahead_ok = c->n_transient == c->g.n_transient0 && c->cu->mem_gen == c->g.ahead_gen && !c->failed;
        c->g.mode = CB_STEP_NONE;
        return false;
    case CB_STEP_WARM:
        c->g.warm_ok = 1;
        c->g.warm_gen = c->cu->mem_gen;
        c->g.mode = CB_STEP_NONE;
        return false;
    case CB_STEP_DRY:
        c->g.dry_host_s += now_s() - c->g.t_begin;
        if (c->g.sig == c->g.graph_sig && c->g.graph_gen == c->cu->mem_gen) {
            c->g.mode = CB_STEP_NONE;
            if (!launch_graph(c)) return give_up(be, "graph launch failed");
            c->g.n_replays++;
            return false;
        }
        /* the step changed shape: issue it plainly, record the next one */
        c->g.n_mismatch++;
        drop_graph(c);
        be->stats = c->g.stats0;
        c->g.warm_ok = 0;
        start_warm(c);
        return true;
    case CB_STEP_CAPTURE: {
        cudaGraph_t graph = NULL;
        cudaError_t e = cudaStreamEndCapture(c->cu->stream, &graph);
        ds4_kt_record_end();
        c->g.mode = CB_STEP_NONE;
        if (e != cudaSuccess || !graph) return give_up(be, "stream capture failed");
        /* a transient weight copy, a reallocation or an op error during the
         * recording would leave the graph with dead pointers */
        if (c->n_transient != c->g.n_transient0 || c->cu->mem_gen != c->g.warm_gen || c->failed) {
            cudaGraphDestroy(graph);
            return give_up(be, "memory changed while recording");
        }
        cudaGraphExec_t exec = NULL;
        e = cudaGraphInstantiate(&exec, graph, 0);
        cudaGraphDestroy(graph);
        if (e != cudaSuccess) return give_up(be, "graph instantiation failed");
        c->g.exec = exec;
        c->g.graph_sig = c->g.sig;
        c->g.graph_gen = c->cu->mem_gen;
        c->g.warm_ok = 0;
        c->g.n_captures++;
        /* the recording did not run anything: run it now (position already set) */
        if (cudaGraphLaunch(c->g.exec, c->cu->stream) != cudaSuccess) return give_up(be, "graph launch failed");
        return false;
    }
    default:
        c->g.mode = CB_STEP_NONE;
        return false;
    }
}

void cb_graph_init(ds4_backend *be)
{
    cuda_backend *c = cb_of(be);
    const char *env = getenv("DS4_CUDA_GRAPH");
    c->g.off = (env && atoi(env) == 0) || c->profile;
    const char *fp = getenv("DS4_CUDA_GRAPH_FP");
    c->g.dry_fp = fp && atoi(fp) != 0;
    const char *ah = getenv("DS4_CUDA_STEP_AHEAD"); /* read per backend: a test runs both */
    c->g.ahead_on = !(ah && atoi(ah) == 0);
    if (!c->g.off && ds4_cuda_malloc(c->cu, sizeof(int64_t), (void **)&c->g.d_pos) != DS4_OK) c->g.off = 1;
    be->step_begin = step_begin;
    be->step_end = step_end;
    be->step_ahead = step_ahead;
}

void cb_graph_destroy(ds4_backend *be)
{
    cuda_backend *c = cb_of(be);
    ds4_kt_report();
    drop_graph(c);
    if (c->g.d_pos) ds4_cuda_free(c->cu, c->g.d_pos);
    c->g.d_pos = NULL;
    if (getenv("DS4_CUDA_GRAPH_VERBOSE"))
        fprintf(stderr,
                "cuda graph: %llu recordings, %llu replays, %llu signature changes; host walk of a replayed step %.1f us; "
                "%llu launched on a walk ahead (%.1f us a walk beside the device)\n",
                (unsigned long long)c->g.n_captures, (unsigned long long)c->g.n_replays,
                (unsigned long long)c->g.n_mismatch,
                c->g.n_replays > c->g.n_ahead
                    ? 1e6 * c->g.dry_host_s / (double)(c->g.n_replays - c->g.n_ahead + c->g.n_mismatch)
                    : 0.0,
                (unsigned long long)c->g.n_ahead, c->g.n_ahead ? 1e6 * c->g.ahead_host_s / (double)c->g.n_ahead : 0.0);
}

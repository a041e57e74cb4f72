/*
 * cuda_expert_cache.cu - the VRAM expert cache (cuda_expert_cache.cuh).
 */
#include "backend/cuda/cuda_expert_cache.cuh"
#include "backend/cuda/cuda_expert_cache.h"

extern "C" {
#include "backend/expert_slots.h"
}

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

struct cb_xcache {
    int n_layer, n_expert;
    int64_t n_slots;
    ds4_expert_slots *slots;
    const uint8_t **host; /* [3 * n_layer]: gate, up, down data of each layer */
    uint64_t stride[3];   /* bytes of one expert of each matrix */
    uint8_t *pool[3];     /* device: n_slots experts of each matrix */
    int32_t *d_map;       /* device: [n_layer * n_expert] expert -> slot, -1 */
    int32_t *h_map;       /* pinned mirror of what is uploaded */
    int32_t *h_sel;       /* pinned: the router's ids of a call */
    int32_t *d_ids;       /* device: the call's ids as slots */
    size_t ids_cap;
    uint8_t *seen;        /* [n_expert] scratch */
    cudaStream_t copy;
    cudaEvent_t copied;
    uintptr_t *pin_lo, *pin_hi; /* [3 * n_layer]: page-locked part of each routed tensor ([0, 0): none) */
    uint8_t *pin_own;     /* [3 * n_layer]: we registered it (unregister at the end) */
    ds4_type *type;       /* [3 * n_layer]: each tensor's type and row width, for the layout */
    int64_t *cols;        /* its kernels read (ds4_cuda_runs_on) */
    int pinned;           /* copies come from page-locked memory */
    int copies_queued;    /* `copied` was recorded: compute waits for it before using the pool */
    uint64_t preloaded;   /* hot-list experts copied in at set-up (counted as misses by the slots) */
    uint64_t bytes_copied, calls, chunks;
    double setup_s, wait_s; /* registration; host time in the ids wait */
};

static double xc_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

bool cb_xcache_owns(const cb_xcache *xc, const void *host)
{
    if (!xc || !host) return false;
    for (int i = 0; i < 3 * xc->n_layer; i++)
        if (xc->host[i] == host) return true;
    return false;
}

int cb_xcache_layer(const cb_xcache *xc, const void *gate_host)
{
    if (!xc || !gate_host) return -1;
    for (int l = 0; l < xc->n_layer; l++)
        if (xc->host[3 * l] == gate_host) return l;
    return -1;
}

/* Page-lock the routed tensors in place (the mapping of the file), so a
 * miss's copy is a DMA on the copy stream that returns at once; without it
 * cudaMemcpyAsync stages pageable memory through the driver and the host
 * waits. Only the whole pages inside each tensor are registered: a copy
 * whose source straddles page-locked and pageable memory is refused by the
 * driver, and the other weights' uploads must never touch a locked page;
 * a miss's copy is split at those page bounds (xc_copy_expert).
 * DS4_CUDA_EXPERT_PIN=0 skips it. */
static void xc_pin(cb_xcache *xc, const ds4_weight *const *gud)
{
    const char *env = getenv("DS4_CUDA_EXPERT_PIN");
    if (env && strcmp(env, "0") == 0) return;
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    const double t0 = xc_now();
    int n_ok = 0, n = 3 * xc->n_layer;
    cudaError_t last = cudaSuccess;
    for (int i = 0; i < n; i++) {
        const uintptr_t lo = ((uintptr_t)gud[i]->data + pg - 1) & ~(pg - 1);
        const uintptr_t hi = ((uintptr_t)gud[i]->data + gud[i]->nbytes) & ~(pg - 1);
        if (hi <= lo) continue;
        cudaError_t e = cudaHostRegister((void *)lo, hi - lo, cudaHostRegisterReadOnly);
        if (e == cudaSuccess || e == cudaErrorHostMemoryAlreadyRegistered) { /* another session of the model */
            xc->pin_lo[i] = lo;
            xc->pin_hi[i] = hi;
            xc->pin_own[i] = e == cudaSuccess;
            n_ok++;
        } else {
            last = e;
        }
        cudaGetLastError();
    }
    if (n_ok < n && last != cudaSuccess)
        fprintf(stderr,
                "cuda expert cache: %d of %d routed tensors not page-locked (%s); their copies are staged by the "
                "driver\n",
                n - n_ok, n, cudaGetErrorString(last));
    xc->pinned = n_ok == n;
    xc->setup_s = xc_now() - t0;
}

static void xc_destroy(cb_xcache *xc, ds4_cuda *cu)
{
    if (!xc) return;
    if (xc->copy) cudaStreamSynchronize(xc->copy);
    for (int i = 0; i < 3; i++) ds4_cuda_free(cu, xc->pool[i]);
    ds4_cuda_free(cu, xc->d_map);
    ds4_cuda_free(cu, xc->d_ids);
    if (xc->h_map) cudaFreeHost(xc->h_map);
    if (xc->h_sel) cudaFreeHost(xc->h_sel);
    if (xc->copied) cudaEventDestroy(xc->copied);
    if (xc->copy) cudaStreamDestroy(xc->copy);
    for (int i = 0; xc->pin_own && i < 3 * xc->n_layer; i++)
        if (xc->pin_own[i]) cudaHostUnregister((void *)xc->pin_lo[i]);
    cudaGetLastError();
    free(xc->pin_lo);
    free(xc->pin_hi);
    free(xc->pin_own);
    free(xc->type);
    free(xc->cols);
    ds4_expert_slots_free(xc->slots);
    free(xc->host);
    free(xc->seen);
    free(xc);
}

void cb_xcache_free(ds4_backend *be)
{
    cuda_backend *c = cb_of(be);
    cb_xcache *xc = c->xc;
    if (!xc) return;
    ds4_expert_slots_stats st;
    ds4_expert_slots_get_stats(xc->slots, &st);
    const uint64_t slot_bytes = xc->stride[0] + xc->stride[1] + xc->stride[2];
    /* one line the benchmarks read (bench/h200_stream.sh) */
    fprintf(stderr,
            "cuda expert cache: %lld slots (%.2f GiB), hits %llu, misses %llu (hit rate %.1f%%), "
            "%llu preloaded, %.2f GiB copied, %llu calls in %llu chunks, pinned %s (%.1f s), ids wait %.3f s\n",
            (long long)st.n_slots, (double)(st.n_slots * slot_bytes) / 1073741824.0, (unsigned long long)st.hits,
            (unsigned long long)(st.misses - xc->preloaded),
            st.hits + st.misses - xc->preloaded
                ? 100.0 * (double)st.hits / (double)(st.hits + st.misses - xc->preloaded)
                : 0.0,
            (unsigned long long)xc->preloaded, (double)xc->bytes_copied / 1073741824.0,
            (unsigned long long)xc->calls, (unsigned long long)xc->chunks, xc->pinned ? "yes" : "no", xc->setup_s,
            xc->wait_s);
    xc_destroy(xc, c->cu);
    c->xc = NULL;
}

/* Copy expert e of layer's three matrices into slot s on the copy stream,
 * in up to three pieces per matrix: before, inside and after the tensor's
 * page-locked pages (the driver refuses a copy that straddles them); then
 * the layout every kernel reads (IQ2_XXS and Q2_K in runs,
 * cuda_weight_runs.cuh), on
 * the same stream. */
static ds4_status xc_copy_expert(cb_xcache *xc, int layer, int e, int64_t s)
{
    for (int m = 0; m < 3; m++) {
        const int t = 3 * layer + m;
        const uint64_t sb = xc->stride[m];
        const uintptr_t a = (uintptr_t)(xc->host[t] + (uint64_t)e * sb), b = a + sb;
        uintptr_t cut[4] = {a, a, b, b};
        if (xc->pin_hi[t] > xc->pin_lo[t]) {
            cut[1] = xc->pin_lo[t] < a ? a : xc->pin_lo[t] > b ? b : xc->pin_lo[t];
            cut[2] = xc->pin_hi[t] < cut[1] ? cut[1] : xc->pin_hi[t] > b ? b : xc->pin_hi[t];
        }
        for (int k = 0; k < 3; k++) {
            if (cut[k + 1] <= cut[k]) continue;
            if (cudaMemcpyAsync(xc->pool[m] + (uint64_t)s * sb + (cut[k] - a), (const void *)cut[k],
                                cut[k + 1] - cut[k], cudaMemcpyHostToDevice, xc->copy) != cudaSuccess)
                return ds4_fail(DS4_ERR_BACKEND, "cuda expert cache: copy of layer %d expert %d: %s", layer, e,
                                cudaGetErrorString(cudaGetLastError()));
        }
        const ds4_status st = ds4_cuda_runs_on(xc->copy, xc->pool[m] + (uint64_t)s * sb, sb, xc->type[t], xc->cols[t]);
        if (st != DS4_OK) return st;
        xc->bytes_copied += sb;
    }
    return DS4_OK;
}

/* Copy the hot list's first experts in on the copy stream, with every
 * layer's map; the first MoE op waits for them (copies_queued), so they
 * overlap the rest of the set-up and the first layers' compute. */
static ds4_status xc_preload(cb_xcache *xc, const int32_t *pairs, int64_t n)
{
    if (n > xc->n_slots) n = xc->n_slots;
    ds4_expert_slots_begin(xc->slots);
    for (int64_t i = 0; i < n; i++) {
        const int l = pairs[2 * i], e = pairs[2 * i + 1];
        if (l < 0 || l >= xc->n_layer || e < 0 || e >= xc->n_expert || ds4_expert_slots_find(xc->slots, l, e) >= 0)
            continue;
        bool miss;
        int el, ee;
        const int64_t s = ds4_expert_slots_resolve(xc->slots, l, e, &miss, &el, &ee);
        if (s < 0) return DS4_ERR_INVALID;
        ds4_status st = xc_copy_expert(xc, l, e, s);
        if (st != DS4_OK) return st;
        xc->preloaded++;
    }
    const size_t E = (size_t)xc->n_expert;
    for (int l = 0; l < xc->n_layer; l++)
        memcpy(xc->h_map + (size_t)l * E, ds4_expert_slots_map(xc->slots, l), E * sizeof(int32_t));
    if (cudaMemcpyAsync(xc->d_map, xc->h_map, (size_t)xc->n_layer * E * sizeof(int32_t), cudaMemcpyHostToDevice,
                        xc->copy) != cudaSuccess ||
        cudaEventRecord(xc->copied, xc->copy) != cudaSuccess)
        return ds4_fail(DS4_ERR_BACKEND, "cuda expert cache: preload: %s", cudaGetErrorString(cudaGetLastError()));
    xc->copies_queued = 1;
    return DS4_OK;
}

ds4_status cb_xcache_set(ds4_backend *be, int n_layer, int n_expert, const ds4_weight *const *gud, int64_t n_slots,
                         int policy, const int32_t *preload, int64_t n_preload)
{
    cuda_backend *c = cb_of(be);
    if (c->xc) return ds4_fail(DS4_ERR_INVALID, "cuda expert cache: already set");
    if (n_layer < 1 || n_expert < 1 || !gud)
        return ds4_fail(DS4_ERR_INVALID, "cuda expert cache: %d layers x %d experts", n_layer, n_expert);
    /* The kernels address slot s at pool + s * (one expert's bytes): every
     * layer's experts must have the same type and shape. */
    for (int l = 0; l < n_layer; l++)
        for (int m = 0; m < 3; m++) {
            const ds4_weight *w = gud[3 * l + m], *w0 = gud[m];
            if (!w || !w->data || w->n_dims != 3 || w->ne[2] != n_expert || w->type != w0->type ||
                w->ne[0] != w0->ne[0] || w->ne[1] != w0->ne[1])
                return ds4_fail(DS4_ERR_UNSUPPORTED,
                                "cuda expert cache: layer %d's routed tensor %s differs in type or shape from layer "
                                "0's (the cache needs one expert size per matrix)",
                                l, w && w->name ? w->name : "?");
        }
    if (n_slots < 1 || n_slots > (int64_t)n_layer * n_expert)
        return ds4_fail(DS4_ERR_INVALID, "cuda expert cache: %lld slots (1 .. %lld)", (long long)n_slots,
                        (long long)n_layer * n_expert);
    cb_xcache *xc = (cb_xcache *)calloc(1, sizeof *xc);
    if (!xc) return ds4_fail(DS4_ERR_NOMEM, "cuda expert cache: out of memory");
    xc->n_layer = n_layer;
    xc->n_expert = n_expert;
    xc->n_slots = n_slots;
    xc->host = (const uint8_t **)calloc((size_t)n_layer * 3, sizeof *xc->host);
    xc->seen = (uint8_t *)calloc((size_t)n_expert, 1);
    xc->pin_lo = (uintptr_t *)calloc((size_t)n_layer * 3, sizeof *xc->pin_lo);
    xc->pin_hi = (uintptr_t *)calloc((size_t)n_layer * 3, sizeof *xc->pin_hi);
    xc->pin_own = (uint8_t *)calloc((size_t)n_layer * 3, 1);
    xc->type = (ds4_type *)calloc((size_t)n_layer * 3, sizeof *xc->type);
    xc->cols = (int64_t *)calloc((size_t)n_layer * 3, sizeof *xc->cols);
    xc->slots = ds4_expert_slots_create(n_layer, n_expert, n_slots, policy ? policy : DS4_SLOTS_FREQ);
    if (!xc->host || !xc->seen || !xc->slots || !xc->pin_lo || !xc->pin_hi || !xc->pin_own || !xc->type ||
        !xc->cols) {
        const bool slots_failed = !xc->slots; /* its message is set */
        xc_destroy(xc, c->cu);
        return slots_failed ? DS4_ERR_INVALID : ds4_fail(DS4_ERR_NOMEM, "cuda expert cache: out of memory");
    }
    for (int i = 0; i < 3 * n_layer; i++) {
        xc->host[i] = (const uint8_t *)gud[i]->data;
        xc->type[i] = gud[i]->type;
        xc->cols[i] = gud[i]->ne[0];
    }
    for (int m = 0; m < 3; m++) xc->stride[m] = gud[m]->nbytes / (uint64_t)n_expert;
    const size_t map_bytes = (size_t)n_layer * (size_t)n_expert * sizeof(int32_t);
    ds4_status st = DS4_OK;
    for (int m = 0; m < 3 && st == DS4_OK; m++) st = ds4_cuda_malloc(c->cu, (size_t)n_slots * xc->stride[m], (void **)&xc->pool[m]);
    if (st != DS4_OK) {
        ds4_error_prefix("cuda expert cache of %lld experts (%.2f GiB): ", (long long)n_slots,
                         (double)n_slots * (double)(xc->stride[0] + xc->stride[1] + xc->stride[2]) / 1073741824.0);
        xc_destroy(xc, c->cu);
        return st;
    }
    st = ds4_cuda_malloc(c->cu, map_bytes, (void **)&xc->d_map);
    if (st == DS4_OK && (cudaMallocHost((void **)&xc->h_map, map_bytes) != cudaSuccess ||
                         cudaStreamCreateWithFlags(&xc->copy, cudaStreamNonBlocking) != cudaSuccess ||
                         cudaEventCreateWithFlags(&xc->copied, cudaEventDisableTiming) != cudaSuccess ||
                         cudaMemset(xc->d_map, 0xff, map_bytes) != cudaSuccess))
        st = ds4_fail(DS4_ERR_BACKEND, "cuda expert cache: set-up failed: %s", cudaGetErrorString(cudaGetLastError()));
    if (st != DS4_OK) {
        xc_destroy(xc, c->cu);
        return st;
    }
    memset(xc->h_map, 0xff, map_bytes);
    xc_pin(xc, gud);
    if (preload && n_preload > 0 && (st = xc_preload(xc, preload, n_preload)) != DS4_OK) {
        xc_destroy(xc, c->cu);
        return st;
    }
    c->xc = xc;
    /* A cached MoE op waits on the host for the router's ids, which a
     * recorded decode graph cannot do: plain launches for this backend. */
    c->g.off = 1;
    return DS4_OK;
}

/* ids[i] = map[sel[i]] (-1, hence NaN in the kernels, for a bad id). */
__global__ void cb_xcache_remap_kernel(const int32_t *sel, const int32_t *map, int n_expert, int n, int32_t *ids)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int32_t e = sel[i];
    ids[i] = e >= 0 && e < n_expert ? map[e] : -1;
}

/* Tokens from t0 whose distinct experts fit the slots (at least one). */
static int xc_chunk(cb_xcache *xc, const int32_t *h_sel, int t0, int T, int k)
{
    int distinct = 0, t = t0;
    for (; t < T; t++) {
        int add = 0;
        for (int j = 0; j < k; j++) {
            const int32_t e = h_sel[(size_t)t * k + j];
            if (e >= 0 && e < xc->n_expert && xc->seen[e] == 0) xc->seen[e] = 2, add++;
        }
        if (t > t0 && distinct + add > xc->n_slots) break;
        for (int j = 0; j < k; j++) {
            const int32_t e = h_sel[(size_t)t * k + j];
            if (e >= 0 && e < xc->n_expert && xc->seen[e] == 2) xc->seen[e] = 1;
        }
        distinct += add;
    }
    for (int e = 0; e < xc->n_expert; e++) xc->seen[e] = 0;
    return t - t0;
}

/* Give each distinct expert of tokens [t0, t0+tn) a slot, queue the misses'
 * copies and the layer's map on the copy stream, and make the compute
 * stream wait for them. */
static ds4_status xc_resolve(cuda_backend *c, cb_xcache *xc, int layer, const int32_t *h_sel, int n)
{
    ds4_expert_slots_begin(xc->slots);
    int n_miss = 0;
    for (int i = 0; i < n; i++) {
        const int32_t e = h_sel[i];
        if (e < 0 || e >= xc->n_expert || xc->seen[e]) continue;
        xc->seen[e] = 1;
        bool miss;
        int el, ee;
        const int64_t s = ds4_expert_slots_resolve(xc->slots, layer, e, &miss, &el, &ee);
        if (s < 0) return DS4_ERR_INVALID;
        if (!miss) continue;
        n_miss++;
        ds4_status st = xc_copy_expert(xc, layer, e, s);
        if (st != DS4_OK) return st;
    }
    for (int i = 0; i < n; i++)
        if (h_sel[i] >= 0 && h_sel[i] < xc->n_expert) xc->seen[h_sel[i]] = 0;
    if (n_miss == 0) {
        /* the layer's uploaded map already holds these; a preload may still be in flight */
        if (xc->copies_queued && cudaStreamWaitEvent(c->cu->stream, xc->copied, 0) != cudaSuccess)
            return ds4_fail(DS4_ERR_BACKEND, "cuda expert cache: %s", cudaGetErrorString(cudaGetLastError()));
        return DS4_OK;
    }
    const size_t E = (size_t)xc->n_expert;
    memcpy(xc->h_map + (size_t)layer * E, ds4_expert_slots_map(xc->slots, layer), E * sizeof(int32_t));
    if (cudaMemcpyAsync(xc->d_map + (size_t)layer * E, xc->h_map + (size_t)layer * E, E * sizeof(int32_t),
                        cudaMemcpyHostToDevice, xc->copy) != cudaSuccess ||
        cudaEventRecord(xc->copied, xc->copy) != cudaSuccess ||
        cudaStreamWaitEvent(c->cu->stream, xc->copied, 0) != cudaSuccess)
        return ds4_fail(DS4_ERR_BACKEND, "cuda expert cache: %s", cudaGetErrorString(cudaGetLastError()));
    xc->copies_queued = 1;
    return DS4_OK;
}

void cb_xcache_moe(ds4_backend *be, int layer, const ds4_weight *gate, const ds4_weight *up, const ds4_weight *down,
                   const float *x, int T, const int32_t *sel, const float *w, int k, float clamp, float *out,
                   bool accumulate)
{
    cuda_backend *c = cb_of(be);
    cb_xcache *xc = c->xc;
    const int n = T * k;
    const int64_t D = gate->ne[0];
    if ((size_t)n > xc->ids_cap) {
        ds4_cuda_free(c->cu, xc->d_ids);
        if (xc->h_sel) cudaFreeHost(xc->h_sel);
        xc->d_ids = NULL;
        xc->h_sel = NULL;
        xc->ids_cap = 0;
        ds4_status st = ds4_cuda_malloc(c->cu, (size_t)n * sizeof(int32_t), (void **)&xc->d_ids);
        if (st == DS4_OK && cudaMallocHost((void **)&xc->h_sel, (size_t)n * sizeof(int32_t)) != cudaSuccess)
            st = ds4_fail(DS4_ERR_NOMEM, "cuda expert cache: pinned ids buffer");
        if (st != DS4_OK) {
            cb_fail_status(be, st, "moe_experts (expert cache)");
            return;
        }
        xc->ids_cap = (size_t)n;
    }
    /* the router's choice, on the host: the one wait per MoE layer */
    const double t0w = xc_now();
    if (cudaMemcpyAsync(xc->h_sel, sel, (size_t)n * sizeof(int32_t), cudaMemcpyDeviceToHost, c->cu->stream) !=
            cudaSuccess ||
        cudaStreamSynchronize(c->cu->stream) != cudaSuccess) {
        cb_fail_status(be, ds4_fail(DS4_ERR_BACKEND, "cuda expert cache: ids download: %s",
                                    cudaGetErrorString(cudaGetLastError())),
                       "moe_experts");
        return;
    }
    xc->wait_s += xc_now() - t0w;
    xc->calls++;
    const int32_t *map = xc->d_map + (size_t)layer * (size_t)xc->n_expert;
    /* The shared expert's result offered to the down's store (ds4_cuda's
     * down_add, cuda_ops_moe_ahead.cu) is the whole call's, token t at y +
     * t * D: a call split into chunks would add token 0's to each chunk's
     * first token (and none to the rest), so a split call hides the offer
     * and the offerer adds the result itself (the same bits). */
    const auto offer = c->cu->down_add;
    for (int t0 = 0; t0 < T;) {
        const int tn = xc_chunk(xc, xc->h_sel, t0, T, k);
        if (t0 == 0 && tn < T) c->cu->down_add = {NULL, NULL, 0};
        /* a later chunk may evict what the previous one's kernels read */
        if (t0 > 0) cudaStreamSynchronize(c->cu->stream);
        ds4_status st = xc_resolve(c, xc, layer, xc->h_sel + (size_t)t0 * k, tn * k);
        if (st != DS4_OK) {
            cb_fail_status(be, st, "moe_experts (expert cache)");
            return;
        }
        xc->chunks++;
        cb_xcache_remap_kernel<<<(tn * k + 255) / 256, 256, 0, c->cu->stream>>>(sel + (size_t)t0 * k, map,
                                                                                xc->n_expert, tn * k, xc->d_ids);
        cb_moe_compute(be, gate, up, down, xc->pool[0], xc->pool[1], xc->pool[2], xc->d_ids, xc->n_slots,
                       sel + (size_t)t0 * k, map, x + (size_t)t0 * D, tn, w + (size_t)t0 * k, k, clamp,
                       out + (size_t)t0 * D, accumulate, T);
        t0 += tn;
    }
    if (offer.y && !c->cu->down_add.y) c->cu->down_add = {offer.y, offer.ready, 0}; /* not taken */
}

extern "C" double ds4_cuda_h2d_bandwidth(int device, size_t bytes, int pinned, int reps)
{
    if (reps < 1 || reps > 64 || bytes == 0 || cudaSetDevice(device) != cudaSuccess) return -1;
    void *h = NULL, *d = NULL;
    double t[64], bw = -1;
    if (pinned ? cudaMallocHost(&h, bytes) != cudaSuccess : !(h = malloc(bytes))) h = NULL;
    if (h && cudaMalloc(&d, bytes) == cudaSuccess) {
        memset(h, 1, bytes); /* pageable memory: fault it in before timing */
        int ok = cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) == cudaSuccess;
        for (int r = 0; ok && r < reps; r++) {
            const double t0 = xc_now();
            ok = cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) == cudaSuccess;
            t[r] = xc_now() - t0;
        }
        if (ok) {
            for (int i = 1; i < reps; i++) /* insertion sort: the median */
                for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
                    const double x = t[j];
                    t[j] = t[j - 1];
                    t[j - 1] = x;
                }
            bw = (double)bytes / t[reps / 2];
        }
    }
    if (d) cudaFree(d);
    if (h) pinned ? (void)cudaFreeHost(h) : free(h);
    cudaGetLastError();
    return bw;
}

/*
 * cuda_expert_cache.cuh - the VRAM expert cache of the CUDA backend
 * (issue 14; docs/STREAMING.md "CUDA: --gpu-expert-cache").
 *
 * Only n_slots routed experts live in device memory: three pools (gate,
 * up, down), slot s of each at base + s * (bytes of one expert), so the
 * MoE kernels keep their "expert e at base + e * stride" addressing with
 * the pool as base and a slot index where they took the expert id; the
 * down + combine kernel keeps the expert ids for its summation order and
 * takes the slot from a device expert -> slot map (cuda_mmvq.cu slot_of).
 * Every multiplication and every sum is the one of the full-residency
 * path, so the logits are bit-identical at any budget.
 *
 * A MoE op downloads the router's expert ids (one small copy and a wait
 * per MoE layer), resolves them on the host (backend/expert_slots.h: LRU
 * or frequency eviction, never what the call itself uses), copies the
 * misses from the weights' host memory (pinned in place with
 * cudaHostRegister when the driver allows it) on a copy stream of its own,
 * and makes the compute stream wait for them with an event. A call whose
 * tokens need more distinct experts than there are slots (prefill on a
 * small cache) runs in token chunks that fit, each on the kernel path the
 * whole call would take, so the arithmetic does not change either.
 */
#ifndef DS4_CUDA_EXPERT_CACHE_CUH
#define DS4_CUDA_EXPERT_CACHE_CUH

#include "backend/cuda/cuda_backend.cuh"

struct cb_xcache;

/* ops.h set_vram_expert_cache (installed by ds4_backend_cuda_create). */
ds4_status cb_xcache_set(ds4_backend *be, int n_layer, int n_expert, const ds4_weight *const *gud, int64_t n_slots,
                         int policy, const int32_t *preload, int64_t n_preload);
void cb_xcache_free(ds4_backend *be);

/* Whether host tensor data is a routed tensor the cache serves (so
 * weight_prepare must not upload it); the layer of a gate tensor, or -1. */
bool cb_xcache_owns(const cb_xcache *xc, const void *host);
int cb_xcache_layer(const cb_xcache *xc, const void *gate_host);

/* op_moe_experts for a cached layer. */
void cb_xcache_moe(ds4_backend *be, int layer, const ds4_weight *gate, const ds4_weight *up, const ds4_weight *down,
                   const float *x, int T, const int32_t *sel, const float *w, int k, float clamp, float *out,
                   bool accumulate);

/* The routed-expert computation of cuda_ops_moe.cu on device weights:
 * per-slot kernels address expert ids_addr[s] (< n_addr) of dg/du/dd;
 * the down + combine kernel takes sel (the expert ids, < E, its order)
 * and slot_of (expert -> index of dd; NULL: the id itself). path_T: the
 * token count that picks the kernels (the whole call's, when it runs in
 * chunks). */
void cb_moe_compute(ds4_backend *be, const ds4_weight *gate, const ds4_weight *up, const ds4_weight *down,
                    const void *dg, const void *du, const void *dd, const int32_t *ids_addr, int64_t n_addr,
                    const int32_t *sel, const int32_t *slot_of, const float *x, int T, const float *w, int k,
                    float clamp, float *out, bool accumulate, int path_T);

extern "C" ds4_status ds4_cuda_mmvq_down_slots(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows,
                                               int64_t cols, const int32_t *d_ids, const int32_t *d_slot_of,
                                               int64_t n_expert, const float *d_route_w, int k, int64_t n_tok,
                                               const float *d_h, float *d_out, int accumulate);

#endif

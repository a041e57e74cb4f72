/*
 * ops.h - the backend contract: the coarse fused operations the DeepSeek V4
 * forward pass (model/dsv4_forward.c) is written against.
 *
 * A backend (backend/cpu, later backend/cuda) fills a struct ds4_backend
 * with function pointers; the model calls nothing else. The ops are coarse
 * on purpose (a whole mHC collapse with its Sinkhorn, a whole chunk of
 * compressor pushes, a whole chunk of sparse attention) so that a GPU
 * backend needs only a few launches per layer and the model never touches
 * activation memory itself.
 *
 * Memory. Activations and session state (raw KV ring, compressed rows,
 * compressor/indexer frontiers) are "device pointers": memory returned by
 * be->alloc(). The model never dereferences them; it moves bytes in and out
 * only with upload/download. Model parameters are ds4_weight views of host
 * memory (the mmapped GGUF, or small f32 arrays the model owns); a backend
 * that needs them elsewhere caches its own copy keyed by the view
 * (weight_prepare). Every layout below is plain row-major f32 unless noted,
 * so the session state has one meaning on every backend (a snapshot taken
 * on one restores on another).
 *
 * Chunks. Ops over a chunk of T tokens at consecutive absolute positions
 * pos0 .. pos0+T-1 (dsv4-model.md §3.10: prefill is the per-token recurrence
 * batched; results do not depend on T).
 *
 * Each op cites the section of shared/docs/dsv4-model.md whose math it is.
 * tests/test_ops.c checks every op of the CPU backend against an
 * independent double-precision computation; a new backend must pass it.
 */
#ifndef DS4_BACKEND_OPS_H
#define DS4_BACKEND_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "include/ds4.h"
#include "quant/blocks.h"

/* A model parameter: a host view of a GGUF tensor (or a small f32 array).
 * ne[0] is the contiguous axis (GGUF order): a matrix of `ne[1]` rows of
 * `ne[0]` inputs; 3-D expert tensors stack ne[2] such matrices. */
typedef struct {
    const char *name;
    ds4_type type;
    int n_dims;
    int64_t ne[4];
    const void *data;
    uint64_t nbytes;
} ds4_weight;

/* Numerics switches of the KV path (§4.1). All zero = "hf" (clean math). */
typedef struct {
    int fp8_nope;     /* D1: FP8-E4M3 round trip of the first fp8_nope dims of a KV row (0 = off) */
    bool f16_store;   /* D3: round stored KV rows (raw and compressed) to f16 */
    bool indexer_qat; /* D2: Hadamard + FP4-E2M1 round trip of indexer queries and keys */
} ds4_kv_numerics;

/* Streaming state of one compressor (§3.5, §5.1), all device memory:
 *   buf_c, buf_z   [ratio, width_in]  pending window, slot = pos mod ratio
 *                                     (gate stored with ape added)
 *   prev_c, prev_z [ratio, out_dim]   CSA only (overlap): Ca/za of the last
 *                                     complete window; initially 0 / -inf
 *   rows           [cap_rows, out_dim] emitted rows, append-only; row w is
 *                                     window w, normed and RoPE'd
 * width_in = out_dim * (overlap ? 2 : 1). The number of rows and of pending
 * slots follow from the absolute position alone (floor(n/ratio), n mod
 * ratio), so no counters live on the device. */
typedef struct {
    int ratio;
    int out_dim;
    bool overlap;
    int64_t cap_rows;
    float *buf_c, *buf_z, *prev_c, *prev_z, *rows;
} ds4_comp_state;

/* Work counters (for tests that check decode cost; §5). */
typedef struct {
    uint64_t rows_attended;     /* KV rows entering an attention softmax, summed over queries (one per query, not per head) */
    uint64_t compressor_pushes; /* tokens pushed into any compressor */
    uint64_t rows_emitted;      /* compressed rows / indexer keys produced */
    uint64_t indexer_keys_scored; /* (query, key) pairs scored by the indexer */
    uint64_t matmul_rows;       /* weight rows multiplied, summed over tokens */
} ds4_op_stats;

/* *to += *d, counter by counter. */
static inline void ds4_op_stats_add(ds4_op_stats *to, const ds4_op_stats *d)
{
    to->rows_attended += d->rows_attended;
    to->compressor_pushes += d->compressor_pushes;
    to->rows_emitted += d->rows_emitted;
    to->indexer_keys_scored += d->indexer_keys_scored;
    to->matmul_rows += d->matmul_rows;
}

typedef struct ds4_backend ds4_backend;
struct ds4_expert_cache; /* backend/expert_cache.h */

struct ds4_backend {
    const char *name;
    ds4_op_stats stats;
    /* Tokens a prefill step takes when the caller leaves it to the library
     * (engine/session.c); 0: the library's 512. */
    int prefill_chunk;

    void (*destroy)(ds4_backend *be);

    /* ---- memory -------------------------------------------------------- */
    /* Zero-filled device memory; NULL (message set) on failure. */
    void *(*alloc)(ds4_backend *be, size_t bytes);
    void (*free)(ds4_backend *be, void *p);
    void (*upload)(ds4_backend *be, void *dst, const void *src, size_t bytes);
    void (*download)(ds4_backend *be, void *dst, const void *src, size_t bytes);
    /* Optional (NULL: nothing to do): page-lock host memory that downloads
     * land in (pin), or release it (!pin) before it is freed; a backend
     * that cannot leaves it as it is. CUDA: a download into locked memory
     * is one DMA, with no staging copy (a session's logits row). */
    void (*host_pin)(ds4_backend *be, void *p, size_t bytes, bool pin);
    /* Optional (NULL: ops do not fail once the backend is made): DS4_OK,
     * or the first failure of an op since the backend was made (a kernel
     * that did not launch, device memory that could not be had), with its
     * message set again. It stays failed. The model checks it after each
     * forward step and returns it instead of the step's numbers, which
     * such a failure makes wrong. */
    ds4_status (*status)(ds4_backend *be);
    void (*fill)(ds4_backend *be, float *dst, float value, size_t n);
    /* Make a parameter usable by this backend (upload, repack); CPU: no-op.
     * Fails (message naming the tensor) for a type the backend cannot use. */
    ds4_status (*weight_prepare)(ds4_backend *be, const ds4_weight *w);

    /* ---- dense math ---------------------------------------------------- */
    /* y[t, r] = sum_c W[r, c] x[t, c]; W is ne = [cols, rows], any float or
     * quantized type. (§3.0) */
    void (*matmul)(ds4_backend *be, const ds4_weight *w, const float *x,
                   int T, float *y);
    /* Block-diagonal product (grouped output projection, §3.4): W has G
     * groups of rows_g = ne[1]/G rows; group g reads x[t, g*cols ..
     * (g+1)*cols) where cols = ne[0], x has G*cols per token, y has ne[1]. */
    void (*matmul_grouped)(ds4_backend *be, const ds4_weight *w, int groups,
                           const float *x, int T, float *y);
    /* Optional (NULL: the caller runs the two ops): u = matmul_grouped(wa,
     * groups, x) then y = matmul(wb, u), both stored, with the two ops'
     * results. One op so that a backend may hand u to the second product
     * in a form it made along the way (CUDA: one token's u as Q8_0 blocks). */
    void (*matmul_grouped_chain)(ds4_backend *be, const ds4_weight *wa, int groups,
                                 const float *x, int T, float *u,
                                 const ds4_weight *wb, float *y);
    /* out[r] = x[r] * rms(x[r]) * w   for n_rows rows of n; w may be NULL
     * (unweighted RMSNorm_1). out may equal x. (§3.2) */
    void (*rmsnorm)(ds4_backend *be, const float *x, const ds4_weight *w,
                    int64_t n_rows, int n, float eps, float *out);
    /* Interleaved RoPE of the trailing n_rot dims of every head (§3.4):
     * x [T, n_heads, head_dim], position of token t = pos0 + t,
     * theta_i = pos * omega[i] (omega: n_rot/2 f32, an F32 weight);
     * inverse rotates by -theta. In place. */
    void (*rope)(ds4_backend *be, float *x, int T, int n_heads, int head_dim,
                 int n_rot, const ds4_weight *omega, int64_t pos0, bool inverse);
    /* X [T, n_hc, D] = token_embd[tokens[t]] copied into every stream (§3.1).
     * tokens: T int32 in device memory. */
    void (*embed)(ds4_backend *be, const ds4_weight *tok_embd,
                  const int32_t *tokens, int T, int n_hc, float *X);

    /* ---- hyper-connections (§3.3, §3.8) -------------------------------- */
    /* mHC collapse: from X [T, n_hc, D] compute
     * y [T, D] = sum_i pre_i X_i, post [T, n_hc], comb [T, n_hc, n_hc]
     * (comb[i][j]: i = source stream; Sinkhorn with `iters` iterations).
     * fn: ne = [n_hc*D, (2+n_hc)*n_hc]; scale: 3 f32; base: (2+n_hc)*n_hc. */
    void (*hc_pre)(ds4_backend *be, const float *X, int T, int n_hc, int D,
                   const ds4_weight *fn, const ds4_weight *scale,
                   const ds4_weight *base, int iters, float rms_eps,
                   float hc_eps, float *y, float *post, float *comb);
    /* X'[j] = post[j] F + sum_i comb[i][j] X[i], in place on X. */
    void (*hc_post)(ds4_backend *be, float *X, int T, int n_hc, int D,
                    const float *F, const float *post, const float *comb);
    /* Final head collapse (§3.8): y = sum_i (sigmoid(m_i scale + base_i) +
     * hc_eps) X_i with m = rms(flat X) * fn . flat X; fn ne = [n_hc*D, n_hc]. */
    void (*hc_head)(ds4_backend *be, const float *X, int T, int n_hc, int D,
                    const ds4_weight *fn, const ds4_weight *scale,
                    const ds4_weight *base, float rms_eps, float hc_eps,
                    float *y);

    /* ---- attention state and math (§3.4-§3.6, §4.1, §5) --------------- */
    /* Official-numerics rounding of n_rows KV rows of row_len in place:
     * FP8 round trip of dims [0, nm->fp8_nope) in blocks of 64 (fp8_nope is
     * a multiple of 64), then f16 rounding of the whole row (D1, D3). The
     * rounded values are stored as f32. */
    void (*kv_round)(ds4_backend *be, float *x, int64_t n_rows, int row_len,
                     const ds4_kv_numerics *nm);
    /* Hadamard-128 + FP4 round trip of n_rows rows of row_len = 128 (D2).
     * In place. */
    void (*indexer_qat)(ds4_backend *be, float *x, int64_t n_rows, int row_len);
    /* Push T tokens' compressor inputs into the frontier (§3.5): c, z are
     * [T, width_in] (z without ape); ape: ne = [width_in, ratio]. Every
     * window completed by the chunk is pooled (per-dimension softmax over
     * its slots; CSA: previous window's first half + this window's second
     * half), RMSNorm'ed with `norm`, RoPE'd at the window's first position
     * (omega, n_rot trailing dims), rounded per `nm` (kv_round for main
     * rows, indexer_qat for indexer keys when nm->indexer_qat and
     * is_indexer) and appended to st->rows. */
    void (*compressor_push)(ds4_backend *be, ds4_comp_state *st,
                            const float *c, const float *z, int T,
                            int64_t pos0, const ds4_weight *ape,
                            const ds4_weight *norm, float eps,
                            const ds4_weight *omega, int n_rot,
                            const ds4_kv_numerics *nm, bool is_indexer);
    /* Lightning-indexer selection (§3.6) for T queries: query t sees
     * n_t = floor((pos0+t+1)/ratio) keys; if n_t <= topk all are selected,
     * else the topk best by score = sum_h w[t,h] relu(q[t,h] . key_s),
     * ties by lower index. qi [T, n_heads, dim], w [T, n_heads],
     * keys [>= n_T, dim]. sel [T, topk] int32 device: selected entry ids
     * in ascending order, -1 padded. */
    void (*indexer_topk)(ds4_backend *be, const float *qi, const float *w,
                         int T, int n_heads, int dim, const float *keys,
                         int64_t pos0, int ratio, int topk, int32_t *sel);
    /* Sparse/mixed attention with sinks (§3.4) for T queries:
     * q [T, n_heads, hd]; raw rows of position p come from kv [T, hd] when
     * p >= pos0 (row p - pos0), else from ring slot p mod window; query at
     * p sees raw positions max(0, p-window+1) .. p. Compressed rows
     * comp [*, hd] (NULL when ratio == 0): if sel is NULL query p sees rows
     * w < floor((p+1)/ratio), else the ids in sel[t, 0..topk) (-1 = none).
     * One softmax with the sink logit sinks[h]; scale 1/sqrt(hd); V = K.
     * out [T, n_heads, hd]. */
    void (*attention)(ds4_backend *be, const float *q, int T, int n_heads,
                      int hd, const float *kv, const float *ring, int window,
                      int64_t pos0, const float *comp, int ratio,
                      const int32_t *sel, int topk, const ds4_weight *sinks,
                      float *out);
    /* Store the chunk's raw rows kv [T, hd] into the ring (slot p mod
     * window), keeping the last `window` positions (§5.1). */
    void (*ring_push)(ds4_backend *be, float *ring, int window, int hd,
                      const float *kv, int T, int64_t pos0);

    /* ---- mixture of experts (§3.7) ------------------------------------- */
    /* Router: from logits [T, n_expert] pick k experts per token and their
     * weights: sc = sqrt(softplus(logit)); hash layers (tid2eid != NULL,
     * I32 ne = [k, vocab]) take tid2eid[tokens[t]], others the top-k of
     * sc + bias (bias may be NULL; ties by lower id); w = sc[sel] /
     * sum sc[sel] * scale. sel [T, k] int32, w [T, k] f32 (device). */
    void (*moe_route)(ds4_backend *be, const float *logits, int T,
                      int n_expert, int k, const ds4_weight *bias,
                      const ds4_weight *tid2eid, const int32_t *tokens,
                      float scale, int32_t *sel, float *w);
    /* Routed experts: out[t] (+)= sum_k w[t,k] down_e(swiglu(gate_e x,
     * up_e x)) with e = sel[t,k]; gate/up ne = [D, F, E], down [F, D, E];
     * SwiGLU clamp: gate <= clamp, |up| <= clamp. accumulate: add to out
     * instead of overwriting. An id < 0 (with weight 0) is no expert: a
     * tensor-parallel rank holds a slice of the experts and drops the
     * others' (model/dsv4_forward.c); the CPU backend skips them, the CUDA
     * backend is not given them (tensor parallel runs on the CPU only). */
    void (*moe_experts)(ds4_backend *be, const ds4_weight *gate,
                        const ds4_weight *up, const ds4_weight *down,
                        const float *x, int T, const int32_t *sel,
                        const float *w, int k, float clamp, float *out,
                        bool accumulate);
    /* Dense clamped SwiGLU FFN (shared expert): out (+)= down(swiglu(gate x,
     * up x)). */
    void (*ffn_swiglu)(ds4_backend *be, const ds4_weight *gate,
                       const ds4_weight *up, const ds4_weight *down,
                       const float *x, int T, float clamp, float *out,
                       bool accumulate);
    /* Optional (NULL: the model calls moe_experts, then ffn_swiglu with
     * accumulate): both at once, out = routed experts + shared expert, with
     * the bits of those two calls; lets a backend run them in one region. */
    void (*moe_shared)(ds4_backend *be, const ds4_weight *gate,
                       const ds4_weight *up, const ds4_weight *down,
                       const ds4_weight *gate_sh, const ds4_weight *up_sh,
                       const ds4_weight *down_sh, const float *x, int T,
                       const int32_t *sel, const float *w, int k, float clamp,
                       float *out);
    /* Optional (NULL: nothing starts early), with moe_shared: start the
     * shared expert's product of x (ffn_swiglu of gate_sh, up_sh,
     * down_sh) now, beside the ops that follow (the router); the next
     * moe_shared with the same shared weights, x and T adds that result
     * instead of computing it, with the same bits. The model calls it
     * right before the router, x unchanged until moe_shared. */
    void (*ffn_swiglu_ahead)(ds4_backend *be, const ds4_weight *gate_sh,
                             const ds4_weight *up_sh, const ds4_weight *down_sh,
                             const float *x, int T, float clamp);
    /* Optional (all three or none; NULL: ops run in call order): the ops
     * called between side_begin and side_end may run beside the ops called
     * after side_end, until side_join, which waits for them. The model
     * puts there only ops that read nothing the later ones write and
     * write nothing they read (a decode step's compressor pushes, beside
     * the query path); each op gives the bits it gives in order. A
     * side_begin may follow a side_end before its join: the side's ops
     * keep their call order and one side_join waits for all of them. A
     * side_begin without a side_end, or a step left without its
     * side_join, is a misuse. CUDA: a second stream. */
    void (*side_begin)(ds4_backend *be);
    void (*side_end)(ds4_backend *be);
    void (*side_join)(ds4_backend *be);
    /* With the side ops, how a CSA layer's indexer is placed: 0, all of it
     * beside the query path (after the compressors, on the side); nonzero,
     * its query products (the indexer's q_b, RoPE, QAT and head weights)
     * on the backend's stream before the fork and only the selection
     * beside, so that they run beside the compressors instead of after
     * them. The same ops either way, so the same bits. */
    int side_indexer_query_first;
    /* With side_indexer_query_first, nonzero: the indexer's head weights
     * (its product of the sublayer input, which nothing on the query path
     * reads) go beside, after the compressors, instead of on the backend's
     * stream before the fork: the query products are then the only
     * indexer work on the query path. The same op, so the same bits. */
    int side_indexer_weights_beside;

    /* ---- fused ops (optional; NULL = the model calls the separate ops) - */
    /* A backend that pays a fixed cost per launched kernel may offer these
     * sequences as one op; each must give bit for bit what its separate
     * ops give on that backend.
     * hc_pre_norm: hc_pre, then rmsnorm(y, norm, T rows of D, norm_eps) into
     * a (y is written too). */
    void (*hc_pre_norm)(ds4_backend *be, const float *X, int T, int n_hc, int D,
                        const ds4_weight *fn, const ds4_weight *scale,
                        const ds4_weight *base, int iters, float rms_eps,
                        float hc_eps, float *y, float *post, float *comb,
                        const ds4_weight *norm, float norm_eps, float *a);
    /* hc_post_pre_norm: hc_post(X, F, post_in, comb_in) of the sublayer
     * before, then hc_pre_norm (the rest as there). post_in and comb_in may
     * be post and comb: they are read before they are written. */
    void (*hc_post_pre_norm)(ds4_backend *be, float *X, int T, int n_hc, int D,
                             const float *F, const float *post_in,
                             const float *comb_in, const ds4_weight *fn,
                             const ds4_weight *scale, const ds4_weight *base,
                             int iters, float rms_eps, float hc_eps, float *y,
                             float *post, float *comb, const ds4_weight *norm,
                             float norm_eps, float *a);
    /* rmsnorm_rope_qkv: rmsnorm_rope(q, NULL, T, n_heads, head_dim, eps,
     * n_rot, omega, pos0, NULL), then rmsnorm_rope(kv, kv_w, T, 1, head_dim,
     * eps, n_rot, omega, pos0, nm). */
    void (*rmsnorm_rope_qkv)(ds4_backend *be, float *q, int n_heads, float *kv,
                             const ds4_weight *kv_w, int T, int head_dim,
                             float eps, int n_rot, const ds4_weight *omega,
                             int64_t pos0, const ds4_kv_numerics *nm);
    /* rmsnorm_rope_qkv_seqs: rmsnorm_rope_qkv for n_seq sequences of one
     * row each (batched decode): row i of q (n_heads heads) and of kv at
     * position pos0[i] (a host array). */
    void (*rmsnorm_rope_qkv_seqs)(ds4_backend *be, float *q, int n_heads,
                                  float *kv, const ds4_weight *kv_w, int n_seq,
                                  int head_dim, float eps, int n_rot,
                                  const ds4_weight *omega, const int64_t *pos0,
                                  const ds4_kv_numerics *nm);
    /* rope_seqs: rope for n_seq sequences of one row each (batched
     * decode): row i of x (n_heads heads of head_dim) at position pos0[i]
     * (a host array), as n_seq rope calls of T = 1 give it. */
    void (*rope_seqs)(ds4_backend *be, float *x, int n_seq, int n_heads,
                      int head_dim, int n_rot, const ds4_weight *omega,
                      const int64_t *pos0, bool inverse);
    /* attention_out: attention(q, T, n_heads, hd, kv, ring, window, pos0,
     * comp, ratio, sel, topk, sinks, out), then ring_push(ring, window, hd,
     * kv, T, pos0), then rope(out, T, n_heads, hd, n_rot, omega, pos0,
     * inverse = true). */
    void (*attention_out)(ds4_backend *be, const float *q, int T, int n_heads,
                          int hd, const float *kv, float *ring, int window,
                          int64_t pos0, const float *comp, int ratio,
                          const int32_t *sel, int topk, const ds4_weight *sinks,
                          int n_rot, const ds4_weight *omega, float *out);
    /* sublayer_input (optional; NULL: nothing to do): x, a sublayer's
     * input of T rows, is written by the next op that writes it (the
     * hyper-connection site: hc_pre_norm, hc_post_pre_norm or rmsnorm) and
     * then only read until sublayer_input(be, NULL, 0). Meanwhile a backend
     * may hand the products that read x a form of it that the site made
     * along the way (CUDA: one token's x as Q8_0 blocks,
     * DS4_CUDA_Q8_HANDOFF_S). */
    void (*sublayer_input)(ds4_backend *be, const float *x, int T);
    /* attention_out_project (optional; NULL: the caller runs the two ops):
     * attention_out(q, ..., out), then matmul_grouped_chain(wa, groups,
     * out, T, u, wb, y), with their results. One op so that a backend may
     * hand out to o_a in a form it made along the way (CUDA: one token's
     * attention output as Q8_0 blocks, DS4_CUDA_Q8_HANDOFF_A). */
    void (*attention_out_project)(ds4_backend *be, const float *q, int T,
                                  int n_heads, int hd, const float *kv,
                                  float *ring, int window, int64_t pos0,
                                  const float *comp, int ratio,
                                  const int32_t *sel, int topk,
                                  const ds4_weight *sinks, int n_rot,
                                  const ds4_weight *omega, float *out,
                                  const ds4_weight *wa, int groups, float *u,
                                  const ds4_weight *wb, float *y);
    /* moe_router: matmul(gate_inp, x, T, logits), then moe_route(logits, T,
     * n_expert, k, bias, tid2eid, tokens, scale, sel, w). */
    void (*moe_router)(ds4_backend *be, const ds4_weight *gate_inp,
                       const float *x, int T, float *logits, int n_expert,
                       int k, const ds4_weight *bias,
                       const ds4_weight *tid2eid, const int32_t *tokens,
                       float scale, int32_t *sel, float *w);
    /* attention_out_seqs: attention_out for n_seq sequences of one query
     * each (batched decode): sequence i's query is row i of q, its kv row
     * row i of kv, its selection row i of sel (NULL: none), its output row i
     * of out; it is at position pos0[i] with its own ring[i] and comp[i]
     * (NULL: none). pos0, ring and comp are host arrays. */
    void (*attention_out_seqs)(ds4_backend *be, const float *q, int n_seq,
                               int n_heads, int hd, const float *kv,
                               float *const *ring, int window,
                               const int64_t *pos0, const float *const *comp,
                               int ratio, const int32_t *sel, int topk,
                               const ds4_weight *sinks, int n_rot,
                               const ds4_weight *omega, float *out);
    /* compressor_push_seqs: compressor_push for n_seq sequences of one
     * token each (batched decode): sequence i's c and z are row i of c and
     * z (each row the states' input width), pushed into st[i] at position
     * pos0[i]. Every state is of the same layer and kind (same widths);
     * st and pos0 are host arrays. */
    void (*compressor_push_seqs)(ds4_backend *be, ds4_comp_state *const *st,
                                 const float *c, const float *z, int n_seq,
                                 const int64_t *pos0, const ds4_weight *ape,
                                 const ds4_weight *norm, float eps,
                                 const ds4_weight *omega, int n_rot,
                                 const ds4_kv_numerics *nm, bool is_indexer);
    /* indexer_topk_seqs: indexer_topk for n_seq sequences of one query
     * each (batched decode): sequence i's query is row i of qi and w, its
     * selection row i of sel, its keys keys[i] (its indexer rows), its
     * position pos0[i]. keys and pos0 are host arrays. */
    void (*indexer_topk_seqs)(ds4_backend *be, const float *qi, const float *w,
                              int n_seq, int n_heads, int dim,
                              const float *const *keys, const int64_t *pos0,
                              int ratio, int topk, int32_t *sel);
    /* matmul_pair: matmul(w1, x, T, y1) and matmul(w2, x, T, y2). */
    void (*matmul_pair)(ds4_backend *be, const ds4_weight *w1, const ds4_weight *w2,
                        const float *x, int T, float *y1, float *y2);
    /* compress_two (optional; NULL: the model calls the ops): a CSA layer's
     * two compressors on one input (one sequence): matmul_pair(kv[k],
     * gate[k], x, T, c[k], z[k]) for k = 0, 1, then compressor_push(st[k],
     * c[k], z[k], T, pos0, ape[k], norm[k], eps, omega, n_rot, nm,
     * is_indexer = k == 1) for k = 0, 1 (the attention's compressor, then
     * the indexer's), with their results. One op so that a backend may
     * make the four products in one weight pass and the two pushes at once
     * (CUDA: one token's). */
    void (*compress_two)(ds4_backend *be, const ds4_weight *const kv[2],
                         const ds4_weight *const gate[2], const float *x, int T,
                         float *const c[2], float *const z[2],
                         ds4_comp_state *const st[2], int64_t pos0,
                         const ds4_weight *const ape[2],
                         const ds4_weight *const norm[2], float eps,
                         const ds4_weight *omega, int n_rot,
                         const ds4_kv_numerics *nm);
    /* rmsnorm_rope: on x [T, n_heads, head_dim] in place, rmsnorm of every
     * head row (w may be NULL), then rope(.., pos0, forward), then, when nm
     * is not NULL, kv_round(.., nm). */
    void (*rmsnorm_rope)(ds4_backend *be, float *x, const ds4_weight *w,
                         int T, int n_heads, int head_dim, float eps, int n_rot,
                         const ds4_weight *omega, int64_t pos0,
                         const ds4_kv_numerics *nm);
    /* rmsnorm_matmul: matmul(w, rmsnorm(x, norm, T rows of n, eps), T, y)
     * with x left as it is (the normalized rows are not kept), so several
     * products of one normalized input may each take it. */
    void (*rmsnorm_matmul)(ds4_backend *be, const float *x, const ds4_weight *norm,
                           int T, int n, float eps, const ds4_weight *w,
                           float *y);
    /* query_rope (optional; NULL: the caller runs the two ops):
     * rmsnorm_matmul(qr, q_norm, T, n, eps, wq, q), then
     * rmsnorm_rope_qkv(q, n_heads, kv, kv_w, T, head_dim, eps, n_rot,
     * omega, pos0, nm), with their results. One op so that a backend may
     * normalize and rotate each head as the product finishes it (CUDA: one
     * token's q_b; DS4_CUDA_QB_ROPE=0 leaves the op out). */
    void (*query_rope)(ds4_backend *be, const float *qr, const ds4_weight *q_norm,
                       int T, int n, float eps, const ds4_weight *wq, float *q,
                       int n_heads, float *kv, const ds4_weight *kv_w,
                       int head_dim, int n_rot, const ds4_weight *omega,
                       int64_t pos0, const ds4_kv_numerics *nm);
    /* indexer_query_rope (optional; NULL: the caller runs the ops): the
     * lightning indexer's queries of one sequence (§3.6),
     * rmsnorm_matmul(qr, q_norm, T, n, eps, w, qi), then rope(qi, T,
     * n_heads, head_dim, n_rot, omega, pos0, false), then, with qat,
     * indexer_qat(qi, T * n_heads, head_dim), with their results. One op so
     * that a backend may rotate and round each head where the product
     * leaves it (CUDA: one token's). */
    void (*indexer_query_rope)(ds4_backend *be, const float *qr,
                               const ds4_weight *q_norm, int T, int n,
                               float eps, const ds4_weight *w, float *qi,
                               int n_heads, int head_dim, int n_rot,
                               const ds4_weight *omega, int64_t pos0,
                               bool qat);

    /* ---- decode-step replay (optional; NULL = not used) ---------------- */
    /* A backend that records a whole decode step once and replays it (CUDA
     * graphs) needs to see the step's boundaries. The model calls
     * step_begin(pos0) before the device work of a T = 1 forward and
     * step_end() after it; step_end returns true when the step's ops must
     * be issued once more (the backend switched mode, e.g. it found the
     * recording stale and now records anew), false when the step is done.
     * A backend may return true only when the pass just ended changed no
     * state (its ops were recorded or skipped, not run): the ops are not
     * idempotent (compressor frontiers, hc_post in place). Between the
     * two, every op gets the same pos0. key names whose step it is (the
     * model passes its state: sessions may share a backend).
     * step_begin returns true when the step is already issued (a walk
     * ahead, below, found it the recorded one): the model then issues no
     * op of it and does not call step_end.
     * step_ahead (optional, NULL = not used): right after a step was
     * issued, the model may offer the next one (pos0 = the next position,
     * same key); a backend that returns true gets that step's ops walked
     * at once, while the device still runs this one, then step_end. The
     * walk must change no state (the backend launches nothing of it); it
     * lets the next step_begin of that key and position launch at once
     * instead of waiting for the walk between the steps. */
    bool (*step_begin)(ds4_backend *be, int64_t pos0, const void *key);
    bool (*step_end)(ds4_backend *be);
    bool (*step_ahead)(ds4_backend *be, int64_t pos0, const void *key);

    /* ---- state of other instances (optional; NULL = own memory only) --- */
    /* A batched decode step (model/dsv4_forward_batch.c) runs the ops of
     * one backend on the states of several sessions, each allocated by
     * its own backend instance. shares_memory: whether be's ops may take
     * device pointers that `other` allocated (CPU: any CPU backend, it is
     * all host memory; CUDA: a CUDA backend on the same device). Offsets
     * into such memory are plain pointer arithmetic, as for be's own. */
    bool (*shares_memory)(const ds4_backend *be, const ds4_backend *other);
    /* Wait until the work queued on be is done, so that another instance
     * may use its memory (CUDA: the stream). NULL: every op is done when
     * it returns (CPU). */
    void (*sync)(ds4_backend *be);

    /* ---- greedy pick on the backend (optional; NULL = not offered) ----- */
    /* A greedy decode step needs one token of its logits, not the row:
     * where the backend offers these, the engine leaves the logits where
     * the head wrote them and takes only the picks (docs/CUDA.md "The
     * greedy pick on the device"); without them it downloads the row and
     * picks on the host. argmax_rows: for n rows of n_vocab floats at x
     * (row i at x + i * n_vocab, memory be's ops may take), out[i] (host)
     * = ds4_argmax_excluding(row i, n_vocab, excluded) (include/
     * ds4_sampler.h) bit for bit: the index of the largest value, the
     * lowest on ties (-0 and +0 equal), never a NaN, -inf or `excluded`
     * (< 0: none), -1 when no value is left. It follows the ops queued
     * before it and returns when out is written; never inside a step
     * (step_begin .. step_end). copy: bytes from src to dst (memory be's
     * ops may take), in order with the ops (a batched step puts each
     * session's row into its own state with it). */
    ds4_status (*argmax_rows)(ds4_backend *be, const float *x, int n, int n_vocab, int32_t excluded, int32_t *out);
    void (*copy)(ds4_backend *be, void *dst, const void *src, size_t bytes);

    /* ---- expert streaming (optional; NULL = this backend cannot) ------- */
    /* Take the routed experts of the layers `c` knows from that bounded
     * cache instead of the weight views' memory (backend/expert_cache.h,
     * docs/STREAMING.md); NULL detaches. Results must be bit-identical. */
    void (*set_expert_cache)(ds4_backend *be, struct ds4_expert_cache *c);

    /* ---- VRAM expert cache (optional; NULL = this backend cannot) ------ */
    /* Keep only n_slots routed experts (one layer's gate+up+down each) in
     * device memory, copied from the weight views' host memory as tokens
     * select them, evicting by `policy` (ds4_expert_evict). Call before
     * weight_prepare: the routed tensors of `layers` are then not uploaded.
     * preload[2i], preload[2i+1] (n_preload pairs, at most n_slots): the
     * (layer, expert) pairs to copy in at once, in the background (a hot
     * list). Results must be bit-identical (docs/STREAMING.md, CUDA). */
    ds4_status (*set_vram_expert_cache)(ds4_backend *be, int n_layer, int n_expert,
                                        const ds4_weight *const *gate_up_down, int64_t n_slots,
                                        int policy, const int32_t *preload, int64_t n_preload);
};

/* The CPU backend (backend/cpu): n_threads <= 0 uses every core. */
ds4_backend *ds4_backend_cpu_create(int n_threads);

#endif

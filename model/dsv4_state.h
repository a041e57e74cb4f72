/*
 * dsv4_state.h - the decode-time state of one DeepSeek V4 sequence
 * (dsv4-model.md §5.1) in backend memory, the per-chunk activation buffers,
 * and the forward pass that advances it (model/dsv4_forward.c).
 *
 * State per layer: the raw KV ring (window rows), and for compressed layers
 * the compressor frontier + append-only compressed rows, for CSA layers
 * also the indexer's frontier + keys. Sizes are fixed at creation from the
 * context length, so nothing grows during decode and decoding token n
 * touches O(window + selected rows) rows, never all n.
 */
#ifndef DS4_MODEL_DSV4_STATE_H
#define DS4_MODEL_DSV4_STATE_H

#include "backend/ops.h"
#include "model/dsv4_model.h"

typedef struct {
    float *ring;         /* [window, head_dim], slot = pos mod window */
    ds4_comp_state comp; /* ratio != 0 */
    ds4_comp_state idx;  /* ratio == 4 (indexer keys) */
} dsv4_layer_state;

typedef struct {
    const dsv4_model *m;
    ds4_backend *be;
    int64_t n_ctx;     /* maximum positions */
    int64_t n_pos;     /* tokens consumed so far */
    int max_chunk;     /* tokens per forward call (activation buffers) */
    int logit_rows;    /* rows of the logits buffer: min(max_chunk, DSV4_LOGIT_ROWS) */
    ds4_kv_numerics nm;
    dsv4_layer_state *layers;
    /* activation buffers for max_chunk tokens (device) */
    int32_t *tokens, *sel, *esel;
    float *X, *y, *post, *comb, *a, *qr, *q, *kv, *c, *z, *ci, *zi, *qi, *wi;
    float *o, *u, *F, *rlogits, *ew, *hy, *logits;
    /* backend memory allocated at creation: the KV state for n_ctx
     * positions (rings, compressor buffers and rows) and the activation
     * buffers of one chunk */
    size_t kv_bytes, work_bytes;
    /* Per-session edits of the pass, set and owned by the engine (NULL/0:
     * none; docs/MODEL.md "Directional steering" and "--power"):
     * y <- y - S v (v . y) on each sublayer's output rows, v = steer_dir
     * row il (host [n_layer, n_embd], unit or zero rows), S = steer_attn /
     * steer_ffn; steer_buf is host scratch of [max_chunk, n_embd]. The
     * throttle sleeps between layers of a chunk and after a decode step. */
    const float *steer_dir;
    float steer_attn, steer_ffn;
    float *steer_buf;
    struct ds4_throttle *throttle;
    /* NULL, or host [n_layer, n_embd]: the FFN outputs summed (ds4-steer) */
    double *capture;
    int64_t capture_rows;
    /* Tensor parallel (m is a rank's view, dsv4_model_tp): the rank's
     * endpoint of its group, set by the engine before the first forward,
     * and the rank's rows of the logits [max_chunk, n_vocab / size] when
     * the head is split (else NULL). Only rank 0 has a logits buffer. */
    struct ds4_comm *comm;
    float *tp_logits;
} dsv4_state;

/* Directional steering of rows 0..N-1 of s->F (model/dsv4_steer.c). */
void dsv4_steer_rows(dsv4_state *s, int il, int N, float scale);
/* Add rows 0..N-1 of s->F into layer il of s->capture. */
void dsv4_capture_rows(dsv4_state *s, int il, int N);

/* The numerics switches of a mode: hf = all off; official = FP8 on the
 * non-RoPE dims, f16 KV storage, indexer Hadamard+FP4 (§4.1 D1-D3). */
ds4_kv_numerics dsv4_numerics(const dsv4_config *c, bool official);
/* Whether the model's shapes allow those simulations (FP8 blocks of 64,
 * Hadamard of 128: dsv4-model.md §7.1); message names the dims if not. */
ds4_status dsv4_numerics_check(const dsv4_config *c, const ds4_kv_numerics *nm);

/* Rows of a state's logits buffer (and of a tensor-parallel rank's
 * share). A row is n_vocab floats (517 KB for the Flash vocabulary), so a
 * buffer of max_chunk rows was the largest activation buffer of a session
 * (1 GB at CUDA's 2048-token chunk, half its work buffers), while the rows
 * read on the backend after a forward are few: a decode step's one, an MTP
 * verify's drafts + 1, a batched step's one per session. A forward asked
 * for more rows (all-row prefill) computes the head in groups of this many
 * and downloads each group. 64 rows: 33 MB. */
#define DSV4_LOGIT_ROWS 64
/* The most sessions one batched step takes (their activation rows live in
 * session 0's buffers and their logits in its logits rows); a larger batch
 * goes in groups of this many (engine/session_batch.c). */
int dsv4_state_batch_rows(const dsv4_state *s);

/* Allocate the state for n_ctx positions and chunks of up to max_chunk
 * tokens on backend be (borrowed); nm: numerics switches (NULL = hf). */
ds4_status dsv4_state_create(const dsv4_model *m, ds4_backend *be, int64_t n_ctx,
                             int max_chunk, const ds4_kv_numerics *nm, dsv4_state **out);
void dsv4_state_free(dsv4_state *s);
/* Back to position 0 (frontiers cleared, CSA overlap gates to -inf). */
void dsv4_state_reset(dsv4_state *s);

/* Run T <= max_chunk tokens at positions n_pos.. and advance. logits:
 * host [T, vocab] for every token (all = true) or [vocab] of the last one. */
ds4_status dsv4_forward(dsv4_state *s, const int32_t *tokens, int T, bool all, float *logits);

/* One pipeline stage of that step (docs/DISTRIBUTED.md): the layers of
 * s->m only. x_in: the residual stream [T, n_hc, n_embd] (host f32) from
 * the stage before, NULL on the stage with the embedding; x_out: receives
 * the stream after this stage's layers (NULL: not wanted); logits as
 * dsv4_forward, on the stage with the head. Advances n_pos by T. */
ds4_status dsv4_forward_stage(dsv4_state *s, const int32_t *tokens, int T, const float *x_in, float *x_out,
                              bool all, float *logits);

/* Whether n states can take one batched decode step together, token
 * tokens[i] fed to ss[i] (dsv4_forward_batch.c). DS4_ERR_INVALID for what
 * no step can do: NULL or repeated states, states of another model than
 * ss[0]'s, a state whose context is full, a token outside the vocabulary.
 * DS4_ERR_UNSUPPORTED when each could decode alone but not in one pass:
 * numerics that differ from ss[0]'s, or state memory that ss[0]'s backend
 * cannot address (backend/ops.h shares_memory). The message (no prefix)
 * names the state by index ("session 2 of 5: ..."). Moves nothing. */
ds4_status dsv4_batch_check(dsv4_state *const *ss, const int32_t *tokens, int n);

/* One decode step of n states at once (each at its own position): one
 * pass over n rows in ss[0]'s activation buffers on ss[0]'s backend, so
 * every weight is read once for all n (model/dsv4_pass.h); n <= ss[0]'s
 * max_chunk. Checks as dsv4_batch_check (and nothing moves on an error);
 * then every n_pos advances by one and, where logits[i] is not NULL, it
 * receives state i's [vocab] logits. Each state's backend counters get
 * the work of its own sequence ops plus an equal share of the shared
 * weight work. Never uses the backend's step_begin/step_end. */
ds4_status dsv4_forward_batch(dsv4_state *const *ss, const int32_t *tokens, int n, float *const *logits);

/* The same step on a pipeline stage (docs/DISTRIBUTED.md): the checks
 * of dsv4_batch_check but for the whole-model one, x_in / x_out the n rows
 * of the residual stream (host f32; x_in NULL on the stage with the
 * embedding), logits only on the stage with the head. */
ds4_status dsv4_batch_check_stage(dsv4_state *const *ss, const int32_t *tokens, int n);
ds4_status dsv4_forward_batch_stage(dsv4_state *const *ss, const int32_t *tokens, int n, const float *x_in,
                                    float *x_out, float *const *logits);

/* ---- the greedy pick on the backend (model/dsv4_pick.c) ---------------
 * A forward given logits NULL leaves them where the head wrote them, in
 * s->logits on the backend (row t: the step's t-th output row, row 0 for
 * a decode step). Where the backend offers argmax_rows (ops.h), the engine
 * takes only the greedy picks of those rows and downloads a row when
 * someone reads it. */
/* Whether s's backend picks (argmax_rows) and s computes the head of the
 * whole model itself (not a pipeline stage, not a tensor-parallel rank). */
bool dsv4_pick_ready(const dsv4_state *s);
/* next[i] = ds4_argmax_excluding(row row0 + i of s's logits, n_vocab,
 * excluded) for i < n, the rows the last forward left on the backend. */
ds4_status dsv4_logits_pick(dsv4_state *s, int row0, int n, int32_t excluded, int32_t *next);
/* Row `row` of s's logits into host out (n_vocab floats). */
void dsv4_logits_download(dsv4_state *s, int row, float *out);
/* Whether a batched step whose first state is s0 can leave every state's
 * logits on the backend (dsv4_forward_batch_keep): dsv4_pick_ready(s0)
 * and its backend's copy op. */
bool dsv4_batch_keep_ready(const dsv4_state *s0);
/* dsv4_forward_batch with the logits left on the backend: state i's row
 * ends in row 0 of its own logits buffer (ss[0]'s in place, the others
 * copied there), where dsv4_logits_download(ss[i], 0, ..) finds it until
 * state i's next forward; ss[0]'s rows 0..n-1 hold all of them until
 * ss[0]'s next forward, for one dsv4_logits_pick(ss[0], 0, n, ..). Needs
 * dsv4_batch_keep_ready(ss[0]) (DS4_ERR_UNSUPPORTED otherwise, nothing
 * moved). */
ds4_status dsv4_forward_batch_keep(dsv4_state *const *ss, const int32_t *tokens, int n);

/* Snapshot: the logical state (backend-neutral f32 arrays, little-endian)
 * after a versioned header. Size for the current position. */
size_t dsv4_state_snapshot_size(const dsv4_state *s);
/* The size a snapshot would have at n_pos positions (bounds what a file
 * claiming to be a state of this model and context may hold). */
size_t dsv4_state_snapshot_size_at(const dsv4_state *s, int64_t n_pos);
/* An upper bound of the snapshot size at any position up to n_ctx (not the
 * size at n_ctx: the compressors' pending rows make a state just short of a
 * ratio boundary larger than one on it). */
size_t dsv4_state_snapshot_size_max(const dsv4_state *s);
ds4_status dsv4_state_snapshot(const dsv4_state *s, void *buf, size_t len);
ds4_status dsv4_state_restore(dsv4_state *s, const void *buf, size_t len);

/* A pipeline stage's share of the same format (docs/DISTRIBUTED.md): the
 * snapshot is the header followed by the layers in order, so the stages'
 * parts laid end to end after the header are the one-process snapshot.
 * part_offset: where layer `layer` starts in a snapshot at n_pos (layer =
 * n_layer: its size). The header and the checks of a whole snapshot work on
 * any stage (they use the configuration only); a part holds the layers of
 * s->m (layer_lo..layer_hi-1) and its length must be exact. */
size_t dsv4_state_part_offset(const dsv4_state *s, int64_t n_pos, int layer);
ds4_status dsv4_state_snapshot_header(const dsv4_state *s, void *buf, size_t len);
ds4_status dsv4_state_snapshot_part(const dsv4_state *s, void *buf, size_t len);
/* Every check of dsv4_state_restore on a whole snapshot, nothing changed;
 * *n_pos: its position count. */
ds4_status dsv4_state_restore_check(const dsv4_state *s, const void *buf, size_t len, int64_t *n_pos);
ds4_status dsv4_state_restore_part(dsv4_state *s, const void *buf, size_t len, int64_t n_pos);

#endif

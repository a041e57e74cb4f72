/*
 * tp.h - private: tensor parallel in one process (docs/TENSOR-PARALLEL.md).
 * A model opened with tensor_parallel N > 1 gets a group: N rank views of
 * the model (dsv4_model_shard), the ranks' communicator endpoints
 * (backend/comm.h) and N - 1 worker threads; rank 0 runs on the caller's
 * thread. A session has one backend and one state per rank; every forward
 * runs on all ranks at once, and the ranks meet in the collectives of the
 * sharded pass (model/dsv4_forward.c). Runs of the group's sessions are
 * serialized (one at a time), so sessions used from several threads share
 * the ranks safely.
 *
 * Each rank's state holds the whole KV state (one MQA head, replicated):
 * rank 0's state is the session's, its snapshot the one-process format,
 * and a restore writes it into every rank.
 */
#ifndef DS4_ENGINE_TP_H
#define DS4_ENGINE_TP_H

#include "include/ds4.h"
#include "model/dsv4_state.h"

typedef struct ds4_tp ds4_tp;
/* Views, endpoints and threads for `size` (2..64) ranks over whole model m
 * (borrowed; it must outlive the group). */
ds4_status ds4_tp_open(const dsv4_model *m, int size, ds4_tp **out);
void ds4_tp_close(ds4_tp *tp);
int ds4_tp_size(const ds4_tp *tp);
const dsv4_model *ds4_tp_view(const ds4_tp *tp, int rank);

typedef struct ds4_tp_session ds4_tp_session;
/* A session over the group: be[r] is rank r's backend (all taken, also on
 * error); each prepares its view's weights and gets a state. CPU ranks
 * use the group's in-process communicator; CUDA ranks get their own, on
 * their streams: NCCL when every rank has its own GPU, else (ranks sharing
 * a GPU) the host-staged in-process one (backend/comm.h). */
ds4_status ds4_tp_session_open(ds4_tp *tp, ds4_backend **be, int64_t n_ctx, int max_chunk, const ds4_kv_numerics *nm,
                               ds4_tp_session **out);
/* Frees every rank's state and backend. */
void ds4_tp_session_close(ds4_tp_session *d);
dsv4_state *ds4_tp_session_state(ds4_tp_session *d, int rank);
/* As ds4_session_prefill: n tokens in chunks of max_chunk on every rank;
 * all_logits (n x vocab, or NULL) and last_logits (vocab) from rank 0. */
ds4_status ds4_tp_prefill(ds4_tp_session *d, const int32_t *tokens, int64_t n, float *all_logits, float *last_logits);
/* One batched decode step of n sessions (n <= their max_chunk) on every
 * rank: each rank runs dsv4_forward_batch over its states of the n
 * sessions. The checks of dsv4_batch_check run first on every rank's
 * states; on an error nothing moves. */
ds4_status ds4_tp_decode_batch(ds4_tp_session *const *d, const int32_t *tokens, int n, float *const *logits);
/* The other ranks' states back to position 0 (rank 0's: the caller). */
void ds4_tp_reset_others(ds4_tp_session *d);
/* A one-process snapshot of the model state into every rank's state
 * (rank 0 first: a snapshot it refuses changes nothing). */
ds4_status ds4_tp_restore(ds4_tp_session *d, const void *buf, size_t len);

#endif

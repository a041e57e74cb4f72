/*
 * session_access.h - private: the model state and the logits buffer
 * behind a public ds4_session handle, for engine files other than
 * session.c (which owns the handle's layout): the batched decode step
 * (session_batch.c) advances several sessions' states in one forward and
 * fills their logits itself.
 */
#ifndef DS4_ENGINE_SESSION_ACCESS_H
#define DS4_ENGINE_SESSION_ACCESS_H

#include "include/ds4.h"
#include "model/dsv4_state.h"

dsv4_state *ds4_session_dsv4(ds4_session *s);
/* The host buffer ds4_session_logits returns (n_vocab floats), and
 * whether it holds the logits of the last token fed (set_have_logits: the
 * caller wrote them there, or there are none). */
float *ds4_session_logits_buffer(ds4_session *s);
void ds4_session_set_have_logits(ds4_session *s, bool have);
/* The greedy pick on the backend (ds4_session_decode_pick): whether this
 * session's steps may leave their logits on the backend (model/dsv4_pick.c:
 * the backend picks; not distributed, not tensor parallel); that the last
 * step's logits are there, in row 0 of the state's logits buffer
 * (set_logits_on_backend); and bringing them into the host buffer, which
 * every reader of it does first (logits_home; nothing when they are
 * there already). */
bool ds4_session_picks_on_backend(const ds4_session *s);
void ds4_session_set_logits_on_backend(ds4_session *s);
void ds4_session_logits_home(const ds4_session *s);
/* DS4_OK, or the expert-streaming read error that voids the last step
 * (message set; docs/STREAMING.md). */
ds4_status ds4_session_stream_error(ds4_session *s);
/* Rank 0 of a distributed run: the session's part on the other ranks
 * (engine/dist.h); NULL otherwise. */
struct ds4_dist_session *ds4_session_dist(ds4_session *s);
/* A tensor-parallel session's ranks (engine/tp.h); NULL otherwise. */
struct ds4_tp_session *ds4_session_tp(ds4_session *s);
/* The session's steering / --power buffers (engine/session_edit.c owns
 * them; session.c frees them with the session). */
void **ds4_session_edits_slot(ds4_session *s);
void ds4_session_edits_free(void *edits);
/* The session's speculation state (engine/spec.c owns it): freed and
 * reset with the session; fed after every forward of a prefill/decode. */
void **ds4_session_spec_slot(ds4_session *s);
void ds4_session_spec_free(void *spec);
void ds4_session_spec_reset(void *spec);
ds4_status ds4_session_spec_after_forward(ds4_session *s, const int32_t *tokens, int T);

#endif

/*
 * dsv4_undo.h - what feeding one chunk overwrites in a state, saved so the
 * chunk can be taken back (speculative decoding's rollback, engine/spec.c).
 *
 * Before feeding T tokens at the state's position P: dsv4_undo_save. After
 * feeding them (all or fewer), dsv4_undo_restore brings the state back to
 * exactly the state at P (snapshot bytes equal), at the cost of the rows
 * the chunk touches, not of the whole state (dsv4_undo.c says which).
 */
#ifndef DS4_MODEL_DSV4_UNDO_H
#define DS4_MODEL_DSV4_UNDO_H

#include "model/dsv4_state.h"

/* Bytes of the record for a chunk of T tokens at the state's position. */
size_t dsv4_undo_size(const dsv4_state *s, int T);
ds4_status dsv4_undo_save(const dsv4_state *s, int T, void *buf, size_t len);
/* Refuses a record that does not cover the state's position (a state
 * that went back before P or on past P + T since the save). */
ds4_status dsv4_undo_restore(dsv4_state *s, const void *buf, size_t len);

#endif

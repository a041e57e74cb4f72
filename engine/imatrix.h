/*
 * imatrix.h - private: the importance-matrix collector behind the public
 * ds4_imatrix handle (include/ds4.h).
 *
 * Collection wraps a session's backend in a recording backend
 * (engine/imatrix.c) that forwards every op to the real one and, for the
 * weight products (matmul, matmul_grouped, moe_experts, ffn_swiglu), adds
 * the squares of their input activations to per-column sums, per routed
 * expert for the expert tensors. The model and the backends are not
 * touched: a session without an imatrix has no wrapper, so collection
 * costs nothing when it is off.
 */
#ifndef DS4_ENGINE_IMATRIX_H
#define DS4_ENGINE_IMATRIX_H

#include "backend/ops.h"
#include "include/ds4.h"

/* A backend that records into `im` and forwards to `inner` (which it then
 * owns: destroying the wrapper destroys inner). NULL + message on failure,
 * inner destroyed too. */
ds4_backend *ds4_imatrix_wrap(ds4_imatrix *im, ds4_backend *inner);

#endif

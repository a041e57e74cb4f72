/*
 * dist.h - private: what session.c asks of a distributed run
 * (docs/DISTRIBUTED.md). Each rank of an mpirun job holds a contiguous
 * range of layers (a pipeline stage) and their KV state; rank 0 is the
 * front end and the first stage. session.c calls these at the few places
 * where a run over ranks differs from one process; in a plain run they do
 * nothing (model load: the whole model; sessions: no distributed part).
 */
#ifndef DS4_ENGINE_DIST_H
#define DS4_ENGINE_DIST_H

#include "include/ds4.h"
#include "model/dsv4_state.h"

/* The model for this process: the whole file in a plain run; in a
 * distributed run this rank's stage. On rank 0 it makes the run's plan
 * (dist_plan.h), has every other rank open its stage and reports the
 * first failure naming the rank. */
dsv4_model *ds4_dist_model_load(const char *path, const ds4_model_options *o);
/* Before dsv4_model_free: on rank 0, the other ranks close their stage. */
void ds4_dist_model_close(const dsv4_model *m);

typedef struct ds4_dist_session ds4_dist_session;
/* On rank 0 of a distributed run: the session's stages on the other
 * ranks (*out); otherwise *out = NULL and DS4_OK. */
ds4_status ds4_dist_session_open(const dsv4_model *m, const ds4_session_params *p, ds4_dist_session **out);
void ds4_dist_session_close(ds4_dist_session *d);
/* n tokens through the pipeline in chunks of st->max_chunk: this rank
 * computes its layers of chunk k+1 while the later ranks compute chunk k.
 * all_logits: n x vocab (or NULL); last_logits: the last token's. */
ds4_status ds4_dist_prefill(ds4_dist_session *d, dsv4_state *st, const int32_t *tokens, int64_t n, float *all_logits,
                            float *last_logits);
ds4_status ds4_dist_reset(ds4_dist_session *d);
/* One decode step of n sessions through the pipeline, every stage running
 * its layers once over the n rows (dsv4_forward_batch_stage): st[i] rank
 * 0's state of d[i], logits[i] n_vocab floats. n <= st[0]->max_chunk. */
ds4_status ds4_dist_decode_batch(ds4_dist_session *const *d, dsv4_state *const *st, const int32_t *tokens, int n,
                                 float *const *logits);
/* The one-process snapshot format, gathered from every rank's layers,
 * and restored the other way (len: the whole snapshot). */
ds4_status ds4_dist_snapshot(ds4_dist_session *d, const dsv4_state *st, void *buf, size_t len);
ds4_status ds4_dist_restore(ds4_dist_session *d, dsv4_state *st, const void *buf, size_t len);

#endif

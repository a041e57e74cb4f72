/*
 * dsv4_pass.h - private to model/: one forward pass over rows of
 * activations that belong to one or several sequences, shared by the
 * single-sequence forward (dsv4_forward.c) and the batched decode step
 * (dsv4_forward_batch.c).
 *
 * An op that is the same function on every row (weight products, norms,
 * hyper-connections, the MoE) runs once over all the rows, so each weight
 * is read once per pass whatever the number of sequences. An op that
 * depends on a sequence's position or state (RoPE, compressor pushes,
 * indexer top-k, attention, ring push) runs once per sequence, on that
 * sequence's rows of the activation buffers and its own layer state. A
 * prefill or decode chunk is one sequence of T rows; a batched decode
 * step is n sequences of one row each.
 */
#ifndef DS4_MODEL_DSV4_PASS_H
#define DS4_MODEL_DSV4_PASS_H

#include "model/dsv4_state.h"

typedef struct {
    dsv4_state *st; /* its layer state (ring, compressors, indexer) */
    int64_t pos0;   /* position of its first row */
    int row0, T;    /* its rows of the activation buffers */
} dsv4_pass_seq;

typedef struct dsv4_pass {
    dsv4_state *s; /* activation buffers, model, backend and numerics of the pass */
    int rows;      /* all rows: the sum of the sequences' T, <= s->max_chunk */
    const dsv4_pass_seq *seq;
    int n_seq;
    /* NULL, or n_seq counters: each receives the backend counters of its
     * sequence's own ops (attention rows, compressor pushes, ...). */
    ds4_op_stats *seq_stats;
} dsv4_pass;

/* Embedding of s->tokens (p->rows of them) and every layer: s->X. */
void dsv4_pass_body(const dsv4_pass *p);
/* Layer il of the pass's model on s->X (the MTP block runs its one layer
 * this way, model/dsv4_mtp.c). */
void dsv4_pass_layer(const dsv4_pass *p, int il);
/* Final HC collapse, norm and LM head of rows first .. first+n-1 of s->X
 * into rows 0 .. n-1 of s->logits (§3.8; n <= s->logit_rows). */
void dsv4_pass_head(const dsv4_pass *p, int first, int n);
/* Whether this state's model computes the head (the last stage; in a
 * tensor-parallel run every rank when the vocabulary is split, else
 * rank 0 only). */
bool dsv4_pass_has_head(const dsv4_state *s);

#endif

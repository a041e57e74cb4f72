/*
 * dsv4_forward_batch.c - one decode step of several sequences at once.
 *
 * Decode is bound by the bandwidth of reading the weights; a step of n
 * sequences that reads every weight once costs little more than a step of
 * one. The step is one pass (model/dsv4_pass.h) over n rows, row i being
 * sequence i's token: the row-wise ops (weight products, MoE, hyper-
 * connections, norms) run once over the n rows, the per-sequence ops
 * (RoPE at the sequence's position, compressor pushes, indexer top-k,
 * attention over its own ring and compressed rows, ring push) once per
 * sequence on its row and its own layer state.
 *
 * The pass runs on the first state's backend and activation buffers; the
 * other states only lend their layer state, so their backends must share
 * memory with the first (ops.h shares_memory). Every row gives the same
 * values as that sequence's own T = 1 forward as long as the backend's
 * row-wise ops compute each row independently of the others (the CPU
 * kernels do: a token tile keeps one accumulator per token, so a row is
 * bit-identical; see tests/test_decode_batch.c).
 */
#include "model/dsv4_pass.h"

#include "backend/comm.h"

#include "util/error.h"

#include <stdlib.h>
#include <string.h>

static bool same_numerics(const ds4_kv_numerics *a, const ds4_kv_numerics *b)
{
    return a->fp8_nope == b->fp8_nope && a->f16_store == b->f16_store && a->indexer_qat == b->indexer_qat;
}

ds4_status dsv4_batch_check(dsv4_state *const *ss, const int32_t *tokens, int n)
{
    ds4_status st = dsv4_batch_check_stage(ss, tokens, n);
    /* a pipeline stage's states take the step through dsv4_forward_batch_stage */
    if (st == DS4_OK && !dsv4_model_is_whole(ss[0]->m))
        return ds4_fail(DS4_ERR_UNSUPPORTED, "the model holds layers %d:%d only (a pipeline stage)",
                        ss[0]->m->layer_lo, ss[0]->m->layer_hi);
    return st;
}

ds4_status dsv4_batch_check_stage(dsv4_state *const *ss, const int32_t *tokens, int n)
{
    if (n < 1) return ds4_fail(DS4_ERR_INVALID, "%d sessions (at least 1)", n);
    if (!ss || !tokens) return ds4_fail(DS4_ERR_INVALID, "NULL sessions or tokens");
    for (int i = 0; i < n; i++)
        if (!ss[i]) return ds4_fail(DS4_ERR_INVALID, "session %d of %d is NULL", i, n);
    /* one step feeds each sequence one token: a state twice would get two
     * rows at the same position */
    for (int i = 1; i < n; i++)
        for (int j = 0; j < i; j++)
            if (ss[i] == ss[j])
                return ds4_fail(DS4_ERR_INVALID, "session %d of %d is session %d again (one token per session and step)",
                                i, n, j);
    const dsv4_state *s0 = ss[0];
    for (int i = 0; i < n; i++) {
        const dsv4_state *s = ss[i];
        if (s->m != s0->m) return ds4_fail(DS4_ERR_INVALID, "session %d of %d is of another model than session 0", i, n);
        if (s->n_pos + 1 > s->n_ctx)
            return ds4_fail(DS4_ERR_INVALID, "session %d of %d: context full (%lld of %lld positions used)", i, n,
                            (long long)s->n_pos, (long long)s->n_ctx);
        if (tokens[i] < 0 || tokens[i] >= s0->m->cfg.n_vocab)
            return ds4_fail(DS4_ERR_INVALID, "session %d of %d: token id %d outside vocabulary [0, %d)", i, n,
                            tokens[i], s0->m->cfg.n_vocab);
    }
    for (int i = 1; i < n; i++) {
        const dsv4_state *s = ss[i];
        /* kv_round and the indexer rounding run once over all rows */
        if (s->steer_dir || s->throttle || s->capture || s0->steer_dir || s0->throttle || s0->capture)
            return ds4_fail(DS4_ERR_UNSUPPORTED, "session %d of %d: steering or --power is per session", i, n);
        if (!same_numerics(&s->nm, &s0->nm))
            return ds4_fail(DS4_ERR_UNSUPPORTED, "session %d of %d: numerics differ from session 0's", i, n);
        if (s->be != s0->be && !(s0->be->shares_memory && s0->be->shares_memory(s0->be, s->be)))
            return ds4_fail(DS4_ERR_UNSUPPORTED,
                            "session %d of %d: its state is on a %s backend that session 0's %s backend cannot "
                            "address (another kind or device)",
                            i, n, s->be->name, s0->be->name);
    }
    return DS4_OK;
}


/* The counters of a step go to the sessions: each its own sequence ops,
 * and the shared (weight) work in equal parts, the remainder to the first. */
static void charge_sessions(dsv4_state *const *ss, int n, const ds4_op_stats *before, const ds4_op_stats *seq)
{
    ds4_backend *be = ss[0]->be;
    uint64_t now[5] = {be->stats.rows_attended, be->stats.compressor_pushes, be->stats.rows_emitted,
                       be->stats.indexer_keys_scored, be->stats.matmul_rows};
    uint64_t was[5] = {before->rows_attended, before->compressor_pushes, before->rows_emitted,
                       before->indexer_keys_scored, before->matmul_rows};
    uint64_t shared[5];
    for (int k = 0; k < 5; k++) shared[k] = now[k] - was[k];
    for (int i = 0; i < n; i++) {
        shared[0] -= seq[i].rows_attended;
        shared[1] -= seq[i].compressor_pushes;
        shared[2] -= seq[i].rows_emitted;
        shared[3] -= seq[i].indexer_keys_scored;
        shared[4] -= seq[i].matmul_rows;
    }
    be->stats = *before;
    for (int i = 0; i < n; i++) {
        uint64_t part[5];
        for (int k = 0; k < 5; k++) part[k] = shared[k] / (uint64_t)n + (i == 0 ? shared[k] % (uint64_t)n : 0);
        ds4_op_stats add = {part[0], part[1], part[2], part[3], part[4]};
        ds4_op_stats_add(&add, &seq[i]);
        ds4_op_stats_add(&ss[i]->be->stats, &add);
    }
}

static ds4_status batch_step(dsv4_state *const *ss, const int32_t *tokens, int n, const float *x_in, float *x_out,
                             float *const *logits, bool keep);

ds4_status dsv4_forward_batch(dsv4_state *const *ss, const int32_t *tokens, int n, float *const *logits)
{
    ds4_status st = dsv4_batch_check(ss, tokens, n);
    if (st != DS4_OK) {
        ds4_error_prefix("forward_batch: ");
        return st;
    }
    return batch_step(ss, tokens, n, NULL, NULL, logits, false);
}

ds4_status dsv4_forward_batch_keep(dsv4_state *const *ss, const int32_t *tokens, int n)
{
    ds4_status st = dsv4_batch_check(ss, tokens, n);
    if (st == DS4_OK && !dsv4_batch_keep_ready(ss[0]))
        st = ds4_fail(DS4_ERR_UNSUPPORTED, "the %s backend of session 0 cannot keep the logits (argmax_rows, copy)",
                      ss[0]->be->name);
    if (st != DS4_OK) {
        ds4_error_prefix("forward_batch: ");
        return st;
    }
    return batch_step(ss, tokens, n, NULL, NULL, NULL, true);
}

ds4_status dsv4_forward_batch_stage(dsv4_state *const *ss, const int32_t *tokens, int n, const float *x_in,
                                    float *x_out, float *const *logits)
{
    return batch_step(ss, tokens, n, x_in, x_out, logits, false);
}

/* keep: the rows stay on the backend, each state's also in its own
 * logits buffer (dsv4_forward_batch_keep). */
static ds4_status batch_step(dsv4_state *const *ss, const int32_t *tokens, int n, const float *x_in, float *x_out,
                             float *const *logits, bool keep)
{
    ds4_status st = dsv4_batch_check_stage(ss, tokens, n);
    if (st != DS4_OK) {
        ds4_error_prefix("forward_batch: ");
        return st;
    }
    dsv4_state *s = ss[0];
    ds4_backend *be = s->be;
    if (n > dsv4_state_batch_rows(s))
        return ds4_fail(DS4_ERR_INVALID,
                        "forward_batch: %d sessions, more than the %d rows of session 0's activation and logits "
                        "buffers (dsv4_state_batch_rows)",
                        n, dsv4_state_batch_rows(s));
    if (!dsv4_model_has_embed(s->m) && !x_in)
        return ds4_fail(DS4_ERR_INVALID, "forward_batch: a stage from layer %d needs the residual stream",
                        s->m->layer_lo);
    dsv4_pass_seq *seq = malloc((size_t)n * sizeof *seq);
    ds4_op_stats *seq_stats = calloc((size_t)n, sizeof *seq_stats);
    if (!seq || !seq_stats) {
        free(seq);
        free(seq_stats);
        return ds4_fail(DS4_ERR_NOMEM, "forward_batch: out of memory for %d sessions", n);
    }
    bool foreign = false;
    for (int i = 0; i < n; i++) {
        seq[i] = (dsv4_pass_seq){ss[i], ss[i]->n_pos, i, 1};
        /* work another instance queued on its state must be done before
         * this backend's ops touch that state */
        if (ss[i]->be != be) {
            foreign = true;
            if (ss[i]->be->sync) ss[i]->be->sync(ss[i]->be);
        }
    }
    be->upload(be, s->tokens, tokens, (size_t)n * sizeof(int32_t));
    const size_t xbytes = (size_t)n * s->m->cfg.n_hc * s->m->cfg.n_embd * sizeof(float);
    if (x_in) be->upload(be, s->X, x_in, xbytes);
    const ds4_op_stats before = be->stats;
    const dsv4_pass p = {s, n, seq, n, seq_stats};
    const bool head = dsv4_pass_has_head(s);
    dsv4_pass_body(&p);
    if (head) dsv4_pass_head(&p, 0, n);
    if (x_out) be->download(be, x_out, s->X, xbytes);
    /* an op that failed left wrong numbers: no position taken (as dsv4_forward_stage) */
    const ds4_status bst = be->status ? be->status(be) : DS4_OK;
    if (bst != DS4_OK) {
        if (foreign && be->sync) be->sync(be);
        free(seq);
        free(seq_stats);
        return bst;
    }
    const int V = s->m->cfg.n_vocab;
    for (int i = 0; i < n; i++) {
        ss[i]->n_pos += 1;
        if (head && logits && logits[i])
            be->download(be, logits[i], s->logits + (size_t)i * V, (size_t)V * sizeof(float));
        /* the next step on ss[0] overwrites its rows; state i's own buffer
         * is written only by its own forwards, which replace its logits */
        if (head && keep && i > 0) be->copy(be, ss[i]->logits, s->logits + (size_t)i * V, (size_t)V * sizeof(float));
    }
    /* and the other instances may go on with their states once it is done */
    if (foreign && be->sync) be->sync(be);
    charge_sessions(ss, n, &before, seq_stats);
    free(seq);
    free(seq_stats);
    if (s->comm && s->comm->status(s->comm) != DS4_OK) return s->comm->status(s->comm);
    return DS4_OK;
}

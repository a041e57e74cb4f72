/*
 * dsv4_pick.c - the greedy pick on the backend: what the engine needs to
 * leave a step's logits where the LM head wrote them (s->logits, backend
 * memory) and take only the tokens it picks (ops.h argmax_rows), fetching
 * a row when it is read. dsv4_forward_batch_keep (the batched step that
 * leaves each state's row in its own buffer) is in dsv4_forward_batch.c.
 */
#include "model/dsv4_state.h"

#include "util/error.h"

bool dsv4_pick_ready(const dsv4_state *s)
{
    /* a tensor-parallel rank's logits are its vocabulary slice or rank 0's
     * gather; a pipeline stage may have no head: the engine's paths for
     * those download the rows as they always did */
    return s->be->argmax_rows && dsv4_model_is_whole(s->m) && !dsv4_model_tp(s->m);
}

bool dsv4_batch_keep_ready(const dsv4_state *s0) { return dsv4_pick_ready(s0) && s0->be->copy; }

ds4_status dsv4_logits_pick(dsv4_state *s, int row0, int n, int32_t excluded, int32_t *next)
{
    if (!dsv4_pick_ready(s))
        return ds4_fail(DS4_ERR_UNSUPPORTED, "pick: the %s backend does not pick on its side (ops.h argmax_rows)",
                        s->be->name);
    if (row0 < 0 || n < 1 || row0 + n > s->logit_rows)
        return ds4_fail(DS4_ERR_INVALID, "pick: rows %d..%d of a logits buffer of %d rows", row0, row0 + n - 1,
                        s->logit_rows);
    const int V = s->m->cfg.n_vocab;
    return s->be->argmax_rows(s->be, s->logits + (size_t)row0 * (size_t)V, n, V, excluded, next);
}

void dsv4_logits_download(dsv4_state *s, int row, float *out)
{
    const size_t V = (size_t)s->m->cfg.n_vocab;
    s->be->download(s->be, out, s->logits + (size_t)row * V, V * sizeof(float));
}

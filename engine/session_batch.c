/*
 * session_batch.c - ds4_session_decode_batch: one decode step for several
 * sessions (independent sequences) at once.
 *
 * Decode is bound by the bandwidth of reading the weights, so the step is
 * one forward over n rows, one per session (model/dsv4_forward_batch.c):
 * every weight is read once for all n, and only RoPE, compressors,
 * indexer and attention run per session on its own state. More sessions
 * than the first one's rows (dsv4_state_batch_rows: activations, logits) go in groups.
 *
 * The per-session loop of ds4_session_decode is kept for one case only:
 * sessions that could each decode but not in one pass (numerics that
 * differ, or states on backends that cannot address each other's memory,
 * such as a CPU and a CUDA session, or two GPUs). The result is the same
 * either way; the loop just reads the weights once per session.
 *
 * ds4_session_decode_batch_pick is the same step with each session's
 * greedy pick: where the first session's backend picks on its side
 * (model/dsv4_pick.c), the rows stay there, one launch picks them all and
 * each session's row is copied into its own state, downloaded only when
 * read; otherwise the rows come home and are picked here.
 */
#include "include/ds4.h"
#include "include/ds4_sampler.h"

#include "engine/dist.h"
#include "engine/session_access.h"
#include "engine/tp.h"
#include "model/dsv4_state.h"
#include "util/error.h"

#include <stdio.h>
#include <stdlib.h>

/* Each session alone, in order (sessions before a failing one advanced);
 * next: NULL, or each one's greedy pick (decode_pick: on the backend
 * where each session's can). */
static ds4_status decode_each(ds4_session **s, const int32_t *tokens, int n, int32_t excluded, int32_t *next)
{
    for (int i = 0; i < n; i++) {
        ds4_status st = next ? ds4_session_decode_pick(s[i], tokens[i], excluded, &next[i])
                             : ds4_session_decode(s[i], tokens[i]);
        if (st != DS4_OK) {
            ds4_error_prefix("decode_batch: session %d of %d: ", i, n);
            return st;
        }
    }
    return DS4_OK;
}

/* Distributed sessions (engine/dist.h): every stage runs its layers once
 * over the n rows; sessions that cannot share a step go one by one. */
static ds4_status decode_batch_dist(ds4_session **s, const int32_t *tokens, int n)
{
    dsv4_state **st = malloc((size_t)n * sizeof *st);
    float **lg = malloc((size_t)n * sizeof *lg);
    ds4_dist_session **d = malloc((size_t)n * sizeof *d);
    ds4_status rc = st && lg && d ? DS4_OK : ds4_fail(DS4_ERR_NOMEM, "decode_batch: out of memory for %d sessions", n);
    for (int i = 0; i < n && rc == DS4_OK; i++) {
        st[i] = ds4_session_dsv4(s[i]);
        lg[i] = ds4_session_logits_buffer(s[i]);
        d[i] = ds4_session_dist(s[i]);
        if (!d[i]) rc = DS4_ERR_UNSUPPORTED;
    }
    if (rc == DS4_OK) rc = dsv4_batch_check_stage(st, tokens, n);
    if (rc == DS4_ERR_UNSUPPORTED) {
        ds4_clear_error();
        rc = decode_each(s, tokens, n, -1, NULL);
    } else if (rc != DS4_OK) {
        ds4_error_prefix("decode_batch: ");
    }
    for (int g = 0, k; g < n && rc == DS4_OK && d[0]; g += k) {
        k = n - g < dsv4_state_batch_rows(st[g]) ? n - g : dsv4_state_batch_rows(st[g]);
        rc = ds4_dist_decode_batch(d + g, st + g, tokens + g, k, lg + g);
        if (rc != DS4_OK) {
            ds4_error_prefix("decode_batch: sessions %d..%d of %d: ", g, g + k - 1, n);
            break;
        }
        for (int i = g; i < g + k; i++) ds4_session_set_have_logits(s[i], true);
    }
    free(st);
    free(lg);
    free(d);
    return rc;
}

/* Tensor-parallel sessions (engine/tp.h), which passed dsv4_batch_check on
 * rank 0's states: the step on every rank, in groups of dsv4_state_batch_rows. lg is
 * taken (freed here). */
static ds4_status decode_batch_tp(ds4_session **s, const int32_t *tokens, int n, float **lg)
{
    ds4_tp_session **d = malloc((size_t)n * sizeof *d);
    ds4_status rc = d ? DS4_OK : ds4_fail(DS4_ERR_NOMEM, "decode_batch: out of memory for %d sessions", n);
    for (int i = 0; i < n && rc == DS4_OK; i++)
        if (!(d[i] = ds4_session_tp(s[i])))
            rc = ds4_fail(DS4_ERR_INVALID, "decode_batch: session %d of %d is not tensor parallel like session 0", i, n);
    for (int g = 0, k; g < n && rc == DS4_OK; g += k) {
        int max = dsv4_state_batch_rows(ds4_session_dsv4(s[g]));
        k = n - g < max ? n - g : max;
        rc = ds4_tp_decode_batch(d + g, tokens + g, k, lg + g);
        if (rc != DS4_OK) {
            ds4_error_prefix("decode_batch: sessions %d..%d of %d: ", g, g + k - 1, n);
            break;
        }
        for (int i = g; i < g + k; i++) ds4_session_set_have_logits(s[i], true);
    }
    free(d);
    free(lg);
    return rc;
}

/* The greedy picks of sessions whose logits came into their host rows. */
static void pick_on_host(ds4_session **s, int n, int32_t excluded, int32_t *next)
{
    for (int i = 0; i < n; i++) {
        const float *lg = ds4_session_logits(s[i]);
        next[i] = lg ? ds4_argmax_excluding(lg, ds4_session_dsv4(s[i])->m->cfg.n_vocab, excluded) : -1;
    }
}

/* One group of the batched step over states st[0..k) of sessions
 * s[0..k): with next, the rows kept on the backend and picked there when
 * the first state's backend can (model/dsv4_pick.c), else downloaded
 * into lg (and picked on the host). */
static ds4_status step_group(ds4_session **s, dsv4_state **st, const int32_t *tokens, int k, float **lg,
                             int32_t excluded, int32_t *next)
{
    const bool keep = next && dsv4_batch_keep_ready(st[0]);
    ds4_status rc = keep ? dsv4_forward_batch_keep(st, tokens, k) : dsv4_forward_batch(st, tokens, k, lg);
    if (rc == DS4_OK) rc = ds4_session_stream_error(s[0]);
    if (rc != DS4_OK) return rc;
    for (int i = 0; i < k; i++) {
        if (keep) ds4_session_set_logits_on_backend(s[i]);
        else ds4_session_set_have_logits(s[i], true);
    }
    if (!next) return DS4_OK;
    if (keep) return dsv4_logits_pick(st[0], 0, k, excluded, next);
    pick_on_host(s, k, excluded, next);
    return DS4_OK;
}

/* ds4_session_decode_batch; next (NULL: none): the greedy picks, on the
 * backend where it can (ds4_session_decode_batch_pick). */
static ds4_status decode_batch(ds4_session **s, const int32_t *tokens, int n, int32_t excluded, int32_t *next)
{
    if (n < 0) return ds4_fail(DS4_ERR_INVALID, "decode_batch: negative session count %d", n);
    if (n == 0) return DS4_OK;
    if (!s || !tokens) return ds4_fail(DS4_ERR_INVALID, "decode_batch: NULL sessions or tokens");
    for (int i = 0; i < n; i++)
        if (!s[i]) return ds4_fail(DS4_ERR_INVALID, "decode_batch: session %d of %d is NULL", i, n);
    dsv4_state **st = malloc((size_t)n * sizeof *st);
    float **lg = malloc((size_t)n * sizeof *lg);
    if (!st || !lg) {
        free(st);
        free(lg);
        return ds4_fail(DS4_ERR_NOMEM, "decode_batch: out of memory for %d sessions", n);
    }
    for (int i = 0; i < n; i++) {
        st[i] = ds4_session_dsv4(s[i]);
        lg[i] = ds4_session_logits_buffer(s[i]);
    }
    ds4_status rc = dsv4_batch_check(st, tokens, n);
    if (rc == DS4_OK && ds4_session_tp(s[0])) {
        /* tensor parallel: every rank takes the step over its states */
        free(st);
        rc = decode_batch_tp(s, tokens, n, lg);
        if (rc == DS4_OK && next) pick_on_host(s, n, excluded, next);
        return rc;
    }
    if (rc == DS4_ERR_UNSUPPORTED && ds4_session_dist(s[0])) {
        /* over the ranks of a distributed run: the step per stage */
        free(st);
        free(lg);
        rc = decode_batch_dist(s, tokens, n);
        if (rc == DS4_OK && next) pick_on_host(s, n, excluded, next);
        return rc;
    }
    if (rc == DS4_ERR_UNSUPPORTED) {
        ds4_clear_error();
        rc = decode_each(s, tokens, n, excluded, next);
    } else if (rc != DS4_OK) {
        ds4_error_prefix("decode_batch: ");
    } else {
        for (int g = 0, k; g < n && rc == DS4_OK; g += k) {
            k = n - g < dsv4_state_batch_rows(st[g]) ? n - g : dsv4_state_batch_rows(st[g]);
            rc = step_group(s + g, st + g, tokens + g, k, lg + g, excluded, next ? next + g : NULL);
            if (rc != DS4_OK) ds4_error_prefix("decode_batch: sessions %d..%d of %d: ", g, g + k - 1, n);
        }
    }
    free(st);
    free(lg);
    return rc;
}

ds4_status ds4_session_decode_batch(ds4_session **s, const int32_t *tokens, int n)
{
    return decode_batch(s, tokens, n, -1, NULL);
}

ds4_status ds4_session_decode_batch_pick(ds4_session **s, const int32_t *tokens, int n, int32_t excluded,
                                         int32_t *next)
{
    if (!next && n > 0) return ds4_fail(DS4_ERR_INVALID, "decode_batch_pick: NULL for the picked tokens");
    for (int i = 0; i < n; i++) next[i] = -1;
    return decode_batch(s, tokens, n, excluded, next);
}

/*
 * session_batch.c - ds4_session_decode_batch: one decode step for several
 * sessions (independent sequences) at once.
 *
 * Decode is bound by the bandwidth of reading the weights, so the step is
 * one forward over n rows, one per session (model/dsv4_forward_batch.c):
 * every weight is read once for all n, and only RoPE, compressors,
 * indexer and attention run per session on its own state. More sessions
 * than the first one's activation rows (its max_chunk) go in groups.
 *
 * The per-session loop of ds4_session_decode is kept for one case only:
 * sessions that could each decode but not in one pass (numerics that
 * differ, or states on backends that cannot address each other's memory,
 * such as a CPU and a CUDA session, or two GPUs). The result is the same
 * either way; the loop just reads the weights once per session.
 */
#include "include/ds4.h"

#include "engine/dist.h"
#include "engine/session_access.h"
#include "engine/tp.h"
#include "model/dsv4_state.h"
#include "util/error.h"

#include <stdio.h>
#include <stdlib.h>

/* Each session alone, in order (sessions before a failing one advanced). */
static ds4_status decode_each(ds4_session **s, const int32_t *tokens, int n)
{
    for (int i = 0; i < n; i++) {
        ds4_status st = ds4_session_decode(s[i], tokens[i]);
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
        rc = decode_each(s, tokens, n);
    } else if (rc != DS4_OK) {
        ds4_error_prefix("decode_batch: ");
    }
    for (int g = 0, k; g < n && rc == DS4_OK && d[0]; g += k) {
        k = n - g < st[g]->max_chunk ? n - g : st[g]->max_chunk;
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
 * rank 0's states: the step on every rank, in groups of max_chunk. lg is
 * taken (freed here). */
static ds4_status decode_batch_tp(ds4_session **s, const int32_t *tokens, int n, float **lg)
{
    ds4_tp_session **d = malloc((size_t)n * sizeof *d);
    ds4_status rc = d ? DS4_OK : ds4_fail(DS4_ERR_NOMEM, "decode_batch: out of memory for %d sessions", n);
    for (int i = 0; i < n && rc == DS4_OK; i++)
        if (!(d[i] = ds4_session_tp(s[i])))
            rc = ds4_fail(DS4_ERR_INVALID, "decode_batch: session %d of %d is not tensor parallel like session 0", i, n);
    for (int g = 0, k; g < n && rc == DS4_OK; g += k) {
        int max = ds4_session_dsv4(s[g])->max_chunk;
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

ds4_status ds4_session_decode_batch(ds4_session **s, const int32_t *tokens, int n)
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
        return decode_batch_tp(s, tokens, n, lg);
    }
    if (rc == DS4_ERR_UNSUPPORTED && ds4_session_dist(s[0])) {
        /* over the ranks of a distributed run: the step per stage */
        free(st);
        free(lg);
        return decode_batch_dist(s, tokens, n);
    }
    if (rc == DS4_ERR_UNSUPPORTED) {
        ds4_clear_error();
        rc = decode_each(s, tokens, n);
    } else if (rc != DS4_OK) {
        ds4_error_prefix("decode_batch: ");
    } else {
        for (int g = 0, k; g < n && rc == DS4_OK; g += k) {
            k = n - g < st[g]->max_chunk ? n - g : st[g]->max_chunk;
            rc = dsv4_forward_batch(st + g, tokens + g, k, lg + g);
            if (rc == DS4_OK) rc = ds4_session_stream_error(s[g]);
            if (rc != DS4_OK) {
                ds4_error_prefix("decode_batch: sessions %d..%d of %d: ", g, g + k - 1, n);
                break;
            }
            for (int i = g; i < g + k; i++) ds4_session_set_have_logits(s[i], true);
        }
    }
    free(st);
    free(lg);
    return rc;
}

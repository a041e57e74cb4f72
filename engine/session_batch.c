/*
 * session_batch.c - ds4_session_decode_batch: one decode step for several
 * sessions (independent sequences) at once.
 *
 * A batched step should read every weight once for all the sessions
 * (decode is bandwidth bound, so n sequences would cost little more than
 * one); that needs batched ops over several states in the backend, which
 * do not exist yet. Until then this is the reference semantics: each
 * session advances exactly as ds4_session_decode would advance it, in
 * order, so a faster implementation can be tested against it.
 */
#include "include/ds4.h"

#include "util/error.h"

#include <stdio.h>

ds4_status ds4_session_decode_batch(ds4_session **s, const int32_t *tokens, int n)
{
    if (n < 0) return ds4_fail(DS4_ERR_INVALID, "decode_batch: negative session count %d", n);
    if (n > 0 && (!s || !tokens)) return ds4_fail(DS4_ERR_INVALID, "decode_batch: NULL sessions or tokens");
    for (int i = 0; i < n; i++)
        if (!s[i]) return ds4_fail(DS4_ERR_INVALID, "decode_batch: session %d of %d is NULL", i, n);
    for (int i = 0; i < n; i++) {
        ds4_status st = ds4_session_decode(s[i], tokens[i]);
        if (st != DS4_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", ds4_last_error()); /* ds4_fail rewrites that buffer */
            return ds4_fail(st, "decode_batch: session %d of %d: %s", i, n, why);
        }
    }
    return DS4_OK;
}

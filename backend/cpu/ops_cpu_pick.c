/*
 * ops_cpu_pick.c - the greedy pick of ops.h (argmax_rows, copy) on the
 * CPU, offered only when DS4_CPU_PICK=1 is set at the backend's creation.
 *
 * Why off: on the CPU the logits already are host memory, and the host
 * pick the engine falls back to (ds4_argmax_excluding's SSE lanes) is as
 * fast as a pass here, so a decode step gains nothing from it. Why at
 * all: with it the engine takes the path a GPU takes (logits left in the
 * state, only the picks returned, the row copied on first read; a batched
 * step's rows copied into each session's state), so the tests run that
 * path on machines without a GPU (tests/test_decode_pick.c).
 *
 * The pick is the plain statement of the rule, one value at a time in
 * index order: `v > best` with best starting at -inf skips NaN and -inf
 * (neither compares greater) and keeps the first of equal values (-0 and
 * +0 compare equal), so the lowest index wins a tie; -1 when nothing
 * beat -inf. Being written apart from ds4_argmax_excluding, it checks
 * that function where the tests compare the two.
 */
#include "backend/cpu/ops_cpu.h"

#include "util/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static ds4_status cpu_argmax_rows(ds4_backend *be, const float *x, int n, int n_vocab, int32_t excluded, int32_t *out)
{
    (void)be;
    if (n < 1 || n_vocab < 0 || !x || !out)
        return ds4_fail(DS4_ERR_INVALID, "cpu argmax_rows: %d rows of %d logits (at least one row; x and out set)", n,
                        n_vocab);
    for (int r = 0; r < n; r++) {
        const float *row = x + (size_t)r * (size_t)n_vocab;
        float best = -INFINITY;
        int32_t at = -1;
        for (int32_t i = 0; i < n_vocab; i++)
            if (row[i] > best && i != excluded) {
                best = row[i];
                at = i;
            }
        out[r] = at;
    }
    return DS4_OK;
}

static void cpu_copy_rows(ds4_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    if (bytes) memmove(dst, src, bytes);
}

void cpu_install_pick(ds4_backend *be)
{
    const char *e = getenv("DS4_CPU_PICK");
    if (!e || e[0] != '1') return;
    be->argmax_rows = cpu_argmax_rows;
    be->copy = cpu_copy_rows;
}

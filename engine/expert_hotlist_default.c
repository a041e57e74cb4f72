/*
 * expert_hotlist_default.c - the hot lists compiled into the binary, one
 * per model family (expert_profile.h). The data lives in
 * models/hotlists/ *.hotlist; the build turns it into expert_hotlists.inc
 * (scripts/hotlists_to_c.sh), so a new list is a new data file.
 */
#include "engine/expert_profile.h"

#include "util/error.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *family, *source;
    int n_embd, n_layer, n_expert;
    const uint16_t (*pairs)[2];
    int n;
} default_hotlist;

#include "expert_hotlists.inc"

int ds4_expert_hotlist_n_defaults(void) { return N_DEFAULT_HOTLISTS; }

/* Entries of list d with layer < max_layer, copied. */
static ds4_status copy_list(const default_hotlist *d, int max_layer, ds4_expert_hotlist *out)
{
    memset(out, 0, sizeof *out);
    out->pairs = malloc((size_t)(d->n > 0 ? d->n : 1) * 2 * sizeof(int32_t));
    if (!out->pairs) return ds4_fail(DS4_ERR_NOMEM, "expert hot list: out of memory");
    for (int i = 0; i < d->n; i++) {
        if (d->pairs[i][0] >= max_layer) continue;
        out->pairs[2 * out->n] = d->pairs[i][0];
        out->pairs[2 * out->n + 1] = d->pairs[i][1];
        out->n++;
    }
    out->n_layer = max_layer;
    out->n_expert = d->n_expert;
    out->n_embd = d->n_embd;
    snprintf(out->family, sizeof out->family, "%s", d->family);
    return DS4_OK;
}

ds4_status ds4_expert_hotlist_default_at(int i, ds4_expert_hotlist *out, const char **source)
{
    if (i < 0 || i >= N_DEFAULT_HOTLISTS) return ds4_fail(DS4_ERR_NOT_FOUND, "expert hot list: no default list %d", i);
    *source = DEFAULT_HOTLISTS[i].source;
    return copy_list(&DEFAULT_HOTLISTS[i], DEFAULT_HOTLISTS[i].n_layer, out);
}

ds4_status ds4_expert_hotlist_default(int n_layer, int n_expert, int n_embd, ds4_expert_hotlist *out,
                                      const char **source)
{
    for (int i = 0; i < N_DEFAULT_HOTLISTS; i++) {
        const default_hotlist *d = &DEFAULT_HOTLISTS[i];
        if (d->n_expert == n_expert && d->n_embd == n_embd && n_layer <= d->n_layer) {
            *source = d->source;
            return copy_list(d, n_layer, out);
        }
    }
    return ds4_fail(DS4_ERR_NOT_FOUND, "expert hot list: none compiled in for %d layers x %d experts, embd %d", n_layer,
                    n_expert, n_embd);
}

/*
 * expert_profile.h - the two text formats of expert streaming
 * (docs/STREAMING.md): an expert profile (how often each (layer, expert)
 * was selected) and a hot list (experts to preload, hottest first), plus
 * the hot lists compiled in for known model families.
 *
 *   # comments and blank lines anywhere
 *   ds4-expert-profile 1 layers L experts E
 *   <layer> <expert> <count>          one line per selected pair
 *
 *   ds4-expert-hotlist 1 layers L experts E [embd D] [family NAME]
 *   <layer> <expert>                  hottest first
 *
 * Readers check everything (header, ranges, duplicates, overflow, line
 * length) and name the file, line and cause. ds4-hotlist (tools/) and the
 * engine use these; the build turns models/hotlists/ *.hotlist into the
 * compiled-in table.
 */
#ifndef DS4_ENGINE_EXPERT_PROFILE_H
#define DS4_ENGINE_EXPERT_PROFILE_H

#include "include/ds4.h"

#include <stdint.h>

/* counts: [n_layer * n_expert] malloc'd. DS4_ERR_NOT_FOUND (message set)
 * when the file does not exist. */
ds4_status ds4_expert_profile_read(const char *path, int *n_layer, int *n_expert, uint64_t **counts);

/* Add `add` to the profile in `path` (created when absent; its layers and
 * experts must match) and write it back atomically (tmp + rename). */
ds4_status ds4_expert_profile_merge(const char *path, int n_layer, int n_expert, const uint64_t *add);

/* Write counts as a profile (pairs with count 0 left out). */
ds4_status ds4_expert_profile_write(const char *path, int n_layer, int n_expert, const uint64_t *counts);

typedef struct {
    int n_layer, n_expert; /* from the header */
    int n_embd;            /* 0 when the header has none */
    char family[32];       /* "" when the header has none */
    int64_t n;             /* entries */
    int32_t *pairs;        /* [2n]: layer, expert; malloc'd */
} ds4_expert_hotlist;

ds4_status ds4_expert_hotlist_read(const char *path, ds4_expert_hotlist *out);
ds4_status ds4_expert_hotlist_parse(const char *text, size_t len, const char *name, ds4_expert_hotlist *out);
void ds4_expert_hotlist_free(ds4_expert_hotlist *h);

/* The hot list of a profile: pairs by count descending (ties by layer,
 * then expert), at most `top` (<= 0: all selected pairs). */
ds4_status ds4_expert_hotlist_from_counts(int n_layer, int n_expert, const uint64_t *counts, int64_t top,
                                          ds4_expert_hotlist *out);
ds4_status ds4_expert_hotlist_write(const char *path, const ds4_expert_hotlist *h, const char *comment);

/* The compiled-in list for a model of these dimensions (its family has
 * n_embd and n_expert equal and at least n_layer layers; entries past
 * n_layer are dropped), copied into *out; DS4_ERR_NOT_FOUND when none.
 * *source names the data file it was built from. */
ds4_status ds4_expert_hotlist_default(int n_layer, int n_expert, int n_embd, ds4_expert_hotlist *out,
                                      const char **source);

/* The compiled-in lists, for tests: count, and list i with its source. */
int ds4_expert_hotlist_n_defaults(void);
ds4_status ds4_expert_hotlist_default_at(int i, ds4_expert_hotlist *out, const char **source);

#endif

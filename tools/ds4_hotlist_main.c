/*
 * ds4_hotlist_main.c - `ds4-hotlist`: expert profiles to a hot list.
 *
 *   ds4-hotlist [--top N] [--family NAME --embd D] -o OUT PROFILE...
 *
 * Adds up the profiles (`--expert-profile` files of any runs: CLI, server,
 * bench; they must agree on layers and experts) and writes the (layer,
 * expert) pairs by count, hottest first, as a hot list for
 * `--ssd-streaming-hotlist`, or, with --family and --embd, as a data file
 * for models/hotlists/ that the build compiles in as that family's default
 * (docs/STREAMING.md). Like ds4-gguf it works on the formats themselves
 * (engine/expert_profile.h), not through the engine API.
 *
 * Exit status: 0 success, 1 a profile is malformed or cannot be read or
 * the output cannot be written (message names file and line), 2 usage.
 */
#include "engine/expert_profile.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int usage(const char *msg)
{
    if (msg) fprintf(stderr, "ds4-hotlist: %s\n", msg);
    fprintf(msg ? stderr : stdout,
            "usage: ds4-hotlist [--top N] [--family NAME --embd D] -o OUT PROFILE...\n"
            "\n"
            "  PROFILE...     files written by --expert-profile (summed)\n"
            "  -o OUT         the hot list to write (pairs by count, hottest first)\n"
            "  --top N        keep the N hottest pairs (default: every selected pair)\n"
            "  --family NAME  with --embd: header fields of a compiled-in default list\n"
            "  --embd D       the family's hidden size (models/hotlists/, docs/STREAMING.md)\n");
    return msg ? 2 : 0;
}

static int parse_pos(const char *v, long long *out)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (!*v || *end || errno || x < 1) return -1;
    *out = x;
    return 0;
}

int main(int argc, char **argv)
{
    const char *out = NULL, *family = NULL;
    long long top = 0, embd = 0;
    const char **profiles = calloc((size_t)argc, sizeof *profiles);
    int np = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(NULL);
        if (!strcmp(a, "-o") || !strcmp(a, "--top") || !strcmp(a, "--family") || !strcmp(a, "--embd")) {
            if (!v) return usage("an option needs a value");
            i++;
            if (!strcmp(a, "-o")) out = v;
            else if (!strcmp(a, "--family")) family = v;
            else if (!strcmp(a, "--top") ? parse_pos(v, &top) : parse_pos(v, &embd))
                return usage("--top and --embd take a positive number");
        } else if (a[0] == '-' && a[1]) {
            return usage("unknown option");
        } else {
            profiles[np++] = a;
        }
    }
    if (!out || np == 0) return usage("-o OUT and at least one PROFILE are required");
    if (!family != !embd) return usage("--family and --embd go together");
    if (family && (strlen(family) >= 32 || strpbrk(family, " \t\r\n#")))
        return usage("--family takes a short word");

    int L = 0, E = 0;
    uint64_t *sum = NULL;
    for (int p = 0; p < np; p++) {
        int l, e;
        uint64_t *c;
        if (ds4_expert_profile_read(profiles[p], &l, &e, &c) != DS4_OK) {
            fprintf(stderr, "ds4-hotlist: %s\n", ds4_last_error());
            return 1;
        }
        if (!sum) {
            L = l, E = e, sum = c;
            continue;
        }
        if (l != L || e != E) {
            fprintf(stderr, "ds4-hotlist: %s has %d layers x %d experts, %s has %d x %d\n", profiles[p], l, e,
                    profiles[0], L, E);
            return 1;
        }
        for (size_t k = 0; k < (size_t)L * (size_t)E; k++) sum[k] = sum[k] > UINT64_MAX - c[k] ? UINT64_MAX : sum[k] + c[k];
        free(c);
    }
    ds4_expert_hotlist h;
    if (ds4_expert_hotlist_from_counts(L, E, sum, top, &h) != DS4_OK) {
        fprintf(stderr, "ds4-hotlist: %s\n", ds4_last_error());
        return 1;
    }
    if (family) {
        snprintf(h.family, sizeof h.family, "%s", family);
        h.n_embd = (int)embd;
    }
    char comment[512];
    snprintf(comment, sizeof comment, "made by ds4-hotlist from %d profile(s), first %s", np, profiles[0]);
    int rc = 0;
    if (ds4_expert_hotlist_write(out, &h, comment) != DS4_OK) {
        fprintf(stderr, "ds4-hotlist: %s\n", ds4_last_error());
        rc = 1;
    } else {
        fprintf(stderr, "ds4-hotlist: %lld pairs to %s\n", (long long)h.n, out);
    }
    ds4_expert_hotlist_free(&h);
    free(sum);
    free(profiles);
    return rc;
}

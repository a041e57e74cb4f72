/*
 * expert_profile.c - reading and writing expert profiles and hot lists
 * (expert_profile.h). Files are small (at most layers x experts lines),
 * so they are read whole; each line is checked before it is used.
 */
#include "engine/expert_profile.h"

#include "util/error.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_LAYERS 4096
#define MAX_EXPERTS 65536
#define MAX_PAIRS (1 << 24)
#define MAX_LINE 512

/* Whole file into a NUL-terminated buffer, refusing what no valid file
 * can be (so a wrong path to a huge file fails fast, not out of memory). */
static ds4_status slurp(const char *what, const char *path, char **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT) return ds4_fail(DS4_ERR_NOT_FOUND, "%s %s: no such file", what, path);
        return ds4_fail(DS4_ERR_IO, "%s %s: %s", what, path, strerror(errno));
    }
    size_t cap = 1 << 16, n = 0, limit = (size_t)MAX_PAIRS * 48;
    char *b = malloc(cap + 1);
    for (;;) {
        if (!b) {
            fclose(f);
            return ds4_fail(DS4_ERR_NOMEM, "%s %s: out of memory", what, path);
        }
        n += fread(b + n, 1, cap - n, f);
        if (n < cap) break;
        if (cap >= limit) {
            free(b);
            fclose(f);
            return ds4_fail(DS4_ERR_FORMAT, "%s %s: larger than %zu bytes, not a list of experts", what, path, limit);
        }
        cap *= 2;
        char *nb = realloc(b, cap + 1);
        if (!nb) free(b);
        b = nb;
    }
    bool bad = ferror(f);
    fclose(f);
    if (bad) {
        free(b);
        return ds4_fail(DS4_ERR_IO, "%s %s: read error", what, path);
    }
    b[n] = 0;
    *out = b;
    *len = n;
    return DS4_OK;
}

/* Line cursor: next non-blank, non-comment line (trimmed) into buf. */
typedef struct {
    const char *p, *end, *what, *name;
    int line;
} cursor;

static ds4_status next_line(cursor *c, char *buf, bool *have)
{
    *have = false;
    while (c->p < c->end) {
        const char *nl = memchr(c->p, '\n', (size_t)(c->end - c->p));
        const char *le = nl ? nl : c->end;
        c->line++;
        size_t n = (size_t)(le - c->p);
        const char *s = c->p;
        c->p = nl ? nl + 1 : c->end;
        if (memchr(s, 0, n)) return ds4_fail(DS4_ERR_FORMAT, "%s %s line %d: NUL byte", c->what, c->name, c->line);
        while (n && (s[n - 1] == '\r' || s[n - 1] == ' ' || s[n - 1] == '\t')) n--;
        while (n && (*s == ' ' || *s == '\t')) s++, n--;
        if (n == 0 || *s == '#') continue;
        if (n >= MAX_LINE)
            return ds4_fail(DS4_ERR_FORMAT, "%s %s line %d: line longer than %d bytes", c->what, c->name, c->line,
                            MAX_LINE);
        memcpy(buf, s, n);
        buf[n] = 0;
        *have = true;
        return DS4_OK;
    }
    return DS4_OK;
}

/* Unsigned decimal field; advances *s past it and the blanks after it. */
static bool field_u64(const char **s, uint64_t *v)
{
    const char *p = *s;
    if (*p < '0' || *p > '9') return false;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(p, &end, 10);
    if (errno || (*end && *end != ' ' && *end != '\t')) return false;
    while (*end == ' ' || *end == '\t') end++;
    *s = end;
    *v = x;
    return true;
}

/* "MAGIC 1 layers L experts E [embd D] [family NAME]" */
static ds4_status parse_header(cursor *c, const char *magic, int *nl, int *ne, int *embd, char *family, size_t fcap)
{
    char buf[MAX_LINE];
    bool have;
    ds4_status st = next_line(c, buf, &have);
    if (st != DS4_OK) return st;
    if (!have) return ds4_fail(DS4_ERR_FORMAT, "%s %s: empty (no \"%s 1 layers L experts E\" header)", c->what,
                               c->name, magic);
    char m[64], k1[16], k2[16];
    unsigned ver, l, e;
    int used = 0;
    if (sscanf(buf, "%63s %u %15s %u %15s %u%n", m, &ver, k1, &l, k2, &e, &used) != 6 || strcmp(m, magic) ||
        strcmp(k1, "layers") || strcmp(k2, "experts"))
        return ds4_fail(DS4_ERR_FORMAT, "%s %s line %d: expected the header \"%s 1 layers L experts E\", found \"%s\"",
                        c->what, c->name, c->line, magic, buf);
    if (ver != 1)
        return ds4_fail(DS4_ERR_UNSUPPORTED, "%s %s line %d: version %u (this build reads version 1)", c->what,
                        c->name, c->line, ver);
    if (l < 1 || l > MAX_LAYERS || e < 1 || e > MAX_EXPERTS || (uint64_t)l * e > MAX_PAIRS)
        return ds4_fail(DS4_ERR_FORMAT, "%s %s line %d: %u layers x %u experts out of range", c->what, c->name,
                        c->line, l, e);
    *nl = (int)l;
    *ne = (int)e;
    if (embd) *embd = 0;
    if (family) family[0] = 0;
    const char *p = buf + used;
    for (;;) {
        while (*p == ' ' || *p == '\t') p++;
        if (!*p) break;
        char key[16], val[64];
        int n2 = 0;
        if (sscanf(p, "%15s %63s%n", key, val, &n2) != 2 || (!embd && !family))
            return ds4_fail(DS4_ERR_FORMAT, "%s %s line %d: unexpected text after the header: \"%s\"", c->what,
                            c->name, c->line, p);
        if (!strcmp(key, "embd")) {
            const char *v = val;
            uint64_t x;
            if (!field_u64(&v, &x) || *v || x < 1 || x > 1 << 20)
                return ds4_fail(DS4_ERR_FORMAT, "%s %s line %d: bad embd \"%s\"", c->what, c->name, c->line, val);
            *embd = (int)x;
        } else if (!strcmp(key, "family") && strlen(val) < fcap) {
            snprintf(family, fcap, "%s", val);
        } else {
            return ds4_fail(DS4_ERR_FORMAT, "%s %s line %d: unknown header field \"%s\"", c->what, c->name, c->line,
                            key);
        }
        p += n2;
    }
    return DS4_OK;
}

static ds4_status parse_profile(const char *text, size_t len, const char *name, int *n_layer, int *n_expert,
                                uint64_t **counts)
{
    cursor c = {text, text + len, "expert profile", name, 0};
    int L, E;
    ds4_status st = parse_header(&c, "ds4-expert-profile", &L, &E, NULL, NULL, 0);
    if (st != DS4_OK) return st;
    uint64_t *cnt = calloc((size_t)L * (size_t)E, sizeof *cnt);
    uint8_t *seen = calloc((size_t)L * (size_t)E, 1);
    if (!cnt || !seen) {
        free(cnt);
        free(seen);
        return ds4_fail(DS4_ERR_NOMEM, "expert profile %s: out of memory", name);
    }
    char buf[MAX_LINE];
    for (;;) {
        bool have;
        st = next_line(&c, buf, &have);
        if (st != DS4_OK || !have) break;
        const char *p = buf;
        uint64_t l, e, n;
        if (!field_u64(&p, &l) || !field_u64(&p, &e) || !field_u64(&p, &n) || *p) {
            st = ds4_fail(DS4_ERR_FORMAT, "expert profile %s line %d: expected \"layer expert count\", found \"%s\"",
                          name, c.line, buf);
            break;
        }
        if (l >= (uint64_t)L || e >= (uint64_t)E) {
            st = ds4_fail(DS4_ERR_FORMAT, "expert profile %s line %d: layer %llu expert %llu outside %d layers x %d experts",
                          name, c.line, (unsigned long long)l, (unsigned long long)e, L, E);
            break;
        }
        size_t k = (size_t)l * (size_t)E + (size_t)e;
        if (seen[k]) {
            st = ds4_fail(DS4_ERR_FORMAT, "expert profile %s line %d: layer %llu expert %llu listed twice", name, c.line,
                          (unsigned long long)l, (unsigned long long)e);
            break;
        }
        seen[k] = 1;
        cnt[k] = n;
    }
    free(seen);
    if (st != DS4_OK) {
        free(cnt);
        return st;
    }
    *n_layer = L;
    *n_expert = E;
    *counts = cnt;
    return DS4_OK;
}

ds4_status ds4_expert_profile_read(const char *path, int *n_layer, int *n_expert, uint64_t **counts)
{
    char *text;
    size_t len;
    ds4_status st = slurp("expert profile", path, &text, &len);
    if (st != DS4_OK) return st;
    st = parse_profile(text, len, path, n_layer, n_expert, counts);
    free(text);
    return st;
}

/* Write through path.tmp + rename, so a crash never leaves half a file. */
static ds4_status write_atomic(const char *what, const char *path, ds4_status (*body)(FILE *, const void *),
                               const void *ctx)
{
    size_t n = strlen(path) + 8;
    char *tmp = malloc(n);
    if (!tmp) return ds4_fail(DS4_ERR_NOMEM, "%s %s: out of memory", what, path);
    snprintf(tmp, n, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        ds4_status st = ds4_fail(DS4_ERR_IO, "%s %s: cannot create %s: %s", what, path, tmp, strerror(errno));
        free(tmp);
        return st;
    }
    ds4_status st = body(f, ctx);
    if (fflush(f) != 0 || ferror(f)) st = ds4_fail(DS4_ERR_IO, "%s %s: write error: %s", what, path, strerror(errno));
    if (fclose(f) != 0 && st == DS4_OK) st = ds4_fail(DS4_ERR_IO, "%s %s: write error: %s", what, path, strerror(errno));
    if (st == DS4_OK && rename(tmp, path) != 0)
        st = ds4_fail(DS4_ERR_IO, "%s %s: cannot rename %s: %s", what, path, tmp, strerror(errno));
    if (st != DS4_OK) unlink(tmp);
    free(tmp);
    return st;
}

typedef struct {
    int L, E;
    const uint64_t *cnt;
} profile_body;

static ds4_status write_profile_body(FILE *f, const void *ctx)
{
    const profile_body *b = ctx;
    fprintf(f, "# ds4 expert profile: times each (layer, expert) was selected (docs/STREAMING.md)\n");
    fprintf(f, "ds4-expert-profile 1 layers %d experts %d\n", b->L, b->E);
    for (int l = 0; l < b->L; l++)
        for (int e = 0; e < b->E; e++) {
            uint64_t v = b->cnt[(size_t)l * (size_t)b->E + (size_t)e];
            if (v) fprintf(f, "%d %d %llu\n", l, e, (unsigned long long)v);
        }
    return DS4_OK;
}

ds4_status ds4_expert_profile_write(const char *path, int n_layer, int n_expert, const uint64_t *counts)
{
    profile_body b = {n_layer, n_expert, counts};
    return write_atomic("expert profile", path, write_profile_body, &b);
}

ds4_status ds4_expert_profile_merge(const char *path, int n_layer, int n_expert, const uint64_t *add)
{
    int L, E;
    uint64_t *cnt = NULL;
    ds4_status st = ds4_expert_profile_read(path, &L, &E, &cnt);
    if (st == DS4_ERR_NOT_FOUND) {
        ds4_clear_error();
        return ds4_expert_profile_write(path, n_layer, n_expert, add);
    }
    if (st != DS4_OK) return st;
    if (L != n_layer || E != n_expert) {
        free(cnt);
        return ds4_fail(DS4_ERR_INVALID, "expert profile %s: has %d layers x %d experts, this model %d x %d", path, L,
                        E, n_layer, n_expert);
    }
    for (size_t k = 0; k < (size_t)L * (size_t)E; k++)
        cnt[k] = cnt[k] > UINT64_MAX - add[k] ? UINT64_MAX : cnt[k] + add[k];
    st = ds4_expert_profile_write(path, L, E, cnt);
    free(cnt);
    return st;
}

ds4_status ds4_expert_hotlist_parse(const char *text, size_t len, const char *name, ds4_expert_hotlist *out)
{
    memset(out, 0, sizeof *out);
    cursor c = {text, text + len, "expert hot list", name, 0};
    int L, E, embd;
    char family[32];
    ds4_status st = parse_header(&c, "ds4-expert-hotlist", &L, &E, &embd, family, sizeof family);
    if (st != DS4_OK) return st;
    size_t keys = (size_t)L * (size_t)E;
    uint8_t *seen = calloc(keys, 1);
    int32_t *pairs = malloc(2 * keys * sizeof *pairs);
    if (!seen || !pairs) {
        free(seen);
        free(pairs);
        return ds4_fail(DS4_ERR_NOMEM, "expert hot list %s: out of memory", name);
    }
    int64_t n = 0;
    char buf[MAX_LINE];
    for (;;) {
        bool have;
        st = next_line(&c, buf, &have);
        if (st != DS4_OK || !have) break;
        const char *p = buf;
        uint64_t l, e;
        if (!field_u64(&p, &l) || !field_u64(&p, &e) || *p) {
            st = ds4_fail(DS4_ERR_FORMAT, "expert hot list %s line %d: expected \"layer expert\", found \"%s\"", name,
                          c.line, buf);
            break;
        }
        if (l >= (uint64_t)L || e >= (uint64_t)E) {
            st = ds4_fail(DS4_ERR_FORMAT, "expert hot list %s line %d: layer %llu expert %llu outside %d layers x %d experts",
                          name, c.line, (unsigned long long)l, (unsigned long long)e, L, E);
            break;
        }
        size_t k = (size_t)l * (size_t)E + (size_t)e;
        if (seen[k]) {
            st = ds4_fail(DS4_ERR_FORMAT, "expert hot list %s line %d: layer %llu expert %llu listed twice", name,
                          c.line, (unsigned long long)l, (unsigned long long)e);
            break;
        }
        seen[k] = 1;
        pairs[2 * n] = (int32_t)l;
        pairs[2 * n + 1] = (int32_t)e;
        n++;
    }
    free(seen);
    if (st != DS4_OK) {
        free(pairs);
        return st;
    }
    out->n_layer = L;
    out->n_expert = E;
    out->n_embd = embd;
    snprintf(out->family, sizeof out->family, "%s", family);
    out->n = n;
    out->pairs = pairs;
    return DS4_OK;
}

ds4_status ds4_expert_hotlist_read(const char *path, ds4_expert_hotlist *out)
{
    memset(out, 0, sizeof *out);
    char *text;
    size_t len;
    ds4_status st = slurp("expert hot list", path, &text, &len);
    if (st != DS4_OK) return st;
    st = ds4_expert_hotlist_parse(text, len, path, out);
    free(text);
    return st;
}

void ds4_expert_hotlist_free(ds4_expert_hotlist *h)
{
    if (!h) return;
    free(h->pairs);
    h->pairs = NULL;
    h->n = 0;
}

static const uint64_t *g_sort_counts; /* qsort has no context argument */

static int by_count(const void *a, const void *b)
{
    int32_t ka = *(const int32_t *)a, kb = *(const int32_t *)b;
    uint64_t ca = g_sort_counts[ka], cb = g_sort_counts[kb];
    if (ca != cb) return ca > cb ? -1 : 1;
    return ka < kb ? -1 : ka > kb;
}

ds4_status ds4_expert_hotlist_from_counts(int n_layer, int n_expert, const uint64_t *counts, int64_t top,
                                          ds4_expert_hotlist *out)
{
    memset(out, 0, sizeof *out);
    size_t keys = (size_t)n_layer * (size_t)n_expert;
    int32_t *k = malloc(keys * sizeof *k), *pairs = malloc(2 * keys * sizeof *pairs);
    if (!k || !pairs) {
        free(k);
        free(pairs);
        return ds4_fail(DS4_ERR_NOMEM, "expert hot list: out of memory");
    }
    int64_t n = 0;
    for (size_t i = 0; i < keys; i++)
        if (counts[i]) k[n++] = (int32_t)i;
    g_sort_counts = counts;
    qsort(k, (size_t)n, sizeof *k, by_count);
    if (top > 0 && n > top) n = top;
    for (int64_t i = 0; i < n; i++) {
        pairs[2 * i] = k[i] / n_expert;
        pairs[2 * i + 1] = k[i] % n_expert;
    }
    free(k);
    out->n_layer = n_layer;
    out->n_expert = n_expert;
    out->n = n;
    out->pairs = pairs;
    return DS4_OK;
}

typedef struct {
    const ds4_expert_hotlist *h;
    const char *comment;
} hotlist_body;

static ds4_status write_hotlist_body(FILE *f, const void *ctx)
{
    const hotlist_body *b = ctx;
    const ds4_expert_hotlist *h = b->h;
    fprintf(f, "# ds4 expert hot list: (layer, expert) pairs, hottest first (docs/STREAMING.md)\n");
    if (b->comment) {
        const char *p = b->comment;
        while (*p) {
            const char *nl = strchr(p, '\n');
            size_t n = nl ? (size_t)(nl - p) : strlen(p);
            fprintf(f, "# %.*s\n", (int)n, p);
            p += n + (nl ? 1 : 0);
        }
    }
    fprintf(f, "ds4-expert-hotlist 1 layers %d experts %d", h->n_layer, h->n_expert);
    if (h->n_embd) fprintf(f, " embd %d", h->n_embd);
    if (h->family[0]) fprintf(f, " family %s", h->family);
    fprintf(f, "\n");
    for (int64_t i = 0; i < h->n; i++) fprintf(f, "%d %d\n", h->pairs[2 * i], h->pairs[2 * i + 1]);
    return DS4_OK;
}

ds4_status ds4_expert_hotlist_write(const char *path, const ds4_expert_hotlist *h, const char *comment)
{
    hotlist_body b = {h, comment};
    return write_atomic("expert hot list", path, write_hotlist_body, &b);
}

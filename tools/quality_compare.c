/*
 * quality_compare.c - `ds4-quality compare A.tsv B.tsv` (see
 * quality_tools.h): join two score files by item id and print, per
 * metric, the means, the mean difference B - A with its standard error
 * over items, and how many items each side wins. Lower NLL is better,
 * higher first-token match, common prefix and top-k overlap are better,
 * lower top-k KL.
 * The two files must hold the same ids (scores of one manifest).
 */
#include "tools/quality_tools.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_METRIC 5
#define N_COL 8
static const char *const metric_name[N_METRIC] = {"nll/token", "first_match", "prefix_len", "top_overlap", "top_kl"};
static const int metric_col[N_METRIC] = {3, 4, 5, 6, 7}; /* TSV columns (0 = id) */
static const int lower_better[N_METRIC] = {1, 0, 0, 0, 1};

typedef struct {
    char *id;
    double v[N_METRIC];
    double tokens, nll; /* for the token-weighted NLL */
} row;

static const char *const header = "id\ttokens\tnll\tnll_per_token\tfirst_match\tprefix_len\ttop_overlap\ttop_kl";

static int load(const char *path, row **out, int *n_out)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "ds4-quality: cannot open %s\n", path);
        return 0;
    }
    char line[4096];
    int n = 0, cap = 0, no = 0, ok = 1;
    row *r = NULL;
    while (ok && fgets(line, sizeof line, f)) {
        no++;
        size_t len = strlen(line);
        if (len && line[len - 1] == '\n') line[--len] = 0;
        if (no == 1) {
            if (strcmp(line, header) != 0) {
                fprintf(stderr, "ds4-quality: %s: not a ds4-quality score file (header is not \"%s\")\n", path, header);
                ok = 0;
            }
            continue;
        }
        if (!len) continue;
        char *col[N_COL];
        int nc = 0;
        for (char *p = line; nc < N_COL; nc++) {
            col[nc] = p;
            char *t = strchr(p, '\t');
            if (!t) {
                nc++;
                break;
            }
            *t = 0;
            p = t + 1;
        }
        if (nc != N_COL) {
            fprintf(stderr, "ds4-quality: %s line %d: expected %d tab-separated columns\n", path, no, N_COL);
            ok = 0;
            break;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            row *q = realloc(r, (size_t)cap * sizeof *q);
            if (!q) {
                ok = 0;
                break;
            }
            r = q;
        }
        r[n].id = strdup(col[0]);
        r[n].tokens = strtod(col[1], NULL);
        r[n].nll = strtod(col[2], NULL);
        if (!(r[n].tokens >= 1)) {
            fprintf(stderr, "ds4-quality: %s line %d: bad token count '%s'\n", path, no, col[1]);
            ok = 0;
        }
        for (int k = 0; k < N_METRIC; k++) {
            char *end;
            r[n].v[k] = strtod(col[metric_col[k]], &end);
            if (end == col[metric_col[k]] || *end || !isfinite(r[n].v[k])) {
                fprintf(stderr, "ds4-quality: %s line %d: column %s is not a number: '%s'\n", path, no,
                        metric_name[k], col[metric_col[k]]);
                ok = 0;
            }
        }
        n++;
    }
    if (ok && no == 0) {
        fprintf(stderr, "ds4-quality: %s is empty\n", path);
        ok = 0;
    } else if (ok && n == 0) {
        fprintf(stderr, "ds4-quality: %s has no items\n", path);
        ok = 0;
    }
    fclose(f);
    if (!ok) {
        for (int i = 0; i < n; i++) free(r[i].id);
        free(r);
        return 0;
    }
    *out = r;
    *n_out = n;
    return 1;
}

int quality_compare(const char *a_path, const char *b_path)
{
    row *a = NULL, *b = NULL;
    int na = 0, nb = 0, rc = 1;
    if (!load(a_path, &a, &na) || !load(b_path, &b, &nb)) goto done;
    if (na != nb) {
        fprintf(stderr, "ds4-quality: %s has %d items, %s has %d: not scores of the same manifest\n", a_path, na, b_path,
                nb);
        goto done;
    }
    int *match = malloc((size_t)na * sizeof *match);
    if (!match) goto done;
    for (int i = 0; i < na; i++) {
        match[i] = -1;
        for (int j = 0; j < nb && match[i] < 0; j++)
            if (strcmp(a[i].id, b[j].id) == 0) match[i] = j;
        if (match[i] < 0) {
            fprintf(stderr, "ds4-quality: item %s of %s is not in %s\n", a[i].id, a_path, b_path);
            free(match);
            goto done;
        }
    }
    printf("A = %s\nB = %s\n%d items\n\n", a_path, b_path, na);
    printf("%-12s %12s %12s %12s %10s %9s %9s %6s\n", "metric", "A", "B", "B-A", "+/-", "B better", "A better", "ties");
    for (int k = 0; k < N_METRIC; k++) {
        double sa = 0, sb = 0, sd = 0, sd2 = 0;
        int wb = 0, wa = 0, tie = 0;
        for (int i = 0; i < na; i++) {
            double x = a[i].v[k], y = b[match[i]].v[k], d = y - x;
            sa += x;
            sb += y;
            sd += d;
            sd2 += d * d;
            if (fabs(d) <= 1e-9 * (fabs(x) + fabs(y))) tie++;
            else if ((d < 0) == (lower_better[k] != 0)) wb++;
            else wa++;
        }
        double md = sd / na, var = sd2 / na - md * md;
        double se = na > 1 && var > 0 ? sqrt(var / (na - 1)) : 0;
        printf("%-12s %12.6f %12.6f %+12.6f %10.6f %9d %9d %6d\n", metric_name[k], sa / na, sb / na, md, se, wb, wa, tie);
    }
    double ta = 0, tb = 0, la = 0, lb = 0;
    for (int i = 0; i < na; i++) {
        ta += a[i].tokens;
        la += a[i].nll;
        tb += b[match[i]].tokens;
        lb += b[match[i]].nll;
    }
    printf("\nall tokens: nll/token A %.6f, B %.6f, B-A %+.6f (%.0f tokens)\n", la / ta, lb / tb, lb / tb - la / ta, ta);
    printf("(nll/token and top_kl: lower is better; the others: higher is better; rows are means over items)\n");
    free(match);
    rc = 0;
done:
    for (int i = 0; i < na; i++) free(a[i].id);
    for (int i = 0; i < nb; i++) free(b[i].id);
    free(a);
    free(b);
    return rc;
}

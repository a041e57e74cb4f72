/*
 * harness.c - implementation of tests/test.h (linked into every test).
 */
#include "tests/test.h"

#include <math.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_passed, g_failed, g_skipped;
static int g_cur_failed, g_cur_skipped;
static const char *g_cur_name;

void test_fail_at(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    fprintf(stdout, "  %s:%d: %s: ", file, line, g_cur_name ? g_cur_name : "?");
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fputc('\n', stdout);
    fflush(stdout);
    g_cur_failed++;
}

void test_skip(const char *fmt, ...)
{
    va_list ap;
    fprintf(stdout, "  skip %s: ", g_cur_name ? g_cur_name : "?");
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fputc('\n', stdout);
    g_cur_skipped = 1;
}

void test_run(const char *name, void (*fn)(void))
{
    g_cur_name = name;
    g_cur_failed = 0;
    g_cur_skipped = 0;
    /* DS4_TEST_ONLY=part: only the tests whose names contain it run (a
     * device call's re-run of a few tests under a switch), the others
     * skipped and saying so */
    const char *only = getenv("DS4_TEST_ONLY");
    if (only && *only && !strstr(name, only)) test_skip("not named by DS4_TEST_ONLY=%s", only);
    else fn();
    if (g_cur_failed) {
        g_failed++;
        printf("FAIL %s\n", name);
    } else if (g_cur_skipped) {
        g_skipped++;
        printf("SKIP %s\n", name);
    } else {
        g_passed++;
        printf("PASS %s\n", name);
    }
    fflush(stdout);
    g_cur_name = NULL;
}

int test_finish(void)
{
    printf("RESULT %d %d %d\n", g_passed, g_failed, g_skipped);
    return g_failed ? 1 : 0;
}

static void skip_all(void) { test_skip(TEST_SKIP_NO_CUDA); }

int test_skip_all_no_cuda(void)
{
    test_run("skip_all", skip_all);
    return test_finish();
}

const char *test_data(const char *rel)
{
    static char buf[4096];
    const char *root = getenv("DS4_TEST_DATA");
    snprintf(buf, sizeof buf, "%s/%s", root ? root : "tests/data", rel);
    return buf;
}

void *test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return NULL; }
    long n = ftell(f);
    if (n < 0) { fclose(f); return NULL; }
    rewind(f);
    char *p = malloc((size_t)n + 1);
    if (!p) { fclose(f); return NULL; }
    if (fread(p, 1, (size_t)n, f) != (size_t)n) { free(p); fclose(f); return NULL; }
    p[n] = '\0';
    fclose(f);
    if (len) *len = (size_t)n;
    return p;
}

void test_remove_dir(const char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

double test_max_abs_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (isnan(d)) return INFINITY;
        if (d > m) m = d;
    }
    return m;
}

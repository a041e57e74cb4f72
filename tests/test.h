/*
 * test.h - the minimal test harness every tests/test_*.c uses.
 *
 * A test file defines plain `static void test_something(void)` functions and
 * a main() that calls RUN(test_something) for each and returns
 * test_finish(). A test passes when none of its EXPECTs failed; test_skip()
 * marks it skipped with a reason (e.g. "no GPU"). Each binary prints one
 * line per test and a closing "RESULT <passed> <failed> <skipped>" line that
 * tests/run_tests.sh adds up into the suite's "N passed, N failed" summary.
 * DS4_TEST_ONLY=part runs only the tests whose names contain `part` (the
 * others are skipped and say so): a GPU call's re-run of a few tests under
 * a switch.
 *
 * Tests run from the repository root; fixture files live under tests/data
 * (copied from the project's shared fixtures so that a fresh clone works).
 */
#ifndef DS4_TEST_H
#define DS4_TEST_H

#include <stddef.h>
#include <stdio.h>

void test_run(const char *name, void (*fn)(void));
int test_finish(void);
void test_fail_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Path of a file under tests/data (static buffer, valid until next call). */
const char *test_data(const char *rel);

/* Read a whole file; returns malloc'd buffer (NUL-terminated) or NULL. */
void *test_read_file(const char *path, size_t *len);

/* Remove a test's scratch folder and everything in it (rm -rf); a failure
 * is reported on stderr, not counted against a test. */
void test_remove_dir(const char *dir);

/* max |a[i] - b[i]| in double; a NaN anywhere gives +inf (never hidden by
 * a later finite difference). */
double test_max_abs_diff(const float *a, const float *b, size_t n);

/* Why the CUDA tests skip in a build without the CUDA backend (the
 * Makefile builds it only when asked or when a GPU is visible). */
#define TEST_SKIP_NO_CUDA                                                   \
    "CUDA not built (make builds it with CUDA=1 or CUDA_ARCHS=..., or by "  \
    "itself on a machine with a GPU; NO_CUDA=1 leaves it out)"

/* main() of a CUDA test in a build without the CUDA backend: its one
 * test, skip_all, skips with TEST_SKIP_NO_CUDA. Returns test_finish(). */
int test_skip_all_no_cuda(void);

#define RUN(fn) test_run(#fn, fn)

#define EXPECT(cond)                                                      \
    do {                                                                  \
        if (!(cond)) test_fail_at(__FILE__, __LINE__, "expected: %s", #cond); \
    } while (0)

#define EXPECT_MSG(cond, ...)                                             \
    do {                                                                  \
        if (!(cond)) test_fail_at(__FILE__, __LINE__, __VA_ARGS__);       \
    } while (0)

/* Abort the current test function (after a failure it cannot go past). */
#define REQUIRE(cond)                                                     \
    do {                                                                  \
        if (!(cond)) {                                                    \
            test_fail_at(__FILE__, __LINE__, "required: %s", #cond);      \
            return;                                                       \
        }                                                                 \
    } while (0)

#endif

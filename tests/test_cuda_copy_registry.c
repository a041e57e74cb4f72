/*
 * test_cuda_copy_registry.c - the table of copies derived from weights
 * (backend/cuda/cuda_copy_registry.h: the Q8_0 split layout and the prefill
 * GEMM's bf16 copies are found through it): host code, so it runs in any
 * build with the CUDA backend, GPU or not. The pointers are made-up
 * addresses; nothing is dereferenced.
 */
#include "tests/test.h"

#include <stdint.h>
#include <stdlib.h>

#if DS4_HAVE_CUDA
#include "backend/cuda/cuda_copy_registry.h"

#define P(x) ((void *)(uintptr_t)(x))

/* Added copies are found by their original and device only; a second add
 * of the same original keeps the first copy; take removes. */
static void test_add_has_take(void)
{
    ds4_copy_registry r = DS4_COPY_REGISTRY_INIT;
    bool added = false;
    EXPECT(ds4_copy_registry_add(&r, 0, P(0x1000), P(0x9000), 4, 64, &added) == DS4_OK && added);
    EXPECT(ds4_copy_registry_add(&r, 1, P(0x1000), P(0xa000), 4, 64, &added) == DS4_OK && added);
    EXPECT(ds4_copy_registry_has(&r, 0, P(0x1000)) && ds4_copy_registry_has(&r, 1, P(0x1000)));
    EXPECT(!ds4_copy_registry_has(&r, 2, P(0x1000)) && !ds4_copy_registry_has(&r, 0, P(0x1010)));
    EXPECT(ds4_copy_registry_add(&r, 0, P(0x1000), P(0xb000), 4, 64, &added) == DS4_OK && !added);
    EXPECT(ds4_copy_registry_take(&r, 0, P(0x1000)) == P(0x9000));
    EXPECT(ds4_copy_registry_take(&r, 0, P(0x1000)) == NULL);
    EXPECT(ds4_copy_registry_has(&r, 1, P(0x1000)));
    EXPECT(ds4_copy_registry_take(&r, 1, P(0x1000)) == P(0xa000));
    free(r.tab);
}

/* Row blocks: a pointer at the start of row k of a registered matrix
 * (Q8_0: cols / 32 * 34 bytes a row) finds it with row k; one inside a row,
 * past the last row, of other columns or another device does not. Exact
 * lookups (row_bytes 0) take the original only. */
static void test_find_rows(void)
{
    ds4_copy_registry r = DS4_COPY_REGISTRY_INIT;
    bool added = false;
    const int64_t cols = 4096, rb = cols / 32 * 34, rows = 512;
    const uintptr_t o = 0x10000000;
    EXPECT(ds4_copy_registry_add(&r, 0, P(o), P(0x80000000), rows, cols, &added) == DS4_OK && added);
    ds4_copy_entry e;
    int64_t r0 = -1;
    EXPECT(ds4_copy_registry_find(&r, 0, P(o), cols, 0, &e, &r0) && r0 == 0 && e.copy == P(0x80000000) &&
           e.rows == rows);
    EXPECT(!ds4_copy_registry_find(&r, 0, P(o + rb), cols, 0, &e, &r0));
    EXPECT(ds4_copy_registry_find(&r, 0, P(o + 64 * rb), cols, rb, &e, &r0) && r0 == 64);
    EXPECT(ds4_copy_registry_find(&r, 0, P(o + (rows - 1) * rb), cols, rb, &e, &r0) && r0 == rows - 1);
    EXPECT(!ds4_copy_registry_find(&r, 0, P(o + rows * rb), cols, rb, &e, &r0));
    EXPECT(!ds4_copy_registry_find(&r, 0, P(o + 64 * rb + 34), cols, rb, &e, &r0));
    EXPECT(!ds4_copy_registry_find(&r, 0, P(o - rb), cols, rb, &e, &r0));
    EXPECT(!ds4_copy_registry_find(&r, 0, P(o), cols / 2, 0, &e, &r0));
    EXPECT(!ds4_copy_registry_find(&r, 1, P(o), cols, 0, &e, &r0));
    free(r.tab);
}

/* More entries than the first allocation (256) holds: every one stays
 * findable, and taking them all empties the table. */
static void test_many(void)
{
    ds4_copy_registry r = DS4_COPY_REGISTRY_INIT;
    bool added = false;
    int ok = 1;
    for (uintptr_t i = 1; i <= 1000; i++)
        ok &= ds4_copy_registry_add(&r, 0, P(i * 0x100), P(i * 0x1000), 1, 32, &added) == DS4_OK && added;
    EXPECT(ok);
    ds4_copy_entry e;
    int64_t r0;
    for (uintptr_t i = 1; i <= 1000; i++)
        ok &= ds4_copy_registry_find(&r, 0, P(i * 0x100), 32, 0, &e, &r0) && e.copy == P(i * 0x1000);
    EXPECT(ok);
    for (uintptr_t i = 1000; i >= 1; i--) ok &= ds4_copy_registry_take(&r, 0, P(i * 0x100)) == P(i * 0x1000);
    EXPECT(ok && r.n == 0);
    free(r.tab);
}

int main(void)
{
    RUN(test_add_has_take);
    RUN(test_find_rows);
    RUN(test_many);
    return test_finish();
}
#else
int main(void) { return test_skip_all_no_cuda(); }
#endif

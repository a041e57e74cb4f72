/*
 * test_dist_plan.c - the layer split of a distributed run
 * (engine/dist_plan.h, docs/DISTRIBUTED.md): --layers parsing, the
 * automatic split by bytes (embedding with the first rank, head with the
 * last, weighted by each rank's free memory, at least one layer each),
 * the checks of ranges given per rank, and the model file summary the
 * ranks compare (the demo model's tensor bytes add up to its data).
 */
#include "tests/test.h"

#include "engine/dist_plan.h"
#include "gguf/gguf.h"
#include "util/error.h"

#include <string.h>

static ds4_dist_model_info info(int L, uint64_t per_layer, uint64_t embed, uint64_t head)
{
    ds4_dist_model_info mi;
    memset(&mi, 0, sizeof mi);
    mi.n_layer = L;
    for (int i = 0; i < L; i++) mi.layer_bytes[i] = per_layer;
    mi.embed_bytes = embed;
    mi.head_bytes = head;
    return mi;
}

static bool ranges_are(const ds4_dist_range *r, int n, const int *want)
{
    for (int i = 0; i < n; i++)
        if (r[i].lo != want[2 * i] || r[i].hi != want[2 * i + 1]) return false;
    return true;
}

static void test_parse_range(void)
{
    ds4_dist_range r;
    EXPECT(ds4_dist_parse_range("0:3", &r) == DS4_OK && r.lo == 0 && r.hi == 3);
    EXPECT(ds4_dist_parse_range("21:43", &r) == DS4_OK && r.lo == 21 && r.hi == 43);
    const char *bad[] = {"3:3", "4:2", "a:b", "2", "-1:4", "1:2x", ":4", "1:", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        EXPECT_MSG(ds4_dist_parse_range(bad[i], &r) == DS4_ERR_INVALID, "'%s' accepted", bad[i]);
        EXPECT_MSG(strstr(ds4_last_error(), "expected A:B") != NULL, "'%s': %s", bad[i], ds4_last_error());
    }
}

static void test_split_by_bytes(void)
{
    ds4_dist_range out[8];
    ds4_dist_model_info mi = info(6, 100, 0, 0);
    EXPECT(ds4_dist_plan(&mi, 2, NULL, NULL, out) == DS4_OK && ranges_are(out, 2, (int[]){0, 3, 3, 6}));
    EXPECT(ds4_dist_plan(&mi, 3, NULL, NULL, out) == DS4_OK && ranges_are(out, 3, (int[]){0, 2, 2, 4, 4, 6}));
    EXPECT(ds4_dist_plan(&mi, 1, NULL, NULL, out) == DS4_OK && ranges_are(out, 1, (int[]){0, 6}));
    /* the embedding counts with the first rank: 300 + 100 = 400 of 900 */
    mi = info(6, 100, 300, 0);
    EXPECT(ds4_dist_plan(&mi, 2, NULL, NULL, out) == DS4_OK && ranges_are(out, 2, (int[]){0, 1, 1, 6}));
    /* the head with the last: 100 x 4 = 400 before, 200 + 300 after */
    mi = info(6, 100, 0, 300);
    EXPECT(ds4_dist_plan(&mi, 2, NULL, NULL, out) == DS4_OK && ranges_are(out, 2, (int[]){0, 4, 4, 6}));
    /* free memory 1 : 3 -> a quarter of the bytes on rank 0 */
    mi = info(8, 100, 0, 0);
    uint64_t w[2] = {1ull << 30, 3ull << 30};
    EXPECT(ds4_dist_plan(&mi, 2, NULL, w, out) == DS4_OK && ranges_are(out, 2, (int[]){0, 2, 2, 8}));
    /* a huge first layer still leaves a layer for every later rank */
    mi = info(4, 1, 0, 0);
    mi.layer_bytes[0] = 1000;
    EXPECT(ds4_dist_plan(&mi, 3, NULL, NULL, out) == DS4_OK && ranges_are(out, 3, (int[]){0, 1, 1, 2, 2, 4}));
    mi.layer_bytes[0] = 1;
    mi.layer_bytes[3] = 1000; /* and a huge last one takes a rank of its own */
    EXPECT(ds4_dist_plan(&mi, 3, NULL, NULL, out) == DS4_OK && ranges_are(out, 3, (int[]){0, 2, 2, 3, 3, 4}));
    /* more ranks than layers */
    mi = info(3, 100, 0, 0);
    EXPECT(ds4_dist_plan(&mi, 4, NULL, NULL, out) == DS4_ERR_INVALID);
    EXPECT(strstr(ds4_last_error(), "4 ranks for a model of 3 layers") != NULL);
}

static void test_ranges_given(void)
{
    ds4_dist_range out[4];
    ds4_dist_model_info mi = info(6, 100, 0, 0);
    ds4_dist_range ok3[3] = {{0, 1}, {1, 5}, {5, 6}};
    EXPECT(ds4_dist_plan(&mi, 3, ok3, NULL, out) == DS4_OK && ranges_are(out, 3, (int[]){0, 1, 1, 5, 5, 6}));
    struct {
        ds4_dist_range r[2];
        const char *msg;
    } bad[] = {
        {{{0, 2}, {3, 6}}, "rank 1 has layers 3:6, but the ranks before it end at layer 2"},
        {{{1, 3}, {3, 6}}, "rank 0 has layers 1:3, but the ranks before it end at layer 0"},
        {{{0, 4}, {2, 6}}, "rank 1 has layers 2:6, but the ranks before it end at layer 4"},
        {{{0, 2}, {2, 4}}, "end at layer 4, the model has 6 layers"},
        {{{0, 2}, {2, 9}}, "rank 1 has layers 2:9, the model has 6 layers"},
        {{{0, 2}, {-1, -1}}, "given to some ranks but not to rank 1"},
        {{{-1, -1}, {0, 6}}, "given to some ranks but not to rank 0"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        EXPECT_MSG(ds4_dist_plan(&mi, 2, bad[i].r, NULL, out) == DS4_ERR_INVALID, "case %zu accepted", i);
        EXPECT_MSG(strstr(ds4_last_error(), bad[i].msg) != NULL, "case %zu: %s", i, ds4_last_error());
    }
}

static void test_model_info(void)
{
    const char *path = "models/ds4-demo.gguf";
    ds4_dist_model_info a, b;
    REQUIRE(ds4_dist_model_info_read(path, &a) == DS4_OK);
    REQUIRE(ds4_dist_model_info_read(path, &b) == DS4_OK);
    EXPECT(a.fingerprint == b.fingerprint && a.fingerprint != 0);
    ds4_gguf *g = ds4_gguf_open(path);
    REQUIRE(g);
    uint64_t total = 0, sum = a.embed_bytes + a.head_bytes;
    for (int64_t i = 0; i < ds4_gguf_n_tensors(g); i++) total += ds4_gguf_tensor_at(g, i)->size;
    for (int i = 0; i < a.n_layer; i++) {
        EXPECT_MSG(a.layer_bytes[i] > 0, "layer %d has no bytes", i);
        sum += a.layer_bytes[i];
    }
    ds4_gguf_close(g);
    EXPECT_MSG(sum == total, "layers + embedding + head = %llu bytes, the tensors %llu", (unsigned long long)sum,
               (unsigned long long)total);
    EXPECT(a.embed_bytes > 0 && a.head_bytes > 0);
    EXPECT(ds4_dist_model_info_read("tests/data/no-such.gguf", &a) != DS4_OK);
    EXPECT(strstr(ds4_last_error(), "no-such.gguf") != NULL);
}

int main(void)
{
    RUN(test_parse_range);
    RUN(test_split_by_bytes);
    RUN(test_ranges_given);
    RUN(test_model_info);
    return test_finish();
}

/*
 * test_expert_slots.c - the slot bookkeeping of the CUDA VRAM expert cache
 * (backend/expert_slots.h), on the host: a hit returns the slot the expert
 * was given, a miss takes an empty slot first, then evicts what the policy
 * names (LRU: the least recently used; FREQ: the fewest uses, counts
 * halved every n_slots misses), never an expert of the current call; the
 * per-layer expert -> slot maps always agree with what each slot holds;
 * a call that needs more distinct experts than there are slots is refused
 * with a message; bad sizes are refused. Expected values are worked out by
 * hand from the policies' definitions (docs/STREAMING.md).
 */
#include "tests/test.h"

#include "backend/expert_slots.h"
#include "include/ds4.h"

#include <stdlib.h>
#include <string.h>

/* Resolve one expert as a call of its own; returns 1 on a hit. */
static int use(ds4_expert_slots *s, int layer, int e, int *ev_layer, int *ev_expert)
{
    ds4_expert_slots_begin(s);
    bool miss;
    int64_t slot = ds4_expert_slots_resolve(s, layer, e, &miss, ev_layer, ev_expert);
    EXPECT(slot >= 0);
    EXPECT(ds4_expert_slots_find(s, layer, e) == slot);
    return !miss;
}

/* Every slot's owner maps back to it; nothing else maps anywhere. */
static int maps_consistent(const ds4_expert_slots *s, int n_layer, int n_expert, int64_t n_slots)
{
    int64_t seen = 0;
    char *used = calloc((size_t)n_slots, 1);
    for (int l = 0; l < n_layer; l++) {
        const int32_t *m = ds4_expert_slots_map(s, l);
        for (int e = 0; e < n_expert; e++) {
            if (m[e] < 0) continue;
            if (m[e] >= n_slots || used[m[e]]) {
                free(used);
                return 0;
            }
            used[m[e]] = 1;
            seen++;
        }
    }
    free(used);
    ds4_expert_slots_stats st;
    ds4_expert_slots_get_stats(s, &st);
    return seen == st.resident;
}

static void test_lru_order(void)
{
    ds4_expert_slots *s = ds4_expert_slots_create(2, 4, 2, DS4_SLOTS_LRU);
    REQUIRE(s);
    int el, ee;
    /* A B A C: C evicts B (least recently used); then B evicts A */
    EXPECT(!use(s, 0, 1, &el, &ee) && el == -1);
    EXPECT(!use(s, 1, 3, &el, &ee) && el == -1);
    EXPECT(use(s, 0, 1, &el, &ee));
    EXPECT(!use(s, 1, 2, &el, &ee) && el == 1 && ee == 3);
    EXPECT(ds4_expert_slots_find(s, 1, 3) == -1);
    EXPECT(!use(s, 1, 3, &el, &ee) && el == 0 && ee == 1);
    ds4_expert_slots_stats st;
    ds4_expert_slots_get_stats(s, &st);
    EXPECT(st.hits == 1 && st.misses == 4 && st.evictions == 2 && st.resident == 2 && st.n_slots == 2);
    EXPECT(maps_consistent(s, 2, 4, 2));
    ds4_expert_slots_free(s);
}

static void test_freq_order_and_aging(void)
{
    ds4_expert_slots *s = ds4_expert_slots_create(1, 8, 2, DS4_SLOTS_FREQ);
    REQUIRE(s);
    int el, ee;
    /* A used 4 times; counts halve at every 2nd miss (before the new
     * expert's own use is counted). */
    EXPECT(!use(s, 0, 0, &el, &ee)); /* A: miss 1, A=1 */
    EXPECT(use(s, 0, 0, &el, &ee));
    EXPECT(use(s, 0, 0, &el, &ee));
    EXPECT(use(s, 0, 0, &el, &ee)); /* A=4 */
    EXPECT(!use(s, 0, 1, &el, &ee) && el == -1); /* B: miss 2, halve: A=2; B=1 */
    EXPECT(!use(s, 0, 2, &el, &ee) && ee == 1);  /* C evicts B (1 < 2); C=1 */
    /* D evicts C, the more recent one: fewer uses than A; miss 4 halves: A=1, D=1 */
    EXPECT(!use(s, 0, 3, &el, &ee) && ee == 2);
    /* aging: A's old uses have faded to D's count, so recency decides: E evicts A */
    EXPECT(!use(s, 0, 4, &el, &ee) && ee == 0);
    EXPECT(maps_consistent(s, 1, 8, 2));
    ds4_expert_slots_free(s);
}

static void test_call_keeps_its_experts(void)
{
    /* 3 slots; a call of 3 distinct experts evicts none of its own, even
     * though its first ones are the least recently used */
    ds4_expert_slots *s = ds4_expert_slots_create(2, 8, 3, DS4_SLOTS_LRU);
    REQUIRE(s);
    int el, ee;
    EXPECT(!use(s, 1, 5, &el, &ee));
    EXPECT(!use(s, 1, 6, &el, &ee));
    EXPECT(!use(s, 1, 7, &el, &ee));
    ds4_expert_slots_begin(s);
    bool miss;
    int64_t a = ds4_expert_slots_resolve(s, 0, 0, &miss, &el, &ee);
    EXPECT(a >= 0 && miss && el == 1 && ee == 5);
    int64_t b = ds4_expert_slots_resolve(s, 0, 1, &miss, &el, &ee);
    EXPECT(b >= 0 && b != a && miss && ee == 6);
    int64_t c = ds4_expert_slots_resolve(s, 0, 0, &miss, &el, &ee); /* again in the same call: a hit */
    EXPECT(c == a && !miss);
    int64_t d = ds4_expert_slots_resolve(s, 0, 2, &miss, &el, &ee);
    EXPECT(d >= 0 && d != a && d != b && ee == 7);
    /* a fourth distinct expert in the same call does not fit */
    EXPECT(ds4_expert_slots_resolve(s, 0, 3, &miss, &el, &ee) == -1);
    EXPECT(strstr(ds4_last_error(), "more than the 3 slots") != NULL);
    EXPECT(ds4_expert_slots_find(s, 0, 0) == a && ds4_expert_slots_find(s, 0, 1) == b);
    /* the next call may evict them again: expert 1 is the least recently
     * used (expert 0 was used again after it) */
    ds4_expert_slots_begin(s);
    EXPECT(ds4_expert_slots_resolve(s, 0, 3, &miss, &el, &ee) == b && miss && el == 0 && ee == 1);
    EXPECT(maps_consistent(s, 2, 8, 3));
    ds4_expert_slots_free(s);
}

/* A random workload against a plain model of the cache: resident set and
 * maps agree after every step, hits + misses = uses, and a cache as large
 * as every expert misses each expert exactly once. */
static void test_random_workload(void)
{
    for (int pol = DS4_SLOTS_LRU; pol <= DS4_SLOTS_FREQ; pol++) {
        const int L = 4, E = 16;
        int64_t sizes[] = {6, 20, L * E};
        for (int z = 0; z < 3; z++) {
            ds4_expert_slots *s = ds4_expert_slots_create(L, E, sizes[z], pol);
            REQUIRE(s);
            uint64_t x = 88172645463325252ull, uses = 0;
            int bad = 0;
            for (int step = 0; step < 2000 && !bad; step++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                const int layer = (int)(x % L);
                int32_t ids[6];
                for (int j = 0; j < 6; j++) {
                    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                    ids[j] = (int32_t)(x % E);
                }
                ds4_expert_slots_begin(s);
                int64_t got[6];
                for (int j = 0; j < 6; j++) {
                    bool miss;
                    int el, ee;
                    got[j] = ds4_expert_slots_resolve(s, layer, ids[j], &miss, &el, &ee);
                    uses++;
                    if (got[j] < 0) bad = 1;
                }
                /* every expert of the call still holds its slot at the end */
                for (int j = 0; j < 6 && !bad; j++)
                    if (ds4_expert_slots_find(s, layer, ids[j]) != got[j]) bad = 2;
                if (!bad && !maps_consistent(s, L, E, sizes[z])) bad = 3;
            }
            EXPECT_MSG(!bad, "policy %d, %lld slots: failure kind %d", pol, (long long)sizes[z], bad);
            ds4_expert_slots_stats st;
            ds4_expert_slots_get_stats(s, &st);
            EXPECT(st.hits + st.misses == uses);
            if (sizes[z] == L * E) EXPECT(st.misses == (uint64_t)(L * E) && st.evictions == 0);
            else EXPECT(st.evictions > 0 && st.resident == sizes[z]);
            ds4_expert_slots_free(s);
        }
    }
}

static void test_distinct_and_bad_values(void)
{
    ds4_expert_slots *s = ds4_expert_slots_create(2, 8, 4, DS4_SLOTS_FREQ);
    REQUIRE(s);
    const int32_t ids[] = {3, 1, 3, 7, -1, 8, 1, 0};
    EXPECT(ds4_expert_slots_distinct(s, ids, 8) == 4); /* 3 1 7 0; -1 and 8 out of range */
    EXPECT(ds4_expert_slots_distinct(s, ids, 8) == 4); /* scratch is cleared */
    bool miss;
    int el, ee;
    EXPECT(ds4_expert_slots_resolve(s, 0, 8, &miss, &el, &ee) == -1);
    EXPECT(strstr(ds4_last_error(), "out of range") != NULL);
    EXPECT(ds4_expert_slots_resolve(s, 2, 0, &miss, &el, &ee) == -1);
    EXPECT(ds4_expert_slots_find(s, -1, 0) == -1);
    ds4_expert_slots_free(s);
    EXPECT(ds4_expert_slots_create(2, 8, 0, DS4_SLOTS_LRU) == NULL);
    EXPECT(strstr(ds4_last_error(), "0 slots") != NULL);
    EXPECT(ds4_expert_slots_create(2, 8, 17, DS4_SLOTS_LRU) == NULL);
    EXPECT(ds4_expert_slots_create(2, 8, 4, 7) == NULL);
    EXPECT(strstr(ds4_last_error(), "policy 7") != NULL);
}

int main(void)
{
    RUN(test_lru_order);
    RUN(test_freq_order_and_aging);
    RUN(test_call_keeps_its_experts);
    RUN(test_random_workload);
    RUN(test_distinct_and_bad_values);
    return test_finish();
}

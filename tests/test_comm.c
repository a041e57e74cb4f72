/*
 * test_comm.c - the in-process communicator of tensor parallel runs
 * (backend/comm.h): all-reduce, all-gather, gather, broadcast and barrier over 1,
 * 2, 3 and 4 ranks, each rank a thread. The expected values are computed
 * here from the formula each rank's input is made with: the all-reduce
 * must give the float sum taken in rank order (the contract that makes
 * runs reproducible), the same bits on every rank, over many rounds of
 * changing sizes (odd ones that do not divide by the rank count).
 */
#include "backend/comm.h"
#include "backend/ops.h"
#include "tests/test.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define ROUNDS 40

typedef struct {
    ds4_comm *c;
    int bad_sum, bad_gather, bad_bcast, bad_barrier;
} rank_ctx;

static atomic_int arrived;

/* Rank r's element i in round k: not exactly representable sums, so the
 * order of the additions shows in the result. */
static float input(int k, int r, size_t i) { return 0.1f * (float)(r + 1) + 1e-3f * (float)i + 0.37f * (float)k; }

static size_t round_n(int k) { return (size_t)(1 + 97 * k % 1001); }

static void *rank_main(void *arg)
{
    rank_ctx *x = arg;
    ds4_comm *c = x->c;
    int R = c->size;
    float *buf = malloc(1001 * sizeof(float)), *all = malloc((size_t)R * 1001 * sizeof(float));
    for (int k = 0; k < ROUNDS; k++) {
        size_t n = round_n(k);
        for (size_t i = 0; i < n; i++) buf[i] = input(k, c->rank, i);
        c->allreduce_sum_f32(c, buf, n);
        for (size_t i = 0; i < n; i++) {
            float want = input(k, 0, i);
            for (int r = 1; r < R; r++) want += input(k, r, i);
            if (memcmp(&want, &buf[i], sizeof want)) x->bad_sum++;
        }
        for (size_t i = 0; i < n; i++) buf[i] = input(k, c->rank, i);
        c->allgather_f32(c, buf, n, all);
        for (int r = 0; r < R; r++)
            for (size_t i = 0; i < n; i++)
                if (all[(size_t)r * n + i] != input(k, r, i)) x->bad_gather++;
        int root = k % R;
        for (size_t i = 0; i < (size_t)R * n; i++) all[i] = -2.0f;
        c->gather_f32(c, buf, n, c->rank == root ? all : NULL, root);
        for (int r = 0; r < R && c->rank == root; r++)
            for (size_t i = 0; i < n; i++)
                if (all[(size_t)r * n + i] != input(k, r, i)) x->bad_gather++;
        for (size_t i = 0; i < (size_t)R * n && c->rank != root; i++)
            if (all[i] != -2.0f) x->bad_gather++; /* a gather writes the root's buffer only */
        for (size_t i = 0; i < n; i++) buf[i] = c->rank == root ? input(k, root, i) : -1.0f;
        c->broadcast(c, buf, n * sizeof(float), root);
        for (size_t i = 0; i < n; i++)
            if (buf[i] != input(k, root, i)) x->bad_bcast++;
        /* after the barrier every rank has counted this round */
        atomic_fetch_add(&arrived, 1);
        c->barrier(c);
        if (atomic_load(&arrived) < (k + 1) * R) x->bad_barrier++;
        c->barrier(c); /* nobody counts the next round before all checked */
    }
    free(buf);
    free(all);
    return NULL;
}

/* staged: the same group through each rank's backend copies (CPU here) */
static void run_group_on(int R, bool staged)
{
    ds4_comm *eps[4];
    ds4_backend *be[4] = {0};
    if (staged) {
        for (int r = 0; r < R; r++) REQUIRE((be[r] = ds4_backend_cpu_create(1)) != NULL);
        REQUIRE(ds4_comm_staged_create(R, be, eps) == DS4_OK);
    } else {
        REQUIRE(ds4_comm_local_create(R, eps) == DS4_OK);
    }
    atomic_store(&arrived, 0);
    rank_ctx ctx[4];
    pthread_t th[4];
    for (int r = 0; r < R; r++) {
        memset(&ctx[r], 0, sizeof ctx[r]);
        ctx[r].c = eps[r];
        EXPECT(eps[r]->rank == r && eps[r]->size == R);
    }
    for (int r = 1; r < R; r++) pthread_create(&th[r], NULL, rank_main, &ctx[r]);
    rank_main(&ctx[0]);
    for (int r = 1; r < R; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < R; r++) {
        EXPECT_MSG(!ctx[r].bad_sum, "%d ranks, rank %d: %d all-reduce sums differ from the rank-order sum", R, r,
                   ctx[r].bad_sum);
        EXPECT_MSG(!ctx[r].bad_gather, "%d ranks, rank %d: %d gathered values wrong", R, r, ctx[r].bad_gather);
        EXPECT_MSG(!ctx[r].bad_bcast, "%d ranks, rank %d: %d broadcast values wrong", R, r, ctx[r].bad_bcast);
        EXPECT_MSG(!ctx[r].bad_barrier, "%d ranks, rank %d: left a barrier before every rank arrived", R, r);
        EXPECT(eps[r]->status(eps[r]) == DS4_OK);
    }
    if (staged) {
        ds4_comm_staged_free(eps, R);
        for (int r = 0; r < R; r++) be[r]->destroy(be[r]);
    } else {
        ds4_comm_local_free(eps, R);
    }
}

static void run_group(int R) { run_group_on(R, false); }
static void test_staged_three_ranks(void) { run_group_on(3, true); }

static void test_one_rank(void) { run_group(1); }
static void test_two_ranks(void) { run_group(2); }
static void test_three_ranks(void) { run_group(3); }
static void test_four_ranks(void) { run_group(4); }

static void test_bad_size(void)
{
    ds4_comm *eps[1];
    EXPECT(ds4_comm_local_create(0, eps) == DS4_ERR_INVALID);
    EXPECT(ds4_comm_local_create(DS4_COMM_MAX_RANKS + 1, eps) == DS4_ERR_INVALID);
}

int main(void)
{
    RUN(test_one_rank);
    RUN(test_two_ranks);
    RUN(test_three_ranks);
    RUN(test_four_ranks);
    RUN(test_staged_three_ranks);
    RUN(test_bad_size);
    return test_finish();
}

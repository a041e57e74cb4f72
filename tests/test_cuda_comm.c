/*
 * test_cuda_comm.c - the NCCL communicator of CUDA ranks
 * (backend/cuda/cuda_comm.h) on the GPUs of this machine, one rank per
 * GPU (up to 4), each a thread with its own CUDA backend; buffers are the
 * backends' device memory and the collectives run on their streams. The
 * expected values are computed here from the formula each rank's input is
 * made with: the all-reduce equals the sum within 1e-6 (NCCL's order is
 * not rank order) and is the same bits on every rank; gather, all-gather
 * and broadcast are exact. With one GPU this is a one-rank communicator
 * (the collectives as copies) plus the refusal of two ranks on one device.
 * Skipped without a CUDA build, a GPU or libnccl.so.2, saying which.
 */
#include "include/ds4.h"
#include "tests/test.h"

#if DS4_HAVE_CUDA
#include "backend/cuda/cuda_api.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_comm.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MAXR 4
#define NMAX 4097

typedef struct {
    ds4_backend *be;
    ds4_comm *c;
    int bad_sum, bad_same, bad_gather, bad_bcast;
    float *sum_out; /* host copy of the all-reduce result, compared across ranks */
} rank_ctx;

static float input(int k, int r, size_t i) { return 0.1f * (float)(r + 1) + 1e-3f * (float)i + 0.37f * (float)k; }

static void *rank_main(void *p)
{
    rank_ctx *x = p;
    ds4_backend *be = x->be;
    ds4_comm *c = x->c;
    int R = c->size;
    float *h = malloc((size_t)R * NMAX * sizeof(float));
    float *d = be->alloc(be, NMAX * sizeof(float)), *dall = be->alloc(be, (size_t)R * NMAX * sizeof(float));
    if (!h || !d || !dall) {
        x->bad_sum = -1;
        return NULL;
    }
    for (int k = 0; k < 6; k++) {
        size_t n = (size_t)(1 + 811 * k % NMAX);
        for (size_t i = 0; i < n; i++) h[i] = input(k, c->rank, i);
        be->upload(be, d, h, n * sizeof(float));
        c->allreduce_sum_f32(c, d, n);
        be->download(be, h, d, n * sizeof(float));
        for (size_t i = 0; i < n; i++) {
            double want = 0;
            for (int r = 0; r < R; r++) want += input(k, r, i);
            if (fabs(h[i] - want) > 1e-6 * fabs(want) + 1e-7) x->bad_sum++;
        }
        if (k == 5) memcpy(x->sum_out, h, n * sizeof(float));
        for (size_t i = 0; i < n; i++) h[i] = input(k, c->rank, i);
        be->upload(be, d, h, n * sizeof(float));
        c->allgather_f32(c, d, n, dall);
        be->download(be, h, dall, (size_t)R * n * sizeof(float));
        for (int r = 0; r < R; r++)
            for (size_t i = 0; i < n; i++)
                if (h[(size_t)r * n + i] != input(k, r, i)) x->bad_gather++;
        int root = k % R;
        for (size_t i = 0; i < n; i++) h[i] = input(k, c->rank, i);
        be->upload(be, d, h, n * sizeof(float));
        c->gather_f32(c, d, n, c->rank == root ? dall : NULL, root);
        if (c->rank == root) {
            be->download(be, h, dall, (size_t)R * n * sizeof(float));
            for (int r = 0; r < R; r++)
                for (size_t i = 0; i < n; i++)
                    if (h[(size_t)r * n + i] != input(k, r, i)) x->bad_gather++;
        }
        for (size_t i = 0; i < n; i++) h[i] = c->rank == root ? input(k, root, i) : -1.0f;
        be->upload(be, d, h, n * sizeof(float));
        c->broadcast(c, d, n * sizeof(float), root);
        be->download(be, h, d, n * sizeof(float));
        for (size_t i = 0; i < n; i++)
            if (h[i] != input(k, root, i)) x->bad_bcast++;
        c->barrier(c);
    }
    be->free(be, d);
    be->free(be, dall);
    free(h);
    return NULL;
}

static void test_nccl_ranks(void)
{
    int ndev = ds4_cuda_device_count();
    if (ndev <= 0) {
        test_skip("no CUDA device");
        return;
    }
    if (!ds4_comm_nccl_built()) {
        test_skip("this build found no nccl.h");
        return;
    }
    int R = ndev < MAXR ? ndev : MAXR;
    ds4_backend *be[MAXR] = {0};
    for (int r = 0; r < R; r++) REQUIRE((be[r] = ds4_backend_cuda_create(r)) != NULL);
    ds4_comm *eps[MAXR];
    ds4_status st = ds4_comm_nccl_create(R, be, eps);
    if (st == DS4_ERR_UNSUPPORTED) {
        test_skip("%s", ds4_last_error());
        for (int r = 0; r < R; r++) be[r]->destroy(be[r]);
        return;
    }
    REQUIRE(st == DS4_OK);
    rank_ctx ctx[MAXR];
    pthread_t th[MAXR];
    for (int r = 0; r < R; r++) {
        memset(&ctx[r], 0, sizeof ctx[r]);
        ctx[r].be = be[r];
        ctx[r].c = eps[r];
        ctx[r].sum_out = calloc(NMAX, sizeof(float));
    }
    for (int r = 0; r < R; r++) pthread_create(&th[r], NULL, rank_main, &ctx[r]);
    for (int r = 0; r < R; r++) pthread_join(th[r], NULL);
    printf("    %d rank(s), one per GPU\n", R);
    for (int r = 0; r < R; r++) {
        EXPECT_MSG(ctx[r].bad_sum == 0, "rank %d: %d all-reduce sums wrong", r, ctx[r].bad_sum);
        EXPECT_MSG(ctx[r].bad_gather == 0, "rank %d: %d gathered values wrong", r, ctx[r].bad_gather);
        EXPECT_MSG(ctx[r].bad_bcast == 0, "rank %d: %d broadcast values wrong", r, ctx[r].bad_bcast);
        EXPECT_MSG(!memcmp(ctx[r].sum_out, ctx[0].sum_out, NMAX * sizeof(float)),
                   "rank %d's all-reduce result differs from rank 0's", r);
        EXPECT_MSG(eps[r]->status(eps[r]) == DS4_OK, "rank %d: %s", r, ds4_last_error());
        free(ctx[r].sum_out);
    }
    ds4_comm_nccl_free(eps, R);
    for (int r = 0; r < R; r++) be[r]->destroy(be[r]);
}

/* NCCL takes one rank per GPU: two backends on device 0 are refused. */
static void test_two_ranks_one_device_refused(void)
{
    if (ds4_cuda_device_count() <= 0) {
        test_skip("no CUDA device");
        return;
    }
    ds4_backend *be[2] = {ds4_backend_cuda_create(0), ds4_backend_cuda_create(0)};
    REQUIRE(be[0] && be[1]);
    ds4_comm *eps[2];
    ds4_status st = ds4_comm_nccl_create(2, be, eps);
    printf("    refused: %s\n", ds4_last_error());
    EXPECT(st == DS4_ERR_UNSUPPORTED && eps[0] == NULL && eps[1] == NULL);
    be[0]->destroy(be[0]);
    be[1]->destroy(be[1]);
}

int main(void)
{
    RUN(test_nccl_ranks);
    RUN(test_two_ranks_one_device_refused);
    return test_finish();
}
#else
int main(void) { return test_skip_all_no_cuda(); }
#endif

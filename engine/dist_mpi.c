/*
 * dist_mpi.c - byte messages between ranks over MPI (dist_mpi.h).
 *
 * MPI counts are ints, so a message above PIECE bytes (a snapshot's share
 * of a long context) goes as a 16-byte announcement ("DS4BIG", u64
 * length) followed by pieces with the same tag; no other message of the
 * protocol is 16 bytes long, so the receiver cannot mistake one.
 */
#include "engine/dist_mpi.h"

#include "util/error.h"

#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PIECE ((size_t)1 << 30)

/* Open MPI's blocking calls poll the network in a busy loop: a rank
 * waiting for its next chunk (or rank 0 waiting for the logits) would hold
 * a whole core, which the ranks sharing a machine need for computing. So
 * a wait polls without pause for its first 100 us (a message on its
 * way, or the fragments of one being copied, need the poll to progress),
 * then sleeps 50 us between polls. DS4_DIST_SPIN=1 never sleeps: for ranks
 * that each have their machine or GPU to themselves. */
static long elapsed_us(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) * 1000000L + (t.tv_nsec - t0->tv_nsec) / 1000;
}

static void idle_wait(int *round, struct timespec *t0)
{
    static int spin = -1;
    if (spin < 0) spin = getenv("DS4_DIST_SPIN") && atoi(getenv("DS4_DIST_SPIN")) == 1;
    if ((*round)++ == 0) clock_gettime(CLOCK_MONOTONIC, t0);
    if (spin || elapsed_us(t0) < 100) return;
    struct timespec ts = {0, 50 * 1000};
    nanosleep(&ts, NULL);
}

static const char BIG_MAGIC[8] = "DS4BIG";

struct ds4_mpi_req {
    MPI_Request r;
};

static ds4_status mpi_fail(int rc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(rc, msg, &n);
    return ds4_fail(DS4_ERR_BACKEND, "distributed: %s: %s", what, msg);
}

bool ds4_mpi_launched(void)
{
    /* Open MPI's mpirun, PMIx launchers (srun, prterun), MPICH's hydra */
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

ds4_status ds4_mpi_init(void)
{
    int provided = 0;
    /* the engine's calls may come from different threads (the server's
     * worker), never at the same time (dist_front.c holds a lock) */
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Init_thread");
    /* errors come back as values, so a failure is reported with its cause */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (provided < MPI_THREAD_SERIALIZED)
        return ds4_fail(DS4_ERR_BACKEND, "distributed: this MPI gives thread level %d, at least SERIALIZED (%d) is needed",
                        provided, MPI_THREAD_SERIALIZED);
    return DS4_OK;
}

void ds4_mpi_finalize(void)
{
    int done = 0;
    MPI_Finalized(&done);
    if (!done) MPI_Finalize();
}

int ds4_mpi_rank(void)
{
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

int ds4_mpi_size(void)
{
    int n = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

int ds4_mpi_local_rank(void)
{
    const char *v = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (!v) v = getenv("MPI_LOCALRANKID");
    if (!v) v = getenv("SLURM_LOCALID");
    return v ? atoi(v) : 0;
}

void ds4_mpi_abort(int code) { MPI_Abort(MPI_COMM_WORLD, code); }

/* A send that waits politely: a large message waits for the receiver to
 * post its receive (it may be computing the chunk before), and MPI_Send
 * would spin a core for all that time. */
static int send_piece(const void *buf, int n, int to, int tag)
{
    MPI_Request r;
    int rc = MPI_Isend(buf, n, MPI_BYTE, to, tag, MPI_COMM_WORLD, &r);
    struct timespec t0;
    for (int round = 0, done = 0; rc == MPI_SUCCESS && !done; idle_wait(&round, &t0)) {
        rc = MPI_Test(&r, &done, MPI_STATUS_IGNORE);
        if (done) break;
    }
    return rc;
}

ds4_status ds4_mpi_send(const void *buf, size_t n, int to, int tag)
{
    int rc;
    if (n <= PIECE) {
        rc = send_piece(buf, (int)n, to, tag);
        return rc == MPI_SUCCESS ? DS4_OK : mpi_fail(rc, "send");
    }
    uint8_t ann[16];
    uint64_t len = n;
    memcpy(ann, BIG_MAGIC, 8);
    memcpy(ann + 8, &len, 8);
    rc = send_piece(ann, 16, to, tag);
    for (size_t at = 0; rc == MPI_SUCCESS && at < n; at += PIECE) {
        size_t k = n - at < PIECE ? n - at : PIECE;
        rc = send_piece((const uint8_t *)buf + at, (int)k, to, tag);
    }
    return rc == MPI_SUCCESS ? DS4_OK : mpi_fail(rc, "send");
}

static ds4_status grow(void **buf, size_t *cap, size_t n)
{
    if (n <= *cap && *buf) return DS4_OK;
    void *p = realloc(*buf, n ? n : 1);
    if (!p) return ds4_fail(DS4_ERR_NOMEM, "distributed: cannot allocate %zu bytes for a message", n);
    *buf = p;
    *cap = n ? n : 1;
    return DS4_OK;
}

ds4_status ds4_mpi_recv(int from, int tag, void **buf, size_t *cap, size_t *len, int *src, int *tag_out)
{
    MPI_Status s;
    int rc, found = 0;
    struct timespec t0;
    for (int round = 0; !found; idle_wait(&round, &t0)) {
        rc = MPI_Iprobe(from < 0 ? MPI_ANY_SOURCE : from, tag < 0 ? MPI_ANY_TAG : tag, MPI_COMM_WORLD, &found, &s);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "probe");
        if (found) break;
    }
    int count = 0;
    MPI_Get_count(&s, MPI_BYTE, &count);
    ds4_status st = grow(buf, cap, (size_t)count);
    if (st != DS4_OK) return st;
    rc = MPI_Recv(*buf, count, MPI_BYTE, s.MPI_SOURCE, s.MPI_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "receive");
    if (src) *src = s.MPI_SOURCE;
    if (tag_out) *tag_out = s.MPI_TAG;
    *len = (size_t)count;
    if (count == 16 && memcmp(*buf, BIG_MAGIC, 8) == 0) {
        uint64_t n;
        memcpy(&n, (uint8_t *)*buf + 8, 8);
        if ((st = grow(buf, cap, (size_t)n)) != DS4_OK) return st;
        for (size_t at = 0; at < n; at += PIECE) {
            size_t k = n - at < PIECE ? n - at : PIECE;
            rc = MPI_Recv((uint8_t *)*buf + at, (int)k, MPI_BYTE, s.MPI_SOURCE, s.MPI_TAG, MPI_COMM_WORLD,
                          MPI_STATUS_IGNORE);
            if (rc != MPI_SUCCESS) return mpi_fail(rc, "receive");
        }
        *len = (size_t)n;
    }
    return DS4_OK;
}

ds4_mpi_req *ds4_mpi_irecv(void *buf, size_t cap, int from, int tag)
{
    ds4_mpi_req *r = malloc(sizeof *r);
    if (!r) {
        ds4_fail(DS4_ERR_NOMEM, "distributed: out of memory");
        return NULL;
    }
    int rc = MPI_Irecv(buf, (int)(cap < PIECE ? cap : PIECE), MPI_BYTE, from, tag, MPI_COMM_WORLD, &r->r);
    if (rc != MPI_SUCCESS) {
        free(r);
        mpi_fail(rc, "post a receive");
        return NULL;
    }
    return r;
}

ds4_status ds4_mpi_wait(ds4_mpi_req *r, size_t *len)
{
    MPI_Status s;
    int rc, done = 0;
    struct timespec t0;
    for (int round = 0; !done; idle_wait(&round, &t0)) {
        rc = MPI_Test(&r->r, &done, &s);
        if (rc != MPI_SUCCESS) {
            free(r);
            return mpi_fail(rc, "wait");
        }
        if (done) break;
    }
    free(r);
    int count = 0;
    MPI_Get_count(&s, MPI_BYTE, &count);
    *len = (size_t)count;
    return DS4_OK;
}

ds4_status ds4_mpi_gather(const void *mine, size_t n, void *all)
{
    int rc = MPI_Gather(mine, (int)n, MPI_BYTE, all, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? DS4_OK : mpi_fail(rc, "gather");
}

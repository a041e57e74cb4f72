/*
 * dist_mpi.h - the message transport of distributed runs
 * (docs/DISTRIBUTED.md) over MPI; the only file that includes mpi.h is
 * dist_mpi.c, so the rest of the engine sees byte messages and ranks.
 *
 * Every call returns DS4_ERR_BACKEND with the MPI error string when MPI
 * reports a failure (a peer that dies usually makes mpirun end the whole
 * job instead, naming the rank).
 */
#ifndef DS4_ENGINE_DIST_MPI_H
#define DS4_ENGINE_DIST_MPI_H

#include "include/ds4.h"

#include <stdbool.h>
#include <stddef.h>

/* Whether this process was started by an MPI launcher (mpirun, srun with
 * PMIx): its environment says so. A plain run never initialises MPI. */
bool ds4_mpi_launched(void);
ds4_status ds4_mpi_init(void);
void ds4_mpi_finalize(void);
int ds4_mpi_rank(void);
int ds4_mpi_size(void);
/* The rank among the processes of this host (OMPI_COMM_WORLD_LOCAL_RANK
 * or the launcher's equivalent; 0 when unknown). */
int ds4_mpi_local_rank(void);
/* Ends every rank of the job (after a fatal error on one). */
void ds4_mpi_abort(int code);

/* Blocking send of n bytes (any size; large buffers go in pieces). */
ds4_status ds4_mpi_send(const void *buf, size_t n, int to, int tag);
/* The next message from `from` (-1: any rank) with `tag` (-1: any tag),
 * in *buf (grown with realloc; *cap its size); *len, *src, *tag_out:
 * what came (src/tag_out may be NULL). */
ds4_status ds4_mpi_recv(int from, int tag, void **buf, size_t *cap, size_t *len, int *src, int *tag_out);

/* A receive posted ahead (rank 0 posts the replies of the chunks it sends
 * into the pipeline before sending, so the last stage never waits on it). */
typedef struct ds4_mpi_req ds4_mpi_req;
ds4_mpi_req *ds4_mpi_irecv(void *buf, size_t cap, int from, int tag);
/* Waits and frees r; *len: the bytes received. */
ds4_status ds4_mpi_wait(ds4_mpi_req *r, size_t *len);

/* Every rank's n bytes at rank 0 (all: size() * n bytes there). Collective. */
ds4_status ds4_mpi_gather(const void *mine, size_t n, void *all);

#endif

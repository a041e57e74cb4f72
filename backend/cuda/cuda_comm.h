/*
 * cuda_comm.h - the NCCL implementation of the tensor-parallel
 * communicator (backend/comm.h) for CUDA ranks: one rank per GPU, the
 * collectives queued on each rank's backend stream, so they are ordered
 * with the rank's ops without a host wait.
 *
 * NCCL is loaded at run time (dlopen of libnccl.so.2), not linked: the
 * binaries keep starting on a machine without it, and only a tensor
 * parallel CUDA run needs it. The build needs nccl.h for the types (the
 * CUDA toolkit's include directory, or /usr/include: libnccl-dev); a
 * build without it compiles this file to a stub that says so.
 *
 * The sum order of an NCCL all-reduce is its own (ring or tree), not
 * rank order; every rank still receives the same bits.
 */
#ifndef DS4_BACKEND_CUDA_COMM_H
#define DS4_BACKEND_CUDA_COMM_H

#include "backend/comm.h"
#include "backend/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One endpoint per rank r on CUDA backend be[r] (each on its own device;
 * NCCL refuses two ranks on one device). eps[r] then belongs to the
 * thread that runs rank r. DS4_ERR_UNSUPPORTED (message) when this build
 * has no nccl.h or libnccl.so.2 cannot be loaded. */
ds4_status ds4_comm_nccl_create(int size, ds4_backend *const *be, ds4_comm **eps);
void ds4_comm_nccl_free(ds4_comm **eps, int size);
/* Whether this build was compiled with nccl.h. */
int ds4_comm_nccl_built(void);
/* Make be's device the calling thread's current device (a rank's thread
 * launches its backend's work; a backend sets its device when it is made
 * and when it allocates, not on every launch). be: a CUDA backend. */
void ds4_cuda_bind_thread(ds4_backend *be);

#ifdef __cplusplus
}
#endif

#endif

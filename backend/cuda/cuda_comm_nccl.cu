/*
 * cuda_comm_nccl.cu - the communicator of backend/comm.h over NCCL
 * (cuda_comm.h). All communicators are made at once by one thread
 * (ncclCommInitAll over the ranks' devices); afterwards each rank's thread
 * calls its endpoint, which queues the collective on that rank's backend
 * stream. gather is a group of point-to-point receives on the root and
 * one send on every other rank; barrier is a one-float all-reduce followed
 * by a wait on the stream.
 */
#include "backend/cuda/cuda_comm.h"

#include "backend/cuda/cuda_backend.cuh"
#include "util/error.h"

#include <stdlib.h>
#include <string.h>

extern "C" void ds4_cuda_bind_thread(ds4_backend *be) { cudaSetDevice(cb_of(be)->cu->device); }

#if __has_include(<nccl.h>)
#include <dlfcn.h>
#include <nccl.h>

/* The NCCL entry points, resolved from libnccl.so.2 once. */
static struct {
    int tried, ok;
    decltype(&ncclCommInitAll) init_all;
    decltype(&ncclCommDestroy) destroy;
    decltype(&ncclAllReduce) all_reduce;
    decltype(&ncclAllGather) all_gather;
    decltype(&ncclBroadcast) broadcast;
    decltype(&ncclSend) send;
    decltype(&ncclRecv) recv;
    decltype(&ncclGroupStart) group_start;
    decltype(&ncclGroupEnd) group_end;
    decltype(&ncclGetErrorString) error_string;
} N;

static ds4_status load_nccl(void)
{
    if (N.tried) return N.ok ? DS4_OK : ds4_fail(DS4_ERR_UNSUPPORTED, "nccl: libnccl.so.2 could not be loaded");
    N.tried = 1;
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) return ds4_fail(DS4_ERR_UNSUPPORTED, "nccl: cannot load libnccl.so.2 (%s)", dlerror());
#define NCCL_SYM(field, name)                                                                       \
    if (!(N.field = (decltype(N.field))dlsym(h, #name)))                                            \
        return ds4_fail(DS4_ERR_UNSUPPORTED, "nccl: libnccl.so.2 has no %s", #name);
    NCCL_SYM(init_all, ncclCommInitAll)
    NCCL_SYM(destroy, ncclCommDestroy)
    NCCL_SYM(all_reduce, ncclAllReduce)
    NCCL_SYM(all_gather, ncclAllGather)
    NCCL_SYM(broadcast, ncclBroadcast)
    NCCL_SYM(send, ncclSend)
    NCCL_SYM(recv, ncclRecv)
    NCCL_SYM(group_start, ncclGroupStart)
    NCCL_SYM(group_end, ncclGroupEnd)
    NCCL_SYM(error_string, ncclGetErrorString)
#undef NCCL_SYM
    N.ok = 1;
    return DS4_OK;
}

typedef struct {
    ds4_comm pub; /* first: the endpoint is its ds4_comm */
    ncclComm_t comm;
    int device;
    cudaStream_t stream;
    float *one; /* device float for the barrier */
    ds4_status st;
} nccl_ep;

static nccl_ep *ep_of(ds4_comm *c) { return (nccl_ep *)c; }

/* The first failure is kept; later collectives on the endpoint do nothing. */
static bool check(nccl_ep *e, ncclResult_t r, const char *what)
{
    if (r == ncclSuccess) return true;
    if (e->st == DS4_OK)
        e->st = ds4_fail(DS4_ERR_BACKEND, "nccl: %s on rank %d (device %d): %s", what, e->pub.rank, e->device,
                         N.error_string(r));
    return false;
}

static void nccl_allreduce(ds4_comm *c, float *x, size_t n)
{
    nccl_ep *e = ep_of(c);
    if (e->st != DS4_OK || n == 0) return;
    cudaSetDevice(e->device);
    check(e, N.all_reduce(x, x, n, ncclFloat, ncclSum, e->comm, e->stream), "all-reduce");
}

static void nccl_allgather(ds4_comm *c, const float *send, size_t n, float *recv)
{
    nccl_ep *e = ep_of(c);
    if (e->st != DS4_OK || n == 0) return;
    cudaSetDevice(e->device);
    check(e, N.all_gather(send, recv, n, ncclFloat, e->comm, e->stream), "all-gather");
}

static void nccl_gather(ds4_comm *c, const float *send, size_t n, float *recv, int root)
{
    nccl_ep *e = ep_of(c);
    if (e->st != DS4_OK || n == 0) return;
    cudaSetDevice(e->device);
    if (c->rank != root) {
        check(e, N.send(send, n, ncclFloat, root, e->comm, e->stream), "gather (send)");
        return;
    }
    if (cudaMemcpyAsync(recv + (size_t)root * n, send, n * sizeof(float), cudaMemcpyDeviceToDevice, e->stream) !=
        cudaSuccess) {
        cudaGetLastError();
        if (e->st == DS4_OK) e->st = ds4_fail(DS4_ERR_BACKEND, "nccl: gather: device copy failed on rank %d", root);
        return;
    }
    if (!check(e, N.group_start(), "gather (group)")) return;
    for (int r = 0; r < c->size; r++)
        if (r != root) check(e, N.recv(recv + (size_t)r * n, n, ncclFloat, r, e->comm, e->stream), "gather (recv)");
    check(e, N.group_end(), "gather (group end)");
}

static void nccl_broadcast(ds4_comm *c, void *buf, size_t bytes, int root)
{
    nccl_ep *e = ep_of(c);
    if (e->st != DS4_OK || bytes == 0) return;
    cudaSetDevice(e->device);
    check(e, N.broadcast(buf, buf, bytes, ncclChar, root, e->comm, e->stream), "broadcast");
}

static void nccl_barrier(ds4_comm *c)
{
    nccl_ep *e = ep_of(c);
    if (e->st != DS4_OK) return;
    cudaSetDevice(e->device);
    if (check(e, N.all_reduce(e->one, e->one, 1, ncclFloat, ncclSum, e->comm, e->stream), "barrier"))
        cudaStreamSynchronize(e->stream);
}

static ds4_status nccl_status(ds4_comm *c) { return ep_of(c)->st; }

extern "C" int ds4_comm_nccl_built(void) { return 1; }

extern "C" ds4_status ds4_comm_nccl_create(int size, ds4_backend *const *be, ds4_comm **eps)
{
    if (size < 1 || size > DS4_COMM_MAX_RANKS)
        return ds4_fail(DS4_ERR_INVALID, "nccl: %d ranks (1..%d allowed)", size, DS4_COMM_MAX_RANKS);
    for (int r = 0; r < size; r++) eps[r] = NULL;
    int dev[DS4_COMM_MAX_RANKS];
    for (int r = 0; r < size; r++) {
        if (!be[r] || strcmp(be[r]->name, "cuda") != 0)
            return ds4_fail(DS4_ERR_INVALID, "nccl: rank %d is not on a CUDA backend", r);
        dev[r] = cb_of(be[r])->cu->device;
        for (int k = 0; k < r; k++)
            if (dev[k] == dev[r])
                return ds4_fail(DS4_ERR_UNSUPPORTED, "nccl: ranks %d and %d are both on device %d (NCCL takes one "
                                                     "rank per GPU)", k, r, dev[r]);
    }
    ds4_status st = load_nccl();
    if (st != DS4_OK) return st;
    ncclComm_t comms[DS4_COMM_MAX_RANKS];
    ncclResult_t rc = N.init_all(comms, size, dev);
    if (rc != ncclSuccess)
        return ds4_fail(DS4_ERR_BACKEND, "nccl: communicator set-up over %d devices failed: %s", size,
                        N.error_string(rc));
    for (int r = 0; r < size && st == DS4_OK; r++) {
        nccl_ep *e = (nccl_ep *)calloc(1, sizeof *e);
        if (!e) {
            st = ds4_fail(DS4_ERR_NOMEM, "nccl: out of memory");
            break;
        }
        e->comm = comms[r];
        e->device = dev[r];
        e->stream = cb_stream(be[r]);
        cudaSetDevice(dev[r]);
        if (cudaMalloc((void **)&e->one, sizeof(float)) != cudaSuccess) {
            cudaGetLastError();
            st = ds4_fail(DS4_ERR_NOMEM, "nccl: cannot allocate the barrier's float on device %d", dev[r]);
        }
        e->pub.rank = r;
        e->pub.size = size;
        e->pub.allreduce_sum_f32 = nccl_allreduce;
        e->pub.allgather_f32 = nccl_allgather;
        e->pub.gather_f32 = nccl_gather;
        e->pub.broadcast = nccl_broadcast;
        e->pub.barrier = nccl_barrier;
        e->pub.status = nccl_status;
        eps[r] = &e->pub;
    }
    if (st != DS4_OK) {
        for (int r = 0; r < size; r++)
            if (!eps[r]) N.destroy(comms[r]);
        ds4_comm_nccl_free(eps, size);
    }
    return st;
}

extern "C" void ds4_comm_nccl_free(ds4_comm **eps, int size)
{
    for (int r = 0; r < size; r++) {
        if (!eps[r]) continue;
        nccl_ep *e = ep_of(eps[r]);
        cudaSetDevice(e->device);
        cudaStreamSynchronize(e->stream);
        if (e->one) cudaFree(e->one);
        N.destroy(e->comm);
        free(e);
        eps[r] = NULL;
    }
}

#else /* no nccl.h at build time */

extern "C" int ds4_comm_nccl_built(void) { return 0; }

extern "C" ds4_status ds4_comm_nccl_create(int size, ds4_backend *const *be, ds4_comm **eps)
{
    (void)be;
    for (int r = 0; r < size && r < DS4_COMM_MAX_RANKS; r++) eps[r] = NULL;
    return ds4_fail(DS4_ERR_UNSUPPORTED, "nccl: this build found no nccl.h (the CUDA toolkit's include directory or "
                                         "libnccl-dev), so CUDA ranks have no communicator");
}

extern "C" void ds4_comm_nccl_free(ds4_comm **eps, int size)
{
    (void)eps;
    (void)size;
}

#endif

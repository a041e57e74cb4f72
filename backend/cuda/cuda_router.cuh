/*
 * cuda_router.cuh - one token's MoE router of Flash's shape (256 experts,
 * F16 gate rows of 4096) in one kernel: the gate matvec and the routing of
 * ops.h moe_route (cuda_router.cu). cuda_ops_moe.cu offers it as the
 * router op.
 */
#ifndef DS4_CUDA_ROUTER_CUH
#define DS4_CUDA_ROUTER_CUH

#include "backend/cuda/cuda_internal.cuh"

#define DS4_RT_EXPERTS 256
#define DS4_RT_COLS 4096
#define DS4_RT_KMAX 16

struct ds4_router_args {
    const void *w;  /* gate rows, F16 [256][4096] */
    const float *x; /* the token's input, 4096 floats, 16-byte aligned */
    float *logits;  /* out: the 256 gate logits (the matmul's output) */
    const float *bias;
    const int32_t *tid2eid; /* hash layers: [vocab][tid_ld] expert ids, or NULL */
    int64_t tid_ld;
    const int32_t *token; /* the token id (device), for tid2eid */
    float scale;
    int k;
    int32_t *sel; /* out: k expert ids */
    float *w_out; /* out: k weights */
};

/* Whether the kernel takes this router: the shape above, k <= 16, the
 * matmul op's float matvec for it the block-per-row kernel whose sums it
 * repeats, a GPU with clusters (sm_90+), DS4_CUDA_ROUTER1 not 0. */
bool ds4_router_ok(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows, int64_t cols, int k, const float *x);

/* Launch it (ds4_router_ok must hold); false if the launch failed. */
bool ds4_router_run(ds4_cuda *cu, const ds4_router_args &a);

#endif

/*
 * cuda_q8f_rope.cuh - q_b's product with the query heads' rmsnorm + RoPE
 * at its end (ops.h query_rope; cuda_q8split_fused.cu): what the launch
 * needs besides the product's arguments.
 */
#ifndef DS4_CUDA_Q8F_ROPE_CUH
#define DS4_CUDA_Q8F_ROPE_CUH

#include "backend/cuda/cuda_hc_cluster.cuh"
#include "backend/cuda/cuda_internal.cuh"

struct ds4_q8f_rope {
    unsigned *cnt;      /* a counter a head, at 0 between launches (the kernel leaves them at 0) */
    int head_dim, n_rot; /* head_dim a multiple of 128 (the rows a block takes), at most 1024 */
    int nt;             /* the rmsnorm op's threads for a row of head_dim (its sum order) */
    float eps;
    const float *om;    /* the RoPE frequencies, n_rot / 2 */
    const int64_t *d_pos; /* cb_pos(d_pos, pos): the token's position */
    int64_t pos;
    float *kv;          /* the kv row (head_dim), normalized by kv_w, rotated, rounded in place */
    const float *kv_w;
    int fp8_nope, f16_store;
    ds4_sink_job sj;    /* a site's pending Sinkhorn, or comb NULL */
    int cluster;        /* the cluster form where it applies: 1 (DS4_CUDA_QB_ROPE=2), 2 by pushes (=3); opt-in */
};

/* y = W rmsnorm(x) as ds4_q8split_fused_norm (one slot of 1024, stored),
 * then each head of y (r->head_dim rows) normalized and rotated in place
 * as the rmsnorm_rope op does (no weight), the kv row as that op does with
 * its weight and rounding, and the Sinkhorn job run: one launch, the bits
 * of ds4_q8split_fused_norm and the rmsnorm_rope_qkv op. A block takes 128
 * rows; the last of a head's blocks to finish (a counter a head) does its
 * norm; an extra last block does the kv row and the job. With r->cluster,
 * where heads are 512 wide and every cluster fits at once, a head's four
 * blocks are a cluster that exchange their squares instead (no counter).
 * 1 when covered (and launched with launch = 1), 0 when not. */
int ds4_q8split_fused_norm_rope(ds4_cuda *cu, const ds4_q8f_args *a, const ds4_q8f_rope *r, int launch);

#endif

/*
 * cuda_q8f.cuh - one token's decode matvec on the split-layout Q8_0 copies
 * (cuda_q8split.cu) that quantizes its activation itself: the parameters
 * shared by the register-pipelined kernel (cuda_q8split_fused.cu) and the
 * shared-memory ring kernel (cuda_q8split_ring.cu).
 */
#ifndef DS4_CUDA_Q8F_CUH
#define DS4_CUDA_Q8F_CUH

#include "backend/cuda/cuda_internal.cuh"

struct ds4_q8f_params {
    const uint8_t *qs[2];
    const uint16_t *d[2];
    int64_t rows, cols, n_group;
    const float *x;
    int64_t x_ld;
    float *y;
    int64_t y_slot_stride;
    float clamp;
    int accumulate;
    /* DS4_Q8S_PAIR: blockIdx.y = 1 takes matrix 1 (rows2 rows) into y2 */
    int64_t rows2;
    float *y2;
};

/* Work of one warp: an "item" is RPB rows of one matrix pair, a "batch"
 * 8 chunks of 16 bytes per lane (4 KB a warp). CPL (16-byte chunks per
 * lane per row, cols / 512) < 8: a batch is RPB = 8 / CPL whole rows;
 * CPL >= 8: a row takes NB = CPL / 8 batches. Load k of batch j of an item
 * is chunk lane + 32 * (CPL < 8 ? k % CPL : 8 j + k) of row k / CPL (CPL < 8)
 * or of the item's row; a batch's 4 KB (and its 128 scales) are contiguous
 * in the split copy, with load k of lane l at byte 16 (32 k + l). */
template <int CPL> struct ds4_q8f_shape {
    enum { RPB = CPL < 8 ? 8 / CPL : 1, NB = CPL < 8 ? 1 : CPL / 8 };
};

/* The ring kernel's launch for this product (epi: DS4_Q8S_*; n_slots
 * blockIdx.y slices): true when it took it; false leaves it to the
 * register-pipelined kernel (DS4_CUDA_Q8F_RING=0, or a device without the
 * shared memory). */
bool ds4_q8r_launch(ds4_cuda *cu, const ds4_q8f_params &P, int epi, int64_t n_slots);

#endif

/*
 * cuda_moe_gateup1.cuh - one token's routed gate+up+SwiGLU on IQ2_XXS
 * experts of Flash's width (4096 columns), the decode step's largest
 * kernel (cuda_moe_gateup1.cu). cuda_mmvq.cu offers it the launches it can
 * take and falls back to its pipelined kernel for the rest.
 */
#ifndef DS4_CUDA_MOE_GATEUP1_CUH
#define DS4_CUDA_MOE_GATEUP1_CUH

#include "backend/cuda/cuda_internal.cuh"

/* What the kernel computes: for slot s < n_slots (expert ids[s], at pool
 * slot slot_of[e] when slot_of is set) and row r < rows,
 * y[s * y_slot_stride + r] = swiglu(gate_row . x, up_row . x) with x (cols
 * floats) quantized to Q8_K in the kernel. */
struct ds4_g1_args {
    const uint8_t *gate, *up;
    int64_t rows, cols, expert_bytes, n_expert;
    const int32_t *ids, *slot_of;
    int64_t n_slots;
    const float *x;
    float clamp;
    float *y;
    int64_t y_slot_stride;
};

/* Launches the kernel and returns true when it takes the shape (cols =
 * 4096, at most 64 slots, 16-byte aligned rows and x); false leaves the
 * launch to the caller. DS4_CUDA_MOE1=0: never (A/B runs);
 * DS4_CUDA_MOE1_CFG = 16x3 (default), 24x2, 32x2: warps per block x
 * pipeline stages. */
bool ds4_g1_gateup(ds4_cuda *cu, const ds4_g1_args &a);

#endif

/*
 * cuda_backend.h - the CUDA implementation of the ops contract
 * (backend/ops.h). C callers (engine/) include this under #if DS4_HAVE_CUDA.
 */
#ifndef DS4_BACKEND_CUDA_BACKEND_H
#define DS4_BACKEND_CUDA_BACKEND_H

#include "backend/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A backend on CUDA device `device`; NULL (message set) when there is no
 * such device. Weights are copied to the device by weight_prepare (once;
 * never read through host-mapped memory); activations and session state
 * live in device memory. */
ds4_backend *ds4_backend_cuda_create(int device);

#ifdef __cplusplus
}
#endif

#endif

/*
 * cuda_ktrace.h - in-graph kernel times (DS4_CUDA_KTIME=1): the graph
 * code's hooks into cuda_ktrace.cu.
 */
#ifndef DS4_CUDA_KTRACE_H
#define DS4_CUDA_KTRACE_H

#include <cuda_runtime.h>

bool ds4_kt_on(void);
/* a decode step's recording begins / ends: its launches are noted */
void ds4_kt_record_begin(void);
void ds4_kt_record_end(void);
/* before a replay on `stream`: the previous replay's stamps are added up */
void ds4_kt_before_replay(cudaStream_t stream);
/* the table on stderr (at the backend's end) */
void ds4_kt_report(void);

#endif

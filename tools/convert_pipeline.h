/*
 * convert_pipeline.h - fill the data section of a GGUF being streamed,
 * tensor by tensor, with work split over threads.
 *
 * Each tensor of the plan is cut into units (an expert slab, or a range of
 * rows of at most CONVERT_UNIT_ELEMS values); a producer callback writes
 * the final bytes of one unit (decode + quantize, or synthetic blocks).
 * Units are produced in batches of bounded size by a few pthreads and
 * appended to the writer in file order, so memory stays at a few hundred
 * MB whatever the model size, and the output does not depend on the
 * number of threads.
 */
#ifndef DS4_TOOLS_CONVERT_PIPELINE_H
#define DS4_TOOLS_CONVERT_PIPELINE_H

#include "gguf/gguf.h"
#include "tools/convert_plan.h"

#include <stdbool.h>
#include <stddef.h>

#define CONVERT_UNIT_ELEMS (1u << 22)

/* Write rows [row0, row0+n) of slab `slab` of tensor `ti` to dst (already
 * in the tensor's type). scratch holds CONVERT_UNIT_ELEMS floats, private
 * to the calling thread. On failure set a message with ds4_fail(). */
typedef ds4_status (*convert_unit_fn)(void *ctx, int ti, uint64_t slab, uint64_t row0, uint64_t n,
                                      void *dst, float *scratch);

/* The writer must have had every tensor of `plan` added in plan order and
 * ds4_gguf_writer_begin() called. */
ds4_status convert_pipeline_run(ds4_gguf_writer *w, const convert_plan *plan, int n_threads,
                                convert_unit_fn fn, void *ctx, bool progress);

/* Online CPUs (at least 1). */
int convert_default_threads(void);

#endif

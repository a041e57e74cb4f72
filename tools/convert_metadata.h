/*
 * convert_metadata.h - the general.* and deepseek4.* keys of a DeepSeek V4
 * GGUF (dsv4-model.md §1.2), with exactly the value types the loaders
 * accept: u32 for counts, f32 for floats, bool for expert_weights_norm, an
 * i32 array for compress_ratios and an f32 array for swiglu_clamp_exp (one
 * entry per layer).
 */
#ifndef DS4_TOOLS_CONVERT_METADATA_H
#define DS4_TOOLS_CONVERT_METADATA_H

#include "gguf/gguf.h"
#include "tools/convert_config.h"

ds4_status convert_metadata_add(ds4_gguf_writer *w, const convert_config *cfg);

#endif

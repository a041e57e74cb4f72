/*
 * convert_names.h - checkpoint tensor names of each GGUF tensor, in the
 * two naming schemes (dsv4-model.md §2.2/§2.3, last two columns):
 *   transformers  model.layers.N.self_attn.q_a_proj.weight, fused experts
 *                 mlp.experts.gate_up_proj [E, 2F, D] and down_proj [E, D, F]
 *   official      layers.N.attn.wq_a.weight (+ .scale when FP8), per-expert
 *                 layers.N.ffn.experts.M.w1/w2/w3.weight (+ .scale when FP4)
 */
#ifndef DS4_TOOLS_CONVERT_NAMES_H
#define DS4_TOOLS_CONVERT_NAMES_H

#include "tools/convert_plan.h"
#include "tools/convert_safetensors.h"

#include <stddef.h>

typedef enum { SCHEME_TRANSFORMERS, SCHEME_OFFICIAL } convert_scheme;

/* Which scheme a checkpoint uses (by its embedding's name). */
ds4_status convert_detect_scheme(const st_archive *a, convert_scheme *out);
const char *convert_scheme_name(convert_scheme s);

/* Name of tensor t in the checkpoint. For the routed experts: transformers
 * gives the fused tensor (gate_up_proj for gate and up, down_proj), official
 * the per-expert weight of expert `expert`. alt selects an alternative
 * spelling (0 = main; returns 0 when there is no alternative `alt`). */
int convert_source_name(convert_scheme s, const plan_tensor *t, int expert, int alt, char *buf,
                        size_t cap);

#endif

/*
 * convert_run.h - the two jobs of ds4-quantize: convert a checkpoint
 * directory (convert_checkpoint) and write a synthetic model
 * (convert_synthetic, convert_synthetic.c). Both end in a GGUF written to
 * OUT.tmp and renamed to OUT on success (the GGUF writer's contract).
 */
#ifndef DS4_TOOLS_CONVERT_RUN_H
#define DS4_TOOLS_CONVERT_RUN_H

#include "quant/blocks.h"
#include "tools/convert_config.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    const char *out;
    ds4_type dense;        /* --type: f32 f16 bf16 q8_0 */
    ds4_type exp_gate_up;  /* --experts, gate and up */
    ds4_type exp_down;     /* --experts, down */
    const char *imatrix;   /* NULL: none */
    const char *tokenizer; /* NULL: <dir>/tokenizer.json when present */
    int threads;           /* <= 0: all CPUs */
    bool quiet;
    /* --tensor-type NAME=TYPE overrides, applied after the policy: NAME is
     * a full tensor name or a per-layer suffix ("attn_q_a.weight" = every
     * layer's). Off the published layout, for small demo models. */
    int n_overrides;
    const char *override_name[16];
    ds4_type override_type[16];
    /* synthetic only */
    uint32_t layers, n_experts; /* 0: keep */
    int mtp;                    /* synthetic: also a random MTP block (mtp.0.*) */
    uint64_t seed;
    double expert_share;        /* synthetic: a routed expert's blocks that are expert 0's (0..1) */
    double branch_scale;        /* synthetic: the sublayers' output products' scale (0: 1, fan-in) */
} convert_options;

/* --type / --experts names -> types. */
ds4_status convert_parse_dense_type(const char *s, ds4_type *out);
ds4_status convert_parse_experts(const char *s, ds4_type *gate_up, ds4_type *down);

/* "NAME=TYPE" -> one more override in opt (at most 16). */
ds4_status convert_parse_override(const char *s, convert_options *opt);

ds4_status convert_checkpoint(const char *dir, const convert_options *opt);

/* --gguf IN: requantize IN's routed experts to opt->exp_gate_up/exp_down
 * (with opt->imatrix), copy the rest (convert_requant.c). */
ds4_status convert_requant(const char *in, const convert_options *opt);

/* spec: "flash", "pro" or a config.json path (either style). */
ds4_status convert_synthetic(const char *spec, const convert_options *opt);

#endif

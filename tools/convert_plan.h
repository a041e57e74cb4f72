/*
 * convert_plan.h - the list of GGUF tensors a DeepSeek V4 file holds for a
 * given configuration (dsv4-model.md §2.2, §2.3), with their shapes, their
 * type class, and where each comes from in either checkpoint naming scheme.
 *
 * The plan is the contract shared by the converter and the synthetic
 * writer: same names, same order (globals, then blk.0 ... blk.N-1 in the
 * order of the spec table), same shapes, same types. A "class" says how
 * the output type is chosen (convert_plan_set_types):
 *   F32    kept f32 in the published files (norms, biases, HC base/scale, sinks)
 *   F16    kept f16 (token_embd, HC fn, compressor, indexer, router)
 *   DENSE  the Q8_0 tensors of the published files -> --type
 *   I32    tid2eid
 *   EXP_GU / EXP_DOWN   routed experts -> --experts
 */
#ifndef DS4_TOOLS_CONVERT_PLAN_H
#define DS4_TOOLS_CONVERT_PLAN_H

#include "quant/blocks.h"
#include "tools/convert_config.h"

#include <stdint.h>

typedef enum { CLS_F32, CLS_F16, CLS_DENSE, CLS_I32, CLS_EXP_GU, CLS_EXP_DOWN } convert_class;

/* What a tensor is; selects its checkpoint names (convert_names.c). */
typedef enum {
    R_TOKEN_EMBD, R_OUT_HC_FN, R_OUT_HC_BASE, R_OUT_HC_SCALE, R_OUT_NORM, R_OUTPUT,
    R_HC_ATTN_FN, R_HC_ATTN_SCALE, R_HC_ATTN_BASE, R_ATTN_NORM,
    R_Q_A, R_Q_A_NORM, R_Q_B, R_KV, R_KV_NORM, R_SINKS, R_O_A, R_O_B,
    R_COMP_APE, R_COMP_KV, R_COMP_GATE, R_COMP_NORM,
    R_IDX_Q_B, R_IDX_PROJ, R_IDX_COMP_APE, R_IDX_COMP_KV, R_IDX_COMP_GATE, R_IDX_COMP_NORM,
    R_HC_FFN_FN, R_HC_FFN_SCALE, R_HC_FFN_BASE, R_FFN_NORM,
    R_GATE_INP, R_EXP_PROBS_B, R_TID2EID,
    R_GATE_EXPS, R_UP_EXPS, R_DOWN_EXPS,
    R_GATE_SHEXP, R_UP_SHEXP, R_DOWN_SHEXP,
    /* the MTP block's own tensors (its decoder block uses the roles above) */
    R_MTP_E_PROJ, R_MTP_H_PROJ, R_MTP_ENORM, R_MTP_HNORM, R_MTP_NORM,
    R_MTP_HC_HEAD_FN, R_MTP_HC_HEAD_BASE, R_MTP_HC_HEAD_SCALE,
    R_COUNT
} convert_role;

typedef struct {
    char name[64];
    convert_role role;
    convert_class cls;
    int layer;        /* -1 for global tensors */
    int mtp;          /* 1: a tensor of the MTP block (GGUF mtp.0.*, layer 0) */
    uint32_t n_dims;
    uint64_t ne[3];   /* GGUF order, ne[0] fastest */
    ds4_type type;    /* chosen by convert_plan_set_types */
} plan_tensor;

typedef struct {
    plan_tensor *t;
    int n;
} convert_plan;

ds4_status convert_plan_build(const convert_config *cfg, convert_plan *plan);
/* Append the MTP block (mtp.0.*: one sliding-window block, top-k routed
 * with a bias, plus e_proj/h_proj/enorm/hnorm/norm/hc_head_*). */
ds4_status convert_plan_add_mtp(const convert_config *cfg, convert_plan *plan);
void convert_plan_free(convert_plan *plan);

/* Output types: dense for DENSE, gate_up / down for the routed experts.
 * dense == F32 also turns the F16 class into F32 (a faithful f32 file).
 * Fails, naming the tensor, when a row length does not fit the type's
 * block size. */
ds4_status convert_plan_set_types(convert_plan *plan, ds4_type dense, ds4_type exp_gate_up,
                                  ds4_type exp_down);

/* Force the type of the tensors named `name` (full name, or the suffix
 * after "blk.N." for every layer); fails, naming the tensor, when the row
 * length does not fit the type, and when nothing matched. */
ds4_status convert_plan_override_type(convert_plan *plan, const char *name, ds4_type type);

/* Number of expert slabs (ne[2] of a 3-D tensor, else 1) and rows per slab. */
static inline uint64_t plan_slabs(const plan_tensor *t) { return t->n_dims == 3 ? t->ne[2] : 1; }
static inline uint64_t plan_rows(const plan_tensor *t) { return t->n_dims >= 2 ? t->ne[1] : 1; }

#endif

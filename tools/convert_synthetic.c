/*
 * convert_synthetic.c - a DeepSeek V4 GGUF with random weights
 * (ds4-quantize --synthetic), for benchmarks and tests that need the real
 * layout without the real weights.
 *
 * Same plan, types and metadata as a converted checkpoint (convert_plan.c,
 * convert_metadata.c), so the file is accepted wherever a real one is.
 * Quantized tensors are written as random *valid* blocks directly (random
 * codes, a scale chosen for the target magnitude): no quantizer runs, so
 * the full Flash q2 layout is limited by memory bandwidth and the disk.
 * Magnitudes: matrices ~ N(0, 1/ne0) (fan-in scaling; activations stay
 * O(1) through the RMS norms), norm weights ~ 1 +- 0.1, HC scales ~ 1,
 * HC bases, sinks, position biases and router biases small and centred.
 * Every unit draws from its own stream seeded by (seed, tensor, slab, row),
 * so the bytes do not depend on the number of threads.
 */
#include "tools/convert_run.h"

#include "gguf/gguf.h"
#include "quant/half.h"
#include "quant/quant.h"
#include "tools/convert_metadata.h"
#include "tools/convert_pipeline.h"
#include "tools/convert_plan.h"
#include "tools/convert_tokenizer.h"
#include "util/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t s;
} rng;

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t next(rng *r)
{
    uint64_t x = r->s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->s = x;
    return x * 0x2545f4914f6cdd1dull;
}

/* ~N(0,1): Irwin-Hall of four 16-bit uniforms, rescaled. */
static inline float gauss(rng *r)
{
    uint64_t x = next(r);
    float s = (float)(x & 0xffff) + (float)((x >> 16) & 0xffff) + (float)((x >> 32) & 0xffff) +
              (float)(x >> 48);
    return (s / 65536.0f - 2.0f) * 1.7320508f;
}

static void fill_bytes(rng *r, uint8_t *p, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x = next(r);
        memcpy(p + i, &x, 8);
    }
    if (i < n) {
        uint64_t x = next(r);
        memcpy(p + i, &x, n - i);
    }
}

typedef struct {
    const convert_config *cfg;
    const convert_plan *plan;
    uint64_t seed;
    double expert_share, branch_scale;
} syn_ctx;

/* The products whose output a sublayer adds to the residual streams: the
 * attention's o_b and the routed and shared experts' down. */
static bool syn_branch_out(const plan_tensor *t)
{
    return t->role == R_O_B || t->role == R_DOWN_EXPS || t->role == R_DOWN_SHEXP;
}

/* Value model of a float tensor: mean + std * N(0,1). --branch-scale F
 * multiplies the sublayers' output products by F. (Tried for the
 * exactness floor: at F = 0.5, 0.25 and 0.1 it stays at ~80%, since a
 * random model's streams are its sublayers' outputs either way, the
 * embedding being ~1/64 of one; docs/BENCHMARKS.md.) */
static void value_model(const syn_ctx *c, const plan_tensor *t, float *mean, float *std)
{
    *mean = 0.0f;
    *std = 1.0f / sqrtf((float)t->ne[0]);
    switch (t->role) {
    case R_OUT_NORM: case R_ATTN_NORM: case R_Q_A_NORM: case R_KV_NORM: case R_COMP_NORM:
    case R_IDX_COMP_NORM: case R_FFN_NORM:
        *mean = 1.0f, *std = 0.1f;
        break;
    case R_OUT_HC_SCALE: case R_HC_ATTN_SCALE: case R_HC_FFN_SCALE:
        *mean = 1.0f, *std = 0.2f;
        break;
    case R_OUT_HC_BASE: case R_HC_ATTN_BASE: case R_HC_FFN_BASE: case R_COMP_APE: case R_IDX_COMP_APE:
        *std = 0.5f;
        break;
    case R_SINKS: *std = 1.0f; break;
    case R_EXP_PROBS_B: *std = 0.1f; break;
    default: break;
    }
    if (c->branch_scale > 0 && syn_branch_out(t)) *std *= (float)c->branch_scale;
}

static void gen_blocks(rng *r, ds4_type type, float std, uint8_t *dst, uint64_t n_blocks)
{
    switch (type) {
    case DS4_TYPE_Q8_0: {
        block_q8_0 *b = (block_q8_0 *)dst;
        uint16_t d = ds4_f32_to_f16(std / 73.9f);
        for (uint64_t i = 0; i < n_blocks; i++) {
            fill_bytes(r, (uint8_t *)b[i].qs, sizeof b[i].qs);
            for (int j = 0; j < QK8_0; j++)
                if (b[i].qs[j] == -128) b[i].qs[j] = -127;
            b[i].d = d;
        }
        return;
    }
    case DS4_TYPE_Q2_K: {
        block_q2_K *b = (block_q2_K *)dst;
        float d = std / 9.5f;
        for (uint64_t i = 0; i < n_blocks; i++) {
            fill_bytes(r, (uint8_t *)&b[i], sizeof b[i]);
            b[i].d = ds4_f32_to_f16(d);
            b[i].dmin = ds4_f32_to_f16(d * 1.5f);
        }
        return;
    }
    case DS4_TYPE_Q4_K: {
        block_q4_K *b = (block_q4_K *)dst;
        float d = std / 166.0f;
        for (uint64_t i = 0; i < n_blocks; i++) {
            fill_bytes(r, (uint8_t *)&b[i], sizeof b[i]);
            b[i].d = ds4_f32_to_f16(d);
            b[i].dmin = ds4_f32_to_f16(d * 7.5f);
        }
        return;
    }
    case DS4_TYPE_IQ2_XXS: {
        block_iq2_xxs *b = (block_iq2_xxs *)dst;
        uint16_t d = ds4_f32_to_f16(std / 58.0f);
        for (uint64_t i = 0; i < n_blocks; i++) {
            fill_bytes(r, (uint8_t *)b[i].qs, sizeof b[i].qs);
            b[i].d = d;
        }
        return;
    }
    case DS4_TYPE_MXFP4: {
        block_mxfp4 *b = (block_mxfp4 *)dst;
        int e = 127 + (int)lrintf(log2f(std / 3.0f));
        if (e < 1) e = 1;
        for (uint64_t i = 0; i < n_blocks; i++) {
            fill_bytes(r, b[i].qs, sizeof b[i].qs);
            b[i].e = (uint8_t)e;
        }
        return;
    }
    default: return;
    }
}

/* The stream of unit (tensor ti, slab, row0); salt 0 for the values,
 * others for decisions about them. */
static rng syn_stream(const syn_ctx *c, int ti, uint64_t slab, uint64_t row0, uint64_t salt)
{
    uint64_t x = c->seed ^ ((uint64_t)ti << 40) ^ (slab << 20) ^ row0 ^ (salt << 60);
    rng r = {splitmix(&x) | 1};
    return r;
}

/* --expert-share F: a routed expert's quantized blocks are, each with
 * probability F, expert 0's block at the same place (its unit at the same
 * rows draws the same values), otherwise its own. A trained model's
 * experts near a routing boundary answer alike, random ones do not: with
 * shared blocks a pick that flips on a rounding difference moves the
 * output a little, as it would in a trained model (docs/CUDA.md,
 * "Exactness on synthetic models"). */
static ds4_status syn_share_experts(const syn_ctx *c, int ti, uint64_t slab, uint64_t row0, uint64_t n_blocks,
                                    float std, uint8_t *dst)
{
    const plan_tensor *t = &c->plan->t[ti];
    const ds4_type_info *info = ds4_type_get(t->type);
    if (!info) return DS4_ERR_INVALID;
    const size_t bb = (size_t)info->block_bytes;
    uint8_t *base = malloc(bb * n_blocks);
    if (!base) return ds4_fail(DS4_ERR_NOMEM, "synthetic: out of memory for %llu shared blocks",
                               (unsigned long long)n_blocks);
    rng rb = syn_stream(c, ti, 0, row0, 0), pick = syn_stream(c, ti, slab, row0, 1);
    gen_blocks(&rb, t->type, std, base, n_blocks);
    for (uint64_t i = 0; i < n_blocks; i++)
        if ((double)(next(&pick) >> 11) * 0x1p-53 < c->expert_share) memcpy(dst + i * bb, base + i * bb, bb);
    free(base);
    return DS4_OK;
}

static bool syn_routed_expert(const plan_tensor *t)
{
    return t->role == R_GATE_EXPS || t->role == R_UP_EXPS || t->role == R_DOWN_EXPS;
}

static ds4_status syn_unit(void *p, int ti, uint64_t slab, uint64_t row0, uint64_t n, void *dst, float *scratch)
{
    (void)scratch;
    syn_ctx *c = p;
    const plan_tensor *t = &c->plan->t[ti];
    rng r = syn_stream(c, ti, slab, row0, 0);
    const uint64_t ne0 = t->ne[0], count = n * ne0;
    if (t->type == DS4_TYPE_I32) { /* tid2eid: K distinct experts per token */
        int32_t *o = dst;
        const uint64_t k = ne0, ne = c->cfg->n_expert;
        for (uint64_t row = 0; row < n; row++)
            for (uint64_t j = 0; j < k; j++) {
                int32_t e;
                bool dup;
                do {
                    e = (int32_t)(next(&r) % ne);
                    dup = false;
                    for (uint64_t q = 0; q < j; q++) dup |= o[row * k + q] == e;
                } while (dup);
                o[row * k + j] = e;
            }
        return DS4_OK;
    }
    float mean, std;
    value_model(c, t, &mean, &std);
    switch (t->type) {
    case DS4_TYPE_F32: {
        float *o = dst;
        for (uint64_t i = 0; i < count; i++) o[i] = mean + std * gauss(&r);
        return DS4_OK;
    }
    case DS4_TYPE_F16:
    case DS4_TYPE_BF16: {
        uint16_t *o = dst;
        bool bf = t->type == DS4_TYPE_BF16;
        for (uint64_t i = 0; i < count; i++) {
            float v = mean + std * gauss(&r);
            o[i] = bf ? ds4_f32_to_bf16(v) : ds4_f32_to_f16(v);
        }
        return DS4_OK;
    }
    default: {
        const ds4_type_info *ti_ = ds4_type_get(t->type);
        if (!ti_) return DS4_ERR_INVALID;
        const uint64_t n_blocks = count / (uint64_t)ti_->block_elems;
        gen_blocks(&r, t->type, std, dst, n_blocks);
        if (c->expert_share > 0 && slab > 0 && syn_routed_expert(t))
            return syn_share_experts(c, ti, slab, row0, n_blocks, std, dst);
        return DS4_OK;
    }
    }
}

ds4_status convert_synthetic(const char *spec, const convert_options *opt)
{
    convert_config cfg;
    ds4_status st;
    if (strcmp(spec, "flash") == 0 || strcmp(spec, "pro") == 0) st = convert_config_preset(spec, &cfg);
    else st = convert_config_load(spec, &cfg);
    if (!st) st = convert_config_truncate(&cfg, opt->layers, opt->n_experts);
    if (!st) {
        size_t n = strlen(cfg.name);
        snprintf(cfg.name + n, sizeof cfg.name - n, " (synthetic)");
    }
    convert_plan plan = {0};
    ds4_gguf_writer *w = NULL;
    if (!st) st = convert_plan_build(&cfg, &plan);
    if (!st && opt->mtp) {
        if (!cfg.n_mtp) cfg.n_mtp = 1;
        st = convert_plan_add_mtp(&cfg, &plan);
    }
    if (!st) st = convert_plan_set_types(&plan, opt->dense, opt->exp_gate_up, opt->exp_down);
    for (int k = 0; !st && k < opt->n_overrides; k++)
        st = convert_plan_override_type(&plan, opt->override_name[k], opt->override_type[k]);
    if (!st && !(w = ds4_gguf_writer_new())) st = ds4_fail(DS4_ERR_NOMEM, "out of memory");
    if (!st) st = convert_metadata_add(w, &cfg);
    if (!st) st = ds4_gguf_writer_add_u64(w, "ds4.synthetic_seed", opt->seed);
    if (!st && opt->expert_share > 0)
        st = ds4_gguf_writer_add_f32(w, "ds4.synthetic_expert_share", (float)opt->expert_share);
    if (!st && opt->branch_scale > 0)
        st = ds4_gguf_writer_add_f32(w, "ds4.synthetic_branch_scale", (float)opt->branch_scale);
    if (!st && opt->tokenizer) st = convert_tokenizer_add(w, opt->tokenizer, &cfg);
    for (int i = 0; !st && i < plan.n; i++)
        st = ds4_gguf_writer_add_tensor(w, plan.t[i].name, plan.t[i].type, plan.t[i].n_dims, plan.t[i].ne, NULL);
    if (!st && !opt->quiet)
        fprintf(stderr, "ds4-quantize: synthetic %s: %u layers, %u experts, %d tensors, %.2f GiB\n", cfg.name,
                cfg.n_layer, cfg.n_expert, plan.n, (double)ds4_gguf_writer_file_size(w) / (1u << 30));
    if (!st) st = ds4_gguf_writer_begin(w, opt->out);
    if (!st) {
        syn_ctx ctx = {.cfg = &cfg,
                       .plan = &plan,
                       .seed = opt->seed,
                       .expert_share = opt->expert_share,
                       .branch_scale = opt->branch_scale};
        int threads = opt->threads > 0 ? opt->threads : convert_default_threads();
        st = convert_pipeline_run(w, &plan, threads, syn_unit, &ctx, !opt->quiet);
        if (!st) st = ds4_gguf_writer_finish(w);
        else ds4_gguf_writer_abort(w);
    }
    if (w) ds4_gguf_writer_free(w);
    convert_plan_free(&plan);
    return st;
}

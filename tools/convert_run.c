/*
 * convert_run.c - checkpoint directory -> GGUF (ds4-quantize --hf).
 *
 * Order of work: read config.json, open the shards, build the tensor plan,
 * choose the output types, resolve and validate every source tensor, and
 * only then create OUT.tmp and stream the tensors through the pipeline.
 * So a bad checkpoint fails in seconds with a message naming the tensor,
 * and never leaves a partial OUT behind.
 *
 * Type policy (docs/CONVERTER.md): published F32 tensors stay F32,
 * published F16 tensors stay F16 (F32 with --type f32), the published Q8_0
 * tensors take --type, routed experts take --experts. IQ2_XXS needs an
 * importance vector: from --imatrix when it has the tensor, else uniform
 * weights (plain least squares).
 */
#include "tools/convert_run.h"

#include "gguf/gguf.h"
#include "quant/quant.h"
#include "tools/convert_imatrix.h"
#include "tools/convert_metadata.h"
#include "tools/convert_pipeline.h"
#include "tools/convert_source.h"
#include "tools/convert_tokenizer.h"
#include "util/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

ds4_status convert_parse_dense_type(const char *s, ds4_type *out)
{
    static const struct {
        const char *n;
        ds4_type t;
    } k[] = {{"f32", DS4_TYPE_F32}, {"f16", DS4_TYPE_F16}, {"bf16", DS4_TYPE_BF16}, {"q8_0", DS4_TYPE_Q8_0}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (strcasecmp(s, k[i].n) == 0) {
            *out = k[i].t;
            return DS4_OK;
        }
    return ds4_fail(DS4_ERR_INVALID, "--type %s: expected f32, f16, bf16 or q8_0", s);
}

ds4_status convert_parse_override(const char *s, convert_options *opt)
{
    const char *eq = strchr(s, '=');
    if (!eq || eq == s || !eq[1])
        return ds4_fail(DS4_ERR_INVALID, "--tensor-type %s: expected NAME=TYPE", s);
    if (opt->n_overrides >= (int)(sizeof opt->override_name / sizeof opt->override_name[0]))
        return ds4_fail(DS4_ERR_INVALID, "--tensor-type %s: at most 16 overrides", s);
    ds4_type t;
    if (ds4_type_from_name(eq + 1, &t) != DS4_OK || t == DS4_TYPE_I32 || t == DS4_TYPE_Q8_K)
        return ds4_fail(DS4_ERR_INVALID, "--tensor-type %s: unknown weight type '%s'", s, eq + 1);
    /* The name part is kept by pointer into argv; cut it at '=' in a copy. */
    char *name = strndup(s, (size_t)(eq - s));
    if (!name) return ds4_fail(DS4_ERR_NOMEM, "out of memory");
    opt->override_name[opt->n_overrides] = name;
    opt->override_type[opt->n_overrides] = t;
    opt->n_overrides++;
    return DS4_OK;
}

ds4_status convert_parse_experts(const char *s, ds4_type *gu, ds4_type *down)
{
    static const struct {
        const char *n;
        ds4_type gu, down;
    } k[] = {
        {"q2", DS4_TYPE_IQ2_XXS, DS4_TYPE_Q2_K}, {"q4", DS4_TYPE_Q4_K, DS4_TYPE_Q4_K},
        {"q8_0", DS4_TYPE_Q8_0, DS4_TYPE_Q8_0},  {"mxfp4", DS4_TYPE_MXFP4, DS4_TYPE_MXFP4},
        {"f16", DS4_TYPE_F16, DS4_TYPE_F16},     {"bf16", DS4_TYPE_BF16, DS4_TYPE_BF16},
        {"f32", DS4_TYPE_F32, DS4_TYPE_F32},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (strcasecmp(s, k[i].n) == 0) {
            *gu = k[i].gu;
            *down = k[i].down;
            return DS4_OK;
        }
    return ds4_fail(DS4_ERR_INVALID, "--experts %s: expected q2, q4, q8_0, mxfp4, f16, bf16 or f32", s);
}

typedef struct {
    const convert_config *cfg;
    const convert_plan *plan;
    convert_src *srcs;
    const convert_imatrix *im;
    float *uniform; /* ones, for IQ2_XXS without an imatrix entry */
} hf_ctx;

static ds4_status hf_unit(void *p, int ti, uint64_t slab, uint64_t row0, uint64_t n, void *dst, float *scratch)
{
    hf_ctx *c = p;
    const plan_tensor *t = &c->plan->t[ti];
    const convert_src *src = &c->srcs[ti];
    if (t->type == DS4_TYPE_I32) return convert_src_i32(src, dst, c->cfg->n_expert);
    if (t->type == DS4_TYPE_MXFP4 && convert_src_is_fp4_e8m0(src)) /* lossless */
        return convert_src_fp4_to_mxfp4(src, slab, row0, n, dst);
    ds4_status st = convert_src_rows(src, slab, row0, n, scratch);
    if (st) return st;
    const uint64_t ne0 = t->ne[0];
    for (uint64_t i = 0; i < n * ne0; i++)
        if (!isfinite(scratch[i]))
            return ds4_fail(DS4_ERR_FORMAT, "convert: tensor %s: non-finite value at expert %llu row %llu column %llu",
                            t->name, (unsigned long long)slab, (unsigned long long)(row0 + i / ne0),
                            (unsigned long long)(i % ne0));
    const float *im = convert_imatrix_find(c->im, t->name, ne0, slab, plan_slabs(t), &st);
    if (st) return st;
    if (!im && t->type == DS4_TYPE_IQ2_XXS) im = c->uniform;
    st = ds4_quantize_rows(t->type, scratch, dst, (int64_t)n, (int64_t)ne0, im);
    if (st) ds4_error_prefix("convert: tensor %s: ", t->name);
    return st;
}

static char *join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* Checkpoint tensors that feed nothing usually mean a naming mismatch
 * (mtp.* beyond the one MTP block converted are counted apart). */
static void warn_unused(const st_archive *a, const convert_plan *plan, const convert_src *srcs)
{
    uint8_t *used = calloc((size_t)st_count(a) + 1, 1);
    if (!used) return;
    for (int i = 0; i < plan->n; i++) convert_src_mark_used(&srcs[i], a, used);
    int64_t n_unused = 0, n_mtp = 0;
    for (int64_t i = 0; i < st_count(a); i++) {
        if (used[i]) continue;
        const char *name = st_at(a, i)->name;
        if (strncmp(name, "mtp.", 4) == 0) {
            n_mtp++;
            continue;
        }
        if (n_unused++ < 8) fprintf(stderr, "ds4-quantize: warning: checkpoint tensor %s is not used\n", name);
    }
    if (n_unused > 8) fprintf(stderr, "ds4-quantize: warning: ... %lld unused tensors in all\n", (long long)n_unused);
    if (n_mtp)
        fprintf(stderr, "ds4-quantize: warning: %lld mtp.* tensors left out (only mtp.0 is converted)\n",
                (long long)n_mtp);
    free(used);
}

ds4_status convert_checkpoint(const char *dir, const convert_options *opt)
{
    convert_config cfg;
    convert_plan plan = {0};
    convert_src *srcs = NULL;
    convert_imatrix *im = NULL;
    ds4_gguf_writer *w = NULL;
    st_archive *a = NULL;
    float *uniform = NULL;
    char *cfg_path = join(dir, "config.json");
    char *tok_path = NULL;
    ds4_status st = cfg_path ? convert_config_load(cfg_path, &cfg) : ds4_fail(DS4_ERR_NOMEM, "out of memory");
    if (!st) { /* general.name: the checkpoint directory's name ("DeepSeek-V4-Flash") */
        size_t n = strlen(dir);
        while (n > 1 && dir[n - 1] == '/') n--;
        size_t b = n;
        while (b > 0 && dir[b - 1] != '/') b--;
        if (n > b && n - b < sizeof cfg.name) snprintf(cfg.name, sizeof cfg.name, "%.*s", (int)(n - b), dir + b);
    }
    convert_scheme scheme = SCHEME_TRANSFORMERS;
    if (!st && !(a = st_open(dir))) st = DS4_ERR_FORMAT;
    if (!st) st = convert_detect_scheme(a, &scheme);
    if (!st) st = convert_plan_build(&cfg, &plan);
    /* the checkpoint's MTP block (mtp.0.*) is kept: --mtp auto finds it */
    bool with_mtp = !st && cfg.n_mtp > 0 && (st_find(a, "mtp.0.e_proj.weight") != NULL);
    if (with_mtp) st = convert_plan_add_mtp(&cfg, &plan);
    if (!st) st = convert_plan_set_types(&plan, opt->dense, opt->exp_gate_up, opt->exp_down);
    for (int k = 0; !st && k < opt->n_overrides; k++)
        st = convert_plan_override_type(&plan, opt->override_name[k], opt->override_type[k]);
    if (!st && !(srcs = calloc((size_t)plan.n, sizeof *srcs))) st = ds4_fail(DS4_ERR_NOMEM, "out of memory");
    for (int i = 0; !st && i < plan.n; i++) st = convert_src_resolve(a, scheme, &plan.t[i], &srcs[i]);
    if (!st && !opt->quiet) warn_unused(a, &plan, srcs);
    if (!st && opt->imatrix && !(im = convert_imatrix_load(opt->imatrix))) st = DS4_ERR_FORMAT;
    if (!st && !opt->quiet)
        fprintf(stderr, "ds4-quantize: %s: %s names, %lld checkpoint tensors, %d GGUF tensors, %u layers, %u experts%s\n",
                dir, convert_scheme_name(scheme), (long long)st_count(a), plan.n, cfg.n_layer, cfg.n_expert,
                im ? "" : (opt->exp_gate_up == DS4_TYPE_IQ2_XXS ? " (no imatrix: uniform IQ2_XXS weights)" : ""));
    if (!st) {
        uint64_t max_ne0 = 1;
        for (int i = 0; i < plan.n; i++) max_ne0 = plan.t[i].ne[0] > max_ne0 ? plan.t[i].ne[0] : max_ne0;
        if (!(uniform = malloc(max_ne0 * sizeof *uniform))) st = ds4_fail(DS4_ERR_NOMEM, "out of memory");
        for (uint64_t i = 0; uniform && i < max_ne0; i++) uniform[i] = 1.0f;
    }
    if (!st && !(w = ds4_gguf_writer_new())) st = ds4_fail(DS4_ERR_NOMEM, "out of memory");
    if (!st) st = convert_metadata_add(w, &cfg);
    if (!st) {
        const char *tp = opt->tokenizer;
        if (!tp) {
            tok_path = join(dir, "tokenizer.json");
            if (tok_path && access(tok_path, R_OK) == 0) tp = tok_path;
        }
        if (tp) st = convert_tokenizer_add(w, tp, &cfg);
        else if (!opt->quiet)
            fprintf(stderr, "ds4-quantize: no tokenizer.json in %s and no --tokenizer: writing no tokenizer keys\n", dir);
    }
    if (!st && im) st = ds4_gguf_writer_add_str(w, "quantize.imatrix.file", opt->imatrix);
    if (!st && im) st = ds4_gguf_writer_add_u64(w, "quantize.imatrix.entries_count", (uint64_t)convert_imatrix_count(im));
    for (int i = 0; !st && i < plan.n; i++)
        st = ds4_gguf_writer_add_tensor(w, plan.t[i].name, plan.t[i].type, plan.t[i].n_dims, plan.t[i].ne, NULL);
    if (!st) st = ds4_gguf_writer_begin(w, opt->out);
    if (!st) {
        hf_ctx ctx = {.cfg = &cfg, .plan = &plan, .srcs = srcs, .im = im, .uniform = uniform};
        int threads = opt->threads > 0 ? opt->threads : convert_default_threads();
        st = convert_pipeline_run(w, &plan, threads, hf_unit, &ctx, !opt->quiet);
        if (!st) st = ds4_gguf_writer_finish(w);
        else ds4_gguf_writer_abort(w);
    }
    if (w) ds4_gguf_writer_free(w);
    for (int i = 0; srcs && i < plan.n; i++) convert_src_free(&srcs[i]);
    free(srcs);
    free(uniform);
    free(cfg_path);
    free(tok_path);
    convert_imatrix_free(im);
    convert_plan_free(&plan);
    st_close(a);
    return st;
}

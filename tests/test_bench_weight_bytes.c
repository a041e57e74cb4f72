/*
 * test_bench_weight_bytes.c - ds4_model_weight_bytes_per_token, the
 * roofline input of ds4-bench, against dsv4-model.md §6.2.
 *
 *   - The full Flash q2 layout (the converter's plan; no file written)
 *     through the per-tensor rule: the spec's total of 9.56 GB per token
 *     above 2048 tokens of context, and exactly the indexer's q_b + proj
 *     (363.3 MB in the spec's table) less at 2048, where a CSA layer has
 *     512 = top_k rows and the indexer is not run.
 *   - A tiny synthetic model (tests/data/bench/synthetic-tiny.json,
 *     written here with ds4-quantize's synthetic mode, opened with
 *     ds4_model_open): the function's value equals the spec's formula
 *     written out tensor by tensor from that config's shapes and the
 *     published type sizes (Q8_0 34 B / 32, IQ2_XXS 66 B / 256, Q2_K
 *     84 B / 256, F16, F32), on both sides of the indexer threshold.
 */
#include "engine/model_stats.h"
#include "include/ds4.h"
#include "quant/quant.h"
#include "tests/test.h"
#include "tools/convert_plan.h"
#include "tools/convert_run.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static double plan_bytes_per_token(const convert_plan *p, int64_t n_ctx)
{
    double sum = 0;
    for (int i = 0; i < p->n; i++) {
        const plan_tensor *t = &p->t[i];
        uint64_t ne[4] = {t->ne[0], t->n_dims >= 2 ? t->ne[1] : 1, t->n_dims >= 3 ? t->ne[2] : 1, 1};
        uint64_t bytes = (uint64_t)ds4_row_bytes(t->type, (int64_t)ne[0]) * ne[1] * ne[2];
        sum += (double)ds4_tensor_bytes_per_token(t->name, bytes, ne, 6, 512, n_ctx);
    }
    return sum;
}

static void test_flash_q2_plan(void)
{
    convert_config c;
    REQUIRE(convert_config_preset("flash", &c) == DS4_OK);
    convert_plan p;
    REQUIRE(convert_plan_build(&c, &p) == DS4_OK);
    REQUIRE(convert_plan_set_types(&p, DS4_TYPE_Q8_0, DS4_TYPE_IQ2_XXS, DS4_TYPE_Q2_K) == DS4_OK);
    double above = plan_bytes_per_token(&p, 4096), at = plan_bytes_per_token(&p, 2048);
    /* §6.2: "Weights total 9.56 GB" (the table's rows add up to 9558.2 MB) */
    EXPECT_MSG(fabs(above / 1e9 - 9.56) < 0.01, "q2 bytes/token above 2048: %.4f GB", above / 1e9);
    /* §6.2: indexer q_b + weights_proj, F16, 21 layers: 363.3 MB */
    EXPECT_MSG(fabs((above - at) / 1e6 - 363.3) < 0.1, "indexer share %.2f MB", (above - at) / 1e6);
    /* exact: 21 x (1024 x 8192 + 4096 x 64) f16 values */
    EXPECT(above - at == 21.0 * (1024.0 * 8192 + 4096.0 * 64) * 2);
    EXPECT(plan_bytes_per_token(&p, 2051) == at && plan_bytes_per_token(&p, 2052) == above);
    convert_plan_free(&p);
}

/* The formula of §6.2 for synthetic-tiny.json, from the §2 tensor table. */
static double tiny_formula(int indexer)
{
    const double E = 256, V = 129280, H = 2, D = 128, QL = 128, OL = 64, G = 2, NU = 2, F = 256, HC = 4,
                 IH = 2, ID = 128;
    const int ratio[4] = {0, 4, 16, 4}, n_hash = 1;
    const double q8 = 34.0 / 32, f16 = 2, f32 = 4, iq2 = 66.0 / 256, q2k = 84.0 / 256;
    double b = E * f16;                                        /* one embedding row */
    b += HC * E * HC * f16 + HC * f32 + 1 * f32 + E * f32;    /* output_hc_fn/base/scale, output_norm */
    b += E * V * q8;                                           /* output */
    for (int il = 0; il < 4; il++) {
        double mix = HC * E * (2 + HC) * HC * f16 + 3 * f32 + (2 + HC) * HC * f32; /* hc fn, scale, base */
        b += 2 * mix;                                           /* attention and ffn sites */
        b += 2 * E * f32;                                       /* attn_norm, ffn_norm */
        b += (E * QL + QL * H * D + E * D) * q8 + (QL + D + H) * f32; /* q_a, q_b, kv; norms, sinks */
        b += (H * D / G * G * OL + G * OL * E) * q8;           /* output_a, output_b */
        b += E * 8 * f16;                                       /* router (8 experts) */
        b += il < n_hash ? NU * 4 : 8 * f32;                    /* tid2eid row | exp_probs_b */
        b += NU * (2 * E * F * iq2 + F * E * q2k);              /* routed gate, up, down */
        b += 3 * E * F * q8;                                    /* shared expert */
        if (ratio[il]) {
            double c = ratio[il] == 4 ? 2 : 1;
            b += (c * D * ratio[il] + 2 * E * c * D) * f16 + D * f32; /* ape, kv, gate; norm */
        }
        if (ratio[il] == 4) {
            b += (2 * ID * 4 + 2 * E * 2 * ID) * f16 + ID * f32; /* indexer compressor */
            if (indexer) b += (QL * IH * ID + E * IH) * f16;     /* indexer q_b, proj */
        }
    }
    return b;
}

static void test_tiny_model(void)
{
    char dir[] = "/tmp/ds4-test-wbytes-XXXXXX", path[96];
    REQUIRE(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tiny.gguf", dir);
    convert_options o = {.out = path, .dense = DS4_TYPE_Q8_0, .exp_gate_up = DS4_TYPE_IQ2_XXS,
                         .exp_down = DS4_TYPE_Q2_K, .seed = 1, .quiet = true};
    REQUIRE(convert_synthetic(test_data("bench/synthetic-tiny.json"), &o) == DS4_OK);
    ds4_model *m = ds4_model_open(path, NULL);
    if (!m) fprintf(stderr, "model: %s\n", ds4_last_error());
    REQUIRE(m);
    double with = tiny_formula(1), without = tiny_formula(0);
    uint64_t got_with = ds4_model_weight_bytes_per_token(m, 36), got_without = ds4_model_weight_bytes_per_token(m, 35);
    EXPECT_MSG((double)got_with == with, "n_ctx 36: %llu, formula %.1f", (unsigned long long)got_with, with);
    EXPECT_MSG((double)got_without == without, "n_ctx 35: %llu, formula %.1f", (unsigned long long)got_without,
               without);
    EXPECT(ds4_model_weight_bytes_per_token(m, 1) == got_without);
    EXPECT(ds4_model_weight_bytes_per_token(m, 1 << 20) == got_with);
    ds4_model_close(m);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    RUN(test_flash_q2_plan);
    RUN(test_tiny_model);
    return test_finish();
}

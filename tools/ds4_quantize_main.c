/*
 * ds4_quantize_main.c - ds4-quantize: Hugging Face checkpoint (or random
 * weights) -> DeepSeek V4 GGUF with the published names, types and
 * metadata. Argument parsing only; the work is in convert_run.c and
 * convert_synthetic.c. See docs/CONVERTER.md.
 */
#include "include/ds4.h"
#include "tools/convert_run.h"
#include "util/error.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "util/version.h"

static void usage(FILE *f)
{
    fputs("usage: ds4-quantize --hf DIR --out FILE.gguf [options]\n"
          "       ds4-quantize --synthetic flash|pro|CONFIG.json --out FILE.gguf [options]\n"
          "       ds4-quantize --gguf IN.gguf --out FILE.gguf --experts E [--imatrix F]\n"
          "\n"
          "Writes a DeepSeek V4 GGUF with the tensor names, shapes, types and metadata of\n"
          "the published DeepSeek V4 Flash files (written to FILE.tmp, renamed on success).\n"
          "\n"
          "  --hf DIR           checkpoint directory: config.json + *.safetensors (sharded via\n"
          "                     model.safetensors.index.json or not); transformers or official\n"
          "                     tensor names; f32/bf16/f16, FP8-E4M3 + scale, FP4 experts\n"
          "  --synthetic SPEC   random weights of realistic magnitude: flash, pro, or a\n"
          "                     config.json (either style)\n"
          "  --gguf IN          requantize the routed experts of an existing GGUF to --experts\n"
          "                     (with --imatrix); every other tensor and key is copied\n"
          "  --out FILE         output GGUF\n"
          "  --type T           dense tensors published as Q8_0: f32|f16|bf16|q8_0 (q8_0);\n"
          "                     f32 also turns the published F16 tensors into F32\n"
          "  --experts E        routed experts: q2 (gate/up IQ2_XXS + down Q2_K), q4 (Q4_K),\n"
          "                     q8_0, mxfp4, f16, bf16, f32 (q2)\n"
          "  --imatrix FILE     importance matrix (llama.cpp legacy imatrix.dat layout, see\n"
          "                     docs/CONVERTER.md); without it IQ2_XXS uses uniform weights\n"
          "  --tokenizer FILE   tokenizer.json, or a GGUF whose tokenizer.* keys are copied\n"
          "                     (default for --hf: DIR/tokenizer.json when present)\n"
          "  --tensor-type N=T  force tensor N (full name, or per-layer suffix such as\n"
          "                     attn_q_a.weight) to type T; repeatable; leaves the\n"
          "                     published layout (used for the small demo model)\n"
          "  --threads N        worker threads (all CPUs)\n"
          "  --layers N         synthetic: keep the first N layers\n"
          "  --mtp              synthetic: also a random MTP block (mtp.0.*, for --mtp auto)\n"
          "  --n-experts N      synthetic: N routed experts per layer\n"
          "  --seed S           synthetic: random seed (1)\n"
          "  --expert-share F   synthetic: each quantized block of a routed expert is,\n"
          "                     with probability F (0..1), expert 0's block (experts\n"
          "                     that answer alike, as a trained model's; default 0)\n"
          "  --branch-scale F   synthetic: the sublayers' output products (o_b, the\n"
          "                     experts' down) at F (0..1] times fan-in scale\n"
          "                     (default 1)\n"
          "  --quiet            no progress lines\n"
          "  --help             this text\n",
          f);
}

static int parse_u64(const char *flag, const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *end || s[0] == '-') {
        fprintf(stderr, "ds4-quantize: %s %s: expected a non-negative integer\n", flag, s);
        return 0;
    }
    *out = v;
    return 1;
}

int main(int argc, char **argv)
{
    if (ds4_version_requested(argc, argv)) { ds4_version_print(stdout, "ds4-quantize"); return 0; }
    enum { O_HF = 256, O_SYN, O_OUT, O_TYPE, O_EXP, O_IM, O_TOK, O_THR, O_LAY, O_NEXP, O_SEED, O_QUIET, O_HELP, O_TT, O_GGUF, O_MTP, O_SHARE, O_BRANCH };
    static const struct option opts[] = {
        {"hf", required_argument, 0, O_HF},          {"synthetic", required_argument, 0, O_SYN},
        {"out", required_argument, 0, O_OUT},        {"type", required_argument, 0, O_TYPE},
        {"experts", required_argument, 0, O_EXP},    {"imatrix", required_argument, 0, O_IM},
        {"tokenizer", required_argument, 0, O_TOK},  {"threads", required_argument, 0, O_THR},
        {"mtp", no_argument, 0, O_MTP},
        {"layers", required_argument, 0, O_LAY},     {"n-experts", required_argument, 0, O_NEXP},
        {"seed", required_argument, 0, O_SEED},      {"quiet", no_argument, 0, O_QUIET},
        {"help", no_argument, 0, O_HELP},            {"tensor-type", required_argument, 0, O_TT},
        {"gguf", required_argument, 0, O_GGUF},      {"expert-share", required_argument, 0, O_SHARE},
        {"branch-scale", required_argument, 0, O_BRANCH},
        {0, 0, 0, 0},
    };
    convert_options o = {.dense = DS4_TYPE_Q8_0, .exp_gate_up = DS4_TYPE_IQ2_XXS, .exp_down = DS4_TYPE_Q2_K,
                         .seed = 1};
    const char *hf = NULL, *syn = NULL, *gg = NULL;
    uint64_t v;
    int c;
    ds4_status st = DS4_OK;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_HF: hf = optarg; break;
        case O_SYN: syn = optarg; break;
        case O_GGUF: gg = optarg; break;
        case O_OUT: o.out = optarg; break;
        case O_TYPE: st = convert_parse_dense_type(optarg, &o.dense); break;
        case O_EXP: st = convert_parse_experts(optarg, &o.exp_gate_up, &o.exp_down); break;
        case O_IM: o.imatrix = optarg; break;
        case O_TOK: o.tokenizer = optarg; break;
        case O_THR: if (!parse_u64("--threads", optarg, &v) || v > 256) return 2; o.threads = (int)v; break;
        case O_MTP: o.mtp = 1; break;
        case O_LAY: if (!parse_u64("--layers", optarg, &v) || v > 100000) return 2; o.layers = (uint32_t)v; break;
        case O_NEXP: if (!parse_u64("--n-experts", optarg, &v) || v > 100000) return 2; o.n_experts = (uint32_t)v; break;
        case O_SEED: if (!parse_u64("--seed", optarg, &v)) return 2; o.seed = v; break;
        case O_SHARE: {
            char *end = NULL;
            const double f = strtod(optarg, &end);
            if (!end || end == optarg || *end || !(f >= 0.0 && f <= 1.0)) {
                fprintf(stderr, "ds4-quantize: --expert-share %s: expected a fraction from 0 to 1\n", optarg);
                return 2;
            }
            o.expert_share = f;
            break;
        }
        case O_BRANCH: {
            char *end = NULL;
            const double f = strtod(optarg, &end);
            if (!end || end == optarg || *end || !(f > 0.0 && f <= 1.0)) {
                fprintf(stderr, "ds4-quantize: --branch-scale %s: expected a number in (0, 1]\n", optarg);
                return 2;
            }
            o.branch_scale = f;
            break;
        }
        case O_QUIET: o.quiet = true; break;
        case O_TT: st = convert_parse_override(optarg, &o); break;
        case O_HELP: case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (st) {
            fprintf(stderr, "ds4-quantize: %s\n", ds4_last_error());
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "ds4-quantize: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!o.out || (hf != NULL) + (syn != NULL) + (gg != NULL) != 1) {
        fprintf(stderr, "ds4-quantize: need --out and exactly one of --hf, --synthetic or --gguf\n\n");
        usage(stderr);
        return 2;
    }
    if (!syn && (o.expert_share > 0 || o.branch_scale > 0)) {
        fprintf(stderr, "ds4-quantize: --%s is for --synthetic\n", o.expert_share > 0 ? "expert-share" : "branch-scale");
        return 2;
    }
    if (hf && (o.layers || o.n_experts)) {
        fprintf(stderr, "ds4-quantize: --layers and --n-experts are for --synthetic\n");
        return 2;
    }
    if (gg && (o.layers || o.n_experts || o.n_overrides)) {
        fprintf(stderr, "ds4-quantize: --gguf takes only --experts, --imatrix, --out and --quiet\n");
        return 2;
    }
    st = hf ? convert_checkpoint(hf, &o) : gg ? convert_requant(gg, &o) : convert_synthetic(syn, &o);
    for (int k = 0; k < o.n_overrides; k++) free((char *)o.override_name[k]);
    if (st) {
        fprintf(stderr, "ds4-quantize: error: %s\n", ds4_last_error());
        return 1;
    }
    if (!o.quiet) fprintf(stderr, "ds4-quantize: wrote %s\n", o.out);
    return 0;
}

/*
 * cli_options.c - parsing and help text of the `ds4` command (cli_options.h).
 */
#include "cli/cli_options.h"

#include "cli/cli_stream_options.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_MODEL "./ds4flash.gguf"

void ds4_cli_options_default(ds4_cli_options *o)
{
    memset(o, 0, sizeof *o);
    o->model = DEFAULT_MODEL;
    o->n_predict = 50000;
    o->ctx = 32768;
    o->think = DS4_CLI_THINK;
    o->temp = 1.0f;
    o->top_p = 1.0f;
    o->min_p = 0.05f;
    o->top_k = 0;
    o->logprobs_top_k = 20;
    o->numerics = DS4_NUMERICS_AUTO;
}

void ds4_cli_print_help(FILE *f)
{
    fputs(
        "Usage: ds4 [options]\n"
        "\n"
        "Chat with DeepSeek V4 Flash. With -p or --prompt-file: answer once,\n"
        "streaming to stdout. Without: an interactive multi-turn chat.\n"
        "\n"
        "Model and machine:\n"
        "  -m, --model FILE        GGUF model. Default: " DEFAULT_MODEL ", or when that\n"
        "                          file is absent the tiny demo model\n"
        "                          models/ds4-demo.gguf (see models/README.md)\n"
        "  --ctx N                 Context size in tokens. Default: 32768\n"
        "  -t, --threads N         CPU threads. Default: all cores\n"
        "  --cuda                  Run on the GPU (the default when one is found and\n"
        "                          the build has CUDA).\n"
        "  --cpu                   Run on the CPU even when a GPU is found.\n"
        "  --gpu-device N          CUDA device index. Default: 0\n"
        "\n"
        "Prompt and generation:\n"
        "  -p, --prompt TEXT       The user message (one-shot mode).\n"
        "  --prompt-file FILE      Read the user message from FILE.\n"
        "  -sys, --system TEXT     System prompt; \"\" for none.\n"
        "                          Default: You are a helpful assistant\n"
        "  --raw-prompt            Use the prompt as already rendered text (no chat\n"
        "                          template; special tokens in it are recognised).\n"
        "  -n, --tokens N          Maximum tokens to generate per answer. Default: 50000\n"
        "  --think                 Thinking mode: the model reasons first. Default.\n"
        "  --think-max             Think Max (needs --ctx >= 393216; below that it\n"
        "                          falls back to normal thinking, with a warning).\n"
        "  --nothink               Answer directly, no reasoning.\n"
        "  --temp F                Sampling temperature; 0 = greedy. Default: 1\n"
        "  --top-p F               Nucleus sampling mass, 0 < F <= 1. Default: 1\n"
        "  --top-k N               Keep only the N most likely tokens; 0 = off. Default: 0\n"
        "  --min-p F               Drop tokens below F x the top probability. Default: 0.05\n"
        "  --seed N                Sampling seed (reproducible runs). Default: time-based\n"
        "\n"
        "Diagnostics:\n"
        "  --dump-tokens           Tokenize -p/--prompt-file exactly as written (special\n"
        "                          tokens recognised), print \"id<TAB>piece\" per token\n"
        "                          (piece bytes escaped: \\\\ \\n \\r \\t, \\xNN for other\n"
        "                          bytes outside printable ASCII), and exit. Needs only\n"
        "                          the tokenizer (a vocab-only GGUF works).\n"
        "  --dump-logprobs FILE    Greedy continuation of the prompt with the top-K\n"
        "                          alternatives at every step, written as JSON.\n"
        "  --logprobs-top-k K      Alternatives per step for --dump-logprobs. Default: 20\n"
        "  --dump-logits ...       Raw logits for token ids (see docs/CLI.md).\n"
        "\n"
        "Quality (docs/QUALITY.md):\n"
        "  --perplexity-file FILE  Perplexity of a raw text: chunks of --ctx tokens\n"
        "                          (default 512 here), the second half of each scored.\n"
        "  --chunks N              Score at most N chunks. Default: all\n"
        "  --ppl-bos               Start every chunk with BOS. Default: only when the\n"
        "                          file's tokenizer.ggml.add_bos_token is true (as\n"
        "                          llama-perplexity does; DeepSeek V4's is false)\n"
        "  --kld-base FILE         Also write the scored log-probabilities as\n"
        "                          llama-perplexity --kl-divergence-base reads them\n"
        "  --numerics MODE         KV-path numerics of --perplexity-file and\n"
        "                          --imatrix-dataset: official (FP8 KV, FP4 indexer),\n"
        "                          hf (clean math, as llama.cpp computes) or auto.\n"
        "                          Default: auto (official where the shapes allow it)\n"
        "  --imatrix-dataset FILE  Collect an importance matrix over prompts: one per\n"
        "                          line, or JSONL of {\"messages\": [...]} / [...] rendered\n"
        "                          in the chat format. Needs --imatrix-out.\n"
        "  --imatrix-out FILE      Where to write it (llama.cpp imatrix.dat layout).\n"
        "  --imatrix-max-prompts N Use at most N prompts. Default: all\n"
        "  --imatrix-max-tokens N  Stop after N tokens in all. Default: no limit\n"
        "  -h, --help              This help.\n"
        "\n",
        f);
    ds4_cli_stream_help(f);
    ds4_cli_edit_help(f);
    fputs("\n"
        "Interactive commands:\n"
        "  /help                   List the commands.\n"
        "  /think /think-max /nothink   Switch the reasoning mode for the next turns.\n"
        "  /ctx N                  Start a new session with context N (the\n"
        "                          conversation is kept and prefilled again).\n"
        "  /read FILE              Send the contents of FILE as the next message.\n"
        "  /save FILE              Save the conversation (JSON messages).\n"
        "  /load FILE              Load a conversation saved with /save.\n"
        "  /quit, /exit            Leave (Ctrl-D too).\n"
        "  Ctrl-C                  Stop the current answer, back to the prompt.\n"
        "\n"
        "Reasoning is shown dimmed between \"<think>\" and \"</think>\" lines on a\n"
        "terminal; prefill and generation speed go to stderr.\n",
        f);
}

static char g_err[256];

static const char *bad_value(const char *opt, const char *v)
{
    snprintf(g_err, sizeof g_err, "invalid value for %s: '%s'", opt, v);
    return g_err;
}

bool ds4_cli_parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static bool parse_float(const char *s, float lo, float hi, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (!*s || *end || errno || !isfinite(v) || v < lo || v > hi) return false;
    *out = v;
    return true;
}

const char *ds4_cli_options_parse(ds4_cli_options *o, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
#define IS(x) (strcmp(a, x) == 0)
#define NEXT()                                                                  \
    (i + 1 < argc ? argv[++i]                                                   \
                  : (snprintf(g_err, sizeof g_err, "%s needs a value", a), (char *)NULL))
        long lv;
        const char *serr = NULL;
        int sr = ds4_cli_stream_option(&o->model_opt, argc, argv, &i, &serr);
        if (sr < 0) return serr;
        if (sr > 0) continue;
        sr = ds4_cli_edit_option(&o->edit, argc, argv, &i, &serr);
        if (sr < 0) return serr;
        if (sr > 0) continue;
        if (IS("-h") || IS("--help")) {
            o->help = true;
        } else if (IS("-m") || IS("--model")) {
            if (!(o->model = NEXT())) return g_err;
            o->model_given = true;
        } else if (IS("-p") || IS("--prompt")) {
            if (!(o->prompt = NEXT())) return g_err;
        } else if (IS("--prompt-file")) {
            if (!(o->prompt_file = NEXT())) return g_err;
        } else if (IS("-sys") || IS("--system")) {
            if (!(o->system = NEXT())) return g_err;
        } else if (IS("--raw-prompt")) {
            o->raw_prompt = true;
        } else if (IS("-n") || IS("--tokens") || IS("--n-predict")) {
            const char *v = NEXT();
            if (!v) return g_err;
            if (!ds4_cli_parse_long(v, 0, 100000000, &lv)) return bad_value(a, v);
            o->n_predict = (int)lv;
        } else if (IS("--ctx") || IS("-c")) {
            const char *v = NEXT();
            if (!v) return g_err;
            if (!ds4_cli_parse_long(v, 16, 1 << 24, &lv)) return bad_value(a, v);
            o->ctx = (int)lv;
            o->ctx_given = true;
        } else if (IS("-t") || IS("--threads")) {
            const char *v = NEXT();
            if (!v) return g_err;
            if (!ds4_cli_parse_long(v, 1, 4096, &lv)) return bad_value(a, v);
            o->threads = (int)lv;
        } else if (IS("--cpu")) {
            o->backend = 1;
        } else if (IS("--cuda")) {
            o->backend = 2;
        } else if (IS("--gpu-device")) {
            const char *v = NEXT();
            if (!v) return g_err;
            if (!ds4_cli_parse_long(v, 0, 1024, &lv)) return bad_value(a, v);
            o->gpu_device = (int)lv;
        } else if (IS("--think")) {
            o->think = DS4_CLI_THINK;
        } else if (IS("--think-max")) {
            o->think = DS4_CLI_THINK_MAX;
        } else if (IS("--nothink")) {
            o->think = DS4_CLI_NOTHINK;
        } else if (IS("--temp")) {
            const char *v = NEXT();
            if (!v) return g_err;
            if (!parse_float(v, 0.0f, 100.0f, &o->temp)) return bad_value(a, v);
        } else if (IS("--top-p")) {
            const char *v = NEXT();
            if (!v) return g_err;
            if (!parse_float(v, 0.0f, 1.0f, &o->top_p) || o->top_p <= 0.0f) return bad_value(a, v);
        } else if (IS("--min-p")) {
            const char *v = NEXT();
            if (!v) return g_err;
            if (!parse_float(v, 0.0f, 1.0f, &o->min_p)) return bad_value(a, v);
        } else if (IS("--top-k")) {
            const char *v = NEXT();
            if (!v) return g_err;
            if (!ds4_cli_parse_long(v, 0, 1 << 24, &lv)) return bad_value(a, v);
            o->top_k = (int)lv;
        } else if (IS("--seed")) {
            const char *v = NEXT();
            if (!v) return g_err;
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (!*v || *end || errno || v[0] == '-') return bad_value(a, v);
            o->seed = s;
            o->seed_set = true;
        } else if (IS("--perplexity-file")) {
            if (!(o->perplexity_file = NEXT())) return g_err;
        } else if (IS("--chunks")) {
            const char *v = NEXT();
            if (!v) return g_err;
            if (!ds4_cli_parse_long(v, 1, 1 << 30, &lv)) return bad_value(a, v);
            o->ppl_chunks = (int)lv;
        } else if (IS("--kld-base")) {
            if (!(o->kld_base = NEXT())) return g_err;
        } else if (IS("--ppl-bos")) {
            o->ppl_bos = true;
        } else if (IS("--numerics")) {
            const char *v = NEXT();
            if (!v) return g_err;
            if (!strcmp(v, "official")) o->numerics = DS4_NUMERICS_OFFICIAL;
            else if (!strcmp(v, "hf")) o->numerics = DS4_NUMERICS_HF;
            else if (!strcmp(v, "auto")) o->numerics = DS4_NUMERICS_AUTO;
            else {
                snprintf(g_err, sizeof g_err, "--numerics takes official, hf or auto, not '%s'", v);
                return g_err;
            }
            o->numerics_given = true;
        } else if (IS("--imatrix-dataset")) {
            if (!(o->imatrix_dataset = NEXT())) return g_err;
        } else if (IS("--imatrix-out")) {
            if (!(o->imatrix_out = NEXT())) return g_err;
        } else if (IS("--imatrix-max-prompts")) {
            const char *v = NEXT();
            if (!v) return g_err;
            if (!ds4_cli_parse_long(v, 1, 1 << 30, &lv)) return bad_value(a, v);
            o->imatrix_max_prompts = (int)lv;
        } else if (IS("--imatrix-max-tokens")) {
            const char *v = NEXT();
            if (!v) return g_err;
            if (!ds4_cli_parse_long(v, 1, (long)1 << 40, &lv)) return bad_value(a, v);
            o->imatrix_max_tokens = lv;
        } else if (IS("--dump-tokens")) {
            o->dump_tokens = true;
        } else if (IS("--dump-logprobs")) {
            if (!(o->dump_logprobs = NEXT())) return g_err;
        } else if (IS("--logprobs-top-k")) {
            const char *v = NEXT();
            if (!v) return g_err;
            if (!ds4_cli_parse_long(v, 1, 1000, &lv)) return bad_value(a, v);
            o->logprobs_top_k = (int)lv;
        } else {
            snprintf(g_err, sizeof g_err, "unknown option '%s' (see ds4 --help)", a);
            return g_err;
        }
#undef IS
#undef NEXT
    }
    if ((o->imatrix_dataset != NULL) != (o->imatrix_out != NULL))
        return "--imatrix-dataset and --imatrix-out go together";
    if (o->perplexity_file && o->imatrix_dataset) return "give either --perplexity-file or --imatrix-dataset, not both";
    if (o->ppl_bos && !o->perplexity_file) return "--ppl-bos goes with --perplexity-file";
    if (o->kld_base && !o->perplexity_file) return "--kld-base goes with --perplexity-file";
    /* llama-perplexity replaces the first token by BOS only when its vocabulary says so */
    if (o->kld_base && o->ppl_bos) return "--kld-base and --ppl-bos: a KL-divergence base must keep the vocabulary's BOS rule";
    if (o->numerics_given && !o->perplexity_file && !o->imatrix_dataset)
        return "--numerics goes with --perplexity-file or --imatrix-dataset (ds4 --dump-logits has its own)";
    if (ds4_cli_stream_check(&o->model_opt)) return ds4_cli_stream_check(&o->model_opt);
    if (ds4_cli_edit_check(&o->edit)) return ds4_cli_edit_check(&o->edit);
    if (o->prompt && o->prompt_file) return "give either -p or --prompt-file, not both";
    if ((o->dump_tokens || o->dump_logprobs) && !o->prompt && !o->prompt_file)
        return "--dump-tokens and --dump-logprobs need -p TEXT or --prompt-file FILE";
    return NULL;
}

/*
 * cli_options.h - the `ds4` command line: options, defaults, parsing, help.
 *
 * Flag names follow antirez/ds4 where it has them (-m, -p, --prompt-file,
 * -n, --ctx, --think/--nothink/--think-max, --temp, --top-p, --top-k,
 * --min-p, --seed, -sys/--system, -t/--threads, --dump-tokens,
 * --dump-logprobs, --logprobs-top-k), so its users need not relearn.
 * Parsing never exits: it returns an error string for main to print.
 */
#ifndef DS4_CLI_OPTIONS_H
#define DS4_CLI_OPTIONS_H

#include "include/ds4.h"
#include "cli/cli_edit_options.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef enum { DS4_CLI_NOTHINK, DS4_CLI_THINK, DS4_CLI_THINK_MAX } ds4_cli_think;

/* Think Max needs this much context (DeepSeek's recommendation; ds4 uses
 * the same gate and falls back to normal thinking below it). */
#define DS4_CLI_THINK_MAX_MIN_CTX 393216

typedef struct {
    const char *model;          /* -m, default ./ds4flash.gguf */
    const char *prompt;         /* -p */
    const char *prompt_file;    /* --prompt-file */
    const char *system;         /* -sys/--system; NULL = default */
    int n_predict;              /* -n */
    int ctx;                    /* --ctx */
    int threads;                /* -t; 0 = all cores */
    int backend;                /* 0 auto, 1 --cpu, 2 --cuda (ds4_backend_kind) */
    int gpu_device;             /* --gpu-device N */
    ds4_cli_think think;
    float temp, top_p, min_p;
    int top_k;                  /* 0 = off */
    uint64_t seed;
    bool seed_set;
    bool dump_tokens;
    const char *dump_logprobs;  /* FILE */
    int logprobs_top_k;
    bool raw_prompt;            /* --raw-prompt: no chat template */
    bool help;
    bool model_given; /* -m was on the command line */
    bool ctx_given;   /* --ctx was on the command line */
    /* Quality tools (cli/cli_perplexity.c, cli/cli_imatrix.c, docs/QUALITY.md). */
    const char *perplexity_file; /* --perplexity-file FILE */
    int ppl_chunks;              /* --chunks N; 0 = all */
    const char *kld_base;        /* --kld-base FILE: llama-perplexity's --kl-divergence-base layout */
    bool ppl_bos;                /* --ppl-bos: BOS starts every chunk whatever the vocabulary says */
    int numerics;                /* --numerics (ds4_numerics), sessions of the quality tools; default auto */
    bool numerics_given;
    const char *imatrix_dataset; /* --imatrix-dataset FILE */
    const char *imatrix_out;     /* --imatrix-out FILE */
    int imatrix_max_prompts;     /* --imatrix-max-prompts N; 0 = all */
    int64_t imatrix_max_tokens;  /* --imatrix-max-tokens N; 0 = no limit */
    ds4_model_options model_opt; /* --ssd-streaming*, --expert-profile (cli_stream_options.h) */
    ds4_cli_edit edit;           /* --dir-steering-*, --power (cli_edit_options.h) */
} ds4_cli_options;

void ds4_cli_options_default(ds4_cli_options *o);
/* Parse argv. Returns NULL on success or a static/thread-local message. */
const char *ds4_cli_options_parse(ds4_cli_options *o, int argc, char **argv);
void ds4_cli_print_help(FILE *f);

/* s is a whole decimal number in [lo, hi] (nothing after it): *out = it.
 * For the flags of ds4 and ds4-agent. */
bool ds4_cli_parse_long(const char *s, long lo, long hi, long *out);

#endif

/*
 * ds4_main.c - the `ds4` command: one-shot answers, interactive chat, and
 * tokenizer/logit diagnostics (options in cli_options.c, docs/CLI.md).
 *
 * main only dispatches: --dump-logits goes to the model's logit dumper
 * (cli/dump_logits.c, which parses its own options), --dump-tokens needs
 * only the tokenizer, everything else needs the engine.
 */
#include "include/ds4.h"
#include "cli/cli_chat.h"
#include "cli/cli_dump_tokens.h"
#include "cli/cli_imatrix.h"
#include "cli/cli_io.h"
#include "cli/cli_logprobs.h"
#include "cli/cli_options.h"
#include "cli/cli_perplexity.h"
#include "cli/cli_repl.h"
#include "cli/cli_sigint.h"
#include "include/ds4_tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__has_include)
#if __has_include("cli/dump_logits.h")
#include "cli/dump_logits.h"
#include "util/version.h"
#define HAVE_DUMP_LOGITS 1
#endif
#endif

static bool has_arg(int argc, char **argv, const char *flag)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], flag) == 0) return true;
    return false;
}

/* The prompt text from -p or --prompt-file (malloc'd). */
static char *prompt_text(const ds4_cli_options *o, size_t *len)
{
    if (o->prompt_file) return ds4_cli_read_file(o->prompt_file, len);
    *len = strlen(o->prompt);
    char *s = malloc(*len + 1);
    if (s) memcpy(s, o->prompt, *len + 1);
    return s;
}

static int run_dump_tokens(const ds4_cli_options *o)
{
    ds4_tokenizer *tok = ds4_tokenizer_load(o->model);
    if (!tok) {
        fprintf(stderr, "ds4: %s\n", ds4_last_error());
        return 1;
    }
    size_t len;
    char *text = prompt_text(o, &len);
    int rc = text ? ds4_cli_dump_tokens(tok, text, len, stdout) : 1;
    free(text);
    ds4_tokenizer_free(tok);
    return rc;
}

int main(int argc, char **argv)
{
    if (ds4_version_requested(argc, argv)) { ds4_version_print(stdout, "ds4"); return 0; }
    /* under mpirun: ranks other than 0 serve the pipeline here (docs/DISTRIBUTED.md) */
    int dist_rc;
    if (ds4_dist_init(&argc, argv, &dist_rc)) return dist_rc;
    if (has_arg(argc, argv, "--dump-logits")) {
#ifdef HAVE_DUMP_LOGITS
        return ds4_cli_dump_logits(argc, argv);
#else
        fprintf(stderr, "ds4: --dump-logits is not built into this binary\n");
        return 2;
#endif
    }
    ds4_cli_options o;
    ds4_cli_options_default(&o);
    const char *err = ds4_cli_options_parse(&o, argc, argv);
    if (o.help) {
        ds4_cli_print_help(stdout);
        return 0;
    }
    if (err) {
        fprintf(stderr, "ds4: %s\n", err);
        return 2;
    }
    char demo_path[4096];
    if (!o.model_given && access(o.model, R_OK) != 0) {
        if (!ds4_cli_find_demo_model(demo_path, sizeof demo_path)) {
            fprintf(stderr, "ds4: no model: %s not found and the demo model models/ds4-demo.gguf is missing "
                            "(pass -m FILE)\n", o.model);
            return 1;
        }
        fprintf(stderr, "ds4: %s not found; using the tiny demo model %s (see models/README.md)\n", o.model,
                demo_path);
        o.model = demo_path;
    }
    if (o.dump_tokens) return run_dump_tokens(&o);
    if (o.perplexity_file) return ds4_cli_perplexity(&o);
    if (o.imatrix_dataset) return ds4_cli_imatrix(&o);
    if (o.think == DS4_CLI_THINK_MAX && o.ctx < DS4_CLI_THINK_MAX_MIN_CTX)
        fprintf(stderr, "ds4: warning: --think-max needs --ctx >= %d; ctx %d uses normal thinking\n",
                DS4_CLI_THINK_MAX_MIN_CTX, o.ctx);

    ds4_cli_chat chat;
    if (!ds4_cli_chat_open(&chat, &o)) {
        ds4_cli_chat_close(&chat);
        return 1;
    }
    int rc = 0;
    if (!o.prompt && !o.prompt_file) {
        rc = ds4_cli_repl(&chat);
    } else {
        size_t len;
        char *text = prompt_text(&o, &len);
        ds4_cli_install_sigint();
        if (!text) {
            rc = 1;
        } else if (o.dump_logprobs) {
            size_t plen = len;
            ds4_spans tpl = {0};
            char *prompt = o.raw_prompt ? text : ds4_cli_chat_first_prompt(&chat, text, len, &plen, &tpl);
            rc = prompt ? ds4_cli_dump_logprobs(&chat, prompt, plen, o.raw_prompt ? NULL : &tpl) : 1;
            if (prompt != text) free(prompt);
            ds4_spans_free(&tpl);
        } else if (o.raw_prompt) {
            rc = ds4_cli_chat_raw_turn(&chat, text, len, true) ? 0 : 1;
        } else {
            rc = ds4_cli_chat_turn(&chat, text, len, true) ? 0 : 1;
        }
        free(text);
    }
    ds4_cli_chat_close(&chat);
    return rc;
}

/*
 * ds4_eval_main.c - ds4-eval: the built-in capability suite (eval_suite.h,
 * docs/QUALITY.md). Argument parsing only.
 */
#include "include/ds4.h"
#include "tools/eval_suite.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fputs("usage: ds4-eval [-m MODEL] [options]\n"
          "\n"
          "Asks MODEL the built-in questions (arithmetic, code, facts, format, tools),\n"
          "each answer checked by the rule the question states, and prints the score\n"
          "per category. Greedy decoding: a run is reproducible.\n"
          "\n"
          "  -m, --model FILE      GGUF model (default ./ds4flash.gguf, else the demo model)\n"
          "  --category NAME       only this category\n"
          "  --limit N             only the first N questions\n"
          "  --think / --nothink   thinking mode (default) or chat mode\n"
          "  --think-budget N      reasoning tokens before </think> is forced (default 2048)\n"
          "  --max-tokens N        answer tokens after the reasoning (default 256)\n"
          "  --ctx N               context per question (default 8192)\n"
          "  --trace FILE          one JSON line per question: prompt, rule, full output,\n"
          "                        answer, tool calls, verdict and why\n"
          "  --list                print the questions and their rules, and exit\n"
          "  -t, --threads N, --cpu, --cuda\n"
          "Exit status: 0 when the suite ran (whatever the score), 1 error, 2 usage.\n",
          f);
}

static int num(const char *flag, const char *v, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "ds4-eval: %s needs an integer in %ld..%ld\n", flag, lo, hi);
        return 0;
    }
    *out = (int)x;
    return 1;
}

int main(int argc, char **argv)
{
    eval_opts o = {.model = "./ds4flash.gguf", .thinking = true, .think_budget = 2048, .max_tokens = 256, .ctx = 8192};
    bool model_given = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define IS(x) (strcmp(a, x) == 0)
        if (IS("-h") || IS("--help")) {
            usage(stdout);
            return 0;
        } else if (IS("--list")) {
            for (int q = 0; q < eval_n_questions; q++) {
                const eval_question *e = &eval_questions[q];
                printf("%s\t%s\t%s%s%s %s\t", e->id, e->category, eval_rule_name(e->rule), e->tool ? " " : "",
                       e->tool ? e->tool : "", e->expected);
                for (const char *p = e->prompt; *p; p++) putchar(*p == '\n' ? ' ' : *p);
                putchar('\n');
            }
            return 0;
        } else if (IS("-m") || IS("--model")) {
            if (!v) return fprintf(stderr, "ds4-eval: %s needs a value\n", a), 2;
            o.model = v;
            model_given = true;
            i++;
        } else if (IS("--category")) {
            if (!v) return fprintf(stderr, "ds4-eval: %s needs a value\n", a), 2;
            o.category = v;
            i++;
        } else if (IS("--trace")) {
            if (!v) return fprintf(stderr, "ds4-eval: %s needs a value\n", a), 2;
            o.trace = v;
            i++;
        } else if (IS("--limit")) {
            if (!num(a, v, 1, 1000000, &o.limit)) return 2;
            i++;
        } else if (IS("--think-budget")) {
            if (!num(a, v, 1, 1 << 24, &o.think_budget)) return 2;
            i++;
        } else if (IS("--max-tokens")) {
            if (!num(a, v, 1, 1 << 24, &o.max_tokens)) return 2;
            i++;
        } else if (IS("--ctx")) {
            if (!num(a, v, 64, 1 << 24, &o.ctx)) return 2;
            i++;
        } else if (IS("-t") || IS("--threads")) {
            if (!num(a, v, 1, 4096, &o.threads)) return 2;
            i++;
        } else if (IS("--think")) {
            o.thinking = true;
        } else if (IS("--nothink")) {
            o.thinking = false;
        } else if (IS("--cpu")) {
            o.backend = DS4_BACKEND_CPU;
        } else if (IS("--cuda")) {
            o.backend = DS4_BACKEND_CUDA;
        } else {
            fprintf(stderr, "ds4-eval: unknown option '%s' (see ds4-eval --help)\n", a);
            return 2;
        }
#undef IS
    }
    if (!model_given && access(o.model, R_OK) != 0 && access("models/ds4-demo.gguf", R_OK) == 0) {
        fprintf(stderr, "ds4-eval: %s not found; using the demo model models/ds4-demo.gguf\n", o.model);
        o.model = "models/ds4-demo.gguf";
    }
    return eval_run(&o);
}

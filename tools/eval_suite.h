/*
 * eval_suite.h - the `ds4-eval` capability suite (docs/QUALITY.md): the
 * questions built into the binary (eval_questions.c), the answer checks
 * (eval_check.c) and the runner (eval_run.c).
 *
 * Every question states how its answer is checked, so a score means the
 * same thing on every model:
 *   number      the last number in the answer equals `expected`
 *   exact       the whole answer equals `expected` (trimmed; surrounding
 *               quotes/backticks and a final period dropped; any case)
 *   exact_case  the same, case-sensitive
 *   contains    the answer contains one of the '|'-separated alternatives
 *               of `expected` (any case)
 *   regex       the trimmed answer matches the PCRE2 pattern `expected`
 *   lines       exactly `expected` non-empty lines
 *   words_max   1 to `expected` words
 *   json_eq     the answer (``` fences allowed) is JSON equal to `expected`
 *   tool        a tool call named `tool` whose arguments hold every key of
 *               `expected` (a JSON object) with an equal value (strings
 *               any case; numbers by value, also when sent as strings; a
 *               key written "~k" needs the value only to contain it)
 */
#ifndef DS4_TOOLS_EVAL_SUITE_H
#define DS4_TOOLS_EVAL_SUITE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef enum {
    EVAL_NUMBER,
    EVAL_EXACT,
    EVAL_EXACT_CASE,
    EVAL_CONTAINS,
    EVAL_REGEX,
    EVAL_LINES,
    EVAL_WORDS_MAX,
    EVAL_JSON_EQ,
    EVAL_TOOL,
} eval_rule;

typedef struct {
    const char *id;
    const char *category; /* arithmetic, code, facts, format, tools */
    const char *prompt;
    eval_rule rule;
    const char *expected;
    const char *tool; /* EVAL_TOOL: the function name expected */
} eval_question;

extern const eval_question eval_questions[];
extern const int eval_n_questions;
/* The tools declared to every "tools" question (OpenAI "tools" JSON). */
extern const char eval_tools_json[];

const char *eval_rule_name(eval_rule r);

/* Check an answer. content: the answer text (after any reasoning);
 * calls: the parsed tool calls (array, may be NULL). *why receives a short
 * reason on failure (static or malloc'd into why_buf of why_cap). */
bool eval_check(const eval_question *q, const char *content, const json_t *calls, char *why, size_t why_cap);

typedef struct {
    const char *model;
    const char *category; /* NULL: all */
    const char *trace;    /* NULL: none */
    int limit;            /* 0: all */
    bool thinking;
    int think_budget;     /* reasoning tokens before </think> is forced */
    int max_tokens;       /* answer tokens after the reasoning */
    int ctx;
    int threads;
    int backend;
} eval_opts;

/* Run the suite, print progress (stderr) and the report (stdout).
 * Returns the exit status: 0 when it ran (whatever the score), 1 on error. */
int eval_run(const eval_opts *o);

#endif

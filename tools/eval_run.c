/*
 * eval_run.c - the `ds4-eval` runner (see eval_suite.h).
 *
 * Each question is one fresh chat (no system prompt; the "tools"
 * questions declare eval_tools_json), rendered in the model's chat format
 * and answered greedily, so a run is reproducible. In thinking mode the
 * reasoning gets --think-budget tokens: if the model has not closed it by
 * then, "</think>" is fed for it (the question is marked budget_hit in the
 * trace) and the answer gets its own --max-tokens. The answer (after the
 * reasoning, DSML tool calls parsed out) is checked by the question's rule.
 */
#include "tools/eval_suite.h"

#include "include/ds4.h"
#include "include/ds4_chat.h"
#include "include/ds4_dsml.h"
#include "include/ds4_sampler.h"
#include "include/ds4_tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    char *text;
    size_t len, cap;
} buf;

static bool put(buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *p = realloc(b->text, cap);
        if (!p) return false;
        b->text = p;
        b->cap = cap;
    }
    memcpy(b->text + b->len, s, n);
    b->len += n;
    b->text[b->len] = 0;
    return true;
}

typedef struct {
    int reason_tokens, answer_tokens;
    bool budget_hit, truncated;
} gen_info;

/* Generate one answer into out. DS4_OK or an engine error (message set). */
static ds4_status generate(const eval_opts *o, ds4_session *s, const ds4_tokenizer *tok, const ds4_tokens *prompt,
                           int n_vocab, buf *out, gen_info *gi)
{
    const int32_t eos = ds4_tokenizer_special(tok, DS4_TOK_EOS), think_end = ds4_tokenizer_special(tok, DS4_TOK_THINK_END);
    memset(gi, 0, sizeof *gi);
    ds4_session_reset(s);
    ds4_status st = ds4_session_prefill(s, prompt->ids, (int64_t)prompt->n, NULL);
    bool reasoning = o->thinking;
    while (st == DS4_OK) {
        if (ds4_session_n_past(s) + 2 >= o->ctx) {
            gi->truncated = true;
            break;
        }
        const float *l = ds4_session_logits(s);
        int32_t t = l ? ds4_argmax(l, n_vocab) : -1;
        if (t < 0) return ds4_session_logits(s) ? DS4_ERR_BACKEND : DS4_ERR_INVALID;
        if (t == eos) break;
        size_t n;
        const char *b = ds4_token_bytes(tok, t, &n);
        if (!put(out, b, n)) return DS4_ERR_NOMEM;
        st = ds4_session_decode(s, t);
        if (reasoning) {
            if (t == think_end) {
                reasoning = false;
                continue;
            }
            if (++gi->reason_tokens >= o->think_budget && st == DS4_OK) {
                /* Budget spent: close the reasoning for the model. */
                b = ds4_token_bytes(tok, think_end, &n);
                if (!put(out, b, n)) return DS4_ERR_NOMEM;
                st = ds4_session_decode(s, think_end);
                gi->budget_hit = true;
                reasoning = false;
            }
        } else if (++gi->answer_tokens >= o->max_tokens) {
            gi->truncated = true;
            break;
        }
    }
    return st;
}

typedef struct {
    const char *name;
    int pass, total;
} cat_score;

int eval_run(const eval_opts *o)
{
    ds4_tokenizer *tok = ds4_tokenizer_load(o->model);
    if (!tok) {
        fprintf(stderr, "ds4-eval: %s\n", ds4_last_error());
        return 1;
    }
    int n_sel = 0;
    for (int i = 0; i < eval_n_questions; i++)
        if (!o->category || strcmp(o->category, eval_questions[i].category) == 0) n_sel++;
    if (n_sel == 0) {
        fprintf(stderr, "ds4-eval: no question in category '%s' (see ds4-eval --list)\n", o->category);
        ds4_tokenizer_free(tok);
        return 1;
    }
    if (o->limit > 0 && o->limit < n_sel) n_sel = o->limit;
    FILE *trace = NULL;
    if (o->trace && !(trace = fopen(o->trace, "w"))) {
        fprintf(stderr, "ds4-eval: cannot create trace file %s\n", o->trace);
        ds4_tokenizer_free(tok);
        return 1;
    }
    ds4_model *m = ds4_model_open(o->model, NULL);
    ds4_session *s = NULL;
    if (m) {
        ds4_session_params p;
        ds4_session_params_default(&p);
        p.n_ctx = o->ctx;
        p.n_threads = o->threads;
        p.backend = (ds4_backend_kind)o->backend;
        s = ds4_session_create(m, &p);
    }
    json_t *tools = json_loads(eval_tools_json, 0, NULL);
    int rc = 1;
    if (!s || !tools) {
        fprintf(stderr, "ds4-eval: %s\n", ds4_last_error());
        goto done;
    }
    const int V = ds4_model_n_vocab(m);
    cat_score cats[16];
    int n_cats = 0, done_n = 0, passed = 0, budget_hits = 0;
    int64_t gen_tokens = 0;
    const double t0 = now_s();
    for (int i = 0; i < eval_n_questions && done_n < n_sel; i++) {
        const eval_question *q = &eval_questions[i];
        if (o->category && strcmp(o->category, q->category) != 0) continue;
        done_n++;
        const bool use_tools = q->rule == EVAL_TOOL;
        json_t *msgs = json_pack("[{s:s,s:s}]", "role", "user", "content", q->prompt);
        ds4_chat_options co;
        ds4_chat_options_default(&co);
        co.thinking = o->thinking;
        ds4_tokens ids = {0};
        /* template spans: only the template's markers become control tokens */
        ds4_status st = ds4_chat_tokenize(tok, msgs, use_tools ? tools : NULL, &co, &ids);
        json_decref(msgs);
        buf out = {0};
        gen_info gi;
        const double tq = now_s();
        if (!st) st = generate(o, s, tok, &ids, V, &out, &gi);
        ds4_tokens_free(&ids);
        if (st) {
            fprintf(stderr, "\nds4-eval: %s: %s\n", q->id, ds4_last_error());
            free(out.text);
            goto done;
        }
        ds4_gen_state gs;
        char *perr = NULL;
        json_t *msg = ds4_dsml_parse_message(out.text ? out.text : "", out.len, o->thinking, use_tools, &gs, &perr);
        const char *content = json_string_value(json_object_get(msg, "content"));
        const json_t *calls = json_object_get(msg, "tool_calls");
        char why[160];
        bool ok = msg && eval_check(q, content, calls, why, sizeof why);
        if (!msg) snprintf(why, sizeof why, "unparsable output");
        passed += ok;
        budget_hits += gi.budget_hit;
        gen_tokens += gi.reason_tokens + gi.answer_tokens;
        int c = 0;
        while (c < n_cats && strcmp(cats[c].name, q->category) != 0) c++;
        if (c == n_cats && n_cats < 16) cats[n_cats++] = (cat_score){q->category, 0, 0};
        if (c < n_cats) {
            cats[c].total++;
            cats[c].pass += ok;
        }
        fprintf(stderr, "[%d/%d] %-22s %s  (%d+%d tokens%s, %.1f s)%s%s\n", done_n, n_sel, q->id, ok ? "PASS" : "FAIL",
                gi.reason_tokens, gi.answer_tokens, gi.budget_hit ? ", budget hit" : "", now_s() - tq, ok ? "" : ": ",
                ok ? "" : why);
        if (trace) {
            json_t *tr = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s?,s:s#,s:s?,s:O?,s:b,s:s,s:i,s:i,s:b,s:b}", "id", q->id,
                                   "category", q->category, "prompt", q->prompt, "rule", eval_rule_name(q->rule),
                                   "expected", q->expected, "tool", q->tool, "output", out.text ? out.text : "",
                                   out.len, "answer", content, "tool_calls", calls, "pass", ok, "why", ok ? "" : why,
                                   "reasoning_tokens", gi.reason_tokens, "answer_tokens", gi.answer_tokens,
                                   "budget_hit", gi.budget_hit, "truncated", gi.truncated);
            char *line = tr ? json_dumps(tr, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
            if (line) fprintf(trace, "%s\n", line);
            free(line);
            json_decref(tr);
        }
        json_decref(msg);
        free(perr);
        free(out.text);
    }
    const double el = now_s() - t0;
    printf("ds4-eval: %s, %s mode%s, %d questions, %.0f s, %lld tokens generated\n\n", o->model,
           o->thinking ? "thinking" : "chat", o->thinking ? "" : "", done_n, el, (long long)gen_tokens);
    printf("%-12s %8s %8s\n", "category", "passed", "score");
    for (int c = 0; c < n_cats; c++)
        printf("%-12s %4d/%-3d %7.1f%%\n", cats[c].name, cats[c].pass, cats[c].total, 100.0 * cats[c].pass / cats[c].total);
    printf("%-12s %4d/%-3d %7.1f%%\n", "total", passed, done_n, 100.0 * passed / done_n);
    if (o->thinking) printf("\nthinking budget %d tokens: reached by %d questions\n", o->think_budget, budget_hits);
    rc = 0;
done:
    if (trace && fclose(trace) != 0 && rc == 0) {
        fprintf(stderr, "ds4-eval: writing %s failed\n", o->trace);
        rc = 1;
    }
    json_decref(tools);
    ds4_session_free(s);
    ds4_model_close(m);
    ds4_tokenizer_free(tok);
    return rc;
}

/*
 * prompt_render.c - the official V4 encoder for API requests (see header).
 *
 * Walks the messages once, grouping consecutive user and tool messages into
 * one user turn (official preprocessing, chat-format §3.1) and emitting the
 * assistant transitions of §3.2. The format pieces (tools block, canonical
 * DSML, Think Max prefix) come from the text layer (ds4_dsml.h, ds4_chat.h);
 * what is the server's own is the walk over api_request and the exact-replay
 * substitution, which text/chat_render.c has no notion of.
 */
#include "server/prompt_render.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "include/ds4_chat.h"
#include "include/ds4_dsml.h"
#include "server/tool_memory.h"

/* tpl (may be NULL) receives the ranges the template writes: markers,
 * separators, the tools block's wording, replayed blocks (the server's own
 * sampled bytes). Request text is content: it never yields control
 * tokens (include/ds4_tokenizer.h, "template spans"). */
typedef struct { char *p; size_t len, cap; int oom; ds4_spans *tpl; } buf;

static void put(buf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 1024;
        while (cap < b->len + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) { b->oom = 1; return; }
        b->p = q; b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void puts_(buf *b, const char *s) { put(b, s, strlen(s)); }

/* Template text: appended and its range recorded. */
static void tpl_(buf *b, const char *s)
{
    size_t at = b->len;
    puts_(b, s);
    if (b->tpl && !b->oom) ds4_spans_add(b->tpl, at, strlen(s));
}

/* A rendered piece of the text layer with its own template ranges. */
static void put_rendered(buf *b, const char *s, size_t n, const ds4_spans *sp)
{
    size_t at = b->len;
    put(b, s, n);
    if (b->tpl && !b->oom) ds4_spans_append(b->tpl, sp, at);
}

/* The tools block (text layer, official wording) for the request's tools,
 * whose schemas api_request kept as JSON text in the client's key order. */
static void put_tools_block(buf *b, const api_request *r)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < r->n_tools; i++) {
        json_t *t = json_loads(r->tools[i].schema_json, 0, NULL);
        if (t) json_array_append_new(arr, t);
    }
    char *out = NULL;
    size_t n = 0;
    ds4_spans sp = {0};
    if (ds4_dsml_render_tools_spans(arr, &sp, &out, &n) == DS4_OK) put_rendered(b, out, n, &sp);
    else b->oom = 1;
    free(out);
    ds4_spans_free(&sp);
    json_decref(arr);
}

/* Structured output (chat-format §3.2, a system message's
 * response_format): the schema the answer must follow, after the tools. */
static void put_response_format(buf *b, const api_request *r)
{
    if (r->response_format == RF_TEXT) return;
    tpl_(b, "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n");
    json_t *s = r->rf_schema ? json_loads(r->rf_schema, 0, NULL) : json_pack("{s:s}", "type", "object");
    char *t = s ? json_dumps(s, JSON_ENCODE_ANY | JSON_REAL_PRECISION(17)) : NULL;
    if (t) puts_(b, t);
    else b->oom = 1;
    free(t);
    json_decref(s);
}

/* Canonical DSML (text layer: the official encoder's form). */
static void put_calls(buf *b, const api_tool_call *calls, size_t n)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(arr, json_pack("{s:s, s:s}", "name", calls[i].name, "arguments",
                                             calls[i].arguments));
    char *out = NULL;
    size_t len = 0;
    ds4_spans sp = {0};
    if (ds4_dsml_render_calls_spans(arr, &sp, &out, &len) == DS4_OK) put_rendered(b, out, len, &sp);
    else b->oom = 1;
    free(out);
    ds4_spans_free(&sp);
    json_decref(arr);
}

/* What separates an assistant turn's content from its tool-call block. */
#define CALLS_SEP "\n\n"

/* One canonical call of `name` without parameters, as put_calls renders it. */
static char *render_one_call(const char *name, size_t *len)
{
    api_tool_call c = {NULL, (char *)name, (char *)"{}"};
    buf b = {0};
    put_calls(&b, &c, 1);
    if (b.oom) { free(b.p); return NULL; }
    *len = b.len;
    return b.p;
}

char *prompt_render_call_opening(const char *name)
{
    /* cut after `name="` (no name), or after the `">\n` that ends the
     * invoke tag: a call without parameters continues with "\n</invoke>" */
    size_t len = 0;
    char *r = render_one_call(name ? name : "x", &len);
    if (!r) return NULL;
    const char *at = strstr(r, "name=\"");
    size_t keep = 0;
    if (at) {
        keep = (size_t)(at - r) + strlen("name=\"");
        if (name) {
            keep += strlen(name);
            if (keep + 3 <= len && !memcmp(r + keep, "\">\n", 3)) keep += 3;
            else keep = 0;
        }
    }
    buf b = {0};
    if (keep) {
        puts_(&b, CALLS_SEP);
        put(&b, r, keep);
    }
    free(r);
    if (!keep || b.oom) { free(b.p); return NULL; }
    return b.p;
}

char *prompt_render_calls_close(void)
{
    /* the block's tail after the (last) invoke's closing tag */
    size_t len = 0;
    char *r = render_one_call("x", &len);
    if (!r) return NULL;
    static const char end_tag[] = "</" DS4_DSML "invoke>";
    const char *inv = strstr(r, end_tag);
    char *out = inv ? strdup(inv + strlen(end_tag)) : NULL;
    free(r);
    return out;
}

/* Position of a tool result among the calls of the last assistant message
 * before it (unknown ids sort first, as the official encoder does). */
static size_t call_order(const api_message *asst, const char *id)
{
    if (!asst || !id) return 0;
    for (size_t i = 0; i < asst->n_calls; i++)
        if (asst->calls[i].id && !strcmp(asst->calls[i].id, id)) return i;
    return 0;
}

/* One user turn: the user and tool messages from..to merged (chat-format
 * §3.1), and the system messages among them. The official encoder renders
 * a system message in the middle of the list in place, glued to its
 * neighbours: after an assistant turn that is raw text between its EOS and
 * the next <｜User｜>, read like the system prompt; but one that follows a
 * user message (Claude Code appends its environment, agent and skill lists
 * so) would glue onto the user's words, and one that ends the list opens no
 * assistant turn at all. Here every system message of a turn goes before
 * its <｜User｜>, glued as the official form glues it after an assistant
 * turn (separated by "\n\n" from one another): the user's words stay the
 * last thing the model reads, the turn still ends in the assistant
 * transition, and a growing conversation keeps each in the same place
 * (prefix reuse). */
static void put_user_turn(buf *b, const api_request *r, size_t from, size_t to,
                          const api_message *last_asst)
{
    bool first = true;
    for (size_t i = from; i < to; i++) {
        if (r->msgs[i].role != ROLE_SYSTEM) continue;
        if (!first) tpl_(b, "\n\n");
        puts_(b, r->msgs[i].content);
        first = false;
    }
    tpl_(b, DS4_USER);
    /* Tool results first in call order (stable), then the text blocks in
     * their own order, as the merged block list reads. */
    size_t *idx = malloc((to - from ? to - from : 1) * sizeof *idx);
    if (!idx) { b->oom = 1; return; }
    size_t n = 0;
    for (size_t i = from; i < to; i++)
        if (r->msgs[i].role != ROLE_SYSTEM) idx[n++] = i;
    /* insertion sort of the tool results by call order, user texts keep
     * their position relative to each other after the results before them */
    for (size_t i = 1; i < n; i++) {
        size_t x = idx[i];
        if (r->msgs[x].role != ROLE_TOOL) continue;
        size_t j = i;
        while (j > 0 && r->msgs[idx[j - 1]].role == ROLE_TOOL &&
               call_order(last_asst, r->msgs[idx[j - 1]].tool_call_id) >
                   call_order(last_asst, r->msgs[x].tool_call_id)) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = x;
    }
    for (size_t i = 0; i < n; i++) {
        const api_message *m = &r->msgs[idx[i]];
        if (i) tpl_(b, "\n\n");
        if (m->role == ROLE_TOOL) {
            tpl_(b, "<tool_result>");
            puts_(b, m->content);
            tpl_(b, "</tool_result>");
        } else {
            puts_(b, m->content);
        }
    }
    free(idx);
}

char *prompt_render(const api_request *r, const render_opts *o, size_t *len,
                    int *replayed)
{
    return prompt_render_spans(r, o, len, replayed, NULL);
}

char *prompt_render_spans(const api_request *r, const render_opts *o, size_t *len,
                          int *replayed, ds4_spans *tpl)
{
    buf b = {0};
    b.tpl = tpl;
    int n_replayed = 0;
    bool tools = o->use_tools && r->n_tools > 0;
    /* drop_thinking: on unless tools are declared (§3.1 step 3). */
    bool drop = !tools;
    size_t last_user = (size_t)-1;
    for (size_t i = 0; i < r->n_msgs; i++)
        if (r->msgs[i].role == ROLE_USER || r->msgs[i].role == ROLE_TOOL) last_user = i;

    tpl_(&b, DS4_BOS);
    if (o->thinking && o->think_max) tpl_(&b, ds4_chat_think_max_prefix);

    if (r->kind == API_COMPLETIONS) {
        /* A raw completion prompt is one user turn. */
        tpl_(&b, DS4_USER);
        puts_(&b, r->prompt ? r->prompt : "");
        tpl_(&b, DS4_ASSISTANT);
        tpl_(&b, o->thinking ? DS4_THINK : DS4_ENDTHINK);
        goto out;
    }

    bool tools_done = !tools;
    /* System messages before the first turn are the system prompt; later
     * ones (Claude Code's agent and skill lists, a Responses developer item
     * between turns) stand in the conversation: see put_user_turn. */
    size_t first_turn = 0;
    while (first_turn < r->n_msgs && r->msgs[first_turn].role == ROLE_SYSTEM) first_turn++;
    size_t first_sys = first_turn ? 0 : (size_t)-1;
    bool rf_done = r->response_format == RF_TEXT;
    if ((!tools_done || !rf_done) && first_sys == (size_t)-1) {
        /* No system message: the tools ride on an empty one at the front. */
        if (!tools_done) {
            tpl_(&b, "\n\n");
            put_tools_block(&b, r);
        }
        put_response_format(&b, r);
        tools_done = rf_done = true;
    }

    const api_message *last_asst = NULL;
    for (size_t i = 0; i < r->n_msgs;) {
        const api_message *m = &r->msgs[i];
        if (m->role == ROLE_SYSTEM && i < first_turn) {
            puts_(&b, m->content);
            if (!tools_done && i == first_sys) {
                tpl_(&b, "\n\n");
                put_tools_block(&b, r);
                tools_done = true;
            }
            if (!rf_done && i == first_sys) {
                put_response_format(&b, r);
                rf_done = true;
            }
            i++;
            continue;
        }
        if (m->role != ROLE_ASSISTANT) {
            size_t j = i;
            while (j < r->n_msgs && r->msgs[j].role != ROLE_ASSISTANT) j++;
            put_user_turn(&b, r, i, j, last_asst);
            /* Transition: at the end, or when an assistant turn follows. */
            if (j == r->n_msgs || r->msgs[j].role == ROLE_ASSISTANT) {
                tpl_(&b, DS4_ASSISTANT);
                bool open = o->thinking && (!drop || j - 1 >= last_user);
                tpl_(&b, open ? DS4_THINK : DS4_ENDTHINK);
            }
            i = j;
            continue;
        }
        /* assistant */
        bool keep = o->thinking && (!drop || last_user == (size_t)-1 || i > last_user);
        if (keep) {
            if (m->reasoning) puts_(&b, m->reasoning);
            tpl_(&b, DS4_ENDTHINK);
        }
        puts_(&b, m->content);
        if (m->n_calls) {
            char *exact = NULL;
            if (o->memory) {
                const char *ids[64];
                size_t n = m->n_calls < 64 ? m->n_calls : 0;
                for (size_t k = 0; k < n; k++) ids[k] = m->calls[k].id;
                if (n) exact = tool_memory_get_block(o->memory, ids, n);
            }
            if (exact) {
                /* The stored block holds the sampled separator too. */
                tpl_(&b, exact);
                free(exact);
                n_replayed++;
            } else {
                tpl_(&b, CALLS_SEP);
                put_calls(&b, m->calls, m->n_calls);
            }
        }
        tpl_(&b, DS4_EOS);
        last_asst = m;
        i++;
    }

out:
    if (b.oom) { free(b.p); return NULL; }
    if (len) *len = b.len;
    if (replayed) *replayed = n_replayed;
    return b.p;
}

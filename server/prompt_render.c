/*
 * prompt_render.c - the official V4 encoder for API requests (see header).
 *
 * Walks the messages once, grouping consecutive user and tool messages into
 * one user turn (official preprocessing, chat-format §3.1) and emitting the
 * assistant transitions of §3.2. Everything is appended to one growable
 * buffer; nothing here can fail except allocation.
 */
#include "server/prompt_render.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "server/tool_memory.h"

typedef struct { char *p; size_t len, cap; int oom; } buf;

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

static const char MAX_PREFIX[] =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate "
    "step, considered alternative, and rejected hypothesis to ensure absolutely no assumption "
    "is left unchecked.\n\n";

static const char TOOLS_HEAD[] =
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. "
    "You can invoke tools by writing a \"<" DS4_DSML "tool_calls>\" block like the following:\n\n"
    "<" DS4_DSML "tool_calls>\n"
    "<" DS4_DSML "invoke name=\"$TOOL_NAME\">\n"
    "<" DS4_DSML "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" DS4_DSML "parameter>\n"
    "...\n"
    "</" DS4_DSML "invoke>\n"
    "<" DS4_DSML "invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</" DS4_DSML "invoke>\n"
    "</" DS4_DSML "tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other "
    "types (numbers, booleans, arrays, objects), pass the value in JSON format and set "
    "`string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete "
    "reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";

static const char TOOLS_TAIL[] =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to "
    "invoke tool calls.\n";

static void put_tools_block(buf *b, const api_request *r)
{
    puts_(b, TOOLS_HEAD);
    for (size_t i = 0; i < r->n_tools; i++) {
        if (i) puts_(b, "\n");
        puts_(b, r->tools[i].schema_json);
    }
    puts_(b, TOOLS_TAIL);
}

static void put_calls(buf *b, const api_tool_call *calls, size_t n)
{
    puts_(b, "<" DS4_DSML "tool_calls>\n");
    for (size_t i = 0; i < n; i++) {
        if (i) puts_(b, "\n");
        puts_(b, "<" DS4_DSML "invoke name=\"");
        puts_(b, calls[i].name);
        puts_(b, "\">\n");
        json_t *args = json_loads(calls[i].arguments, 0, NULL);
        if (!json_is_object(args)) {
            /* Not a JSON object: the whole text is one string parameter. */
            puts_(b, "<" DS4_DSML "parameter name=\"arguments\" string=\"true\">");
            puts_(b, calls[i].arguments);
            puts_(b, "</" DS4_DSML "parameter>");
        } else {
            const char *key;
            json_t *v;
            int first = 1;
            json_object_foreach(args, key, v) {
                if (!first) puts_(b, "\n");
                first = 0;
                puts_(b, "<" DS4_DSML "parameter name=\"");
                puts_(b, key);
                if (json_is_string(v)) {
                    puts_(b, "\" string=\"true\">");
                    put(b, json_string_value(v), json_string_length(v));
                } else {
                    puts_(b, "\" string=\"false\">");
                    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_REAL_PRECISION(17));
                    if (s) puts_(b, s);
                    free(s);
                }
                puts_(b, "</" DS4_DSML "parameter>");
            }
        }
        json_decref(args);
        puts_(b, "\n</" DS4_DSML "invoke>");
    }
    puts_(b, "\n</" DS4_DSML "tool_calls>");
}

char *prompt_render_calls(const api_tool_call *calls, size_t n)
{
    buf b = {0};
    put_calls(&b, calls, n);
    if (b.oom) { free(b.p); return NULL; }
    return b.p;
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

static void put_user_turn(buf *b, const api_request *r, size_t from, size_t to,
                          const api_message *last_asst)
{
    puts_(b, DS4_USER);
    /* Tool results first in call order (stable), then the text blocks in
     * their own order, as the merged block list reads. */
    size_t n = to - from;
    size_t *idx = malloc((n ? n : 1) * sizeof *idx);
    if (!idx) { b->oom = 1; return; }
    size_t k = 0;
    for (size_t i = from; i < to; i++) idx[k++] = i;
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
        if (i) puts_(b, "\n\n");
        if (m->role == ROLE_TOOL) {
            puts_(b, "<tool_result>");
            puts_(b, m->content);
            puts_(b, "</tool_result>");
        } else {
            puts_(b, m->content);
        }
    }
    free(idx);
}

char *prompt_render(const api_request *r, const render_opts *o, size_t *len,
                    int *replayed)
{
    buf b = {0};
    int n_replayed = 0;
    bool tools = o->use_tools && r->n_tools > 0;
    /* drop_thinking: on unless tools are declared (§3.1 step 3). */
    bool drop = !tools;
    size_t last_user = (size_t)-1;
    for (size_t i = 0; i < r->n_msgs; i++)
        if (r->msgs[i].role == ROLE_USER || r->msgs[i].role == ROLE_TOOL) last_user = i;

    puts_(&b, DS4_BOS);
    if (o->thinking && o->think_max) puts_(&b, MAX_PREFIX);

    if (r->kind == API_COMPLETIONS) {
        /* A raw completion prompt is one user turn. */
        puts_(&b, DS4_USER);
        puts_(&b, r->prompt ? r->prompt : "");
        puts_(&b, DS4_ASSISTANT);
        puts_(&b, o->thinking ? DS4_THINK : DS4_ENDTHINK);
        goto out;
    }

    bool tools_done = !tools;
    size_t first_sys = (size_t)-1;
    for (size_t i = 0; i < r->n_msgs; i++)
        if (r->msgs[i].role == ROLE_SYSTEM) { first_sys = i; break; }
    if (!tools_done && first_sys == (size_t)-1) {
        /* No system message: the tools ride on an empty one at the front. */
        puts_(&b, "\n\n");
        put_tools_block(&b, r);
        tools_done = true;
    }

    const api_message *last_asst = NULL;
    for (size_t i = 0; i < r->n_msgs;) {
        const api_message *m = &r->msgs[i];
        if (m->role == ROLE_SYSTEM) {
            puts_(&b, m->content);
            if (!tools_done && i == first_sys) {
                puts_(&b, "\n\n");
                put_tools_block(&b, r);
                tools_done = true;
            }
            i++;
            continue;
        }
        if (m->role == ROLE_USER || m->role == ROLE_TOOL) {
            size_t j = i;
            while (j < r->n_msgs && (r->msgs[j].role == ROLE_USER || r->msgs[j].role == ROLE_TOOL)) j++;
            put_user_turn(&b, r, i, j, last_asst);
            /* Transition: at the end, or when an assistant turn follows. */
            if (j == r->n_msgs || r->msgs[j].role == ROLE_ASSISTANT) {
                puts_(&b, DS4_ASSISTANT);
                bool open = o->thinking && (!drop || j - 1 >= last_user);
                puts_(&b, open ? DS4_THINK : DS4_ENDTHINK);
            }
            i = j;
            continue;
        }
        /* assistant */
        bool keep = o->thinking && (!drop || last_user == (size_t)-1 || i > last_user);
        if (keep) {
            if (m->reasoning) puts_(&b, m->reasoning);
            puts_(&b, DS4_ENDTHINK);
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
                puts_(&b, exact);
                free(exact);
                n_replayed++;
            } else {
                puts_(&b, "\n\n");
                put_calls(&b, m->calls, m->n_calls);
            }
        }
        puts_(&b, DS4_EOS);
        last_asst = m;
        i++;
    }

out:
    if (b.oom) { free(b.p); return NULL; }
    if (len) *len = b.len;
    if (replayed) *replayed = n_replayed;
    return b.p;
}

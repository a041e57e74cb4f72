/*
 * chat_render.c - OpenAI-style messages -> DeepSeek V4 prompt text
 * (public API in include/ds4_chat.h; rules in dsv4-chat-format.md §3).
 *
 * The pipeline mirrors DeepSeek's reference encoder so that edge cases
 * come out identical:
 *   1. attach request-level tools to the first system message;
 *   2. merge tool results and following user text into user messages made
 *      of blocks (consecutive user messages merge too);
 *   3. reorder tool results to the order of the latest assistant's calls;
 *   4. in thinking mode without tools, drop reasoning (and developer
 *      messages) before the last user turn;
 *   5. render each message plus the transition to the assistant turn.
 * Steps 1-4 work on a private deep copy of the messages.
 */
#include "include/ds4_chat.h"

#include "text/dsml_render.h"
#include "text/pyjson.h"
#include "text/strbuf.h"
#include "util/error.h"

#include <stdlib.h>
#include <string.h>

const char ds4_chat_think_max_prefix[] =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve "
    "the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and "
    "adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";

static const char *const k_tasks[][2] = {
    {"action", "<\xEF\xBD\x9C" "action\xEF\xBD\x9C>"},
    {"query", "<\xEF\xBD\x9Cquery\xEF\xBD\x9C>"},
    {"authority", "<\xEF\xBD\x9C" "authority\xEF\xBD\x9C>"},
    {"domain", "<\xEF\xBD\x9C" "domain\xEF\xBD\x9C>"},
    {"title", "<\xEF\xBD\x9Ctitle\xEF\xBD\x9C>"},
    {"read_url", "<\xEF\xBD\x9Cread_url\xEF\xBD\x9C>"},
};

void ds4_chat_options_default(ds4_chat_options *o)
{
    o->thinking = true;
    o->think_max = false;
    o->drop_thinking = true;
    o->add_bos = true;
}

static const char *role_of(const json_t *m)
{
    const char *r = json_string_value(json_object_get(m, "role"));
    return r ? r : "";
}

static bool role_is(const json_t *m, const char *r) { return strcmp(role_of(m), r) == 0; }

/* Python truthiness of a JSON value (present, non-empty, non-zero). */
static bool truthy(const json_t *v)
{
    switch (v ? json_typeof(v) : JSON_NULL) {
    case JSON_OBJECT: return json_object_size(v) > 0;
    case JSON_ARRAY: return json_array_size(v) > 0;
    case JSON_STRING: return json_string_length(v) > 0;
    case JSON_INTEGER: return json_integer_value(v) != 0;
    case JSON_REAL: return json_real_value(v) != 0;
    case JSON_TRUE: return true;
    default: return false;
    }
}

/* ---- 1-3: preprocessing --------------------------------------------- */

/* A user message's content as a list of blocks (new reference). */
static json_t *user_blocks(const json_t *content)
{
    json_t *blocks = json_array();
    if (json_is_array(content)) {
        for (size_t i = 0; i < json_array_size(content); i++)
            json_array_append(blocks, json_array_get(content, i));
    } else {
        json_t *b = json_object();
        json_object_set_new(b, "type", json_string("text"));
        json_object_set_new(b, "text", json_is_string(content) ? json_incref((json_t *)content) : json_string(""));
        json_array_append_new(blocks, b);
    }
    return blocks;
}

static json_t *merge_tool_messages(const json_t *msgs)
{
    json_t *out = json_array();
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        size_t n = json_array_size(out);
        json_t *last = n ? json_array_get(out, n - 1) : NULL;
        bool last_is_block_user = last && role_is(last, "user") && json_object_get(last, "content_blocks");
        if (role_is(m, "tool")) {
            json_t *b = json_object();
            json_t *id = json_object_get(m, "tool_call_id");
            json_t *c = json_object_get(m, "content");
            json_object_set_new(b, "type", json_string("tool_result"));
            json_object_set_new(b, "tool_use_id", id ? json_deep_copy(id) : json_string(""));
            json_object_set_new(b, "content", c ? json_deep_copy(c) : json_string(""));
            if (last_is_block_user) {
                json_array_append_new(json_object_get(last, "content_blocks"), b);
            } else {
                json_t *u = json_object();
                json_object_set_new(u, "role", json_string("user"));
                json_t *blocks = json_array();
                json_array_append_new(blocks, b);
                json_object_set_new(u, "content_blocks", blocks);
                json_array_append_new(out, u);
            }
        } else if (role_is(m, "user")) {
            json_t *blocks = user_blocks(json_object_get(m, "content"));
            if (last_is_block_user && !json_object_get(last, "task")) {
                json_array_extend(json_object_get(last, "content_blocks"), blocks);
                json_decref(blocks);
            } else {
                json_t *u = json_object();
                json_object_set_new(u, "role", json_string("user"));
                json_object_set_new(u, "content_blocks", blocks);
                static const char *const keep[] = {"task", "wo_eos", "mask"};
                for (size_t k = 0; k < 3; k++) {
                    json_t *v = json_object_get(m, keep[k]);
                    if (v) json_object_set_new(u, keep[k], json_deep_copy(v));
                }
                json_array_append_new(out, u);
            }
        } else {
            json_array_append_new(out, json_deep_copy(m));
        }
    }
    return out;
}

static const char *call_id(const json_t *tc)
{
    const char *id = json_string_value(json_object_get(tc, "id"));
    if (!id || !*id) id = json_string_value(json_object_get(json_object_get(tc, "function"), "id"));
    return id ? id : "";
}

/* Position of a tool_result's id in the latest assistant's calls (0 when
 * unknown, as the reference encoder does). */
static size_t result_rank(const json_t *calls, const json_t *block)
{
    const char *id = json_string_value(json_object_get(block, "tool_use_id"));
    if (!id || !*id) return 0;
    size_t rank = 0;
    bool found = false;
    for (size_t i = 0; i < json_array_size(calls); i++) {
        const char *cid = call_id(json_array_get(calls, i));
        if (*cid && strcmp(cid, id) == 0) {
            rank = i; /* a repeated id maps to its last position */
            found = true;
        }
    }
    return found ? rank : 0;
}

static void sort_tool_results(json_t *msgs)
{
    const json_t *calls = NULL;
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        if (role_is(m, "assistant") && truthy(json_object_get(m, "tool_calls"))) {
            calls = json_object_get(m, "tool_calls");
            bool any_id = false;
            for (size_t k = 0; k < json_array_size(calls); k++) any_id |= *call_id(json_array_get(calls, k)) != 0;
            if (!any_id) calls = NULL;
            continue;
        }
        json_t *blocks = json_object_get(m, "content_blocks");
        if (!role_is(m, "user") || !calls || !json_is_array(blocks)) continue;
        /* stable insertion sort of the tool_result blocks among their own slots */
        size_t n = json_array_size(blocks), nt = 0;
        size_t slots[n ? n : 1];
        json_t *items[n ? n : 1];
        for (size_t k = 0; k < n; k++) {
            json_t *b = json_array_get(blocks, k);
            const char *t = json_string_value(json_object_get(b, "type"));
            if (t && strcmp(t, "tool_result") == 0) {
                slots[nt] = k;
                items[nt++] = json_incref(b);
            }
        }
        if (nt > 1) {
            for (size_t a = 1; a < nt; a++) {
                json_t *x = items[a];
                size_t r = result_rank(calls, x), j = a;
                while (j > 0 && result_rank(calls, items[j - 1]) > r) {
                    items[j] = items[j - 1];
                    j--;
                }
                items[j] = x;
            }
            for (size_t k = 0; k < nt; k++) json_array_set(blocks, slots[k], items[k]);
        }
        for (size_t k = 0; k < nt; k++) json_decref(items[k]);
    }
}

static long last_user_index(const json_t *msgs)
{
    for (size_t i = json_array_size(msgs); i-- > 0;) {
        const json_t *m = json_array_get(msgs, i);
        if (role_is(m, "user") || role_is(m, "developer")) return (long)i;
    }
    return -1;
}

static json_t *drop_thinking(const json_t *msgs)
{
    long last = last_user_index(msgs);
    json_t *out = json_array();
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        const char *r = role_of(m);
        bool keep_role = !strcmp(r, "user") || !strcmp(r, "system") || !strcmp(r, "tool") ||
                         !strcmp(r, "latest_reminder") || !strcmp(r, "direct_search_results");
        if (keep_role || (long)i >= last) {
            json_array_append(out, m);
        } else if (!strcmp(r, "assistant")) {
            json_t *c = json_copy(m);
            json_object_del(c, "reasoning_content");
            json_array_append_new(out, c);
        } /* developer messages before the last user turn are dropped */
    }
    return out;
}

/* ---- 5: rendering ---------------------------------------------------- */

/* Text of a content value: a string, null/absent (""), or a list of parts
 * (text parts joined by "\n\n", others "[Unsupported TYPE]"). */
static ds4_status put_content(ds4_strbuf *b, const json_t *c, size_t idx, const char *field)
{
    if (!c || json_is_null(c)) return DS4_OK;
    if (json_is_string(c)) {
        ds4_sb_append(b, json_string_value(c), json_string_length(c));
        return DS4_OK;
    }
    if (json_is_array(c)) {
        for (size_t i = 0; i < json_array_size(c); i++) {
            const json_t *part = json_array_get(c, i);
            const char *t = json_string_value(json_object_get(part, "type"));
            if (i) ds4_sb_tpl(b, "\n\n");
            if (json_is_string(part)) {
                ds4_sb_append(b, json_string_value(part), json_string_length(part));
            } else if (t && strcmp(t, "text") == 0) {
                const json_t *tx = json_object_get(part, "text");
                if (json_is_string(tx)) ds4_sb_append(b, json_string_value(tx), json_string_length(tx));
            } else {
                ds4_sb_printf(b, "[Unsupported %s]", t ? t : "None");
            }
        }
        return DS4_OK;
    }
    return ds4_fail(DS4_ERR_INVALID, "chat: messages[%zu].%s: expected a string or a list of parts", idx, field);
}

static ds4_status render_user_blocks(ds4_strbuf *b, const json_t *m, size_t idx)
{
    const json_t *blocks = json_object_get(m, "content_blocks");
    for (size_t i = 0; i < json_array_size(blocks); i++) {
        const json_t *blk = json_array_get(blocks, i);
        const char *t = json_string_value(json_object_get(blk, "type"));
        ds4_status st = DS4_OK;
        if (i) ds4_sb_tpl(b, "\n\n");
        if (t && strcmp(t, "text") == 0) {
            st = put_content(b, json_object_get(blk, "text"), idx, "content");
        } else if (t && strcmp(t, "tool_result") == 0) {
            ds4_sb_tpl(b, "<tool_result>");
            st = put_content(b, json_object_get(blk, "content"), idx, "content");
            ds4_sb_tpl(b, "</tool_result>");
        } else {
            ds4_sb_printf(b, "[Unsupported %s]", t ? t : "None");
        }
        if (st) return st;
    }
    return DS4_OK;
}

static ds4_status append_tools(ds4_strbuf *b, const json_t *m, size_t idx)
{
    const json_t *tools = json_object_get(m, "tools");
    if (truthy(tools)) {
        ds4_sb_tpl(b, "\n\n");
        if (ds4_dsml_tools_block(b, tools)) {
            ds4_error_prefix("chat: messages[%zu]: ", idx);
            return DS4_ERR_INVALID;
        }
    }
    const json_t *rf = json_object_get(m, "response_format");
    if (truthy(rf)) {
        ds4_sb_tpl(b, "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n");
        ds4_pyjson_dump(b, rf);
    }
    return DS4_OK;
}

static ds4_status render_message(ds4_strbuf *b, const json_t *msgs, size_t idx, const ds4_chat_options *o,
                                 bool drop)
{
    const json_t *m = json_array_get(msgs, idx);
    const char *role = role_of(m);
    long last_user = last_user_index(msgs);
    size_t n = json_array_size(msgs);
    ds4_status st = DS4_OK;

    if (idx == 0 && o->thinking && o->think_max) ds4_sb_tpl(b, ds4_chat_think_max_prefix);

    if (!strcmp(role, "system")) {
        if ((st = put_content(b, json_object_get(m, "content"), idx, "content"))) return st;
        if ((st = append_tools(b, m, idx))) return st;
    } else if (!strcmp(role, "developer")) {
        if (!truthy(json_object_get(m, "content")))
            return ds4_fail(DS4_ERR_INVALID, "chat: messages[%zu]: developer message without content", idx);
        ds4_sb_tpl(b, DS4_TEXT_USER);
        if ((st = put_content(b, json_object_get(m, "content"), idx, "content"))) return st;
        if ((st = append_tools(b, m, idx))) return st;
    } else if (!strcmp(role, "user")) {
        ds4_sb_tpl(b, DS4_TEXT_USER);
        if (json_array_size(json_object_get(m, "content_blocks")))
            st = render_user_blocks(b, m, idx);
        else
            st = put_content(b, json_object_get(m, "content"), idx, "content");
        if (st) return st;
    } else if (!strcmp(role, "latest_reminder")) {
        ds4_sb_tpl(b, DS4_TEXT_LATEST_REMINDER);
        if ((st = put_content(b, json_object_get(m, "content"), idx, "content"))) return st;
    } else if (!strcmp(role, "assistant")) {
        bool prev_task = idx > 0 && json_object_get(json_array_get(msgs, idx - 1), "task") &&
                         !json_is_null(json_object_get(json_array_get(msgs, idx - 1), "task"));
        if (o->thinking && !prev_task && (!drop || (long)idx > last_user)) {
            const json_t *rc = json_object_get(m, "reasoning_content");
            if (json_is_string(rc)) ds4_sb_append(b, json_string_value(rc), json_string_length(rc));
            ds4_sb_tpl(b, DS4_TEXT_THINK_END);
        }
        if ((st = put_content(b, json_object_get(m, "content"), idx, "content"))) return st;
        const json_t *calls = json_object_get(m, "tool_calls");
        if (truthy(calls)) {
            ds4_sb_tpl(b, "\n\n");
            if (ds4_dsml_calls_block(b, calls)) {
                ds4_error_prefix("chat: messages[%zu]: ", idx);
                return DS4_ERR_INVALID;
            }
        }
        if (!json_is_true(json_object_get(m, "wo_eos"))) ds4_sb_tpl(b, DS4_TEXT_EOS);
    } else {
        return ds4_fail(DS4_ERR_INVALID, "chat: messages[%zu]: unsupported role \"%s\"", idx, role);
    }

    /* transition to the assistant turn */
    if (idx + 1 < n) {
        const json_t *next = json_array_get(msgs, idx + 1);
        if (!role_is(next, "assistant") && !role_is(next, "latest_reminder")) return DS4_OK;
    }
    const json_t *task = json_object_get(m, "task");
    if (task && !json_is_null(task)) {
        const char *t = json_string_value(task);
        const char *tok = NULL;
        for (size_t k = 0; t && k < sizeof k_tasks / sizeof *k_tasks; k++)
            if (!strcmp(t, k_tasks[k][0])) tok = k_tasks[k][1];
        if (!tok) return ds4_fail(DS4_ERR_INVALID, "chat: messages[%zu]: unknown task \"%s\"", idx, t ? t : "?");
        if (strcmp(t, "action") != 0) {
            ds4_sb_tpl(b, tok);
        } else {
            ds4_sb_tpl(b, DS4_TEXT_ASSISTANT);
            ds4_sb_tpl(b, o->thinking ? DS4_TEXT_THINK : DS4_TEXT_THINK_END);
            ds4_sb_tpl(b, tok);
        }
    } else if (!strcmp(role, "user") || !strcmp(role, "developer")) {
        ds4_sb_tpl(b, DS4_TEXT_ASSISTANT);
        bool think = o->thinking && (!drop || (long)idx >= last_user);
        ds4_sb_tpl(b, think ? DS4_TEXT_THINK : DS4_TEXT_THINK_END);
    }
    return DS4_OK;
}

/* Copy of the messages with request-level tools attached. */
static json_t *with_tools(const json_t *messages, const json_t *tools)
{
    json_t *msgs = json_deep_copy(messages);
    if (!msgs || !truthy(tools)) return msgs;
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        if (role_is(m, "system")) {
            json_object_set_new(m, "tools", json_deep_copy(tools));
            return msgs;
        }
    }
    json_t *sys = json_object();
    json_object_set_new(sys, "role", json_string("system"));
    json_object_set_new(sys, "content", json_string(""));
    json_object_set_new(sys, "tools", json_deep_copy(tools));
    json_array_insert_new(msgs, 0, sys);
    return msgs;
}

ds4_status ds4_chat_render(const json_t *messages, const json_t *tools, const ds4_chat_options *opt,
                           char **out, size_t *out_len)
{
    return ds4_chat_render_spans(messages, tools, opt, NULL, out, out_len);
}

ds4_status ds4_chat_tokenize(const ds4_tokenizer *tok, const json_t *messages, const json_t *tools,
                             const ds4_chat_options *opt, ds4_tokens *out)
{
    ds4_spans tpl = {0};
    char *text = NULL;
    size_t len = 0;
    ds4_status st = ds4_chat_render_spans(messages, tools, opt, &tpl, &text, &len);
    if (!st) st = ds4_tokenize_spans(tok, text, len, &tpl, 0, out);
    free(text);
    ds4_spans_free(&tpl);
    return st;
}

ds4_status ds4_chat_render_spans(const json_t *messages, const json_t *tools, const ds4_chat_options *opt,
                                 ds4_spans *tpl, char **out, size_t *out_len)
{
    *out = NULL;
    if (!json_is_array(messages)) return ds4_fail(DS4_ERR_INVALID, "chat: messages is not an array");
    for (size_t i = 0; i < json_array_size(messages); i++) {
        const json_t *m = json_array_get(messages, i);
        if (!json_is_object(m) || !json_is_string(json_object_get(m, "role")))
            return ds4_fail(DS4_ERR_INVALID, "chat: messages[%zu] is not an object with a \"role\" string", i);
    }
    if (tools && !json_is_null(tools) && !json_is_array(tools))
        return ds4_fail(DS4_ERR_INVALID, "chat: tools is not an array");

    json_t *attached = with_tools(messages, tools);
    json_t *msgs = attached ? merge_tool_messages(attached) : NULL;
    json_decref(attached);
    if (!msgs) return ds4_fail(DS4_ERR_NOMEM, "chat: out of memory");
    sort_tool_results(msgs);

    bool drop = opt->drop_thinking;
    for (size_t i = 0; i < json_array_size(msgs); i++)
        if (truthy(json_object_get(json_array_get(msgs, i), "tools"))) drop = false;
    if (opt->thinking && drop) {
        json_t *d = drop_thinking(msgs);
        json_decref(msgs);
        msgs = d;
    }

    ds4_strbuf b = {0};
    b.tpl = tpl;
    if (opt->add_bos) ds4_sb_tpl(&b, DS4_TEXT_BOS);
    ds4_status st = DS4_OK;
    for (size_t i = 0; i < json_array_size(msgs) && !st; i++) st = render_message(&b, msgs, i, opt, drop);
    json_decref(msgs);
    if (st) {
        ds4_sb_free(&b);
        return st;
    }
    *out = ds4_sb_take(&b, out_len);
    return *out ? DS4_OK : ds4_fail(DS4_ERR_NOMEM, "chat: out of memory");
}

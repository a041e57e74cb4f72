/*
 * api_response.c - native response and stream shapes of the four APIs.
 *
 * Shapes (public API facts):
 *  chat.completion / chat.completion.chunk: choices[0].message|delta with
 *    content, reasoning_content, tool_calls[{index,id,type,function}];
 *    finish_reason stop|length|tool_calls; usage {prompt_tokens,
 *    completion_tokens, total_tokens, prompt_tokens_details.cached_tokens};
 *    the stream ends with "data: [DONE]".
 *  text_completion: choices[0].text.
 *  response (Responses API): output[] of reasoning / message (output_text)
 *    / function_call items; events response.created, response.in_progress,
 *    response.output_item.added|done, response.content_part.added|done,
 *    response.output_text.delta|done, response.reasoning_text.delta|done,
 *    response.function_call_arguments.delta|done, response.completed;
 *    each event carries a sequence_number.
 *  Anthropic message: content[] of thinking / text / tool_use blocks;
 *    stop_reason end_turn|max_tokens|tool_use|stop_sequence; usage
 *    {input_tokens, output_tokens, cache_read_input_tokens}.
 * Besides the standard usage fields every body carries "ds4": {cache,
 * prefilled_tokens, reused_tokens, prefill_ms, decode_ms} so that clients
 * and tests can see what the prefix cache did.
 */
#include "server/api_response.h"
#include "server/thinking_signature.h"

#include "include/ds4_tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/tool_memory.h"

typedef enum { BLK_NONE = 0, BLK_REASONING, BLK_TEXT, BLK_TOOL } block_kind;

struct resp_writer {
    api_kind kind;
    json_t *tool_choice;   /* Responses: the request's tool_choice, echoed */
    bool stream, include_usage;
    char model[128];
    char id[64];
    long created;
    sink_fn sink;
    void *ud;

    block_kind open;
    int block_index;       /* Anthropic content index / Responses output index */
    int seq;               /* Responses sequence_number */
    char item_id[64];
    char *acc;             /* text of the open block (Responses *.done events) */
    size_t acc_len, acc_cap;
    int tool_index;
    bool any_tool_streamed;
    /* ids of the Responses items already announced in the stream, reused by
     * the final response object so that both name the same items */
    char rs_id[64], msg_id[64];
    char fc_ids[64][64];
    int n_fc;
    const api_request *req;   /* for namespaced tool names (Responses) */
};

void resp_writer_request(resp_writer *w, const api_request *r) { w->req = r; }

/* A function_call item names a namespaced tool as {namespace, name}
 * (Codex's form), the model's flat "NS__name" split back. */
static void fc_set_name(const resp_writer *w, json_t *item, const char *name)
{
    const api_tool *t = w->req ? api_request_tool(w->req, name) : NULL;
    if (t && t->ns) {
        json_object_set_new(item, "name", json_string(t->local));
        json_object_set_new(item, "namespace", json_string(t->ns));
    }
}

/* A Responses reasoning item carries its text as encrypted_content too
 * (thinking_signature.h), which store=false clients send back alone. */
static void rs_set_sig(json_t *item, const char *txt, size_t n)
{
    char *sig = thinking_signature_make(txt, n);
    if (sig) json_object_set_new(item, "encrypted_content", json_string(sig));
    free(sig);
}

static void acc_add(resp_writer *w, const char *s, size_t n)
{
    if (w->acc_len + n + 1 > w->acc_cap) {
        size_t cap = w->acc_cap ? w->acc_cap * 2 : 256;
        while (cap < w->acc_len + n + 1) cap *= 2;
        char *q = realloc(w->acc, cap);
        if (!q) return;
        w->acc = q;
        w->acc_cap = cap;
    }
    memcpy(w->acc + w->acc_len, s, n);
    w->acc_len += n;
    w->acc[w->acc_len] = 0;
}

resp_writer *resp_writer_new(api_kind kind, bool stream, bool include_usage,
                             const char *model, sink_fn sink, void *ud)
{
    resp_writer *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->kind = kind;
    w->stream = stream;
    w->include_usage = include_usage;
    snprintf(w->model, sizeof w->model, "%s", model ? model : "deepseek-v4-flash");
    w->created = (long)time(NULL);
    w->sink = sink;
    w->ud = ud;
    const char *pfx = kind == API_CHAT ? "chatcmpl-" : kind == API_COMPLETIONS ? "cmpl-"
                    : kind == API_RESPONSES ? "resp_" : "msg_";
    if (tool_id_new(pfx, w->id, sizeof w->id) < 0) snprintf(w->id, sizeof w->id, "%s0", pfx);
    w->tool_choice = json_string("auto");
    if (!w->tool_choice) {
        free(w);
        return NULL;
    }
    return w;
}

void resp_writer_tool_choice(resp_writer *w, api_tool_choice c, const char *name)
{
    json_t *v = c == TOOL_CHOICE_NONE       ? json_string("none")
              : c == TOOL_CHOICE_REQUIRED   ? json_string("required")
              : c == TOOL_CHOICE_NAMED && name ? json_pack("{s:s, s:s}", "type", "function", "name", name)
                                             : json_string("auto");
    if (!v) return; /* out of memory: keep "auto" */
    json_decref(w->tool_choice);
    w->tool_choice = v;
}

void resp_writer_free(resp_writer *w)
{
    if (!w) return;
    json_decref(w->tool_choice);
    free(w->acc);
    free(w);
}

/* ---- SSE output ---------------------------------------------------------- */

static void send_raw(resp_writer *w, const char *s) { w->sink(w->ud, s, strlen(s)); }

/* Writes "event: name\n" (if name) + "data: json\n\n"; steals obj. */
static void send_event(resp_writer *w, const char *name, json_t *obj)
{
    if (w->kind == API_RESPONSES) {
        json_object_set_new(obj, "sequence_number", json_integer(w->seq++));
    }
    char *s = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    if (!s) return;
    if (name) {
        send_raw(w, "event: ");
        send_raw(w, name);
        send_raw(w, "\n");
    }
    send_raw(w, "data: ");
    send_raw(w, s);
    send_raw(w, "\n\n");
    free(s);
}

/* ---- usage ------------------------------------------------------------------ */

static json_t *ds4_info(const usage_info *u)
{
    json_t *o = json_pack("{s:s, s:i, s:i, s:f, s:f}", "cache", u->cache ? u->cache : "cold",
                          "prefilled_tokens", u->prompt_tokens - u->cached_tokens,
                          "reused_tokens", u->cached_tokens, "prefill_ms", u->prefill_ms,
                          "decode_ms", u->decode_ms);
    if (o && u->mtp_drafted) { /* only when the answer was speculated */
        json_object_set_new(o, "mtp_drafted", json_integer(u->mtp_drafted));
        json_object_set_new(o, "mtp_accepted", json_integer(u->mtp_accepted));
    }
    return o;
}

static json_t *usage_json(api_kind kind, const usage_info *u)
{
    if (kind == API_MESSAGES)
        return json_pack("{s:i, s:i, s:i, s:i}", "input_tokens", u->prompt_tokens - u->cached_tokens,
                         "output_tokens", u->completion_tokens, "cache_read_input_tokens",
                         u->cached_tokens, "cache_creation_input_tokens", 0);
    if (kind == API_RESPONSES)
        return json_pack("{s:i, s:{s:i}, s:i, s:{s:i}, s:i}", "input_tokens", u->prompt_tokens,
                         "input_tokens_details", "cached_tokens", u->cached_tokens,
                         "output_tokens", u->completion_tokens, "output_tokens_details",
                         "reasoning_tokens", u->reasoning_tokens, "total_tokens",
                         u->prompt_tokens + u->completion_tokens);
    return json_pack("{s:i, s:i, s:i, s:{s:i}, s:{s:i}}", "prompt_tokens", u->prompt_tokens,
                     "completion_tokens", u->completion_tokens, "total_tokens",
                     u->prompt_tokens + u->completion_tokens, "prompt_tokens_details",
                     "cached_tokens", u->cached_tokens, "completion_tokens_details",
                     "reasoning_tokens", u->reasoning_tokens);
}

static const char *finish_name(api_kind kind, finish_kind f)
{
    if (kind == API_MESSAGES)
        return f == FIN_LENGTH ? "max_tokens" : f == FIN_TOOL_CALLS ? "tool_use"
             : f == FIN_STOP_SEQUENCE ? "stop_sequence" : "end_turn";
    if (f == FIN_LENGTH) return "length";
    if (f == FIN_TOOL_CALLS && kind == API_CHAT) return "tool_calls";
    return "stop";
}

/* Anthropic's stop_sequence: the string that matched when one ended the
 * answer, null otherwise. */
static json_t *stop_sequence_json(const out_parser *p, finish_kind f)
{
    const char *s = f == FIN_STOP_SEQUENCE && p ? out_parser_stop_sequence(p) : NULL;
    return s ? json_string(s) : json_null();
}

/* ---- chunks of the OpenAI chat / completions streams -------------------------- */

static json_t *chat_chunk(resp_writer *w, json_t *delta, const char *finish)
{
    json_t *choice;
    if (w->kind == API_COMPLETIONS) {
        json_t *t = json_object_get(delta, "content");
        choice = json_pack("{s:i, s:O, s:n, s:o}", "index", 0, "text", t ? t : json_string(""),
                           "logprobs", "finish_reason", finish ? json_string(finish) : json_null());
        json_decref(delta);
    } else {
        choice = json_pack("{s:i, s:o, s:n, s:o}", "index", 0, "delta", delta, "logprobs",
                           "finish_reason", finish ? json_string(finish) : json_null());
    }
    return json_pack("{s:s, s:s, s:i, s:s, s:[o]}", "id", w->id, "object",
                     w->kind == API_COMPLETIONS ? "text_completion" : "chat.completion.chunk",
                     "created", (int)w->created, "model", w->model, "choices", choice);
}

/* ---- Responses helpers ---------------------------------------------------------- */

static json_t *resp_object(resp_writer *w, const char *status, json_t *output, json_t *usage)
{
    json_t *r = json_pack("{s:s, s:s, s:i, s:s, s:s, s:o, s:n, s:n}", "id", w->id, "object",
                          "response", "created_at", (int)w->created, "status", status, "model",
                          w->model, "output", output ? output : json_array(), "error",
                          "incomplete_details");
    json_object_set_new(r, "usage", usage ? usage : json_null());
    json_object_set_new(r, "parallel_tool_calls", json_true());
    json_object_set(r, "tool_choice", w->tool_choice);
    json_object_set_new(r, "tools", json_array());
    return r;
}

static void resp_close_block(resp_writer *w)
{
    if (w->open == BLK_NONE) return;
    const char *txt = w->acc ? w->acc : "";
    if (w->kind == API_MESSAGES) {
        if (w->open == BLK_REASONING) {
            char *sig = thinking_signature_make(txt, w->acc_len);
            send_event(w, "content_block_delta",
                       json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index",
                                 w->block_index, "delta", "type", "signature_delta", "signature",
                                 sig ? sig : ""));
            free(sig);
        }
        send_event(w, "content_block_stop",
                   json_pack("{s:s, s:i}", "type", "content_block_stop", "index", w->block_index));
    } else if (w->kind == API_RESPONSES) {
        json_t *item = NULL;
        if (w->open == BLK_REASONING) {
            send_event(w, "response.reasoning_text.done",
                       json_pack("{s:s, s:s, s:i, s:i, s:s}", "type", "response.reasoning_text.done",
                                 "item_id", w->item_id, "output_index", w->block_index,
                                 "content_index", 0, "text", txt));
            item = json_pack("{s:s, s:s, s:[], s:[{s:s, s:s}], s:s}", "type", "reasoning", "id",
                             w->item_id, "summary", "content", "type", "reasoning_text", "text", txt,
                             "status", "completed");
            if (item) rs_set_sig(item, txt, w->acc_len);
        } else if (w->open == BLK_TEXT) {
            send_event(w, "response.output_text.done",
                       json_pack("{s:s, s:s, s:i, s:i, s:s, s:[]}", "type", "response.output_text.done",
                                 "item_id", w->item_id, "output_index", w->block_index,
                                 "content_index", 0, "text", txt, "logprobs"));
            json_t *part = json_pack("{s:s, s:s, s:[], s:[]}", "type", "output_text", "text", txt,
                                     "annotations", "logprobs");
            send_event(w, "response.content_part.done",
                       json_pack("{s:s, s:s, s:i, s:i, s:O}", "type", "response.content_part.done",
                                 "item_id", w->item_id, "output_index", w->block_index,
                                 "content_index", 0, "part", part));
            item = json_pack("{s:s, s:s, s:s, s:s, s:[o]}", "type", "message", "id", w->item_id,
                             "status", "completed", "role", "assistant", "content", part);
        }
        /* tool items are closed in resp_writer_event (TOOL_END) */
        if (item)
            send_event(w, "response.output_item.done",
                       json_pack("{s:s, s:i, s:o}", "type", "response.output_item.done",
                                 "output_index", w->block_index, "item", item));
    }
    w->open = BLK_NONE;
    w->block_index++;
    w->acc_len = 0;
    if (w->acc) w->acc[0] = 0;
}

static void resp_open_block(resp_writer *w, block_kind k, const out_event *ev)
{
    if (w->open == k && k != BLK_TOOL) return;
    resp_close_block(w);
    w->open = k;
    if (w->kind == API_MESSAGES) {
        json_t *cb;
        if (k == BLK_REASONING) cb = json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "", "signature", "");
        else if (k == BLK_TEXT) cb = json_pack("{s:s, s:s}", "type", "text", "text", "");
        else cb = json_pack("{s:s, s:s, s:s, s:{}}", "type", "tool_use", "id", ev->id, "name", ev->name, "input");
        send_event(w, "content_block_start",
                   json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index",
                             w->block_index, "content_block", cb));
    } else if (w->kind == API_RESPONSES) {
        const char *pfx = k == BLK_REASONING ? "rs_" : k == BLK_TEXT ? "msg_" : "fc_";
        if (tool_id_new(pfx, w->item_id, sizeof w->item_id) < 0) snprintf(w->item_id, sizeof w->item_id, "%s0", pfx);
        if (k == BLK_REASONING) memcpy(w->rs_id, w->item_id, sizeof w->rs_id);
        else if (k == BLK_TEXT) memcpy(w->msg_id, w->item_id, sizeof w->msg_id);
        else if (w->n_fc < 64) memcpy(w->fc_ids[w->n_fc++], w->item_id, sizeof w->fc_ids[0]);
        json_t *item;
        if (k == BLK_REASONING)
            item = json_pack("{s:s, s:s, s:[], s:s}", "type", "reasoning", "id", w->item_id, "summary", "status", "in_progress");
        else if (k == BLK_TEXT)
            item = json_pack("{s:s, s:s, s:s, s:s, s:[]}", "type", "message", "id", w->item_id, "status",
                             "in_progress", "role", "assistant", "content");
        else
        {
            item = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "type", "function_call", "id", w->item_id,
                             "call_id", ev->id, "name", ev->name, "arguments", "", "status", "in_progress");
            if (item) fc_set_name(w, item, ev->name);
        }
        send_event(w, "response.output_item.added",
                   json_pack("{s:s, s:i, s:o}", "type", "response.output_item.added", "output_index",
                             w->block_index, "item", item));
        if (k == BLK_TEXT)
            send_event(w, "response.content_part.added",
                       json_pack("{s:s, s:s, s:i, s:i, s:{s:s, s:s, s:[], s:[]}}", "type",
                                 "response.content_part.added", "item_id", w->item_id, "output_index",
                                 w->block_index, "content_index", 0, "part", "type", "output_text",
                                 "text", "", "annotations", "logprobs"));
    }
}

/* ---- public ---------------------------------------------------------------------- */

void resp_writer_begin(resp_writer *w, const usage_info *u)
{
    if (!w->stream) return;
    if (w->kind == API_CHAT) {
        send_event(w, NULL, chat_chunk(w, json_pack("{s:s, s:s}", "role", "assistant", "content", ""), NULL));
    } else if (w->kind == API_RESPONSES) {
        json_t *r = resp_object(w, "in_progress", NULL, NULL);
        send_event(w, "response.created", json_pack("{s:s, s:O}", "type", "response.created", "response", r));
        send_event(w, "response.in_progress", json_pack("{s:s, s:o}", "type", "response.in_progress", "response", r));
    } else if (w->kind == API_MESSAGES) {
        json_t *usage = json_pack("{s:i, s:i, s:i, s:i}", "input_tokens", u->prompt_tokens - u->cached_tokens,
                                  "output_tokens", 0, "cache_read_input_tokens", u->cached_tokens,
                                  "cache_creation_input_tokens", 0);
        json_t *msg = json_pack("{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:o}", "id", w->id, "type", "message",
                                "role", "assistant", "model", w->model, "content", "stop_reason",
                                "stop_sequence", "usage", usage);
        send_event(w, "message_start", json_pack("{s:s, s:o}", "type", "message_start", "message", msg));
    }
}

void resp_writer_keepalive(resp_writer *w)
{
    if (!w->stream) return;
    if (w->kind == API_MESSAGES) send_raw(w, "event: ping\ndata: {\"type\":\"ping\"}\n\n");
    else send_raw(w, ": keep-alive\n\n");
}

void resp_writer_event(resp_writer *w, const out_event *ev)
{
    if (!w->stream) return;
    if (w->kind == API_CHAT || w->kind == API_COMPLETIONS) {
        json_t *d = NULL;
        if (ev->type == OUT_REASONING) {
            if (w->kind == API_COMPLETIONS) return;
            d = json_pack("{s:s%}", "reasoning_content", ev->text, ev->len);
        } else if (ev->type == OUT_CONTENT) {
            d = json_pack("{s:s%}", "content", ev->text, ev->len);
        } else if (w->kind == API_CHAT && ev->type == OUT_TOOL_START) {
            w->any_tool_streamed = true;
            d = json_pack("{s:[{s:i, s:s, s:s, s:{s:s, s:s}}]}", "tool_calls", "index", ev->index, "id",
                          ev->id, "type", "function", "function", "name", ev->name, "arguments", "");
        } else if (w->kind == API_CHAT && ev->type == OUT_TOOL_ARGS) {
            d = json_pack("{s:[{s:i, s:{s:s%}}]}", "tool_calls", "index", ev->index, "function",
                          "arguments", ev->text, ev->len);
        }
        if (d) send_event(w, NULL, chat_chunk(w, d, NULL));
        return;
    }
    if (w->kind == API_MESSAGES) {
        if (ev->type == OUT_REASONING || ev->type == OUT_CONTENT) {
            bool r = ev->type == OUT_REASONING;
            resp_open_block(w, r ? BLK_REASONING : BLK_TEXT, ev);
            if (r) acc_add(w, ev->text, ev->len); /* for the block's signature */
            json_t *delta = r ? json_pack("{s:s, s:s%}", "type", "thinking_delta", "thinking", ev->text, ev->len)
                              : json_pack("{s:s, s:s%}", "type", "text_delta", "text", ev->text, ev->len);
            send_event(w, "content_block_delta",
                       json_pack("{s:s, s:i, s:o}", "type", "content_block_delta", "index", w->block_index,
                                 "delta", delta));
        } else if (ev->type == OUT_TOOL_START) {
            resp_open_block(w, BLK_TOOL, ev);
        } else if (ev->type == OUT_TOOL_ARGS) {
            send_event(w, "content_block_delta",
                       json_pack("{s:s, s:i, s:{s:s, s:s%}}", "type", "content_block_delta", "index",
                                 w->block_index, "delta", "type", "input_json_delta", "partial_json",
                                 ev->text, ev->len));
        } else if (ev->type == OUT_TOOL_END) {
            resp_close_block(w);
        }
        return;
    }
    /* Responses */
    if (ev->type == OUT_REASONING || ev->type == OUT_CONTENT) {
        bool r = ev->type == OUT_REASONING;
        resp_open_block(w, r ? BLK_REASONING : BLK_TEXT, ev);
        acc_add(w, ev->text, ev->len);
        send_event(w, r ? "response.reasoning_text.delta" : "response.output_text.delta",
                   json_pack("{s:s, s:s, s:i, s:i, s:s%}", "type",
                             r ? "response.reasoning_text.delta" : "response.output_text.delta",
                             "item_id", w->item_id, "output_index", w->block_index, "content_index", 0,
                             "delta", ev->text, ev->len));
    } else if (ev->type == OUT_TOOL_START) {
        resp_open_block(w, BLK_TOOL, ev);
        w->acc_len = 0;
        if (w->acc) w->acc[0] = 0;
    } else if (ev->type == OUT_TOOL_ARGS) {
        acc_add(w, ev->text, ev->len);
        send_event(w, "response.function_call_arguments.delta",
                   json_pack("{s:s, s:s, s:i, s:s%}", "type", "response.function_call_arguments.delta",
                             "item_id", w->item_id, "output_index", w->block_index, "delta", ev->text,
                             ev->len));
    }
    /* OUT_TOOL_END: the final item needs the call id and name; it is sent
     * from resp_writer_end, which has the parser's complete calls. */
}

/* Final Anthropic content / Responses output / chat message from the parse. */
static json_t *final_body(resp_writer *w, const out_parser *p, finish_kind fin, const usage_info *u)
{
    const char *reasoning = out_parser_reasoning(p);
    const char *content = out_parser_content(p);
    size_t nc = out_parser_n_calls(p);
    json_t *body;
    if (w->kind == API_CHAT || w->kind == API_COMPLETIONS) {
        json_t *choice;
        if (w->kind == API_COMPLETIONS) {
            choice = json_pack("{s:i, s:s, s:n, s:s}", "index", 0, "text", content, "logprobs",
                               "finish_reason", finish_name(w->kind, fin));
        } else {
            json_t *msg = json_pack("{s:s, s:s}", "role", "assistant", "content", content);
            if (reasoning) json_object_set_new(msg, "reasoning_content", json_string(reasoning));
            if (nc) {
                json_t *calls = json_array();
                for (size_t i = 0; i < nc; i++) {
                    const out_call *c = out_parser_call(p, i);
                    json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", c->id, "type",
                                                           "function", "function", "name", c->name,
                                                           "arguments", c->arguments));
                }
                json_object_set_new(msg, "tool_calls", calls);
            }
            choice = json_pack("{s:i, s:o, s:n, s:s}", "index", 0, "message", msg, "logprobs",
                               "finish_reason", finish_name(w->kind, fin));
        }
        body = json_pack("{s:s, s:s, s:i, s:s, s:[o], s:o}", "id", w->id, "object",
                         w->kind == API_COMPLETIONS ? "text_completion" : "chat.completion", "created",
                         (int)w->created, "model", w->model, "choices", choice, "usage",
                         usage_json(w->kind, u));
    } else if (w->kind == API_MESSAGES) {
        json_t *blocks = json_array();
        if (reasoning) {
            char *sig = thinking_signature_make(reasoning, strlen(reasoning));
            json_array_append_new(blocks, json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking",
                                                    reasoning, "signature", sig ? sig : ""));
            free(sig);
        }
        if (*content || !nc)
            json_array_append_new(blocks, json_pack("{s:s, s:s}", "type", "text", "text", content));
        for (size_t i = 0; i < nc; i++) {
            const out_call *c = out_parser_call(p, i);
            json_t *input = json_loads(c->arguments, 0, NULL);
            json_array_append_new(blocks, json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", c->id,
                                                    "name", c->name, "input", input ? input : json_object()));
        }
        body = json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:o, s:o}", "id", w->id, "type", "message", "role",
                         "assistant", "model", w->model, "content", blocks, "stop_reason",
                         finish_name(w->kind, fin), "stop_sequence", stop_sequence_json(p, fin), "usage",
                         usage_json(w->kind, u));
    } else {
        json_t *output = json_array();
        char id[64];
        if (reasoning) {
            if (w->rs_id[0]) memcpy(id, w->rs_id, sizeof id);
            else tool_id_new("rs_", id, sizeof id);
            json_t *rs = json_pack("{s:s, s:s, s:[], s:[{s:s, s:s}], s:s}", "type", "reasoning", "id", id,
                                   "summary", "content", "type", "reasoning_text", "text", reasoning,
                                   "status", "completed");
            if (rs) rs_set_sig(rs, reasoning, strlen(reasoning));
            json_array_append_new(output, rs);
        }
        if (*content || !nc) {
            if (w->msg_id[0]) memcpy(id, w->msg_id, sizeof id);
            else tool_id_new("msg_", id, sizeof id);
            json_array_append_new(output, json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:s, s:[], s:[]}]}", "type",
                                                    "message", "id", id, "status", "completed", "role",
                                                    "assistant", "content", "type", "output_text", "text",
                                                    content, "annotations", "logprobs"));
        }
        for (size_t i = 0; i < nc; i++) {
            const out_call *c = out_parser_call(p, i);
            if ((int)i < w->n_fc) memcpy(id, w->fc_ids[i], sizeof id);
            else tool_id_new("fc_", id, sizeof id);
            json_t *fc = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "type", "function_call", "id", id,
                                   "call_id", c->id, "name", c->name, "arguments", c->arguments, "status",
                                   "completed");
            if (fc) fc_set_name(w, fc, c->name);
            json_array_append_new(output, fc);
        }
        body = resp_object(w, fin == FIN_LENGTH ? "incomplete" : "completed", output, usage_json(w->kind, u));
        if (fin == FIN_LENGTH)
            json_object_set_new(body, "incomplete_details", json_pack("{s:s}", "reason", "max_output_tokens"));
    }
    json_object_set_new(body, "ds4", ds4_info(u));
    return body;
}

void resp_writer_end(resp_writer *w, const out_parser *p, finish_kind fin, const usage_info *u)
{
    if (!w->stream) {
        json_t *b = final_body(w, p, fin, u);
        char *s = json_dumps(b, JSON_COMPACT);
        json_decref(b);
        if (s) { send_raw(w, s); free(s); }
        return;
    }
    if (w->kind == API_CHAT || w->kind == API_COMPLETIONS) {
        size_t nc = out_parser_n_calls(p);
        if (w->kind == API_CHAT && nc && !w->any_tool_streamed) {
            /* calls the live parser could not stream go out in one delta */
            json_t *calls = json_array();
            for (size_t i = 0; i < nc; i++) {
                const out_call *c = out_parser_call(p, i);
                json_array_append_new(calls, json_pack("{s:i, s:s, s:s, s:{s:s, s:s}}", "index", (int)i, "id",
                                                       c->id, "type", "function", "function", "name", c->name,
                                                       "arguments", c->arguments));
            }
            send_event(w, NULL, chat_chunk(w, json_pack("{s:o}", "tool_calls", calls), NULL));
        }
        json_t *last = chat_chunk(w, json_object(), finish_name(w->kind, fin));
        if (w->kind == API_COMPLETIONS) {
            json_object_set_new(json_array_get(json_object_get(last, "choices"), 0), "text", json_string(""));
        }
        json_object_set_new(last, "ds4", ds4_info(u));
        send_event(w, NULL, last);
        if (w->include_usage) {
            json_t *uc = json_pack("{s:s, s:s, s:i, s:s, s:[], s:o}", "id", w->id, "object",
                                   w->kind == API_COMPLETIONS ? "text_completion" : "chat.completion.chunk",
                                   "created", (int)w->created, "model", w->model, "choices", "usage",
                                   usage_json(w->kind, u));
            json_object_set_new(uc, "ds4", ds4_info(u));
            send_event(w, NULL, uc);
        }
        send_raw(w, "data: [DONE]\n\n");
        return;
    }
    if (w->kind == API_MESSAGES) {
        resp_close_block(w);
        if (w->block_index == 0) {
            /* an empty answer still has one (empty) text block */
            out_event ev = {OUT_CONTENT, 0, "", 0, NULL, NULL};
            resp_open_block(w, BLK_TEXT, &ev);
            resp_close_block(w);
        }
        json_t *usage = json_pack("{s:i, s:i, s:i}", "input_tokens", u->prompt_tokens - u->cached_tokens,
                                  "output_tokens", u->completion_tokens, "cache_read_input_tokens",
                                  u->cached_tokens);
        json_t *md = json_pack("{s:s, s:{s:s, s:o}, s:o}", "type", "message_delta", "delta", "stop_reason",
                               finish_name(w->kind, fin), "stop_sequence", stop_sequence_json(p, fin), "usage",
                               usage);
        json_object_set_new(md, "ds4", ds4_info(u));
        send_event(w, "message_delta", md);
        send_event(w, "message_stop", json_pack("{s:s}", "type", "message_stop"));
        return;
    }
    /* Responses: close text/reasoning; function_call items get their done
     * events here, with the complete arguments. */
    if (w->open != BLK_TOOL) resp_close_block(w);
    json_t *body = final_body(w, p, fin, u);
    json_t *output = json_object_get(body, "output");
    size_t i;
    json_t *item;
    json_array_foreach(output, i, item) {
        if (strcmp(json_string_value(json_object_get(item, "type")), "function_call")) continue;
        /* the output index of the k-th call in the stream: it was opened after
         * any reasoning/text blocks, in order */
        int idx = (int)i;
        const char *args = json_string_value(json_object_get(item, "arguments"));
        send_event(w, "response.function_call_arguments.done",
                   json_pack("{s:s, s:O, s:i, s:s}", "type", "response.function_call_arguments.done",
                             "item_id", json_object_get(item, "id"), "output_index", idx, "arguments", args));
        send_event(w, "response.output_item.done",
                   json_pack("{s:s, s:i, s:O}", "type", "response.output_item.done", "output_index", idx,
                             "item", item));
    }
    send_event(w, fin == FIN_LENGTH ? "response.incomplete" : "response.completed",
               json_pack("{s:s, s:o}", "type", fin == FIN_LENGTH ? "response.incomplete" : "response.completed",
                         "response", body));
}

/* Valid UTF-8 for a JSON string: messages quote request bytes (a model id
 * from the URL, a field cut at the message buffer's end), and jansson
 * refuses invalid UTF-8, which used to lose the whole message. Invalid or
 * cut sequences become U+FFFD. malloc'd, NULL on out of memory. */
static char *utf8_clean(const char *s)
{
    size_t n = strlen(s);
    char *out = malloc(DS4_UTF8_STREAM_MAX_OUT(n) + 12);
    if (!out) return NULL;
    ds4_utf8_stream us = {0};
    size_t k = ds4_utf8_stream_feed(&us, s, n, out);
    k += ds4_utf8_stream_flush(&us, out + k);
    out[k] = 0;
    return out;
}

char *api_error_body(api_kind kind, int status, const char *message_in, const char *param_in)
{
    char *message = utf8_clean(message_in ? message_in : "");
    char *param = param_in ? utf8_clean(param_in) : NULL;
    if (!message || (param_in && !param)) {
        free(message);
        free(param);
        return NULL;
    }
    const char *type = status == 401 ? "authentication_error" : status == 404 ? "not_found_error"
                     : status == 413 ? "request_too_large" : status == 429 || status == 503 ? "overloaded_error"
                     : status >= 500 ? "api_error" : "invalid_request_error";
    json_t *b;
    if (kind == API_MESSAGES)
        b = json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", type, "message", message);
    else
        b = json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", message, "type",
                      status == 401 ? "invalid_request_error" : type, "param",
                      param && *param ? json_string(param) : json_null(), "code",
                      status == 401 ? json_string("invalid_api_key") : json_null());
    char *s = b ? json_dumps(b, JSON_COMPACT) : NULL;
    json_decref(b);
    free(message);
    free(param);
    return s;
}

char *api_error_event(api_kind kind, const char *message)
{
    char *body = api_error_body(kind, 500, message, NULL);
    if (!body) return NULL;
    size_t n = strlen(body) + 64;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s%s\n\n", kind == API_CHAT || kind == API_COMPLETIONS ? "data: " : "event: error\ndata: ", body);
    free(body);
    return s;
}

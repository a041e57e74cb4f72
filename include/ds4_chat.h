/*
 * ds4_chat.h - rendering conversations into the exact DeepSeek V4 prompt
 * text (public API).
 *
 * Implements DeepSeek's official V4 encoding (shared/docs/dsv4-chat-format.md
 * §3), byte for byte: BOS, [Think Max prefix], then each message; tool
 * messages merged into user turns as <tool_result> blocks in call order;
 * earlier reasoning dropped in thinking mode unless tools are declared;
 * tool calls rendered as DSML; the assistant transition (<｜Assistant｜> +
 * <think> or </think>) after the last user turn. Render with
 * ds4_chat_render_spans and tokenize with ds4_tokenize_spans (or in one
 * call, ds4_chat_tokenize): then only the template's own markers become
 * special tokens, and a marker string inside a message stays plain text.
 *
 * Messages are OpenAI-style JSON objects (jansson):
 *   {"role": "system",    "content": str, ["tools": [...]], ["response_format": {...}]}
 *   {"role": "user",      "content": str | [parts], ["task": str]}
 *   {"role": "assistant", "content": str|null, ["reasoning_content": str],
 *                         ["tool_calls": [{"id", "type", "function": {"name", "arguments"}}]],
 *                         ["wo_eos": true]   (leave the turn open: no EOS)}
 *   {"role": "tool",      "tool_call_id": str, "content": str | [parts]}
 *   {"role": "developer", "content": str, ["tools": [...]]}
 *   {"role": "latest_reminder", "content": str}
 * Content parts: {"type":"text","text":...}; in user messages also
 * {"type":"tool_result","tool_use_id":...,"content":...}; any other part
 * renders as "[Unsupported TYPE]" (as DeepSeek's encoder does).
 * "arguments" may be a JSON string (as in the OpenAI API) or an object.
 */
#ifndef DS4_CHAT_H
#define DS4_CHAT_H

#include "ds4.h"
#include "ds4_tokenizer.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Literal texts of the chat special tokens (UTF-8). */
#define DS4_TEXT_BOS "<\xEF\xBD\x9C" "begin\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>"
#define DS4_TEXT_EOS "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>"
#define DS4_TEXT_USER "<\xEF\xBD\x9CUser\xEF\xBD\x9C>"
#define DS4_TEXT_ASSISTANT "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>"
#define DS4_TEXT_LATEST_REMINDER "<\xEF\xBD\x9Clatest_reminder\xEF\xBD\x9C>"
#define DS4_TEXT_THINK "<think>"
#define DS4_TEXT_THINK_END "</think>"
#define DS4_TEXT_DSML "\xEF\xBD\x9C" "DSML\xEF\xBD\x9C"

/* The Think Max system prefix (ends in "\n\n"). */
extern const char ds4_chat_think_max_prefix[];

/* Think Max is only used when the context is at least this long
 * (DeepSeek's recommendation; ds4 downgrades below it). */
#define DS4_THINK_MAX_MIN_CTX 393216

typedef struct {
    bool thinking;       /* thinking mode (prompt ends <think>) vs chat (</think>) */
    bool think_max;      /* reasoning_effort "max" (only with thinking) */
    bool drop_thinking;  /* drop reasoning of turns before the last user message
                            (default true; forced off when tools are declared) */
    bool add_bos;        /* start with BOS (default true) */
} ds4_chat_options;

/* thinking=true, think_max=false, drop_thinking=true, add_bos=true */
void ds4_chat_options_default(ds4_chat_options *o);

/* Render `messages` (a JSON array) to a malloc'd NUL-terminated string.
 * `tools` (may be NULL or empty): an OpenAI "tools" array; it is attached
 * to the first system message, or to a new empty system message put first
 * when there is none. Fails with DS4_ERR_INVALID naming the message index
 * and field for malformed input (unknown role, developer without content,
 * unknown task, a tool call without a name...). */
ds4_status ds4_chat_render(const json_t *messages, const json_t *tools, const ds4_chat_options *opt,
                           char **out, size_t *out_len);

/* ds4_chat_render that also APPENDS to *tpl the byte ranges the template
 * wrote (markers, separators, the tools block's wording); message text,
 * reasoning, tool results, tool names, arguments and schemas are content
 * and lie outside them. */
ds4_status ds4_chat_render_spans(const json_t *messages, const json_t *tools, const ds4_chat_options *opt,
                                 ds4_spans *tpl, char **out, size_t *out_len);

/* Render and tokenize in one call, APPENDING the ids to *out (no BOS
 * beyond opt->add_bos). Content never yields control tokens. */
ds4_status ds4_chat_tokenize(const ds4_tokenizer *tok, const json_t *messages, const json_t *tools,
                             const ds4_chat_options *opt, ds4_tokens *out);

#ifdef __cplusplus
}
#endif

#endif /* DS4_CHAT_H */

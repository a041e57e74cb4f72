/*
 * prompt_render.h - api_request -> the DeepSeek V4 prompt string.
 *
 * Implements the official V4 encoding (docs: dsv4-chat-format.md §3) for the
 * message shapes the HTTP APIs can express: system text with the tools block
 * appended, user turns (tool results merged into them, re-sorted into call
 * order), assistant turns with reasoning and DSML tool calls, the thinking /
 * chat transitions and Think Max. Assistant tool calls are rendered from the
 * exact sampled DSML bytes when the tool memory knows every id of the turn
 * (chat-format §7), canonically otherwise.
 *
 * The rendered bytes are the key of everything downstream: the live-session
 * prefix match and the disk cache's SHA1 file names.
 */
#ifndef DS4_SERVER_PROMPT_RENDER_H
#define DS4_SERVER_PROMPT_RENDER_H

#include <stdbool.h>
#include <stddef.h>

#include "include/ds4_chat.h"
#include "server/api_request.h"

struct tool_memory;

/* Short names for the chat special tokens' text (include/ds4_chat.h). */
#define DS4_BOS DS4_TEXT_BOS
#define DS4_EOS DS4_TEXT_EOS
#define DS4_USER DS4_TEXT_USER
#define DS4_ASSISTANT DS4_TEXT_ASSISTANT
#define DS4_THINK DS4_TEXT_THINK
#define DS4_ENDTHINK DS4_TEXT_THINK_END
#define DS4_DSML DS4_TEXT_DSML

typedef struct {
    bool thinking;     /* thinking mode (prompt ends with <think>) */
    bool think_max;    /* prepend the Think Max prefix */
    bool use_tools;    /* render the tools block (false for tool_choice none) */
    struct tool_memory *memory; /* exact DSML replay; NULL = canonical only */
} render_opts;

/* Returns a malloc'd NUL-terminated prompt, or NULL on allocation failure.
 * *replayed counts the assistant turns rendered from exact sampled bytes. */
char *prompt_render(const api_request *r, const render_opts *o, size_t *len,
                    int *replayed);
/* The same, also appending to *tpl the byte ranges the template wrote
 * (markers, separators, the tools block's wording, exactly replayed
 * blocks); request text lies outside them, so tokenizing with
 * ds4_tokenize_spans never turns it into control tokens. */
char *prompt_render_spans(const api_request *r, const render_opts *o, size_t *len,
                          int *replayed, ds4_spans *tpl);

/* tool_choice enforcement (worker.c) forces the start of a tool-call block
 * into the answer. The forced bytes are cut out of what the history
 * renderer above writes for a canonical call, so a replayed turn still
 * spells the live session byte for byte:
 *   opening(NAME)  "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"NAME\">\n"
 *   opening(NULL)  the same through `name="` (the model writes the name)
 *   close          "\n</｜DSML｜tool_calls>", what follows a closed invoke
 *                  when it is the last one.
 * malloc'd, NULL on allocation failure. */
char *prompt_render_call_opening(const char *name);
char *prompt_render_calls_close(void);

#endif

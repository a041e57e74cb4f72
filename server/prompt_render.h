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

#include "server/api_request.h"

struct tool_memory;

#define DS4_BOS "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define DS4_EOS "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define DS4_USER "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define DS4_ASSISTANT "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"
#define DS4_THINK "<think>"
#define DS4_ENDTHINK "</think>"
#define DS4_DSML "\xef\xbd\x9c" "DSML\xef\xbd\x9c"

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

/* Canonical DSML block (no leading "\n\n") for a list of calls. */
char *prompt_render_calls(const api_tool_call *calls, size_t n);

#endif

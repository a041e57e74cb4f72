/*
 * cli_logprobs.h - `ds4 --dump-logprobs FILE`: greedy continuation with
 * the top-K alternatives of every step, as JSON.
 */
#ifndef DS4_CLI_LOGPROBS_H
#define DS4_CLI_LOGPROBS_H

#include "cli/cli_chat.h"

/* Prompt: the rendered chat (or the raw text with --raw-prompt). Writes
 * {"model","prompt_tokens","prompt_ids","top_k","steps":[{"token":{"id","text","bytes"},
 * "logprob","top_logprobs":[{"id","text","bytes","logprob"},...]}]} where
 * bytes is the token's raw bytes in hex and text its UTF-8 (invalid bytes
 * as U+FFFD). Stops after -n steps or at EOS (included). Exit code. */
int ds4_cli_dump_logprobs(ds4_cli_chat *c, const char *prompt, size_t len, const ds4_spans *tpl);

#endif

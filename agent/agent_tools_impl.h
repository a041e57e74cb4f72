/*
 * agent_tools_impl.h - what the tool implementations share (private to
 * agent_tools*.c).
 */
#ifndef DS4_AGENT_TOOLS_IMPL_H
#define DS4_AGENT_TOOLS_IMPL_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "agent/agent_buf.h"
#include "agent/agent_fileio.h"
#include "agent/agent_tools.h"

#define AGENT_MAX_FILE_BYTES (16u << 20) /* files larger than this are not read whole */

/* A string argument (NULL when absent or not a string; an embedded NUL
 * makes it absent too: a C path cannot hold one). */
const char *agent_arg_str(const json_t *args, const char *key);
/* An integer argument (a JSON integer, or a string of digits, since a
 * model may send numbers with string="true"); false when absent/bad. */
bool agent_arg_int(const json_t *args, const char *key, long long *out);
bool agent_arg_bool(const json_t *args, const char *key, bool dflt);

char *agent_tool_read(agent_tools *t, const json_t *args, bool *failed);
char *agent_tool_write(agent_tools *t, const json_t *args, bool *failed);
char *agent_tool_edit(agent_tools *t, const json_t *args, bool *failed);
char *agent_tool_list(agent_tools *t, const json_t *args, bool *failed);
char *agent_tool_glob(agent_tools *t, const json_t *args, bool *failed);
char *agent_tool_search(agent_tools *t, const json_t *args, bool *failed);

/* "error: ..." result. */
char *agent_tool_error(bool *failed, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif

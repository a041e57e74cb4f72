/*
 * dsml_render.h - DSML rendering into a strbuf, shared by the public
 * ds4_dsml_render_* functions and the chat renderer.
 */
#ifndef DS4_TEXT_DSML_RENDER_H
#define DS4_TEXT_DSML_RENDER_H

#include "include/ds4.h"
#include "text/strbuf.h"

#include <jansson.h>

/* Append the tools block. DS4_ERR_INVALID (message set) for a tool that
 * is not an object. */
ds4_status ds4_dsml_tools_block(ds4_strbuf *b, const json_t *tools);
/* Append "<｜DSML｜tool_calls>\n...\n</｜DSML｜tool_calls>". */
ds4_status ds4_dsml_calls_block(ds4_strbuf *b, const json_t *tool_calls);

#endif

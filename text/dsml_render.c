/*
 * dsml_render.c - the tools block and canonical DSML tool calls, exactly
 * as DeepSeek's V4 encoder writes them (dsv4-chat-format.md §3.5, §3.6).
 *
 * The wording of the tools block is protocol data the model was trained
 * on; it is reproduced byte for byte and checked by the gold tests.
 */
#include "include/ds4_dsml.h"

#include "text/dsml_render.h"
#include "text/pyjson.h"
#include "util/error.h"

#include <string.h>

#define DSML DS4_TEXT_DSML_LIT
#define DS4_TEXT_DSML_LIT "\xEF\xBD\x9C" "DSML\xEF\xBD\x9C"

static const char k_tools_head[] =
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by "
    "writing a \"<" DSML "tool_calls>\" block like the following:\n\n"
    "<" DSML "tool_calls>\n"
    "<" DSML "invoke name=\"$TOOL_NAME\">\n"
    "<" DSML "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" DSML "parameter>\n"
    "...\n"
    "</" DSML "invoke>\n"
    "<" DSML "invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</" DSML "invoke>\n"
    "</" DSML "tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types "
    "(numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning "
    "inside <think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";

static const char k_tools_tail[] =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

ds4_status ds4_dsml_tools_block(ds4_strbuf *b, const json_t *tools)
{
    if (!json_is_array(tools)) return ds4_fail(DS4_ERR_INVALID, "tools: not an array");
    ds4_sb_tpl(b, k_tools_head);
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *t = json_array_get(tools, i);
        const json_t *fn = json_object_get(t, "function");
        if (!json_is_object(fn)) fn = t; /* bare function object */
        if (!json_is_object(fn)) return ds4_fail(DS4_ERR_INVALID, "tools[%zu]: not an object", i);
        if (i) ds4_sb_tpl(b, "\n");
        ds4_pyjson_dump(b, fn); /* the caller's schema: content */
    }
    ds4_sb_tpl(b, k_tools_tail);
    return DS4_OK;
}

/* Parameters of one call, joined by "\n". */
static void render_params(ds4_strbuf *b, const json_t *args_in)
{
    json_t *owned = NULL;
    const json_t *args = args_in;
    if (!args_in) return; /* no arguments at all: a call without parameters */
    if (json_is_string(args_in)) {
        json_error_t err;
        owned = json_loadb(json_string_value(args_in), json_string_length(args_in), JSON_ALLOW_NUL, &err);
        args = owned;
    }
    if (!json_is_object(args)) {
        /* not a JSON object: the whole text is one string parameter */
        ds4_sb_tpl(b, "<" DSML "parameter name=\"arguments\" string=\"true\">");
        if (json_is_string(args_in)) ds4_sb_append(b, json_string_value(args_in), json_string_length(args_in));
        else ds4_pyjson_dump(b, args_in);
        ds4_sb_tpl(b, "</" DSML "parameter>");
        json_decref(owned);
        return;
    }
    const char *key;
    json_t *v;
    bool first = true;
    json_object_foreach((json_t *)args, key, v) {
        if (!first) ds4_sb_tpl(b, "\n");
        first = false;
        ds4_sb_tpl(b, "<" DSML "parameter name=\"");
        ds4_sb_puts(b, key);
        ds4_sb_tpl(b, json_is_string(v) ? "\" string=\"true\">" : "\" string=\"false\">");
        if (json_is_string(v)) ds4_sb_append(b, json_string_value(v), json_string_length(v));
        else ds4_pyjson_dump(b, v);
        ds4_sb_tpl(b, "</" DSML "parameter>");
    }
    json_decref(owned);
}

ds4_status ds4_dsml_calls_block(ds4_strbuf *b, const json_t *tool_calls)
{
    if (!json_is_array(tool_calls)) return ds4_fail(DS4_ERR_INVALID, "tool_calls: not an array");
    ds4_sb_tpl(b, "<" DSML "tool_calls>\n");
    for (size_t i = 0; i < json_array_size(tool_calls); i++) {
        const json_t *tc = json_array_get(tool_calls, i);
        const json_t *fn = json_object_get(tc, "function");
        if (!json_is_object(fn)) fn = tc;
        const json_t *name = json_object_get(fn, "name");
        if (!json_is_string(name)) return ds4_fail(DS4_ERR_INVALID, "tool_calls[%zu]: no function name", i);
        if (i) ds4_sb_tpl(b, "\n");
        ds4_sb_tpl(b, "<" DSML "invoke name=\"");
        ds4_sb_append(b, json_string_value(name), json_string_length(name));
        ds4_sb_tpl(b, "\">\n");
        render_params(b, json_object_get(fn, "arguments"));
        ds4_sb_tpl(b, "\n</" DSML "invoke>");
    }
    ds4_sb_tpl(b, "\n</" DSML "tool_calls>");
    return DS4_OK;
}

static ds4_status finish(ds4_strbuf *b, ds4_status st, char **out, size_t *out_len)
{
    if (st) {
        ds4_sb_free(b);
        return st;
    }
    *out = ds4_sb_take(b, out_len);
    return *out ? DS4_OK : ds4_fail(DS4_ERR_NOMEM, "dsml: out of memory");
}

ds4_status ds4_dsml_render_tools(const json_t *tools, char **out, size_t *out_len)
{
    return ds4_dsml_render_tools_spans(tools, NULL, out, out_len);
}

ds4_status ds4_dsml_render_calls(const json_t *tool_calls, char **out, size_t *out_len)
{
    return ds4_dsml_render_calls_spans(tool_calls, NULL, out, out_len);
}

ds4_status ds4_dsml_render_tools_spans(const json_t *tools, ds4_spans *tpl, char **out, size_t *out_len)
{
    ds4_strbuf b = {0};
    b.tpl = tpl;
    return finish(&b, ds4_dsml_tools_block(&b, tools), out, out_len);
}

ds4_status ds4_dsml_render_calls_spans(const json_t *tool_calls, ds4_spans *tpl, char **out, size_t *out_len)
{
    ds4_strbuf b = {0};
    b.tpl = tpl;
    return finish(&b, ds4_dsml_calls_block(&b, tool_calls), out, out_len);
}

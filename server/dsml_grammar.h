/*
 * dsml_grammar.h - a forced tool call whose parameters follow the tool's
 * schema: which bytes may come next in the DSML block.
 *
 * When a request forces a call (Anthropic tool_choice "tool" / "any",
 * OpenAI a named or required choice of strict tools), the server writes
 * the block's opening itself (worker.c, "tool_choice") and the model
 * writes the rest. This grammar takes over right after that opening and
 * admits only the canonical DSML (chat-format §3.6) of calls that
 * validate against the tool's input schema:
 *
 *   <｜DSML｜parameter name="K" string="true">raw text</｜DSML｜parameter>\n
 *   <｜DSML｜parameter name="N" string="false">JSON</｜DSML｜parameter>\n
 *   </｜DSML｜invoke>   (a call without parameters: "\n</｜DSML｜invoke>")
 *
 * then "\n</｜DSML｜tool_calls>" (or, when any tool may be called, another
 * "\n<｜DSML｜invoke name=\"" and a declared name). Keys are the schema's
 * properties (others only when additionalProperties allows them), each at
 * most once; the invoke closes only when every required key was written.
 * A value is string="true" raw text exactly when it is a JSON string (as
 * the official encoder renders arguments), checked against the property's
 * schema as the JSON string it becomes (maxLength, enum, const), and
 * string="false" JSON otherwise, checked by server/json_grammar.h. The
 * parser (text/dsml_parse.c) decodes no entities and ends a value at the
 * first "</｜DSML｜parameter>", so a value may hold any bytes but that tag.
 * Strings without maxLength are not bounded here: the budget ends them.
 *
 * The root schema must be an object schema ({"type":"object",...}: with no
 * properties any keys; or no schema at all, as OpenAI reads a function
 * without "parameters": no keys); others are refused with a reason.
 */
#ifndef DS4_SERVER_DSML_GRAMMAR_H
#define DS4_SERVER_DSML_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>

#include "include/ds4_tokenizer.h"

typedef struct dsml_grammar dsml_grammar;
typedef struct dg_state dg_state;

typedef struct {
    const char *name;
    const char *schema_json;  /* the input schema (JSON object text), or NULL */
} dg_tool;

/* NULL with err filled when a schema is not one the grammar can take. */
dsml_grammar *dsml_grammar_new(const dg_tool *tools, size_t n, char *err, size_t es);
void dsml_grammar_free(dsml_grammar *g);

/* named >= 0: the text so far ends with that tool's invoke tag
 * ("<｜DSML｜invoke name=\"N\">\n"); named < 0: it ends with
 * "<｜DSML｜invoke name=\"" and the model names one of the tools. */
dg_state *dg_state_new(const dsml_grammar *g, int named);
void dg_state_free(dg_state *s);
/* Whether bytes can follow what was fed so far (s is not changed). */
bool dg_accepts(dg_state *s, const char *bytes, size_t n);
/* Feeds bytes; -1 when they do not fit (the state is then unchanged). */
int dg_feed(dg_state *s, const char *bytes, size_t n);
/* The block is closed. */
bool dg_done(const dg_state *s);
/* The shortest bytes that close the block from here: the required
 * parameters still missing with their shortest values, then the invoke's
 * and the block's end. What the server writes itself when the output
 * budget would end inside the call, so even a cut call validates.
 * Appends to *tpl the byte ranges (from 0) that are DSML structure, where
 * the marker is meant; names and values are text. malloc'd; "" when done;
 * NULL on no memory. */
char *dg_completion(dg_state *s, size_t *len, ds4_spans *tpl);
/* Where the DSML marker would be text: in a name, or in a parameter value
 * (there it may only come as part of the closing tag). */
bool dg_marker_is_text(const dg_state *s);

#endif

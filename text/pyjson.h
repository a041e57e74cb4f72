/*
 * pyjson.h - JSON text exactly as Python's json.dumps(v, ensure_ascii=False)
 * writes it.
 *
 * DeepSeek's encoder serializes tool schemas and non-string tool-call
 * arguments with json.dumps, and the model was trained on those bytes:
 * ", " and ": " separators, keys in the given order, non-ASCII raw,
 * floats in Python's shortest repr (1.0, 1e-05, 1e+16). Token-exact
 * prompts need the same text, so we reproduce it instead of using
 * jansson's own dumper.
 */
#ifndef DS4_TEXT_PYJSON_H
#define DS4_TEXT_PYJSON_H

#include "text/strbuf.h"

#include <jansson.h>

void ds4_pyjson_dump(ds4_strbuf *b, const json_t *v);
/* A JSON string literal for s[0..n) with Python's escapes. */
void ds4_pyjson_string(ds4_strbuf *b, const char *s, size_t n);
/* Python repr() of a double (what json.dumps writes for a float). */
void ds4_pyjson_float(ds4_strbuf *b, double x);

#endif

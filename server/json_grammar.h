/*
 * json_grammar.h - structured outputs: which bytes may come next so that
 * the answer is JSON that validates against a schema.
 *
 * A request's response_format (OpenAI json_object / json_schema) becomes a
 * json_grammar; while the visible answer is sampled, a jg_state tracks the
 * JSON read so far (a pushdown automaton over bytes) and the sampler keeps
 * only the tokens whose bytes it accepts (srv_sampling.allow), then the
 * end-of-sentence token once the value is complete. So the answer always
 * parses, and validates, whatever the model would have written.
 *
 * Schema subset (what the OpenAI strict mode allows, minus $ref and
 * pattern/format): type object (properties, required,
 * additionalProperties), array (items, minItems, maxItems), string
 * (maxLength), number, integer, boolean, null, a list of types, enum,
 * const, anyOf of those; anything else is any JSON value. Unbounded parts
 * get a bound (strings 1024 bytes, arrays 256 items, 18 integer digits and
 * 2 exponent digits, so any parser holds a number, 4 spaces
 * between tokens, 32 levels) so the answer always ends.
 */
#ifndef DS4_SERVER_JSON_GRAMMAR_H
#define DS4_SERVER_JSON_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>

typedef struct json_grammar json_grammar;
typedef struct jg_state jg_state;

/* schema_json NULL: any JSON object (json_object mode). NULL on a schema
 * that is not JSON or uses an unsupported form, with err filled. */
json_grammar *json_grammar_new(const char *schema_json, char *err, size_t es);
/* The same with options: JG_LONG_STRINGS lifts the 1024-byte bound of
 * strings without maxLength (to JG_LONG_STRING_BOUND): a tool call's
 * parameter (a file's text) ends with the output budget anyway. */
#define JG_LONG_STRINGS 1u
#define JG_LONG_STRING_BOUND (1 << 30)
json_grammar *json_grammar_new_opts(const char *schema_json, unsigned flags, char *err, size_t es);
void json_grammar_free(json_grammar *g);

jg_state *jg_state_new(const json_grammar *g);
void jg_state_free(jg_state *s);
/* Back to the start of a value of g (which may be another grammar). */
void jg_state_reset(jg_state *s, const json_grammar *g);
/* dst becomes a copy of src (both made by jg_state_new). */
void jg_state_copy(jg_state *dst, const jg_state *src);
/* Whether bytes can follow what was fed so far. */
bool jg_accepts(const jg_state *s, const char *bytes, size_t n);
/* Feeds bytes; -1 when they do not fit (the state is then unchanged). */
int jg_feed(jg_state *s, const char *bytes, size_t n);
/* Whether bytes can follow and leave a whole value. */
bool jg_accepts_to_end(const jg_state *s, const char *bytes, size_t n);
/* A whole value has been read (only whitespace may follow). */
bool jg_done(const jg_state *s);
/* The shortest bytes that complete the value from here (what the server
 * writes itself when the output budget would end inside the JSON, so the
 * answer still parses). malloc'd; "" when done; NULL on no memory. */
char *jg_completion(const jg_state *s, size_t *len);

#endif

/*
 * fuzz_dsml_grammar.c - libFuzzer target for the forced tool call's
 * grammar (server/dsml_grammar.c): a tool's input schema from the request
 * and the bytes the model writes after the forced DSML opening.
 *
 * The input is "schema\0bytes" (no NUL: the whole input is the schema).
 * The first byte of the bytes picks the start (odd: a named call, even:
 * the model names the tool). Bytes the grammar refuses are skipped (the
 * sampler would not pick them); accepting and feeding must agree, and from
 * every point the shortest completion must be accepted and close the
 * block, which the DSML parser must then read as a closed block with one
 * call at least. Seeds: fuzz/corpus/dsml_grammar/.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "include/ds4_dsml.h"
#include "server/dsml_grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t sl = nul ? (size_t)(nul - data) : size;
    char *schema = malloc(sl + 1);
    if (!schema) return 0;
    memcpy(schema, data, sl);
    schema[sl] = 0;
    const char *bytes = nul ? (const char *)nul + 1 : "";
    size_t n = nul ? size - sl - 1 : 0;
    dg_tool tools[2] = {{"f", schema}, {"g_2", "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}"}};
    char err[160];
    dsml_grammar *g = dsml_grammar_new(tools, 2, err, sizeof err);
    free(schema);
    if (!g) return 0;
    bool named = n && (bytes[0] & 1);
    dg_state *s = dg_state_new(g, named ? 0 : -1);
    static const char open_named[] = "<\xEF\xBD\x9C" "DSML\xEF\xBD\x9C" "tool_calls>\n<\xEF\xBD\x9C" "DSML\xEF\xBD\x9C" "invoke name=\"f\">\n";
    static const char open_any[] = "<\xEF\xBD\x9C" "DSML\xEF\xBD\x9C" "tool_calls>\n<\xEF\xBD\x9C" "DSML\xEF\xBD\x9C" "invoke name=\"";
    const char *open = named ? open_named : open_any;
    size_t ol = strlen(open), cap = ol + n + 1, tl = ol;
    char *text = malloc(cap);
    if (!s || !text) goto out;
    memcpy(text, open, ol);
    for (size_t i = n ? 1 : 0; i < n && !dg_done(s); i++) {
        if (!dg_accepts(s, bytes + i, 1)) continue;
        if (dg_feed(s, bytes + i, 1) != 0) abort(); /* accepts and feed disagree */
        text[tl++] = bytes[i];
    }
    size_t cl = 0;
    ds4_spans tpl = {0};
    char *c = dg_completion(s, &cl, &tpl);
    ds4_spans_free(&tpl);
    if (c) {
        if (dg_feed(s, c, cl) != 0 || !dg_done(s)) abort();
        char *all = malloc(tl + cl);
        if (all) {
            memcpy(all, text, tl);
            memcpy(all + tl, c, cl);
            ds4_gen_state st;
            json_t *m = ds4_dsml_parse_message(all, tl + cl, false, true, &st, NULL);
            if (m && (st != DS4_GEN_TOOLS_DONE || json_array_size(json_object_get(m, "tool_calls")) < 1)) abort();
            json_decref(m);
            free(all);
        }
        free(c);
    }
out:
    free(text);
    dg_state_free(s);
    dsml_grammar_free(g);
    return 0;
}

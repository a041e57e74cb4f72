/*
 * fuzz_json_grammar.c - libFuzzer target for the structured-output matcher
 * (server/json_grammar.c): a schema from the request and model bytes.
 *
 * The input is "schema\0bytes" (no NUL: the whole input is the schema and
 * the json_object grammar reads it as bytes). Every accepted prefix must
 * have a completion that the matcher itself accepts and that ends the
 * value: the property the server relies on when the budget runs out.
 * Seeds: fuzz/corpus/json_grammar/.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/json_grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    char *schema = NULL;
    const char *bytes = (const char *)data;
    size_t n = size;
    if (nul) {
        schema = malloc((size_t)(nul - data) + 1);
        if (!schema) return 0;
        memcpy(schema, data, (size_t)(nul - data));
        schema[nul - data] = 0;
        bytes = (const char *)nul + 1;
        n = size - (size_t)(nul - data) - 1;
    }
    char err[160];
    json_grammar *g = json_grammar_new(schema, err, sizeof err);
    free(schema);
    if (!g) return 0;
    jg_state *s = jg_state_new(g);
    for (size_t i = 0; s && i < n; i++) {
        if (!jg_accepts(s, bytes + i, 1)) continue; /* the sampler would not pick it */
        if (jg_feed(s, bytes + i, 1) != 0) abort(); /* accepts and feed disagree */
    }
    if (s) {
        size_t cl = 0;
        char *c = jg_completion(s, &cl);
        if (c) {
            if (jg_feed(s, c, cl) != 0 || !jg_done(s)) abort();
            free(c);
        }
    }
    jg_state_free(s);
    json_grammar_free(g);
    return 0;
}

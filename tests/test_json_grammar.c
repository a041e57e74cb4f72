/*
 * test_json_grammar.c - the structured-output matcher (server/json_grammar.h):
 * documents valid under a schema are accepted byte by byte and end the
 * value; documents that break it (wrong type, undeclared or missing key,
 * bad JSON) are refused at the first offending byte; and a random walk
 * that only ever picks accepted bytes always ends in JSON that jansson
 * parses and that has the schema's required keys and types (checked here
 * with jansson, not with the matcher).
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "server/json_grammar.h"
#include "tests/test.h"

static const char *SCHEMA =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":12},"
    "\"age\":{\"type\":\"integer\"},"
    "\"score\":{\"type\":\"number\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":5},\"maxItems\":3},"
    "\"color\":{\"enum\":[\"red\",\"green\",7]},"
    "\"ok\":{\"type\":\"boolean\"},"
    "\"note\":{\"type\":[\"string\",\"null\"],\"maxLength\":8}},"
    "\"required\":[\"name\",\"age\",\"color\"],\"additionalProperties\":false}";

/* -1: accepted and complete; else the offset of the first refused byte,
 * or the length when all was accepted but the value is not complete */
static long run(const json_grammar *g, const char *doc)
{
    jg_state *s = jg_state_new(g);
    size_t n = strlen(doc);
    long at = -2;
    for (size_t i = 0; i < n && at == -2; i++) {
        if (!jg_accepts(s, doc + i, 1)) at = (long)i;
        else if (jg_feed(s, doc + i, 1) != 0) at = (long)i;
    }
    if (at == -2) at = jg_done(s) ? -1 : (long)n;
    jg_state_free(s);
    return at;
}

static void test_accepts_valid(void)
{
    char err[128];
    json_grammar *g = json_grammar_new(SCHEMA, err, sizeof err);
    REQUIRE(g);
    const char *good[] = {
        "{\"name\":\"Ann\",\"age\":30,\"color\":\"red\"}",
        "{ \"age\": -4, \"color\": 7, \"name\": \"B\\u00e9\\n\", \"ok\": true }",
        "{\"name\":\"\",\"age\":0,\"color\":\"green\",\"score\":-1.5e+3,\"tags\":[\"a\",\"bb\"],\"note\":null}",
        "{\"name\":\"x\",\"age\":1,\"color\":\"red\",\"tags\":[],\"note\":\"hi\"}\n",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        EXPECT_MSG(run(g, good[i]) == -1, "good %zu refused at %ld", i, run(g, good[i]));
    json_grammar_free(g);
}

static void test_refuses_invalid(void)
{
    char err[128];
    json_grammar *g = json_grammar_new(SCHEMA, err, sizeof err);
    REQUIRE(g);
    struct { const char *doc; long at; } bad[] = {
        {"[1]", 0},                                           /* not an object */
        {"{\"nam\":", 5},                                     /* no such key */
        {"{\"name\":1", 8},                                   /* wrong type */
        {"{\"name\":\"a\",\"age\":1.5", 19},                  /* integer */
        {"{\"name\":\"a\",\"age\":1,\"color\":\"blue\"", 29},    /* enum */
        {"{\"name\":\"a\",\"age\":1}", 19},                   /* color missing */
        {"{\"name\":\"a\",\"name\"", 14},                     /* twice (n of note) */
        {"{\"name\":\"abcdefghijklm\"", 21},                  /* maxLength 12 */
        {"{\"name\":\"a\",\"age\":01", 19},                   /* leading zero */
        {"{\"name\":\"a\\x", 11},                             /* bad escape */
        {"{\"tags\":[\"a\",\"b\",\"c\",", 20},                  /* maxItems 3 */
        {"{\"name\":\"a\",\"age\":1,\"color\":7} x", 31},       /* after the end */
        {"{\"name\":\"a\",\"age\":1,\"color\":7", 29},           /* unfinished */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        long at = run(g, bad[i].doc);
        EXPECT_MSG(at == bad[i].at, "bad %zu (%s): refused at %ld, expected %ld", i, bad[i].doc, at, bad[i].at);
    }
    json_grammar_free(g);
    /* a union inside a union (the CI fuzz smoke's crash): a value no
     * branch of the inner one starts is refused, not a NULL branch read */
    json_grammar *nu = json_grammar_new("{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"number\"},"
                                        "{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"null\"}]}]}}",
                                        err, sizeof err);
    REQUIRE(nu);
    EXPECT(run(nu, "[1,null,2.5]") == -1);
    EXPECT(run(nu, "[1,\"x\"]") == 3);
    EXPECT(run(nu, "[true]") == 1);
    json_grammar_free(nu);
    EXPECT(json_grammar_new("{\"$ref\":\"#/x\"}", err, sizeof err) == NULL && strstr(err, "$ref"));
    EXPECT(json_grammar_new("{\"type\":\"object\",\"properties\":{},\"required\":[\"x\"]}", err, sizeof err) == NULL);
    EXPECT(json_grammar_new("not json", err, sizeof err) == NULL);
}

/* bytes a model could write: JSON punctuation, letters, digits, escapes */
static const char ALPHA[] = "{}[]\",:0123456789-+.eE abcdefghijklmnopqrstuvwxyzAN\\/u\n";

static unsigned long long rng = 88172645463325252ull;
static unsigned rnd(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (unsigned)rng; }

static void test_random_walks_validate(void)
{
    char err[128];
    json_grammar *g = json_grammar_new(SCHEMA, err, sizeof err);
    json_grammar *any = json_grammar_new(NULL, err, sizeof err);
    REQUIRE(g && any);
    for (int walk = 0; walk < 400; walk++) {
        const json_grammar *gg = walk % 2 ? g : any;
        jg_state *s = jg_state_new(gg);
        char doc[16384];
        size_t n = 0;
        /* pick uniformly among accepted bytes, ending as soon as allowed
         * half of the time; the bounds guarantee an end. Every other walk
         * stops early and appends the shortest completion (what the
         * server writes when the budget runs out). */
        size_t stop_at = walk % 4 >= 2 ? rnd() % 40 : sizeof doc;
        while (n + 1 < sizeof doc) {
            if (jg_done(s) && (rnd() & 1)) break;
            if (n == stop_at) {
                size_t cl = 0;
                char *comp = jg_completion(s, &cl);
                EXPECT_MSG(comp != NULL, "walk %d: no completion after %s", walk, doc);
                if (!comp) break;
                EXPECT(jg_feed(s, comp, cl) == 0);
                memcpy(doc + n, comp, cl);
                n += cl;
                free(comp);
                break;
            }
            char ok[sizeof ALPHA];
            int k = 0;
            for (size_t i = 0; i + 1 < sizeof ALPHA; i++)
                if (jg_accepts(s, &ALPHA[i], 1)) ok[k++] = ALPHA[i];
            if (!k) break;
            char c = ok[rnd() % (unsigned)k];
            EXPECT(jg_feed(s, &c, 1) == 0);
            doc[n++] = c;
        }
        doc[n] = 0;
        EXPECT_MSG(jg_done(s), "walk %d ended unfinished: %s", walk, doc);
        json_error_t je;
        json_t *j = json_loads(doc, 0, &je);
        EXPECT_MSG(j && json_is_object(j), "walk %d: not a JSON object (%s): %s", walk, je.text, doc);
        if (j && gg == g) {
            json_t *name = json_object_get(j, "name"), *age = json_object_get(j, "age"), *color = json_object_get(j, "color");
            EXPECT_MSG(json_is_string(name) && json_string_length(name) <= 3 * 12, "walk %d name: %s", walk, doc);
            EXPECT_MSG(json_is_integer(age), "walk %d age: %s", walk, doc);
            EXPECT_MSG(color && ((json_is_string(color) && (!strcmp(json_string_value(color), "red") ||
                                                           !strcmp(json_string_value(color), "green"))) ||
                                 (json_is_integer(color) && json_integer_value(color) == 7)),
                       "walk %d color: %s", walk, doc);
            const char *k;
            json_t *v;
            json_object_foreach(j, k, v)
                EXPECT_MSG(strstr(SCHEMA, k) != NULL, "walk %d undeclared key %s", walk, k);
            json_t *tags = json_object_get(j, "tags");
            EXPECT(!tags || (json_is_array(tags) && json_array_size(tags) <= 3));
            json_t *sc = json_object_get(j, "score");
            EXPECT(!sc || json_is_number(sc));
        }
        json_decref(j);
        jg_state_free(s);
    }
    json_grammar_free(g);
    json_grammar_free(any);
}

int main(void)
{
    RUN(test_accepts_valid);
    RUN(test_refuses_invalid);
    RUN(test_random_walks_validate);
    return test_finish();
}

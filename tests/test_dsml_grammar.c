/*
 * test_dsml_grammar.c - forced tool calls under the tool's schema
 * (server/dsml_grammar.h): the canonical DSML that the official-form
 * renderer (ds4_dsml_render_calls) writes for valid arguments is accepted
 * byte by byte and closes the block; calls that break the schema (a
 * missing required key, a value outside an enum, a string for an integer,
 * an undeclared or repeated key, a non-canonical string="false" string)
 * are refused at the offending byte; and random walks that only pick
 * accepted pieces always end in a block that the DSML parser
 * (ds4_dsml_parse_message) turns into arguments that validate, checked
 * here with jansson against the schema, not with the grammar.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "include/ds4_dsml.h"
#include "server/dsml_grammar.h"
#include "tests/test.h"

#define D "\xEF\xBD\x9C" "DSML\xEF\xBD\x9C"

static const char *SCHEMA =
    "{\"type\":\"object\",\"properties\":{"
    "\"city\":{\"type\":\"string\",\"maxLength\":10},"
    "\"days\":{\"type\":\"integer\"},"
    "\"unit\":{\"enum\":[\"celsius\",\"fahrenheit\"]},"
    "\"temp\":{\"type\":\"number\"},"
    "\"alert\":{\"type\":\"boolean\"},"
    "\"hours\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"maxItems\":3},"
    "\"note\":{\"type\":[\"string\",\"null\"],\"maxLength\":6}},"
    "\"required\":[\"city\",\"days\",\"unit\"],\"additionalProperties\":false}";

static const char *OPEN_NAMED = "\n\n<" D "tool_calls>\n<" D "invoke name=\"get_weather\">\n";
static const char *OPEN_ANY = "\n\n<" D "tool_calls>\n<" D "invoke name=\"";

static dsml_grammar *grammar(void)
{
    dg_tool t[2] = {{"get_weather", SCHEMA}, {"ping", NULL}};
    char err[160];
    dsml_grammar *g = dsml_grammar_new(t, 2, err, sizeof err);
    EXPECT_MSG(g, "grammar: %s", err);
    return g;
}

/* -1: accepted and the block closed; else the offset of the first refused
 * byte, or the length when all was accepted but the block is open */
static long run(const dsml_grammar *g, int named, const char *text)
{
    dg_state *s = dg_state_new(g, named);
    size_t n = strlen(text);
    long at = -2;
    for (size_t i = 0; i < n && at == -2; i++)
        if (!dg_accepts(s, text + i, 1) || dg_feed(s, text + i, 1) != 0) at = (long)i;
    if (at == -2) at = dg_done(s) ? -1 : (long)n;
    dg_state_free(s);
    return at;
}

/* The canonical block of one call, from the renderer, minus `open`. */
static char *canonical_rest(const char *name, const char *args, const char *open)
{
    json_t *calls = json_pack("[{s:s, s:{s:s, s:s}}]", "type", "function", "function", "name", name, "arguments", args);
    char *out = NULL;
    size_t len = 0;
    ds4_status st = ds4_dsml_render_calls(calls, &out, &len);
    json_decref(calls);
    if (st != DS4_OK) return NULL;
    /* the renderer omits the leading "\n\n" (the chat renderer adds it) */
    const char *o = open + 2;
    char *rest = NULL;
    if (strncmp(out, o, strlen(o)) == 0) rest = strdup(out + strlen(o));
    free(out);
    return rest;
}

static void test_canonical_calls_accepted(void)
{
    dsml_grammar *g = grammar();
    REQUIRE(g);
    const char *good[] = {
        "{\"city\": \"Rome\", \"days\": 2, \"unit\": \"celsius\"}",
        "{\"unit\": \"fahrenheit\", \"days\": -3, \"city\": \"a</b>\\\"q\\\"\\n\", \"temp\": 21.5e1, \"alert\": true}",
        "{\"city\": \"\", \"days\": 0, \"unit\": \"celsius\", \"hours\": [1, 2, 3], \"note\": null}",
        "{\"city\": \"x\", \"days\": 1, \"unit\": \"celsius\", \"note\": \"hi\"}",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        char *rest = canonical_rest("get_weather", good[i], OPEN_NAMED);
        REQUIRE(rest);
        long at = run(g, 0, rest);
        EXPECT_MSG(at == -1, "good %zu refused at %ld of %s", i, at, rest);
        free(rest);
        /* the same call when the model names the tool itself */
        rest = canonical_rest("get_weather", good[i], OPEN_ANY);
        REQUIRE(rest);
        at = run(g, -1, rest);
        EXPECT_MSG(at == -1, "good %zu (any) refused at %ld of %s", i, at, rest);
        free(rest);
    }
    /* a call without parameters: "\n</｜DSML｜invoke>" */
    char *rest = canonical_rest("ping", "{}", OPEN_ANY);
    REQUIRE(rest);
    EXPECT_MSG(run(g, -1, rest) == -1, "ping refused at %ld of %s", run(g, -1, rest), rest);
    free(rest);
    dsml_grammar_free(g);
}

static void test_invalid_calls_refused(void)
{
    dsml_grammar *g = grammar();
    REQUIRE(g);
    static const char P[] = "<" D "parameter name=\"";
    static const char E[] = "</" D "parameter>\n";
    char buf[512];
    /* each ends with the byte that must be refused */
    const char *bad[] = {
        /* days and unit are required: the invoke cannot close yet */
        "<" D "parameter name=\"city\" string=\"true\">Rome</" D "parameter>\n</",
        /* an undeclared key */
        "<" D "parameter name=\"cityx",
        /* an integer written as raw text */
        "<" D "parameter name=\"days\" string=\"t",
        /* a value outside the enum */
        "<" D "parameter name=\"unit\" string=\"true\">k",
        /* a JSON string under string="false" (the canonical form is raw text) */
        "<" D "parameter name=\"note\" string=\"false\">\"",
        /* 1.5 for an integer */
        "<" D "parameter name=\"days\" string=\"false\">1.",
        /* maxLength 10 */
        "<" D "parameter name=\"city\" string=\"true\">abcdefghijk",
        /* the enum's value must be whole before the tag closes it */
        "<" D "parameter name=\"unit\" string=\"true\">cel<",
        /* past "</｜DSML｜" the closing tag must be finished (no marker as text) */
        "<" D "parameter name=\"city\" string=\"true\">a</" D "0",
        /* a parameter after the last possible one is not "</" of the invoke */
        "<" D "parameter name=\"days\" string=\"false\">1</" D "parameter>\n<" D "parameter name=\"d",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        long at = run(g, 0, bad[i]);
        EXPECT_MSG(at == (long)strlen(bad[i]) - 1, "bad %zu: refused at %ld of %zu bytes", i, at, strlen(bad[i]));
    }
    /* a key twice */
    snprintf(buf, sizeof buf, "%scity\" string=\"true\">A%s%sc", P, E, P);
    EXPECT_MSG(run(g, 0, buf) == (long)strlen(buf) - 1, "twice: %ld", run(g, 0, buf));
    /* after the invoke of a named call only the block's end */
    snprintf(buf, sizeof buf, "%scity\" string=\"true\">A%s%sdays\" string=\"false\">1%s%sunit\" string=\"true\">celsius%s"
                              "</" D "invoke>\n<\xEF", P, E, P, E, P, E);
    EXPECT_MSG(run(g, 0, buf) == (long)strlen(buf) - 1, "second invoke: %ld", run(g, 0, buf));
    /* a name that is not a tool */
    EXPECT(run(g, -1, "get_wx") == 5);
    dsml_grammar_free(g);
}

/* The DSML marker is structure only in tags: the sampler refuses the
 * marker token where it would be text (a name, a value). */
static void test_marker_positions(void)
{
    dsml_grammar *g = grammar();
    REQUIRE(g);
    struct { const char *fed; bool text; } at[] = {
        {"", false},
        {"<", false},
        {"<" D "parameter name=\"", true},
        {"<" D "parameter name=\"city\" string=\"true\">a", true},
        {"<" D "parameter name=\"city\" string=\"true\">a</", false},
    };
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        dg_state *s = dg_state_new(g, 0);
        REQUIRE(s);
        EXPECT_MSG(dg_feed(s, at[i].fed, strlen(at[i].fed)) == 0, "case %zu refused", i);
        EXPECT_MSG(dg_marker_is_text(s) == at[i].text, "case %zu", i);
        dg_state_free(s);
    }
    dg_state *s = dg_state_new(g, -1);
    EXPECT(s && dg_marker_is_text(s)); /* the model names the tool */
    dg_state_free(s);
    dsml_grammar_free(g);
}

static void test_schema_refused(void)
{
    char err[160];
    dg_tool t = {"f", "{\"type\":\"array\"}"};
    EXPECT(!dsml_grammar_new(&t, 1, err, sizeof err));
    EXPECT(strstr(err, "object"));
    dg_tool r = {"f", "{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#/x\"}}}"};
    EXPECT(!dsml_grammar_new(&r, 1, err, sizeof err));
    EXPECT(strstr(err, "$ref"));
}

/* ---- random walks -------------------------------------------------------------- */

static unsigned long long rng = 88172645463325252ull;
static unsigned rnd(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (unsigned)rng; }

static const char *const PIECES[] = {
    /* the ways out first: taken when a walk runs long */
    "</" D "parameter>", "\n</" D "tool_calls>", "</" D "invoke>", "\n</" D "invoke>", "\n", "\"", "]", "}", "0",
    "<" D "parameter name=\"", "\" string=\"true\">", "\" string=\"false\">", "\">\n", "\n<" D "invoke name=\"",
    "city", "days", "unit", "temp", "alert", "hours", "note", "get_weather", "ping", "celsius", "fahrenheit",
    "true", "false", "null", "[", ",", " ", "-", ".", "e", "1", "7", "a", "Z", "<", "/", "\\", "&", "\xC3\xA9",
    "</", "</" D, D,
};
#define N_PIECES (sizeof PIECES / sizeof PIECES[0])

static bool validates(json_t *a, char *why, size_t wl)
{
    if (!json_is_object(a)) { snprintf(why, wl, "not an object"); return false; }
    const char *k;
    json_t *v;
    json_object_foreach(a, k, v) {
        bool ok = !strcmp(k, "city") ? json_is_string(v) && json_string_length(v) <= 10
                : !strcmp(k, "days") ? json_is_integer(v)
                : !strcmp(k, "unit") ? json_is_string(v) && (!strcmp(json_string_value(v), "celsius") ||
                                                              !strcmp(json_string_value(v), "fahrenheit"))
                : !strcmp(k, "temp") ? json_is_number(v)
                : !strcmp(k, "alert") ? json_is_boolean(v)
                : !strcmp(k, "note") ? json_is_null(v) || (json_is_string(v) && json_string_length(v) <= 6)
                : !strcmp(k, "hours") ? json_is_array(v) && json_array_size(v) <= 3
                : false;
        if (!strcmp(k, "hours") && ok) {
            size_t i;
            json_t *x;
            json_array_foreach(v, i, x) ok = ok && json_is_integer(x);
        }
        if (!ok) { snprintf(why, wl, "key %s", k); return false; }
    }
    if (!json_object_get(a, "city") || !json_object_get(a, "days") || !json_object_get(a, "unit")) {
        snprintf(why, wl, "a required key is missing");
        return false;
    }
    return true;
}

/* cut: walks stop after this many pieces (-1: never) and the server's
 * shortest completion closes the block */
static void random_walks(int cut_every)
{
    dsml_grammar *g = grammar();
    REQUIRE(g);
    int closed = 0, weather = 0;
    for (int walk = 0; walk < 300; walk++) {
        int cut = cut_every > 0 ? walk % cut_every : -1;
        int named = walk % 2 ? 0 : -1;
        const char *open = named == 0 ? OPEN_NAMED : OPEN_ANY;
        dg_state *s = dg_state_new(g, named);
        REQUIRE(s);
        char text[8192];
        size_t n = (size_t)snprintf(text, sizeof text, "%s", open);
        for (int step = 0; step < 2000 && !dg_done(s); step++) {
            if (step == cut) {
                size_t cl = 0;
                ds4_spans tpl = {0};
                char *comp = dg_completion(s, &cl, &tpl);
                EXPECT_MSG(comp, "walk %d: no completion after %.*s", walk, (int)n, text);
                if (!comp) break;
                /* the structure ranges hold every DSML marker of it */
                for (const char *m = strstr(comp, D); m; m = strstr(m + 1, D)) {
                    size_t off = (size_t)(m - comp);
                    bool in = false;
                    for (size_t k = 0; k < tpl.n; k++)
                        in |= tpl.v[k].off <= off && off + strlen(D) <= tpl.v[k].off + tpl.v[k].len;
                    EXPECT_MSG(in, "walk %d: a marker of the completion outside the spans", walk);
                }
                ds4_spans_free(&tpl);
                EXPECT_MSG(dg_feed(s, comp, cl) == 0 && dg_done(s), "walk %d: completion %s refused", walk, comp);
                REQUIRE(n + cl < sizeof text);
                memcpy(text + n, comp, cl);
                n += cl;
                free(comp);
                break;
            }
            const char *ok[N_PIECES];
            size_t nok = 0;
            for (size_t i = 0; i < N_PIECES; i++)
                if (dg_accepts(s, PIECES[i], strlen(PIECES[i]))) ok[nok++] = PIECES[i];
            static char bytes[256][2];
            for (int b = 1; b < 256 && !nok; b++) {
                /* no piece fits: some byte must (the grammar has no dead end) */
                bytes[b][0] = (char)b;
                if (dg_accepts(s, bytes[b], 1)) ok[nok++] = bytes[b];
            }
            EXPECT_MSG(nok > 0, "dead end after %.*s", (int)n, text);
            if (!nok) { dg_state_free(s); dsml_grammar_free(g); return; }
            const char *p = step > 60 + walk % 40 ? ok[0] : ok[rnd() % nok];
            size_t pl = strlen(p);
            REQUIRE(n + pl < sizeof text);
            REQUIRE(dg_feed(s, p, pl) == 0);
            memcpy(text + n, p, pl);
            n += pl;
        }
        bool done = dg_done(s);
        dg_state_free(s);
        EXPECT_MSG(done, "walk %d did not close: %.*s", walk, (int)n, text);
        if (!done) continue;
        closed++;
        ds4_gen_state st;
        char *err = NULL;
        json_t *m = ds4_dsml_parse_message(text, n, false, true, &st, &err);
        REQUIRE(m);
        json_t *calls = json_object_get(m, "tool_calls");
        EXPECT_MSG(st == DS4_GEN_TOOLS_DONE && json_array_size(calls) >= 1, "walk %d: parser state %d (%s): %.*s", walk,
                   (int)st, err, (int)n, text);
        size_t i;
        json_t *c;
        json_array_foreach(calls, i, c) {
            json_t *fn = json_object_get(c, "function");
            const char *name = json_string_value(json_object_get(fn, "name"));
            json_t *a = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, NULL);
            char why[64] = "";
            if (name && !strcmp(name, "ping")) EXPECT_MSG(json_is_object(a) && json_object_size(a) == 0, "ping args");
            else {
                weather++;
                EXPECT_MSG(a && validates(a, why, sizeof why), "walk %d: %s: %s", walk, why,
                           json_string_value(json_object_get(fn, "arguments")));
            }
            json_decref(a);
        }
        if (named == 0) EXPECT_MSG(json_array_size(calls) == 1, "named: one call");
        json_decref(m);
        free(err);
    }
    EXPECT(closed == 300);
    EXPECT(weather > 100);
    dsml_grammar_free(g);
}

static void test_random_walks_validate(void) { random_walks(-1); }
static void test_cut_walks_completed_validate(void) { random_walks(40); }

int main(void)
{
    RUN(test_canonical_calls_accepted);
    RUN(test_invalid_calls_refused);
    RUN(test_marker_positions);
    RUN(test_schema_refused);
    RUN(test_random_walks_validate);
    RUN(test_cut_walks_completed_validate);
    return test_finish();
}

/*
 * test_dsml.c - DSML tool calls: parsing generated text (whole and piece
 * by piece), streaming events, tolerance, and render/parse round trips.
 *
 * Expected values come from outside the parser: the model output of the
 * chat-format spec's worked example (ex3_tools_completion, parsed result
 * stated in dsv4-chat-format.md §5.3), DeepSeek's gold test 1 (its first
 * assistant turn parses to get_weather {"location": "Beijing", "unit":
 * "celsius"} per the test README), and the canonical renderer's text.
 */
#include "tests/test.h"

#include "include/ds4_chat.h"
#include "include/ds4_dsml.h"
#include "text/strbuf.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* ---- event recorder ---------------------------------------------------- */

typedef struct {
    ds4_strbuf reasoning, content, args[8], names[8], errors;
    int begins, ends;
    int order_ok; /* BEGIN before NAME before ARGS before END */
    int last_kind[8];
} recorder;

static void on_event(void *u, const ds4_gen_event *ev)
{
    recorder *r = u;
    int i = ev->index >= 0 && ev->index < 8 ? ev->index : 7;
    switch (ev->kind) {
    case DS4_GEN_REASONING: ds4_sb_append(&r->reasoning, ev->text, ev->len); break;
    case DS4_GEN_CONTENT: ds4_sb_append(&r->content, ev->text, ev->len); break;
    case DS4_GEN_CALL_BEGIN:
        r->begins++;
        if (r->last_kind[i] != 0) r->order_ok = 0;
        r->last_kind[i] = 1;
        break;
    case DS4_GEN_CALL_NAME:
        ds4_sb_append(&r->names[i], ev->text, ev->len);
        if (r->last_kind[i] != 1) r->order_ok = 0;
        r->last_kind[i] = 2;
        break;
    case DS4_GEN_CALL_ARGS:
        ds4_sb_append(&r->args[i], ev->text, ev->len);
        if (r->last_kind[i] < 2) r->order_ok = 0;
        r->last_kind[i] = 3;
        break;
    case DS4_GEN_CALL_END:
        r->ends++;
        if (r->last_kind[i] != 3) r->order_ok = 0;
        r->last_kind[i] = 4;
        break;
    case DS4_GEN_ERROR: ds4_sb_append(&r->errors, ev->text, ev->len); break;
    }
}

static void recorder_free(recorder *r)
{
    ds4_sb_free(&r->reasoning);
    ds4_sb_free(&r->content);
    ds4_sb_free(&r->errors);
    for (int i = 0; i < 8; i++) {
        ds4_sb_free(&r->args[i]);
        ds4_sb_free(&r->names[i]);
    }
}

static const char *sbs(const ds4_strbuf *b) { return b->p ? b->p : ""; }

/* Parse text fed in chunks of `chunk` bytes (0 = all at once). */
static json_t *parse_chunked(const char *text, size_t len, bool thinking, bool tools, size_t chunk, recorder *r,
                             ds4_gen_state *state)
{
    memset(r, 0, sizeof *r);
    r->order_ok = 1;
    ds4_gen_parser *p = ds4_gen_parser_new(thinking, tools, on_event, r);
    if (!p) return NULL;
    for (size_t i = 0; i < len;) {
        size_t k = chunk && len - i > chunk ? chunk : len - i;
        if (ds4_gen_parser_feed(p, text + i, k) != DS4_OK) break;
        i += k;
    }
    ds4_gen_parser_finish(p);
    *state = ds4_gen_parser_state(p);
    json_t *m = ds4_gen_parser_message(p, NULL);
    ds4_gen_parser_free(p);
    return m;
}

static const char *call_name(const json_t *m, size_t i)
{
    return json_string_value(json_object_get(json_object_get(json_array_get(json_object_get(m, "tool_calls"), i), "function"), "name"));
}

static const char *call_args(const json_t *m, size_t i)
{
    return json_string_value(json_object_get(json_object_get(json_array_get(json_object_get(m, "tool_calls"), i), "function"), "arguments"));
}

/* The spec's worked example output (without its final EOS). */
static char *ex3_completion(size_t *len)
{
    FILE *f = fopen(test_data("tokenizer/dsv4-rendered-prompts-tokens.jsonl"), "r");
    if (!f) return NULL;
    char *line = NULL, *text = NULL;
    size_t cap = 0;
    while (!text && getline(&line, &cap, f) > 0) {
        json_t *c = json_loads(line, 0, NULL);
        if (c && !strcmp(json_string_value(json_object_get(c, "name")), "ex3_tools_completion")) {
            const char *t = json_string_value(json_object_get(c, "text"));
            const char *eos = strstr(t, DS4_TEXT_EOS);
            *len = eos ? (size_t)(eos - t) : strlen(t);
            text = strndup(t, *len);
        }
        json_decref(c);
    }
    free(line);
    fclose(f);
    return text;
}

static void test_parse_spec_example_any_chunking(void)
{
    size_t len;
    char *text = ex3_completion(&len);
    REQUIRE(text);
    static const size_t chunks[] = {0, 1, 2, 3, 5, 7, 13, 64};
    for (size_t c = 0; c < sizeof chunks / sizeof *chunks; c++) {
        recorder r;
        ds4_gen_state st;
        json_t *m = parse_chunked(text, len, true, true, chunks[c], &r, &st);
        REQUIRE(m);
        EXPECT_MSG(st == DS4_GEN_TOOLS_DONE, "chunk %zu: state %d", chunks[c], st);
        EXPECT(!strcmp(json_string_value(json_object_get(m, "reasoning_content")),
                       "The user wants two things; I will call both tools."));
        EXPECT(!strcmp(json_string_value(json_object_get(m, "content")), ""));
        EXPECT(json_array_size(json_object_get(m, "tool_calls")) == 2);
        EXPECT(call_name(m, 0) && !strcmp(call_name(m, 0), "get_weather"));
        EXPECT(call_args(m, 0) && !strcmp(call_args(m, 0), "{\"city\": \"Rome\", \"days\": 2}"));
        EXPECT(call_name(m, 1) && !strcmp(call_name(m, 1), "read_file"));
        EXPECT(call_args(m, 1) && !strcmp(call_args(m, 1), "{\"path\": \"/etc/motd\"}"));
        /* streamed deltas add up to exactly the final values */
        EXPECT(!strcmp(sbs(&r.reasoning), "The user wants two things; I will call both tools."));
        EXPECT(r.content.n == 0);
        EXPECT(r.begins == 2 && r.ends == 2 && r.order_ok);
        EXPECT(!strcmp(sbs(&r.names[0]), "get_weather") && !strcmp(sbs(&r.names[1]), "read_file"));
        EXPECT_MSG(!strcmp(sbs(&r.args[0]), call_args(m, 0)), "chunk %zu: streamed args %s", chunks[c], sbs(&r.args[0]));
        EXPECT(!strcmp(sbs(&r.args[1]), call_args(m, 1)));
        recorder_free(&r);
        json_decref(m);
    }
    free(text);
}

/* Gold test 1: parse its first assistant turn, then render the parsed
 * calls back: the bytes must equal the gold text (canonical form). */
static void test_gold_round_trip(void)
{
    size_t len;
    char *gold = test_read_file(test_data("dsv4-encoding-tests/test_output_1.txt"), &len);
    REQUIRE(gold);
    const char *start = strstr(gold, DS4_TEXT_ASSISTANT DS4_TEXT_THINK);
    REQUIRE(start);
    start += strlen(DS4_TEXT_ASSISTANT DS4_TEXT_THINK);
    const char *end = strstr(start, DS4_TEXT_EOS);
    REQUIRE(end);
    ds4_gen_state st;
    char *err = NULL;
    json_t *m = ds4_dsml_parse_message(start, (size_t)(end - start), true, true, &st, &err);
    REQUIRE(m);
    EXPECT(st == DS4_GEN_TOOLS_DONE && err && !*err);
    EXPECT(!strcmp(json_string_value(json_object_get(m, "content")), ""));
    EXPECT(call_name(m, 0) && !strcmp(call_name(m, 0), "get_weather"));
    EXPECT(call_args(m, 0) && !strcmp(call_args(m, 0), "{\"location\": \"Beijing\", \"unit\": \"celsius\"}"));
    char *dsml;
    size_t dlen;
    REQUIRE(ds4_dsml_render_calls(json_object_get(m, "tool_calls"), &dsml, &dlen) == DS4_OK);
    const char *block = strstr(start, "<" DS4_TEXT_DSML "tool_calls>");
    REQUIRE(block);
    EXPECT(dlen == (size_t)(end - block) && !memcmp(dsml, block, dlen));
    free(dsml);
    free(err);
    json_decref(m);
    free(gold);
}

/* JSON tool calls -> DSML -> parse -> the same arguments (as JSON values),
 * for strings with markup and newlines, numbers, nested values, unicode,
 * a call without arguments, and arguments that are not JSON. */
static void test_render_parse_round_trip(void)
{
    const char *calls_json =
        "[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"write\",\"arguments\":"
        "\"{\\\"path\\\": \\\"a<b>&c.txt\\\", \\\"body\\\": \\\"line1\\\\nline2 \\\\\\\"q\\\\\\\" é 🙂\\\", "
        "\\\"n\\\": -1.5e-07, \\\"list\\\": [1, {\\\"x\\\": null}], \\\"ok\\\": true}\"}},"
        "{\"function\":{\"name\":\"ping\",\"arguments\":\"{}\"}},"
        "{\"function\":{\"name\":\"raw\",\"arguments\":\"not json\"}},"
        "{\"function\":{\"name\":\"obj\",\"arguments\":{\"k\":[true,false]}}}]";
    json_t *calls = json_loads(calls_json, 0, NULL);
    REQUIRE(calls);
    char *dsml;
    size_t dlen;
    REQUIRE(ds4_dsml_render_calls(calls, &dsml, &dlen) == DS4_OK);
    /* zero-argument call has the blank line the official encoder writes */
    EXPECT(strstr(dsml, "<" DS4_TEXT_DSML "invoke name=\"ping\">\n\n</" DS4_TEXT_DSML "invoke>"));
    /* non-string values are Python json.dumps text */
    EXPECT(strstr(dsml, "string=\"false\">[1, {\"x\": null}]</"));
    EXPECT(strstr(dsml, "string=\"false\">-1.5e-07</"));
    ds4_strbuf text = {0};
    ds4_sb_puts(&text, "Sure.\n\n");
    ds4_sb_append(&text, dsml, dlen);
    for (size_t chunk = 0; chunk < 4; chunk++) {
        recorder r;
        ds4_gen_state st;
        json_t *m = parse_chunked(text.p, text.n, false, true, chunk, &r, &st);
        REQUIRE(m);
        EXPECT(st == DS4_GEN_TOOLS_DONE);
        EXPECT(!strcmp(json_string_value(json_object_get(m, "content")), "Sure."));
        EXPECT(!strcmp(sbs(&r.content), "Sure."));
        json_t *got = json_object_get(m, "tool_calls");
        REQUIRE(json_array_size(got) == 4);
        for (size_t i = 0; i < 4; i++) {
            json_t *want_fn = json_object_get(json_array_get(calls, i), "function");
            EXPECT(!strcmp(call_name(m, i), json_string_value(json_object_get(want_fn, "name"))));
            json_t *wa = json_object_get(want_fn, "arguments");
            json_t *want_args = json_is_string(wa) ? json_loads(json_string_value(wa), 0, NULL) : json_incref(wa);
            if (!want_args) want_args = json_pack("{s:s}", "arguments", json_string_value(wa));
            json_t *got_args = json_loads(call_args(m, i), 0, NULL);
            EXPECT_MSG(got_args && json_equal(got_args, want_args), "call %zu: %s", i, call_args(m, i));
            EXPECT(!strcmp(sbs(&r.args[i]), call_args(m, i)));
            json_decref(want_args);
            json_decref(got_args);
        }
        /* and rendering the parsed calls reproduces the DSML exactly */
        char *again;
        size_t alen;
        REQUIRE(ds4_dsml_render_calls(got, &again, &alen) == DS4_OK);
        EXPECT(alen == dlen && !memcmp(again, dsml, dlen));
        free(again);
        recorder_free(&r);
        json_decref(m);
    }
    ds4_sb_free(&text);
    free(dsml);
    json_decref(calls);
}

/* Nothing is streamed that a later byte could retract. */
static void test_holds_back_partial_markers(void)
{
    recorder r = {0};
    r.order_ok = 1;
    ds4_gen_parser *p = ds4_gen_parser_new(true, true, on_event, &r);
    REQUIRE(p);
    ds4_gen_parser_feed(p, "<think>plan</th", 15);
    EXPECT(!strcmp(sbs(&r.reasoning), "plan"));
    ds4_gen_parser_feed(p, "ink>Ok \xc3", 8);
    EXPECT(!strcmp(sbs(&r.reasoning), "plan"));
    EXPECT(!strcmp(sbs(&r.content), "Ok ")); /* the half 'é' is held */
    ds4_gen_parser_feed(p, "\xa9\n\n<\xEF\xBD\x9C" "DS", 9);
    EXPECT(!strcmp(sbs(&r.content), "Ok \xc3\xa9")); /* the blank line and partial marker are held */
    const char tail[] = "ML\xEF\xBD\x9Ctool_calls>\n<\xEF\xBD\x9C" "DSML\xEF\xBD\x9Cinvoke name=\"f\">\n"
                        "<\xEF\xBD\x9C" "DSML\xEF\xBD\x9Cparameter name=\"s\" string=\"true\">a</\xEF\xBD\x9C" "DSML";
    ds4_gen_parser_feed(p, tail, sizeof tail - 1);
    EXPECT(!strcmp(sbs(&r.content), "Ok \xc3\xa9"));
    EXPECT(r.begins == 1 && !strcmp(sbs(&r.names[0]), "f"));
    EXPECT(!strcmp(sbs(&r.args[0]), "{\"s\": \"a")); /* partial closing tag held */
    EXPECT(ds4_gen_parser_state(p) == DS4_GEN_IN_TOOLS);
    const char end[] = "\xEF\xBD\x9Cparameter>\n</\xEF\xBD\x9C" "DSML\xEF\xBD\x9Cinvoke>\n</\xEF\xBD\x9C"
                       "DSML\xEF\xBD\x9Ctool_calls>trailing ignored";
    ds4_gen_parser_feed(p, end, sizeof end - 1);
    EXPECT(ds4_gen_parser_state(p) == DS4_GEN_TOOLS_DONE);
    EXPECT(!strcmp(sbs(&r.args[0]), "{\"s\": \"a\"}") && r.ends == 1);
    ds4_gen_parser_finish(p);
    size_t rl;
    const char *raw = ds4_gen_parser_raw_dsml(p, &rl);
    EXPECT(raw && rl > 2 && raw[0] == '\n' && raw[1] == '\n' && !memcmp(raw + rl - 5, "alls>", 5));
    json_t *m = ds4_gen_parser_message(p, NULL);
    EXPECT(!strcmp(json_string_value(json_object_get(m, "content")), "Ok \xc3\xa9"));
    json_decref(m);
    ds4_gen_parser_free(p);
    recorder_free(&r);
}

static void test_malformed_and_unclosed(void)
{
    const char *D = DS4_TEXT_DSML;
    char buf[1024];
    /* malformed: unknown tag inside the block -> no calls, text kept as content */
    snprintf(buf, sizeof buf, "Hi\n\n<%stool_calls>\n<%sinvoke name=\"a\">\n<%sbogus>x", D, D, D);
    recorder r;
    ds4_gen_state st;
    json_t *m = parse_chunked(buf, strlen(buf), false, true, 1, &r, &st);
    REQUIRE(m);
    EXPECT(st == DS4_GEN_MALFORMED);
    EXPECT(!json_object_get(m, "tool_calls"));
    EXPECT(!strcmp(json_string_value(json_object_get(m, "content")), buf)); /* nothing lost */
    EXPECT(!strcmp(sbs(&r.content), buf));
    EXPECT(strstr(sbs(&r.errors), "malformed"));
    recorder_free(&r);
    json_decref(m);

    /* unclosed: generation cut inside the second call -> the first is kept */
    snprintf(buf, sizeof buf,
             "\n\n<%stool_calls>\n<%sinvoke name=\"a\">\n<%sparameter name=\"n\" string=\"false\"> 7 </%sparameter>\n"
             "<%sparameter name=\"e\" string=\"false\"></%sparameter>\n</%sinvoke>\n<%sinvoke name=\"b\">\n<%sparam",
             D, D, D, D, D, D, D, D, D);
    m = parse_chunked(buf, strlen(buf), false, true, 3, &r, &st);
    REQUIRE(m);
    EXPECT(st == DS4_GEN_IN_TOOLS);
    EXPECT(json_array_size(json_object_get(m, "tool_calls")) == 1);
    EXPECT(call_args(m, 0) && !strcmp(call_args(m, 0), "{\"n\": 7, \"e\": null}"));
    EXPECT(r.begins == 2 && r.ends == 1);
    recorder_free(&r);
    json_decref(m);

    /* tools off: the same text is all content */
    m = parse_chunked(buf, strlen(buf), false, false, 0, &r, &st);
    EXPECT(st == DS4_GEN_OPEN && !strcmp(json_string_value(json_object_get(m, "content")), buf));
    recorder_free(&r);
    json_decref(m);

    /* thinking, never closed: everything is reasoning; DSML inside
     * reasoning is not a call */
    snprintf(buf, sizeof buf, "<think>maybe <%stool_calls>\n</%stool_calls> later", D, D);
    m = parse_chunked(buf, strlen(buf), true, true, 2, &r, &st);
    EXPECT(st == DS4_GEN_OPEN && !json_object_get(m, "tool_calls"));
    EXPECT(!strcmp(json_string_value(json_object_get(m, "reasoning_content")), buf + 7));
    recorder_free(&r);
    json_decref(m);

    /* a parameter without string="..." is a string; invalid UTF-8 is replaced */
    snprintf(buf, sizeof buf, "<%stool_calls><%sinvoke name=\"f\"><%sparameter name=\"p\">x\xff</%sparameter></%sinvoke></%stool_calls>",
             D, D, D, D, D, D);
    m = parse_chunked(buf, strlen(buf), false, true, 0, &r, &st);
    EXPECT(st == DS4_GEN_TOOLS_DONE);
    EXPECT(call_args(m, 0) && !strcmp(call_args(m, 0), "{\"p\": \"x\xef\xbf\xbd\"}"));
    recorder_free(&r);
    json_decref(m);
}

/* Random byte soup never crashes and always yields valid JSON strings. */
static void test_garbage_is_safe(void)
{
    static const char *const atoms[] = {"<", ">", "\n", "\n\n", "\"", "=", " name=\"x\"", " string=\"false\"",
                                        "<\xEF\xBD\x9C" "DSML\xEF\xBD\x9Ctool_calls>", "<\xEF\xBD\x9C" "DSML\xEF\xBD\x9Cinvoke",
                                        "<\xEF\xBD\x9C" "DSML\xEF\xBD\x9Cparameter", "</\xEF\xBD\x9C" "DSML\xEF\xBD\x9Cparameter>",
                                        "</\xEF\xBD\x9C" "DSML\xEF\xBD\x9Cinvoke>", "</think>", "<think>", "\xff", "\xc3", "é", "a"};
    unsigned seed = 12345;
    for (int iter = 0; iter < 300; iter++) {
        ds4_strbuf t = {0};
        int n = 1 + (int)((seed = seed * 1103515245u + 12345u) >> 16) % 40;
        for (int k = 0; k < n; k++) ds4_sb_puts(&t, atoms[((seed = seed * 1103515245u + 12345u) >> 16) % 19]);
        recorder r;
        ds4_gen_state st;
        json_t *m = parse_chunked(t.p, t.n, iter & 1, true, (size_t)(iter % 5), &r, &st);
        EXPECT(m && json_is_string(json_object_get(m, "content")));
        char *s = json_dumps(m, 0);
        EXPECT(s != NULL);
        free(s);
        json_decref(m);
        recorder_free(&r);
        ds4_sb_free(&t);
    }
}

int main(void)
{
    RUN(test_parse_spec_example_any_chunking);
    RUN(test_gold_round_trip);
    RUN(test_render_parse_round_trip);
    RUN(test_holds_back_partial_markers);
    RUN(test_malformed_and_unclosed);
    RUN(test_garbage_is_safe);
    return test_finish();
}

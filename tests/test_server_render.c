/*
 * test_server_render.c - the server's prompt renderer against DeepSeek's gold
 * encodings (tests/data/dsv4-encoding-tests: the official encoder's test
 * pairs and the byte-exact examples of dsv4-chat-format.md §5).
 *
 * Each case goes through the real request path: its messages are wrapped in
 * an OpenAI chat request body, parsed by api_request_parse and rendered by
 * prompt_render; the result must equal the expected bytes exactly.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "server/api_request.h"
#include "server/prompt_render.h"
#include "server/tool_memory.h"
#include "tests/test.h"

/* messages (tools possibly attached to a message) -> chat request body */
static char *chat_body(json_t *messages, json_t *top_tools, const char *effort)
{
    json_t *req = json_object();
    json_t *msgs = json_array();
    json_t *tools = top_tools ? json_incref(top_tools) : NULL;
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        json_t *copy = json_deep_copy(m);
        json_t *t = json_object_get(copy, "tools");
        if (t) {
            if (!tools) tools = json_incref(t);
            json_object_del(copy, "tools");
        }
        json_array_append_new(msgs, copy);
    }
    json_object_set_new(req, "messages", msgs);
    if (tools) json_object_set_new(req, "tools", tools);
    if (effort) json_object_set_new(req, "reasoning_effort", json_string(effort));
    char *s = json_dumps(req, 0);
    json_decref(req);
    return s;
}

static char *render_body(const char *body, bool thinking, bool think_max, char *why, size_t why_n)
{
    api_request r;
    api_error err;
    if (api_request_parse(API_CHAT, body, strlen(body), &r, &err) != 0) {
        snprintf(why, why_n, "parse: %s (%s)", err.message, err.param);
        return NULL;
    }
    render_opts o = {thinking, think_max, true, NULL};
    char *p = prompt_render(&r, &o, NULL, NULL);
    api_request_free(&r);
    return p;
}

static void first_diff(const char *a, const char *b)
{
    size_t i = 0;
    while (a[i] && a[i] == b[i]) i++;
    printf("    first difference at byte %zu:\n    got:      %.80s\n    expected: %.80s\n", i, a + i, b + i);
}

static void test_doc_examples(void)
{
    size_t len;
    char *data = test_read_file(test_data("dsv4-encoding-tests/doc-examples.jsonl"), &len);
    REQUIRE(data);
    int cases = 0;
    for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *e = json_loads(line, 0, NULL);
        REQUIRE(e);
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *mode = json_string_value(json_object_get(e, "thinking_mode"));
        const char *effort = json_string_value(json_object_get(e, "reasoning_effort"));
        const char *expected = json_string_value(json_object_get(e, "expected"));
        char *body = chat_body(json_object_get(e, "messages"), NULL, effort);
        char why[512] = "";
        bool thinking = !strcmp(mode, "thinking");
        char *got = render_body(body, thinking, effort && !strcmp(effort, "max"), why, sizeof why);
        EXPECT_MSG(got, "%s: %s", name, why);
        if (got) {
            EXPECT_MSG(!strcmp(got, expected), "%s: rendering differs", name);
            if (strcmp(got, expected)) first_diff(got, expected);
        }
        cases++;
        free(got);
        free(body);
        json_decref(e);
    }
    EXPECT(cases >= 8);
    free(data);
}

static void gold_case(int n, bool thinking)
{
    char in[96], out[96];
    snprintf(in, sizeof in, "dsv4-encoding-tests/test_input_%d.json", n);
    snprintf(out, sizeof out, "dsv4-encoding-tests/test_output_%d.txt", n);
    json_t *root = json_load_file(test_data(in), 0, NULL);
    REQUIRE(root);
    size_t len;
    char *expected = test_read_file(test_data(out), &len);
    REQUIRE(expected);
    json_t *msgs = json_is_array(root) ? root : json_object_get(root, "messages");
    char *body = chat_body(msgs, json_is_object(root) ? json_object_get(root, "tools") : NULL, NULL);
    char why[512] = "";
    char *got = render_body(body, thinking, false, why, sizeof why);
    EXPECT_MSG(got, "gold %d: %s", n, why);
    if (got) {
        EXPECT_MSG(!strcmp(got, expected), "gold %d: rendering differs", n);
        if (strcmp(got, expected)) first_diff(got, expected);
    }
    free(got);
    free(body);
    free(expected);
    json_decref(root);
}

/* Official gold 1: system + tools, a DSML call, a tool result, an answer. */
static void test_gold_1_tools(void) { gold_case(1, true); }
/* Official gold 2: multi-turn thinking; earlier reasoning dropped. */
static void test_gold_2_multiturn(void) { gold_case(2, true); }

/* Exact replay: a turn whose call ids map to a stored block renders those
 * bytes instead of the canonical form. */
static void test_exact_replay(void)
{
    const char *body =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
        "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"call_x\",\"type\":\"function\","
        "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": 1}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_x\",\"content\":\"r\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}";
    api_request r;
    api_error err;
    REQUIRE(api_request_parse(API_CHAT, body, strlen(body), &r, &err) == 0);
    tool_memory *m = tool_memory_new(8);
    const char *sampled = "\n\n<" DS4_DSML "tool_calls>\n<" DS4_DSML "invoke name=\"f\">\n<" DS4_DSML
                          "parameter name=\"a\" string=\"false\">1 </" DS4_DSML "parameter>\n</" DS4_DSML
                          "invoke>\n</" DS4_DSML "tool_calls>";
    const char *id = "call_x";
    tool_memory_put(m, &id, 1, sampled, strlen(sampled));
    render_opts o = {false, false, true, m};
    int replayed = 0;
    char *p = prompt_render(&r, &o, NULL, &replayed);
    REQUIRE(p);
    EXPECT(replayed == 1);
    EXPECT(strstr(p, "string=\"false\">1 </") != NULL); /* the sampled space survives */
    free(p);
    o.memory = NULL;
    p = prompt_render(&r, &o, NULL, &replayed);
    EXPECT(replayed == 0);
    EXPECT(strstr(p, "string=\"false\">1</") != NULL);
    free(p);
    tool_memory_free(m);
    api_request_free(&r);
}

/* tool_choice forces the start (and for a named function the end) of a
 * tool-call block: those bytes must be the official encoder's, so a forced
 * turn renders back byte for byte. Checked against DeepSeek's gold 1, whose
 * assistant turn calls get_weather. */
static void test_forced_call_text(void)
{
    size_t len;
    char *gold = test_read_file(test_data("dsv4-encoding-tests/test_output_1.txt"), &len);
    REQUIRE(gold);
    char *named = prompt_render_call_opening("get_weather");
    char *any = prompt_render_call_opening(NULL);
    char *close = prompt_render_calls_close();
    REQUIRE(named && any && close);
    EXPECT(!strcmp(named, "\n\n<" DS4_DSML "tool_calls>\n<" DS4_DSML "invoke name=\"get_weather\">\n"));
    EXPECT(!strcmp(any, "\n\n<" DS4_DSML "tool_calls>\n<" DS4_DSML "invoke name=\""));
    EXPECT(!strcmp(close, "\n</" DS4_DSML "tool_calls>"));
    char want[512];
    snprintf(want, sizeof want, "%s%s", DS4_ENDTHINK, named);
    EXPECT_MSG(strstr(gold, want), "gold 1 has no '</think>' + forced opening");
    snprintf(want, sizeof want, "</%sinvoke>%s%s", DS4_DSML, close, DS4_EOS);
    EXPECT_MSG(strstr(gold, want), "gold 1's block does not end with the forced close");
    free(named);
    free(any);
    free(close);
    free(gold);
}

int main(void)
{
    RUN(test_doc_examples);
    RUN(test_gold_1_tools);
    RUN(test_gold_2_multiturn);
    RUN(test_exact_replay);
    RUN(test_forced_call_text);
    return test_finish();
}

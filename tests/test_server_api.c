/*
 * test_server_api.c - request parsing, the generated-text parser and the
 * SSE / response shapes of ds4-server, without HTTP or an engine.
 *
 * Expected values are the public API shapes (OpenAI, Anthropic) and the
 * DSML of dsv4-chat-format.md §5.3 (the worked two-call example).
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "server/api_request.h"
#include "server/api_response.h"
#include "server/output_parser.h"
#include "server/prompt_render.h"
#include "server/server_config.h"
#include "server/thinking_signature.h"
#include "server/tool_memory.h"
#include "tests/test.h"

static int parse(api_kind k, const char *body, api_request *r, api_error *e)
{
    return api_request_parse(k, body, strlen(body), r, e);
}

static void test_chat_fields(void)
{
    api_request r;
    api_error e;
    const char *body =
        "{\"model\":\"deepseek-chat\",\"messages\":[{\"role\":\"system\",\"content\":\"S\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]},"
        "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"R\",\"tool_calls\":[{\"id\":\"call_1\","
        "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"out\"}],"
        "\"max_completion_tokens\":77,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":40,\"min_p\":0.1,\"seed\":7,"
        "\"stop\":[\"END\",\"\"],\"stream\":true,\"stream_options\":{\"include_usage\":true},"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\",\"parameters\":"
        "{\"type\":\"object\",\"properties\":{}}}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}";
    REQUIRE(parse(API_CHAT, body, &r, &e) == 0);
    EXPECT(r.n_msgs == 4);
    EXPECT(r.msgs[0].role == ROLE_SYSTEM && !strcmp(r.msgs[0].content, "S"));
    EXPECT(!strcmp(r.msgs[1].content, "a\n\nb"));
    EXPECT(r.msgs[2].role == ROLE_ASSISTANT && !strcmp(r.msgs[2].content, "") && !strcmp(r.msgs[2].reasoning, "R"));
    EXPECT(r.msgs[2].n_calls == 1 && !strcmp(r.msgs[2].calls[0].id, "call_1") && !strcmp(r.msgs[2].calls[0].name, "f"));
    EXPECT(r.msgs[3].role == ROLE_TOOL && !strcmp(r.msgs[3].tool_call_id, "call_1"));
    EXPECT(r.max_tokens == 77 && r.temperature == 0.5 && r.top_p == 0.9 && r.top_k == 40 && r.min_p == 0.1);
    EXPECT(r.has_seed && r.seed == 7);
    EXPECT(r.n_stop == 1 && !strcmp(r.stop[0], "END"));
    EXPECT(r.stream && r.include_usage);
    EXPECT(r.thinking == 0); /* deepseek-chat alias */
    EXPECT(r.n_tools == 1);
    /* python json.dumps shape, keys in order: name, description, parameters */
    EXPECT(!strcmp(r.tools[0].schema_json,
                   "{\"name\": \"f\", \"description\": \"d\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}"));
    EXPECT(r.tool_choice == TOOL_CHOICE_NAMED && !strcmp(r.tool_choice_name, "f"));
    api_request_free(&r);
}

/* tool_choice in each API's spelling (OpenAI chat, Responses' flat
 * function, Anthropic any / tool) lands on the same two enforced modes. */
static void test_tool_choice_forms(void)
{
    const char *msgs = "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]";
    const char *ftool = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]";
    const char *atool = "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}]";
    struct { api_kind k; const char *tools, *choice; api_tool_choice want; } cases[] = {
        {API_CHAT, ftool, "\"required\"", TOOL_CHOICE_REQUIRED},
        {API_CHAT, ftool, "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}", TOOL_CHOICE_NAMED},
        {API_RESPONSES, "\"tools\":[{\"type\":\"function\",\"name\":\"f\"}]", "{\"type\":\"function\",\"name\":\"f\"}", TOOL_CHOICE_NAMED},
        {API_MESSAGES, atool, "{\"type\":\"any\"}", TOOL_CHOICE_REQUIRED},
        {API_MESSAGES, atool, "{\"type\":\"tool\",\"name\":\"f\"}", TOOL_CHOICE_NAMED},
        {API_MESSAGES, atool, "{\"type\":\"auto\"}", TOOL_CHOICE_AUTO},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[512];
        snprintf(body, sizeof body, "{%s%s,%s,\"tool_choice\":%s,\"max_tokens\":9}",
                 cases[i].k == API_RESPONSES ? "\"input\":\"x\"" : msgs, "", cases[i].tools, cases[i].choice);
        api_request r;
        api_error e;
        int rc = parse(cases[i].k, body, &r, &e);
        EXPECT_MSG(rc == 0, "case %zu: %s", i, e.message);
        if (rc) continue;
        EXPECT_MSG(r.tool_choice == cases[i].want, "case %zu: mode %d", i, (int)r.tool_choice);
        if (cases[i].want == TOOL_CHOICE_NAMED) EXPECT(r.tool_choice_name && !strcmp(r.tool_choice_name, "f"));
        api_request_free(&r);
    }
}

static void test_errors_name_the_field(void)
{
    struct { api_kind k; const char *body; const char *param; } cases[] = {
        {API_CHAT, "{", ""},
        {API_CHAT, "[]", ""},
        {API_CHAT, "{}", "messages"},
        {API_CHAT, "{\"messages\":\"hi\"}", "messages"},
        {API_CHAT, "{\"messages\":[]}", "messages"},
        {API_CHAT, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "messages[0]"},
        {API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages[0].content"},
        {API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":\"hot\"}", "temperature"},
        {API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":9}", "temperature"},
        {API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":-1}", "max_tokens"},
        {API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":\"yes\"}", "stream"},
        {API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":{}}", "tools"},
        {API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"sometimes\"}", "tool_choice"},
        {API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}}", "tool_choice"},
        {API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\"}", "tool_choice"},
        {API_MESSAGES, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":\"any\"}}", "tool_choice"},
        {API_MESSAGES, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":\"tool\",\"name\":\"f\"}}", "tool_choice"},
        {API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"reasoning_effort\":\"extreme\"}", "reasoning_effort"},
        {API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[1]}", "stop"},
        {API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"a\":1,\"a\":2}", ""},
        {API_COMPLETIONS, "{\"prompt\":3}", "prompt"},
        {API_RESPONSES, "{}", "input"},
        {API_RESPONSES, "{\"input\":[{\"type\":\"telepathy\"}]}", "input[0]"},
        {API_MESSAGES, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "max_tokens"},
        {API_MESSAGES, "{\"max_tokens\":5,\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "messages[0]"},
        {API_MESSAGES, "{\"max_tokens\":5,\"messages\":[{\"role\":\"system\",\"content\":5}]}", "messages[0].content"},
        {API_RESPONSES, "{\"input\":\"x\",\"tools\":[{\"type\":\"namespace\",\"tools\":[]}]}", "tools[0]"},
        {API_RESPONSES, "{\"input\":\"x\",\"tools\":[{\"type\":\"namespace\",\"name\":\"n\",\"tools\":[{\"type\":\"function\"}]}]}", "tools[0].tools[0]"},
        {API_MESSAGES, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\"}]}]}", "messages[0].content[0]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        api_request r;
        api_error e;
        int rc = parse(cases[i].k, cases[i].body, &r, &e);
        EXPECT_MSG(rc == -1, "case %zu accepted: %s", i, cases[i].body);
        if (rc == 0) { api_request_free(&r); continue; }
        EXPECT_MSG(e.status == 400, "case %zu status %d", i, e.status);
        EXPECT_MSG(!strcmp(e.param, cases[i].param), "case %zu: param '%s', expected '%s' (%s)", i, e.param,
                   cases[i].param, e.message);
        EXPECT_MSG(e.message[0], "case %zu: empty message", i);
    }
}

static void test_anthropic_blocks(void)
{
    api_request r;
    api_error e;
    const char *body =
        "{\"model\":\"claude\",\"max_tokens\":100,\"system\":[{\"type\":\"text\",\"text\":\"SYS\"}],"
        "\"thinking\":{\"type\":\"disabled\"},\"stop_sequences\":[\"X\"],"
        "\"tools\":[{\"name\":\"get_weather\",\"input_schema\":{\"type\":\"object\"}}],"
        "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"T\",\"signature\":\"\"},"
        "{\"type\":\"text\",\"text\":\"calling\"},{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get_weather\","
        "\"input\":{\"city\":\"Rome\"}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":"
        "[{\"type\":\"text\",\"text\":\"sunny\"}]},{\"type\":\"text\",\"text\":\"thanks\"}]}]}";
    REQUIRE(parse(API_MESSAGES, body, &r, &e) == 0);
    REQUIRE(r.n_msgs == 5);
    EXPECT(r.msgs[0].role == ROLE_SYSTEM && !strcmp(r.msgs[0].content, "SYS"));
    EXPECT(r.msgs[2].role == ROLE_ASSISTANT && !strcmp(r.msgs[2].reasoning, "T") && !strcmp(r.msgs[2].content, "calling"));
    EXPECT(r.msgs[2].n_calls == 1 && !strcmp(r.msgs[2].calls[0].arguments, "{\"city\":\"Rome\"}"));
    EXPECT(r.msgs[3].role == ROLE_TOOL && !strcmp(r.msgs[3].content, "sunny") && !strcmp(r.msgs[3].tool_call_id, "toolu_1"));
    EXPECT(r.msgs[4].role == ROLE_USER && !strcmp(r.msgs[4].content, "thanks"));
    EXPECT(r.thinking == 0 && r.max_tokens == 100 && r.n_stop == 1);
    EXPECT(r.n_tools == 1 && strstr(r.tools[0].schema_json, "\"parameters\": {\"type\": \"object\"}"));
    api_request_free(&r);
}

static void test_responses_items(void)
{
    api_request r;
    api_error e;
    const char *body =
        "{\"instructions\":\"I\",\"max_output_tokens\":9,\"reasoning\":{\"effort\":\"max\"},"
        "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":{}}],"
        "\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"q\"}]},"
        "{\"type\":\"function_call\",\"call_id\":\"call_9\",\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"call_9\",\"output\":\"res\"}]}";
    REQUIRE(parse(API_RESPONSES, body, &r, &e) == 0);
    REQUIRE(r.n_msgs == 4);
    EXPECT(r.msgs[0].role == ROLE_SYSTEM && !strcmp(r.msgs[0].content, "I"));
    EXPECT(r.msgs[1].role == ROLE_USER && !strcmp(r.msgs[1].content, "q"));
    EXPECT(r.msgs[2].role == ROLE_ASSISTANT && r.msgs[2].n_calls == 1 && !strcmp(r.msgs[2].calls[0].id, "call_9"));
    EXPECT(r.msgs[3].role == ROLE_TOOL && !strcmp(r.msgs[3].content, "res"));
    EXPECT(r.max_tokens == 9 && r.thinking == 1 && r.think_max);
    api_request_free(&r);
}

/* ---- output parser --------------------------------------------------------------- */

typedef struct { char log[8192]; size_t n; int starts, ends; } evlog;

static void collect(void *ud, const out_event *ev)
{
    evlog *l = ud;
    static const char tag[] = "RCSAE";
    if (ev->type == OUT_TOOL_START) l->starts++;
    if (ev->type == OUT_TOOL_END) l->ends++;
    l->n += (size_t)snprintf(l->log + l->n, sizeof l->log - l->n, "%c[%.*s]", tag[ev->type],
                             (int)ev->len, ev->text ? ev->text : (ev->name ? ev->name : ""));
    if (ev->type == OUT_TOOL_START)
        l->n += (size_t)snprintf(l->log + l->n, sizeof l->log - l->n, "%s", ev->name);
}

/* Feed s in pieces of `step` bytes (1 = the worst case for hold-backs). */
static out_parser *feed_all(const char *s, size_t step, bool thinking, bool tools, evlog *l, char **stops, size_t ns)
{
    out_parser *p = out_parser_new(thinking, tools, "call_", stops, ns, collect, l);
    size_t n = strlen(s);
    for (size_t i = 0; i < n && !out_parser_done(p); i += step)
        out_parser_feed(p, s + i, n - i < step ? n - i : step);
    out_parser_finish(p);
    return p;
}

/* The model output of dsv4-chat-format.md §5.3 (without the EOS). */
static const char OUT_53[] =
    "The user wants two things; I will call both tools.</think>\n\n<" DS4_DSML "tool_calls>\n<" DS4_DSML
    "invoke name=\"get_weather\">\n<" DS4_DSML "parameter name=\"city\" string=\"true\">Rome</" DS4_DSML
    "parameter>\n<" DS4_DSML "parameter name=\"days\" string=\"false\">2</" DS4_DSML "parameter>\n</" DS4_DSML
    "invoke>\n<" DS4_DSML "invoke name=\"read_file\">\n<" DS4_DSML "parameter name=\"path\" string=\"true\">/etc/motd</"
    DS4_DSML "parameter>\n</" DS4_DSML "invoke>\n</" DS4_DSML "tool_calls>";

static void test_parser_two_calls_any_split(void)
{
    for (size_t step = 1; step <= 7; step += 3) {
        evlog l = {0};
        out_parser *p = feed_all(OUT_53, step, true, true, &l, NULL, 0);
        EXPECT(out_parser_done(p));
        EXPECT(!strcmp(out_parser_reasoning(p), "The user wants two things; I will call both tools."));
        EXPECT(!strcmp(out_parser_content(p), ""));
        REQUIRE(out_parser_n_calls(p) == 2);
        EXPECT(!strcmp(out_parser_call(p, 0)->name, "get_weather"));
        EXPECT(!strcmp(out_parser_call(p, 0)->arguments, "{\"city\": \"Rome\", \"days\": 2}"));
        EXPECT(!strcmp(out_parser_call(p, 1)->arguments, "{\"path\": \"/etc/motd\"}"));
        EXPECT(!strncmp(out_parser_call(p, 0)->id, "call_", 5) && strlen(out_parser_call(p, 0)->id) == 37);
        EXPECT(strcmp(out_parser_call(p, 0)->id, out_parser_call(p, 1)->id));
        EXPECT(l.starts == 2 && l.ends == 2);
        /* the concatenated argument deltas are the JSON object */
        json_t *o = NULL;
        char args[256] = "";
        const char *s = l.log;
        int call = -1;
        while ((s = strchr(s, '[')) != NULL) {
            char tag = s[-1];
            const char *e = strchr(s, ']');
            if (tag == 'S') call++;
            if (tag == 'A' && call == 0) strncat(args, s + 1, (size_t)(e - s - 1));
            s = e;
        }
        o = json_loads(args, 0, NULL);
        EXPECT_MSG(o && json_integer_value(json_object_get(o, "days")) == 2, "streamed args: %s", args);
        json_decref(o);
        size_t rl;
        const char *raw = out_parser_raw_block(p, &rl);
        const char *m = strstr(OUT_53, "\n\n<");
        EXPECT(raw && rl == strlen(m) && !memcmp(raw, m, rl));
        out_parser_free(p);
    }
}

static void test_parser_content_and_holdback(void)
{
    evlog l = {0};
    /* "<" of a tag that turns out not to be DSML is released in the end */
    out_parser *p = feed_all("Use a<b and x</thinker> done.  ", 1, false, true, &l, NULL, 0);
    EXPECT(!strcmp(out_parser_content(p), "Use a<b and x</thinker> done.  "));
    EXPECT(out_parser_n_calls(p) == 0 && !out_parser_done(p));
    out_parser_free(p);
    /* multi-byte characters never split across content events */
    evlog l2 = {0};
    p = feed_all("caff\xc3\xa8 \xe2\x82\xac", 1, false, false, &l2, NULL, 0);
    EXPECT(!strcmp(out_parser_content(p), "caff\xc3\xa8 \xe2\x82\xac"));
    EXPECT(strstr(l2.log, "C[\xc3\xa8]") || strstr(l2.log, "\xc3\xa8"));
    EXPECT(!strstr(l2.log, "[\xc3]"));
    out_parser_free(p);
}

static void test_parser_stop_sequence(void)
{
    evlog l = {0};
    char *stops[] = {"STOP"};
    out_parser *p = feed_all("abc STOP def", 1, false, false, &l, stops, 1);
    EXPECT(out_parser_done(p) && out_parser_stopped_by_sequence(p));
    EXPECT(!strcmp(out_parser_content(p), "abc "));
    out_parser_free(p);
}

static void test_parser_reasoning_without_end(void)
{
    evlog l = {0};
    out_parser *p = feed_all("<think>still thinking </thi", 2, true, false, &l, NULL, 0);
    EXPECT(!strcmp(out_parser_reasoning(p), "still thinking </thi"));
    EXPECT(!strcmp(out_parser_content(p), ""));
    out_parser_free(p);
}

/* ---- response shapes --------------------------------------------------------------- */

typedef struct { char *s; size_t n; } cap_buf;

static void cap(void *ud, const char *s, size_t n)
{
    cap_buf *b = ud;
    b->s = realloc(b->s, b->n + n + 1);
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

typedef struct { resp_writer *w; } fwd;
static void to_writer(void *ud, const out_event *ev) { resp_writer_event(((fwd *)ud)->w, ev); }

static char *run_stream(api_kind k, bool stream, const char *gen, bool thinking, bool tools)
{
    cap_buf b = {0};
    resp_writer *w = resp_writer_new(k, stream, true, "m", cap, &b);
    usage_info u = {.prompt_tokens = 10, .cached_tokens = 4, .completion_tokens = 3, .cache = "token-prefix"};
    resp_writer_begin(w, &u);
    fwd f = {w};
    out_parser *p = out_parser_new(thinking, tools, k == API_MESSAGES ? "toolu_" : "call_", NULL, 0, to_writer, &f);
    out_parser_feed(p, gen, strlen(gen));
    out_parser_finish(p);
    resp_writer_end(w, p, out_parser_n_calls(p) ? FIN_TOOL_CALLS : FIN_STOP, &u);
    out_parser_free(p);
    resp_writer_free(w);
    return b.s;
}

/* every "data:" line of an SSE stream must be JSON (or [DONE]) */
static int sse_events(const char *s, const char *want_type, int *found)
{
    int n = 0;
    *found = 0;
    for (const char *l = strstr(s, "data: "); l; l = strstr(l + 1, "\ndata: ")) {
        if (*l == '\n') l++;
        l += 6;
        const char *e = strstr(l, "\n\n");
        if (!e) return -1;
        if (!strncmp(l, "[DONE]", 6)) { n++; continue; }
        json_t *j = json_loadb(l, (size_t)(e - l), 0, NULL);
        if (!j) return -1;
        const char *t = json_string_value(json_object_get(j, "type"));
        if (want_type && t && !strcmp(t, want_type)) (*found)++;
        json_decref(j);
        n++;
    }
    return n;
}

static void test_chat_stream_shape(void)
{
    char *s = run_stream(API_CHAT, true, OUT_53, true, true);
    int found;
    EXPECT(sse_events(s, NULL, &found) > 5);
    EXPECT(strstr(s, "\"delta\":{\"role\":\"assistant\",\"content\":\"\"}"));
    EXPECT(strstr(s, "\"reasoning_content\":\"The user wants two things; I will call both tools.\""));
    EXPECT(strstr(s, "\"tool_calls\":[{\"index\":0,\"id\":\"call_"));
    EXPECT(strstr(s, "\"function\":{\"name\":\"read_file\",\"arguments\":\"\"}"));
    EXPECT(strstr(s, "\"finish_reason\":\"tool_calls\""));
    EXPECT(strstr(s, "\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":3,\"total_tokens\":13,"
                     "\"prompt_tokens_details\":{\"cached_tokens\":4}"));
    EXPECT(strstr(s, "data: [DONE]\n\n"));
    free(s);
}

static void test_anthropic_stream_shape(void)
{
    char *s = run_stream(API_MESSAGES, true, OUT_53, true, true);
    int found;
    EXPECT(sse_events(s, "content_block_start", &found) > 5);
    EXPECT(found == 3); /* thinking + two tool_use blocks */
    EXPECT(!strncmp(s, "event: message_start\ndata: ", 27));
    EXPECT(strstr(s, "\"type\":\"thinking_delta\""));
    EXPECT(strstr(s, "\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_"));
    EXPECT(strstr(s, "\"type\":\"input_json_delta\""));
    EXPECT(strstr(s, "\"stop_reason\":\"tool_use\""));
    EXPECT(strstr(s, "event: message_stop\n"));
    free(s);
}

static void test_responses_stream_shape(void)
{
    char *s = run_stream(API_RESPONSES, true, "Thinking.</think>Answer text.", true, false);
    int found;
    EXPECT(sse_events(s, "response.output_text.delta", &found) > 5);
    EXPECT(found >= 1);
    EXPECT(!strncmp(s, "event: response.created\n", 24));
    EXPECT(strstr(s, "\"type\":\"response.output_text.done\""));
    EXPECT(strstr(s, "\"text\":\"Answer text.\""));
    EXPECT(strstr(s, "event: response.completed\n"));
    EXPECT(strstr(s, "\"sequence_number\":0"));
    free(s);
}

static void test_nonstream_bodies(void)
{
    char *s = run_stream(API_CHAT, false, OUT_53, true, true);
    json_t *j = json_loads(s, 0, NULL);
    REQUIRE(j);
    json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    EXPECT(json_array_size(json_object_get(msg, "tool_calls")) == 2);
    EXPECT(!strcmp(json_string_value(json_object_get(json_object_get(j, "ds4"), "cache")), "token-prefix"));
    json_decref(j);
    free(s);
    s = run_stream(API_MESSAGES, false, "Hi there.", false, false);
    j = json_loads(s, 0, NULL);
    REQUIRE(j);
    EXPECT(!strcmp(json_string_value(json_object_get(j, "stop_reason")), "end_turn"));
    EXPECT(json_integer_value(json_object_get(json_object_get(j, "usage"), "input_tokens")) == 6);
    EXPECT(json_integer_value(json_object_get(json_object_get(j, "usage"), "cache_read_input_tokens")) == 4);
    json_decref(j);
    free(s);
    char *eb = api_error_body(API_MESSAGES, 401, "no", NULL);
    EXPECT(!strcmp(eb, "{\"type\":\"error\",\"error\":{\"type\":\"authentication_error\",\"message\":\"no\"}}"));
    free(eb);
}

static void test_tool_memory_bounded(void)
{
    tool_memory *m = tool_memory_new(3);
    const char *ids[5] = {"a", "b", "c", "d", "e"};
    tool_memory_put(m, ids, 2, "AB", 2);      /* a, b share a block */
    tool_memory_put(m, ids + 2, 1, "C", 1);
    char *x = tool_memory_get_block(m, ids, 2);
    EXPECT(x && !strcmp(x, "AB"));
    free(x);
    EXPECT(tool_memory_get_block(m, ids + 1, 2) == NULL); /* b and c differ */
    tool_memory_put(m, ids + 3, 2, "DE", 2);  /* over the bound: oldest go */
    EXPECT(tool_memory_count(m) == 3);
    x = tool_memory_get_block(m, ids + 3, 2);
    EXPECT(x && !strcmp(x, "DE"));
    free(x);
    tool_memory_free(m);
    char id1[64], id2[64];
    EXPECT(tool_id_new("toolu_", id1, sizeof id1) == 0 && tool_id_new("toolu_", id2, sizeof id2) == 0);
    EXPECT(strlen(id1) == 38 && strcmp(id1, id2));
}

/* Each of the n values after flag is an error whose message names the flag
 * and the value. */
static void expect_flag_rejects(const char *flag, const char *const *bad, size_t n)
{
    server_config c;
    char err[256];
    for (size_t i = 0; i < n; i++) {
        char *argv[] = {"ds4-server", "--test-engine", (char *)flag, (char *)bad[i]};
        server_config_defaults(&c);
        EXPECT(server_config_parse(&c, 4, argv, err, sizeof err) == -1);
        EXPECT_MSG(strstr(err, flag) && strstr(err, bad[i]), "%s", err);
    }
}

/* -np / --parallel: default 1 (one slot, the old behaviour); bad values are
 * errors that name the flag. */
static void test_parallel_flag(void)
{
    server_config c;
    char err[256];
    char *base[] = {"ds4-server", "--test-engine"};
    server_config_defaults(&c);
    REQUIRE(server_config_parse(&c, 2, base, err, sizeof err) == 0);
    EXPECT(c.parallel == 1);
    char *np[] = {"ds4-server", "--test-engine", "-np", "4"};
    REQUIRE(server_config_parse(&c, 4, np, err, sizeof err) == 0);
    EXPECT(c.parallel == 4);
    char *longf[] = {"ds4-server", "--test-engine", "--parallel", "256"};
    REQUIRE(server_config_parse(&c, 4, longf, err, sizeof err) == 0);
    EXPECT(c.parallel == 256);
    const char *bad[] = {"0", "257", "x", "-1"};
    expect_flag_rejects("--parallel", bad, sizeof bad / sizeof *bad);
    /* --prefill-chunk: 0 (the backend's choice) unless given; 1..16384 */
    server_config_defaults(&c);
    EXPECT(c.prefill_chunk == 0);
    char *pc[] = {"ds4-server", "--test-engine", "--prefill-chunk", "2048"};
    REQUIRE(server_config_parse(&c, 4, pc, err, sizeof err) == 0);
    EXPECT(c.prefill_chunk == 2048);
    const char *badpc[] = {"0", "16385", "many", "-8"};
    expect_flag_rejects("--prefill-chunk", badpc, sizeof badpc / sizeof *badpc);
    char *warm[] = {"ds4-server", "--test-engine", "--warmup"};
    server_config_defaults(&c);
    EXPECT(!c.warmup);
    REQUIRE(server_config_parse(&c, 3, warm, err, sizeof err) == 0);
    EXPECT(c.warmup);
    char *missing[] = {"ds4-server", "--test-engine", "-np"};
    EXPECT(server_config_parse(&c, 3, missing, err, sizeof err) == -1);
    EXPECT_MSG(strstr(err, "-np needs a value") != NULL, "%s", err);
}

/* Claude Code (2.1.x) sends system messages inside `messages` (its
 * environment, agent and skill lists); shapes trimmed from a recorded
 * request. They render before the <｜User｜> of the turn they stand in, so
 * the user's words end the prompt and the next turn extends it. */
static void test_claude_code_system_messages(void)
{
    const char *turn1 =
        "{\"model\":\"claude-opus-5-5\",\"max_tokens\":128000,\"thinking\":{\"type\":\"adaptive\",\"display\":\"omitted\"},"
        "\"system\":[{\"type\":\"text\",\"text\":\"S\"}],"
        "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Q\"}]},"
        "{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"# Environment\"}]}]}";
    api_request r;
    api_error e;
    EXPECT_MSG(parse(API_MESSAGES, turn1, &r, &e) == 0, "%s", e.message);
    if (r.n_msgs != 3) { EXPECT(r.n_msgs == 3); api_request_free(&r); return; }
    EXPECT(r.msgs[2].role == ROLE_SYSTEM && !strcmp(r.msgs[2].content, "# Environment"));
    render_opts o = {true, false, true, NULL};
    char *p1 = prompt_render(&r, &o, NULL, NULL);
    EXPECT(p1 && !strcmp(p1, "<｜begin▁of▁sentence｜>S# Environment<｜User｜>Q<｜Assistant｜><think>"));
    api_request_free(&r);
    free(p1);
    /* with a tool declared (as Claude Code always has), reasoning is kept:
     * turn 2 (the history, the answer, a new question and a late system
     * message) extends turn 1's prompt plus what was sampled */
    const char *tools = "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}],";
    char b1[1024], b2[1024];
    snprintf(b1, sizeof b1, "{%s\"max_tokens\":9,\"system\":\"S\",\"messages\":[{\"role\":\"user\",\"content\":\"Q\"},"
             "{\"role\":\"system\",\"content\":\"# Environment\"}]}", tools);
    snprintf(b2, sizeof b2, "{%s\"max_tokens\":9,\"system\":\"S\",\"messages\":[{\"role\":\"user\",\"content\":\"Q\"},"
             "{\"role\":\"system\",\"content\":\"# Environment\"},"
             "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"r\",\"signature\":\"\"},{\"type\":\"text\",\"text\":\"A\"}]},"
             "{\"role\":\"user\",\"content\":\"Q2\"},{\"role\":\"system\",\"content\":\"late\"}]}", tools);
    EXPECT_MSG(parse(API_MESSAGES, b1, &r, &e) == 0, "%s", e.message);
    p1 = prompt_render(&r, &o, NULL, NULL);
    api_request_free(&r);
    EXPECT_MSG(parse(API_MESSAGES, b2, &r, &e) == 0, "%s", e.message);
    char *p2 = prompt_render(&r, &o, NULL, NULL);
    api_request_free(&r);
    REQUIRE(p1 && p2);
    size_t l1 = strlen(p1);
    EXPECT(!strncmp(p2, p1, l1));
    EXPECT(!strcmp(p2 + l1, "r</think>A<｜end▁of▁sentence｜>late<｜User｜>Q2<｜Assistant｜><think>"));
    EXPECT(strstr(p1, "## Tools") && strstr(p1, "# Environment<｜User｜>Q<｜Assistant｜><think>"));
    free(p1);
    free(p2);
}

/* Thinking signatures: ours carry the reasoning; a block sent back with
 * the text omitted (Claude Code's display:"omitted") or rewritten renders
 * the sampled reasoning; a damaged or foreign signature is not ours. */
static void test_thinking_signature(void)
{
    const char *txt = "The user wants the weather in Paris. I will call get_weather.";
    for (size_t n = 0; n <= 5; n++) { /* every base64 padding */
        char *sig = thinking_signature_make(txt, n);
        size_t got = 99;
        char *back = thinking_signature_open(sig, &got);
        EXPECT_MSG(back && got == n && !memcmp(back, txt, n), "length %zu", n);
        free(back);
        free(sig);
    }
    char *sig = thinking_signature_make(txt, strlen(txt));
    EXPECT(sig && sig[0]);
    size_t n;
    char *bad = strdup(sig);
    bad[8] = bad[8] == 'A' ? 'B' : 'A';
    EXPECT(thinking_signature_open(bad, &n) == NULL);
    EXPECT(thinking_signature_open("EqQBCkgIARABGAIiQL", &n) == NULL);
    EXPECT(thinking_signature_open("", &n) == NULL);
    free(bad);
    char body[1024];
    snprintf(body, sizeof body,
             "{\"max_tokens\":9,\"messages\":[{\"role\":\"user\",\"content\":\"Q\"},"
             "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"%s\"},"
             "{\"type\":\"text\",\"text\":\"A\"}]}]}", sig);
    api_request r;
    api_error e;
    EXPECT_MSG(parse(API_MESSAGES, body, &r, &e) == 0, "%s", e.message);
    if (r.n_msgs == 2) EXPECT(r.msgs[1].reasoning && !strcmp(r.msgs[1].reasoning, txt));
    api_request_free(&r);
    /* Responses: encrypted_content alone (store=false clients) */
    snprintf(body, sizeof body,
             "{\"input\":[{\"type\":\"message\",\"role\":\"user\",\"content\":\"Q\"},"
             "{\"type\":\"reasoning\",\"summary\":[],\"encrypted_content\":\"%s\"},"
             "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"A\"}]}]}", sig);
    EXPECT_MSG(parse(API_RESPONSES, body, &r, &e) == 0, "%s", e.message);
    if (r.n_msgs == 2) EXPECT(r.msgs[1].reasoning && !strcmp(r.msgs[1].reasoning, txt) && !strcmp(r.msgs[1].content, "A"));
    api_request_free(&r);
    free(sig);
}

/* Codex (0.17x) over the Responses API: a namespace group of functions,
 * the hosted web_search tool, developer messages, replayed items. Shapes
 * trimmed from a recorded request; the flat name is Codex's own form
 * (namespace + "__" + name). */
static void test_codex_tools(void)
{
    const char *body =
        "{\"model\":\"m\",\"input\":[{\"type\":\"message\",\"role\":\"developer\",\"content\":[{\"type\":\"input_text\",\"text\":\"D\"}]},"
        "{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"Q\"}]},"
        "{\"type\":\"function_call\",\"namespace\":\"multi_agent_v1\",\"name\":\"close_agent\",\"arguments\":\"{}\",\"call_id\":\"c1\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"ok\"},"
        "{\"type\":\"web_search_call\",\"id\":\"ws_1\",\"status\":\"completed\"}],"
        "\"tools\":[{\"type\":\"function\",\"name\":\"exec_command\",\"parameters\":{\"type\":\"object\"}},"
        "{\"type\":\"namespace\",\"name\":\"multi_agent_v1\",\"description\":\"d\",\"tools\":["
        "{\"type\":\"function\",\"name\":\"close_agent\",\"strict\":false,\"parameters\":{\"type\":\"object\"}}]},"
        "{\"type\":\"web_search\",\"external_web_access\":false}]}";
    api_request r;
    api_error e;
    EXPECT_MSG(parse(API_RESPONSES, body, &r, &e) == 0, "%s", e.message);
    EXPECT(r.n_tools == 2);
    if (r.n_tools == 2) {
        EXPECT(!strcmp(r.tools[1].name, "multi_agent_v1__close_agent"));
        EXPECT(r.tools[1].ns && !strcmp(r.tools[1].ns, "multi_agent_v1") && !strcmp(r.tools[1].local, "close_agent"));
        EXPECT(strstr(r.tools[1].schema_json, "\"name\": \"multi_agent_v1__close_agent\""));
        EXPECT(api_request_tool(&r, "multi_agent_v1__close_agent") == &r.tools[1]);
    }
    EXPECT(strstr(r.left_out, "web_search") && strstr(r.left_out, "item web_search_call"));
    EXPECT(r.n_msgs == 4 && r.msgs[0].role == ROLE_SYSTEM);
    if (r.n_msgs == 4) EXPECT(r.msgs[2].n_calls == 1 && !strcmp(r.msgs[2].calls[0].name, "multi_agent_v1__close_agent"));
    /* a call of the flat name goes back as {namespace, name} */
    cap_buf b = {0};
    out_parser *op = out_parser_new(false, true, "call_", NULL, 0, NULL, NULL);
    const char *gen = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"multi_agent_v1__close_agent\">\n"
                      "<｜DSML｜parameter name=\"target\" string=\"true\">a1</｜DSML｜parameter>\n"
                      "</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    out_parser_feed(op, gen, strlen(gen));
    out_parser_finish(op);
    resp_writer *w = resp_writer_new(API_RESPONSES, false, false, "m", cap, &b);
    resp_writer_request(w, &r);
    usage_info u = {.cache = "cold"};
    resp_writer_end(w, op, FIN_TOOL_CALLS, &u);
    json_t *out = b.s ? json_loads(b.s, 0, NULL) : NULL;
    free(b.s);
    json_t *item = out ? json_array_get(json_object_get(out, "output"), 0) : NULL;
    EXPECT(item && !strcmp(json_string_value(json_object_get(item, "name")), "close_agent") &&
           !strcmp(json_string_value(json_object_get(item, "namespace")), "multi_agent_v1"));
    json_decref(out);
    resp_writer_free(w);
    out_parser_free(op);
    api_request_free(&r);
    /* Anthropic server tools are left out too */
    EXPECT_MSG(parse(API_MESSAGES, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                     "\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"web_search\"},{\"name\":\"f\"}]}", &r, &e) == 0,
               "%s", e.message);
    EXPECT(r.n_tools == 1 && strstr(r.left_out, "web_search_20250305"));
    api_request_free(&r);
}

/* Structured output: the three APIs' forms land on one response_format;
 * the prompt carries the schema as the official encoder's system
 * response_format does (chat-format §3.2). */
static void test_response_format(void)
{
    const char *schema = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}";
    char body[1024];
    api_request r;
    api_error e;
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"Q\"}],"
             "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"strict\":true,\"schema\":%s}}}", schema);
    EXPECT_MSG(parse(API_CHAT, body, &r, &e) == 0, "%s", e.message);
    EXPECT(r.response_format == RF_JSON_SCHEMA && r.rf_schema && !strcmp(r.rf_schema, schema));
    render_opts o = {false, false, true, NULL};
    char *p = prompt_render(&r, &o, NULL, NULL);
    EXPECT(p && !strcmp(p, "<｜begin▁of▁sentence｜>S\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
                           "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}, \"required\": [\"a\"]}"
                           "<｜User｜>Q<｜Assistant｜></think>"));
    free(p);
    api_request_free(&r);
    snprintf(body, sizeof body, "{\"input\":\"Q\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\",\"schema\":%s}}}", schema);
    EXPECT_MSG(parse(API_RESPONSES, body, &r, &e) == 0, "%s", e.message);
    EXPECT(r.response_format == RF_JSON_SCHEMA);
    api_request_free(&r);
    snprintf(body, sizeof body, "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"Q\"}],"
             "\"output_config\":{\"format\":{\"type\":\"json_schema\",\"schema\":%s}}}", schema);
    EXPECT_MSG(parse(API_MESSAGES, body, &r, &e) == 0, "%s", e.message);
    EXPECT(r.response_format == RF_JSON_SCHEMA);
    api_request_free(&r);
    EXPECT(parse(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"Q\"}],\"response_format\":{\"type\":\"json_object\"}}", &r, &e) == 0);
    EXPECT(r.response_format == RF_JSON_OBJECT && !r.rf_schema);
    api_request_free(&r);
    EXPECT(parse(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"Q\"}],\"response_format\":{\"type\":\"yaml\"}}", &r, &e) == -1);
    EXPECT(!strcmp(e.param, "response_format"));
    EXPECT(parse(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"Q\"}],\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"type\":\"object\",\"required\":[\"x\"],\"properties\":{}}}}}", &r, &e) == -1);
    EXPECT(!strcmp(e.param, "response_format.json_schema.schema") && strstr(e.message, "required property 'x'"));
}

int main(void)
{
    RUN(test_chat_fields);
    RUN(test_tool_choice_forms);
    RUN(test_errors_name_the_field);
    RUN(test_anthropic_blocks);
    RUN(test_responses_items);
    RUN(test_parser_two_calls_any_split);
    RUN(test_parser_content_and_holdback);
    RUN(test_parser_stop_sequence);
    RUN(test_parser_reasoning_without_end);
    RUN(test_chat_stream_shape);
    RUN(test_anthropic_stream_shape);
    RUN(test_responses_stream_shape);
    RUN(test_nonstream_bodies);
    RUN(test_tool_memory_bounded);
    RUN(test_parallel_flag);
    RUN(test_claude_code_system_messages);
    RUN(test_thinking_signature);
    RUN(test_codex_tools);
    RUN(test_response_format);
    return test_finish();
}

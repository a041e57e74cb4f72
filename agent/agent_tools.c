/*
 * agent_tools.c - tool schemas, argument helpers, dispatch, the shell tool
 * and the demo tools (see agent_tools.h). File tools: agent_tool_files.c;
 * list/glob/search: agent_tool_find.c.
 */
#include "agent/agent_tools_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent/agent_shell.h"

/* Schemas: {"name", "description", "parameters"} in the order the model
 * sees them; wrapped as OpenAI tools below. */
static const char CODING_TOOLS[] =
    "["
    "{\"name\": \"read\", \"description\": \"Read a text file of the workspace. Lines are numbered from 1; "
    "give start_line/end_line to read a range.\", \"parameters\": {\"type\": \"object\", \"properties\": {"
    "\"path\": {\"type\": \"string\", \"description\": \"File path relative to the workspace\"}, "
    "\"start_line\": {\"type\": \"integer\", \"description\": \"First line to read (default 1)\"}, "
    "\"end_line\": {\"type\": \"integer\", \"description\": \"Last line to read (default: the end)\"}}, "
    "\"required\": [\"path\"]}},"
    "{\"name\": \"write\", \"description\": \"Create or overwrite a file of the workspace with the given "
    "content (parent directories are created).\", \"parameters\": {\"type\": \"object\", \"properties\": {"
    "\"path\": {\"type\": \"string\"}, \"content\": {\"type\": \"string\"}}, \"required\": [\"path\", "
    "\"content\"]}},"
    "{\"name\": \"edit\", \"description\": \"Replace an exact piece of text in a file. old_text must occur "
    "exactly once unless replace_all is true.\", \"parameters\": {\"type\": \"object\", \"properties\": {"
    "\"path\": {\"type\": \"string\"}, \"old_text\": {\"type\": \"string\", \"description\": \"Text to "
    "replace, exactly as in the file\"}, \"new_text\": {\"type\": \"string\"}, \"replace_all\": {\"type\": "
    "\"boolean\"}}, \"required\": [\"path\", \"old_text\", \"new_text\"]}},"
    "{\"name\": \"list\", \"description\": \"List a directory of the workspace (directories end in /).\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"path\": {\"type\": \"string\", \"description\": "
    "\"Directory (default: the workspace root)\"}}}},"
    "{\"name\": \"glob\", \"description\": \"Find files whose path matches a glob pattern (* within a "
    "directory, ** across directories, ?).\", \"parameters\": {\"type\": \"object\", \"properties\": {"
    "\"pattern\": {\"type\": \"string\", \"description\": \"For example src/**/*.c\"}}, \"required\": "
    "[\"pattern\"]}},"
    "{\"name\": \"search\", \"description\": \"Search file contents with a regular expression (PCRE2); "
    "prints path:line: text for each matching line.\", \"parameters\": {\"type\": \"object\", \"properties\": {"
    "\"pattern\": {\"type\": \"string\"}, \"path\": {\"type\": \"string\", \"description\": \"File or "
    "directory to search (default: the workspace)\"}, \"glob\": {\"type\": \"string\", \"description\": "
    "\"Only files matching this glob\"}, \"ignore_case\": {\"type\": \"boolean\"}}, \"required\": "
    "[\"pattern\"]}},"
    "{\"name\": \"shell\", \"description\": \"Run a shell command in the workspace directory and return its "
    "exit status and output (stdout and stderr).\", \"parameters\": {\"type\": \"object\", \"properties\": {"
    "\"command\": {\"type\": \"string\"}, \"timeout_s\": {\"type\": \"integer\", \"description\": \"Seconds "
    "before the command is killed\"}}, \"required\": [\"command\"]}}"
    "]";

/* The demo model's training tools (tools/train_demo/make_data.py), same
 * text, so the model sees what it was trained on. */
static const char DEMO_TOOLS[] =
    "["
    "{\"name\": \"get_weather\", \"description\": \"Get the current weather for a city\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"location\": {\"type\": \"string\", \"description\": \"The city "
    "name\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"], \"description\": "
    "\"Temperature unit\"}}, \"required\": [\"location\"]}},"
    "{\"name\": \"add\", \"description\": \"Add two integers\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"a\": {\"type\": \"integer\"}, \"b\": {\"type\": \"integer\"}}, \"required\": [\"a\", "
    "\"b\"]}},"
    "{\"name\": \"get_time\", \"description\": \"Get the current local time in a city\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"The city "
    "name\"}}, \"required\": [\"city\"]}}"
    "]";

json_t *agent_tools_schemas(agent_toolset set)
{
    json_t *fns = json_loads(set == AGENT_TOOLSET_DEMO ? DEMO_TOOLS : CODING_TOOLS, JSON_PRESERVE_ORDER, NULL);
    json_t *out = json_array();
    for (size_t i = 0; i < json_array_size(fns); i++)
        json_array_append_new(out, json_pack("{s:s,s:O}", "type", "function", "function", json_array_get(fns, i)));
    json_decref(fns);
    return out;
}

char *agent_tool_error(bool *failed, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    *failed = true;
    agent_buf b = {0};
    if (strncmp(msg, "error:", 6)) agent_buf_puts(&b, "error: ");
    agent_buf_puts(&b, msg);
    return agent_buf_take(&b);
}

const char *agent_arg_str(const json_t *args, const char *key)
{
    const json_t *v = json_object_get(args, key);
    if (!json_is_string(v)) return NULL;
    const char *s = json_string_value(v);
    return strlen(s) == json_string_length(v) ? s : NULL;
}

bool agent_arg_int(const json_t *args, const char *key, long long *out)
{
    const json_t *v = json_object_get(args, key);
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return true;
    }
    if (json_is_real(v) && json_real_value(v) == (double)(long long)json_real_value(v)) {
        *out = (long long)json_real_value(v);
        return true;
    }
    const char *s = json_string_value(v);
    if (!s || !*s) return false;
    char *end;
    long long x = strtoll(s, &end, 10);
    while (*end == ' ') end++;
    if (*end) return false;
    *out = x;
    return true;
}

bool agent_arg_bool(const json_t *args, const char *key, bool dflt)
{
    const json_t *v = json_object_get(args, key);
    if (json_is_boolean(v)) return json_is_true(v);
    const char *s = json_string_value(v);
    if (s) return !strcmp(s, "true") || !strcmp(s, "1") || !strcmp(s, "yes");
    return dflt;
}

static char *tool_shell(agent_tools *t, const json_t *args, bool *failed)
{
    const char *cmd = agent_arg_str(args, "command");
    if (!cmd || !*cmd) return agent_tool_error(failed, "shell needs a \"command\" string");
    long long ts = 0;
    int timeout_ms = t->cmd_timeout_ms;
    if (agent_arg_int(args, "timeout_s", &ts) && ts > 0 && ts * 1000 < timeout_ms) timeout_ms = (int)(ts * 1000);
    if (t->confirm) {
        char what[600];
        snprintf(what, sizeof what, "run: %.500s", cmd);
        if (!t->confirm(t->confirm_ud, what))
            return agent_tool_error(failed, "the user did not allow running this command");
    }
    agent_shell_result r;
    char err[256];
    if (agent_shell_run(t->ws->root, cmd, timeout_ms, t->output_cap, t->stop, &r, err, sizeof err) != 0)
        return agent_tool_error(failed, "%s", err);
    agent_buf b = {0};
    if (r.timed_out)
        agent_buf_printf(&b, "error: the command did not finish within %d s and was killed\n", timeout_ms / 1000);
    else if (r.interrupted)
        agent_buf_puts(&b, "error: the user interrupted the command (Ctrl-C)\n");
    agent_buf_printf(&b, "exit status %d\n", r.exit_code);
    agent_buf_add(&b, r.output, r.len);
    *failed = r.timed_out || r.interrupted || r.exit_code != 0;
    agent_shell_result_free(&r);
    return agent_buf_take(&b);
}

/* ---- demo tools --------------------------------------------------------- */

static unsigned hash_str(const char *s)
{
    unsigned h = 2166136261u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

static char *tool_get_weather(const json_t *args, bool *failed)
{
    const char *city = agent_arg_str(args, "location");
    if (!city) city = agent_arg_str(args, "city");
    if (!city || !*city) return agent_tool_error(failed, "get_weather needs a \"location\" string");
    static const char *const cond[] = {"sunny", "cloudy", "rainy", "windy", "snowy", "foggy"};
    unsigned h = hash_str(city);
    const char *unit = agent_arg_str(args, "unit");
    int c = (int)(h % 30) - 2;
    bool f = unit && !strcmp(unit, "fahrenheit");
    agent_buf b = {0};
    agent_buf_printf(&b, "{\"temperature\": %d, \"condition\": \"%s\"}", f ? c * 9 / 5 + 32 : c, cond[(h >> 8) % 6]);
    return agent_buf_take(&b);
}

static char *tool_add(const json_t *args, bool *failed)
{
    long long a, b;
    if (!agent_arg_int(args, "a", &a) || !agent_arg_int(args, "b", &b))
        return agent_tool_error(failed, "add needs integers \"a\" and \"b\"");
    agent_buf o = {0};
    agent_buf_printf(&o, "%lld", a + b);
    return agent_buf_take(&o);
}

static char *tool_get_time(const json_t *args, bool *failed)
{
    const char *city = agent_arg_str(args, "city");
    if (!city || !*city) return agent_tool_error(failed, "get_time needs a \"city\" string");
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    agent_buf b = {0};
    agent_buf_printf(&b, "{\"time\": \"%02d:%02d\"}", tm.tm_hour, tm.tm_min);
    return agent_buf_take(&b);
}

char *agent_tools_call(agent_tools *t, const char *name, const char *args_json, bool *failed)
{
    *failed = false;
    json_error_t je;
    json_t *args = json_loads(args_json && *args_json ? args_json : "{}", JSON_DECODE_ANY, &je);
    if (!json_is_object(args)) {
        json_decref(args);
        return agent_tool_error(failed, "the arguments of %s are not a JSON object", name);
    }
    char *r;
    if (t->set == AGENT_TOOLSET_DEMO) {
        if (!strcmp(name, "get_weather")) r = tool_get_weather(args, failed);
        else if (!strcmp(name, "add")) r = tool_add(args, failed);
        else if (!strcmp(name, "get_time")) r = tool_get_time(args, failed);
        else r = agent_tool_error(failed, "unknown tool \"%.100s\" (tools: get_weather, add, get_time)", name);
    } else if (!strcmp(name, "read")) r = agent_tool_read(t, args, failed);
    else if (!strcmp(name, "write")) r = agent_tool_write(t, args, failed);
    else if (!strcmp(name, "edit")) r = agent_tool_edit(t, args, failed);
    else if (!strcmp(name, "list")) r = agent_tool_list(t, args, failed);
    else if (!strcmp(name, "glob")) r = agent_tool_glob(t, args, failed);
    else if (!strcmp(name, "search")) r = agent_tool_search(t, args, failed);
    else if (!strcmp(name, "shell")) r = tool_shell(t, args, failed);
    else r = agent_tool_error(failed, "unknown tool \"%.100s\" (tools: read, write, edit, list, glob, search, shell)", name);
    json_decref(args);
    return r;
}

/*
 * api_request.h - one request of any of the four HTTP APIs, as plain C data.
 *
 * The server speaks OpenAI chat completions, OpenAI text completions, OpenAI
 * Responses and Anthropic Messages. Each arrives as JSON in its own shape;
 * api_request_parse() turns any of them into the same api_request struct so
 * that everything after parsing (rendering, generation, caching) has one code
 * path. The parser never touches the engine and allocates only in proportion
 * to the body it was given, so the fuzz target (fuzz/fuzz_http_request.c)
 * drives it directly.
 *
 * A validation failure fills an api_error naming the offending field
 * ("messages[2].content") and the HTTP status to answer with (400).
 */
#ifndef DS4_SERVER_API_REQUEST_H
#define DS4_SERVER_API_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    API_CHAT = 0,      /* POST /v1/chat/completions */
    API_COMPLETIONS,   /* POST /v1/completions */
    API_RESPONSES,     /* POST /v1/responses */
    API_MESSAGES,      /* POST /v1/messages (Anthropic) */
} api_kind;

typedef enum { ROLE_SYSTEM = 0, ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL } api_role;

typedef struct {
    char *id;         /* client-visible id (call_..., toolu_...), may be NULL */
    char *name;
    char *arguments;  /* JSON object text as the client sent it */
} api_tool_call;

typedef struct {
    api_role role;
    char *content;        /* text; parts joined with "\n\n"; never NULL */
    char *reasoning;      /* assistant reasoning / thinking, NULL if none */
    api_tool_call *calls; /* assistant tool calls */
    size_t n_calls;
    char *tool_call_id;   /* ROLE_TOOL: which call this result answers */
} api_message;

typedef struct {
    char *name;           /* as the model sees and calls it: a Responses
                             namespace's tool is "NS__name" (Codex's form) */
    char *schema_json;    /* {"name","description","parameters"} re-serialised
                             with ", " / ": " separators, raw UTF-8 */
    char *ns;             /* the Responses namespace it came from, else NULL */
    char *local;          /* its name inside that namespace, else NULL */
    bool strict;          /* "strict": true: a forced call follows the schema
                             (server/dsml_grammar.h) */
    char *strict_error;   /* strict, but the grammar cannot take the schema:
                             why (a 400 when the call is forced), else NULL */
    char strict_param[96];/* its field: "tools[2].parameters" */
} api_tool;

typedef enum {
    TOOL_CHOICE_AUTO = 0,
    TOOL_CHOICE_NONE,
    TOOL_CHOICE_REQUIRED,
    TOOL_CHOICE_NAMED,
} api_tool_choice;

#define API_MAX_STOP 16

typedef struct {
    api_kind kind;
    char *model;             /* as sent (NULL if absent) */
    api_message *msgs;
    size_t n_msgs;
    char *prompt;            /* API_COMPLETIONS only */
    api_tool *tools;
    size_t n_tools;
    api_tool_choice tool_choice;
    char *tool_choice_name;  /* TOOL_CHOICE_NAMED */
    int max_tokens;          /* -1: not given */
    double temperature;      /* < 0: not given */
    double top_p;            /* < 0: not given */
    double min_p;            /* < 0: not given */
    int top_k;               /* < 0: not given */
    bool has_seed;
    uint64_t seed;
    char *stop[API_MAX_STOP];
    size_t n_stop;
    bool stream;
    bool include_usage;      /* stream_options.include_usage */
    int thinking;            /* -1 default (model decides), 0 off, 1 on */
    bool think_max;          /* reasoning effort "max" */
    /* Structured output: OpenAI response_format / Responses text.format /
     * Anthropic output_config.format. The answer is sampled under the
     * schema's grammar (server/json_grammar.h). */
    enum { RF_TEXT = 0, RF_JSON_OBJECT, RF_JSON_SCHEMA } response_format;
    char *rf_schema;         /* RF_JSON_SCHEMA: the schema as JSON text */
    /* What the request carried that the prompt leaves out, for the log:
     * hosted tools (web_search, ...: run by the provider, not by the
     * client or us) and history items with nothing to render. */
    char left_out[256];      /* "tools: web_search; items: 2 web_search_call" */
} api_request;

/* The tool a call names, or NULL. */
const api_tool *api_request_tool(const api_request *r, const char *name);

typedef struct {
    int status;              /* HTTP status, 400 for validation errors */
    char message[256];
    char param[96];          /* offending field path, "" when none */
} api_error;

/* Bounds on what one request may make the parser build (docs/SERVER.md
 * flags --max-messages, --max-tools, --max-json-values). Process-wide, set
 * once at start; the defaults are the flags' defaults. */
typedef struct {
    size_t max_messages;     /* messages / input items */
    size_t max_tools;
    size_t max_json_values;  /* counted on the raw body before parsing */
} api_limits;

void api_request_set_limits(const api_limits *l);

/* The JSON values in body[0..len) (objects, arrays, strings including
 * keys, numbers, literals), counted on the bytes without building
 * anything: a body of 1.85 M tiny messages is refused before jansson would
 * take 1.4 GB for it. Malformed JSON is counted as far as it goes (the
 * parser names the error later). */
size_t api_json_count_values(const char *body, size_t len);

/* Parse `body` (not NUL-terminated, `len` bytes) as a request of `kind`.
 * Returns 0 and fills *out, or -1 and fills *err (out is then empty). */
int api_request_parse(api_kind kind, const char *body, size_t len,
                      api_request *out, api_error *err);

void api_request_free(api_request *r);

/* "chat.completion" ids etc. use the kind's public name in logs. */
const char *api_kind_name(api_kind k);

/* Model aliases: names that switch thinking off/on (deepseek-chat,
 * deepseek-reasoner, *-nothink). Returns -1 (no opinion), 0 or 1. */
int api_model_alias_thinking(const char *model);

#endif

/*
 * api_response.h - what goes back to the client, in each API's own shape.
 *
 * A resp_writer turns the output parser's events into the API's native SSE
 * events as they happen (OpenAI chat chunks with reasoning_content and
 * tool_calls argument deltas; text_completion chunks; the Responses
 * lifecycle events; Anthropic message_start / content_block_* /
 * message_delta / message_stop), and at the end builds the final object: the
 * whole body of a non-streaming request, or the last events of a stream.
 * Output goes through a sink function so tests can capture it.
 */
#ifndef DS4_SERVER_API_RESPONSE_H
#define DS4_SERVER_API_RESPONSE_H

#include <stdbool.h>
#include <stddef.h>

#include "server/api_request.h"
#include "server/output_parser.h"

typedef enum { FIN_STOP = 0, FIN_LENGTH, FIN_TOOL_CALLS, FIN_STOP_SEQUENCE } finish_kind;

typedef struct {
    int prompt_tokens;      /* tokens of the whole prompt */
    int cached_tokens;      /* of those, reused (live session or disk) */
    int completion_tokens;
    int reasoning_tokens;
    const char *cache;      /* "cold", "token-prefix", "text-prefix", "disk" */
    double prefill_ms, decode_ms;
    /* --mtp: drafts made and confirmed for this answer (steps that
     * speculated; both 0 when none did) */
    int mtp_drafted, mtp_accepted;
} usage_info;

typedef void (*sink_fn)(void *ud, const char *s, size_t n);

typedef struct resp_writer resp_writer;

resp_writer *resp_writer_new(api_kind kind, bool stream, bool include_usage,
                             const char *model, sink_fn sink, void *ud);
void resp_writer_free(resp_writer *w);
/* The request's tool_choice, which the Responses object echoes ("auto"
 * until set). */
void resp_writer_tool_choice(resp_writer *w, api_tool_choice c, const char *name);

/* The request (kept, not copied): namespaced Responses tools are named
 * back as {namespace, name}. */
void resp_writer_request(resp_writer *w, const api_request *r);

/* Stream start (role chunk, response.created, message_start). */
void resp_writer_begin(resp_writer *w, const usage_info *u);
/* Keep-alive during a long prefill (an SSE comment, or Anthropic ping). */
void resp_writer_keepalive(resp_writer *w);
/* A parser event (streaming only; ignored otherwise). */
void resp_writer_event(resp_writer *w, const out_event *ev);
/* End: the closing events, or the whole non-streaming body. */
void resp_writer_end(resp_writer *w, const out_parser *p, finish_kind fin,
                     const usage_info *u);

/* Error body in the API's shape: OpenAI {"error":{message,type,param,code}}
 * or Anthropic {"type":"error","error":{type,message}}. malloc'd. */
char *api_error_body(api_kind kind, int status, const char *message, const char *param);
/* The same as one SSE event, for errors after a stream began. */
char *api_error_event(api_kind kind, const char *message);

#endif

/*
 * server_log.h - what ds4-server tells its operator: the log on stderr and
 * the counters behind GET /metrics.
 *
 * One line per request (endpoint, the client's model name, prompt tokens
 * reused / prefilled, generated, finish reason, times and rates), one per
 * error status with its reason, prefill progress of long prompts and the
 * startup report. `--log-format json` writes each as one JSON object a line
 * (for log collectors), text otherwise. Every call is thread-safe: the HTTP
 * threads and the worker both log.
 */
#ifndef DS4_SERVER_LOG_H
#define DS4_SERVER_LOG_H

#include <stdbool.h>
#include <stdint.h>

void slog_init(bool json);

/* A finished generation request (status 200 or 499 for a client gone). */
typedef struct {
    const char *endpoint;   /* "/v1/messages" */
    const char *model;      /* as the client named it, may be NULL */
    int status;
    int prompt_tokens, reused_tokens, generated_tokens, reasoning_tokens;
    const char *cache;      /* cold, token-prefix, text-prefix, memory, disk */
    const char *finish;     /* stop, length, tool_calls, stop_sequence, cancelled, error */
    double queue_ms, prefill_ms, decode_ms;
} slog_request_info;
void slog_request(const slog_request_info *r);

/* A 4xx/5xx answer and why. */
void slog_error(const char *method, const char *endpoint, int status, const char *reason);

/* Any other event: "startup", "prefill", ... with a preformatted text. */
void slog_event(const char *event, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Gauges read when /metrics is asked. */
typedef struct {
    int queue, slots, busy, ctx;
    uint64_t decode_steps, batched_steps, decode_tokens;
} slog_gauges;
/* The Prometheus text exposition (version 0.0.4). malloc'd. */
char *slog_metrics_text(const slog_gauges *g);

const char *slog_endpoint(int api_kind);

#endif

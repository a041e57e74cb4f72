/*
 * server_log.c - see the header.
 */
#include "server/server_log.h"

#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/api_request.h"

static bool g_json;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

/* counters for /metrics */
#define N_EP 5
#define N_CACHE 5
static const char *const EP[N_EP] = {"/v1/chat/completions", "/v1/completions", "/v1/responses",
                                     "/v1/messages", "other"};
static const char *const CACHE[N_CACHE] = {"cold", "token-prefix", "text-prefix", "memory", "disk"};
static struct {
    uint64_t requests[N_EP][6]; /* by status class: 2xx, 4xx, 5xx, 499, other... */
    uint64_t prompt, reused, generated, reasoning;
    double prefill_s, decode_s;
    uint64_t cache[N_CACHE];
    uint64_t errors_4xx, errors_5xx;
} M;

void slog_init(bool json) { g_json = json; }

const char *slog_endpoint(int k)
{
    return k >= 0 && k < 4 ? EP[k] : EP[4];
}

static int ep_index(const char *ep)
{
    for (int i = 0; i < N_EP - 1; i++)
        if (ep && !strcmp(ep, EP[i])) return i;
    return N_EP - 1;
}

static int status_class(int st)
{
    if (st == 499) return 3;
    if (st >= 200 && st < 300) return 0;
    if (st >= 400 && st < 500) return 1;
    if (st >= 500) return 2;
    return 4;
}
static const char *const CLASS[5] = {"2xx", "4xx", "5xx", "499", "other"};

static void put_line(json_t *o, const char *text)
{
    /* one write per line, so lines of concurrent threads never interleave */
    if (g_json) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        json_object_set_new(o, "ts", json_real((double)ts.tv_sec + ts.tv_nsec / 1e9));
        char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (s) {
            fprintf(stderr, "%s\n", s);
            free(s);
        }
    } else {
        fprintf(stderr, "ds4-server: %s\n", text);
    }
    fflush(stderr);
}

void slog_request(const slog_request_info *r)
{
    int prefilled = r->prompt_tokens - r->reused_tokens;
    double ds = r->decode_ms / 1000.0, ps = r->prefill_ms / 1000.0;
    double total = (r->queue_ms + r->prefill_ms + r->decode_ms) / 1000.0;
    double dtps = ds > 0 ? r->generated_tokens / ds : 0, ptps = ps > 0 ? prefilled / ps : 0;
    pthread_mutex_lock(&g_mu);
    M.requests[ep_index(r->endpoint)][status_class(r->status)]++;
    M.prompt += (uint64_t)(r->prompt_tokens > 0 ? r->prompt_tokens : 0);
    M.reused += (uint64_t)(r->reused_tokens > 0 ? r->reused_tokens : 0);
    M.generated += (uint64_t)(r->generated_tokens > 0 ? r->generated_tokens : 0);
    M.reasoning += (uint64_t)(r->reasoning_tokens > 0 ? r->reasoning_tokens : 0);
    M.prefill_s += ps;
    M.decode_s += ds;
    for (int i = 0; i < N_CACHE; i++)
        if (r->cache && !strcmp(r->cache, CACHE[i])) M.cache[i]++;
    pthread_mutex_unlock(&g_mu);

    char text[768];
    snprintf(text, sizeof text,
             "POST %s model=%s status=%d prompt=%d reused=%d prefilled=%d cache=%s generated=%d "
             "(reasoning %d) finish=%s time=%.2fs (queue %.2fs, prefill %.2fs at %.0f tok/s, "
             "decode %.2fs at %.1f tok/s)",
             r->endpoint, r->model ? r->model : "-", r->status, r->prompt_tokens, r->reused_tokens, prefilled,
             r->cache ? r->cache : "-", r->generated_tokens, r->reasoning_tokens, r->finish, total,
             r->queue_ms / 1000.0, ps, ptps, ds, dtps);
    json_t *o = g_json ? json_pack("{s:s, s:s, s:s, s:s?, s:i, s:i, s:i, s:i, s:s?, s:i, s:i, s:s, s:f, s:f, s:f, s:f, s:f, s:f}",
                                   "event", "request", "method", "POST", "endpoint", r->endpoint, "model", r->model,
                                   "status", r->status, "prompt_tokens", r->prompt_tokens, "reused_tokens",
                                   r->reused_tokens, "prefilled_tokens", prefilled, "cache", r->cache,
                                   "generated_tokens", r->generated_tokens, "reasoning_tokens", r->reasoning_tokens,
                                   "finish", r->finish, "time_s", total, "queue_s", r->queue_ms / 1000.0,
                                   "prefill_s", ps, "decode_s", ds, "prefill_tok_s", ptps, "decode_tok_s", dtps)
                        : NULL;
    put_line(o, text);
    json_decref(o);
}

void slog_error(const char *method, const char *endpoint, int status, const char *reason)
{
    pthread_mutex_lock(&g_mu);
    M.requests[ep_index(endpoint)][status_class(status)]++;
    if (status >= 400 && status < 500 && status != 499) M.errors_4xx++;
    if (status >= 500) M.errors_5xx++;
    pthread_mutex_unlock(&g_mu);
    char text[640];
    snprintf(text, sizeof text, "%s %s status=%d error: %s", method ? method : "-", endpoint ? endpoint : "-",
             status, reason ? reason : "");
    json_t *o = g_json ? json_pack("{s:s, s:s?, s:s?, s:i, s:s?}", "event", "error", "method", method, "endpoint",
                                   endpoint, "status", status, "reason", reason)
                       : NULL;
    put_line(o, text);
    json_decref(o);
}

void slog_event(const char *event, const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    char line[1100];
    snprintf(line, sizeof line, "%s: %s", event, text);
    json_t *o = g_json ? json_pack("{s:s, s:s}", "event", event, "message", text) : NULL;
    put_line(o, line);
    json_decref(o);
}

typedef struct { char *p; size_t len, cap; } mbuf;

static void mprintf(mbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void mprintf(mbuf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if (b->p && b->len + (size_t)n < b->cap) { b->len += (size_t)n; return; }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + (size_t)n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return;
        b->p = q;
        b->cap = cap;
    }
}

char *slog_metrics_text(const slog_gauges *g)
{
    mbuf b = {0};
    pthread_mutex_lock(&g_mu);
    mprintf(&b, "# HELP ds4_requests_total HTTP API requests answered, by endpoint and status class.\n"
                "# TYPE ds4_requests_total counter\n");
    for (int e = 0; e < N_EP; e++)
        for (int c = 0; c < 5; c++)
            if (M.requests[e][c] || c < 3)
                mprintf(&b, "ds4_requests_total{endpoint=\"%s\",status=\"%s\"} %llu\n", EP[e], CLASS[c],
                        (unsigned long long)M.requests[e][c]);
    mprintf(&b, "# HELP ds4_prompt_tokens_total Prompt tokens of finished requests.\n# TYPE ds4_prompt_tokens_total counter\n"
                "ds4_prompt_tokens_total %llu\n", (unsigned long long)M.prompt);
    mprintf(&b, "# HELP ds4_prompt_tokens_reused_total Prompt tokens taken from a live session or a cache instead of prefilled.\n"
                "# TYPE ds4_prompt_tokens_reused_total counter\nds4_prompt_tokens_reused_total %llu\n",
            (unsigned long long)M.reused);
    mprintf(&b, "# HELP ds4_prompt_tokens_prefilled_total Prompt tokens run through the model.\n"
                "# TYPE ds4_prompt_tokens_prefilled_total counter\nds4_prompt_tokens_prefilled_total %llu\n",
            (unsigned long long)(M.prompt - M.reused));
    mprintf(&b, "# HELP ds4_generated_tokens_total Tokens generated (reasoning included).\n"
                "# TYPE ds4_generated_tokens_total counter\nds4_generated_tokens_total %llu\n",
            (unsigned long long)M.generated);
    mprintf(&b, "# HELP ds4_reasoning_tokens_total Generated tokens inside the reasoning.\n"
                "# TYPE ds4_reasoning_tokens_total counter\nds4_reasoning_tokens_total %llu\n",
            (unsigned long long)M.reasoning);
    mprintf(&b, "# HELP ds4_prefill_seconds_total Time spent prefilling prompts.\n"
                "# TYPE ds4_prefill_seconds_total counter\nds4_prefill_seconds_total %.6f\n", M.prefill_s);
    mprintf(&b, "# HELP ds4_decode_seconds_total Time spent generating.\n"
                "# TYPE ds4_decode_seconds_total counter\nds4_decode_seconds_total %.6f\n", M.decode_s);
    mprintf(&b, "# HELP ds4_prompt_cache_total Requests by where their prompt's prefix came from (cold = nothing reused).\n"
                "# TYPE ds4_prompt_cache_total counter\n");
    for (int i = 0; i < N_CACHE; i++)
        mprintf(&b, "ds4_prompt_cache_total{source=\"%s\"} %llu\n", CACHE[i], (unsigned long long)M.cache[i]);
    pthread_mutex_unlock(&g_mu);
    mprintf(&b, "# HELP ds4_queue_depth Requests waiting for a free slot.\n# TYPE ds4_queue_depth gauge\n"
                "ds4_queue_depth %d\n", g->queue);
    mprintf(&b, "# HELP ds4_slots Slots (concurrent sessions, --parallel).\n# TYPE ds4_slots gauge\nds4_slots %d\n",
            g->slots);
    mprintf(&b, "# HELP ds4_slots_busy Slots serving a request.\n# TYPE ds4_slots_busy gauge\nds4_slots_busy %d\n",
            g->busy);
    mprintf(&b, "# HELP ds4_context_length Context length of each slot, in tokens.\n# TYPE ds4_context_length gauge\n"
                "ds4_context_length %d\n", g->ctx);
    mprintf(&b, "# HELP ds4_decode_steps_total Decode steps (one batched forward each).\n"
                "# TYPE ds4_decode_steps_total counter\nds4_decode_steps_total %llu\n",
            (unsigned long long)g->decode_steps);
    mprintf(&b, "# HELP ds4_decode_batched_steps_total Decode steps with more than one session.\n"
                "# TYPE ds4_decode_batched_steps_total counter\nds4_decode_batched_steps_total %llu\n",
            (unsigned long long)g->batched_steps);
    return b.p;
}

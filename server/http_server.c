/*
 * http_server.c - libmicrohttpd glue: routing, auth, limits, streaming.
 *
 * Request life: the first callback sees only the headers, so routing, the
 * API key and a declared Content-Length over the limit are answered there
 * without reading the body. Body chunks are then collected up to the limit
 * (an undeclared oversize body is drained and answered 413). On the last
 * callback the body is parsed (400 with the field named on error), turned
 * into a job and queued (503 when the queue is full).
 *
 * Non-streaming: the handler thread waits for the job, polling the socket so
 * that a client that hangs up cancels its job. Streaming: it waits until the
 * worker has written the first event (so errors found before generation
 * still get a proper status), then hands MHD a reader that blocks on the
 * job's condition variable and writes an SSE comment every --keepalive-ms
 * while nothing else comes. When the client goes away MHD frees the reader,
 * which cancels the job; the worker stops at its next token.
 */
#include "server/http_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netdb.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "server/api_response.h"
#include "server/conn_guard.h"
#include "server/job.h"
#include "server/server_log.h"

struct http_server {
    struct MHD_Daemon *d;
    server_config cfg;
    worker *w;
    int port;
    conn_guard *guard;       /* header deadline, open connections */
    pthread_mutex_t parse_mu;
    size_t parse_bytes;      /* estimated memory of the requests being parsed now */
};

/* What parsing a body may take: the body, the tree jansson builds (values
 * counted on the raw bytes; 256 bytes each covers a small object with its
 * hash table) and the request built from it. */
#define PARSE_BYTES_PER_VALUE 256

typedef enum { R_NONE = 0, R_HEALTH, R_MODELS, R_MODEL, R_API, R_METRICS, R_COUNT_TOKENS } route;

/* The request this connection thread is answering, for the error log
 * (thread per connection: set at each callback). */
static __thread const char *cur_method, *cur_url;

typedef struct {
    route route;
    api_kind kind;
    char *body;
    size_t len, cap;
    bool too_big;
} conn_state;

/* ---- responses ------------------------------------------------------------ */

static void add_common_headers(http_server *s, struct MHD_Response *r, const char *ctype)
{
    MHD_add_response_header(r, "Content-Type", ctype);
    if (s->cfg.cors) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
        MHD_add_response_header(r, "Access-Control-Allow-Headers", "*");
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    }
}

static enum MHD_Result send_json(http_server *s, struct MHD_Connection *c, int status, const char *body)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    add_common_headers(s, r, "application/json");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_error(http_server *s, struct MHD_Connection *c, api_kind kind, int status,
                                  const char *msg, const char *param)
{
    slog_error(cur_method, cur_url, status, msg);
    char *b = api_error_body(kind, status, msg, param);
    enum MHD_Result r = send_json(s, c, status, b ? b : "{\"error\":{\"message\":\"error\"}}");
    free(b);
    return r;
}

/* A 503 that tells the client when to come back (queue full, too many
 * connections); `close` also ends the connection, so an overloaded server
 * sheds it at once. */
static enum MHD_Result send_busy(http_server *s, struct MHD_Connection *c, api_kind kind, const char *msg,
                                 int retry_s, bool close)
{
    char *b = api_error_body(kind, 503, msg, NULL);
    const char *body = b ? b : "{\"error\":{\"message\":\"busy\"}}";
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    free(b);
    if (!r) return MHD_NO;
    add_common_headers(s, r, "application/json");
    char ra[16];
    snprintf(ra, sizeof ra, "%d", retry_s);
    MHD_add_response_header(r, "Retry-After", ra);
    if (close) MHD_add_response_header(r, "Connection", "close");
    enum MHD_Result ret = MHD_queue_response(c, 503, r);
    MHD_destroy_response(r);
    return ret;
}

/* ---- routes ------------------------------------------------------------------- */

static bool parse_route(const char *url, const char *method, conn_state *st, int *bad_method)
{
    *bad_method = 0;
    struct { const char *path; route r; api_kind k; const char *m; } t[] = {
        {"/health", R_HEALTH, API_CHAT, "GET"},
        {"/v1/models", R_MODELS, API_CHAT, "GET"},
        {"/v1/chat/completions", R_API, API_CHAT, "POST"},
        {"/v1/completions", R_API, API_COMPLETIONS, "POST"},
        {"/v1/responses", R_API, API_RESPONSES, "POST"},
        {"/v1/messages", R_API, API_MESSAGES, "POST"},
        {"/v1/messages/count_tokens", R_COUNT_TOKENS, API_MESSAGES, "POST"},
        {"/metrics", R_METRICS, API_CHAT, "GET"},
        {"/chat/completions", R_API, API_CHAT, "POST"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        if (strcmp(url, t[i].path)) continue;
        if (strcmp(method, t[i].m)) { *bad_method = 1; st->kind = t[i].k; return false; }
        st->route = t[i].r;
        st->kind = t[i].k;
        return true;
    }
    if (!strncmp(url, "/v1/models/", 11) && url[11]) {
        if (strcmp(method, "GET")) { *bad_method = 1; return false; }
        st->route = R_MODEL;
        return true;
    }
    if (!strncmp(url, "/v1/messages", 12)) st->kind = API_MESSAGES;
    return false;
}

static bool authorized(http_server *s, struct MHD_Connection *c)
{
    const char *key = s->cfg.api_key;
    if (!key) return true;
    size_t kl = strlen(key);
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    if (h && strlen(h) == kl && !CRYPTO_memcmp(h, key, kl)) return true;
    h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (h && !strncasecmp(h, "Bearer ", 7)) {
        h += 7;
        while (*h == ' ') h++;
        if (strlen(h) == kl && !CRYPTO_memcmp(h, key, kl)) return true;
    }
    return false;
}

static const char *const ALIASES[] = {"deepseek-v4-flash", "deepseek-chat", "deepseek-reasoner"};

static json_t *model_obj(const char *id, int ctx)
{
    /* context_length: what clients (opencode, LiteLLM, Codex's model
     * metadata) read to size their prompts; max_model_len is vLLM's name */
    return json_pack("{s:s, s:s, s:i, s:s, s:i, s:i}", "id", id, "object", "model", "created", 0, "owned_by", "ds4",
                     "context_length", ctx, "max_model_len", ctx);
}

static enum MHD_Result send_models(http_server *s, struct MHD_Connection *c, const char *one)
{
    const char *mid = worker_model_id(s->w);
    json_t *o;
    if (one) {
        bool known = !strcmp(one, mid);
        for (size_t i = 0; i < 3; i++) known |= !strcmp(one, ALIASES[i]);
        if (!known) {
            char msg[300];
            snprintf(msg, sizeof msg, "model '%.200s' not found", one);
            return send_error(s, c, API_CHAT, 404, msg, "model");
        }
        o = model_obj(one, worker_ctx(s->w));
    } else {
        json_t *data = json_array();
        json_array_append_new(data, model_obj(mid, worker_ctx(s->w)));
        for (size_t i = 0; i < 3; i++)
            if (strcmp(ALIASES[i], mid)) json_array_append_new(data, model_obj(ALIASES[i], worker_ctx(s->w)));
        o = json_pack("{s:s, s:o}", "object", "list", "data", data);
    }
    char *b = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    enum MHD_Result r = send_json(s, c, 200, b ? b : "{}");
    free(b);
    return r;
}

/* POST /v1/messages/count_tokens: Anthropic's body without max_tokens;
 * answers {"input_tokens": N}, the prompt as /v1/messages would render it. */
static enum MHD_Result count_tokens(http_server *s, struct MHD_Connection *c, conn_state *st)
{
    json_error_t je;
    json_t *root = json_loadb(st->body ? st->body : "", st->len, JSON_REJECT_DUPLICATES, &je);
    if (!root || !json_is_object(root)) {
        char msg[256];
        snprintf(msg, sizeof msg, root ? "the request body must be a JSON object"
                                       : "malformed JSON at line %d column %d: %s", je.line, je.column, je.text);
        json_decref(root);
        return send_error(s, c, API_MESSAGES, 400, msg, NULL);
    }
    if (!json_object_get(root, "max_tokens")) json_object_set_new(root, "max_tokens", json_integer(1));
    char *body = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    api_request r;
    api_error err;
    int rc = body ? api_request_parse(API_MESSAGES, body, strlen(body), &r, &err) : -1;
    free(body);
    if (rc != 0) return send_error(s, c, API_MESSAGES, body ? err.status : 500, body ? err.message : "out of memory",
                                   body ? err.param : NULL);
    int n = 0;
    rc = worker_count_tokens(s->w, &r, &n);
    api_request_free(&r);
    if (rc != 0) return send_error(s, c, API_MESSAGES, 500, "rendering the prompt failed", NULL);
    char b[64];
    snprintf(b, sizeof b, "{\"input_tokens\":%d}", n);
    return send_json(s, c, 200, b);
}

static enum MHD_Result send_metrics(http_server *s, struct MHD_Connection *c)
{
    worker_stats ws;
    worker_get_stats(s->w, &ws);
    slog_gauges g = {ws.queue, ws.slots, ws.busy, worker_ctx(s->w), ws.decode_steps, ws.batched_steps,
                     ws.decode_tokens};
    char *t = slog_metrics_text(&g);
    if (!t) return send_error(s, c, API_CHAT, 500, "out of memory", NULL);
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(t), t, MHD_RESPMEM_MUST_FREE);
    if (!r) { free(t); return MHD_NO; }
    add_common_headers(s, r, "text/plain; version=0.0.4; charset=utf-8");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
}

/* ---- jobs ------------------------------------------------------------------------ */

/* Has the peer closed its end? (a readable socket with nothing to read) */
static bool client_gone(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    struct pollfd p = {ci->connect_fd, POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLHUP | POLLERR | POLLRDHUP)) return true;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0;
}

/* Wait until pred holds, checking for a vanished client every 200 ms.
 * Returns false when the client went away (the job is then cancelled). */
/* Waits for the job's end, or (for_first_bytes, a stream) for its first
 * bytes. A stream still queued after queued_ms gets its 200 SSE headers
 * now and keep-alive comments from then on (the client would otherwise see
 * nothing until a slot frees up and time out); a failure after that point
 * is sent as an SSE error event (job_headers_sent). */
static bool wait_job(job *j, struct MHD_Connection *c, bool for_first_bytes, int queued_ms)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_mutex_lock(&j->mu);
    while (!j->finished && !(for_first_bytes && j->out_len > 0)) {
        if (for_first_bytes && !j->started) {
            struct timespec t1;
            clock_gettime(CLOCK_MONOTONIC, &t1);
            if ((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000 >= queued_ms) {
                j->headers_sent = true;
                pthread_mutex_unlock(&j->mu);
                static const char q[] = ": queued\n\n";
                job_write(j, q, sizeof q - 1); /* a first byte, so the headers go out now */
                return true;
            }
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        if (j->finished || (for_first_bytes && j->out_len > 0)) break;
        pthread_mutex_unlock(&j->mu);
        bool gone = client_gone(c);
        pthread_mutex_lock(&j->mu);
        if (gone) {
            j->cancelled = true;
            pthread_mutex_unlock(&j->mu);
            return false;
        }
    }
    pthread_mutex_unlock(&j->mu);
    return true;
}

typedef struct {
    job *j;
    int keepalive_ms;
} stream_ctx;

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    stream_ctx *sc = cls;
    job *j = sc->j;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        if (j->out_read < j->out_len) {
            size_t n = j->out_len - j->out_read;
            if (n > max) n = max;
            memcpy(buf, j->out + j->out_read, n);
            j->out_read += n;
            pthread_mutex_unlock(&j->mu);
            return (ssize_t)n;
        }
        if (j->finished) {
            pthread_mutex_unlock(&j->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long ns = ts.tv_nsec + (long)(sc->keepalive_ms % 1000) * 1000000L;
        ts.tv_sec += sc->keepalive_ms / 1000 + ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        if (pthread_cond_timedwait(&j->cv, &j->mu, &ts) == ETIMEDOUT &&
            j->out_read == j->out_len && !j->finished) {
            pthread_mutex_unlock(&j->mu);
            static const char ka[] = ": keep-alive\n\n";
            size_t n = sizeof ka - 1 < max ? sizeof ka - 1 : max;
            memcpy(buf, ka, n);
            return (ssize_t)n;
        }
    }
}

static void stream_free(void *cls)
{
    stream_ctx *sc = cls;
    /* A client that leaves before the end cancels the generation. */
    job_cancel(sc->j);
    job_unref(sc->j);
    free(sc);
}

static enum MHD_Result run_api(http_server *s, struct MHD_Connection *c, conn_state *st)
{
    /* the parsing memory of all requests at once is bounded: a request is
     * charged its estimate before jansson builds anything */
    size_t values = api_json_count_values(st->body ? st->body : "", st->len);
    size_t cost = st->len + values * PARSE_BYTES_PER_VALUE, budget = s->cfg.max_parse_mb << 20;
    if (cost > budget) {
        char msg[200];
        snprintf(msg, sizeof msg, "parsing this request needs about %zu MiB, more than the %zu MiB limit (--max-parse-mb)",
                 cost >> 20, s->cfg.max_parse_mb);
        return send_error(s, c, st->kind, 413, msg, NULL);
    }
    pthread_mutex_lock(&s->parse_mu);
    bool room = s->parse_bytes + cost <= budget;
    if (room) s->parse_bytes += cost;
    pthread_mutex_unlock(&s->parse_mu);
    if (!room)
        return send_busy(s, c, st->kind, "the server is busy parsing other large requests; retry later", 1, false);
    job *j = job_new();
    api_error err;
    int prc = j ? api_request_parse(st->kind, st->body ? st->body : "", st->len, &j->req, &err) : -1;
    pthread_mutex_lock(&s->parse_mu);
    s->parse_bytes -= cost;
    pthread_mutex_unlock(&s->parse_mu);
    if (!j) return send_error(s, c, st->kind, 500, "out of memory", NULL);
    if (prc != 0) {
        job_unref(j);
        return send_error(s, c, st->kind, err.status, err.message, err.param);
    }
    bool stream = j->req.stream;
    if (worker_submit(s->w, j) != 0) {
        job_unref(j);
        return send_busy(s, c, st->kind, "the server is busy: too many queued requests; retry later", 2, false);
    }
    if (!wait_job(j, c, stream, s->cfg.keepalive_ms)) {
        job_unref(j);
        return MHD_NO;
    }
    pthread_mutex_lock(&j->mu);
    bool finished = j->finished;
    int status = j->status;
    pthread_mutex_unlock(&j->mu);
    if (!stream || (finished && status != 200)) {
        if (status == 499) { job_unref(j); return MHD_NO; }
        pthread_mutex_lock(&j->mu);
        struct MHD_Response *r = MHD_create_response_from_buffer(j->out_len, j->out ? j->out : (char *)"",
                                                                 MHD_RESPMEM_MUST_COPY);
        pthread_mutex_unlock(&j->mu);
        job_unref(j);
        if (!r) return MHD_NO;
        add_common_headers(s, r, "application/json");
        enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
        MHD_destroy_response(r);
        return ret;
    }
    stream_ctx *sc = calloc(1, sizeof *sc);
    if (!sc) { job_cancel(j); job_unref(j); return MHD_NO; }
    sc->j = j;
    sc->keepalive_ms = s->cfg.keepalive_ms;
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, sc, stream_free);
    if (!r) { stream_free(sc); return MHD_NO; }
    add_common_headers(s, r, "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
}

/* ---- MHD callbacks ------------------------------------------------------------- */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version;
    http_server *s = cls;
    conn_state *st = *con_cls;
    cur_method = method;
    cur_url = url;
    if (!st) {
        st = calloc(1, sizeof *st);
        if (!st) return MHD_NO;
        *con_cls = st;
        conn_guard_headers_done(s->guard, c);
        if (conn_guard_open(s->guard) > s->cfg.max_connections && strcmp(url, "/health")) {
            char msg[160];
            snprintf(msg, sizeof msg, "the server is busy: more than %d open connections; retry later",
                     s->cfg.max_connections);
            /* the error in the shape of the API the client speaks */
            return send_busy(s, c, !strncmp(url, "/v1/messages", 12) ? API_MESSAGES : API_CHAT, msg, 1, true);
        }
        if (!strcmp(method, "OPTIONS")) {
            struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
            add_common_headers(s, r, "text/plain");
            enum MHD_Result ret = MHD_queue_response(c, 204, r);
            MHD_destroy_response(r);
            return ret;
        }
        int bad_method;
        if (!parse_route(url, method, st, &bad_method)) {
            char msg[300];
            snprintf(msg, sizeof msg, bad_method ? "method %.16s is not allowed on %.200s" : "no such endpoint: %.16s %.200s",
                     method, bad_method ? url : url);
            if (!bad_method) snprintf(msg, sizeof msg, "no such endpoint: %.16s %.200s", method, url);
            return send_error(s, c, st->kind, bad_method ? 405 : 404, msg, NULL);
        }
        if (st->route != R_HEALTH && !authorized(s, c))
            return send_error(s, c, st->kind, 401, "missing or invalid API key (send Authorization: Bearer KEY or x-api-key: KEY)", NULL);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->cfg.max_body_bytes) {
            char msg[160];
            snprintf(msg, sizeof msg, "request body of %.24s bytes exceeds the limit of %zu bytes", cl, s->cfg.max_body_bytes);
            return send_error(s, c, st->kind, 413, msg, NULL);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!st->too_big) {
            if (st->len + *upload_size > s->cfg.max_body_bytes) {
                st->too_big = true;
                free(st->body);
                st->body = NULL;
                st->len = st->cap = 0;
            } else {
                if (st->len + *upload_size + 1 > st->cap) {
                    size_t cap = st->cap ? st->cap * 2 : 16384;
                    while (cap < st->len + *upload_size + 1) cap *= 2;
                    char *q = realloc(st->body, cap);
                    if (!q) return MHD_NO;
                    st->body = q;
                    st->cap = cap;
                }
                memcpy(st->body + st->len, upload, *upload_size);
                st->len += *upload_size;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (st->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "request body exceeds the limit of %zu bytes", s->cfg.max_body_bytes);
        return send_error(s, c, st->kind, 413, msg, NULL);
    }
    switch (st->route) {
    case R_HEALTH: {
        worker_stats ws;
        worker_get_stats(s->w, &ws);
        char b[512];
        snprintf(b, sizeof b,
                 "{\"status\":\"ok\",\"model\":\"%s\",\"queue\":%d,\"slots\":%d,\"busy\":%d,"
                 "\"decode\":{\"steps\":%llu,\"batched_steps\":%llu,\"tokens\":%llu,\"max_batch\":%d}}",
                 worker_model_id(s->w), ws.queue, ws.slots, ws.busy, (unsigned long long)ws.decode_steps,
                 (unsigned long long)ws.batched_steps, (unsigned long long)ws.decode_tokens, ws.max_batch);
        return send_json(s, c, 200, b);
    }
    case R_MODELS: return send_models(s, c, NULL);
    case R_MODEL: return send_models(s, c, url + 11);
    case R_API: return run_api(s, c, st);
    case R_METRICS: return send_metrics(s, c);
    case R_COUNT_TOKENS: return count_tokens(s, c, st);
    default: return send_error(s, c, st->kind, 404, "no such endpoint", NULL);
    }
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)toe;
    http_server *s = cls;
    conn_guard_request_done(s->guard, c);
    conn_state *st = *con_cls;
    if (!st) return;
    free(st->body);
    free(st);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    fprintf(stderr, "ds4-server: http: ");
    vfprintf(stderr, fmt, ap);
}

http_server *http_server_start(const server_config *cfg, worker *w, char *err, size_t es)
{
    http_server *s = calloc(1, sizeof *s);
    if (!s) { snprintf(err, es, "out of memory"); return NULL; }
    s->cfg = *cfg;
    s->w = w;
    pthread_mutex_init(&s->parse_mu, NULL);
    api_limits lim = {(size_t)cfg->max_messages, (size_t)cfg->max_tools, (size_t)cfg->max_json_values};
    api_request_set_limits(&lim);
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    int gai = getaddrinfo(cfg->host, port, &hints, &ai);
    if (gai) {
        snprintf(err, es, "--host %s: %s", cfg->host, gai_strerror(gai));
        free(s);
        return NULL;
    }
    s->guard = conn_guard_new(cfg->header_timeout_s);
    if (!s->guard) {
        snprintf(err, es, "out of memory");
        freeaddrinfo(ai);
        free(s);
        return NULL;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    /* libmicrohttpd's own limit is set above --max-connections, so that the
     * connections past ours still get their fast 503 (conn_guard.h) */
    s->d = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, on_request, s,
                            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_NOTIFY_CONNECTION, conn_guard_notify, s->guard,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections + 64,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)cfg->max_client_connections,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600,
                            MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) {
        snprintf(err, es, "cannot listen on %s:%d: %s", cfg->host, cfg->port, strerror(errno));
        conn_guard_free(s->guard);
        free(s);
        return NULL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : cfg->port;
    return s;
}

int http_server_port(http_server *s) { return s->port; }

void http_server_quiesce(http_server *s)
{
    if (s && s->d) MHD_quiesce_daemon(s->d);
}

void http_server_stop(http_server *s)
{
    if (!s) return;
    if (s->d) MHD_stop_daemon(s->d);
    conn_guard_free(s->guard);
    free(s);
}

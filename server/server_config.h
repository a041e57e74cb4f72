/*
 * server_config.h - ds4-server's command line, parsed into one struct.
 *
 * Flag names follow antirez/ds4's ds4-server where it has them, so that its
 * users can switch without relearning (--host, --port, --ctx, -m, --cors,
 * --trace, --kv-disk-dir, --kv-disk-space-mb, --kv-cache-*,
 * --tool-memory-max-ids, --disable-exact-dsml-tool-replay). Unknown flags
 * are an error, never silently ignored.
 */
#ifndef DS4_SERVER_CONFIG_H
#define DS4_SERVER_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "include/ds4.h"
#include "cli/cli_edit_options.h"

typedef struct {
    const char *host;          /* 127.0.0.1 */
    int port;                  /* 8000 */
    int ctx;                   /* 32768 */
    const char *model_path;    /* -m */
    const char *backend;       /* --backend cpu|cuda (passed to the engine) */
    int threads;               /* -t, 0 = engine default */
    const char *api_key;       /* --api-key; NULL = no auth */
    bool cors;
    bool warmup;               /* --warmup: ds4_session_warmup on every slot at start */
    const char *trace_path;
    size_t max_body_bytes;     /* --max-body-mb, default 64 MiB */
    int max_queue;             /* --max-queue, requests waiting; default 64 */
    int parallel;              /* -np/--parallel: slots (live sessions); default 1 */
    int prefill_chunk;         /* --prefill-chunk: tokens a prefill step takes; 0 (default): by backend */
    int default_max_tokens;    /* when the request gives none; default 32768 */
    int keepalive_ms;          /* SSE keep-alive period; default 5000 */
    double default_temperature;/* --temp: when the request gives none; 1 */
    int log_json;              /* --log-format json: one JSON object a line */
    bool version;              /* --version: print it and exit */

    const char *kv_disk_dir;
    size_t kv_disk_space_mb;   /* default 4096 */
    int kv_cache_min_tokens;               /* 512 */
    int kv_cache_cold_max_tokens;          /* 30000 */
    int kv_cache_continued_interval_tokens;/* 10000 */
    int kv_cache_boundary_trim_tokens;     /* 32 */
    int kv_cache_boundary_align_tokens;    /* 2048 */
    bool kv_cache_reject_different_quant;
    size_t kv_memory_snapshot_mb;          /* 2048; 0 = no in-memory snapshot */

    size_t tool_memory_max_ids;            /* 100000 */
    bool disable_exact_replay;

    /* connection limits (conn_guard.h) */
    int header_timeout_s;      /* --header-timeout-s: request headers complete within; default 10 */
    int max_connections;       /* --max-connections: open connections before fast 503s; default 256 */
    int max_client_connections;/* --max-client-connections: per client address; default 64 */
    /* request parsing bounds (api_request.h api_limits) */
    int max_messages;          /* --max-messages: default 100000 */
    int max_tools;             /* --max-tools: default 4096 */
    int max_json_values;       /* --max-json-values: counted before parsing; default 500000 */
    size_t max_parse_mb;       /* --max-parse-mb: parsing memory in flight, all requests; default 1024 */
    ds4_cli_edit edit;           /* --dir-steering-*, --power (cli/cli_edit_options.h), every slot */
    ds4_model_options model_opt; /* --ssd-streaming*, --expert-profile (cli/cli_stream_options.h) */

    bool test_engine;          /* --test-engine: scripted engine, no model */
    int test_engine_delay_us;  /* per token */
} server_config;

void server_config_defaults(server_config *c);

/* Parses argv; on error writes a message naming the flag into err and
 * returns -1; returns 1 for --help (usage printed by the caller). */
int server_config_parse(server_config *c, int argc, char **argv, char *err, size_t err_size);

void server_config_usage(FILE *out);

#endif

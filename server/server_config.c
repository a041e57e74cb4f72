/*
 * server_config.c - ds4-server flags (see server_config.h).
 */
#include <stdio.h>

#include "server/server_config.h"

#include "cli/cli_stream_options.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void server_config_defaults(server_config *c)
{
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8000;
    c->ctx = 32768;
    c->max_body_bytes = 64u << 20;
    c->max_queue = 64;
    c->parallel = 1;
    c->default_max_tokens = 32768;
    c->default_temperature = 1.0;
    c->keepalive_ms = 5000;
    c->kv_disk_space_mb = 4096;
    c->kv_cache_min_tokens = 512;
    c->kv_cache_cold_max_tokens = 30000;
    c->kv_cache_continued_interval_tokens = 10000;
    c->kv_cache_boundary_trim_tokens = 32;
    c->kv_cache_boundary_align_tokens = 2048;
    c->kv_memory_snapshot_mb = 2048;
    c->tool_memory_max_ids = 100000;
    c->header_timeout_s = 10;
    c->max_connections = 256;
    c->max_client_connections = 64;
    c->max_messages = 100000;
    c->max_tools = 4096;
    c->max_json_values = 500000;
    c->max_parse_mb = 1024;
}

void server_config_usage(FILE *out)
{
    fprintf(out,
        "usage: ds4-server [options]\n"
        "  -m FILE                      model GGUF\n"
        "  --host ADDR                  listen address (default 127.0.0.1)\n"
        "  --port N                     listen port (default 8000)\n"
        "  --ctx N                      context length in tokens (default 32768)\n"
        "  --backend cpu|cuda, -t N     engine backend and CPU threads\n"
        "  --api-key KEY                require Authorization: Bearer KEY or x-api-key: KEY\n"
        "  --cors                       send browser cross-origin headers\n"
        "  --trace FILE                 log prompts, cache decisions, generations, tool events\n"
        "  --max-body-mb N              request body limit (default 64)\n"
        "  --max-queue N                requests allowed to wait (default 64; more get 503)\n"
        "  -np, --parallel N            requests served at once, one session each (default 1)\n"
        "  --prefill-chunk N            prompt tokens a prefill step takes (default 128 on the CPU;\n"
        "                               on CUDA 2048 with one slot, 512 with more); each slot holds\n"
        "                               buffers for that many\n"
        "  --warmup                     one untimed prefill step and decode per slot at start (CUDA:\n"
        "                               the first request then skips the one-time costs)\n"
        "  --max-tokens N               default output budget (default 32768)\n"
        "  --temp T                     default temperature when a request gives none (default 1; 0 = greedy)\n"
        "  --log-format text|json       request log on stderr: text lines or JSON objects (default text)\n"
        "  --version                    print version, commit and backends, then exit\n"
        "  --keepalive-ms N             SSE keep-alive period (default 5000)\n"
        "  --kv-disk-dir DIR            disk KV cache directory (off when absent)\n"
        "  --kv-disk-space-mb N         disk cache budget (default 4096)\n"
        "  --kv-cache-min-tokens N      smallest prefix worth saving (default 512)\n"
        "  --kv-cache-cold-max-tokens N largest cold prompt saved (default 30000)\n"
        "  --kv-cache-continued-interval-tokens N  save a growing session every N (10000)\n"
        "  --kv-cache-boundary-trim-tokens N       (accepted; default 32)\n"
        "  --kv-cache-boundary-align-tokens N      (accepted; default 2048)\n"
        "  --kv-cache-reject-different-quant       reuse only same-quant cache files\n"
        "  --kv-memory-snapshot-mb N    largest in-memory snapshot of a thinking prompt (default 2048; 0 = off)\n"
        "  --tool-memory-max-ids N      exact DSML replay map bound (default 100000)\n"
        "  --disable-exact-dsml-tool-replay        always render tool calls canonically\n"
        "  --header-timeout-s N         request headers must be complete within N s (default 10)\n"
        "  --max-connections N          open connections; more get a fast 503 (default 256)\n"
        "  --max-client-connections N   open connections per client address (default 64)\n"
        "  --max-messages N             messages / input items per request (default 100000)\n"
        "  --max-tools N                tools per request (default 4096)\n"
        "  --max-json-values N          JSON values in a request body, counted before parsing (default 500000)\n"
        "  --max-parse-mb N             memory for request parsing in flight, all requests (default 1024; more get 503)\n"
        "  --ssd-streaming ...          expert streaming flags as in ds4 (docs/STREAMING.md)\n"
        "  --dir-steering-file F, --dir-steering-ffn S, --dir-steering-attn S, --power N\n"
        "                               steering and duty cycle as in ds4, for every slot\n"
        "  --expert-profile FILE        count expert selections into FILE (merged at exit)\n"
        "  --test-engine                scripted engine for testing the HTTP layer (no model)\n"
        "  --test-engine-delay-us N     per-token delay of the test engine\n");
}

static int num(const char *flag, const char *v, long long lo, long long hi, long long *out,
               char *err, size_t es)
{
    if (!v) { snprintf(err, es, "%s needs a value", flag); return -1; }
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || *end || end == v || x < lo || x > hi) {
        snprintf(err, es, "%s: '%s' is not an integer in [%lld, %lld]", flag, v, lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

int server_config_parse(server_config *c, int argc, char **argv, char *err, size_t es)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long x;
#define STR(flag, field) if (!strcmp(a, flag)) { if (!v) { snprintf(err, es, "%s needs a value", flag); return -1; } c->field = v; i++; continue; }
#define INT(flag, field, lo, hi) if (!strcmp(a, flag)) { if (num(flag, v, lo, hi, &x, err, es)) return -1; c->field = x; i++; continue; }
#define BOOL(flag, field) if (!strcmp(a, flag)) { c->field = true; continue; }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return 1;
        const char *serr = NULL;
        int sr = ds4_cli_stream_option(&c->model_opt, argc, argv, &i, &serr);
        if (sr < 0) { snprintf(err, es, "%s", serr); return -1; }
        if (sr > 0) continue;
        sr = ds4_cli_edit_option(&c->edit, argc, argv, &i, &serr);
        if (sr < 0) { snprintf(err, es, "%s", serr); return -1; }
        if (sr > 0) continue;
        if (!strcmp(a, "--version")) { c->version = true; return 0; }
        if (!strcmp(a, "--temp")) {
            char *end;
            double t = v ? strtod(v, &end) : -1;
            if (!v || *end || end == v || !(t >= 0 && t <= 2)) {
                snprintf(err, es, "--temp: '%s' is not a number in [0, 2]", v ? v : "");
                return -1;
            }
            c->default_temperature = t; i++; continue;
        }
        if (!strcmp(a, "--log-format")) {
            if (!v || (strcmp(v, "text") && strcmp(v, "json"))) {
                snprintf(err, es, "--log-format: '%s' is not text or json", v ? v : "");
                return -1;
            }
            c->log_json = !strcmp(v, "json"); i++; continue;
        }
        STR("-m", model_path)
        STR("--model", model_path)
        STR("--host", host)
        INT("--port", port, 0, 65535)
        INT("--ctx", ctx, 256, 1 << 20)
        INT("-c", ctx, 256, 1 << 20)
        STR("--backend", backend)
        INT("-t", threads, 0, 4096)
        INT("--threads", threads, 0, 4096)
        STR("--api-key", api_key)
        BOOL("--cors", cors)
        BOOL("--warmup", warmup)
        STR("--trace", trace_path)
        if (!strcmp(a, "--max-body-mb")) {
            if (num(a, v, 1, 4096, &x, err, es)) return -1;
            c->max_body_bytes = (size_t)x << 20; i++; continue;
        }
        if (!strcmp(a, "--max-body-bytes")) {
            if (num(a, v, 1024, 1ll << 32, &x, err, es)) return -1;
            c->max_body_bytes = (size_t)x; i++; continue;
        }
        INT("--max-queue", max_queue, 0, 100000)
        INT("-np", parallel, 1, 256)
        INT("--parallel", parallel, 1, 256)
        INT("--prefill-chunk", prefill_chunk, 1, 16384)
        INT("--max-tokens", default_max_tokens, 1, 1 << 20)
        INT("--keepalive-ms", keepalive_ms, 50, 600000)
        STR("--kv-disk-dir", kv_disk_dir)
        INT("--kv-disk-space-mb", kv_disk_space_mb, 0, 1ll << 30)
        INT("--kv-cache-min-tokens", kv_cache_min_tokens, 1, 1 << 30)
        INT("--kv-cache-cold-max-tokens", kv_cache_cold_max_tokens, 0, 1 << 30)
        INT("--kv-cache-continued-interval-tokens", kv_cache_continued_interval_tokens, 0, 1 << 30)
        INT("--kv-cache-boundary-trim-tokens", kv_cache_boundary_trim_tokens, 0, 1 << 20)
        INT("--kv-cache-boundary-align-tokens", kv_cache_boundary_align_tokens, 0, 1 << 20)
        BOOL("--kv-cache-reject-different-quant", kv_cache_reject_different_quant)
        INT("--kv-memory-snapshot-mb", kv_memory_snapshot_mb, 0, 1ll << 30)
        INT("--tool-memory-max-ids", tool_memory_max_ids, 1, 100000000)
        BOOL("--disable-exact-dsml-tool-replay", disable_exact_replay)
        INT("--header-timeout-s", header_timeout_s, 1, 3600)
        INT("--max-connections", max_connections, 1, 100000)
        INT("--max-client-connections", max_client_connections, 1, 100000)
        INT("--max-messages", max_messages, 1, 10000000)
        INT("--max-tools", max_tools, 0, 100000)
        INT("--max-json-values", max_json_values, 1000, 100000000)
        INT("--max-parse-mb", max_parse_mb, 1, 1 << 20)
        BOOL("--test-engine", test_engine)
        INT("--test-engine-delay-us", test_engine_delay_us, 0, 10000000)
#undef STR
#undef INT
#undef BOOL
        snprintf(err, es, "unknown option '%s' (see --help)", a);
        return -1;
    }
    if (ds4_cli_edit_check(&c->edit)) {
        snprintf(err, es, "%s", ds4_cli_edit_check(&c->edit));
        return -1;
    }
    if (ds4_cli_stream_check(&c->model_opt)) {
        snprintf(err, es, "%s", ds4_cli_stream_check(&c->model_opt));
        return -1;
    }
    if (!c->test_engine && !c->model_path) {
        snprintf(err, es, "no model: pass -m FILE (or --test-engine)");
        return -1;
    }
    return 0;
}

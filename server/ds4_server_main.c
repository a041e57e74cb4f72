/*
 * ds4_server_main.c - ds4-server: OpenAI- and Anthropic-compatible HTTP API
 * over one live DwarfStar session (docs/SERVER.md).
 *
 * main() parses flags, opens the engine, starts the worker thread and the
 * HTTP daemon, then waits for SIGINT/SIGTERM with sigwait (the signals are
 * blocked in every thread, so no handler runs in an arbitrary thread).
 * Shutdown: stop accepting, stop the worker (the live session is saved to
 * the disk cache), stop the HTTP daemon, close the engine.
 */
#include "include/ds4.h"
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/engine_port.h"
#include "server/http_server.h"
#include "server/server_config.h"
#include "server/trace.h"
#include "server/worker.h"
#include "server/server_log.h"
#include "util/version.h"

srv_engine *engine_ds4_open(const server_config *cfg, char *err, size_t err_size);

int main(int argc, char **argv)
{
    if (ds4_version_requested(argc, argv)) { ds4_version_print(stdout, "ds4-server"); return 0; }
    /* under mpirun: ranks other than 0 serve the pipeline here (docs/DISTRIBUTED.md) */
    int dist_rc;
    if (ds4_dist_init(&argc, argv, &dist_rc)) return dist_rc;
    server_config cfg;
    server_config_defaults(&cfg);
    char err[512];
    int pr = server_config_parse(&cfg, argc, argv, err, sizeof err);
    if (pr == 1) { server_config_usage(stdout); return 0; }
    if (pr < 0) { fprintf(stderr, "ds4-server: %s\n", err); return 2; }

    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (cfg.version) { ds4_version_print(stdout, "ds4-server"); return 0; }
    slog_init(cfg.log_json != 0);
    if (trace_open(cfg.trace_path) != 0) {
        fprintf(stderr, "ds4-server: --trace %s: cannot open\n", cfg.trace_path);
        return 1;
    }
    srv_engine *eng = cfg.test_engine ? engine_test_open(cfg.ctx, cfg.test_engine_delay_us, cfg.parallel)
                                      : engine_ds4_open(&cfg, err, sizeof err);
    if (!eng) {
        fprintf(stderr, "ds4-server: %s\n", cfg.test_engine ? "out of memory" : err);
        return 1;
    }
    worker *w = worker_start(eng, &cfg, err, sizeof err);
    if (!w) {
        fprintf(stderr, "ds4-server: %s\n", err);
        eng->close(eng);
        return 1;
    }
    http_server *hs = http_server_start(&cfg, w, err, sizeof err);
    if (!hs) {
        fprintf(stderr, "ds4-server: %s\n", err);
        worker_stop(w);
        eng->close(eng);
        return 1;
    }
    slog_event("startup", "ds4-server %s", ds4_version_string());
    slog_event("startup", "model %s (%s), ctx %d, %d slot%s", eng->model_id,
               cfg.test_engine ? "test engine" : cfg.model_path, eng->ctx, eng->n_slots,
               eng->n_slots == 1 ? "" : "s");
    if (eng->info[0]) slog_event("startup", "%s", eng->info);
    slog_event("startup", "buffers: memory snapshot up to %zu MiB per slot, disk cache %s (%zu MiB), "
               "request body up to %zu MiB, queue %d, default temperature %g",
               cfg.kv_memory_snapshot_mb, cfg.kv_disk_dir ? cfg.kv_disk_dir : "off", cfg.kv_disk_space_mb,
               cfg.max_body_bytes >> 20, cfg.max_queue, cfg.default_temperature);
    fprintf(stderr, "ds4-server: model %s, ctx %d, listening on http://%s:%d%s\n", eng->model_id, eng->ctx,
            cfg.host, http_server_port(hs), cfg.test_engine ? " (test engine)" : "");
    /* machine-readable line for scripts that start us on --port 0 */
    printf("listening %d\n", http_server_port(hs));
    fflush(stdout);

    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "ds4-server: %s: shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    http_server_quiesce(hs);
    worker_stop(w);
    http_server_stop(hs);
    eng->close(eng);
    trace_close();
    fprintf(stderr, "ds4-server: bye\n");
    return 0;
}

/*
 * engine_ds4.c - the srv_engine port over the real engine (include/ds4.h).
 *
 * The model / session API and the tokenizer are being built in parallel
 * (model and text helpers); until they land on main this port reports that
 * no real model can be served, and `--test-engine` is the only engine.
 */
#include <stdio.h>

#include "server/engine_port.h"
#include "server/server_config.h"

srv_engine *engine_ds4_open(const server_config *cfg, char *err, size_t err_size);

srv_engine *engine_ds4_open(const server_config *cfg, char *err, size_t err_size)
{
    snprintf(err, err_size,
             "-m %s: this build has no model engine wired into ds4-server yet "
             "(use --test-engine to exercise the HTTP layer)",
             cfg->model_path ? cfg->model_path : "(none)");
    return NULL;
}

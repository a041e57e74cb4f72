/*
 * ds4_agent_main.c - the `ds4-agent` command: a coding agent on a live
 * in-process session (docs/AGENT.md). Options in agent_options.c, the
 * turn loop in agent_loop.c, sessions on disk in agent_store.c, the
 * interactive loop in agent_repl.c.
 */
#include "agent/agent_app.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agent/agent_store.h"
#include "cli/cli_io.h"
#include "cli/cli_sigint.h"

#define EXIT_STEP_LIMIT 3
#define EXIT_INTERRUPTED 130

static const char CODING_SYSTEM[] =
    "You are ds4-agent, a coding assistant working in the directory %s (the workspace). Use the tools to "
    "look at files, search, edit and run commands there; paths are relative to the workspace and cannot "
    "leave it. Read before you edit, make the smallest change that does the task, check it (build, tests) "
    "when you can, and finish with a short answer saying what you did.";
static const char DEMO_SYSTEM[] = "You are a helpful assistant";

static void default_sessions_dir(char *out, size_t cap)
{
    const char *x = getenv("XDG_STATE_HOME"), *h = getenv("HOME");
    if (x && *x) snprintf(out, cap, "%s/ds4-agent/sessions", x);
    else if (h && *h) snprintf(out, cap, "%s/.local/state/ds4-agent/sessions", h);
    else snprintf(out, cap, ".ds4-agent-sessions");
}

static int run(agent_app *app)
{
    agent_options *o = &app->opt;
    char err[1024];
    if (!agent_ws_open(&app->ws, o->workspace, err, sizeof err)) {
        fprintf(stderr, "ds4-agent: %s\n", err);
        return 1;
    }
    char demo[4096];
    if (!o->test_script && !o->cli.model_given && access(o->cli.model, R_OK) != 0) {
        if (!ds4_cli_find_demo_model(demo, sizeof demo)) {
            fprintf(stderr, "ds4-agent: no model: %s not found and the demo model models/ds4-demo.gguf is missing "
                            "(pass -m FILE)\n", o->cli.model);
            return 1;
        }
        fprintf(stderr, "ds4-agent: %s not found; using the tiny demo model %s (see models/README.md)\n",
                o->cli.model, demo);
        o->cli.model = demo;
    }
    const char *base = strrchr(o->cli.model, '/');
    base = base ? base + 1 : o->cli.model;
    agent_toolset set = o->toolset ? (!strcmp(o->toolset, "demo") ? AGENT_TOOLSET_DEMO : AGENT_TOOLSET_CODING)
                        : (!o->test_script && !strcmp(base, "ds4-demo.gguf")) ? AGENT_TOOLSET_DEMO
                                                                              : AGENT_TOOLSET_CODING;
    uint64_t seed = o->cli.seed_set ? o->cli.seed : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    if (o->test_script) {
        app->eng = agent_engine_script_open(o->test_script, o->cli.ctx, err, sizeof err);
    } else {
        agent_engine_params ep = {o->cli.temp, o->cli.top_p, o->cli.min_p, o->cli.top_k, o->cli.ctx,
                                  o->cli.threads, o->cli.backend, o->cli.gpu_device, &o->cli.edit};
        app->eng = agent_engine_ds4_open(o->cli.model, &ep, seed, err, sizeof err);
    }
    if (!app->eng) {
        fprintf(stderr, "ds4-agent: %s\n", err);
        return 1;
    }
    FILE *trace = NULL;
    if (o->trace && !(trace = fopen(o->trace, "a"))) {
        fprintf(stderr, "ds4-agent: --trace %s: cannot open\n", o->trace);
        return 1;
    }
    if (o->cli.think == DS4_CLI_THINK_MAX && o->cli.ctx < DS4_CLI_THINK_MAX_MIN_CTX)
        fprintf(stderr, "ds4-agent: warning: --think-max needs --ctx >= %d; ctx %d uses normal thinking\n",
                DS4_CLI_THINK_MAX_MIN_CTX, o->cli.ctx);
    bool oneshot = o->cli.prompt || o->cli.prompt_file;
    app->can_ask = !o->non_interactive && !o->yes;
    agent_tools tools = {.ws = &app->ws, .set = set, .cmd_timeout_ms = o->cmd_timeout_s * 1000,
                         .output_cap = (size_t)o->output_cap, .confirm = o->yes ? NULL : agent_app_confirm,
                         .confirm_ud = app, .stop = &ds4_cli_interrupted};
    app->schemas = agent_tools_schemas(set);
    bool tty_out = isatty(STDOUT_FILENO);
    agent_settings s = {
        .thinking = o->cli.think != DS4_CLI_NOTHINK,
        .think_max = o->cli.think == DS4_CLI_THINK_MAX && o->cli.ctx >= DS4_CLI_THINK_MAX_MIN_CTX,
        .n_predict = o->cli.n_predict, .max_steps = o->max_steps, .compact_at = o->compact_at, .seed = seed,
        .color = tty_out, .progress = isatty(STDERR_FILENO), .stats = true, .out = stdout, .trace = trace,
    };
    char *system = NULL;
    if (o->cli.system) {
        system = strdup(o->cli.system);
    } else if (set == AGENT_TOOLSET_DEMO) {
        system = strdup(DEMO_SYSTEM);
    } else {
        size_t n = sizeof CODING_SYSTEM + strlen(app->ws.root);
        if ((system = malloc(n))) snprintf(system, n, CODING_SYSTEM, app->ws.root);
    }
    agent_init(&app->a, app->eng, &tools, app->schemas, &s, system ? system : "");
    free(system);
    if (o->sessions_dir) snprintf(app->sessions_dir, sizeof app->sessions_dir, "%s", o->sessions_dir);
    else default_sessions_dir(app->sessions_dir, sizeof app->sessions_dir);
    ds4_cli_install_sigint();
    int rc = 0;
    if (o->session) {
        if (!agent_store_name_ok(o->session)) {
            fprintf(stderr, "ds4-agent: bad session name '%s' (1-64 of A-Z a-z 0-9 . _ -)\n", o->session);
            rc = 2;
        } else if (agent_store_exists(app->sessions_dir, o->session)) {
            if (!agent_app_load(app, o->session)) rc = 1;
        } else {
            snprintf(app->session, sizeof app->session, "%s", o->session);
        }
    }
    if (rc == 0 && oneshot) {
        size_t len;
        char *task = o->cli.prompt_file ? ds4_cli_read_file(o->cli.prompt_file, &len) : strdup(o->cli.prompt);
        if (!task) {
            rc = 1;
        } else {
            agent_outcome r = agent_task(&app->a, task);
            rc = r == AGENT_DONE ? 0 : r == AGENT_STOPPED ? EXIT_INTERRUPTED : r == AGENT_STEP_LIMIT ? EXIT_STEP_LIMIT : 1;
            if (!agent_app_save(app) && rc == 0) rc = 1;
        }
        free(task);
    } else if (rc == 0) {
        rc = agent_repl(app);
    }
    if (trace) fclose(trace);
    return rc;
}

int main(int argc, char **argv)
{
    agent_app *app = calloc(1, sizeof *app);
    if (!app) return 1;
    const char *err = agent_options_parse(&app->opt, argc, argv);
    int rc;
    if (app->opt.help) {
        agent_print_help(stdout);
        rc = 0;
    } else if (err) {
        fprintf(stderr, "ds4-agent: %s\n", err);
        rc = 2;
    } else {
        rc = run(app);
    }
    if (app->a.messages) agent_free(&app->a);
    if (app->eng) app->eng->close(app->eng);
    json_decref(app->schemas);
    agent_ws_close(&app->ws);
    free(app);
    return rc;
}

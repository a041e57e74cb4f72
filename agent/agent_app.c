/*
 * agent_app.c - the program-level pieces the main and the interactive
 * loop share (see agent_app.h): saving and loading the current session,
 * the confirmation prompt (Ctrl-C is cli/cli_sigint.h, as in ds4).
 */
#include "agent/agent_app.h"

#include <editline/readline.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent_store.h"

bool agent_app_save(agent_app *app)
{
    if (!app->session[0]) return true;
    size_t nm = json_array_size(app->a.messages);
    if (nm == app->saved_msgs && app->a.live.n == app->saved_tokens && agent_store_exists(app->sessions_dir, app->session))
        return true;
    char err[1024];
    if (!agent_store_save(&app->a, app->sessions_dir, app->session, app->ws.root, err, sizeof err)) {
        fprintf(stderr, "ds4-agent: cannot save session %s: %s\n", app->session, err);
        return false;
    }
    app->saved_msgs = nm;
    app->saved_tokens = app->a.live.n;
    return true;
}

bool agent_app_load(agent_app *app, const char *name)
{
    char err[1024];
    bool restored;
    if (!agent_store_load(&app->a, app->sessions_dir, name, app->ws.root, &restored, err, sizeof err)) {
        fprintf(stderr, "ds4-agent: cannot resume session %s: %s\n", name, err);
        /* the load may have replaced part of the state: go back to the
         * current session (saved just before a switch), or to an empty one;
         * never keep a half-loaded state under the current name */
        agent_clear(&app->a);
        char prev[sizeof app->session];
        snprintf(prev, sizeof prev, "%s", app->session);
        if (prev[0] && strcmp(prev, name) && agent_store_exists(app->sessions_dir, prev) &&
            agent_store_load(&app->a, app->sessions_dir, prev, app->ws.root, &restored, err, sizeof err)) {
            fprintf(stderr, "ds4-agent: staying in session %s\n", prev);
        } else {
            agent_clear(&app->a);
            app->session[0] = '\0'; /* nothing is saved until /new or /save NAME */
            if (prev[0]) fprintf(stderr, "ds4-agent: starting empty; /save NAME keeps this conversation\n");
        }
        return false;
    }
    snprintf(app->session, sizeof app->session, "%s", name);
    app->saved_msgs = json_array_size(app->a.messages);
    app->saved_tokens = app->a.live.n;
    fprintf(stderr, "ds4-agent: resumed session %s: %zu messages, %zu tokens%s\n", name,
            json_array_size(app->a.messages), app->a.live.n, restored ? " (snapshot restored, no prefill)" : "");
    return true;
}

bool agent_app_confirm(void *ud, const char *what)
{
    agent_app *app = ud;
    if (app->always) return true;
    if (!app->can_ask) {
        fprintf(stderr, "ds4-agent: refused (not interactive; --yes allows it): %s\n", what);
        return false;
    }
    char prompt[700];
    snprintf(prompt, sizeof prompt, "allow %s? [y]es / [n]o / [a]lways: ", what);
    char *ans = NULL;
    if (app->repl) {
        ans = readline(prompt);
    } else {
        fputs(prompt, stderr);
        fflush(stderr);
        char buf[64];
        if (fgets(buf, sizeof buf, stdin)) ans = strdup(buf);
    }
    bool yes = ans && (ans[0] == 'y' || ans[0] == 'Y' || ans[0] == 'a' || ans[0] == 'A');
    if (ans && (ans[0] == 'a' || ans[0] == 'A')) app->always = true;
    free(ans);
    return yes;
}

/*
 * agent_repl.c - the interactive loop: libedit line editing and history,
 * slash commands for sessions, one task per line. Every task is followed
 * by a save of the current session, so a crash loses at most the task in
 * progress.
 */
#include "agent/agent_app.h"

#include <editline/readline.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent/agent_store.h"
#include "cli/cli_prompt.h"
#include "cli/cli_sigint.h"

static void print_help(void)
{
    fputs("Commands:\n"
          "  /help              this list\n"
          "  /sessions          list the saved sessions (* = current)\n"
          "  /new [NAME]        save this session and start an empty one\n"
          "  /switch NAME       save this session and resume NAME\n"
          "  /save [NAME]       save now (under NAME: NAME becomes current)\n"
          "  /compact           summarise the older turns now\n"
          "  /think, /nothink   reasoning on or off for the next turns\n"
          "  /quit, /exit       save and leave (Ctrl-D too)\n"
          "  Ctrl-C             stop the answer or the running command\n"
          "Anything else is a task for the agent.\n",
          stdout);
}

static void new_name(char *out, size_t cap)
{
    time_t t = time(NULL);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(out, cap, "%Y%m%d-%H%M%S", &tm);
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t') s++;
    size_t l = strlen(s);
    while (l && (s[l - 1] == ' ' || s[l - 1] == '\t' || s[l - 1] == '\n')) s[--l] = '\0';
    return s;
}

/* false to leave */
static bool command(agent_app *app, char *line)
{
    char *arg = line;
    while (*arg && *arg != ' ' && *arg != '\t') arg++;
    if (*arg) *arg++ = '\0';
    arg = trim(arg);
    if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) return false;
    if (!strcmp(line, "/help")) {
        print_help();
    } else if (!strcmp(line, "/sessions")) {
        agent_store_list(app->sessions_dir, app->session, stdout);
    } else if (!strcmp(line, "/new")) {
        if (*arg && !agent_store_name_ok(arg)) {
            fprintf(stderr, "bad session name '%s' (1-64 of A-Z a-z 0-9 . _ -)\n", arg);
        } else if (*arg && agent_store_exists(app->sessions_dir, arg)) {
            fprintf(stderr, "session %s exists; /switch %s resumes it\n", arg, arg);
        } else {
            agent_app_save(app);
            agent_clear(&app->a);
            if (*arg) snprintf(app->session, sizeof app->session, "%s", arg);
            else new_name(app->session, sizeof app->session);
            printf("new session %s\n", app->session);
        }
    } else if (!strcmp(line, "/switch")) {
        if (!*arg) fprintf(stderr, "usage: /switch NAME (see /sessions)\n");
        else if (!agent_store_exists(app->sessions_dir, arg)) fprintf(stderr, "no session %s (see /sessions)\n", arg);
        else {
            agent_app_save(app);
            agent_app_load(app, arg);
        }
    } else if (!strcmp(line, "/save")) {
        if (*arg && !agent_store_name_ok(arg)) {
            fprintf(stderr, "bad session name '%s' (1-64 of A-Z a-z 0-9 . _ -)\n", arg);
        } else {
            if (*arg) snprintf(app->session, sizeof app->session, "%s", arg);
            if (agent_app_save(app)) printf("saved session %s (%zu tokens)\n", app->session, app->a.live.n);
        }
    } else if (!strcmp(line, "/compact")) {
        if (agent_compact(&app->a) && agent_sync(&app->a))
            printf("context now %zu tokens\n", app->a.live.n);
    } else if (!strcmp(line, "/think")) {
        app->a.s.thinking = true;
        printf("mode: think\n");
    } else if (!strcmp(line, "/nothink")) {
        app->a.s.thinking = false;
        printf("mode: nothink\n");
    } else {
        fprintf(stderr, "unknown command %s (try /help)\n", line);
    }
    return true;
}

int agent_repl(agent_app *app)
{
    app->repl = true;
    if (!app->session[0]) new_name(app->session, sizeof app->session);
    printf("ds4-agent in %s, session %s, ctx %lld. /help for commands, /quit to leave.\n", app->ws.root,
           app->session, (long long)app->eng->ctx);
    fflush(stdout);
    for (;;) {
        char *line = ds4_cli_prompt_line("agent> ");
        if (!line) break;
        char *s = trim(line);
        if (!*s) {
            free(line);
            continue;
        }
        add_history(s);
        bool go_on = true;
        if (s[0] == '/') {
            go_on = command(app, s);
        } else {
            agent_outcome r = agent_task(&app->a, s);
            if (r == AGENT_STOPPED) fprintf(stderr, "[interrupted]\n");
            ds4_cli_interrupted = 0;
            agent_app_save(app);
        }
        free(line);
        fflush(stdout);
        if (!go_on) break;
    }
    agent_app_save(app);
    return 0;
}

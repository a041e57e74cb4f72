/*
 * cli_repl.c - interactive chat loop (see cli_repl.h).
 *
 * Each line is a user message unless it starts with '/'. The live session
 * is kept across turns, so a turn prefills only its own new tokens.
 * Ctrl-C during an answer stops it (the partial answer stays in the
 * conversation); at the prompt it just clears the line.
 */
#include "cli/cli_repl.h"

#include "cli/cli_io.h"
#include "cli/cli_prompt.h"
#include "cli/cli_sigint.h"

#include <editline/readline.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_help(void)
{
    fputs("Commands:\n"
          "  /help              this list\n"
          "  /think             thinking mode (reasoning shown dimmed)\n"
          "  /think-max         Think Max (needs /ctx >= 393216, else normal thinking)\n"
          "  /nothink           answer directly, no reasoning\n"
          "  /ctx N             new session with context N; the conversation is prefilled again\n"
          "  /read FILE         send the contents of FILE as your next message\n"
          "  /save FILE         save the conversation (JSON)\n"
          "  /load FILE         load a conversation saved with /save\n"
          "  /quit, /exit       leave (Ctrl-D too)\n"
          "  Ctrl-C             stop the current answer\n",
          stdout);
}

static const char *mode_name(ds4_cli_think t)
{
    return t == DS4_CLI_NOTHINK ? "nothink" : t == DS4_CLI_THINK ? "think" : "think-max";
}

static void set_mode(ds4_cli_chat *c, ds4_cli_think t)
{
    c->opt.think = t;
    if (t == DS4_CLI_THINK_MAX && c->opt.ctx < DS4_CLI_THINK_MAX_MIN_CTX)
        printf("mode: think-max needs ctx >= %d (now %d); using normal thinking until /ctx is raised\n",
               DS4_CLI_THINK_MAX_MIN_CTX, c->opt.ctx);
    else
        printf("mode: %s\n", mode_name(t));
}

static void save(ds4_cli_chat *c, const char *path)
{
    json_t *doc = json_pack("{s:O,s:s}", "messages", c->messages, "mode", mode_name(c->opt.think));
    if (!doc || json_dump_file(doc, path, JSON_INDENT(2) | JSON_ENSURE_ASCII) != 0)
        fprintf(stderr, "ds4: cannot write %s: %s\n", path, strerror(errno));
    else
        printf("saved %zu messages to %s\n", json_array_size(c->messages), path);
    json_decref(doc);
}

static void load(ds4_cli_chat *c, const char *path)
{
    json_error_t err;
    json_t *doc = json_load_file(path, 0, &err);
    json_t *msgs = json_is_array(doc) ? doc : json_object_get(doc, "messages");
    if (!json_is_array(msgs)) {
        fprintf(stderr, "ds4: %s: %s\n", path, doc ? "no \"messages\" array" : err.text);
        json_decref(doc);
        return;
    }
    json_t *old = c->messages;
    c->messages = json_deep_copy(msgs);
    json_decref(doc);
    printf("loaded %zu messages from %s\n", json_array_size(c->messages), path);
    if (!ds4_cli_chat_rebuild(c)) {
        fprintf(stderr, "ds4: could not restore the conversation; starting empty\n");
        json_decref(c->messages);
        c->messages = json_array();
        ds4_cli_chat_rebuild(c);
    }
    json_decref(old);
}

static char *skip_ws(char *s)
{
    while (*s == ' ' || *s == '\t') s++;
    return s;
}

/* Returns false to leave. */
static bool command(ds4_cli_chat *c, char *line)
{
    char *arg = line;
    while (*arg && *arg != ' ' && *arg != '\t') arg++;
    if (*arg) *arg++ = '\0';
    arg = skip_ws(arg);
    size_t al = strlen(arg);
    while (al && (arg[al - 1] == ' ' || arg[al - 1] == '\t')) arg[--al] = '\0';

    if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) return false;
    if (!strcmp(line, "/help")) {
        print_help();
    } else if (!strcmp(line, "/think")) {
        set_mode(c, DS4_CLI_THINK);
    } else if (!strcmp(line, "/think-max")) {
        set_mode(c, DS4_CLI_THINK_MAX);
    } else if (!strcmp(line, "/nothink")) {
        set_mode(c, DS4_CLI_NOTHINK);
    } else if (!strcmp(line, "/ctx")) {
        char *end;
        long n = strtol(arg, &end, 10);
        if (!*arg || *end || n < 16 || n > (1 << 24)) {
            fprintf(stderr, "usage: /ctx N (16..16777216)\n");
        } else {
            c->opt.ctx = (int)n;
            printf("ctx: %d\n", c->opt.ctx);
            if (!ds4_cli_chat_rebuild(c)) fprintf(stderr, "ds4: the session could not be rebuilt\n");
        }
    } else if (!strcmp(line, "/read")) {
        size_t len;
        char *text = *arg ? ds4_cli_read_file(arg, &len) : NULL;
        if (!*arg) fprintf(stderr, "usage: /read FILE\n");
        if (text) ds4_cli_chat_turn(c, text, len, true);
        free(text);
    } else if (!strcmp(line, "/save")) {
        if (*arg) save(c, arg);
        else fprintf(stderr, "usage: /save FILE\n");
    } else if (!strcmp(line, "/load")) {
        if (*arg) load(c, arg);
        else fprintf(stderr, "usage: /load FILE\n");
    } else {
        fprintf(stderr, "unknown command %s (try /help)\n", line);
    }
    return true;
}

int ds4_cli_repl(ds4_cli_chat *c)
{
    ds4_cli_install_sigint();
    printf("ds4 interactive chat, mode %s, ctx %d. /help for commands, /quit to leave.\n", mode_name(c->opt.think),
           c->opt.ctx);
    fflush(stdout);
    for (;;) {
        char *line = ds4_cli_prompt_line("ds4> ");
        if (!line) break;
        char *s = skip_ws(line);
        if (!*s) {
            free(line);
            continue;
        }
        add_history(s);
        bool go_on = true;
        if (s[0] == '/') go_on = command(c, s);
        else ds4_cli_chat_turn(c, s, strlen(s), true);
        free(line);
        fflush(stdout);
        if (!go_on) break;
    }
    return 0;
}

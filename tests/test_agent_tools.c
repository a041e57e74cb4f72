/*
 * test_agent_tools.c - ds4-agent's tools on a real directory tree: every
 * escape from the workspace is refused (and nothing outside is touched),
 * the shell tool kills a hanging command (and what it started) at the
 * timeout, caps output, and passes a clean environment; read, edit, glob,
 * list and search give what the files on disk say.
 *
 * Expected values come from the file system (files created and inspected
 * with plain stdio/stat here), from /bin/sh and kill(2), not from the code
 * under test.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent/agent_shell.h"
#include "agent/agent_tools.h"
#include "agent/agent_workspace.h"
#include "tests/test.h"

static char g_root[256];    /* holds ws/ and outside/ */
static char g_ws[300], g_out[300];
static agent_workspace g_w;
static agent_tools g_t;
static volatile sig_atomic_t g_stop;

static void put_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static char *slurp(const char *path)
{
    size_t n;
    return test_read_file(path, &n);
}

static bool setup(void)
{
    snprintf(g_root, sizeof g_root, "/tmp/ds4-test-agent-%d-XXXXXX", (int)getpid());
    if (!mkdtemp(g_root)) return false;
    snprintf(g_ws, sizeof g_ws, "%s/ws", g_root);
    snprintf(g_out, sizeof g_out, "%s/outside", g_root);
    mkdir(g_ws, 0700);
    mkdir(g_out, 0700);
    char p[600];
    snprintf(p, sizeof p, "%s/secret.txt", g_out);
    put_file(p, "top secret\n");
    snprintf(p, sizeof p, "%s/src", g_ws);
    mkdir(p, 0700);
    snprintf(p, sizeof p, "%s/src/main.c", g_ws);
    put_file(p, "#include <stdio.h>\nint main(void)\n{\n    printf(\"helo\\n\");\n    return 0;\n}\n");
    snprintf(p, sizeof p, "%s/src/util.h", g_ws);
    put_file(p, "int add(int a, int b);\n");
    snprintf(p, sizeof p, "%s/README", g_ws);
    put_file(p, "one\ntwo\nthree\nfour\nfive\n");
    /* links out of the workspace: a directory, a file, a dangling one */
    snprintf(p, sizeof p, "%s/outlink", g_ws);
    if (symlink(g_out, p) != 0) return false;
    snprintf(p, sizeof p, "%s/secretlink", g_ws);
    char target[600];
    snprintf(target, sizeof target, "%s/secret.txt", g_out);
    if (symlink(target, p) != 0) return false;
    snprintf(p, sizeof p, "%s/dangling", g_ws);
    snprintf(target, sizeof target, "%s/created-through-link.txt", g_out);
    if (symlink(target, p) != 0) return false;
    /* a link that stays inside is fine */
    snprintf(p, sizeof p, "%s/readme-link", g_ws);
    if (symlink("README", p) != 0) return false;
    char err[256];
    if (!agent_ws_open(&g_w, g_ws, err, sizeof err)) return false;
    g_t = (agent_tools){.ws = &g_w, .set = AGENT_TOOLSET_CODING, .cmd_timeout_ms = 10000, .output_cap = 4096,
                        .confirm = NULL, .stop = &g_stop};
    return true;
}

static char *call(const char *name, const char *args, bool *failed)
{
    bool f;
    char *r = agent_tools_call(&g_t, name, args, failed ? failed : &f);
    return r ? r : strdup("(null)");
}

static void test_escapes_refused(void)
{
    char outside_abs[700];
    snprintf(outside_abs, sizeof outside_abs, "%s/secret.txt", g_out);
    char outside_new[700];
    snprintf(outside_new, sizeof outside_new, "%s/new.txt", g_out);
    /* (tool, argument JSON) pairs that must all be refused */
    char cases[20][900];
    int n = 0;
    snprintf(cases[n++], 900, "read\t{\"path\": \"../outside/secret.txt\"}");
    snprintf(cases[n++], 900, "read\t{\"path\": \"src/../../outside/secret.txt\"}");
    snprintf(cases[n++], 900, "read\t{\"path\": \"%s\"}", outside_abs);
    snprintf(cases[n++], 900, "read\t{\"path\": \"/etc/passwd\"}");
    snprintf(cases[n++], 900, "read\t{\"path\": \"outlink/secret.txt\"}");
    snprintf(cases[n++], 900, "read\t{\"path\": \"secretlink\"}");
    snprintf(cases[n++], 900, "write\t{\"path\": \"../outside/new.txt\", \"content\": \"x\"}");
    snprintf(cases[n++], 900, "write\t{\"path\": \"%s\", \"content\": \"x\"}", outside_new);
    snprintf(cases[n++], 900, "write\t{\"path\": \"outlink/new.txt\", \"content\": \"x\"}");
    snprintf(cases[n++], 900, "write\t{\"path\": \"dangling\", \"content\": \"x\"}");
    snprintf(cases[n++], 900, "write\t{\"path\": \"secretlink\", \"content\": \"pwned\"}");
    snprintf(cases[n++], 900, "edit\t{\"path\": \"secretlink\", \"old_text\": \"top\", \"new_text\": \"pwned\"}");
    snprintf(cases[n++], 900, "list\t{\"path\": \"..\"}");
    snprintf(cases[n++], 900, "list\t{\"path\": \"outlink\"}");
    snprintf(cases[n++], 900, "search\t{\"pattern\": \"secret\", \"path\": \"outlink\"}");
    snprintf(cases[n++], 900, "search\t{\"pattern\": \"secret\", \"path\": \"../outside\"}");
    snprintf(cases[n++], 900, "glob\t{\"pattern\": \"../outside/*\"}");
    snprintf(cases[n++], 900, "read\t{\"path\": \"a\\u0000/../../outside/secret.txt\"}");
    for (int i = 0; i < n; i++) {
        char *tab = strchr(cases[i], '\t');
        *tab = '\0';
        bool failed = false;
        char *r = call(cases[i], tab + 1, &failed);
        EXPECT_MSG(failed && !strncmp(r, "error:", 6) && !strstr(r, "top secret"),
                   "%s %s was not refused: %s", cases[i], tab + 1, r);
        free(r);
    }
    /* nothing outside changed or appeared */
    char *s = slurp(outside_abs);
    EXPECT(s && !strcmp(s, "top secret\n"));
    free(s);
    EXPECT(access(outside_new, F_OK) != 0);
    char p[700];
    snprintf(p, sizeof p, "%s/created-through-link.txt", g_out);
    EXPECT(access(p, F_OK) != 0);
    /* search over the whole workspace does not follow the link out */
    char *r = call("search", "{\"pattern\": \"top secret\"}", NULL);
    EXPECT_MSG(!strstr(r, "outside") && strstr(r, "no match"), "search crossed a link: %s", r);
    free(r);
}

static void test_inside_paths_allowed(void)
{
    char abs[700];
    snprintf(abs, sizeof abs, "{\"path\": \"%s/README\", \"start_line\": 2, \"end_line\": 3}", g_ws);
    bool failed = true;
    char *r = call("read", abs, &failed);
    EXPECT_MSG(!failed && strstr(r, "2\ttwo\n") && strstr(r, "3\tthree\n") && !strstr(r, "four"), "%s", r);
    free(r);
    r = call("read", "{\"path\": \"src/../readme-link\", \"start_line\": \"5\"}", &failed);
    EXPECT_MSG(!failed && strstr(r, "5\tfive\n") && !strstr(r, "four"), "%s", r);
    free(r);
}

/* a one-line file longer than the cap: its head, and how much is left */
static void test_read_long_line(void)
{
    char p[700];
    snprintf(p, sizeof p, "%s/long.txt", g_ws);
    FILE *f = fopen(p, "w");
    REQUIRE(f);
    for (int i = 0; i < 10000; i++) fputc('a' + i % 26, f);
    fclose(f);
    bool failed = true;
    char *r = call("read", "{\"path\": \"long.txt\"}", &failed);
    EXPECT_MSG(!failed && !strncmp(r, "     1\tabcdef", 13) && strstr(r, "goes on for 5904 more bytes"), "%.200s", r);
    free(r);
    unlink(p);
}

static void test_write_edit(void)
{
    bool failed = true;
    char *r = call("write", "{\"path\": \"new/dir/a.txt\", \"content\": \"alpha beta\\nbeta\\n\"}", &failed);
    EXPECT_MSG(!failed, "%s", r);
    free(r);
    char p[700];
    snprintf(p, sizeof p, "%s/new/dir/a.txt", g_ws);
    char *s = slurp(p);
    EXPECT(s && !strcmp(s, "alpha beta\nbeta\n"));
    free(s);
    r = call("edit", "{\"path\": \"new/dir/a.txt\", \"old_text\": \"beta\", \"new_text\": \"gamma\"}", &failed);
    EXPECT_MSG(failed && strstr(r, "occurs 2 times"), "%s", r);
    free(r);
    r = call("edit", "{\"path\": \"new/dir/a.txt\", \"old_text\": \"delta\", \"new_text\": \"x\"}", &failed);
    EXPECT_MSG(failed && strstr(r, "does not occur"), "%s", r);
    free(r);
    r = call("edit", "{\"path\": \"new/dir/a.txt\", \"old_text\": \"\\nbeta\\n\", \"new_text\": \"\\nBETA\\n\"}", &failed);
    EXPECT_MSG(!failed && strstr(r, "replaced 1 occurrence"), "%s", r);
    free(r);
    s = slurp(p);
    EXPECT_MSG(s && !strcmp(s, "alpha beta\nBETA\n"), "file now: %s", s ? s : "(none)");
    free(s);
    r = call("edit", "{\"path\": \"new/dir/a.txt\", \"old_text\": \"a\", \"new_text\": \"4\", \"replace_all\": true}",
             &failed);
    EXPECT_MSG(!failed && strstr(r, "replaced 3 occurrences"), "%s", r);
    free(r);
    s = slurp(p);
    EXPECT_MSG(s && !strcmp(s, "4lph4 bet4\nBETA\n"), "file now: %s", s ? s : "(none)");
    free(s);
}

static bool g_said_no;
static bool deny(void *ud, const char *what)
{
    (void)ud;
    (void)what;
    g_said_no = true;
    return false;
}

static void test_confirmation_refused(void)
{
    agent_tools keep = g_t;
    g_t.confirm = deny;
    bool failed = false;
    char *r = call("write", "{\"path\": \"denied.txt\", \"content\": \"x\"}", &failed);
    EXPECT_MSG(failed && g_said_no && strstr(r, "did not allow"), "%s", r);
    free(r);
    char p[700];
    snprintf(p, sizeof p, "%s/denied.txt", g_ws);
    EXPECT(access(p, F_OK) != 0);
    r = call("shell", "{\"command\": \"touch ran.txt\"}", &failed);
    EXPECT_MSG(failed && strstr(r, "did not allow"), "%s", r);
    free(r);
    snprintf(p, sizeof p, "%s/ran.txt", g_ws);
    EXPECT(access(p, F_OK) != 0);
    g_t = keep;
}

static void test_list_glob_search(void)
{
    char *r = call("list", "{}", NULL);
    EXPECT_MSG(strstr(r, "README\n") && strstr(r, "src/\n") && strstr(r, "outlink@\n"), "%s", r);
    free(r);
    r = call("glob", "{\"pattern\": \"**/*.c\"}", NULL);
    EXPECT_MSG(!strcmp(r, "src/main.c\n"), "%s", r);
    free(r);
    r = call("glob", "{\"pattern\": \"src/*.h\"}", NULL);
    EXPECT_MSG(!strcmp(r, "src/util.h\n"), "%s", r);
    free(r);
    r = call("search", "{\"pattern\": \"print[f]\\\\(\\\"h\", \"glob\": \"*.c\"}", NULL);
    EXPECT_MSG(!strcmp(r, "src/main.c:4:     printf(\"helo\\n\");\n"), "%s", r);
    free(r);
    bool failed = false;
    r = call("search", "{\"pattern\": \"(unclosed\"}", &failed);
    EXPECT_MSG(failed && strstr(r, "bad regular expression"), "%s", r);
    free(r);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void test_shell_timeout_kills_group(void)
{
    /* a hanging command that also started a background child */
    g_t.cmd_timeout_ms = 1000;
    double t0 = now_s();
    bool failed = false;
    char *r = call("shell", "{\"command\": \"sleep 300 & echo $! > bg.pid; echo started; sleep 300\"}", &failed);
    double dt = now_s() - t0;
    g_t.cmd_timeout_ms = 10000;
    EXPECT_MSG(failed && strstr(r, "did not finish within 1 s") && strstr(r, "started"), "%s", r);
    EXPECT_MSG(dt < 5.0, "took %.1f s", dt);
    free(r);
    char p[700];
    snprintf(p, sizeof p, "%s/bg.pid", g_ws);
    char *s = slurp(p);
    REQUIRE(s);
    pid_t bg = (pid_t)atoi(s);
    free(s);
    /* the background sleep was in the command's process group: gone (or a
     * zombie reaped by init shortly) */
    bool gone = false;
    for (int i = 0; i < 50 && !gone; i++) {
        char st[64];
        snprintf(st, sizeof st, "/proc/%d/stat", (int)bg);
        FILE *f = fopen(st, "r");
        if (!f) {
            gone = true;
            break;
        }
        char state = 0;
        if (fscanf(f, "%*d %*s %c", &state) == 1 && state == 'Z') gone = true;
        fclose(f);
        if (!gone) usleep(20000);
    }
    EXPECT_MSG(gone, "background process %d survived the timeout", (int)bg);
}

static void test_shell_env_cwd_cap(void)
{
    setenv("DS4_TEST_SECRET_TOKEN", "hunter2", 1);
    bool failed = true;
    char *r = call("shell", "{\"command\": \"env; pwd; exit 3\"}", &failed);
    EXPECT_MSG(failed && strstr(r, "exit status 3\n"), "%s", r);
    EXPECT_MSG(!strstr(r, "hunter2") && !strstr(r, "DS4_TEST_SECRET"), "the secret leaked: %s", r);
    EXPECT(strstr(r, "TERM=dumb") != NULL);
    char want[400];
    snprintf(want, sizeof want, "\n%s\n", g_w.root);
    EXPECT_MSG(strstr(r, want) != NULL, "cwd is not the workspace: %s", r);
    free(r);
    /* 100000 lines of output: head and tail kept, the middle cut and said */
    r = call("shell", "{\"command\": \"seq 1 100000\"}", &failed);
    EXPECT_MSG(!failed && strlen(r) < 4096 + 200, "%zu bytes", strlen(r));
    EXPECT_MSG(strstr(r, "\n1\n2\n3\n") && strstr(r, "\n99999\n100000\n") && strstr(r, "bytes of output cut"), "%.300s", r);
    free(r);
}

static void test_shell_interrupt(void)
{
    /* Ctrl-C while a command runs: it is killed, the model is told */
    g_stop = 1;
    double t0 = now_s();
    bool failed = false;
    char *r = call("shell", "{\"command\": \"sleep 60\"}", &failed);
    g_stop = 0;
    EXPECT_MSG(failed && strstr(r, "interrupted"), "%s", r);
    EXPECT(now_s() - t0 < 5.0);
    free(r);
}

static void test_demo_tools(void)
{
    agent_tools d = g_t;
    d.set = AGENT_TOOLSET_DEMO;
    bool failed = true;
    char *r = agent_tools_call(&d, "add", "{\"a\": 1234, \"b\": \"4321\"}", &failed);
    EXPECT_MSG(!failed && !strcmp(r, "5555"), "%s", r);
    free(r);
    r = agent_tools_call(&d, "get_weather", "{\"location\": \"Paris\"}", &failed);
    EXPECT_MSG(!failed && strstr(r, "\"temperature\": ") && strstr(r, "\"condition\": "), "%s", r);
    free(r);
    r = agent_tools_call(&d, "shell", "{\"command\": \"true\"}", &failed);
    EXPECT_MSG(failed && strstr(r, "unknown tool"), "%s", r);
    free(r);
    json_t *s = agent_tools_schemas(AGENT_TOOLSET_DEMO);
    EXPECT(json_array_size(s) == 3);
    json_decref(s);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    if (!setup()) {
        fprintf(stderr, "setup failed: %s\n", strerror(errno));
        return 1;
    }
    RUN(test_escapes_refused);
    RUN(test_inside_paths_allowed);
    RUN(test_read_long_line);
    RUN(test_write_edit);
    RUN(test_confirmation_refused);
    RUN(test_list_glob_search);
    RUN(test_shell_timeout_kills_group);
    RUN(test_shell_env_cwd_cap);
    RUN(test_shell_interrupt);
    RUN(test_demo_tools);
    agent_ws_close(&g_w);
    test_remove_dir(g_root);
    return test_finish();
}

/*
 * agent_shell.c - the shell tool's process handling (see agent_shell.h).
 */
#include "agent/agent_shell.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KILL_GRACE_MS 1000  /* SIGTERM, then SIGKILL after this */
#define DRAIN_GRACE_MS 300  /* after the shell exits, background children holding the pipe */

static const char *const PASS_ENV[] = {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ",
                                       "TMPDIR"};
#define N_PASS (sizeof PASS_ENV / sizeof PASS_ENV[0])

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

typedef struct {
    size_t cap;          /* total kept: head cap/2 + tail cap/2 */
    char *head;
    size_t n_head;
    char *tail;          /* ring */
    size_t n_tail, tail_pos;
    size_t dropped;
} capture;

static void capture_add(capture *c, const char *b, size_t n)
{
    size_t hcap = c->cap / 2, tcap = c->cap - hcap;
    while (n && c->n_head < hcap) {
        c->head[c->n_head++] = *b++;
        n--;
    }
    for (size_t i = 0; i < n; i++) {
        if (tcap == 0) {
            c->dropped++;
            continue;
        }
        if (c->n_tail == tcap) c->dropped++;
        else c->n_tail++;
        c->tail[c->tail_pos] = b[i];
        c->tail_pos = (c->tail_pos + 1) % tcap;
    }
}

static char *capture_take(capture *c, size_t *len)
{
    size_t tcap = c->cap - c->cap / 2;
    char note[96] = "";
    if (c->dropped) snprintf(note, sizeof note, "\n[... %zu bytes of output cut ...]\n", c->dropped);
    size_t nl = strlen(note);
    char *out = malloc(c->n_head + nl + c->n_tail + 1);
    if (!out) return NULL;
    memcpy(out, c->head, c->n_head);
    memcpy(out + c->n_head, note, nl);
    size_t k = c->n_head + nl;
    size_t start = c->n_tail == tcap ? c->tail_pos : 0;
    for (size_t i = 0; i < c->n_tail; i++) out[k++] = c->tail[(start + i) % (tcap ? tcap : 1)];
    out[k] = '\0';
    *len = k;
    return out;
}

void agent_shell_result_free(agent_shell_result *r)
{
    free(r->output);
    memset(r, 0, sizeof *r);
}

int agent_shell_run(const char *cwd, const char *cmd, int timeout_ms, size_t cap, volatile sig_atomic_t *stop,
                    agent_shell_result *r, char *err, size_t es)
{
    memset(r, 0, sizeof *r);
    if (cap < 64) cap = 64;
    /* environment first: nothing may be allocated in the child */
    char *envp[N_PASS + 3];
    size_t ne = 0;
    for (size_t i = 0; i < N_PASS; i++) {
        const char *v = getenv(PASS_ENV[i]);
        if (!v) continue;
        size_t l = strlen(PASS_ENV[i]) + strlen(v) + 2;
        if ((envp[ne] = malloc(l))) snprintf(envp[ne++], l, "%s=%s", PASS_ENV[i], v);
    }
    if (!getenv("PATH") && (envp[ne] = strdup("PATH=/usr/local/bin:/usr/bin:/bin"))) ne++;
    if ((envp[ne] = strdup("TERM=dumb"))) ne++;
    size_t pl = strlen(cwd) + 5;
    if ((envp[ne] = malloc(pl))) snprintf(envp[ne++], pl, "PWD=%s", cwd);
    envp[ne] = NULL;

    int fds[2];
    capture c = {.cap = cap, .head = malloc(cap / 2 + 1), .tail = malloc(cap - cap / 2 + 1)};
    int rc = -1;
    if (!c.head || !c.tail) {
        snprintf(err, es, "out of memory");
        goto out;
    }
    if (pipe2(fds, O_CLOEXEC) != 0) {
        snprintf(err, es, "pipe: %s", strerror(errno));
        goto out;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, es, "fork: %s", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        goto out;
    }
    if (pid == 0) {
        setpgid(0, 0);
        signal(SIGINT, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0) dup2(devnull, 0);
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        if (chdir(cwd) != 0) {
            dprintf(2, "cannot enter the workspace %s: %s\n", cwd, strerror(errno));
            _exit(126);
        }
        char *argv[] = {"sh", "-c", (char *)cmd, NULL};
        execve("/bin/sh", argv, envp);
        dprintf(2, "cannot run /bin/sh: %s\n", strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid); /* also here: no race with the child's own call */
    close(fds[1]);
    int64_t t0 = now_ms(), term_at = -1, exited_at = -1;
    int status = 0;
    bool reaped = false, eof = false;
    while (!eof || !reaped) {
        int64_t t = now_ms();
        if (!reaped) {
            pid_t w = waitpid(pid, &status, WNOHANG);
            if (w == pid) {
                reaped = true;
                exited_at = t;
            }
        }
        if (reaped && !eof && t - exited_at > DRAIN_GRACE_MS) {
            /* the shell is gone but something it started holds the pipe */
            kill(-pid, SIGKILL);
            break;
        }
        if (term_at < 0 && !reaped) {
            if (timeout_ms > 0 && t - t0 >= timeout_ms) r->timed_out = true;
            if (stop && *stop) r->interrupted = true;
            if (r->timed_out || r->interrupted) {
                kill(-pid, SIGTERM);
                term_at = t;
            }
        } else if (term_at >= 0 && !reaped && t - term_at >= KILL_GRACE_MS) {
            kill(-pid, SIGKILL);
        }
        if (eof) {
            struct timespec ts = {0, 20 * 1000000};
            nanosleep(&ts, NULL);
            continue;
        }
        struct pollfd pfd = {fds[0], POLLIN, 0};
        int pr = poll(&pfd, 1, 50);
        if (pr > 0) {
            char buf[8192];
            ssize_t n = read(fds[0], buf, sizeof buf);
            if (n > 0) capture_add(&c, buf, (size_t)n);
            else if (n == 0 || (errno != EINTR && errno != EAGAIN)) eof = true;
        }
    }
    close(fds[0]);
    if (!reaped) waitpid(pid, &status, 0);
    r->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
    r->dropped = c.dropped;
    r->output = capture_take(&c, &r->len);
    if (!r->output) {
        snprintf(err, es, "out of memory");
        goto out;
    }
    rc = 0;
out:
    free(c.head);
    free(c.tail);
    for (size_t i = 0; i < ne; i++) free(envp[i]);
    return rc;
}

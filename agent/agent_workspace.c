/*
 * agent_workspace.c - path confinement (see agent_workspace.h).
 */
#include "agent/agent_workspace.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

bool agent_ws_open(agent_workspace *ws, const char *dir, char *err, size_t es)
{
    memset(ws, 0, sizeof *ws);
    ws->root = realpath(dir, NULL);
    if (!ws->root) {
        snprintf(err, es, "workspace %s: %s", dir, strerror(errno));
        return false;
    }
    ws->root_len = strlen(ws->root);
    return true;
}

void agent_ws_close(agent_workspace *ws)
{
    free(ws->root);
    memset(ws, 0, sizeof *ws);
}

static bool inside(const agent_workspace *ws, const char *p)
{
    if (!strcmp(ws->root, "/")) return p[0] == '/';
    return !strncmp(p, ws->root, ws->root_len) && (p[ws->root_len] == '\0' || p[ws->root_len] == '/');
}

/* Collapse "//", "." and ".." of an absolute path in place; false when
 * ".." would climb above "/". */
static bool normalize(char *p)
{
    char *out = p; /* p[0] == '/' */
    const char *s = p;
    size_t n = 0;  /* bytes in out */
    while (*s) {
        while (*s == '/') s++;
        if (!*s) break;
        const char *e = strchr(s, '/');
        size_t l = e ? (size_t)(e - s) : strlen(s);
        if (l == 1 && s[0] == '.') {
            /* skip */
        } else if (l == 2 && s[0] == '.' && s[1] == '.') {
            if (n == 0) return false;
            while (n > 0 && out[n - 1] != '/') n--;
            if (n > 0) n--; /* the '/' before the dropped component */
        } else {
            memmove(out + n + 1, s, l);
            out[n] = '/';
            n += l + 1;
        }
        s += l;
    }
    if (n == 0) out[n++] = '/';
    out[n] = '\0';
    return true;
}

char *agent_ws_resolve(const agent_workspace *ws, const char *path, bool must_exist, char *err, size_t es)
{
    if (!path || !*path) {
        snprintf(err, es, "error: empty path");
        return NULL;
    }
    size_t need = ws->root_len + strlen(path) + 2;
    char *p = malloc(need);
    if (!p) {
        snprintf(err, es, "error: out of memory");
        return NULL;
    }
    if (path[0] == '/') snprintf(p, need, "%s", path);
    else snprintf(p, need, "%s/%s", ws->root, path);
    if (!normalize(p) || !inside(ws, p)) {
        snprintf(err, es, "error: %s is outside the workspace %s; only paths inside it are allowed", path,
                 ws->root);
        free(p);
        return NULL;
    }
    /* The longest existing prefix, symlinks resolved, must stay inside. */
    size_t len = strlen(p);
    size_t cut = len;
    char *real = NULL;
    for (;;) {
        char save = p[cut];
        p[cut] = '\0';
        real = realpath(p, NULL);
        int e = errno;
        p[cut] = save;
        if (real) break;
        if (e != ENOENT && e != ENOTDIR) {
            snprintf(err, es, "error: %s: %s", path, strerror(e));
            free(p);
            return NULL;
        }
        struct stat st;
        p[cut] = '\0';
        bool dangling = lstat(p, &st) == 0; /* exists, but as a link to nowhere */
        p[cut] = save;
        if (dangling) {
            snprintf(err, es, "error: %s goes through a symlink whose target does not exist; refused", path);
            free(p);
            return NULL;
        }
        if (must_exist) {
            snprintf(err, es, "error: %s does not exist", path);
            free(p);
            return NULL;
        }
        while (cut > 0 && p[cut - 1] != '/') cut--;
        if (cut > 0) cut--;
        if (cut == 0) break; /* "/" always exists; not reached */
    }
    if (!real || !inside(ws, real)) {
        snprintf(err, es, "error: %s leads outside the workspace (through a symlink); refused", path);
        free(real);
        free(p);
        return NULL;
    }
    size_t rl = strlen(real), tail = len - cut;
    char *out = malloc(rl + tail + 1);
    if (out) {
        memcpy(out, real, rl);
        memcpy(out + rl, p + cut, tail);
        out[rl + tail] = '\0';
    } else {
        snprintf(err, es, "error: out of memory");
    }
    free(real);
    free(p);
    return out;
}

const char *agent_ws_rel(const agent_workspace *ws, const char *abs)
{
    if (!strcmp(ws->root, "/")) return abs[1] ? abs + 1 : ".";
    if (!inside(ws, abs)) return abs;
    const char *r = abs + ws->root_len;
    return *r == '/' ? r + 1 : ".";
}

/*
 * agent_tool_find.c - the list, glob and search tools (agent_tools.h).
 *
 * Walks never follow symlinks (a link to a directory outside must not
 * widen the search), skip .git, and stop after MAX_VISIT entries so a huge
 * tree cannot stall the agent.
 */
#include "agent/agent_tools_impl.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <dirent.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_VISIT 50000
#define MAX_DEPTH 32
#define MAX_HITS 200
#define MAX_SEARCH_FILE (4u << 20)

/* Glob match of a relative path: * and ? stay within one component, **
 * spans components ("**" + "/" also matches no directory at all). */
static bool glob_match(const char *p, const char *s)
{
    for (;;) {
        if (p[0] == '*' && p[1] == '*') {
            if (p[2] == '/') {
                if (glob_match(p + 3, s)) return true;
                for (const char *q = s; *q; q++)
                    if (*q == '/' && glob_match(p + 3, q + 1)) return true;
                return false;
            }
            for (const char *q = s;; q++) {
                if (glob_match(p + 2, q)) return true;
                if (!*q) return false;
            }
        }
        if (*p == '*') {
            for (const char *q = s;; q++) {
                if (glob_match(p + 1, q)) return true;
                if (!*q || *q == '/') return false;
            }
        }
        if (!*p) return !*s;
        if (!*s) return false;
        if (*p == '?' ? *s == '/' : *p != *s) return false;
        p++;
        s++;
    }
}

typedef struct {
    char **v;
    size_t n, cap;
    size_t visited;
    bool truncated;
} path_list;

static void list_add(path_list *l, const char *s)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        char **q = realloc(l->v, cap * sizeof *q);
        if (!q) return;
        l->v = q;
        l->cap = cap;
    }
    if ((l->v[l->n] = strdup(s))) l->n++;
}

static void list_free(path_list *l)
{
    for (size_t i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Every regular file under abs (relative names rel/...), into l. */
static void walk(const char *abs, const char *rel, int depth, path_list *l)
{
    if (depth > MAX_DEPTH) return;
    DIR *d = opendir(abs);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, ".git")) continue;
        if (++l->visited > MAX_VISIT) {
            l->truncated = true;
            break;
        }
        size_t al = strlen(abs) + strlen(e->d_name) + 2, rl = strlen(rel) + strlen(e->d_name) + 2;
        char *a = malloc(al), *r = malloc(rl);
        if (a && r) {
            snprintf(a, al, "%s/%s", abs, e->d_name);
            if (*rel) snprintf(r, rl, "%s/%s", rel, e->d_name);
            else snprintf(r, rl, "%s", e->d_name);
            struct stat st;
            if (lstat(a, &st) == 0) {
                if (S_ISDIR(st.st_mode)) walk(a, r, depth + 1, l);
                else if (S_ISREG(st.st_mode)) list_add(l, r);
            }
        }
        free(a);
        free(r);
    }
    closedir(d);
}

char *agent_tool_list(agent_tools *t, const json_t *args, bool *failed)
{
    const char *path = agent_arg_str(args, "path");
    if (!path || !*path) path = ".";
    char err[1024];
    char *abs = agent_ws_resolve(t->ws, path, true, err, sizeof err);
    if (!abs) return agent_tool_error(failed, "%s", err);
    DIR *d = opendir(abs);
    if (!d) {
        free(abs);
        return agent_tool_error(failed, "%s is not a directory", path);
    }
    path_list l = {0};
    struct dirent *e;
    while ((e = readdir(d)) && l.n < MAX_VISIT) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        size_t al = strlen(abs) + strlen(e->d_name) + 2;
        char *a = malloc(al);
        if (!a) continue;
        snprintf(a, al, "%s/%s", abs, e->d_name);
        struct stat st;
        char name[NAME_MAX + 3];
        if (lstat(a, &st) == 0) {
            snprintf(name, sizeof name, "%s%s", e->d_name, S_ISDIR(st.st_mode) ? "/" : S_ISLNK(st.st_mode) ? "@" : "");
            list_add(&l, name);
        }
        free(a);
    }
    closedir(d);
    qsort(l.v, l.n, sizeof *l.v, cmp_str);
    agent_buf b = {0};
    for (size_t i = 0; i < l.n && b.n < t->output_cap; i++) agent_buf_printf(&b, "%s\n", l.v[i]);
    if (l.n == 0) agent_buf_printf(&b, "[%s is empty]\n", agent_ws_rel(t->ws, abs));
    list_free(&l);
    free(abs);
    return agent_buf_take(&b);
}

/* Files under the workspace (or under `under`) whose relative path matches
 * pattern (NULL: all). */
static bool collect(agent_tools *t, const char *under, const char *pattern, path_list *out, char *err, size_t es)
{
    char *abs = agent_ws_resolve(t->ws, under && *under ? under : ".", true, err, es);
    if (!abs) return false;
    struct stat st;
    const char *rel = agent_ws_rel(t->ws, abs);
    if (stat(abs, &st) == 0 && S_ISREG(st.st_mode)) {
        list_add(out, rel);
    } else {
        path_list all = {0};
        walk(abs, strcmp(rel, ".") ? rel : "", 0, &all);
        for (size_t i = 0; i < all.n; i++) {
            const char *base = strrchr(all.v[i], '/');
            base = base ? base + 1 : all.v[i];
            /* a pattern without '/' matches the file name anywhere */
            if (!pattern || glob_match(pattern, strchr(pattern, '/') ? all.v[i] : base)) list_add(out, all.v[i]);
        }
        out->truncated = all.truncated;
        list_free(&all);
    }
    free(abs);
    qsort(out->v, out->n, sizeof *out->v, cmp_str);
    return true;
}

char *agent_tool_glob(agent_tools *t, const json_t *args, bool *failed)
{
    const char *pattern = agent_arg_str(args, "pattern");
    if (!pattern || !*pattern) return agent_tool_error(failed, "glob needs a \"pattern\" string");
    if (pattern[0] == '/' || strstr(pattern, "..")) return agent_tool_error(failed, "the pattern %s would leave the workspace; use a relative pattern", pattern);
    int stars = 0;
    for (const char *p = pattern; *p; p++) stars += *p == '*';
    if (stars > 12) /* the matcher backtracks: bound its work */
        return agent_tool_error(failed, "the pattern %s has more than 12 '*'", pattern);
    char err[1024];
    path_list l = {0};
    if (!collect(t, ".", pattern, &l, err, sizeof err)) return agent_tool_error(failed, "%s", err);
    agent_buf b = {0};
    size_t i = 0;
    for (; i < l.n && b.n < t->output_cap; i++) agent_buf_printf(&b, "%s\n", l.v[i]);
    if (i < l.n) agent_buf_printf(&b, "[... %zu more]\n", l.n - i);
    if (l.truncated) agent_buf_puts(&b, "[the walk stopped early: too many files]\n");
    if (l.n == 0) agent_buf_printf(&b, "[no file matches %s]\n", pattern);
    list_free(&l);
    return agent_buf_take(&b);
}

char *agent_tool_search(agent_tools *t, const json_t *args, bool *failed)
{
    const char *pattern = agent_arg_str(args, "pattern");
    if (!pattern || !*pattern) return agent_tool_error(failed, "search needs a \"pattern\" string");
    int ec;
    PCRE2_SIZE eo;
    uint32_t opts = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | PCRE2_MULTILINE;
    if (agent_arg_bool(args, "ignore_case", false)) opts |= PCRE2_CASELESS;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opts, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return agent_tool_error(failed, "bad regular expression at offset %zu: %s", (size_t)eo, (char *)msg);
    }
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    char err[1024];
    path_list files = {0};
    const char *glob = agent_arg_str(args, "glob");
    if (!md || !collect(t, agent_arg_str(args, "path"), glob && *glob ? glob : NULL, &files, err, sizeof err)) {
        pcre2_match_data_free(md);
        pcre2_code_free(re);
        return agent_tool_error(failed, "%s", md ? err : "out of memory");
    }
    agent_buf b = {0};
    size_t hits = 0;
    for (size_t i = 0; i < files.n && hits < MAX_HITS && b.n < t->output_cap; i++) {
        char *abs = agent_ws_resolve(t->ws, files.v[i], true, err, sizeof err);
        size_t len;
        char *data = abs ? agent_read_whole(abs, MAX_SEARCH_FILE, &len, err, sizeof err) : NULL;
        free(abs);
        if (!data) continue;
        if (memchr(data, '\0', len)) { /* binary */
            free(data);
            continue;
        }
        PCRE2_SIZE off = 0;
        size_t line = 1;
        const char *counted = data;
        while (off <= len && hits < MAX_HITS) {
            int rc = pcre2_match(re, (PCRE2_SPTR)data, len, off, 0, md, NULL);
            if (rc < 0) break;
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            const char *m = data + ov[0];
            for (; counted < m; counted++)
                if (*counted == '\n') line++;
            const char *ls = m;
            while (ls > data && ls[-1] != '\n') ls--;
            const char *le = memchr(m, '\n', (size_t)(data + len - m));
            if (!le) le = data + len;
            size_t show = (size_t)(le - ls) > 300 ? 300 : (size_t)(le - ls);
            agent_buf_printf(&b, "%s:%zu: %.*s\n", files.v[i], line, (int)show, ls);
            hits++;
            off = (PCRE2_SIZE)(le - data) + 1; /* one hit per line */
        }
        free(data);
    }
    if (hits >= MAX_HITS) agent_buf_printf(&b, "[stopped at %d matches]\n", MAX_HITS);
    if (hits == 0) agent_buf_printf(&b, "[no match for %s in %zu files]\n", pattern, files.n);
    list_free(&files);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return agent_buf_take(&b);
}

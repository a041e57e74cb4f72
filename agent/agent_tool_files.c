/*
 * agent_tool_files.c - the read, write and edit tools (agent_tools.h).
 */
#include "agent/agent_tools_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_READ_LINES 2000

char *agent_tool_read(agent_tools *t, const json_t *args, bool *failed)
{
    const char *path = agent_arg_str(args, "path");
    if (!path) return agent_tool_error(failed, "read needs a \"path\" string");
    char err[1024];
    char *abs = agent_ws_resolve(t->ws, path, true, err, sizeof err);
    if (!abs) return agent_tool_error(failed, "%s", err);
    size_t len;
    char *data = agent_read_whole(abs, AGENT_MAX_FILE_BYTES, &len, err, sizeof err);
    free(abs);
    if (!data) return agent_tool_error(failed, "%s", err);
    if (memchr(data, '\0', len)) {
        free(data);
        return agent_tool_error(failed, "%s is a binary file", path);
    }
    long long first = 1, last = -1;
    agent_arg_int(args, "start_line", &first);
    agent_arg_int(args, "end_line", &last);
    if (first < 1) first = 1;
    size_t n_lines = 0;
    for (size_t i = 0; i < len; i++)
        if (data[i] == '\n') n_lines++;
    if (len && data[len - 1] != '\n') n_lines++;
    if (last < 0 || last > (long long)n_lines) last = (long long)n_lines;
    if (n_lines && first > (long long)n_lines) {
        free(data);
        return agent_tool_error(failed, "%s has %zu lines; start_line %lld is past the end", path, n_lines, first);
    }
    agent_buf b = {0};
    long long line = 1, shown = 0;
    size_t bytes_cap = t->output_cap;
    const char *p = data, *end = data + len;
    bool cut = false;
    while (p < end && line <= last) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t l = nl ? (size_t)(nl - p) : (size_t)(end - p);
        if (line >= first) {
            if (shown == 0 && l > bytes_cap) { /* one line longer than the cap: its head */
                size_t k = bytes_cap;
                while (k > 0 && ((unsigned char)p[k] & 0xC0) == 0x80) k--; /* whole characters */
                agent_buf_printf(&b, "%6lld\t", line);
                agent_buf_add(&b, p, k);
                agent_buf_printf(&b, " [... line %lld goes on for %zu more bytes]\n", line, l - k);
                shown = 1;
                line++;
                cut = (long long)n_lines > first;
                break;
            }
            if (shown >= MAX_READ_LINES || b.n + l > bytes_cap) {
                cut = true;
                break;
            }
            agent_buf_printf(&b, "%6lld\t", line);
            agent_buf_add(&b, p, l);
            agent_buf_puts(&b, "\n");
            shown++;
        }
        p += l + (nl ? 1 : 0);
        line++;
    }
    if (cut)
        agent_buf_printf(&b, "[... shown lines %lld-%lld of %zu; read on with start_line=%lld]\n", first,
                         first + shown - 1, n_lines, first + shown);
    else if (n_lines == 0)
        agent_buf_printf(&b, "[%s is empty]\n", path);
    free(data);
    return agent_buf_take(&b);
}

/* mkdir -p for the parent directories of abs (already resolved inside). */
static bool make_parents(const char *abs, char *err, size_t es)
{
    char *dir = strdup(abs);
    if (!dir) return false;
    char *slash = strrchr(dir, '/');
    bool ok = true;
    if (slash && slash != dir) {
        *slash = '\0';
        ok = agent_mkdirs(dir, err, es);
    }
    free(dir);
    return ok;
}

char *agent_tool_write(agent_tools *t, const json_t *args, bool *failed)
{
    const char *path = agent_arg_str(args, "path");
    const json_t *cv = json_object_get(args, "content");
    if (!path || !json_is_string(cv)) return agent_tool_error(failed, "write needs \"path\" and \"content\" strings");
    char err[1024];
    char *abs = agent_ws_resolve(t->ws, path, false, err, sizeof err);
    if (!abs) return agent_tool_error(failed, "%s", err);
    size_t n = json_string_length(cv);
    if (t->confirm) {
        char what[600];
        snprintf(what, sizeof what, "write %zu bytes to %.400s", n, agent_ws_rel(t->ws, abs));
        if (!t->confirm(t->confirm_ud, what)) {
            free(abs);
            return agent_tool_error(failed, "the user did not allow writing %s", path);
        }
    }
    char *r;
    if (!make_parents(abs, err, sizeof err) || !agent_write_atomic(abs, json_string_value(cv), n, err, sizeof err)) {
        r = agent_tool_error(failed, "%s", err);
    } else {
        agent_buf b = {0};
        agent_buf_printf(&b, "wrote %zu bytes to %s", n, agent_ws_rel(t->ws, abs));
        r = agent_buf_take(&b);
    }
    free(abs);
    return r;
}

char *agent_tool_edit(agent_tools *t, const json_t *args, bool *failed)
{
    const char *path = agent_arg_str(args, "path");
    const json_t *ov = json_object_get(args, "old_text"), *nv = json_object_get(args, "new_text");
    if (!path || !json_is_string(ov) || !json_is_string(nv))
        return agent_tool_error(failed, "edit needs \"path\", \"old_text\" and \"new_text\" strings");
    const char *old = json_string_value(ov), *neu = json_string_value(nv);
    size_t ol = json_string_length(ov), nl = json_string_length(nv);
    if (ol == 0) return agent_tool_error(failed, "old_text is empty; use write to create a file");
    bool all = agent_arg_bool(args, "replace_all", false);
    char err[1024];
    char *abs = agent_ws_resolve(t->ws, path, true, err, sizeof err);
    if (!abs) return agent_tool_error(failed, "%s", err);
    size_t len;
    char *data = agent_read_whole(abs, AGENT_MAX_FILE_BYTES, &len, err, sizeof err);
    if (!data) {
        free(abs);
        return agent_tool_error(failed, "%s", err);
    }
    size_t count = 0;
    for (const char *p = data; (p = memmem(p, (size_t)(data + len - p), old, ol)); p += ol) count++;
    char *r = NULL;
    if (count == 0) {
        r = agent_tool_error(failed, "old_text does not occur in %s (it must match exactly, whitespace included)", path);
    } else if (count > 1 && !all) {
        r = agent_tool_error(failed, "old_text occurs %zu times in %s; give more context or set replace_all", count, path);
    } else {
        char what[600];
        snprintf(what, sizeof what, "edit %.400s (%zu replacement%s)", agent_ws_rel(t->ws, abs), count,
                 count == 1 ? "" : "s");
        if (t->confirm && !t->confirm(t->confirm_ud, what)) {
            r = agent_tool_error(failed, "the user did not allow editing %s", path);
        } else {
            agent_buf b = {0};
            const char *p = data, *q;
            while ((q = memmem(p, (size_t)(data + len - p), old, ol))) {
                agent_buf_add(&b, p, (size_t)(q - p));
                agent_buf_add(&b, neu, nl);
                p = q + ol;
            }
            agent_buf_add(&b, p, (size_t)(data + len - p));
            if (b.oom) r = agent_tool_error(failed, "out of memory");
            else if (!agent_write_atomic(abs, b.p ? b.p : "", b.n, err, sizeof err)) r = agent_tool_error(failed, "%s", err);
            agent_buf_free(&b);
            if (!r) {
                agent_buf o = {0};
                agent_buf_printf(&o, "replaced %zu occurrence%s in %s", count, count == 1 ? "" : "s",
                                 agent_ws_rel(t->ws, abs));
                r = agent_buf_take(&o);
            }
        }
    }
    free(data);
    free(abs);
    return r;
}

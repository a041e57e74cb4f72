/*
 * agent_workspace.h - every path the model names is resolved inside the
 * workspace directory, or refused.
 *
 * Refused, with a message the model reads as the tool's result: paths
 * whose ".." steps leave the workspace, absolute paths outside it, and
 * paths that reach outside through a symlink (of a directory on the way or
 * of the file itself). The check resolves the longest existing prefix of
 * the path with realpath(), so a file about to be created is checked
 * through its existing parent directories.
 */
#ifndef DS4_AGENT_WORKSPACE_H
#define DS4_AGENT_WORKSPACE_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    char *root; /* realpath of the workspace, no trailing '/' (except "/") */
    size_t root_len;
} agent_workspace;

/* dir must exist. false with err filled. */
bool agent_ws_open(agent_workspace *ws, const char *dir, char *err, size_t es);
void agent_ws_close(agent_workspace *ws);

/* The real absolute path of `path` (relative to the workspace, or
 * absolute), malloc'd; NULL with err (for the model) when it leaves the
 * workspace, is empty, or (must_exist) does not exist. */
char *agent_ws_resolve(const agent_workspace *ws, const char *path, bool must_exist, char *err, size_t es);

/* `abs` relative to the root ("." for the root itself); abs must be a
 * path agent_ws_resolve returned. */
const char *agent_ws_rel(const agent_workspace *ws, const char *abs);

#endif

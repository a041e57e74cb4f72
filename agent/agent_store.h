/*
 * agent_store.h - named agent sessions on disk, resumable after a restart.
 *
 * DIR/NAME/transcript.json  the conversation and the agent's bookkeeping
 *                            (messages, the exact live text, settings),
 *                            written crash-safely (temp file, fsync,
 *                            rename, directory fsync);
 * DIR/NAME/kv/SHA1.kv        the engine snapshot in the server's disk-cache
 *                            format (engine/kv_disk.h: KVC envelope keyed by
 *                            the SHA1 of the live text, SHA-256 trailer,
 *                            written the same crash-safe way), payload
 *                            [u32 n][n tokens][engine snapshot] as the
 *                            server writes it.
 * Save order: snapshot file, then transcript, then the stale snapshot files
 * go; so at any moment the transcript names a snapshot that exists. Resume
 * restores the snapshot without re-prefill; when it is missing or corrupt
 * (refused by the checksum) the saved token ids (checked to spell the live
 * text) are prefilled again, and the user is told; without usable ids the
 * session is rebuilt from its messages (rendered with template spans).
 */
#ifndef DS4_AGENT_STORE_H
#define DS4_AGENT_STORE_H

#include <stdbool.h>
#include <stddef.h>

#include "agent/agent.h"

/* A name is 1-64 of [A-Za-z0-9._-], not starting with '.'. */
bool agent_store_name_ok(const char *name);

bool agent_store_exists(const char *dir, const char *name);
/* false with err. */
bool agent_store_save(agent *a, const char *dir, const char *name, const char *workspace, char *err, size_t es);
/* Replace a's conversation and session with the saved one. *restored
 * tells whether the snapshot was used (false: re-prefilled). A session
 * saved for another workspace loads, with a warning (its messages name
 * paths of that one). */
bool agent_store_load(agent *a, const char *dir, const char *name, const char *workspace, bool *restored,
                      char *err, size_t es);
/* Print "NAME  updated  messages  tokens" lines, the current one marked. */
void agent_store_list(const char *dir, const char *current, FILE *out);

#endif

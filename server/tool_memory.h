/*
 * tool_memory.h - tool-call ids and the exact-replay map (chat-format §7).
 *
 * Clients send tool calls back as normalised JSON, not as the DSML bytes the
 * model sampled; re-rendering them differently breaks the prefix match with
 * the live KV. So every call id we hand out maps to the exact sampled DSML
 * block of its assistant turn, and the renderer replays those bytes when all
 * ids of a turn map to the same block. The map is bounded (least recently
 * used ids go first) and thread-safe (HTTP threads render, the worker
 * inserts).
 *
 * Ids are "call_" / "toolu_" + 32 hex digits from OpenSSL RAND_bytes: a
 * client cannot guess another conversation's id to pull its DSML.
 */
#ifndef DS4_SERVER_TOOL_MEMORY_H
#define DS4_SERVER_TOOL_MEMORY_H

#include <stddef.h>

typedef struct tool_memory tool_memory;

tool_memory *tool_memory_new(size_t max_ids);
void tool_memory_free(tool_memory *m);

/* Remember `ids[0..n)` -> dsml (copied). */
void tool_memory_put(tool_memory *m, const char *const *ids, size_t n,
                     const char *dsml, size_t dsml_len);

/* The block shared by all `ids`, or NULL when any is unknown or they differ.
 * Returns a malloc'd copy. */
char *tool_memory_get_block(tool_memory *m, const char *const *ids, size_t n);

size_t tool_memory_count(tool_memory *m);

/* Fills out with prefix + 32 lowercase hex digits (out needs >= strlen(prefix)
 * + 33 bytes). Returns 0, or -1 when the RNG fails. */
int tool_id_new(const char *prefix, char *out, size_t out_size);

#endif

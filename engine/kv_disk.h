/*
 * kv_disk.h - the disk KV cache: session snapshots keyed by rendered text.
 *
 * A file holds the state of a session after it consumed some rendered prompt
 * bytes. Its name is the SHA1 (hex) of those bytes plus ".kv", so a new
 * request whose rendered prompt starts with the same bytes can find it and
 * prefill only the rest. Layout (ds4's KVC envelope, little-endian):
 *
 *   0   u8[3] "KVC"        3  u8 version = 1
 *   4   u8 quant_bits      5  u8 save reason (1 cold, 2 continued, 3 evict,
 *                                             4 shutdown)
 *   6   u8 ext_flags (bit0 tool-id map, bit4 SHA-256 trailer)
 *   7   u8 reserved
 *   8   u32 tokens        12 u32 hits          16 u32 ctx size
 *   20  u8 payload ABI, u8[3] reserved
 *   24  u64 created (unix s)  32 u64 last used  40 u64 payload bytes
 *   48  u32 text bytes, then the rendered text
 *   ..  payload (the session: what srv_engine snapshot produced, wrapped by
 *       the caller)
 *   ..  optional tool-id map "KTM" u8 version=1 u32 count, then per entry
 *       u32 id_len u32 dsml_len, id, dsml
 *   ..  32-byte SHA-256 over text, payload and tool map (our addition; files
 *       without it are not trusted)
 *
 * Crash safety: a file is written under a temporary name, fsynced, renamed
 * into place and the directory fsynced. Loading checks sizes, the text's
 * SHA1 against the name and the checksum; a truncated or corrupt file is
 * removed with a log line and never returned. Eviction keeps the directory
 * under the space budget, dropping the files with the fewest recent hits
 * (hits decay with a 6 h half-life) first.
 */
#ifndef DS4_ENGINE_KV_DISK_H
#define DS4_ENGINE_KV_DISK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "include/ds4.h"

typedef enum {
    KV_DISK_REASON_UNKNOWN = 0,
    KV_DISK_REASON_COLD = 1,
    KV_DISK_REASON_CONTINUED = 2,
    KV_DISK_REASON_EVICT = 3,
    KV_DISK_REASON_SHUTDOWN = 4,
} kv_disk_reason;

#define KV_DISK_HEADER_BYTES 48u
#define KV_DISK_EXT_TOOL_MAP 0x01u
#define KV_DISK_EXT_CHECKSUM 0x10u
#define KV_DISK_PAYLOAD_ABI 1u

typedef struct {
    const char *dir;
    uint64_t space_bytes;         /* 0 = unlimited */
    uint8_t quant_bits;           /* written to headers */
    uint32_t ctx_size;            /* files of more tokens are refused */
    uint64_t max_payload_bytes;   /* 0 = unbounded; larger payloads are refused unread */
    bool reject_different_quant;  /* refuse files of other quant_bits */
    void (*log)(void *ud, const char *msg);
    void *log_ud;
} kv_disk_options;

typedef struct {
    char *id;
    char *dsml;
    size_t id_len, dsml_len;
} kv_disk_tool;

typedef struct {
    char sha[41];
    size_t text_len;        /* bytes of the prompt this state covers */
    uint32_t tokens;
    void *payload;          /* malloc'd */
    size_t payload_len;
    kv_disk_tool *tools;    /* malloc'd, may be empty */
    size_t n_tools;
    kv_disk_reason reason;
} kv_disk_hit;

typedef struct kv_disk kv_disk;

/* Creates the directory if needed. Returns NULL with ds4_last_error() set. */
kv_disk *kv_disk_open(const kv_disk_options *o);
void kv_disk_close(kv_disk *d);

/* Store the state covering text[0..text_len). Replaces a file of the same
 * key; then evicts under the budget (never the file just written). */
ds4_status kv_disk_save(kv_disk *d, kv_disk_reason reason,
                        const char *text, size_t text_len, uint32_t tokens,
                        const void *payload, size_t payload_len,
                        const kv_disk_tool *tools, size_t n_tools);

/* The longest stored state whose text is a byte prefix of prompt[0..len)
 * and that covers at most max_text bytes. Returns DS4_OK with *hit filled,
 * DS4_ERR_NOT_FOUND when none; bad files met on the way are removed. */
ds4_status kv_disk_lookup(kv_disk *d, const char *prompt, size_t len,
                          size_t max_text, kv_disk_hit *hit);
void kv_disk_hit_free(kv_disk_hit *hit);
/* Removes the file of `sha` (a state the engine refused), logging why. */
void kv_disk_remove(kv_disk *d, const char *sha, const char *why);

/* Number of files and their total bytes (after a rescan). */
void kv_disk_stats(kv_disk *d, size_t *files, uint64_t *bytes);

/* SHA1 hex of bytes (the file-name key). */
void kv_disk_sha1_hex(const void *p, size_t n, char out[41]);

#endif

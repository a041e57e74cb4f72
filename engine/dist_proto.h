/*
 * dist_proto.h - private to engine/dist_*.c: the messages between the
 * ranks of a distributed run and the run's shared settings.
 *
 * Commands (tag CMD) go from rank 0 to every other rank, and each answers
 * with a REPLY (a header, for SNAP followed by its layers' snapshot
 * bytes). A forward chunk (tag FWD) travels the chain 0 -> 1 -> ... ->
 * n-1: a header, the chunk's token ids, the residual stream after the
 * sender's layers; the last rank sends the logits to rank 0 (tag LOGITS).
 * A batched decode step (DIST_FWDB, tag FWD) carries n sessions' rows:
 * the header (T = n), n session ids, n positions (i64), n tokens, the
 * stream of n rows; the last rank answers n rows of logits.
 * Rank 0 sends a command only when every reply of the previous one has
 * come, so a rank never sees a command overtake a chunk.
 */
#ifndef DS4_ENGINE_DIST_PROTO_H
#define DS4_ENGINE_DIST_PROTO_H

#include "engine/dist_plan.h"

#include <stdint.h>

enum { DIST_TAG_CMD = 11, DIST_TAG_FWD = 12, DIST_TAG_REPLY = 13, DIST_TAG_LOGITS = 14 };
enum { DIST_OPEN = 1, DIST_CLOSE, DIST_NEW, DIST_FREE, DIST_RESET, DIST_FWD, DIST_SNAP, DIST_RESTORE, DIST_QUIT, DIST_FWDB };
enum { DIST_WANT_ALL = 1, DIST_WANT_LAST = 2 };

typedef struct {
    int32_t op, sid, T, flags;
    int32_t status;   /* DS4_OK, or the error of rank err_rank (a chunk that failed upstream passes on) */
    int32_t err_rank;
    int32_t bits;     /* FWD: 32 or 16 (bf16) bits per value of the stream */
    int32_t pad;
    int64_t pos0;     /* FWD: position of the chunk's first token; RESTORE: n_pos */
    int64_t aux;
    char msg[256];
} dist_hdr;

/* DIST_NEW's payload: the session parameters rank 0 was given. */
typedef struct {
    int64_t n_ctx;
    int32_t numerics, n_threads, backend, max_chunk, gpu_device, pad;
} dist_new;

/* What each rank tells rank 0 when the job starts. */
typedef struct {
    ds4_dist_range asked; /* --layers, lo < 0: none */
    uint64_t mem_avail;   /* MemAvailable, bytes (the automatic split's weight) */
    int32_t local_rank, pad;
    char host[64];
} dist_rank_info;

/* Shared by dist_front.c and dist_worker.c. */
typedef enum { DIST_NONE = 0, DIST_FRONT, DIST_WORKER } dist_role;
dist_role ds4_dist_role(void);
/* Worker: the stage rank 0 assigned by DIST_OPEN, for ds4_dist_model_load. */
void ds4_dist_set_stage(ds4_dist_range r);
/* The worker loop (dist_worker.c): serves rank 0 until DIST_QUIT; the exit code. */
int ds4_dist_worker_run(void);

/* The residual stream in a message: f32 as is, or bf16 (16 bits). */
size_t dist_stream_bytes(int bits, size_t n_values);
void dist_stream_pack(int bits, const float *x, size_t n, void *out);
void dist_stream_unpack(int bits, const void *in, size_t n, float *x);

#endif

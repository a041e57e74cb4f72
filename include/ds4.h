/*
 * ds4.h - the one public API of DwarfStar (libds4.a).
 *
 * Every front end (cli/, server/, tools/) includes only this header. The
 * layers below (engine/, model/, backend/, gguf/, quant/, text/, util/) are
 * private: their headers are not part of the API.
 *
 * Errors are values: functions return a ds4_status (or NULL) and leave a
 * human-readable message, naming the cause and the offending value, that
 * ds4_last_error() returns (per thread).
 */
#ifndef DS4_H
#define DS4_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    DS4_OK = 0,
    DS4_ERR_IO,          /* open/read/write/mmap failed */
    DS4_ERR_FORMAT,      /* malformed input file or data */
    DS4_ERR_NOMEM,       /* allocation failed */
    DS4_ERR_INVALID,     /* bad argument or configuration */
    DS4_ERR_UNSUPPORTED, /* valid but not handled (type, version, ...) */
    DS4_ERR_NOT_FOUND,   /* missing key, tensor, file */
    DS4_ERR_BACKEND,     /* device / backend failure */
} ds4_status;

/* Message of the last error set on this thread ("" when none). */
const char *ds4_last_error(void);

/* Short name of a status code ("format error", ...). */
const char *ds4_status_name(ds4_status st);

/* ---- model and session (engine/session.c) ---------------------------- */

typedef struct ds4_model ds4_model;
typedef struct ds4_session ds4_session;
typedef struct ds4_imatrix ds4_imatrix;

/* Numerics of the KV path (docs/MODEL.md, dsv4-model.md §4.1). */
typedef enum {
    DS4_NUMERICS_OFFICIAL = 0, /* FP8 KV, Hadamard+FP4 indexer, f16 KV: what the official model runs */
    DS4_NUMERICS_HF = 1,       /* the clean math of the reference implementation (golden tests) */
    DS4_NUMERICS_AUTO = 2,     /* official where the model's shapes allow the simulation (non-RoPE
                                  dims a multiple of 64, indexer key length 128: every published
                                  model), else hf (small demo/test models) */
} ds4_numerics;

typedef enum {
    DS4_BACKEND_AUTO = 0, /* CUDA when built with it and a GPU is found, else CPU */
    DS4_BACKEND_CPU = 1,
    DS4_BACKEND_CUDA = 2,
} ds4_backend_kind;

/* Eviction policy of the streaming cache (docs/STREAMING.md). */
typedef enum {
    DS4_EXPERT_EVICT_DEFAULT = 0, /* the measured better one (FREQ; docs/STREAMING.md) */
    DS4_EXPERT_EVICT_LRU = 1,     /* least recently used */
    DS4_EXPERT_EVICT_FREQ = 2,    /* least used, counts aged */
} ds4_expert_evict;

/* Options of ds4_model_open; pass NULL or a zeroed struct for defaults. */
typedef struct {
    /* Expert streaming (docs/STREAMING.md): the routed experts are read
     * from the file into a bounded cache as tokens select them, the rest
     * of the weights stay resident; outputs are bit-identical to a run
     * without it. CPU backend only. */
    int ssd_streaming;
    int64_t cache_experts;     /* cache size in experts (one layer's gate+up+down each); 0: see cache_bytes */
    uint64_t cache_bytes;      /* cache size in bytes when cache_experts is 0; both 0: what fits in free memory */
    int64_t preload_experts;   /* hot-list entries read at open (at most the cache); 0: the default cap (docs/STREAMING.md) */
    int cold;                  /* start with an empty cache (no preload) */
    const char *hotlist_path;  /* hot list to preload; NULL: the list compiled in for the model's family */
    ds4_expert_evict evict;
    /* Count expert selections per (layer, expert) into this file, merged
     * with what it holds, when the model is closed (or
     * ds4_model_save_expert_profile). Any backend, with or without
     * streaming. NULL: off. */
    const char *expert_profile;
    /* VRAM expert cache of the CUDA backend (docs/STREAMING.md, "CUDA"):
     * only this many routed experts live in GPU memory, copied from the
     * host copy of the weights as tokens select them; the other weights
     * stay resident; outputs are bit-identical. gpu_cache_experts experts,
     * or gpu_cache_bytes bytes when that is 0; both 0: off (every expert
     * resident). A budget that holds the whole model is full residency.
     * Eviction: `evict`. Not with ssd_streaming. */
    int64_t gpu_cache_experts;
    uint64_t gpu_cache_bytes;
    /* Read every page of the mapped weights at open, on all cores, so the
     * first prefill pays no page faults (`--warm-weights`). Not with
     * ssd_streaming (the file is larger than memory there). */
    int warm_weights;
    /* NUMA placement (`--numa`; engine/model_numa.h): DS4_NUMA_OFF leaves
     * the kernel's default (first touch); DS4_NUMA_INTERLEAVE spreads the
     * weights' pages, and what the process allocates from then on, round
     * robin over every node with memory, so that a decode streams from all
     * sockets' memory at once. */
    int numa;
    /* Tensor parallel (docs/TENSOR-PARALLEL.md): split every layer over
     * this many ranks in this process (attention heads, routed experts,
     * shared expert, vocabulary rows; the ranks meet in all-reduces), each
     * with its own backend and thread. 0 or 1: off. The CPU backend runs
     * the ranks in-process; sessions then split n_threads between them.
     * Not with ssd_streaming, the GPU expert cache or an MPI run. */
    int tensor_parallel;
    /* CUDA devices of the ranks, "0,1" (one per rank; NULL: 0..N-1). */
    const char *gpu_devices;
} ds4_model_options;

/* Open a DeepSeek V4 GGUF: metadata and every tensor are validated; the
 * weights stay mmapped. NULL + ds4_last_error() on failure (a bad option
 * value, a malformed profile or hot list names the cause). */
ds4_model *ds4_model_open(const char *path, const ds4_model_options *opt);
/* Saves the expert profile (if any; a failure is printed to stderr). */
void ds4_model_close(ds4_model *m);
/* Merge the selections counted so far into the expert_profile file and
 * reset the counts. DS4_OK when profiling is off. */
ds4_status ds4_model_save_expert_profile(ds4_model *m);

/* Expert streaming counters (all zero when streaming is off). */
typedef struct {
    uint64_t hits, misses;      /* routed-expert uses served from the cache / read from the file */
    uint64_t bytes_read;        /* bytes read from the file, preload included */
    uint64_t cache_experts;     /* cache capacity in experts */
    uint64_t cache_bytes;       /* cache capacity in bytes */
    uint64_t resident;          /* experts in the cache now */
    uint64_t preloaded;         /* experts read at open from the hot list */
} ds4_expert_stream_stats;
void ds4_model_expert_stream_stats(const ds4_model *m, ds4_expert_stream_stats *out);
int ds4_model_n_vocab(const ds4_model *m);
int ds4_model_n_layer(const ds4_model *m);
/* Weight bytes read to decode one token when the context holds n_ctx
 * tokens (that one included), as stored in the file: every non-expert
 * tensor once, n_used/n_experts of the routed experts, one embedding row,
 * the indexer's q_b/proj only once a CSA layer has more than index_topk
 * rows (dsv4-model.md §6.2; engine/model_stats.c). The roofline input. */
uint64_t ds4_model_weight_bytes_per_token(const ds4_model *m, int64_t n_ctx);
/* ds4_model_options.numa */
enum { DS4_NUMA_OFF = 0, DS4_NUMA_INTERLEAVE = 1 };
/* Where the model file's pages in memory sit, as the kernel reports it:
 * "policy P; N0 x%, N1 y%" into buf; the number of nodes listed, or -1
 * where the kernel does not report it (no NUMA support). */
int ds4_model_weight_numa(const ds4_model *m, char *buf, size_t len);
/* Bytes of the model file this process maps with huge pages (2 MiB on
 * x86), by the kernel's count (/proc/self/smaps); -1 where it cannot be
 * read. The weights are mapped with MADV_HUGEPAGE; whether the kernel
 * grants it depends on its transparent-huge-page setting and on the
 * filesystem caching the file in large folios. */
long long ds4_model_weight_huge_bytes(const ds4_model *m);

typedef struct {
    int64_t n_ctx;            /* maximum tokens in the session (default 4096) */
    ds4_numerics numerics;    /* default DS4_NUMERICS_AUTO */
    int n_threads;            /* CPU threads, <= 0: all cores (default 0) */
    ds4_backend_kind backend; /* default DS4_BACKEND_AUTO */
    int max_chunk;            /* tokens per prefill step (activation memory); default 0: the
                                 backend's (CPU 512, CUDA 2048), never more than n_ctx */
    int gpu_device;           /* CUDA device index for the CUDA backend (default 0) */
    ds4_imatrix *imatrix;     /* collect an importance matrix into this (default NULL: off,
                                 no cost); see ds4_imatrix_create */
} ds4_session_params;

void ds4_session_params_default(ds4_session_params *p);
/* The backend a session created with p would run on: p->backend resolved
 * as ds4_session_create resolves it (DS4_BACKEND=cpu|cuda in the
 * environment overrides AUTO; AUTO is CUDA when the build has it and finds
 * a GPU) - DS4_BACKEND_CPU or DS4_BACKEND_CUDA, so a caller can size what
 * depends on it (a server's prefill chunk) before creating sessions. */
ds4_backend_kind ds4_session_params_backend(const ds4_session_params *p);

/* A sequence being evaluated: its state is bounded (sliding-window ring,
 * compressed rows, compressor frontiers), never a full KV per token. */
ds4_session *ds4_session_create(ds4_model *m, const ds4_session_params *p);
void ds4_session_free(ds4_session *s);

/* Feed n tokens (any n; processed in steps of at most max_chunk). If
 * all_logits is not NULL it receives n * n_vocab floats: row i = logits
 * after token i. The last token's logits are kept (ds4_session_logits). */
ds4_status ds4_session_prefill(ds4_session *s, const int32_t *tokens, int64_t n, float *all_logits);
/* Feed one token (the decode step). */
ds4_status ds4_session_decode(ds4_session *s, int32_t token);
/* One decode step of n sessions of the same model: tokens[i] is fed to
 * s[i], each at its own position, and each session ends exactly as
 * ds4_session_decode would leave it (logits, position, state; bit-
 * identical on the CPU). It is one forward over n rows
 * (engine/session_batch.c, model/dsv4_forward_batch.c): every weight is
 * read once for all n sessions, only RoPE, compressors, indexer and
 * attention run per session on its own state, so n sessions cost little
 * more than one while decode is bandwidth bound. Groups of at most the
 * first session's max_chunk. Refused with nothing moved (message naming
 * the session): a NULL or repeated session, sessions of different models,
 * a full context, a token outside the vocabulary. Sessions that cannot
 * share one forward (different numerics, or backends that cannot address
 * each other's memory: CPU with CUDA, two GPUs) are decoded one after
 * the other instead, with the same results. ds4_session_get_stats: each
 * session counts its own attention work and an equal share of the
 * step's weight rows. */
ds4_status ds4_session_decode_batch(ds4_session **s, const int32_t *tokens, int n);
/* The greedy decode step: ds4_session_decode(s, token), then *next =
 * ds4_argmax_excluding(logits, n_vocab, excluded) of the new logits
 * (include/ds4_sampler.h: the largest value, the lowest index on ties,
 * -0 == +0, never a NaN, -inf or `excluded` (< 0: none); -1 when no value
 * is left), the same token bit for bit. Where the backend picks on its
 * side (CUDA) only the pick crosses to the host (4 bytes instead of the
 * 517 KB row of Flash's vocabulary): the logits stay where the step wrote
 * them and come into the host row when something reads them
 * (ds4_session_logits, a snapshot, the sampler of a later step), the same
 * values. Elsewhere (the CPU, tensor parallel, a distributed run, an
 * importance-matrix session) it is exactly the two calls. The session
 * ends as ds4_session_decode leaves it; an error leaves *next at -1. */
ds4_status ds4_session_decode_pick(ds4_session *s, int32_t token, int32_t excluded, int32_t *next);
/* The same for ds4_session_decode_batch: the step of the n sessions, then
 * next[i] = session i's greedy pick (next has n entries). On the device
 * one launch picks all n rows and n x 4 bytes come back; each session's
 * row is kept in its own state until read. */
ds4_status ds4_session_decode_batch_pick(ds4_session **s, const int32_t *tokens, int n, int32_t excluded,
                                         int32_t *next);
/* Logits after the last token fed (n_vocab floats), NULL before any. After
 * a *_pick step on a backend that picks, the first call (or snapshot)
 * downloads the row; the pointer is valid until the session's next step. */
const float *ds4_session_logits(const ds4_session *s);
/* Tokens consumed so far. */
int64_t ds4_session_n_past(const ds4_session *s);
/* Back to an empty sequence. */
void ds4_session_reset(ds4_session *s);
/* Pay a process's one-time costs before the first real request: on an
 * empty session, prefill n tokens of a fixed pattern (0: one prefill step
 * of the session's, at most the context), decode one, then reset, so the
 * session is as created (its op counters too). On CUDA the first prefill
 * otherwise carries the math library's start-up and the first launch of
 * each kernel and GEMM shape (~80 ms of an 8-layer model's first 2048-token
 * step, docs/BENCHMARKS.md). Paths a prompt of n tokens at position 0 does
 * not take (the indexer's selection past ratio x top-k positions) still
 * pay theirs at their first use. */
ds4_status ds4_session_warmup(ds4_session *s, int64_t n);

/* Backend memory the session took at creation for its whole context
 * (nothing grows while it decodes): the KV state (window rings,
 * compressors' buffers and compressed rows, indexer keys) and the work
 * buffers of one prefill chunk (activations, logits). Either may be NULL. */
void ds4_session_memory(const ds4_session *s, uint64_t *kv_bytes, uint64_t *work_bytes);

/* Snapshot of the whole session state (versioned, backend-neutral bytes:
 * a CPU snapshot restores into any backend). *out is malloc'd. */
ds4_status ds4_session_snapshot(const ds4_session *s, void **out, size_t *len);
/* The byte length ds4_session_snapshot would produce now, without copying
 * anything (lets a caller decide whether a snapshot is worth its memory). */
size_t ds4_session_snapshot_size(const ds4_session *s);
/* An upper bound of any snapshot this session can produce (at any length
 * up to its context): what a stored state may be, at most. */
size_t ds4_session_snapshot_size_max(const ds4_session *s);
/* Checks the header against this model and context, the exact size, and
 * that no value is NaN or +inf (a forged or corrupt state is refused, not
 * loaded). */
ds4_status ds4_session_restore(ds4_session *s, const void *data, size_t len);

/* Work counters since creation (tests of decode cost). */
typedef struct {
    uint64_t rows_attended;       /* KV rows in attention softmaxes, per query */
    uint64_t compressor_pushes;   /* tokens pushed into compressors */
    uint64_t rows_emitted;        /* compressed rows and indexer keys made */
    uint64_t indexer_keys_scored; /* (query, key) pairs scored */
    uint64_t matmul_rows;         /* weight rows multiplied x tokens */
} ds4_session_stats;
void ds4_session_get_stats(const ds4_session *s, ds4_session_stats *out);

/* ---- distributed runs (engine/dist_*.c, docs/DISTRIBUTED.md) --------- */
/* Call first in main(). It takes the distributed options out of argv
 * (`--layers A:B`: this rank's layers; `--dist-activation-bits 32|16`)
 * and, when the process was started by mpirun (its environment says so;
 * a plain run never touches MPI), joins the job. Returns 0 to go on as the
 * front end: a plain run, or rank 0, whose models and sessions then run as
 * a pipeline over all ranks (each holds a contiguous range of layers and
 * their KV state). On the other ranks it serves rank 0 until rank 0 ends,
 * then returns 1 with *exit_code set for main to return; also 1 (message
 * printed, *exit_code 2) for a bad option. */
int ds4_dist_init(int *argc, char **argv, int *exit_code);
/* ---- directional steering, --power (engine/session_edit.c) ---------- */
/* docs/MODEL.md "Directional steering": with a unit direction v_l per
 * layer, each sublayer output y (attention after its output projection,
 * MoE after routed + shared experts, before hc_post) becomes
 * y - S v_l (v_l . y), S = attn or ffn. A zero row leaves its layer alone. */
int ds4_model_n_embd(const ds4_model *m);
/* Read a direction file: n_layer x n_embd little-endian f32, rows unit
 * (or zero). *dirs is malloc'd. A wrong size, a non-finite value or a row
 * that is not unit is refused with the cause named. */
ds4_status ds4_steering_file_read(const ds4_model *m, const char *path, float **dirs);
/* The same checks on directions in memory. */
ds4_status ds4_steering_check(const ds4_model *m, const float *dirs);
/* Steer this session from now on (dirs copied; NULL or both scales 0:
 * off, the plain forward). Sessions with steering or --power decode one
 * by one in ds4_session_decode_batch. */
ds4_status ds4_session_set_steering(ds4_session *s, const float *dirs, float attn, float ffn);
/* Duty cycle 1..100 (100 = off): after each layer of a prefill chunk and
 * after each decode step the session sleeps (100 - N) / N times the
 * compute time it just measured. Results are unchanged. */
ds4_status ds4_session_set_power(ds4_session *s, int percent);
typedef struct {
    uint64_t sleeps; /* sleeps taken */
    double slept_s;  /* seconds slept */
    double busy_s;   /* compute seconds measured */
} ds4_power_stats;
void ds4_session_power_stats(ds4_session *s, ds4_power_stats *out);
/* Replace the sleep (tests count instead of sleeping); NULL: nanosleep. */
void ds4_session_set_power_sleep(ds4_session *s, void (*fn)(double seconds, void *ctx), void *ctx);
/* Direction building (ds4-steer): while on, the session adds every FFN
 * sublayer output row (per layer) into a sum; ds4_session_capture_take
 * gives the per-layer means (n_layer x n_embd) and the row count, and
 * clears the sum. */
ds4_status ds4_session_capture_ffn(ds4_session *s, int on);
int64_t ds4_session_capture_take(ds4_session *s, double *means);

/* ---- speculative decoding with the MTP block (engine/spec.c) ---------- */
/* docs/MODEL.md "Multi-token prediction". Load the model's MTP block:
 * path NULL or "auto" = the mtp.0.* tensors of the model's own file, else
 * a separate GGUF holding them (antirez/ds4's MTP file names). Errors name
 * the missing or malformed tensor. */
ds4_status ds4_model_load_mtp(ds4_model *m, const char *path);
int ds4_model_has_mtp(const ds4_model *m);
/* Speculate with n_draft (1..16) tokens per step from now on (0: off).
 * Turn it on before feeding the prompt: the block learns from every
 * forward after that (earlier tokens only make worse drafts, never wrong
 * output). */
ds4_status ds4_session_set_mtp(ds4_session *s, int n_draft);
/* ds4_session_decode_spec is in ds4_sampler.h (it takes sampler params). */
typedef struct {
    uint64_t steps;    /* ds4_session_decode_spec calls */
    uint64_t drafted;  /* draft tokens verified */
    uint64_t accepted; /* of them confirmed */
    double rollback_s; /* seconds in saving marks and taking chunks back */
} ds4_spec_stats;
void ds4_session_spec_stats(ds4_session *s, ds4_spec_stats *out);
/* The main model's final mHC state (before the head) of the first `rows`
 * tokens of the last forward step, [rows, n_hc, n_embd] floats: the input
 * of the MTP block (training one: tools/train_demo/train_mtp.py). */
ds4_status ds4_session_hidden(ds4_session *s, int rows, float *out);
int ds4_model_n_hc(const ds4_model *m);
/* Benchmarks: pause the MTP block's following of the main model (a plain
 * decode then costs what it costs without --mtp), and mark / rewind its
 * state (with ds4_session_snapshot/restore of the main state, a probe
 * can be repeated from the same point). */
void ds4_session_spec_pause(ds4_session *s, int paused);
/* After ds4_session_decode_spec fed its token and k confirmed drafts
 * (n_out = k + 1 tokens fed): keep only the first `keep` of them, as if
 * the step had stopped there (a caller whose stop string or tool call
 * ended inside the drafts). 1 <= keep <= k + 1; logits are those after
 * the last kept token. Exact: the state equals one fed just those. */
ds4_status ds4_session_spec_trim(ds4_session *s, int keep);
/* ds4-bench: roll rejected drafts back with a full snapshot of the state
 * (the older scheme) instead of the undo record of what the chunk
 * touched; the output is the same either way. */
void ds4_session_spec_full_snapshot(ds4_session *s, int on);
ds4_status ds4_session_spec_mark(ds4_session *s);
ds4_status ds4_session_spec_rewind(ds4_session *s);
/* Tests: fn may replace each greedy draft (pos: the position it would
 * take) before verification, to drive acceptance where the test wants it. */
void ds4_session_spec_draft_hook(ds4_session *s, int32_t (*fn)(void *ctx, int64_t pos, int32_t draft), void *ctx);

/* ---- importance matrix (engine/imatrix.c, docs/QUALITY.md) ---------- */
/* The squared input activations of every weight product, summed per input
 * column (per routed expert for the expert tensors), over everything the
 * sessions created with params.imatrix = im evaluate (one session at a
 * time). Those sessions run every op eagerly (no CUDA graph replay) and
 * read activations back to the host, so collection is slower than
 * inference; results are unchanged. */
ds4_imatrix *ds4_imatrix_create(void);
void ds4_imatrix_free(ds4_imatrix *im);
/* Tensors recorded so far. */
int ds4_imatrix_n_entries(const ds4_imatrix *im);
/* Count one finished prompt (the file's call/chunk count). */
void ds4_imatrix_add_chunk(ds4_imatrix *im);
/* Expert slabs (summed over tensors) that no token was routed to; the file
 * gives them the mean of the other experts. */
int64_t ds4_imatrix_unseen_experts(const ds4_imatrix *im);
/* Write llama.cpp's legacy imatrix.dat layout (what `ds4-quantize
 * --imatrix` reads): via PATH.tmp, renamed when complete. Fails when
 * nothing was collected or an op failed during collection. */
ds4_status ds4_imatrix_save(const ds4_imatrix *im, const char *path, const char *dataset);

#ifdef __cplusplus
}
#endif

#endif /* DS4_H */

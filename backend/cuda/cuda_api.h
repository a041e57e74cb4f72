/*
 * cuda_api.h - the C-callable face of the CUDA backend (the .cu files of backend/cuda).
 *
 * C code (the ops table, tests, benchmarks) calls the GPU only through this
 * header, which uses plain C types so that cc can compile its callers. It
 * exists only in builds made with nvcc (the Makefile then defines
 * DS4_HAVE_CUDA=1); callers guard their use with #if DS4_HAVE_CUDA.
 *
 * Model: one ds4_cuda context = one device + one stream + one cuBLAS
 * handle + scratch memory. Every pointer named d_* is device memory;
 * kernels are queued on the context's stream and run asynchronously:
 * ds4_cuda_sync() waits and reports any fault of the queued work.
 *
 * Weights are GGUF tensors copied to the device by ds4_cuda_upload_weight:
 * `rows` rows of `cols` values, each row ds4_cuda_row_bytes(type, cols)
 * bytes of blocks (quant/blocks.h), unchanged but for IQ2_XXS rows of a
 * multiple of 2048 values and Q2_K rows of a multiple of 1024, which the
 * GPU keeps in runs of 8 and 4 blocks (the same bytes rearranged in each
 * run: cuda_weight_runs.cuh). Activations are f32, token-major:
 *
 *   y[t * rows + r] = sum_c W[r, c] * x[t * cols + c]      t < n_tok
 *
 * Requirements checked on every call (DS4_ERR_INVALID otherwise): cols a
 * multiple of the type's block (256 for the K-quants and IQ2_XXS, 32
 * otherwise), weights aligned to their block fields (2 bytes; 4 for Q2_K,
 * Q4_K, F32), x 16-byte aligned. Weights 16-byte aligned (cudaMalloc gives
 * 256) take the fast path that streams them with 16-byte loads.
 */
#ifndef DS4_BACKEND_CUDA_API_H
#define DS4_BACKEND_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

#include "include/ds4.h"
#include "quant/blocks.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds4_cuda ds4_cuda;

/* Largest token count the matvec kernels take in one weight pass; above it
 * ds4_cuda_matmul uses the tensor-core GEMM path. */
#define DS4_CUDA_MATVEC_MAX_TOK 16

/* How the prefill GEMM path multiplies: weights dequantized to bf16 and
 * activations rounded to bf16 (tensor cores, f32 accumulation), or both in
 * f32 (exact-ish, CUDA cores, for the reference numerics mode). */
typedef enum {
    DS4_CUDA_GEMM_BF16 = 0,
    DS4_CUDA_GEMM_F32 = 1,
} ds4_cuda_gemm_precision;

/* Number of usable CUDA devices; 0 when there is no driver or GPU. */
int ds4_cuda_device_count(void);

ds4_status ds4_cuda_open(int device, ds4_cuda **out);
void ds4_cuda_close(ds4_cuda *cu);
/* "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)" */
const char *ds4_cuda_device_desc(const ds4_cuda *cu);

/* Prefill GEMM precision of this context (default DS4_CUDA_GEMM_BF16). */
void ds4_cuda_set_gemm_precision(ds4_cuda *cu, ds4_cuda_gemm_precision p);

/* Device memory and copies. upload/download are synchronous; copy_d2d is
 * queued on the stream. */
ds4_status ds4_cuda_malloc(ds4_cuda *cu, size_t bytes, void **d_out);
void ds4_cuda_free(ds4_cuda *cu, void *d_ptr);
ds4_status ds4_cuda_upload(ds4_cuda *cu, void *d_dst, const void *src, size_t bytes);
ds4_status ds4_cuda_download(ds4_cuda *cu, void *dst, const void *d_src, size_t bytes);
ds4_status ds4_cuda_copy_d2d(ds4_cuda *cu, void *d_dst, const void *d_src, size_t bytes);
ds4_status ds4_cuda_sync(ds4_cuda *cu);

/* Weights to the device as every kernel reads them: ds4_cuda_upload, then
 * rows of cols values rearranged in runs where ds4_cuda_in_runs(type,
 * cols) (synchronous). Whoever copies weight bytes another way calls
 * ds4_cuda_runs_on on them (queued on stream, a cudaStream_t; bytes whole
 * runs) or copies ds4_runs_host's bytes. */
ds4_status ds4_cuda_upload_weight(ds4_cuda *cu, void *d_dst, const void *src, size_t bytes, ds4_type type,
                                  int64_t cols);
int ds4_cuda_in_runs(ds4_type type, int64_t cols);
ds4_status ds4_cuda_runs_on(void *stream, void *d_w, size_t bytes, ds4_type type, int64_t cols);
/* The runs layout of bytes (whole runs of GGUF blocks of type: 528 bytes
 * of IQ2_XXS, 336 of Q2_K; other types copied; dst and src apart) on the
 * host. */
void ds4_runs_host(ds4_type type, uint8_t *dst, const uint8_t *src, size_t bytes);

/* The greedy pick of n_rows rows of n floats (row r at d_x + r * n), queued
 * on the stream: d_out[r] = the index of row r's largest value, the lowest
 * index on ties (-0 == +0), never a NaN or -inf nor `excluded` (< 0 or >= n:
 * none), -1 when no value is left: ds4_argmax_excluding's answer
 * (include/ds4_sampler.h) for each row (cuda_argmax.cu). */
ds4_status ds4_cuda_argmax_rows(ds4_cuda *cu, const float *d_x, int64_t n_rows, int64_t n, int32_t excluded,
                                int32_t *d_out);

/* Bytes of one row of `cols` values of `type`; 0 when cols is not a
 * multiple of the type's block or the type is not supported here. */
size_t ds4_cuda_row_bytes(ds4_type type, int64_t cols);

/* y = W x for n_tok tokens: the matvec kernels when n_tok <=
 * DS4_CUDA_MATVEC_MAX_TOK, else the GEMM path. */
ds4_status ds4_cuda_matmul(ds4_cuda *cu, ds4_type type, const void *d_w,
                           int64_t rows, int64_t cols, const float *d_x,
                           int64_t n_tok, float *d_y);

/* The fused dequantize-matvec kernels (each weight byte read once per
 * group of up to 4 tokens), for any n_tok. */
ds4_status ds4_cuda_matvec(ds4_cuda *cu, ds4_type type, const void *d_w,
                           int64_t rows, int64_t cols, const float *d_x,
                           int64_t n_tok, float *d_y);

/* The prefill path: weights dequantized tile by tile into scratch, then a
 * cuBLAS GEMM in the context's precision. */
ds4_status ds4_cuda_gemm(ds4_cuda *cu, ds4_type type, const void *d_w,
                         int64_t rows, int64_t cols, const float *d_x,
                         int64_t n_tok, float *d_y);

/* Routed-MoE matvec: d_w holds n_expert matrices of rows x cols back to
 * back (a GGUF [cols, rows, n_expert] tensor). For each slot
 * s < n_slots (slot = token * n_used + k), expert d_ids[s] (int32, on the
 * device) multiplies x_s into y[s * rows ...], reading only that expert's
 * weights. x_s = d_x + (s / x_share) * cols: x_share = n_used makes all
 * slots of a token share its input (gate/up), x_share = 1 gives each slot
 * its own (down). An id outside [0, n_expert) yields NaN rows, never a
 * read out of bounds. */
ds4_status ds4_cuda_moe_matvec(ds4_cuda *cu, ds4_type type, const void *d_w,
                               int64_t n_expert, int64_t rows, int64_t cols,
                               const int32_t *d_ids, int64_t n_slots,
                               int64_t x_share, const float *d_x, float *d_y);

/* Dequantize rows x cols of W to f32 on the device. */
ds4_status ds4_cuda_dequantize(ds4_cuda *cu, ds4_type type, const void *d_w,
                               int64_t rows, int64_t cols, float *d_out);

/* Whether weights can wait in L2 (cuda_l2_probe.cu; ds4-gpubench
 * --l2probe): microseconds of one plain read of a buffer of w_bytes by
 * all SMs, after L2 was flushed and then: nothing (cold); a read of it
 * (warm) or one with the evict_last priority (warm_last); the same
 * followed by a read of other_bytes of other memory with evict_first
 * (warm_last_then_other_first) or plainly after a plain warm read
 * (warm_then_other); the copy engine's bulk prefetch of it (bulk, sm_90+),
 * with evict_last (bulk_last), and that followed by the evict_first read
 * of the other memory (bulk_last_then_other_first); cold again after
 * those (cold_after_last: evict_last lines that outlive a reset and the
 * flush would make it fast). plain: with no L2 set aside for persisting
 * lines; persist: with persist_bytes set aside (capped by the device; 0:
 * not run). */
typedef struct {
    double cold_us, warm_us, warm_last_us, warm_last_then_other_first_us, warm_then_other_us;
    double bulk_us, bulk_last_us, bulk_last_then_other_first_us, cold_after_last_us;
} ds4_cuda_l2probe_times;
typedef struct {
    size_t l2_bytes, persist_bytes;
    int bulk; /* the bulk cases ran */
    ds4_cuda_l2probe_times plain, persist;
} ds4_cuda_l2probe;
ds4_status ds4_cuda_l2_probe(ds4_cuda *cu, size_t w_bytes, size_t other_bytes, size_t persist_bytes,
                             ds4_cuda_l2probe *out);

/* Timing of queued work for benchmarks: start records an event on the
 * stream, stop records another, waits, and gives the milliseconds. */
ds4_status ds4_cuda_timer_start(ds4_cuda *cu);
ds4_status ds4_cuda_timer_stop(ds4_cuda *cu, double *ms);

/* The kernels' block decoding run on the host (no GPU needed), so that a
 * machine without a GPU still checks the decode math against the ggml
 * fixtures. out: cols floats (dequantize) or one float (dot). */
ds4_status ds4_cuda_host_dequantize_row(ds4_type type, const void *row,
                                        int64_t cols, float *out);
ds4_status ds4_cuda_host_dot_row(ds4_type type, const void *row, int64_t cols,
                                 const float *x, float *out);
/* The same from a row as the GPU keeps it (ds4_cuda_upload_weight's bytes:
 * IQ2_XXS and Q2_K in runs where ds4_cuda_in_runs). */
ds4_status ds4_cuda_host_dequantize_gpu_row(ds4_type type, const void *row, int64_t cols, float *out);

/* The int8-activation decode matvec (cuda_mmvq.cu): 1 when a matvec of
 * this weight (type, device address, width; experts expert_bytes apart)
 * runs on activations quantized as the CPU quantizes them (Q8_0 for Q8_0
 * weights, Q8_K for Q2_K and IQ2_XXS), 0 when it takes the f32 kernel
 * (other types, unaligned rows, DS4_CUDA_MMVQ=0). */
int ds4_cuda_mmvq_active(ds4_type type, const void *d_w, int64_t cols, int64_t expert_bytes);

/* Its quantizer on the device: n_rows rows of cols floats (x_ld apart) into
 * rows of ds4_cuda_mmvq_act_bytes(type, cols) bytes in the CPU's format
 * (backend/cpu/cpu_matmul_kernels.h); the bytes equal the CPU's. */
int64_t ds4_cuda_mmvq_act_bytes(ds4_type type, int64_t cols);
ds4_status ds4_cuda_mmvq_quantize(ds4_cuda *cu, ds4_type type, const float *d_x, int64_t x_ld,
                                  int64_t n_rows, int64_t cols, void *d_out);

/* Block-diagonal: groups blocks of rows_g x cols; token t, group g reads
 * x[(t*groups + g)*cols ...] and writes y[(t*groups + g)*rows_g ...]. */
ds4_status ds4_cuda_matvec_grouped(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t groups,
                                   int64_t rows_g, int64_t cols, const float *d_x, int64_t n_tok,
                                   float *d_y);

/* Fused forms for the expert FFNs (decode, int8 activations; the backend's
 * and the tests'):
 * swiglu: h = SwiGLU(gate . x, up . x) for every slot (routed: expert of
 *   slot s from d_ids, x row s / x_share; d_ids NULL: n_slots dense tokens);
 * down: routed (d_ids): out[t] (+)= sum over token t's k slots, in
 *   ascending expert id, of route_w * (down_e . h_slot); dense (d_ids NULL):
 *   out[t] (+)= down . h[t]. DS4_ERR_UNSUPPORTED when the weights do not
 *   take the int8 path (the caller falls back). */
ds4_status ds4_cuda_mmvq_swiglu(ds4_cuda *cu, ds4_type type, const void *d_gate, const void *d_up, int64_t rows,
                                int64_t cols, const int32_t *d_ids, int64_t n_expert, int64_t n_slots,
                                int64_t x_share, const float *d_x, float clamp, float *d_h);
ds4_status ds4_cuda_mmvq_down(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows, int64_t cols,
                              const int32_t *d_ids, int64_t n_expert, const float *d_route_w, int k, int64_t n_tok,
                              const float *d_h, float *d_out, int accumulate);

/* The prefill experts' tensor-core products (cuda_moe_mma.cu), for tests:
 * groups (host) holds n_groups x 4 int32 (expert, first activation row,
 * tokens 1..64, 0); d_act rows as ds4_cuda_mmvq_quantize writes them,
 * act_ld apart, with 7 rows to spare past the last group's. IQ2_XXS: d_w0 /
 * d_w1 the gate and up experts (rows x cols each), a token's y row gets the
 * rows gate values, then the rows up values (y_ld >= 2 rows); Q2_K: d_w0 the
 * down experts, rows values. Each value is the CPU scalar kernel's
 * (ds4_cpu_dot_scalar) on the same activation row, bit for bit. Shapes:
 * IQ2_XXS rows % 1024, cols % 2048; Q2_K rows % 2048, cols % 1024 (both <=
 * 16384). Synchronous. */
ds4_status ds4_cuda_moe_mma_products(ds4_cuda *cu, ds4_type type, const void *d_w0, const void *d_w1,
                                     int64_t rows, int64_t cols, const int32_t *groups, int n_groups,
                                     const void *d_act, int64_t act_ld, float *d_y, int64_t y_ld);

/* The same quantizer and the kernel's per-block integer dot products, run
 * on the host for one row (tests without a GPU): act_out gets
 * ds4_cuda_mmvq_act_bytes(type, cols) bytes; dot gives the row (GGUF
 * bytes; IQ2_XXS and Q2_K rows read as the GPU keeps them) . act. */
ds4_status ds4_cuda_host_mmvq_quantize(ds4_type type, const float *x, int64_t cols, void *act_out);
ds4_status ds4_cuda_host_mmvq_dot(ds4_type type, const void *row, int64_t cols, const void *act,
                                  float *out);

/* The float-weight decode matvec (cuda_fmv.cu): 1 when a matvec of this
 * F16 / BF16 / F32 weight (device address, width) takes it (16-byte aligned
 * weights, cols % 8 == 0), 0 when it takes the f32-dequantizing kernel
 * (other types and shapes, DS4_CUDA_FMV=0). warps_per_row: how many warps
 * it gives one row of a matrix of `rows` rows on this device (8: a block
 * per row, 1: a warp per row). */
int ds4_cuda_fmv_active(ds4_type type, const void *d_w, int64_t cols);
int ds4_cuda_fmv_warps_per_row(const ds4_cuda *cu, int64_t rows);

/* The lightning indexer's queries of one token (ops.h indexer_query_rope,
 * cuda_fmv_iq.cu): y = W rmsnorm(x, norm_w, eps) as the float matvec's
 * normalizing form computes it (F16 or BF16, 1024 columns, a warp a row),
 * then each head of 128 rows rotated on its last n_rot values at position
 * pos (plus *d_pos when d_pos is not NULL) as the rope op does and, with
 * qat, rounded as the indexer_qat op does: one launch, a block a head.
 * 0 when not covered (the caller runs the ops); with launch = 0 only
 * whether it is covered. */
int ds4_cuda_fmv_index_query(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows, int64_t cols,
                             const float *x, const float *norm_w, float eps, float *y, int head_dim, int n_rot,
                             const float *om, const int64_t *d_pos, int64_t pos, int qat, int launch);

/* Its arithmetic on the host, in its order of operations for a row given
 * warps_per_row warps (1 or 8): the GPU's value bit for bit. cols % 8 == 0. */
ds4_status ds4_cuda_host_fmv_dot(ds4_type type, const void *row, int64_t cols, const float *x,
                                 int warps_per_row, float *out);

/* Q8_0 weights at d_w (rows x cols, the GGUF layout, on the device) get a
 * second device copy in the split layout the decode matvec reads fastest
 * (cuda_q8split.cu; the values of each block in one run, the f16 scales in
 * another); the matvecs on d_w then use it. Made on the context's stream;
 * a no-op when DS4_CUDA_Q8SPLIT=0, when cols % 32 != 0 or when d_w has one.
 * release frees it (call before freeing d_w). */
ds4_status ds4_cuda_q8split_register(ds4_cuda *cu, const void *d_w, int64_t rows, int64_t cols);
void ds4_cuda_q8split_release(ds4_cuda *cu, const void *d_w);

/* The prefill GEMM's resident bf16 copy of the Q8_0 matrix at d_w
 * (cuda_gemm_bf16copy.cu): noted here, made at the process's first
 * prefill GEMM when the device then keeps an eighth of its memory free
 * beyond it (else none: not an error), a no-op with DS4_CUDA_BF16COPY=0;
 * release frees it or drops the note (before d_w). */
ds4_status ds4_cuda_bf16copy_register(ds4_cuda *cu, const void *d_w, int64_t rows, int64_t cols);
void ds4_cuda_bf16copy_release(ds4_cuda *cu, const void *d_w);
/* Makes the noted copies on cu's device now (the GEMM calls it first). */
ds4_status ds4_cuda_bf16copy_make_pending(ds4_cuda *cu);
/* What the process made so far: copies, their bytes, and noted weights
 * left to the dequantizing GEMM for want of room (a slower prefill). */
void ds4_cuda_bf16copy_stats(int *made, size_t *bytes, int *skipped);

/* Decode steps of this process that the CUDA backends launched on a walk
 * ahead (cuda_graph.cu, AHEAD): tests see that the path ran. */
uint64_t ds4_cuda_graph_steps_ahead(void);

/* In-graph kernel times (cuda_ktrace.cu; DS4_CUDA_KTIME=1 collects them
 * and prints the table at each backend's end, =2 only collects), for the
 * last recorded decode step of this process: its kernels, the replays
 * timed, the stamps that matched no noted launch and the noted launches
 * without a stamp (both summed over the replays), and the mean time a
 * replay from the first kernel's stamp to the last one's (microseconds). */
typedef struct {
    int kernels;
    long replays, unmatched, unstamped;
    double us_per_step;
} ds4_cuda_ktime;
void ds4_cuda_ktime_totals(ds4_cuda_ktime *out);
/* Kernels that mark their phases (cuda_internal.cuh, ds4_kt_phase). */
enum { DS4_KT_HCC, DS4_KT_HCC_SERVICE, DS4_KT_ATTN_SPLIT, DS4_KT_ATTN_COMBINE, DS4_KT_G1, DS4_KT_G2, DS4_KT_ROUTER };
/* Phase k of such a site: the mean time from the marking thread's dependency wait
 * to the phase's end (microseconds), and how often a replay marked it; 0
 * where it never did. */
double ds4_cuda_ktime_phase(int site, int k, double *marks_per_replay);

/* One replay's n stamps (time, launch-shape pairs, in the order they were
 * written) matched to the nk launches noted in the recording (their
 * shapes): a stamp takes the first unused launch of its shape from the
 * next expected one on, else the nearest unused one before it (within 32
 * launches either way: kernels forked onto a side stream stamp out of
 * launch order); the time to the next stamp (0 if that one is earlier) is
 * added to sum_ns of the stamp's launch. lanes (NULL: not asked for): the
 * launches' streams as small numbers; then the time from a matched stamp
 * to the next stamp matched to a launch of the same stream (0 if earlier,
 * none for a stream's last) is added to lane_ns of its launch: with
 * kernels beside each other, what each adds to its own stream. used: nk
 * bytes of scratch. Host code only (cuda_ktrace.cu; tests). */
typedef struct {
    long unmatched, unstamped; /* stamps matching no launch, launches without a stamp */
    double span_ns;            /* the last stamp's time minus the first one's */
} ds4_cuda_ktime_match;
enum { DS4_KT_LANES = 8 }; /* streams told apart; later ones share the last number */
void ds4_cuda_ktime_match_replay(const unsigned long long *stamps, unsigned long long n,
                                 const unsigned long long *shapes, int nk, double *sum_ns, unsigned char *used,
                                 const unsigned char *lanes, double *lane_ns, ds4_cuda_ktime_match *out);

#ifdef __cplusplus
}
#endif

#endif

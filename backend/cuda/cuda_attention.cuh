/*
 * cuda_attention.cuh - what the attention op (cuda_ops_attention.cu) shares
 * with its split-row kernels (cuda_attn_split.cu, cuda_indexer_split.cu)
 * and its one-pass prefill kernel (cuda_attn_prefill.cu):
 * the argument block of the sparse attention and the launchers of the
 * faster kernels, selected at backend creation (DS4_CUDA_ATTN,
 * DS4_CUDA_INDEXER; 0 = the one-block-per-query kernels).
 */
#ifndef DS4_CUDA_ATTENTION_CUH
#define DS4_CUDA_ATTENTION_CUH

#include "backend/cuda/cuda_backend.cuh"

struct cb_attn_args {
    const float *q, *kv, *ring, *comp, *sinks;
    const int32_t *sel;
    int T, n_heads, hd, window, ratio, topk;
    int64_t pos0; /* inside the kernel: the effective position (device copy added) */
    const int64_t *d_pos;
    float *out, *scores;
    int64_t max_rows;
    /* the attention_out epilogue (split kernels only; NULL = none): the
     * chunk's kv rows pushed into ring_w as ring_push does, the output's
     * last n_rot dims rotated back by rope_om as rope(inverse) does */
    float *ring_w;
    const float *rope_om;
    int n_rot;
    /* the Q8_0 hand-off to o_a (ds4_cuda's q8a; NULL = none): the
     * combine also stores its output as Q8_0 blocks, values in q8 (out's
     * layout) and a scale per 32 in q8d, as o_a's product would quantize
     * them (cb_attention_split_q8_fits: one query, rows of 512) */
    int8_t *q8;
    float *q8d;
    /* the same for a batched step's o_a (ds4_cuda's q8m; NULL = none):
     * this sequence's output as token q8m_tok of the tensor-core
     * products' fragment-order blocks (cuda_q8m.cuh), scales in q8md */
    uint8_t *q8m;
    float *q8md;
    int q8m_tok;
};

/* Row i of the rows visible to query t at position p: raw rows lo .. p
 * (chunk or ring), then the compressed rows (selected or all causal). */
__device__ __forceinline__ const float *cb_attn_row(const cb_attn_args &a, int t, int64_t lo, int64_t n_raw,
                                                    int64_t i)
{
    if (i < n_raw) {
        const int64_t pp = lo + i;
        return pp >= a.pos0 ? a.kv + (size_t)(pp - a.pos0) * a.hd : a.ring + (size_t)(pp % a.window) * a.hd;
    }
    const int64_t j = i - n_raw;
    const int64_t id = a.sel ? a.sel[(size_t)t * a.topk + j] : j;
    return a.comp + (size_t)id * a.hd;
}

/* Split-row attention (cuda_attn_split.cu). fits: the shapes it serves
 * (hd % 4 == 0, hd <= 512, 16-byte aligned rows), else the one-block
 * kernel takes the call. a.pos0 / a.d_pos as cb_graph_pos gives them,
 * a.max_rows the planned maximum; notes its arguments for the graph. */
bool cb_attention_split_fits(const cb_attn_args &a);
/* False (nothing launched) when the epilogue is asked for and the chunk's
 * partials take more than one launch: its ring push must follow every
 * read of the ring. */
bool cb_attention_split(ds4_backend *be, const cb_attn_args &a);
/* The shapes whose combine can store its output's Q8_0 blocks (a.q8):
 * one query, a thread a float4 of a head's row, so a block of 32 values is
 * 8 neighbouring lanes. */
bool cb_attention_split_q8_fits(const cb_attn_args &a);

/* A prefill chunk's attention in one pass (cuda_attn_prefill.cu): a block
 * per query and head group keeps its running softmax in registers (no
 * partials through memory). takes: the split kernels are on, T is at least
 * DS4_CUDA_ATTN_PREFILL (256; 0 = never) and the shapes fit. The call's
 * rope_om epilogue is done, its ring_w not (the caller pushes the ring
 * after the launch). */
bool cb_attention_prefill_takes(ds4_backend *be, const cb_attn_args &a);
void cb_attention_prefill(ds4_backend *be, const cb_attn_args &a);
/* The same walk on the tensor cores (cuda_attn_prefill_tc.cu; fp32-grade
 * with tf32 mma): head dim 512 and heads a multiple of 32 (Flash), unless
 * DS4_CUDA_ATTN_TC=0. cb_attention_prefill hands it what it takes. */
bool cb_attention_prefill_tc_takes(ds4_backend *be, const cb_attn_args &a);
void cb_attention_prefill_tc(ds4_backend *be, const cb_attn_args &a);

/* Several sequences' one query each (attention_out_seqs: batched decode)
 * in one launch of each split kernel, sequence z in grid slot z; each
 * entry a one-query (T = 1) call as cb_attention_split takes it, with the
 * attention_out epilogue or without. False (nothing launched) when n is
 * outside 1..CB_ATTN_SEQS_MAX or the partials do not fit one launch. */
#define CB_ATTN_SEQS_MAX 16
struct cb_attn_seqs {
    cb_attn_args a[CB_ATTN_SEQS_MAX];
};
bool cb_attention_split_seqs(ds4_backend *be, const cb_attn_args *as, int n);
/* The split walk on the tensor cores (cuda_attn_prefill_tc.cu: all 64
 * heads of a chunk of rows a block, fp32-grade) for cb_attention_split and
 * cb_attention_split_seqs: the rows a chunk for a's shape (0: not taken:
 * heads not in 64s, DS4_CUDA_ATTN_TC_SPLIT=0, ...), and the launches
 * writing the combine's partials. */
int cb_attention_tc_split_rows(ds4_backend *be, const cb_attn_args &a);
bool cb_attention_tc_split(ds4_backend *be, const cb_attn_args &a, int t0, int tn, int rows, int max_chunks,
                           float *part, float2 *ml);
bool cb_attention_tc_split_seqs(ds4_backend *be, const cb_attn_seqs &S, int n, int rows, int max_chunks, float *part,
                                float2 *ml);

/* Split indexer (cuda_indexer_split.cu): scores across blocks in the CPU's
 * float order, then one block per query selects the top-k (score
 * descending, index ascending) and writes it in ascending index order.
 * fits: dim % 4 == 0, 16-byte aligned q and keys, T <= 65535. Arguments
 * as the indexer_topk op; qat_queries: the queries are the last
 * indexer_qat op's rows (cb_indexer_tc_bytes). */
bool cb_indexer_split_fits(int T, int n_heads, int dim, const float *qi, const float *keys);
void cb_indexer_split(ds4_backend *be, const float *qi, const float *w, int T, int n_heads, int dim,
                      const float *keys, int64_t pos0, int ratio, int topk, int32_t *sel, bool qat_queries);
/* Several sequences' one query each (indexer_topk_seqs: batched decode) in
 * one launch of each kernel: sequence i's query row i of qi, w and sel,
 * its keys[i] at position pos0[i]. False (nothing launched) when n_seq is
 * outside 1..CB_IS_SEQS_MAX or the shapes do not fit. */
#define CB_IS_SEQS_MAX 16
/* The scores of a prefill chunk's queries on the int8 tensor cores
 * (cuda_indexer_tc.cu), the CPU's bits: cb_indexer_tc_bytes gives the
 * scratch it needs past the scores, 0 where it does not take the call
 * (qat_queries: the queries are the last indexer_qat op's rows);
 * cb_indexer_tc_score writes scores[t][s] as cb_is_score_kernel does. */
size_t cb_indexer_tc_bytes(ds4_backend *be, const float *qi, int T, int n_heads, int dim, const float *keys,
                           int64_t pos0, int ratio, bool qat_queries);
void cb_indexer_tc_score(ds4_backend *be, const float *qi, const float *w, int T, const float *keys, int64_t pos0,
                         int ratio, int topk, float *scores, int64_t max_n, void *prep);
/* One decode query's scores (T = 1, its position *d_pos + pos_arg or
 * pos_arg) on the int8 tensor cores, the CPU's bits, each block preparing
 * its rows (cuda_indexer_tc.cu; opt-in, DS4_CUDA_IS_DEC_TC=1): fits says
 * whether it takes the call (switched on, the queries rounded by the last
 * indexer_qat op, 64 heads of 128);
 * cb_indexer_tc_decode writes scores[s] for s < the query's keys as
 * cb_is_score_kernel does, false (nothing launched, the backend failed)
 * when its shared memory cannot be granted. */
bool cb_indexer_tc_decode_fits(ds4_backend *be, const float *qi, int n_heads, int dim, const float *keys, int ratio,
                               bool qat_queries);
bool cb_indexer_tc_decode(ds4_backend *be, const float *qi, const float *w, const float *keys, const int64_t *d_pos,
                          int64_t pos_arg, int ratio, int topk, float *scores, int64_t max_n);
bool cb_indexer_split_seqs(ds4_backend *be, const float *qi, const float *w, int n_seq, int n_heads, int dim,
                           const float *const *keys, const int64_t *pos0, int ratio, int topk, int32_t *sel);

#endif

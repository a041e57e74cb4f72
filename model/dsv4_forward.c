/*
 * dsv4_forward.c - the DeepSeek V4 forward pass, written once against the
 * backend ops (backend/ops.h). One screen per sublayer; every step cites
 * shared/docs/dsv4-model.md.
 *
 * A call processes a chunk of T tokens at positions pos0 .. pos0+T-1 and
 * advances the session state (§3.10): prefill and decode are the same code
 * (decode is T = 1), and the result does not depend on how a sequence is
 * cut into chunks. Per layer (§3.10 "full per-token order"):
 *
 *   X --hc_pre--> attention(attn_norm(y)) --hc_post--> X
 *     --hc_pre--> moe(ffn_norm(y))        --hc_post--> X
 *
 * where X is the 4-stream residual state [T, n_hc, n_embd] (§3.1).
 *
 * The sublayers work on a pass (model/dsv4_pass.h): rows of activations
 * that may belong to several sequences, so the batched decode step
 * (dsv4_forward_batch.c) runs this same code. Row-wise ops take all the
 * rows at once; the loops over p->seq are the ops that need a sequence's
 * position or state. With one sequence (this file's dsv4_forward) the ops
 * and their order are those of a plain chunk.
 */
#include "model/dsv4_pass.h"

#include "backend/comm.h"
#include "util/error.h"
#include "util/throttle.h"

#include <math.h>
#include <string.h>

/* A sequence's own ops are counted for it: a batched step charges each
 * session the attention work that session caused (dsv4_forward_batch.c). */
static void seq_charge(const dsv4_pass *p, int i, const ds4_op_stats *mark)
{
    if (!p->seq_stats) return;
    const ds4_op_stats *now = &p->s->be->stats;
    ds4_op_stats *d = &p->seq_stats[i];
    d->rows_attended += now->rows_attended - mark->rows_attended;
    d->compressor_pushes += now->compressor_pushes - mark->compressor_pushes;
    d->rows_emitted += now->rows_emitted - mark->rows_emitted;
    d->indexer_keys_scored += now->indexer_keys_scored - mark->indexer_keys_scored;
    d->matmul_rows += now->matmul_rows - mark->matmul_rows;
}

/* Row `row` of a buffer of `width` floats (or ints) per row. */
static float *at_row(float *buf, int row, int64_t width) { return buf + (size_t)row * (size_t)width; }
static int32_t *at_row_i(int32_t *buf, int row, int64_t width) { return buf + (size_t)row * (size_t)width; }

/* §3.4-§3.6: attention sublayer; input s->a = RMSNorm(y, attn_norm),
 * output s->F (n_embd per row). */
/* Two products of the same input x, paired where the backend can. */
static void matmul2(ds4_backend *be, const ds4_weight *w1, const ds4_weight *w2, const float *x, int N, float *y1,
                    float *y2)
{
    if (be->matmul_pair) {
        be->matmul_pair(be, w1, w2, x, N, y1, y2);
        return;
    }
    be->matmul(be, w1, x, N, y1);
    be->matmul(be, w2, x, N, y2);
}

/* attention_out of every sequence of a batched step (each one row, rows
 * in sequence order) as one op; false when the step is not of that shape
 * (the caller then calls attention_out per sequence). Each sequence is
 * charged the rows its query attends (§3.4: the raw window up to its
 * position and the visible compressed rows, at most top-k of them where
 * the indexer selects), which is what the op counts for all of them. */
enum { MAX_SEQS = 64 };

/* Whether every sequence of the pass has one row, in sequence order (a
 * batched decode step of at most MAX_SEQS): then their positions. */
static bool one_row_each(const dsv4_pass *p, int64_t *pos0)
{
    if (p->n_seq > MAX_SEQS) return false;
    for (int i = 0; i < p->n_seq; i++) {
        if (p->seq[i].T != 1 || p->seq[i].row0 != i) return false;
        pos0[i] = p->seq[i].pos0;
    }
    return true;
}

static bool attention_out_seqs(const dsv4_pass *p, int il, int r, int H, int D, const ds4_weight *omega)
{
    dsv4_state *s = p->s;
    const dsv4_config *c = &s->m->cfg;
    const dsv4_layer *L = &s->m->layers[il];
    float *ring[MAX_SEQS];
    const float *comp[MAX_SEQS];
    int64_t pos0[MAX_SEQS];
    if (!one_row_each(p, pos0)) return false;
    for (int i = 0; i < p->n_seq; i++) {
        dsv4_layer_state *ls = &p->seq[i].st->layers[il];
        ring[i] = ls->ring;
        comp[i] = r ? ls->comp.rows : NULL;
    }
    s->be->attention_out_seqs(s->be, s->q, p->n_seq, H, D, s->kv, ring, c->window, pos0, r ? comp : NULL, r,
                              r == DSV4_CSA_RATIO ? s->sel : NULL, c->idx_topk, &L->sinks, c->n_rot, omega, s->o);
    for (int i = 0; p->seq_stats && i < p->n_seq; i++) {
        const int64_t raw = pos0[i] + 1 < c->window ? pos0[i] + 1 : c->window;
        int64_t nc = r ? (pos0[i] + 1) / r : 0;
        if (r == DSV4_CSA_RATIO && nc > c->idx_topk) nc = c->idx_topk;
        p->seq_stats[i].rows_attended += (uint64_t)(raw + nc);
    }
    return true;
}

/* The compressor pushes of a batched step's sequences (one row each at
 * pos0[i]) as one op: the layer's KV compressor, or with is_indexer the
 * indexer's. Each sequence is charged its push and, when its window
 * completes, the row emitted, as the op counts them for all. */
static void compressor_push_seqs(const dsv4_pass *p, int il, bool is_indexer, const int64_t *pos0,
                                 const ds4_weight *omega)
{
    dsv4_state *s = p->s;
    const dsv4_config *c = &s->m->cfg;
    const dsv4_layer *L = &s->m->layers[il];
    ds4_comp_state *st[MAX_SEQS];
    for (int i = 0; i < p->n_seq; i++) {
        dsv4_layer_state *ls = &p->seq[i].st->layers[il];
        st[i] = is_indexer ? &ls->idx : &ls->comp;
    }
    s->be->compressor_push_seqs(s->be, st, is_indexer ? s->ci : s->c, is_indexer ? s->zi : s->z, p->n_seq, pos0,
                                is_indexer ? &L->idx_ape : &L->comp_ape, is_indexer ? &L->idx_norm : &L->comp_norm,
                                c->rms_eps, omega, c->n_rot, &s->nm, is_indexer);
    for (int i = 0; p->seq_stats && i < p->n_seq; i++) {
        p->seq_stats[i].compressor_pushes += 1;
        p->seq_stats[i].rows_emitted += pos0[i] % st[i]->ratio == st[i]->ratio - 1;
    }
}

/* The indexer selections of a batched step's sequences as one op; each
 * sequence is charged the keys its query scores (all of its keys once
 * there are more than top-k, else none), as the op counts them. */
static void indexer_topk_seqs(const dsv4_pass *p, int il, const int64_t *pos0)
{
    dsv4_state *s = p->s;
    const dsv4_config *c = &s->m->cfg;
    const int r = c->compress_ratio[il];
    const float *keys[MAX_SEQS];
    for (int i = 0; i < p->n_seq; i++) keys[i] = p->seq[i].st->layers[il].idx.rows;
    s->be->indexer_topk_seqs(s->be, s->qi, s->wi, p->n_seq, c->idx_heads, c->idx_dim, keys, pos0, r, c->idx_topk,
                             s->sel);
    for (int i = 0; p->seq_stats && i < p->n_seq; i++) {
        const int64_t n = (pos0[i] + 1) / r;
        if (n > c->idx_topk) p->seq_stats[i].indexer_keys_scored += (uint64_t)n;
    }
}

/* The compressors of a compressed layer (§3.5): per-token kv/gate from the
 * normed input s->a; windows completed in this chunk are pooled, normed,
 * RoPE'd and appended to the sequences' states; in a CSA layer the same
 * for the lightning indexer's own compressor (§3.6), one key per window.
 * Reads s->a and the states, writes s->c, s->z, s->ci, s->zi and the
 * states: nothing else in the sublayer touches those before the indexer's
 * selection and the attention. */
static void compress_one(const dsv4_pass *p, int il, bool is_indexer, bool one_each, const int64_t *pos0,
                         const ds4_weight *omega)
{
    dsv4_state *s = p->s;
    const dsv4_config *c = &s->m->cfg;
    const dsv4_layer *L = &s->m->layers[il];
    ds4_backend *be = s->be;
    const ds4_weight *kv = is_indexer ? &L->idx_kv : &L->comp_kv;
    float *ck = is_indexer ? s->ci : s->c, *cz = is_indexer ? s->zi : s->z;
    matmul2(be, kv, is_indexer ? &L->idx_gate : &L->comp_gate, s->a, p->rows, ck, cz);
    if (one_each && be->compressor_push_seqs) {
        compressor_push_seqs(p, il, is_indexer, pos0, omega);
        return;
    }
    const int64_t w = kv->ne[1]; /* width_in: head_dim, x2 with the CSA overlap */
    for (int i = 0; i < p->n_seq; i++) {
        const dsv4_pass_seq *q = &p->seq[i];
        dsv4_layer_state *ls = &q->st->layers[il];
        ds4_op_stats mark = be->stats;
        be->compressor_push(be, is_indexer ? &ls->idx : &ls->comp, at_row(ck, q->row0, w), at_row(cz, q->row0, w),
                            q->T, q->pos0, is_indexer ? &L->idx_ape : &L->comp_ape,
                            is_indexer ? &L->idx_norm : &L->comp_norm, c->rms_eps, omega, c->n_rot, &s->nm,
                            is_indexer);
        seq_charge(p, i, &mark);
    }
}

static void compress(const dsv4_pass *p, int il, bool one_each, const int64_t *pos0, const ds4_weight *omega)
{
    dsv4_state *s = p->s;
    ds4_backend *be = s->be;
    const dsv4_config *c = &s->m->cfg;
    const bool csa = c->compress_ratio[il] == DSV4_CSA_RATIO;
    if (csa && p->n_seq == 1 && be->compress_two) {
        /* a CSA layer's compressor and its indexer's as one op */
        const dsv4_layer *L = &s->m->layers[il];
        dsv4_layer_state *ls = &p->seq[0].st->layers[il];
        const ds4_weight *const kv[2] = {&L->comp_kv, &L->idx_kv}, *const gate[2] = {&L->comp_gate, &L->idx_gate};
        const ds4_weight *const ape[2] = {&L->comp_ape, &L->idx_ape}, *const norm[2] = {&L->comp_norm, &L->idx_norm};
        float *const ck[2] = {s->c, s->ci}, *const cz[2] = {s->z, s->zi};
        ds4_comp_state *const st[2] = {&ls->comp, &ls->idx};
        ds4_op_stats mark = be->stats;
        be->compress_two(be, kv, gate, s->a, p->rows, ck, cz, st, p->seq[0].pos0, ape, norm, c->rms_eps, omega,
                         c->n_rot, &s->nm);
        mark.matmul_rows = be->stats.matmul_rows; /* the products are the pass's, as in compress_one */
        seq_charge(p, 0, &mark);
        return;
    }
    compress_one(p, il, false, one_each, pos0, omega);
    if (csa) compress_one(p, il, true, one_each, pos0, omega);
}

/* whether some query of the pass sees more than top_k keys of a CSA layer:
 * only then are keys scored (the indexer's query products made) */
static bool index_scoring(const dsv4_pass *p, int il)
{
    const dsv4_config *c = &p->s->m->cfg;
    const int r = c->compress_ratio[il];
    bool scoring = false;
    for (int i = 0; i < p->n_seq; i++) {
        const dsv4_pass_seq *q = &p->seq[i];
        scoring |= (q->pos0 + q->T) / r > c->idx_topk;
    }
    return scoring;
}

/* the indexer's head weights of the sublayer input (the selection reads them) */
static void index_weights(const dsv4_pass *p, int il)
{
    dsv4_state *s = p->s;
    s->be->matmul(s->be, &s->m->layers[il].idx_proj, s->a, p->rows, s->wi);
}

/* The lightning indexer's query products of a CSA layer (§3.6), once some
 * query sees more than top_k keys: its queries from qr (RoPE, and the QAT
 * round trip in the official numerics) and (weights) its head weights
 * from the sublayer input a. raw_qr: qr is q_a's output, normalized here
 * as the product reads it (rmsnorm_matmul). Reads s->qr, s->a; writes
 * s->qi, s->wi: nothing the query path or the compressors touch. */
static void index_query(const dsv4_pass *p, int il, const ds4_weight *omega, bool raw_qr, bool weights)
{
    dsv4_state *s = p->s;
    const dsv4_config *c = &s->m->cfg;
    const dsv4_layer *L = &s->m->layers[il];
    ds4_backend *be = s->be;
    const int N = p->rows, r = c->compress_ratio[il];
    const int64_t qw = (int64_t)c->idx_heads * c->idx_dim;
    if (!index_scoring(p, il)) return;
    if (raw_qr && p->n_seq == 1 && be->indexer_query_rope) {
        /* one sequence, which scores (index_scoring): every row roped */
        be->indexer_query_rope(be, s->qr, &L->q_a_norm, N, c->q_lora, c->rms_eps, &L->idx_q_b, s->qi, c->idx_heads,
                               c->idx_dim, c->n_rot, omega, p->seq[0].pos0, s->nm.indexer_qat);
        if (weights) index_weights(p, il);
        return;
    }
    /* one weight read for all rows; a sequence that does not score yet
     * selects every key and never reads its rows of qi, wi */
    if (raw_qr) be->rmsnorm_matmul(be, s->qr, &L->q_a_norm, N, c->q_lora, c->rms_eps, &L->idx_q_b, s->qi);
    else be->matmul(be, &L->idx_q_b, s->qr, N, s->qi);
    /* a batched step whose sequences all score: their rows in one op */
    bool all_score = p->n_seq > 1 && p->n_seq <= MAX_SEQS && N == p->n_seq && be->rope_seqs;
    int64_t pos0[MAX_SEQS];
    for (int i = 0; all_score && i < p->n_seq; i++) {
        all_score = (p->seq[i].pos0 + 1) / r > c->idx_topk && p->seq[i].row0 == i;
        pos0[i] = p->seq[i].pos0;
    }
    if (all_score) be->rope_seqs(be, s->qi, p->n_seq, c->idx_heads, c->idx_dim, c->n_rot, omega, pos0, false);
    for (int i = 0; !all_score && i < p->n_seq; i++) {
        const dsv4_pass_seq *q = &p->seq[i];
        if ((q->pos0 + q->T) / r > c->idx_topk)
            be->rope(be, at_row(s->qi, q->row0, qw), q->T, c->idx_heads, c->idx_dim, c->n_rot, omega, q->pos0,
                     false);
    }
    if (s->nm.indexer_qat) be->indexer_qat(be, s->qi, (int64_t)N * c->idx_heads, c->idx_dim);
    if (weights) index_weights(p, il);
}

/* The indexer's selection: top_k ids a query into s->sel from s->qi,
 * s->wi (index_query) and the keys compress() pushed. Reads those and the
 * indexer states; writes s->sel: nothing the query path touches. */
static void index_pick(const dsv4_pass *p, int il, bool one_each, const int64_t *pos0)
{
    dsv4_state *s = p->s;
    const dsv4_config *c = &s->m->cfg;
    ds4_backend *be = s->be;
    const int r = c->compress_ratio[il];
    const int64_t qw = (int64_t)c->idx_heads * c->idx_dim;
    if (one_each && be->indexer_topk_seqs)
        indexer_topk_seqs(p, il, pos0);
    else
        for (int i = 0; i < p->n_seq; i++) {
            const dsv4_pass_seq *q = &p->seq[i];
            ds4_op_stats mark = be->stats;
            be->indexer_topk(be, at_row(s->qi, q->row0, qw), at_row(s->wi, q->row0, c->idx_heads), q->T,
                             c->idx_heads, c->idx_dim, q->st->layers[il].idx.rows, q->pos0, r, c->idx_topk,
                             at_row_i(s->sel, q->row0, c->idx_topk));
            seq_charge(p, i, &mark);
        }
}

/* The lightning indexer of a CSA layer: index_query, then index_pick. */
static void index_select(const dsv4_pass *p, int il, bool one_each, const int64_t *pos0, const ds4_weight *omega,
                         bool raw_qr)
{
    index_query(p, il, omega, raw_qr, true);
    index_pick(p, il, one_each, pos0);
}

/* official numerics: FP8 on the non-RoPE dims, f16 storage (§4.1 D1, D3) */
static bool kv_rounded(const dsv4_state *s) { return s->nm.fp8_nope || s->nm.f16_store; }

/* §3.4's per-head RMSNorm_1 of q and the kv row's RMSNorm (its weight), the
 * partial RoPE at each row's position, the kv rounding of the official
 * numerics: in the fewest ops the backend offers (the kv product here when
 * matmul_pair did not make it). */
static void head_norms(const dsv4_pass *p, int il, bool kv_paired, bool one_each, const int64_t *pos0,
                       const ds4_weight *omega)
{
    dsv4_state *s = p->s;
    const dsv4_config *c = &s->m->cfg;
    const dsv4_layer *L = &s->m->layers[il];
    ds4_backend *be = s->be;
    const int N = p->rows, D = c->head_dim, H = dsv4_model_heads(s->m);
    const ds4_kv_numerics *nm = kv_rounded(s) ? &s->nm : NULL;
    if (be->rmsnorm_rope_qkv_seqs && kv_paired && one_each) {
        /* batched decode: the sequences' rows in one op */
        be->rmsnorm_rope_qkv_seqs(be, s->q, H, s->kv, &L->kv_norm, p->n_seq, D, c->rms_eps, c->n_rot, omega, pos0,
                                  nm);
    } else if (be->rmsnorm_rope_qkv && kv_paired) { /* the two rmsnorm_rope ops below as one */
        for (int i = 0; i < p->n_seq; i++) {
            const dsv4_pass_seq *q = &p->seq[i];
            be->rmsnorm_rope_qkv(be, at_row(s->q, q->row0, (int64_t)H * D), H, at_row(s->kv, q->row0, D), &L->kv_norm,
                                 q->T, D, c->rms_eps, c->n_rot, omega, q->pos0, nm);
        }
    } else if (be->rmsnorm_rope) { /* the same sequence below, one op per head norm + RoPE (+ rounding) */
        for (int i = 0; i < p->n_seq; i++) {
            const dsv4_pass_seq *q = &p->seq[i];
            be->rmsnorm_rope(be, at_row(s->q, q->row0, (int64_t)H * D), NULL, q->T, H, D, c->rms_eps, c->n_rot,
                             omega, q->pos0, NULL);
        }
        if (!kv_paired) be->matmul(be, &L->kv, s->a, N, s->kv);
        for (int i = 0; i < p->n_seq; i++) {
            const dsv4_pass_seq *q = &p->seq[i];
            be->rmsnorm_rope(be, at_row(s->kv, q->row0, D), &L->kv_norm, q->T, 1, D, c->rms_eps, c->n_rot, omega,
                             q->pos0, nm);
        }
    } else {
        be->rmsnorm(be, s->q, NULL, (int64_t)N * H, D, c->rms_eps, s->q);
        /* KV path: one shared head, K = V */
        if (!kv_paired) be->matmul(be, &L->kv, s->a, N, s->kv);
        be->rmsnorm(be, s->kv, &L->kv_norm, N, D, c->rms_eps, s->kv);
        /* partial interleaved RoPE on the trailing n_rot dims at each row's position */
        for (int i = 0; i < p->n_seq; i++) {
            const dsv4_pass_seq *q = &p->seq[i];
            be->rope(be, at_row(s->q, q->row0, (int64_t)H * D), q->T, H, D, c->n_rot, omega, q->pos0, false);
            be->rope(be, at_row(s->kv, q->row0, D), q->T, 1, D, c->n_rot, omega, q->pos0, false);
        }
        if (nm) be->kv_round(be, s->kv, N, D, nm);
    }
}

static void attention_sublayer(const dsv4_pass *p, int il)
{
    dsv4_state *s = p->s;
    const dsv4_config *c = &s->m->cfg;
    const dsv4_layer *L = &s->m->layers[il];
    ds4_backend *be = s->be;
    const int N = p->rows;
    /* tensor parallel: this rank's heads (the KV path is every rank's) */
    int r = c->compress_ratio[il], D = c->head_dim, H = dsv4_model_heads(s->m);
    /* sliding layers: base 10000 plain; compressed layers: 160000 + YaRN */
    const ds4_weight *omega = r ? &s->m->omega_comp : &s->m->omega_main;

    int64_t pos0[MAX_SEQS];
    const bool one_each = p->n_seq > 1 && one_row_each(p, pos0); /* a batched decode step */
    /* A decode step's compressors read only the sublayer input and their
     * own states, which only the attention reads: where the backend runs
     * ops beside others, they go first, beside the query path; in a CSA
     * layer the indexer's selection follows them there once qr is in. */
    const bool side = r && N == p->n_seq && be->side_begin && be->side_end && be->side_join;
    const bool csa = r == DSV4_CSA_RATIO;
    /* with the query products first, the indexer's head weights (they read
     * only the sublayer input) beside the compressors, where the backend asks */
    const bool idx_w_beside = csa && side && be->side_indexer_query_first && be->side_indexer_weights_beside &&
                              index_scoring(p, il);
    if (side) {
        be->side_begin(be);
        compress(p, il, one_each, pos0, omega);
        if (idx_w_beside) index_weights(p, il);
        be->side_end(be);
    }

    /* Q path (§3.4): qr = RMSNorm(W_q_a a); q = W_q_b qr; per-head RMSNorm_1 */
    /* q_a and kv read the same input: one op where the backend pairs them */
    const bool kv_paired = be->matmul_pair != NULL;
    if (kv_paired) be->matmul_pair(be, &L->q_a, &L->kv, s->a, N, s->qr, s->kv);
    else be->matmul(be, &L->q_a, s->a, N, s->qr);
    /* a CSA layer's indexer beside the query path: all of it, or (where the
     * backend asks) only its selection, its query products here */
    const bool idx_beside = csa && side && !be->side_indexer_query_first;
    /* qr kept as q_a gave it, each product of it normalizing it (one op
     * where the backend merges them), unless the indexer reads it beside;
     * a step of one row only: for more rows the backends have no merged
     * form, and a CSA layer's two products would each normalize a copy */
    const bool raw_qr = be->rmsnorm_matmul && !idx_beside && N == 1;
    if (!raw_qr) be->rmsnorm(be, s->qr, &L->q_a_norm, N, c->q_lora, c->rms_eps, s->qr);
    if (csa && side && !idx_beside) {
        /* the query products beside the compressors; only the selection
         * (which reads the keys they push) beside q_b */
        index_query(p, il, omega, raw_qr, !idx_w_beside);
        be->side_begin(be);
        index_pick(p, il, one_each, pos0);
        be->side_end(be);
    } else if (idx_beside) {
        /* the indexer reads qr: beside q_b and the head norms, after the pushes */
        be->side_begin(be);
        index_select(p, il, one_each, pos0, omega, false);
        be->side_end(be);
    }
    /* q_b and the head norms as one op where the backend has it (one row:
     * raw_qr; the rows' positions are one sequence's) */
    const bool q_rope = raw_qr && kv_paired && be->query_rope && p->n_seq == 1;
    if (q_rope)
        be->query_rope(be, s->qr, &L->q_a_norm, N, c->q_lora, c->rms_eps, &L->q_b, s->q, H, s->kv, &L->kv_norm, D,
                       c->n_rot, omega, p->seq[0].pos0, kv_rounded(s) ? &s->nm : NULL);
    else if (raw_qr) be->rmsnorm_matmul(be, s->qr, &L->q_a_norm, N, c->q_lora, c->rms_eps, &L->q_b, s->q);
    else be->matmul(be, &L->q_b, s->qr, N, s->q);
    if (!q_rope) head_norms(p, il, kv_paired, one_each, pos0, omega);

    if (!side) {
        if (r) compress(p, il, one_each, pos0, omega);
        if (csa) index_select(p, il, one_each, pos0, omega, raw_qr);
    } else {
        be->side_join(be);
    }

    /* batched decode: one op for the sequences' one row each */
    const bool batched = p->n_seq > 1 && be->attention_out_seqs && attention_out_seqs(p, il, r, H, D, omega);
    /* one sequence, no per-sequence stats: the attention and the output
     * projection as one op where the backend offers it (ops.h) */
    const bool project = p->n_seq == 1 && !p->seq_stats && be->attention_out && be->attention_out_project;
    for (int i = 0; !batched && i < p->n_seq; i++) {
        const dsv4_pass_seq *q = &p->seq[i];
        dsv4_layer_state *ls = &q->st->layers[il];
        float *qo = at_row(s->o, q->row0, (int64_t)H * D), *kv = at_row(s->kv, q->row0, D);
        ds4_op_stats mark = be->stats;
        const float *comp = r ? ls->comp.rows : NULL;
        const int32_t *sel = r == DSV4_CSA_RATIO ? at_row_i(s->sel, q->row0, c->idx_topk) : NULL;
        if (project) {
            be->attention_out_project(be, at_row(s->q, q->row0, (int64_t)H * D), q->T, H, D, kv, ls->ring, c->window,
                                      q->pos0, comp, r, sel, c->idx_topk, &L->sinks, c->n_rot, omega, qo, &L->o_a,
                                      dsv4_model_o_groups(s->m), s->u, &L->o_b, s->F);
            seq_charge(p, i, &mark);
            continue;
        }
        if (be->attention_out) { /* the three ops below as one */
            be->attention_out(be, at_row(s->q, q->row0, (int64_t)H * D), q->T, H, D, kv, ls->ring, c->window,
                              q->pos0, comp, r, sel, c->idx_topk, &L->sinks, c->n_rot, omega, qo);
            seq_charge(p, i, &mark);
            continue;
        }
        /* one softmax over raw window rows + visible compressed rows + sink */
        be->attention(be, at_row(s->q, q->row0, (int64_t)H * D), q->T, H, D, kv, ls->ring, c->window, q->pos0, comp,
                      r, sel, c->idx_topk, &L->sinks, qo);
        be->ring_push(be, ls->ring, c->window, D, kv, q->T, q->pos0);
        /* V = K carries RoPE: rotate the output back by -theta(p) */
        be->rope(be, qo, q->T, H, D, c->n_rot, omega, q->pos0, true);
        seq_charge(p, i, &mark);
    }
    /* grouped output projection: G groups of H/G heads -> o_lora each, then o_b */
    if (project) {
        /* done above */
    } else if (be->matmul_grouped_chain) {
        be->matmul_grouped_chain(be, &L->o_a, dsv4_model_o_groups(s->m), s->o, N, s->u, &L->o_b, s->F);
    } else {
        be->matmul_grouped(be, &L->o_a, dsv4_model_o_groups(s->m), s->o, N, s->u);
        be->matmul(be, &L->o_b, s->u, N, s->F);
    }
    /* split heads: each rank's o_b product is its share of the output */
    if (s->m->tp_attn) s->comm->allreduce_sum_f32(s->comm, s->F, (size_t)N * c->n_embd);
}

/* Tensor parallel: keep the selections of this rank's experts, as ids of
 * its expert slice, and mark the others -1 with weight 0 (ops.h). The
 * CUDA expert kernels index by id without that check, so there the others
 * become the slice's first expert with weight 0 (computed, adding 0; the
 * CUDA path is the slow first version, docs/TENSOR-PARALLEL.md). The
 * selections are a few ints per row: they go through the host. */
static void keep_own_experts(dsv4_state *s, int N, int K)
{
    int32_t ids[1024];
    float w[1024];
    const int lo = s->m->tp_e_lo, hi = s->m->tp_e_hi;
    const int32_t none = strcmp(s->be->name, "cpu") == 0 ? -1 : 0;
    for (int done = 0; done < N * K;) {
        int n = N * K - done < 1024 ? N * K - done : 1024;
        s->be->download(s->be, ids, s->esel + done, (size_t)n * sizeof(int32_t));
        s->be->download(s->be, w, s->ew + done, (size_t)n * sizeof(float));
        for (int i = 0; i < n; i++) {
            bool own = ids[i] >= lo && ids[i] < hi;
            ids[i] = own ? ids[i] - lo : none;
            w[i] = own ? w[i] : 0.0f;
        }
        s->be->upload(s->be, s->esel + done, ids, (size_t)n * sizeof(int32_t));
        s->be->upload(s->be, s->ew + done, w, (size_t)n * sizeof(float));
        done += n;
    }
}

/* Expert profile: the rows' selections of layer il, counted. The ids are
 * device memory, so a profiling run pays one small download per layer. */
static void count_selections(dsv4_state *s, int il, int N, int K)
{
    int32_t ids[1024];
    uint64_t *row = s->m->expert_counts + (size_t)il * (size_t)s->m->cfg.n_expert;
    for (int done = 0; done < N * K;) {
        int n = N * K - done < 1024 ? N * K - done : 1024;
        s->be->download(s->be, ids, s->esel + done, (size_t)n * sizeof(int32_t));
        for (int i = 0; i < n; i++) __atomic_fetch_add(&row[ids[i]], 1, __ATOMIC_RELAXED);
        done += n;
    }
}

/* §3.7: MoE sublayer; input s->a = RMSNorm(y, ffn_norm), output s->F. */
static void moe_sublayer(const dsv4_pass *p, int il)
{
    dsv4_state *s = p->s;
    const dsv4_config *c = &s->m->cfg;
    const dsv4_layer *L = &s->m->layers[il];
    ds4_backend *be = s->be;
    const int N = p->rows, K = c->n_expert_used;

    /* router: sqrt(softplus(W_gate_inp b)); hash layers take tid2eid[token],
     * others top-k of score + bias; weights from unbiased scores x scale */
    const ds4_weight *bias = L->has_bias ? &L->exp_probs_b : NULL, *hash = L->is_hash ? &L->tid2eid : NULL;
    const bool tp = dsv4_model_tp(s->m);
    /* a backend may run the shared expert beside the router (ops.h) */
    if (!tp && be->moe_shared && be->ffn_swiglu_ahead)
        be->ffn_swiglu_ahead(be, &L->gate_sh, &L->up_sh, &L->down_sh, s->a, N, c->swiglu_clamp[il]);
    if (be->moe_router) {
        be->moe_router(be, &L->gate_inp, s->a, N, s->rlogits, c->n_expert, K, bias, hash, s->tokens,
                       c->expert_weight_scale, s->esel, s->ew);
    } else {
        be->matmul(be, &L->gate_inp, s->a, N, s->rlogits);
        be->moe_route(be, s->rlogits, N, c->n_expert, K, bias, hash, s->tokens, c->expert_weight_scale, s->esel,
                      s->ew);
    }
    if (s->m->expert_counts) count_selections(s, il, N, K);
    if (tp) keep_own_experts(s, N, K);
    /* routed experts + the always-on shared expert, both clamped SwiGLU */
    if (!tp && be->moe_shared) {
        be->moe_shared(be, &L->gate_exps, &L->up_exps, &L->down_exps, &L->gate_sh, &L->up_sh, &L->down_sh, s->a,
                       N, s->esel, s->ew, K, c->swiglu_clamp[il], s->F);
        return;
    }
    be->moe_experts(be, &L->gate_exps, &L->up_exps, &L->down_exps, s->a, N, s->esel, s->ew, K,
                    c->swiglu_clamp[il], s->F, false);
    /* tensor parallel: the shared expert split like the experts, or on rank 0 */
    if (!tp || s->m->tp_shared || s->m->tp_rank == 0)
        be->ffn_swiglu(be, &L->gate_sh, &L->up_sh, &L->down_sh, s->a, N, c->swiglu_clamp[il], s->F,
                       true);
    /* every rank holds a share of the sum: it is one all-reduce */
    if (tp) s->comm->allreduce_sum_f32(s->comm, s->F, (size_t)N * c->n_embd);
}

/* One decoder layer (§3.3): two hyper-connection sites around the sublayers. */
/* The sublayer input a = RMSNorm(hc_pre collapse of X), post and comb (§3.3). */
static void hc_pre_norm(dsv4_state *s, const ds4_weight *fn, const ds4_weight *scale, const ds4_weight *base,
                        const ds4_weight *norm, int N)
{
    const dsv4_config *c = &s->m->cfg;
    ds4_backend *be = s->be;
    if (be->hc_pre_norm) {
        be->hc_pre_norm(be, s->X, N, c->n_hc, c->n_embd, fn, scale, base, c->sinkhorn_iters, c->rms_eps, c->hc_eps,
                        s->y, s->post, s->comb, norm, c->rms_eps, s->a);
        return;
    }
    be->hc_pre(be, s->X, N, c->n_hc, c->n_embd, fn, scale, base, c->sinkhorn_iters, c->rms_eps, c->hc_eps, s->y,
               s->post, s->comb);
    be->rmsnorm(be, s->y, norm, N, c->n_embd, c->rms_eps, s->a);
}

/* The same after the sublayer before's hc_post, which a backend with
 * hc_post_pre_norm runs in the same kernel (F, post and comb of that
 * sublayer are still in the state). */
static void hc_post_pre_norm(dsv4_state *s, const ds4_weight *fn, const ds4_weight *scale, const ds4_weight *base,
                             const ds4_weight *norm, int N)
{
    const dsv4_config *c = &s->m->cfg;
    ds4_backend *be = s->be;
    if (be->hc_post_pre_norm) {
        be->hc_post_pre_norm(be, s->X, N, c->n_hc, c->n_embd, s->F, s->post, s->comb, fn, scale, base,
                             c->sinkhorn_iters, c->rms_eps, c->hc_eps, s->y, s->post, s->comb, norm, c->rms_eps, s->a);
        return;
    }
    be->hc_post(be, s->X, N, c->n_hc, c->n_embd, s->F, s->post, s->comb);
    hc_pre_norm(s, fn, scale, base, norm, N);
}

/* post_in: the layer before left its last hc_post to this layer's first
 * hyper-connection site; post_out: leave this layer's last one to the next
 * layer (s->F, post and comb stay as they are until then). */
static void layer_forward(const dsv4_pass *p, int il, bool post_in, bool post_out)
{
    dsv4_state *s = p->s;
    const dsv4_config *c = &s->m->cfg;
    const dsv4_layer *L = &s->m->layers[il];
    ds4_backend *be = s->be;
    const int N = p->rows, E = c->n_embd, HC = c->n_hc;

    /* s->a: written by each sublayer's site, then only read by the
     * sublayer (ops.h sublayer_input) */
    if (be->sublayer_input) be->sublayer_input(be, s->a, N);
    if (post_in)
        hc_post_pre_norm(s, &L->hc_attn_fn, &L->hc_attn_scale, &L->hc_attn_base, &L->attn_norm, N);
    else
        hc_pre_norm(s, &L->hc_attn_fn, &L->hc_attn_scale, &L->hc_attn_base, &L->attn_norm, N);
    attention_sublayer(p, il);
    if (be->sublayer_input) be->sublayer_input(be, NULL, 0);
    if (s->steer_dir && s->steer_attn != 0.0f) dsv4_steer_rows(s, il, N, s->steer_attn);

    if (be->sublayer_input) be->sublayer_input(be, s->a, N);
    hc_post_pre_norm(s, &L->hc_ffn_fn, &L->hc_ffn_scale, &L->hc_ffn_base, &L->ffn_norm, N);
    moe_sublayer(p, il);
    if (be->sublayer_input) be->sublayer_input(be, NULL, 0);
    if (s->steer_dir && s->steer_ffn != 0.0f) dsv4_steer_rows(s, il, N, s->steer_ffn);
    if (s->capture) dsv4_capture_rows(s, il, N);
    if (!post_out) be->hc_post(be, s->X, N, HC, E, s->F, s->post, s->comb);
}

void dsv4_pass_layer(const dsv4_pass *p, int il) { layer_forward(p, il, false, false); }

void dsv4_pass_body(const dsv4_pass *p)
{
    dsv4_state *s = p->s;
    const dsv4_model *m = s->m;
    /* §3.1: embedding copied into every hyper-connection stream (a later
     * pipeline stage receives X from the stage before instead) */
    if (dsv4_model_has_embed(m)) s->be->embed(s->be, &m->tok_embd, s->tokens, p->rows, m->cfg.n_hc, s->X);
    bool pending = false; /* the last layer's final hc_post is left to this one */
    for (int il = m->layer_lo; il < m->layer_hi; il++) {
        /* --power: a prefill chunk rests between layers (decode: per step),
         * with X complete */
        const bool rest = s->throttle && p->rows > 1;
        const bool leave = s->be->hc_post_pre_norm && il + 1 < m->layer_hi && !rest;
        layer_forward(p, il, pending, leave);
        pending = leave;
        if (rest) {
            if (s->be->sync) s->be->sync(s->be);
            ds4_throttle_point(s->throttle);
        }
    }
}

void dsv4_pass_head(const dsv4_pass *p, int first, int n)
{
    dsv4_state *s = p->s;
    const dsv4_model *m = s->m;
    const dsv4_config *c = &m->cfg;
    ds4_backend *be = s->be;
    const float *Xo = s->X + (size_t)first * c->n_hc * c->n_embd;
    be->hc_head(be, Xo, n, c->n_hc, c->n_embd, &m->out_hc_fn, &m->out_hc_scale, &m->out_hc_base, c->rms_eps,
                c->hc_eps, s->hy);
    be->rmsnorm(be, s->hy, &m->out_norm, n, c->n_embd, c->rms_eps, s->hy);
    if (!m->tp_vocab) {
        be->matmul(be, &m->output, s->hy, n, s->logits);
        return;
    }
    /* tensor parallel: this rank's vocabulary rows, then every rank's in
     * rank order (= vocabulary order) into each row of rank 0's logits
     * (the front end's; the other ranks keep none) */
    const int64_t Vr = m->output.ne[1];
    be->matmul(be, &m->output, s->hy, n, s->tp_logits);
    for (int t = 0; t < n; t++)
        s->comm->gather_f32(s->comm, s->tp_logits + (size_t)t * Vr, (size_t)Vr,
                            m->tp_rank == 0 ? s->logits + (size_t)t * c->n_vocab : NULL, 0);
}

bool dsv4_pass_has_head(const dsv4_state *s)
{
    const dsv4_model *m = s->m;
    /* tensor parallel with the head not split: rank 0 computes it alone */
    return dsv4_model_has_head(m) && (!dsv4_model_tp(m) || m->tp_vocab || m->tp_rank == 0);
}

ds4_status dsv4_forward(dsv4_state *s, const int32_t *tokens, int T, bool all, float *logits)
{
    if (!dsv4_model_is_whole(s->m))
        return ds4_fail(DS4_ERR_INVALID, "forward: this model holds layers %d:%d only (a pipeline stage)",
                        s->m->layer_lo, s->m->layer_hi);
    return dsv4_forward_stage(s, tokens, T, NULL, NULL, all, logits);
}

ds4_status dsv4_forward_stage(dsv4_state *s, const int32_t *tokens, int T, const float *x_in, float *x_out,
                              bool all, float *logits)
{
    const dsv4_config *c = &s->m->cfg;
    ds4_backend *be = s->be;
    if (T < 1 || T > s->max_chunk)
        return ds4_fail(DS4_ERR_INVALID, "forward: chunk of %d tokens (1..%d allowed)", T, s->max_chunk);
    if (s->n_pos + T > s->n_ctx)
        return ds4_fail(DS4_ERR_INVALID, "forward: context full: %lld + %d tokens > context length %lld",
                        (long long)s->n_pos, T, (long long)s->n_ctx);
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= c->n_vocab)
            return ds4_fail(DS4_ERR_INVALID, "forward: token id %d at chunk index %d outside vocabulary [0, %d)",
                            tokens[t], t, c->n_vocab);
    if (!dsv4_model_has_embed(s->m) && !x_in)
        return ds4_fail(DS4_ERR_INVALID, "forward: a stage from layer %d needs the residual stream", s->m->layer_lo);
    /* the hash layers route by token id, so every stage gets the tokens */
    be->upload(be, s->tokens, tokens, (size_t)T * sizeof(int32_t));
    const size_t xbytes = (size_t)T * c->n_hc * c->n_embd * sizeof(float);
    if (x_in) be->upload(be, s->X, x_in, xbytes);

    const dsv4_pass_seq seq = {s, s->n_pos, 0, T};
    const dsv4_pass p = {s, T, &seq, 1, NULL};
    const bool head = dsv4_pass_has_head(s);
    /* a decode step may be recorded and replayed by the backend (CUDA
     * graph); it may ask for the step's ops once more (see ops.h) */
    /* (not while profiling: its per-layer downloads cannot be replayed) */
    /* (nor with steering or --power: host work between the layers) */
    /* (nor in a tensor-parallel run: the collectives are not in the recording) */
    const bool step = T == 1 && be->step_begin && be->step_end && !s->m->expert_counts && !s->steer_dir &&
                      !s->throttle && !s->capture && !dsv4_model_tp(s->m);
    if (s->throttle) ds4_throttle_start(s->throttle);
    const bool issued = step && be->step_begin(be, s->n_pos, s);
    const int first = all ? 0 : T - 1, R = s->logit_rows;
    const size_t V = (size_t)c->n_vocab;
    /* the rows past the logits buffer's (all-row prefill) go in groups,
     * each downloaded before the next overwrites it; the last group stays
     * on the backend like a decode step's row and is downloaded below */
    const int last = first + (T - 1 - first) / R * R;
    if (!issued) {
        do {
            dsv4_pass_body(&p);
            /* §3.8: final HC collapse, norm, LM head (all tokens, or the last one) */
            for (int g = first; head && g < last; g += R) {
                dsv4_pass_head(&p, g, R);
                if (logits) be->download(be, logits + (size_t)(g - first) * V, s->logits, (size_t)R * V * sizeof(float));
            }
            if (head) dsv4_pass_head(&p, last, T - last);
        } while (step && be->step_end(be));
    }
    /* an op that failed (a kernel that did not launch) left wrong numbers:
     * the step fails, its position not taken */
    const ds4_status bst = be->status ? be->status(be) : DS4_OK;
    if (bst != DS4_OK) return bst;
    s->n_pos += T;
    /* the next decode step's walk while the device runs this one (its ops
     * depend on the position, not on the token, which comes in s->tokens) */
    if (step && be->step_ahead && s->n_pos < s->n_ctx && be->step_ahead(be, s->n_pos, s)) {
        const dsv4_pass_seq nseq = {s, s->n_pos, 0, 1};
        const dsv4_pass np = {s, 1, &nseq, 1, NULL};
        dsv4_pass_body(&np);
        if (head) dsv4_pass_head(&np, 0, 1);
        be->step_end(be);
    }
    if (x_out) be->download(be, x_out, s->X, xbytes);
    if (head && logits)
        be->download(be, logits + (size_t)(last - first) * V, s->logits, (size_t)(T - last) * V * sizeof(float));
    if (s->comm && s->comm->status(s->comm) != DS4_OK) return s->comm->status(s->comm);
    if (s->throttle && T == 1) {
        if (be->sync) be->sync(be);
        ds4_throttle_point(s->throttle);
    }
    return DS4_OK;
}

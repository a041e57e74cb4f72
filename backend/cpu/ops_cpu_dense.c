/*
 * ops_cpu_dense.c - CPU ops of backend/ops.h on dense activations: weight
 * matmuls (plain and block-diagonal), RMSNorm, RoPE, the embedding lookup.
 * Math: dsv4-model.md §3.1 (embedding), §3.2 (norms), §3.4 (RoPE, grouped
 * output projection).
 */
#include "backend/cpu/ops_cpu.h"

#include "backend/cpu/cpu_matmul_kernels.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static void op_matmul(ds4_backend *be, const ds4_weight *w, const float *x, int T, float *y)
{
    cpu_matmul_raw(be, w->type, w->data, w->ne[1], w->ne[0], x, T, y);
}

/* Two products of one token's input (attention: q_a with kv; the
 * compressor's and the indexer's kv with gate) in one pool run: the token
 * converted once per weight type, the rows of both matrices split into
 * chunks of one task list, each row the bits of its own matmul
 * (ds4_cpu_mv_rows). More tokens, or a type without the one-token path:
 * the two matmuls. */
#define PAIR_CHUNK 64

struct pair_job {
    const ds4_mv_token *tok[2];
    const void *w[2];
    float *y[2];
    int64_t rows[2], chunks0;
};

static void pair_task(void *arg, int64_t i, int thread_index)
{
    (void)thread_index;
    const struct pair_job *j = arg;
    int m = i >= j->chunks0;
    int64_t r0 = (m ? i - j->chunks0 : i) * PAIR_CHUNK;
    int64_t r1 = r0 + PAIR_CHUNK < j->rows[m] ? r0 + PAIR_CHUNK : j->rows[m];
    ds4_cpu_mv_rows(j->tok[m], j->w[m], r0, r1, j->y[m] + r0);
}

static void op_matmul_pair(ds4_backend *be, const ds4_weight *w1, const ds4_weight *w2, const float *x, int T,
                           float *y1, float *y2)
{
    const ds4_weight *w[2] = {w1, w2};
    size_t b[2] = {0, 0};
    if (T == 1 && w1->ne[0] == w2->ne[0]) {
        b[0] = ds4_cpu_mv_bytes(w1->type, w1->ne[0]);
        b[1] = w2->type == w1->type ? 0 : ds4_cpu_mv_bytes(w2->type, w2->ne[0]);
    }
    int shared = w2->type == w1->type;
    uint8_t *buf = b[0] && (shared || b[1]) ? cpu_scratch(be, 1, b[0] + b[1] + 64) : NULL;
    if (!buf) {
        op_matmul(be, w1, x, T, y1);
        op_matmul(be, w2, x, T, y2);
        return;
    }
    ds4_mv_token tok[2];
    ds4_cpu_mv_pack(w1->type, w1->ne[0], x, buf, &tok[0]);
    if (!shared) ds4_cpu_mv_pack(w2->type, w2->ne[0], x, buf + ((b[0] + 63) & ~(size_t)63), &tok[1]);
    struct pair_job j = {{&tok[0], shared ? &tok[0] : &tok[1]}, {w1->data, w2->data}, {y1, y2},
                         {w1->ne[1], w2->ne[1]}, (w1->ne[1] + PAIR_CHUNK - 1) / PAIR_CHUNK};
    for (int m = 0; m < 2; m++) be->stats.matmul_rows += (uint64_t)w[m]->ne[1];
    cpu_parallel(be, j.chunks0 + (w2->ne[1] + PAIR_CHUNK - 1) / PAIR_CHUNK, pair_task, &j);
    cpu_of(be)->pair_calls++;
}

/* Block-diagonal product of one token in one pool run: the groups' inputs
 * are consecutive slices of x, each converted once, and the rows of all
 * groups split into chunks of one task list (a matmul per group was a pool
 * run per group: 8 barriers a layer for Flash's o_a). Each row gets the
 * bits of its group's own matmul (ds4_cpu_mv_rows). Returns false where
 * the one-token path does not apply. */
#define GROUPED_MAX 64

struct grouped_job {
    ds4_mv_token tok[GROUPED_MAX];
    const uint8_t *w;
    size_t group_bytes;
    float *y;
    int64_t rows, chunks; /* per group */
};

static void grouped_task(void *arg, int64_t i, int thread_index)
{
    (void)thread_index;
    const struct grouped_job *j = arg;
    int g = (int)(i / j->chunks);
    int64_t r0 = (i % j->chunks) * PAIR_CHUNK, r1 = r0 + PAIR_CHUNK < j->rows ? r0 + PAIR_CHUNK : j->rows;
    ds4_cpu_mv_rows(&j->tok[g], j->w + (size_t)g * j->group_bytes, r0, r1, j->y + (size_t)g * j->rows + r0);
}

static bool grouped_one_token(ds4_backend *be, const ds4_weight *w, int groups, const float *x, float *y)
{
    int64_t cols = w->ne[0], rows = w->ne[1] / groups;
    size_t xb = groups <= GROUPED_MAX ? ds4_cpu_mv_bytes(w->type, cols) : 0;
    if (!xb) return false;
    xb = (xb + 63) & ~(size_t)63;
    uint8_t *buf = cpu_scratch(be, 1, (size_t)groups * xb + 64);
    struct grouped_job *j = cpu_scratch(be, 0, sizeof(struct grouped_job));
    if (!buf || !j) return false;
    buf = (uint8_t *)(((uintptr_t)buf + 63) & ~(uintptr_t)63);
    for (int g = 0; g < groups; g++) ds4_cpu_mv_pack(w->type, cols, x + (size_t)g * cols, buf + (size_t)g * xb, &j->tok[g]);
    j->w = w->data;
    j->group_bytes = (size_t)rows * cpu_row_bytes(w->type, cols);
    j->y = y;
    j->rows = rows;
    j->chunks = (rows + PAIR_CHUNK - 1) / PAIR_CHUNK;
    be->stats.matmul_rows += (uint64_t)w->ne[1];
    cpu_parallel(be, (int64_t)groups * j->chunks, grouped_task, j);
    cpu_of(be)->grouped_calls++;
    return true;
}

/* Block-diagonal product: run each group as its own matmul on a gathered
 * copy of that group's input columns (one token: in one pool run). */
static void op_matmul_grouped(ds4_backend *be, const ds4_weight *w, int groups,
                              const float *x, int T, float *y)
{
    if (T == 1 && grouped_one_token(be, w, groups, x, y)) return;
    int64_t cols = w->ne[0], rows = w->ne[1] / groups;
    size_t rb = cpu_row_bytes(w->type, cols);
    float *xs = cpu_scratch(be, 0, (size_t)T * (size_t)(cols + rows) * sizeof(float));
    float *ys = xs + (size_t)T * (size_t)cols;
    for (int g = 0; g < groups; g++) {
        for (int t = 0; t < T; t++)
            memcpy(xs + (size_t)t * cols, x + ((size_t)t * groups + g) * cols, (size_t)cols * sizeof(float));
        cpu_matmul_raw(be, w->type, (const char *)w->data + (size_t)g * rows * rb, rows, cols, xs, T, ys);
        for (int t = 0; t < T; t++)
            memcpy(y + ((size_t)t * groups + g) * rows, ys + (size_t)t * rows, (size_t)rows * sizeof(float));
    }
}

typedef struct {
    const float *x, *wv;
    float *out;
    int n;
    float eps;
} norm_task;

static void norm_row(void *arg, int64_t r, int thread)
{
    (void)thread;
    norm_task *k = arg;
    const float *xr = k->x + (size_t)r * k->n;
    float *o = k->out + (size_t)r * k->n;
    double ss = 0;
    for (int i = 0; i < k->n; i++) ss += (double)xr[i] * xr[i];
    float s = (float)(1.0 / sqrt(ss / k->n + k->eps));
    for (int i = 0; i < k->n; i++) o[i] = k->wv ? (xr[i] * s) * k->wv[i] : xr[i] * s;
}

static void op_rmsnorm(ds4_backend *be, const float *x, const ds4_weight *w,
                       int64_t n_rows, int n, float eps, float *out)
{
    norm_task k = {x, NULL, out, n, eps};
    k.wv = w ? cpu_weight_f32(w, cpu_scratch(be, 0, (size_t)n * sizeof(float))) : NULL;
    if (n_rows * n < 65536) { /* small: not worth waking the pool */
        for (int64_t r = 0; r < n_rows; r++) norm_row(&k, r, 0);
        return;
    }
    cpu_parallel(be, n_rows, norm_row, &k);
}

typedef struct {
    float *x;
    int n_heads, head_dim, n_rot;
    const float *om;
    int64_t pos0;
    const int64_t *pos; /* rope_seqs: row t at pos[t], else pos0 + t */
    bool inverse;
} rope_task;

static void rope_token(void *arg, int64_t t, int thread)
{
    (void)thread;
    rope_task *k = arg;
    float pos = (float)(k->pos ? k->pos[t] : k->pos0 + t);
    for (int i = 0; i < k->n_rot / 2; i++) {
        float theta = pos * k->om[i]; /* one fp32 product, as the reference (§3.11) */
        float c = (float)cos((double)theta), s = (float)sin((double)theta);
        if (k->inverse) s = -s;
        for (int h = 0; h < k->n_heads; h++) {
            float *v = k->x + ((size_t)t * k->n_heads + h) * k->head_dim + (k->head_dim - k->n_rot) + 2 * i;
            float x0 = v[0], x1 = v[1];
            v[0] = x0 * c - x1 * s;
            v[1] = x0 * s + x1 * c;
        }
    }
}

static void op_rope(ds4_backend *be, float *x, int T, int n_heads, int head_dim,
                    int n_rot, const ds4_weight *omega, int64_t pos0, bool inverse)
{
    rope_task k = {x, n_heads, head_dim, n_rot, omega->data, pos0, NULL, inverse};
    if (T == 1) rope_token(&k, 0, 0);
    else cpu_parallel(be, T, rope_token, &k);
}

/* a batched step's rows, each at its sequence's position, in one parallel pass */
static void op_rope_seqs(ds4_backend *be, float *x, int n_seq, int n_heads, int head_dim, int n_rot,
                         const ds4_weight *omega, const int64_t *pos0, bool inverse)
{
    rope_task k = {x, n_heads, head_dim, n_rot, omega->data, 0, pos0, inverse};
    cpu_parallel(be, n_seq, rope_token, &k);
}

static void op_embed(ds4_backend *be, const ds4_weight *tok_embd, const int32_t *tokens,
                     int T, int n_hc, float *X)
{
    int64_t D = tok_embd->ne[0];
    float *tmp = cpu_scratch(be, 0, (size_t)D * sizeof(float));
    for (int t = 0; t < T; t++) {
        const float *row = cpu_weight_row(tok_embd, tokens[t], tmp);
        for (int s = 0; s < n_hc; s++)
            memcpy(X + ((size_t)t * n_hc + s) * D, row, (size_t)D * sizeof(float));
    }
}

void cpu_install_dense(ds4_backend *be)
{
    be->matmul = op_matmul;
    be->matmul_grouped = op_matmul_grouped;
    be->matmul_pair = op_matmul_pair;
    be->rmsnorm = op_rmsnorm;
    be->rope = op_rope;
    be->rope_seqs = op_rope_seqs;
    be->embed = op_embed;
}

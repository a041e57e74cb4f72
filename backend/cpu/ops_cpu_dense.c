/*
 * ops_cpu_dense.c - CPU ops of backend/ops.h on dense activations: weight
 * matmuls (plain and block-diagonal), RMSNorm, RoPE, the embedding lookup.
 * Math: dsv4-model.md §3.1 (embedding), §3.2 (norms), §3.4 (RoPE, grouped
 * output projection).
 */
#include "backend/cpu/ops_cpu.h"

#include <math.h>
#include <string.h>

static void op_matmul(ds4_backend *be, const ds4_weight *w, const float *x, int T, float *y)
{
    cpu_matmul_raw(be, w->type, w->data, w->ne[1], w->ne[0], x, T, y);
}

/* Block-diagonal product: run each group as its own matmul on a gathered
 * copy of that group's input columns. */
static void op_matmul_grouped(ds4_backend *be, const ds4_weight *w, int groups,
                              const float *x, int T, float *y)
{
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
    bool inverse;
} rope_task;

static void rope_token(void *arg, int64_t t, int thread)
{
    (void)thread;
    rope_task *k = arg;
    float pos = (float)(k->pos0 + t);
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
    rope_task k = {x, n_heads, head_dim, n_rot, omega->data, pos0, inverse};
    if (T == 1) rope_token(&k, 0, 0);
    else cpu_parallel(be, T, rope_token, &k);
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
    be->rmsnorm = op_rmsnorm;
    be->rope = op_rope;
    be->embed = op_embed;
}

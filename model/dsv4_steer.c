/*
 * dsv4_steer.c - directional steering of a sublayer's output.
 *
 * The edit is y <- y - S v (v . y) on the sublayer output F (the attention
 * sublayer after its output projection, the MoE sublayer after routed +
 * shared experts are summed), before hc_post spreads F into the four
 * residual streams. With a unit v and S = 1 the component along v is
 * removed; S < 0 amplifies it. The rows are brought to the host and back
 * (a copy on the CPU backend): steering is a per-session option, not a
 * speed path, so it costs no kernel in every backend.
 */
#include "model/dsv4_state.h"

void dsv4_steer_rows(dsv4_state *s, int il, int N, float scale)
{
    const int E = s->m->cfg.n_embd;
    const float *v = s->steer_dir + (size_t)il * (size_t)E;
    float *h = s->steer_buf;
    size_t bytes = (size_t)N * (size_t)E * sizeof(float);
    s->be->download(s->be, h, s->F, bytes);
    for (int r = 0; r < N; r++) {
        float *y = h + (size_t)r * (size_t)E;
        double d = 0;
        for (int i = 0; i < E; i++) d += (double)v[i] * (double)y[i];
        float k = (float)((double)scale * d);
        for (int i = 0; i < E; i++) y[i] -= k * v[i];
    }
    s->be->upload(s->be, s->F, h, bytes);
}

void dsv4_capture_rows(dsv4_state *s, int il, int N)
{
    const int E = s->m->cfg.n_embd;
    float *h = s->steer_buf;
    s->be->download(s->be, h, s->F, (size_t)N * (size_t)E * sizeof(float));
    double *sum = s->capture + (size_t)il * (size_t)E;
    for (int r = 0; r < N; r++)
        for (int i = 0; i < E; i++) sum[i] += (double)h[(size_t)r * (size_t)E + (size_t)i];
    if (il == 0) s->capture_rows += N;
}

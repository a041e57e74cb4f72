/*
 * session_edit.c - per-session edits of the forward pass that leave the
 * model untouched: directional steering (a unit direction per layer
 * projected out of the sublayer outputs, scaled) and the --power duty
 * cycle; plus the capture of mean FFN outputs that builds a direction
 * (ds4-steer). The math is in model/dsv4_steer.c and util/throttle.c;
 * this file owns the host buffers and checks what users give.
 */
#include "include/ds4.h"

#include "engine/model_access.h"
#include "engine/session_access.h"
#include "model/dsv4_state.h"
#include "util/error.h"
#include "util/throttle.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int ds4_model_n_embd(const ds4_model *m) { return ds4_model_dsv4(m)->cfg.n_embd; }

/* A unit row within this of 1 is accepted as written; rows are stored as
 * f32, so a normalised row is within ~1e-6. */
#define STEER_NORM_TOL 1e-3

ds4_status ds4_steering_file_read(const ds4_model *m, const char *path, float **out)
{
    const dsv4_config *c = &ds4_model_dsv4(m)->cfg;
    size_t n = (size_t)c->n_layer * (size_t)c->n_embd, want = n * sizeof(float);
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return ds4_fail(DS4_ERR_IO, "steering file %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return ds4_fail(DS4_ERR_IO, "steering file %s: not a regular file", path);
    }
    if ((uint64_t)sb.st_size != (uint64_t)want) {
        fclose(f);
        return ds4_fail(DS4_ERR_FORMAT,
                        "steering file %s: %lld bytes, this model needs %zu (f32, %d layers x %d embedding dims)", path,
                        (long long)sb.st_size, want, c->n_layer, c->n_embd);
    }
    float *d = malloc(want);
    if (!d) {
        fclose(f);
        return ds4_fail(DS4_ERR_NOMEM, "steering file %s: out of memory", path);
    }
    size_t got = fread(d, 1, want, f);
    fclose(f);
    if (got != want) {
        free(d);
        return ds4_fail(DS4_ERR_IO, "steering file %s: short read (%zu of %zu bytes)", path, got, want);
    }
    ds4_status st = ds4_steering_check(m, d);
    if (st != DS4_OK) {
        free(d);
        ds4_error_prefix("steering file %s: ", path);
        return st;
    }
    *out = d;
    return DS4_OK;
}

ds4_status ds4_steering_check(const ds4_model *m, const float *dirs)
{
    const dsv4_config *c = &ds4_model_dsv4(m)->cfg;
    for (int l = 0; l < c->n_layer; l++) {
        const float *v = dirs + (size_t)l * (size_t)c->n_embd;
        double nn = 0;
        for (int i = 0; i < c->n_embd; i++) {
            if (!isfinite(v[i]))
                return ds4_fail(DS4_ERR_FORMAT, "layer %d, dim %d: value is not finite", l, i);
            nn += (double)v[i] * (double)v[i];
        }
        /* a zero row leaves that layer alone; otherwise a unit direction */
        if (nn != 0 && fabs(sqrt(nn) - 1.0) > STEER_NORM_TOL)
            return ds4_fail(DS4_ERR_FORMAT, "layer %d: direction has norm %.6g, not 1 (nor 0 for no steering)", l,
                            sqrt(nn));
    }
    return DS4_OK;
}

/* The edits of a session, allocated on first use (engine-owned; the state
 * points into it). */
typedef struct {
    float *dir, *buf;
    ds4_throttle th;
    double *cap_sum;
} session_edits;

static session_edits *edits(ds4_session *s)
{
    session_edits **e = (session_edits **)ds4_session_edits_slot(s);
    if (!*e) *e = calloc(1, sizeof **e);
    return *e;
}

ds4_status ds4_session_set_steering(ds4_session *s, const float *dirs, float attn, float ffn)
{
    dsv4_state *st = ds4_session_dsv4(s);
    const dsv4_config *c = &st->m->cfg;
    if (!isfinite(attn) || !isfinite(ffn))
        return ds4_fail(DS4_ERR_INVALID, "steering: scales must be finite (attn %g, ffn %g)", attn, ffn);
    if (dirs && (attn != 0.0f || ffn != 0.0f) && !dsv4_model_is_whole(st->m))
        return ds4_fail(DS4_ERR_UNSUPPORTED, "steering: not available in a distributed run (the other ranks' layers "
                                             "would not be steered)");
    if (dirs && (attn != 0.0f || ffn != 0.0f) && dsv4_model_tp(st->m))
        return ds4_fail(DS4_ERR_UNSUPPORTED, "steering: not available with tensor parallel (only rank 0's rows "
                                             "would be steered)");
    session_edits *e = edits(s);
    if (!e) return ds4_fail(DS4_ERR_NOMEM, "steering: out of memory");
    if (!dirs || (attn == 0.0f && ffn == 0.0f)) {
        st->steer_dir = NULL; /* off: the pass is exactly the plain one */
        st->steer_attn = st->steer_ffn = 0;
        return DS4_OK;
    }
    size_t n = (size_t)c->n_layer * (size_t)c->n_embd;
    if (!e->dir) e->dir = malloc(n * sizeof(float));
    if (!e->buf) e->buf = malloc((size_t)st->max_chunk * (size_t)c->n_embd * sizeof(float));
    if (!e->dir || !e->buf) return ds4_fail(DS4_ERR_NOMEM, "steering: out of memory");
    memcpy(e->dir, dirs, n * sizeof(float));
    st->steer_dir = e->dir;
    st->steer_buf = e->buf;
    st->steer_attn = attn;
    st->steer_ffn = ffn;
    return DS4_OK;
}

ds4_status ds4_session_set_power(ds4_session *s, int percent)
{
    if (percent < 1 || percent > 100)
        return ds4_fail(DS4_ERR_INVALID, "power: %d%% (1..100 allowed; 100 = full speed)", percent);
    dsv4_state *st = ds4_session_dsv4(s);
    session_edits *e = edits(s);
    if (!e) return ds4_fail(DS4_ERR_NOMEM, "power: out of memory");
    e->th.percent = percent;
    st->throttle = percent < 100 ? &e->th : NULL;
    return DS4_OK;
}

void ds4_session_set_power_sleep(ds4_session *s, void (*fn)(double seconds, void *ctx), void *ctx)
{
    session_edits *e = edits(s);
    if (!e) return;
    e->th.sleep_fn = fn;
    e->th.sleep_ctx = ctx;
}

void ds4_session_power_stats(ds4_session *s, ds4_power_stats *out)
{
    session_edits *e = edits(s);
    memset(out, 0, sizeof *out);
    if (!e) return;
    out->sleeps = e->th.sleeps;
    out->slept_s = e->th.slept_s;
    out->busy_s = e->th.busy_s;
}

void ds4_session_edits_free(void *p)
{
    session_edits *e = p;
    if (!e) return;
    free(e->dir);
    free(e->buf);
    free(e->cap_sum);
    free(e);
}

ds4_status ds4_session_capture_ffn(ds4_session *s, int on)
{
    dsv4_state *st = ds4_session_dsv4(s);
    const dsv4_config *c = &st->m->cfg;
    if (on && dsv4_model_tp(st->m))
        return ds4_fail(DS4_ERR_UNSUPPORTED, "capture: not available with tensor parallel");
    session_edits *e = edits(s);
    if (!e) return ds4_fail(DS4_ERR_NOMEM, "capture: out of memory");
    if (!on) {
        st->capture = NULL;
        return DS4_OK;
    }
    if (!e->buf) e->buf = malloc((size_t)st->max_chunk * (size_t)c->n_embd * sizeof(float));
    if (!e->cap_sum) e->cap_sum = calloc((size_t)c->n_layer * (size_t)c->n_embd, sizeof(double));
    if (!e->buf || !e->cap_sum) return ds4_fail(DS4_ERR_NOMEM, "capture: out of memory");
    st->steer_buf = e->buf;
    st->capture = e->cap_sum;
    return DS4_OK;
}

int64_t ds4_session_capture_take(ds4_session *s, double *means)
{
    dsv4_state *st = ds4_session_dsv4(s);
    const dsv4_config *c = &st->m->cfg;
    session_edits *e = edits(s);
    size_t n = (size_t)c->n_layer * (size_t)c->n_embd;
    int64_t rows = st->capture_rows;
    if (!e || !e->cap_sum) {
        memset(means, 0, n * sizeof *means);
        return 0;
    }
    for (size_t i = 0; i < n; i++) means[i] = rows ? e->cap_sum[i] / (double)rows : 0.0;
    memset(e->cap_sum, 0, n * sizeof *e->cap_sum);
    st->capture_rows = 0;
    return rows;
}

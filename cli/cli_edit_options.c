/* cli_edit_options.c - steering and --power flags (cli/cli_edit_options.h). */
#include "cli/cli_edit_options.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int parse_scale(const char *v, float *out)
{
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(d) || fabs(d) > 1e6) return -1;
    *out = (float)d;
    return 0;
}

int ds4_cli_edit_option(ds4_cli_edit *e, int argc, char **argv, int *i, const char **err)
{
    const char *a = argv[*i];
    bool file = !strcmp(a, "--dir-steering-file"), ffn = !strcmp(a, "--dir-steering-ffn"),
         attn = !strcmp(a, "--dir-steering-attn"), power = !strcmp(a, "--power");
    if (!strcmp(a, "--mtp") || !strcmp(a, "--mtp-draft")) {
        if (*i + 1 >= argc) {
            *err = a[5] ? "--mtp-draft needs a count (1..16)" : "--mtp needs a FILE or auto";
            return -1;
        }
        const char *v = argv[++*i];
        if (!a[5]) {
            e->mtp = v;
            return 1;
        }
        char *end;
        long n = strtol(v, &end, 10);
        if (end == v || *end || n < 1 || n > 16) {
            *err = "--mtp-draft takes a count 1..16";
            return -1;
        }
        e->mtp_draft = (int)n;
        return 1;
    }
    if (!file && !ffn && !attn && !power) return 0;
    if (*i + 1 >= argc) {
        *err = file ? "--dir-steering-file needs a FILE" : ffn ? "--dir-steering-ffn needs a scale"
               : attn ? "--dir-steering-attn needs a scale" : "--power needs a percentage (1..100)";
        return -1;
    }
    const char *v = argv[++*i];
    if (file) {
        e->steer_file = v;
    } else if (ffn || attn) {
        if (parse_scale(v, ffn ? &e->steer_ffn : &e->steer_attn)) {
            *err = ffn ? "--dir-steering-ffn takes a finite number" : "--dir-steering-attn takes a finite number";
            return -1;
        }
        if (ffn) e->ffn_set = true;
        else e->attn_set = true;
    } else {
        char *end;
        long n = strtol(v, &end, 10);
        if (end == v || *end || n < 1 || n > 100) {
            *err = "--power takes a percentage 1..100 (100 = full speed)";
            return -1;
        }
        e->power = (int)n;
    }
    return 1;
}

const char *ds4_cli_edit_check(const ds4_cli_edit *e)
{
    if (!e->steer_file && (e->ffn_set || e->attn_set))
        return "--dir-steering-ffn/--dir-steering-attn need --dir-steering-file";
    if (e->mtp_draft && !e->mtp) return "--mtp-draft needs --mtp FILE|auto";
    return NULL;
}

ds4_status ds4_cli_edit_load(ds4_cli_edit *e, ds4_model *m)
{
    if (e->mtp && !ds4_model_has_mtp(m)) {
        ds4_status st = ds4_model_load_mtp(m, e->mtp);
        if (st != DS4_OK) return st;
    }
    if (!e->steer_file || e->dirs) return DS4_OK;
    /* a file alone steers the FFN outputs at scale 1, as in antirez/ds4 */
    if (!e->ffn_set) e->steer_ffn = 1.0f;
    return ds4_steering_file_read(m, e->steer_file, &e->dirs);
}

ds4_status ds4_cli_edit_apply(const ds4_cli_edit *e, ds4_session *s)
{
    if (e->dirs) {
        ds4_status st = ds4_session_set_steering(s, e->dirs, e->steer_attn, e->steer_ffn);
        if (st != DS4_OK) return st;
    }
    if (e->mtp) {
        ds4_status st = ds4_session_set_mtp(s, e->mtp_draft ? e->mtp_draft : 2);
        if (st != DS4_OK) return st;
    }
    if (e->power) return ds4_session_set_power(s, e->power);
    return DS4_OK;
}

void ds4_cli_edit_free(ds4_cli_edit *e)
{
    free(e->dirs);
    e->dirs = NULL;
}

void ds4_cli_edit_help(FILE *f)
{
    fputs("  --dir-steering-file FILE  directional steering: one unit f32 direction per layer\n"
          "                          (n_layer x n_embd; build one with ds4-steer)\n"
          "  --dir-steering-ffn S    y <- y - S v (v.y) on the MoE outputs. Default with a file: 1\n"
          "  --dir-steering-attn S   the same on the attention outputs. Default: 0\n"
          "  --power N               duty cycle 1..100: sleep between layers (prefill) and\n"
          "                          tokens (decode) so compute is N% of the time. Default: 100\n"
          "  --mtp FILE|auto         speculative decoding with the MTP block: a separate GGUF, or\n"
          "                          auto (the model file's own). Output unchanged (greedy: identical)\n"
          "  --mtp-draft N           tokens drafted per step, 1..16. Default: 2\n",
          f);
}

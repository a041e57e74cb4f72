/*
 * cli_edit_options.h - the flags of the per-session edits, shared by ds4,
 * ds4-server and ds4-agent (names as antirez/ds4 has them):
 *
 *   --dir-steering-file FILE  one unit f32 direction per layer (n_layer x n_embd)
 *   --dir-steering-ffn S      scale on the MoE sublayer outputs (default 1 with a file)
 *   --dir-steering-attn S     scale on the attention sublayer outputs (default 0)
 *   --power N                 duty cycle 1..100 (default 100: full speed)
 *   --mtp FILE|auto           speculative decoding with the MTP block (a separate
 *                             GGUF, or auto: the model file's own mtp.0.*)
 *   --mtp-draft N             draft tokens per step, 1..16 (default 2)
 *
 * docs/MODEL.md "Directional steering" and "--power" say what they do.
 */
#ifndef DS4_CLI_EDIT_OPTIONS_H
#define DS4_CLI_EDIT_OPTIONS_H

#include "include/ds4.h"

#include <stdbool.h>
#include <stdio.h>

typedef struct ds4_cli_edit_s {
    const char *steer_file;
    float steer_ffn, steer_attn;
    bool ffn_set, attn_set;
    int power;   /* 0: not given (= 100) */
    const char *mtp; /* NULL: no speculation */
    int mtp_draft;   /* 0: not given (= 2) */
    float *dirs; /* loaded by ds4_cli_edit_load */
} ds4_cli_edit;

/* As ds4_cli_stream_option: 1 parsed, 0 not one of these, -1 *err set. */
int ds4_cli_edit_option(ds4_cli_edit *e, int argc, char **argv, int *i, const char **err);
/* After parsing: a scale without a file is an error (message). */
const char *ds4_cli_edit_check(const ds4_cli_edit *e);
/* Read and check the direction file against the model (message set). */
ds4_status ds4_cli_edit_load(ds4_cli_edit *e, ds4_model *m);
/* Apply to a new session. */
ds4_status ds4_cli_edit_apply(const ds4_cli_edit *e, ds4_session *s);
void ds4_cli_edit_free(ds4_cli_edit *e);
void ds4_cli_edit_help(FILE *f);

#endif

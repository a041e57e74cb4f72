/*
 * pretokenizer.c - the three-pass Unicode split (see pretokenizer.h).
 *
 * Pass k+1 runs on each piece of pass k as its own subject, so a lookahead
 * such as (?!\S) in the last pattern sees the end of the piece, not the
 * text after it, exactly as HF tokenizers' Sequence of Splits behaves.
 * All patterns only match non-empty strings; an empty match would still be
 * stepped over by one character to guarantee progress.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/pretokenizer.h"

#include "util/error.h"

#include <pcre2.h>
#include <stdlib.h>

#define N_PASSES 3

/* Written with PCRE2 escapes; identical in meaning to the tokenizer.json
 * patterns (which carry literal CR/LF characters). */
static const char *const k_patterns[N_PASSES] = {
    "\\p{N}{1,3}",
    "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
    "|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+"
    "|\\s+(?!\\S)"
    "|\\s+",
};

struct ds4_pretokenizer {
    pcre2_code *re[N_PASSES];
    int jit[N_PASSES];
};

ds4_pretokenizer *ds4_pretokenizer_new(void)
{
    ds4_pretokenizer *pt = calloc(1, sizeof *pt);
    if (!pt) {
        ds4_fail(DS4_ERR_NOMEM, "pretokenizer: out of memory");
        return NULL;
    }
    for (int i = 0; i < N_PASSES; i++) {
        int err;
        PCRE2_SIZE off;
        pt->re[i] = pcre2_compile((PCRE2_SPTR)k_patterns[i], PCRE2_ZERO_TERMINATED,
                                  PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
        if (!pt->re[i]) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            ds4_fail(DS4_ERR_INVALID, "pretokenizer: pattern %d at offset %zu: %s", i, (size_t)off,
                     (const char *)msg);
            ds4_pretokenizer_free(pt);
            return NULL;
        }
        pt->jit[i] = pcre2_jit_compile(pt->re[i], PCRE2_JIT_COMPLETE) == 0;
    }
    return pt;
}

void ds4_pretokenizer_free(ds4_pretokenizer *pt)
{
    if (!pt) return;
    for (int i = 0; i < N_PASSES; i++) pcre2_code_free(pt->re[i]);
    free(pt);
}

typedef struct {
    const ds4_pretokenizer *pt;
    pcre2_match_data *md;
    ds4_piece_fn fn;
    void *ctx;
} split_state;

static int run_pass(split_state *st, int pass, const char *s, size_t len)
{
    if (len == 0) return 0;
    if (pass == N_PASSES) return st->fn(st->ctx, s, len);
    const pcre2_code *re = st->pt->re[pass];
    size_t pos = 0, gap = 0;
    while (pos < len) {
        int rc = st->pt->jit[pass]
                     ? pcre2_jit_match(re, (PCRE2_SPTR)s, len, pos, 0, st->md, NULL)
                     : pcre2_match(re, (PCRE2_SPTR)s, len, pos, PCRE2_NO_UTF_CHECK, st->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            ds4_fail(DS4_ERR_INVALID, "pretokenizer: pass %d at byte %zu: %s", pass, pos,
                     (const char *)msg);
            return -1;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* cannot happen with these patterns; step one char */
            pos = ms + 1;
            while (pos < len && ((unsigned char)s[pos] & 0xC0) == 0x80) pos++;
            continue;
        }
        int r;
        if (ms > gap && (r = run_pass(st, pass + 1, s + gap, ms - gap))) return r;
        if ((r = run_pass(st, pass + 1, s + ms, me - ms))) return r;
        pos = gap = me;
    }
    return run_pass(st, pass + 1, s + gap, len - gap);
}

int ds4_pretokenize(const ds4_pretokenizer *pt, const char *text, size_t len,
                    ds4_piece_fn fn, void *ctx)
{
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md) {
        ds4_fail(DS4_ERR_NOMEM, "pretokenizer: out of memory");
        return -1;
    }
    split_state st = {pt, md, fn, ctx};
    int r = run_pass(&st, 0, text, len);
    pcre2_match_data_free(md);
    return r;
}

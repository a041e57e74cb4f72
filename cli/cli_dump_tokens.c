/*
 * cli_dump_tokens.c - `ds4 --dump-tokens` (see cli_dump_tokens.h).
 *
 * Used to check the tokenizer against other implementations on held-out
 * strings, so the output is plain and stable: no BOS is added, no chat
 * template is applied, every added-token string is recognised (HF
 * semantics), and each piece is escaped to ASCII.
 */
#include "cli/cli_dump_tokens.h"

void ds4_cli_print_escaped(FILE *f, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        switch (c) {
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (c >= 0x20 && c < 0x7f) fputc(c, f);
            else fprintf(f, "\\x%02x", c);
        }
    }
}

int ds4_cli_dump_tokens(const ds4_tokenizer *tok, const char *text, size_t len, FILE *out)
{
    ds4_tokens t = {0};
    if (ds4_tokenize(tok, text, len, DS4_TOKENIZE_SPECIAL, &t) != DS4_OK) {
        fprintf(stderr, "ds4: %s\n", ds4_last_error());
        return 1;
    }
    for (size_t i = 0; i < t.n; i++) {
        size_t n;
        const char *p = ds4_token_bytes(tok, t.ids[i], &n);
        fprintf(out, "%d\t", t.ids[i]);
        ds4_cli_print_escaped(out, p, n);
        fputc('\n', out);
    }
    ds4_tokens_free(&t);
    return fflush(out) == 0 ? 0 : 1;
}

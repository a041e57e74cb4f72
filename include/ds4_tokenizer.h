/*
 * ds4_tokenizer.h - DeepSeek V4 tokenizer: text <-> token ids (public API).
 *
 * Byte-level BPE read from a GGUF's tokenizer.ggml.* metadata (tokens,
 * token_type, merges), with HF `tokenizers` semantics
 * (docs: shared/docs/dsv4-chat-format.md §2):
 *   1. added tokens (token_type CONTROL or USER_DEFINED, e.g. <｜User｜>,
 *      <think>, ｜DSML｜) are split out first, leftmost match, longest on ties;
 *   2. the text between them is pre-tokenized (numbers, CJK/kana, main
 *      pattern; real Unicode categories);
 *   3. each piece is merged by BPE rank.
 * Bytes that are not valid UTF-8 are not dropped: each becomes a piece of
 * its own and encodes as its byte token, so encode/decode round-trips any
 * byte string.
 *
 * A tokenizer is immutable after loading except for an internal,
 * mutex-protected and size-bounded cache of pre-token results, so one
 * instance may be shared by threads.
 */
#ifndef DS4_TOKENIZER_H
#define DS4_TOKENIZER_H

#include "ds4.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ds4_tokenizer ds4_tokenizer;
struct ds4_gguf;

/* A growable array of token ids. Zero-initialise; free with ds4_tokens_free. */
typedef struct {
    int32_t *ids;
    size_t n, cap;
} ds4_tokens;

void ds4_tokens_free(ds4_tokens *t);
ds4_status ds4_tokens_push(ds4_tokens *t, int32_t id);
ds4_status ds4_tokens_append(ds4_tokens *t, const int32_t *ids, size_t n);

/* The special tokens the chat format needs, found by their exact text
 * at load time (loading fails if one is missing). */
typedef enum {
    DS4_TOK_BOS,         /* <｜begin▁of▁sentence｜> (0)  */
    DS4_TOK_EOS,         /* <｜end▁of▁sentence｜>   (1)  */
    DS4_TOK_USER,        /* <｜User｜>              (128803) */
    DS4_TOK_ASSISTANT,   /* <｜Assistant｜>         (128804) */
    DS4_TOK_THINK,       /* <think>                (128821) */
    DS4_TOK_THINK_END,   /* </think>               (128822) */
    DS4_TOK_DSML,        /* ｜DSML｜                (128825) */
    DS4_TOK_SPECIAL_COUNT
} ds4_special_token;

/* Load from a GGUF file (a model or a vocab-only file). NULL + error. */
ds4_tokenizer *ds4_tokenizer_load(const char *gguf_path);
/* Load from an already opened GGUF (gguf/gguf.h); the tokenizer copies what
 * it needs, so g may be closed afterwards. */
ds4_tokenizer *ds4_tokenizer_from_gguf(const struct ds4_gguf *g);
void ds4_tokenizer_free(ds4_tokenizer *tok);

int32_t ds4_tokenizer_n_vocab(const ds4_tokenizer *tok);
int32_t ds4_tokenizer_special(const ds4_tokenizer *tok, ds4_special_token which);
/* Id of the token whose text is exactly s[0..len) (added tokens by their
 * literal text, normal tokens by their raw bytes), or -1. */
int32_t ds4_tokenizer_find(const ds4_tokenizer *tok, const char *s, size_t len);
/* true for added tokens (split out before BPE, decoded as literal text). */
bool ds4_tokenizer_is_added(const ds4_tokenizer *tok, int32_t id);

/* Flags for ds4_tokenize. */
#define DS4_TOKENIZE_SPECIAL 1u /* recognise every added-token string (HF behaviour) */

/* Tokenize text[0..len) and APPEND the ids to *out. No BOS is added.
 * Never fails on content (any bytes are accepted); fails only when out of
 * memory. */
ds4_status ds4_tokenize(const ds4_tokenizer *tok, const char *text, size_t len,
                        unsigned flags, ds4_tokens *out);

/* ---- template spans: user text never becomes control tokens --------
 *
 * A rendered chat prompt mixes the template's own text (markers such as
 * <｜User｜>, <think>, ｜DSML｜ and the fixed wording around them) with the
 * caller's content (messages, tool results, tool schemas and arguments).
 * Tokenizing the whole string with DS4_TOKENIZE_SPECIAL would turn a
 * marker string inside a user message into the control token itself, so a
 * client's text could end its turn or forge a tool call. The renderers
 * (ds4_chat_render_spans, ds4_dsml_render_*_spans) therefore record which
 * byte ranges the template wrote; ds4_tokenize_spans recognises added
 * tokens only inside those ranges and encodes everything else as plain
 * text. For content without marker strings the ids are exactly those of
 * DS4_TOKENIZE_SPECIAL (the split points are the same). */
typedef struct {
    size_t off, len;
} ds4_span;

/* Sorted, non-overlapping byte ranges. Zero-initialise; free with
 * ds4_spans_free. */
typedef struct {
    ds4_span *v;
    size_t n, cap;
    bool oom;            /* an add ran out of memory: the list is incomplete */
} ds4_spans;

void ds4_spans_free(ds4_spans *s);
/* Appends [off, off+len) (after every range already held; touching ranges
 * merge). On allocation failure sets s->oom. */
void ds4_spans_add(ds4_spans *s, size_t off, size_t len);
/* Appends src's ranges moved by `shift` bytes. */
void ds4_spans_append(ds4_spans *dst, const ds4_spans *src, size_t shift);

/* Tokenize text[0..len) (APPENDING to *out), where text is the part of a
 * rendered prompt that starts at byte `base` and tpl holds the template
 * ranges of the whole prompt: an added token is recognised only where its
 * bytes lie inside one template range. tpl NULL = no template at all
 * (everything plain). Fails on out of memory and when tpl->oom. */
ds4_status ds4_tokenize_spans(const ds4_tokenizer *tok, const char *text, size_t len,
                              const ds4_spans *tpl, size_t base, ds4_tokens *out);

/* Raw bytes of a token (literal text for added tokens). NULL and *len=0 if
 * id is out of range. Not NUL-terminated. */
const char *ds4_token_bytes(const ds4_tokenizer *tok, int32_t id, size_t *len);

/* Decode ids to bytes, appending to a malloc'd NUL-terminated buffer
 * (*buf may be NULL; *len is its current length). Invalid ids are skipped. */
ds4_status ds4_detokenize(const ds4_tokenizer *tok, const int32_t *ids, size_t n,
                          char **buf, size_t *len);

/* Streaming decoder: feed token ids one at a time, get back only complete
 * UTF-8 (an incomplete trailing sequence is held until the next token
 * completes it). Bytes that can never become valid UTF-8 are replaced by
 * U+FFFD, so the output is always valid UTF-8. */
typedef struct {
    unsigned char held[4];
    size_t n_held;
} ds4_utf8_stream;

/* Worst-case output size for n input bytes fed to a stream. */
#define DS4_UTF8_STREAM_MAX_OUT(n) (3 * ((n) + 4))

/* Feed bytes; writes up to DS4_UTF8_STREAM_MAX_OUT(n) bytes to out and
 * returns how many. */
size_t ds4_utf8_stream_feed(ds4_utf8_stream *s, const char *bytes, size_t n, char *out);
/* End of stream: whatever is still held becomes U+FFFD (out needs 12 bytes). */
size_t ds4_utf8_stream_flush(ds4_utf8_stream *s, char *out);
/* Convenience: feed one token's bytes. */
size_t ds4_utf8_stream_token(ds4_utf8_stream *s, const ds4_tokenizer *tok, int32_t id, char *out,
                             size_t out_cap);

#ifdef __cplusplus
}
#endif

#endif /* DS4_TOKENIZER_H */

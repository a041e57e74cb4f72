/*
 * tokenizer.c - loading the vocabulary from GGUF and encoding/decoding
 * (public API in include/ds4_tokenizer.h).
 *
 * At load time every normal token's byte-level string is decoded to raw
 * bytes, and every merge "a b" is turned into (id_a, id_b) -> (rank, id_ab),
 * so encoding never touches the byte-level alphabet again. Added tokens go
 * into a trie for the split-out step.
 *
 * Encoding: split out added tokens; cut the rest into valid-UTF-8 runs
 * (invalid bytes become one-byte pieces); pre-tokenize each run; BPE each
 * piece, looking it up first in a cache keyed by the piece bytes (natural
 * text repeats its words, so most pieces hit). The cache is shared by
 * threads behind a mutex and is dropped whole when it passes a byte bound,
 * so hostile input cannot grow it without limit.
 */
#include "include/ds4_tokenizer.h"

#include "gguf/gguf.h"
#include "text/added_tokens.h"
#include "text/bpe.h"
#include "text/byte_unicode.h"
#include "text/pretokenizer.h"
#include "text/str_map.h"
#include "text/utf8.h"
#include "util/error.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define CACHE_MAX_BYTES (64u << 20)
#define CACHE_MAX_PIECE 256 /* longer pieces are rarely repeated */

/* token_type values written by llama.cpp-style converters */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5, TT_BYTE = 6 };

static const char *const k_special_text[DS4_TOK_SPECIAL_COUNT] = {
    "<\xEF\xBD\x9C" "begin\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>",
    "<\xEF\xBD\x9CUser\xEF\xBD\x9C>",
    "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>",
    "<think>",
    "</think>",
    "\xEF\xBD\x9C" "DSML\xEF\xBD\x9C",
};

struct ds4_tokenizer {
    int32_t n_vocab;
    char *bytes;          /* raw bytes of every token, concatenated */
    uint32_t *offset;     /* n_vocab + 1 offsets into bytes */
    uint8_t *added;       /* 1 for added tokens */
    ds4_str_map normal;   /* raw bytes -> id, normal tokens */
    ds4_added_trie trie;  /* added tokens */
    ds4_bpe bpe;
    ds4_pretokenizer *pre;
    int32_t special[DS4_TOK_SPECIAL_COUNT];

    pthread_mutex_t cache_lock;
    ds4_str_map cache;    /* piece bytes -> (offset << 32 | count) in cache_ids */
    ds4_tokens cache_ids;
};

/* ---- ds4_tokens ------------------------------------------------------- */

void ds4_tokens_free(ds4_tokens *t)
{
    free(t->ids);
    t->ids = NULL;
    t->n = t->cap = 0;
}

static ds4_status tokens_reserve(ds4_tokens *t, size_t extra)
{
    if (t->n + extra <= t->cap) return DS4_OK;
    if (extra > SIZE_MAX / 8 - t->n) return ds4_fail(DS4_ERR_NOMEM, "tokens: %zu ids is too many", extra);
    size_t cap = t->cap ? t->cap : 64;
    while (cap < t->n + extra) cap *= 2;
    int32_t *ids = realloc(t->ids, cap * sizeof *ids);
    if (!ids) return ds4_fail(DS4_ERR_NOMEM, "tokens: out of memory for %zu ids", cap);
    t->ids = ids;
    t->cap = cap;
    return DS4_OK;
}

ds4_status ds4_tokens_push(ds4_tokens *t, int32_t id)
{
    ds4_status st = tokens_reserve(t, 1);
    if (st) return st;
    t->ids[t->n++] = id;
    return DS4_OK;
}

ds4_status ds4_tokens_append(ds4_tokens *t, const int32_t *ids, size_t n)
{
    ds4_status st = tokens_reserve(t, n);
    if (st) return st;
    if (n) memcpy(t->ids + t->n, ids, n * sizeof *ids);
    t->n += n;
    return DS4_OK;
}

/* ---- loading ---------------------------------------------------------- */

void ds4_tokenizer_free(ds4_tokenizer *tok)
{
    if (!tok) return;
    free(tok->bytes);
    free(tok->offset);
    free(tok->added);
    ds4_str_map_free(&tok->normal);
    ds4_added_trie_free(&tok->trie);
    ds4_bpe_free(&tok->bpe);
    ds4_pretokenizer_free(tok->pre);
    pthread_mutex_destroy(&tok->cache_lock);
    ds4_str_map_free(&tok->cache);
    ds4_tokens_free(&tok->cache_ids);
    free(tok);
}

static ds4_tokenizer *load_fail(ds4_tokenizer *tok)
{
    ds4_tokenizer_free(tok);
    return NULL;
}

/* Copy the token strings, decoding normal ones from byte-level form. */
static ds4_status load_tokens(ds4_tokenizer *tok, const ds4_gguf *g, int64_t kv_tokens,
                              int64_t kv_types)
{
    uint64_t total = 0;
    for (int32_t i = 0; i < tok->n_vocab; i++) total += ds4_gguf_arr_str(g, kv_tokens, (uint64_t)i).len;
    if (total > UINT32_MAX) return ds4_fail(DS4_ERR_FORMAT, "tokenizer: token strings total %llu bytes",
                                            (unsigned long long)total);
    tok->bytes = malloc(total ? total : 1);
    tok->offset = malloc(((size_t)tok->n_vocab + 1) * sizeof *tok->offset);
    tok->added = calloc((size_t)tok->n_vocab, 1);
    if (!tok->bytes || !tok->offset || !tok->added)
        return ds4_fail(DS4_ERR_NOMEM, "tokenizer: out of memory for %d tokens", tok->n_vocab);
    uint32_t off = 0;
    for (int32_t i = 0; i < tok->n_vocab; i++) {
        ds4_gguf_str s = ds4_gguf_arr_str(g, kv_tokens, (uint64_t)i);
        int64_t type = TT_NORMAL;
        if (kv_types >= 0) {
            ds4_gguf_value v;
            if (ds4_gguf_arr_elem(g, kv_types, (uint64_t)i, &v) == DS4_OK) type = v.v.i;
        }
        tok->offset[i] = off;
        size_t n = 0;
        bool added = type == TT_CONTROL || type == TT_USER_DEFINED;
        if (!added && !ds4_byte_level_decode(s.ptr, s.len, (uint8_t *)tok->bytes + off, &n)) {
            /* Not byte-level text: only an added token can look like this
             * (covers files written without token_type). */
            added = true;
        }
        if (added) {
            memcpy(tok->bytes + off, s.ptr, s.len);
            n = s.len;
            tok->added[i] = 1;
            if (!ds4_added_trie_insert(&tok->trie, s.ptr, s.len, i))
                return ds4_fail(DS4_ERR_NOMEM, "tokenizer: out of memory");
        } else if (type != TT_UNUSED) {
            uint64_t prev;
            if (!ds4_str_map_get(&tok->normal, tok->bytes + off, n, &prev) &&
                !ds4_str_map_put(&tok->normal, tok->bytes + off, n, (uint64_t)i))
                return ds4_fail(DS4_ERR_NOMEM, "tokenizer: out of memory");
            if (n == 1 && tok->bpe.byte_token[(uint8_t)tok->bytes[off]] < 0)
                tok->bpe.byte_token[(uint8_t)tok->bytes[off]] = i;
        }
        off += (uint32_t)n;
    }
    tok->offset[tok->n_vocab] = off;
    return DS4_OK;
}

static int32_t normal_id(const ds4_tokenizer *tok, const uint8_t *b, size_t n)
{
    uint64_t v;
    return ds4_str_map_get(&tok->normal, b, n, &v) ? (int32_t)v : -1;
}

static ds4_status load_merges(ds4_tokenizer *tok, const ds4_gguf *g, int64_t kv, uint64_t n_merges)
{
    uint8_t buf[1024];
    for (uint64_t r = 0; r < n_merges; r++) {
        ds4_gguf_str s = ds4_gguf_arr_str(g, kv, r);
        const char *sp = memchr(s.ptr, ' ', s.len);
        size_t la, lb;
        if (!sp || s.len > sizeof buf / 2)
            return ds4_fail(DS4_ERR_FORMAT, "tokenizer: merge %llu is not \"left right\" (%.*s)",
                            (unsigned long long)r, (int)(s.len > 64 ? 64 : s.len), s.ptr);
        size_t llen = (size_t)(sp - s.ptr), rlen = s.len - llen - 1;
        if (!ds4_byte_level_decode(s.ptr, llen, buf, &la) ||
            !ds4_byte_level_decode(sp + 1, rlen, buf + la, &lb))
            return ds4_fail(DS4_ERR_FORMAT, "tokenizer: merge %llu (%.*s) is not byte-level text",
                            (unsigned long long)r, (int)(s.len > 64 ? 64 : s.len), s.ptr);
        int32_t a = normal_id(tok, buf, la), b = normal_id(tok, buf + la, lb);
        int32_t m = normal_id(tok, buf, la + lb);
        if (a < 0 || b < 0 || m < 0)
            return ds4_fail(DS4_ERR_FORMAT, "tokenizer: merge %llu (%.*s) names a token not in the vocabulary",
                            (unsigned long long)r, (int)(s.len > 64 ? 64 : s.len), s.ptr);
        if (!ds4_bpe_add_merge(&tok->bpe, a, b, m, (uint32_t)r))
            return ds4_fail(DS4_ERR_NOMEM, "tokenizer: out of memory");
    }
    return DS4_OK;
}

ds4_tokenizer *ds4_tokenizer_from_gguf(const ds4_gguf *g)
{
    ds4_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) {
        ds4_fail(DS4_ERR_NOMEM, "tokenizer: out of memory");
        return NULL;
    }
    pthread_mutex_init(&tok->cache_lock, NULL);
    ds4_str_map_init(&tok->normal);
    ds4_str_map_init(&tok->cache);
    ds4_added_trie_init(&tok->trie);
    ds4_bpe_init(&tok->bpe);

    const char *path = ds4_gguf_path(g);
    ds4_gguf_str model;
    if (ds4_gguf_get_str(g, "tokenizer.ggml.model", &model) == DS4_OK &&
        !(model.len == 4 && memcmp(model.ptr, "gpt2", 4) == 0)) {
        ds4_fail(DS4_ERR_UNSUPPORTED, "tokenizer: %s: tokenizer.ggml.model is \"%.*s\", expected \"gpt2\"",
                 path, (int)(model.len > 64 ? 64 : model.len), model.ptr);
        return load_fail(tok);
    }
    int64_t kv_tokens, kv_merges, kv_types = -1;
    uint64_t n_tokens, n_merges, n_types;
    if (ds4_gguf_get_arr(g, "tokenizer.ggml.tokens", DS4_GGUF_STRING, &kv_tokens, &n_tokens) ||
        ds4_gguf_get_arr(g, "tokenizer.ggml.merges", DS4_GGUF_STRING, &kv_merges, &n_merges)) {
        ds4_error_prefix("tokenizer: %s: ", path);
        return load_fail(tok);
    }
    if (n_tokens == 0 || n_tokens > (1u << 24)) {
        ds4_fail(DS4_ERR_FORMAT, "tokenizer: %s: tokenizer.ggml.tokens has %llu entries", path,
                 (unsigned long long)n_tokens);
        return load_fail(tok);
    }
    uint64_t vocab_size;
    if (ds4_gguf_get_uint(g, "deepseek4.vocab_size", &vocab_size) == DS4_OK && vocab_size != n_tokens) {
        ds4_fail(DS4_ERR_FORMAT, "tokenizer: %s: deepseek4.vocab_size is %llu but there are %llu tokens",
                 path, (unsigned long long)vocab_size, (unsigned long long)n_tokens);
        return load_fail(tok);
    }
    if (ds4_gguf_find_key(g, "tokenizer.ggml.token_type") >= 0) {
        if (ds4_gguf_get_arr(g, "tokenizer.ggml.token_type", DS4_GGUF_I32, &kv_types, &n_types)) {
            ds4_error_prefix("tokenizer: %s: ", path);
            return load_fail(tok);
        }
        if (n_types != n_tokens) {
            ds4_fail(DS4_ERR_FORMAT, "tokenizer: %s: %llu token types for %llu tokens", path,
                     (unsigned long long)n_types, (unsigned long long)n_tokens);
            return load_fail(tok);
        }
    }
    ds4_clear_error();
    tok->n_vocab = (int32_t)n_tokens;
    if (load_tokens(tok, g, kv_tokens, kv_types) || load_merges(tok, g, kv_merges, n_merges)) {
        ds4_error_prefix("%s: ", path);
        return load_fail(tok);
    }
    for (int b = 0; b < 256; b++) {
        if (tok->bpe.byte_token[b] < 0) {
            ds4_fail(DS4_ERR_FORMAT, "tokenizer: %s: no token for byte 0x%02x", path, b);
            return load_fail(tok);
        }
    }
    for (int s = 0; s < DS4_TOK_SPECIAL_COUNT; s++) {
        const char *txt = k_special_text[s];
        tok->special[s] = ds4_added_trie_find(&tok->trie, txt, strlen(txt));
        if (tok->special[s] < 0 && kv_types < 0) {
            /* no token_type array: "<think>" and friends read as normal
             * byte-level tokens; promote the chat specials to added ones */
            int32_t id = normal_id(tok, (const uint8_t *)txt, strlen(txt));
            if (id >= 0 && ds4_added_trie_insert(&tok->trie, txt, strlen(txt), id)) {
                tok->added[id] = 1;
                tok->special[s] = id;
            }
        }
        if (tok->special[s] < 0) {
            ds4_fail(DS4_ERR_FORMAT, "tokenizer: %s: special token %s is not an added token", path,
                     k_special_text[s]);
            return load_fail(tok);
        }
    }
    tok->pre = ds4_pretokenizer_new();
    if (!tok->pre) return load_fail(tok);
    return tok;
}

ds4_tokenizer *ds4_tokenizer_load(const char *gguf_path)
{
    ds4_gguf *g = ds4_gguf_open(gguf_path);
    if (!g) return NULL;
    ds4_tokenizer *tok = ds4_tokenizer_from_gguf(g);
    ds4_gguf_close(g);
    return tok;
}

/* ---- queries ---------------------------------------------------------- */

int32_t ds4_tokenizer_n_vocab(const ds4_tokenizer *tok) { return tok->n_vocab; }

int32_t ds4_tokenizer_special(const ds4_tokenizer *tok, ds4_special_token which)
{
    return (unsigned)which < DS4_TOK_SPECIAL_COUNT ? tok->special[which] : -1;
}

int32_t ds4_tokenizer_find(const ds4_tokenizer *tok, const char *s, size_t len)
{
    int32_t id = ds4_added_trie_find(&tok->trie, s, len);
    return id >= 0 ? id : normal_id(tok, (const uint8_t *)s, len);
}

bool ds4_tokenizer_is_added(const ds4_tokenizer *tok, int32_t id)
{
    return id >= 0 && id < tok->n_vocab && tok->added[id];
}

const char *ds4_token_bytes(const ds4_tokenizer *tok, int32_t id, size_t *len)
{
    if (id < 0 || id >= tok->n_vocab) {
        *len = 0;
        return NULL;
    }
    *len = tok->offset[id + 1] - tok->offset[id];
    return tok->bytes + tok->offset[id];
}

/* ---- encoding --------------------------------------------------------- */

typedef struct {
    const ds4_tokenizer *tok;
    ds4_tokens *out;
    ds4_bpe_scratch scratch;
    ds4_status st;
} encode_ctx;

static bool cache_get(const ds4_tokenizer *tok, const char *p, size_t n, ds4_tokens *out, bool *hit)
{
    ds4_tokenizer *mtok = (ds4_tokenizer *)tok; /* the cache is the one mutable part */
    uint64_t v;
    bool ok = true;
    pthread_mutex_lock(&mtok->cache_lock);
    *hit = ds4_str_map_get(&mtok->cache, p, n, &v);
    if (*hit) ok = ds4_tokens_append(out, mtok->cache_ids.ids + (v >> 32), (uint32_t)v) == DS4_OK;
    pthread_mutex_unlock(&mtok->cache_lock);
    return ok;
}

static void cache_put(const ds4_tokenizer *tok, const char *p, size_t n, const int32_t *ids, size_t k)
{
    ds4_tokenizer *mtok = (ds4_tokenizer *)tok;
    pthread_mutex_lock(&mtok->cache_lock);
    if (ds4_str_map_bytes(&mtok->cache) + mtok->cache_ids.cap * 4 > CACHE_MAX_BYTES) {
        ds4_str_map_clear(&mtok->cache);
        mtok->cache_ids.n = 0;
    }
    size_t off = mtok->cache_ids.n;
    if (ds4_tokens_append(&mtok->cache_ids, ids, k) == DS4_OK &&
        !ds4_str_map_put(&mtok->cache, p, n, ((uint64_t)off << 32) | k))
        mtok->cache_ids.n = off;
    ds4_clear_error();
    pthread_mutex_unlock(&mtok->cache_lock);
}

static int encode_piece(void *vctx, const char *p, size_t n)
{
    encode_ctx *c = vctx;
    bool hit = false;
    bool cacheable = n <= CACHE_MAX_PIECE;
    if (cacheable) {
        if (!cache_get(c->tok, p, n, c->out, &hit)) return c->st = DS4_ERR_NOMEM, 1;
        if (hit) return 0;
    }
    if ((c->st = tokens_reserve(c->out, n))) return 1;
    int32_t *dst = c->out->ids + c->out->n;
    long k = ds4_bpe_encode(&c->tok->bpe, &c->scratch, (const uint8_t *)p, n, dst);
    if (k < 0) {
        c->st = ds4_fail(DS4_ERR_NOMEM, "tokenizer: out of memory encoding a %zu-byte piece", n);
        return 1;
    }
    if (cacheable) cache_put(c->tok, p, n, dst, (size_t)k);
    c->out->n += (size_t)k;
    return 0;
}

/* Text without added tokens: valid UTF-8 runs go through the
 * pre-tokenizer, each invalid byte is a piece by itself. */
static ds4_status encode_plain(encode_ctx *c, const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t v = ds4_utf8_valid_prefix((const uint8_t *)s + i, n - i);
        if (v) {
            int r = ds4_pretokenize(c->tok->pre, s + i, v, encode_piece, c);
            if (r < 0) return DS4_ERR_INVALID;
            if (r) return c->st;
            i += v;
        }
        if (i < n) {
            if (encode_piece(c, s + i, 1)) return c->st;
            i++;
        }
    }
    return DS4_OK;
}

/* The added tokens that start in text[a..b) and end by b, each after the
 * plain text before it (from *seg, which then moves past the token). */
static ds4_status encode_specials(encode_ctx *c, const char *text, size_t a, size_t b, size_t *seg)
{
    ds4_status st;
    for (size_t i = a; i < b; i++) {
        if (!c->tok->trie.first_byte[(uint8_t)text[i]]) continue;
        size_t mlen = 0;
        int32_t id = ds4_added_trie_match(&c->tok->trie, text + i, b - i, &mlen);
        if (id < 0) continue;
        if ((st = encode_plain(c, text + *seg, i - *seg)) || (st = ds4_tokens_push(c->out, id))) return st;
        i += mlen - 1;
        *seg = i + 1;
    }
    return DS4_OK;
}

ds4_status ds4_tokenize(const ds4_tokenizer *tok, const char *text, size_t len, unsigned flags,
                        ds4_tokens *out)
{
    encode_ctx c = {tok, out, {0}, DS4_OK};
    ds4_status st = DS4_OK;
    size_t seg = 0;
    if (flags & DS4_TOKENIZE_SPECIAL) st = encode_specials(&c, text, 0, len, &seg);
    if (!st) st = encode_plain(&c, text + seg, len - seg);
    ds4_bpe_scratch_free(&c.scratch);
    return st;
}

/* ---- template spans --------------------------------------------------- */

void ds4_spans_free(ds4_spans *s)
{
    free(s->v);
    memset(s, 0, sizeof *s);
}

void ds4_spans_add(ds4_spans *s, size_t off, size_t len)
{
    if (s->oom || len == 0) return;
    if (s->n && s->v[s->n - 1].off + s->v[s->n - 1].len == off) {
        s->v[s->n - 1].len += len;
        return;
    }
    if (s->n && s->v[s->n - 1].off + s->v[s->n - 1].len > off) {
        s->oom = true; /* out of order: a caller bug, never silently accepted */
        return;
    }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 32;
        ds4_span *v = realloc(s->v, cap * sizeof *v);
        if (!v) {
            s->oom = true;
            return;
        }
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (ds4_span){off, len};
}

void ds4_spans_append(ds4_spans *dst, const ds4_spans *src, size_t shift)
{
    if (src->oom) dst->oom = true;
    for (size_t i = 0; i < src->n; i++) ds4_spans_add(dst, src->v[i].off + shift, src->v[i].len);
}

ds4_status ds4_tokenize_spans(const ds4_tokenizer *tok, const char *text, size_t len,
                              const ds4_spans *tpl, size_t base, ds4_tokens *out)
{
    if (tpl && tpl->oom) return ds4_fail(DS4_ERR_NOMEM, "tokenize: the template ranges are incomplete (out of memory)");
    encode_ctx c = {tok, out, {0}, DS4_OK};
    ds4_status st = DS4_OK;
    size_t seg = 0; /* start of the plain text not yet encoded */
    for (size_t k = 0; tpl && k < tpl->n; k++) {
        /* this template range, cut to text[0..len) */
        size_t a = tpl->v[k].off, b = a + tpl->v[k].len;
        if (b <= base) continue;
        if (a >= base + len) break;
        a = a > base ? a - base : 0;
        b = b - base < len ? b - base : len;
        /* ending by b: the match may not run past the range into content */
        if ((st = encode_specials(&c, text, a, b, &seg))) goto done;
    }
    st = encode_plain(&c, text + seg, len - seg);
done:
    ds4_bpe_scratch_free(&c.scratch);
    return st;
}

/* ---- decoding --------------------------------------------------------- */

ds4_status ds4_detokenize(const ds4_tokenizer *tok, const int32_t *ids, size_t n, char **buf,
                          size_t *len)
{
    size_t total = *len;
    for (size_t i = 0; i < n; i++) {
        size_t k;
        if (ds4_token_bytes(tok, ids[i], &k)) total += k;
    }
    char *b = realloc(*buf, total + 1);
    if (!b) return ds4_fail(DS4_ERR_NOMEM, "detokenize: out of memory for %zu bytes", total);
    size_t pos = *len;
    for (size_t i = 0; i < n; i++) {
        size_t k;
        const char *p = ds4_token_bytes(tok, ids[i], &k);
        if (p) memcpy(b + pos, p, k);
        pos += k;
    }
    b[pos] = '\0';
    *buf = b;
    *len = pos;
    return DS4_OK;
}

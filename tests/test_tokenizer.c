/*
 * test_tokenizer.c - the tokenizer against the shared DeepSeek V4 cases.
 *
 * Expected ids come from outside this code: the tokenizer .jsonl files
 * were generated with the reconstructed HF tokenizer.json and cross-checked
 * by transformers.js, llama.cpp hashes and the official API's token counts
 * (see tests/data/tokenizer/README.md). promessi_sposi.txt must give the
 * documented 417059 tokens.
 */
#include "tests/test.h"

#include "include/ds4_tokenizer.h"
#include "gguf/gguf.h"
#include "text/byte_unicode.h"
#include "text/pretokenizer.h"

#include <jansson.h>
#include <pthread.h>
#include <openssl/sha.h>
#include <stdlib.h>
#include <string.h>

static ds4_tokenizer *g_tok;

static bool load(void)
{
    if (!g_tok) g_tok = ds4_tokenizer_load(test_data("tokenizer/dsv4-vocab.gguf"));
    if (!g_tok) test_fail_at(__FILE__, __LINE__, "load: %s", ds4_last_error());
    return g_tok != NULL;
}

static bool ids_equal(const ds4_tokens *t, json_t *ids, const char *name)
{
    bool ok = t->n == json_array_size(ids);
    for (size_t i = 0; ok && i < t->n; i++) ok = t->ids[i] == json_integer_value(json_array_get(ids, i));
    if (!ok) {
        size_t i = 0;
        while (i < t->n && i < json_array_size(ids) && t->ids[i] == json_integer_value(json_array_get(ids, i))) i++;
        test_fail_at(__FILE__, __LINE__, "%s: %zu ids, expected %zu; first difference at %zu (got %d, want %lld)",
                     name, t->n, json_array_size(ids), i, i < t->n ? t->ids[i] : -1,
                     i < json_array_size(ids) ? json_integer_value(json_array_get(ids, i)) : -1LL);
    }
    return ok;
}

typedef struct {
    json_t *pieces;
    size_t i;
    bool ok;
} piece_check;

static int check_piece(void *ctx, const char *p, size_t n)
{
    piece_check *c = ctx;
    json_t *want = json_array_get(c->pieces, c->i++);
    if (!want || json_string_length(want) != n || memcmp(json_string_value(want), p, n) != 0) c->ok = false;
    return 0;
}

static void test_tokenizer_cases(void)
{
    if (!load()) return;
    FILE *f = fopen(test_data("tokenizer/dsv4-tokenizer-tests.jsonl"), "r");
    REQUIRE(f);
    char *line = NULL;
    size_t cap = 0;
    int n_cases = 0, n_piece_checks = 0;
    ds4_pretokenizer *pt = ds4_pretokenizer_new();
    REQUIRE(pt);
    while (getline(&line, &cap, f) > 0) {
        json_error_t err;
        json_t *c = json_loads(line, JSON_ALLOW_NUL, &err);
        REQUIRE(c);
        const char *name = json_string_value(json_object_get(c, "name"));
        json_t *text = json_object_get(c, "text");
        bool special = json_is_true(json_object_get(c, "parse_special"));
        ds4_tokens t = {0};
        EXPECT(ds4_tokenize(g_tok, json_string_value(text), json_string_length(text),
                            special ? DS4_TOKENIZE_SPECIAL : 0, &t) == DS4_OK);
        ids_equal(&t, json_object_get(c, "ids"), name);
        /* decode(ids) == text byte for byte */
        char *buf = NULL;
        size_t len = 0;
        EXPECT(ds4_detokenize(g_tok, t.ids, t.n, &buf, &len) == DS4_OK);
        EXPECT_MSG(len == json_string_length(text) && memcmp(buf, json_string_value(text), len) == 0,
                   "%s: decode differs", name);
        /* pre-tokenizer pieces, where no added token is involved */
        bool has_added = false;
        for (size_t i = 0; i < t.n; i++) has_added |= ds4_tokenizer_is_added(g_tok, t.ids[i]);
        if (!has_added) {
            piece_check pc = {json_object_get(c, "pieces"), 0, true};
            ds4_pretokenize(pt, json_string_value(text), json_string_length(text), check_piece, &pc);
            EXPECT_MSG(pc.ok && pc.i == json_array_size(pc.pieces), "%s: pre-tokenizer pieces differ", name);
            n_piece_checks++;
        }
        free(buf);
        ds4_tokens_free(&t);
        json_decref(c);
        n_cases++;
    }
    free(line);
    fclose(f);
    ds4_pretokenizer_free(pt);
    EXPECT(n_cases == 52);
    EXPECT(n_piece_checks > 30);
}

/* Files the long ds4 prompts live in, only in the shared data folder. */
static char *read_shared(const char *rel, size_t *len)
{
    const char *roots[] = {getenv("DS4_SHARED_DATA"), "../shared/data", "../../shared/data", "/work/shared/data"};
    for (size_t i = 0; i < sizeof roots / sizeof *roots; i++) {
        if (!roots[i]) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", roots[i], rel);
        char *b = test_read_file(path, len);
        if (b) return b;
    }
    return NULL;
}

static void test_rendered_prompts(void)
{
    if (!load()) return;
    FILE *f = fopen(test_data("tokenizer/dsv4-rendered-prompts-tokens.jsonl"), "r");
    REQUIRE(f);
    char *line = NULL;
    size_t cap = 0;
    int n_checked = 0, n_missing = 0;
    while (getline(&line, &cap, f) > 0) {
        json_error_t err;
        json_t *c = json_loads(line, JSON_ALLOW_NUL, &err);
        REQUIRE(c);
        const char *name = json_string_value(json_object_get(c, "name"));
        json_t *text = json_object_get(c, "text");
        char *owned = NULL;
        const char *s;
        size_t len;
        if (text) {
            s = json_string_value(text);
            len = json_string_length(text);
        } else {
            /* "ds4-vectors/long_context_story_prompt.txt (rendered by ds4; ...)" */
            const char *src = json_string_value(json_object_get(c, "source"));
            char rel[256];
            sscanf(src, "%255s", rel);
            owned = read_shared(rel, &len);
            if (!owned) {
                n_missing++;
                json_decref(c);
                continue;
            }
            unsigned char md[SHA256_DIGEST_LENGTH];
            SHA256((const unsigned char *)owned, len, md);
            char hex[65];
            for (int i = 0; i < 32; i++) sprintf(hex + 2 * i, "%02x", md[i]);
            EXPECT_MSG(strcmp(hex, json_string_value(json_object_get(c, "text_sha256"))) == 0,
                       "%s: shared file has another sha256", name);
            s = owned;
        }
        ds4_tokens t = {0};
        EXPECT(ds4_tokenize(g_tok, s, len, DS4_TOKENIZE_SPECIAL, &t) == DS4_OK);
        ids_equal(&t, json_object_get(c, "ids"), name);
        EXPECT(t.n == (size_t)json_integer_value(json_object_get(c, "n_tokens")));
        ds4_tokens_free(&t);
        free(owned);
        json_decref(c);
        n_checked++;
    }
    free(line);
    fclose(f);
    EXPECT(n_checked >= 20);
    if (n_missing) printf("   note: %d long ds4 prompts not checked (shared data folder not found)\n", n_missing);
}

static void test_promessi_sposi_count(void)
{
    if (!load()) return;
    size_t len;
    char *text = test_read_file(test_data("bench/promessi_sposi.txt"), &len);
    REQUIRE(text);
    ds4_tokens t = {0};
    EXPECT(ds4_tokenize(g_tok, text, len, 0, &t) == DS4_OK);
    EXPECT_MSG(t.n == 417059, "promessi_sposi.txt: %zu tokens, expected 417059", t.n);
    /* tokenizing twice (second time from the cache) gives the same ids */
    ds4_tokens t2 = {0};
    EXPECT(ds4_tokenize(g_tok, text, len, 0, &t2) == DS4_OK);
    EXPECT(t2.n == t.n && memcmp(t.ids, t2.ids, t.n * sizeof *t.ids) == 0);
    char *buf = NULL;
    size_t blen = 0;
    EXPECT(ds4_detokenize(g_tok, t.ids, t.n, &buf, &blen) == DS4_OK);
    EXPECT(blen == len && memcmp(buf, text, len) == 0);
    free(buf);
    ds4_tokens_free(&t);
    ds4_tokens_free(&t2);
    free(text);
}

static void test_special_ids(void)
{
    if (!load()) return;
    EXPECT(ds4_tokenizer_n_vocab(g_tok) == 129280);
    EXPECT(ds4_tokenizer_special(g_tok, DS4_TOK_BOS) == 0);
    EXPECT(ds4_tokenizer_special(g_tok, DS4_TOK_EOS) == 1);
    EXPECT(ds4_tokenizer_special(g_tok, DS4_TOK_USER) == 128803);
    EXPECT(ds4_tokenizer_special(g_tok, DS4_TOK_ASSISTANT) == 128804);
    EXPECT(ds4_tokenizer_special(g_tok, DS4_TOK_THINK) == 128821);
    EXPECT(ds4_tokenizer_special(g_tok, DS4_TOK_THINK_END) == 128822);
    EXPECT(ds4_tokenizer_special(g_tok, DS4_TOK_DSML) == 128825);
    EXPECT(ds4_tokenizer_find(g_tok, "<|EOT|>", 7) == 128805);
    EXPECT(ds4_tokenizer_find(g_tok, " the", 4) == 270);
    /* without DS4_TOKENIZE_SPECIAL an added token's text is plain BPE */
    ds4_tokens t = {0};
    EXPECT(ds4_tokenize(g_tok, "<think>", 7, 0, &t) == DS4_OK);
    EXPECT(t.n > 1);
    for (size_t i = 0; i < t.n; i++) EXPECT(!ds4_tokenizer_is_added(g_tok, t.ids[i]));
    t.n = 0;
    EXPECT(ds4_tokenize(g_tok, "<think>", 7, DS4_TOKENIZE_SPECIAL, &t) == DS4_OK);
    EXPECT(t.n == 1 && t.ids[0] == 128821);
    ds4_tokens_free(&t);
}

/* Invalid UTF-8 is not rejected: each bad byte is its own byte token and
 * decoding gives the input back. */
static void test_invalid_utf8_round_trip(void)
{
    if (!load()) return;
    const char in[] = "ok \xff\xfe caf\xc3 \xe4\xb8 \xed\xa0\x80 end\xf0\x9f\x98";
    ds4_tokens t = {0};
    EXPECT(ds4_tokenize(g_tok, in, sizeof in - 1, DS4_TOKENIZE_SPECIAL, &t) == DS4_OK);
    char *buf = NULL;
    size_t len = 0;
    EXPECT(ds4_detokenize(g_tok, t.ids, t.n, &buf, &len) == DS4_OK);
    EXPECT(len == sizeof in - 1 && memcmp(buf, in, len) == 0);
    free(buf);
    ds4_tokens_free(&t);
}

/* A megabyte of one letter is one pre-token: it must merge in n log n
 * (a quadratic merge loop would not finish in any reasonable time). */
static void test_long_piece(void)
{
    if (!load()) return;
    size_t n = 1 << 20;
    char *s = malloc(n);
    REQUIRE(s);
    for (size_t i = 0; i < n; i++) s[i] = "ab"[i % 7 == 0];
    ds4_tokens t = {0};
    EXPECT(ds4_tokenize(g_tok, s, n, 0, &t) == DS4_OK);
    char *buf = NULL;
    size_t len = 0;
    EXPECT(ds4_detokenize(g_tok, t.ids, t.n, &buf, &len) == DS4_OK);
    EXPECT(len == n && memcmp(buf, s, n) == 0);
    EXPECT(t.n < n / 2);
    free(buf);
    free(s);
    ds4_tokens_free(&t);
}

/* Streaming decode: feeding the ids of a text with multi-byte characters
 * split across tokens gives exactly the text, and nothing invalid is ever
 * emitted. */
static void test_utf8_stream(void)
{
    if (!load()) return;
    const char *text = "emoji 👨‍👩‍👧 家族 «città» 𝔘𝔫𝔦𝔠𝔬𝔡𝔢";
    ds4_tokens t = {0};
    EXPECT(ds4_tokenize(g_tok, text, strlen(text), 0, &t) == DS4_OK);
    ds4_utf8_stream s = {0};
    char out[4096];
    size_t o = 0;
    bool partial_seen = false;
    for (size_t i = 0; i < t.n; i++) {
        char tmp[512];
        size_t k = ds4_utf8_stream_token(&s, g_tok, t.ids[i], tmp, sizeof tmp);
        REQUIRE(k != SIZE_MAX);
        partial_seen |= s.n_held > 0;
        memcpy(out + o, tmp, k);
        o += k;
    }
    o += ds4_utf8_stream_flush(&s, out + o);
    EXPECT(o == strlen(text) && memcmp(out, text, o) == 0);
    EXPECT(partial_seen); /* the case really exercises holding back */
    ds4_tokens_free(&t);

    /* byte-wise feed with broken sequences */
    ds4_utf8_stream s2 = {0};
    const char bad[] = "a\xe4\xb8\xad" "b\xe4\xb8" "c\xff" "d\xf0\x9f";
    o = 0;
    for (size_t i = 0; i < sizeof bad - 1; i++) o += ds4_utf8_stream_feed(&s2, bad + i, 1, out + o);
    o += ds4_utf8_stream_flush(&s2, out + o);
    const char want[] = "a\xe4\xb8\xad" "b\xef\xbf\xbd" "c\xef\xbf\xbd" "d\xef\xbf\xbd";
    EXPECT(o == sizeof want - 1 && memcmp(out, want, o) == 0);
}

/* One tokenizer shared by threads (its pre-token cache is shared and
 * locked): every thread gets exactly the ids of a single-threaded run. */
typedef struct {
    const char *text;
    size_t len;
    ds4_tokens out;
} thread_job;

static void *tokenize_job(void *arg)
{
    thread_job *j = arg;
    for (int rep = 0; rep < 3; rep++) {
        j->out.n = 0;
        if (ds4_tokenize(g_tok, j->text, j->len, DS4_TOKENIZE_SPECIAL, &j->out) != DS4_OK) break;
    }
    return NULL;
}

static void test_threads_share_tokenizer(void)
{
    if (!load()) return;
    size_t len;
    char *text = test_read_file(test_data("bench/promessi_sposi.txt"), &len);
    REQUIRE(text);
    enum { N = 4 };
    thread_job jobs[N];
    pthread_t th[N];
    size_t part = len / N;
    for (int i = 0; i < N; i++) {
        /* overlapping slices so threads hit the same cache entries */
        jobs[i].text = text + i * part / 2;
        jobs[i].len = part;
        memset(&jobs[i].out, 0, sizeof jobs[i].out);
        pthread_create(&th[i], NULL, tokenize_job, &jobs[i]);
    }
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < N; i++) {
        ds4_tokens ref = {0};
        /* reference from a fresh tokenizer (empty cache) */
        ds4_tokenizer *fresh = ds4_tokenizer_load(test_data("tokenizer/dsv4-vocab.gguf"));
        REQUIRE(fresh);
        EXPECT(ds4_tokenize(fresh, jobs[i].text, jobs[i].len, DS4_TOKENIZE_SPECIAL, &ref) == DS4_OK);
        EXPECT_MSG(ref.n == jobs[i].out.n && ref.n > 0 && !memcmp(ref.ids, jobs[i].out.ids, ref.n * sizeof *ref.ids),
                   "thread %d: %zu ids, reference %zu", i, jobs[i].out.n, ref.n);
        ds4_tokens_free(&ref);
        ds4_tokens_free(&jobs[i].out);
        ds4_tokenizer_free(fresh);
    }
    free(text);
}

/* A small vocabulary written with the GGUF writer: the 256 byte tokens,
 * "ab" and "abc" by two merges, then the 7 chat specials (CONTROL). `what`
 * damages it in one way. Returns the loaded tokenizer or NULL. */
static ds4_tokenizer *tiny_vocab(const char *what)
{
    static const char *const specials[] = {
        "<\xEF\xBD\x9C" "begin\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>",
        "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>",
        "<\xEF\xBD\x9CUser\xEF\xBD\x9C>", "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>", "<think>", "</think>",
        "\xEF\xBD\x9C" "DSML\xEF\xBD\x9C"};
    char *tok[256 + 2 + 7];
    int32_t type[256 + 2 + 7];
    int n = 0;
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        char buf[4] = {0};
        ds4_byte_level_encode(&byte, 1, buf);
        tok[n] = strdup(buf);
        type[n++] = 1;
    }
    tok[n] = strdup("ab"), type[n++] = 1;
    tok[n] = strdup("abc"), type[n++] = 1;
    int n_special = strcmp(what, "no_think") == 0 ? 4 : 7;
    for (int i = 0; i < n_special; i++) tok[n] = strdup(specials[i]), type[n++] = 3;
    const char *merges_ok[] = {"a b", "ab c"}, *merges_bad[] = {"a b", "ab zz"};
    ds4_gguf_writer *w = ds4_gguf_writer_new();
    ds4_gguf_writer_add_str(w, "tokenizer.ggml.model", strcmp(what, "bpe_model") ? "gpt2" : "llama");
    ds4_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tok, NULL, (uint64_t)n);
    ds4_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", DS4_GGUF_I32, type,
                            (uint64_t)(strcmp(what, "short_types") ? n : n - 1));
    if (strcmp(what, "no_merges"))
        ds4_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", strcmp(what, "bad_merge") ? merges_ok : merges_bad,
                                    NULL, 2);
    ds4_gguf_writer_add_u32(w, "deepseek4.vocab_size", strcmp(what, "vocab_size") ? (uint32_t)n : 129280);
    void *buf = NULL;
    size_t len = 0;
    ds4_tokenizer *t = NULL;
    if (ds4_gguf_writer_write_memory(w, &buf, &len) == DS4_OK) {
        ds4_gguf *g = ds4_gguf_open_memory(buf, len);
        if (g) t = ds4_tokenizer_from_gguf(g);
        ds4_gguf_close(g);
    }
    free(buf);
    ds4_gguf_writer_free(w);
    for (int i = 0; i < n; i++) free(tok[i]);
    return t;
}

static void test_small_vocab_and_bad_vocabs(void)
{
    ds4_tokenizer *t = tiny_vocab("ok");
    REQUIRE(t);
    ds4_tokens ids = {0};
    EXPECT(ds4_tokenize(t, "abcab<think>x", 13, DS4_TOKENIZE_SPECIAL, &ids) == DS4_OK);
    /* 256 = "ab", 257 = "abc", 262 = <think> */
    EXPECT(ids.n == 4 && ids.ids[0] == 257 && ids.ids[1] == 256 && ids.ids[2] == 262 && ids.ids[3] == 'x'); /* byte tokens are ids 0..255 here */
    ds4_tokens_free(&ids);
    ds4_tokenizer_free(t);
    static const struct {
        const char *what, *msg;
    } bad[] = {
        {"no_merges", "tokenizer.ggml.merges"}, {"bad_merge", "merge 1"}, {"vocab_size", "vocab_size"},
        {"short_types", "token types"}, {"no_think", "<think>"}, {"bpe_model", "llama"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        t = tiny_vocab(bad[i].what);
        EXPECT_MSG(!t && strstr(ds4_last_error(), bad[i].msg), "%s: %s", bad[i].what, t ? "loaded" : ds4_last_error());
        ds4_tokenizer_free(t);
    }
}

int main(void)
{
    RUN(test_special_ids);
    RUN(test_tokenizer_cases);
    RUN(test_rendered_prompts);
    RUN(test_promessi_sposi_count);
    RUN(test_invalid_utf8_round_trip);
    RUN(test_long_piece);
    RUN(test_utf8_stream);
    RUN(test_threads_share_tokenizer);
    RUN(test_small_vocab_and_bad_vocabs);
    ds4_tokenizer_free(g_tok);
    return test_finish();
}

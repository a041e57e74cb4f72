/*
 * fuzz_chat_json.c - libFuzzer target: JSON conversations through both
 * renderers and the span tokenization (issue 13: text from users never
 * becomes control tokens).
 *
 * The first byte picks options (thinking, Think Max, API kind); the rest is
 * JSON. As a text-layer conversation ({"messages": [...], "tools": [...]},
 * or a bare messages array) it goes through ds4_chat_render_spans; as a
 * request body of the chosen API through api_request_parse and
 * prompt_render_spans. Every rendered prompt is tokenized with its
 * template ranges (a byte-level mini vocabulary, fuzz_support.h) and two
 * properties must hold, else the target traps:
 *   - the ids decode back to exactly the rendered bytes;
 *   - every special token's bytes lie inside a template range, i.e. no
 *     marker came out of request text.
 * Seeds: fuzz/corpus/chat_json/.
 */
#include <stddef.h>
#include <stdint.h>

#include "fuzz/fuzz_support.h"
#include "include/ds4_chat.h"
#include "include/ds4_tokenizer.h"
#include "server/api_request.h"
#include "server/prompt_render.h"
#include "server/tool_memory.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static ds4_tokenizer *g_tok;

static ds4_tokenizer *mini_tok(void)
{
    char path[64] = "/tmp/ds4-fuzz-vocab-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return NULL;
    close(fd);
    ds4_tokenizer *t = fuzz_write_mini_vocab(path) ? ds4_tokenizer_load(path) : NULL;
    unlink(path);
    return t;
}

static bool inside(const ds4_spans *sp, size_t a, size_t b)
{
    for (size_t i = 0; i < sp->n; i++)
        if (sp->v[i].off <= a && b <= sp->v[i].off + sp->v[i].len) return true;
    return false;
}

static void check(const char *text, size_t len, const ds4_spans *sp)
{
    if (!text || sp->oom) return;
    for (size_t i = 0; i < sp->n; i++) /* sorted, inside the text */
        if (sp->v[i].off + sp->v[i].len > len || (i && sp->v[i].off < sp->v[i - 1].off + sp->v[i - 1].len))
            __builtin_trap();
    ds4_tokens t = {0};
    if (ds4_tokenize_spans(g_tok, text, len, sp, 0, &t) != DS4_OK) { ds4_tokens_free(&t); return; }
    size_t off = 0;
    for (size_t i = 0; i < t.n; i++) {
        size_t n;
        const char *b = ds4_token_bytes(g_tok, t.ids[i], &n);
        if (!b || off + n > len || memcmp(b, text + off, n)) __builtin_trap();
        if (ds4_tokenizer_is_added(g_tok, t.ids[i]) && !inside(sp, off, off + n)) __builtin_trap();
        off += n;
    }
    if (off != len) __builtin_trap();
    ds4_tokens_free(&t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_tok && !(g_tok = mini_tok())) return 0;
    static tool_memory *mem;
    if (!mem) mem = tool_memory_new(64);
    if (size < 1) return 0;
    uint8_t opt = data[0];
    const char *body = (const char *)data + 1;
    size_t blen = size - 1;

    json_t *root = json_loadb(body, blen, 0, NULL);
    if (root) {
        const json_t *msgs = json_is_array(root) ? root : json_object_get(root, "messages");
        const json_t *tools = json_is_object(root) ? json_object_get(root, "tools") : NULL;
        ds4_chat_options o;
        ds4_chat_options_default(&o);
        o.thinking = opt & 1;
        o.think_max = opt & 2;
        o.drop_thinking = !(opt & 4);
        ds4_spans sp = {0};
        char *text = NULL;
        size_t len = 0;
        if (msgs && ds4_chat_render_spans(msgs, tools, &o, &sp, &text, &len) == DS4_OK) check(text, len, &sp);
        free(text);
        ds4_spans_free(&sp);
        json_decref(root);
    }

    api_request r;
    api_error e;
    if (api_request_parse((api_kind)((opt >> 3) % 4), body, blen, &r, &e) == 0) {
        render_opts ro = {opt & 1, (opt & 2) && r.think_max, !(opt & 4), mem};
        ds4_spans sp = {0};
        size_t len = 0;
        char *text = prompt_render_spans(&r, &ro, &len, NULL, &sp);
        check(text, len, &sp);
        free(text);
        ds4_spans_free(&sp);
        api_request_free(&r);
    }
    return 0;
}

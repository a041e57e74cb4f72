/*
 * quality_manifest.c - load a ds4-quality manifest (see quality_manifest.h).
 */
#include "tools/quality_manifest.h"

#include "include/ds4_chat.h"
#include "util/error.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The official API spells EOS with doubled bars (shared/data/ds4-vectors). */
#define API_EOS_TEXT "<\xEF\xBD\x9C\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C\xEF\xBD\x9C>"

ds4_status quality_prompt_tokens(const ds4_tokenizer *tok, const void *item, const char *where, ds4_tokens *out)
{
    const json_t *it = item;
    const json_t *msgs = json_object_get(it, "messages"), *prompt = json_object_get(it, "prompt"),
                 *rendered = json_object_get(it, "prompt_rendered");
    /* "prompt_rendered" is an already-rendered prompt (an official API
     * capture's exact bytes): its markers are meant, like ds4
     * --raw-prompt. Messages and "prompt" are content: rendered with the
     * template's spans, so text that spells a marker stays text. */
    if (json_is_string(rendered))
        return ds4_tokenize(tok, json_string_value(rendered), json_string_length(rendered), DS4_TOKENIZE_SPECIAL, out);
    json_t *own = NULL;
    if (!msgs && json_is_string(prompt)) {
        own = json_pack("[{s:s,s:O}]", "role", "user", "content", prompt);
        msgs = own;
    }
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        json_decref(own);
        return ds4_fail(DS4_ERR_FORMAT, "%s: needs \"messages\" (non-empty array), \"prompt\" or \"prompt_rendered\" (string)",
                        where);
    }
    ds4_chat_options co;
    ds4_chat_options_default(&co);
    co.thinking = json_is_true(json_object_get(it, "thinking"));
    ds4_status st = ds4_chat_tokenize(tok, msgs, json_object_get(it, "tools"), &co, out);
    json_decref(own);
    if (st) ds4_error_prefix("%s: ", where);
    return st;
}

/* Id of a {"text", "bytes": [...]} token object; -1 when it is none of
 * this vocabulary's tokens; -2 when malformed. */
static int32_t token_id(const ds4_tokenizer *tok, const json_t *t)
{
    const json_t *bytes = json_object_get(t, "bytes"), *text = json_object_get(t, "text");
    char buf[1024];
    size_t n = 0;
    if (json_is_array(bytes)) {
        if (json_array_size(bytes) == 0 || json_array_size(bytes) > sizeof buf) return -2;
        size_t i;
        const json_t *b;
        json_array_foreach(bytes, i, b) {
            if (!json_is_integer(b) || json_integer_value(b) < 0 || json_integer_value(b) > 255) return -2;
            buf[n++] = (char)json_integer_value(b);
        }
    } else if (json_is_string(text) && json_string_length(text) > 0 && json_string_length(text) <= sizeof buf) {
        n = json_string_length(text);
        memcpy(buf, json_string_value(text), n);
    } else {
        return -2;
    }
    if (n == strlen(API_EOS_TEXT) && memcmp(buf, API_EOS_TEXT, n) == 0) return ds4_tokenizer_special(tok, DS4_TOK_EOS);
    return ds4_tokenizer_find(tok, buf, n);
}

static void item_free(quality_item *it)
{
    free(it->id);
    ds4_tokens_free(&it->prompt);
    free(it->tok);
    free(it->lp);
    free(it->n_top);
    free(it->top);
    free(it->top_lp);
}

void quality_manifest_free(quality_manifest *m)
{
    for (int i = 0; m->items && i < m->n_items; i++) item_free(&m->items[i]);
    free(m->items);
    memset(m, 0, sizeof *m);
}

static ds4_status load_item(const ds4_tokenizer *tok, const json_t *j, int idx, int K, const char *path,
                            quality_item *it)
{
    char where[256];
    const json_t *id = json_object_get(j, "id"), *steps = json_object_get(j, "steps");
    snprintf(where, sizeof where, "%s: item %d (%.64s)", path, idx, json_is_string(id) ? json_string_value(id) : "no id");
    if (!json_is_object(j) || !json_is_string(id)) return ds4_fail(DS4_ERR_FORMAT, "%s: needs a string \"id\"", where);
    if (!json_is_array(steps) || json_array_size(steps) == 0 || json_array_size(steps) > 1000000)
        return ds4_fail(DS4_ERR_FORMAT, "%s: needs a non-empty \"steps\" array", where);
    it->id = strdup(json_string_value(id));
    const size_t n = json_array_size(steps);
    it->tok = calloc(n, sizeof *it->tok);
    it->lp = calloc(n, sizeof *it->lp);
    it->n_top = calloc(n, sizeof *it->n_top);
    it->top = calloc(n * (size_t)K, sizeof *it->top);
    it->top_lp = calloc(n * (size_t)K, sizeof *it->top_lp);
    if (!it->id || !it->tok || !it->lp || !it->n_top || !it->top || !it->top_lp) return ds4_fail(DS4_ERR_NOMEM, "out of memory");
    for (const char *c = it->id; *c; c++)
        if (*c == '\t' || *c == '\n' || *c == '\r') return ds4_fail(DS4_ERR_FORMAT, "%s: id contains a tab or newline", where);
    ds4_status st = quality_prompt_tokens(tok, j, where, &it->prompt);
    if (st) return st;
    it->n_steps = (int)n;
    for (size_t s = 0; s < n; s++) {
        const json_t *step = json_array_get(steps, s), *t = json_object_get(step, "token"),
                     *lp = json_object_get(step, "logprob"), *top = json_object_get(step, "top_logprobs");
        int32_t v = token_id(tok, t);
        if (v == -2 || !json_is_number(lp))
            return ds4_fail(DS4_ERR_FORMAT, "%s step %zu: needs \"token\": {\"bytes\": [...]} and a numeric \"logprob\"",
                            where, s);
        if (v < 0) {
            const json_t *tx = json_object_get(t, "text");
            return ds4_fail(DS4_ERR_FORMAT,
                            "%s step %zu: token '%.40s' is not a token of this model's vocabulary "
                            "(was the manifest made with another tokenizer?)",
                            where, s, json_is_string(tx) ? json_string_value(tx) : "?");
        }
        it->tok[s] = v;
        it->lp[s] = json_number_value(lp);
        size_t i;
        const json_t *alt;
        if (top && !json_is_array(top)) return ds4_fail(DS4_ERR_FORMAT, "%s step %zu: \"top_logprobs\" is not an array", where, s);
        json_array_foreach(top, i, alt) {
            if (it->n_top[s] >= K) break;
            int32_t a = token_id(tok, json_object_get(alt, "token"));
            const json_t *alp = json_object_get(alt, "logprob");
            if (a == -2 || !json_is_number(alp))
                return ds4_fail(DS4_ERR_FORMAT, "%s step %zu: malformed alternative %zu", where, s, i);
            if (a >= 0) {
                it->top_lp[s * (size_t)K + (size_t)it->n_top[s]] = json_number_value(alp);
                it->top[s * (size_t)K + (size_t)it->n_top[s]++] = a;
            }
        }
    }
    return DS4_OK;
}

ds4_status quality_manifest_load(const char *path, const ds4_tokenizer *tok, quality_manifest *m)
{
    memset(m, 0, sizeof *m);
    json_error_t je;
    json_t *doc = json_load_file(path, 0, &je);
    if (!doc) {
        FILE *f = fopen(path, "rb");
        if (!f) return ds4_fail(DS4_ERR_IO, "manifest %s: cannot open", path);
        fclose(f);
        return ds4_fail(DS4_ERR_FORMAT, "manifest %s: malformed JSON at line %d: %s", path, je.line, je.text);
    }
    ds4_status st = DS4_OK;
    const json_t *schema = json_object_get(doc, "schema"), *items = json_object_get(doc, "items"),
                 *k = json_object_get(doc, "top_k"), *nv = json_object_get(doc, "n_vocab");
    if (!json_is_string(schema) || strcmp(json_string_value(schema), "ds4-quality-manifest-v1") != 0)
        st = ds4_fail(DS4_ERR_FORMAT, "manifest %s: \"schema\" is not \"ds4-quality-manifest-v1\"", path);
    else if (!json_is_array(items) || json_array_size(items) == 0)
        st = ds4_fail(DS4_ERR_FORMAT, "manifest %s: no items", path);
    else if (k && (!json_is_integer(k) || json_integer_value(k) < 0 || json_integer_value(k) > 1000))
        st = ds4_fail(DS4_ERR_FORMAT, "manifest %s: bad \"top_k\"", path);
    else if (nv && (!json_is_integer(nv) || json_integer_value(nv) != ds4_tokenizer_n_vocab(tok)))
        st = ds4_fail(DS4_ERR_FORMAT, "manifest %s: made with a vocabulary of %lld tokens, this model has %d "
                      "(another tokenizer)", path, json_is_integer(nv) ? (long long)json_integer_value(nv) : -1LL,
                      ds4_tokenizer_n_vocab(tok));
    if (!st) {
        m->top_k = k ? (int)json_integer_value(k) : 20;
        m->items = calloc(json_array_size(items), sizeof *m->items);
        if (!m->items) st = ds4_fail(DS4_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; !st && i < json_array_size(items); i++) {
        st = load_item(tok, json_array_get(items, i), (int)i, m->top_k, path, &m->items[i]);
        m->n_items++;
    }
    json_decref(doc);
    if (st) quality_manifest_free(m);
    return st;
}

/*
 * convert_tokenizer.c - tokenizer.json / vocab GGUF -> tokenizer.ggml.* keys
 * (see convert_tokenizer.h for the rules).
 */
#include "tools/convert_tokenizer.h"

#include "util/error.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TT_NORMAL = 1, TT_UNUSED = 5, TT_CONTROL = 3, TT_USER = 4 };

static bool looks_special(const char *s)
{
    size_t n = strlen(s);
    const char *fo = "<\xef\xbd\x9c", *fc = "\xef\xbd\x9c>"; /* "<｜", "｜>" */
    if (n >= 8 && strncmp(s, fo, 4) == 0 && strcmp(s + n - 4, fc) == 0) return true;
    return n >= 4 && strncmp(s, "<|", 2) == 0 && strcmp(s + n - 2, "|>") == 0;
}

static ds4_status copy_from_gguf(ds4_gguf_writer *w, const char *path, uint32_t n_vocab)
{
    ds4_gguf *g = ds4_gguf_open(path);
    if (!g) return DS4_ERR_FORMAT;
    int64_t kv;
    uint64_t len = 0;
    ds4_status st = ds4_gguf_get_arr(g, "tokenizer.ggml.tokens", DS4_GGUF_STRING, &kv, &len);
    if (!st && len != n_vocab)
        st = ds4_fail(DS4_ERR_INVALID, "tokenizer: %s has %llu tokens, the model's vocab_size is %u", path,
                      (unsigned long long)len, n_vocab);
    if (st) {
        ds4_gguf_close(g);
        return st;
    }
    int copied = 0;
    for (int64_t i = 0; !st && i < ds4_gguf_n_kv(g); i++) {
        if (strncmp(ds4_gguf_key(g, i), "tokenizer.", 10) != 0) continue;
        st = ds4_gguf_writer_copy_kv(w, g, i);
        copied++;
    }
    ds4_gguf_close(g);
    if (!st && !copied) st = ds4_fail(DS4_ERR_NOT_FOUND, "tokenizer: %s has no tokenizer.* keys", path);
    return st;
}

/* A special-token entry of tokenizer_config.json: "str" or {"content": "str"}. */
static const char *token_str(json_t *v)
{
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_string_value(v);
}

static int64_t id_of(json_t *vocab, json_t *added, const char *s)
{
    if (!s) return -1;
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a) {
        const char *c = json_string_value(json_object_get(a, "content"));
        if (c && strcmp(c, s) == 0) return json_integer_value(json_object_get(a, "id"));
    }
    json_t *v = json_object_get(vocab, s);
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

ds4_status convert_tokenizer_add(ds4_gguf_writer *w, const char *path, const convert_config *cfg)
{
    size_t plen = strlen(path);
    if (plen > 5 && strcmp(path + plen - 5, ".gguf") == 0) return copy_from_gguf(w, path, cfg->n_vocab);

    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root)
        return ds4_fail(DS4_ERR_FORMAT, "tokenizer: %s: bad JSON at line %d: %s", path, jerr.line, jerr.text);
    ds4_status st = DS4_OK;
    json_t *model = json_object_get(root, "model");
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    json_t *added = json_object_get(root, "added_tokens");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    const uint32_t nv = cfg->n_vocab;
    const char **tokens = calloc(nv, sizeof *tokens);
    int32_t *types = calloc(nv, sizeof *types);
    char **pads = calloc(nv, sizeof *pads);
    size_t n_merges = json_array_size(merges);
    char **merge_buf = calloc(n_merges + 1, sizeof *merge_buf);
    const char **merge_strs = calloc(n_merges + 1, sizeof *merge_strs);
    if (!tokens || !types || !pads || !merge_buf || !merge_strs) st = ds4_fail(DS4_ERR_NOMEM, "tokenizer: out of memory");
    else if (!mtype || strcmp(mtype, "BPE") != 0 || !json_is_object(vocab) || !json_is_array(merges))
        st = ds4_fail(DS4_ERR_FORMAT, "tokenizer: %s: model is not a BPE with vocab and merges", path);

    const char *key;
    json_t *v;
    if (!st) json_object_foreach(vocab, key, v) {
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0 || id >= nv) {
            st = ds4_fail(DS4_ERR_FORMAT, "tokenizer: %s: token \"%s\" has id %lld outside the model's vocab_size %u",
                          path, key, (long long)id, nv);
            break;
        }
        if (tokens[id]) {
            st = ds4_fail(DS4_ERR_FORMAT, "tokenizer: %s: id %lld used by \"%s\" and \"%s\"", path, (long long)id,
                          tokens[id], key);
            break;
        }
        tokens[id] = key;
        types[id] = TT_NORMAL;
    }
    size_t i;
    json_t *a;
    if (!st) json_array_foreach(added, i, a) {
        json_t *jid = json_object_get(a, "id");
        const char *c = json_string_value(json_object_get(a, "content"));
        json_int_t id = json_integer_value(jid);
        if (!c || !json_is_integer(jid)) {
            st = ds4_fail(DS4_ERR_FORMAT, "tokenizer: %s: added_tokens[%zu] needs an integer id and a content", path, i);
            break;
        }
        if (id < 0 || id >= nv) {
            st = ds4_fail(DS4_ERR_FORMAT, "tokenizer: %s: added token \"%s\" has id %lld outside the model's vocab_size %u",
                          path, c, (long long)id, nv);
            break;
        }
        tokens[id] = c;
        types[id] = json_is_true(json_object_get(a, "special")) || looks_special(c) ? TT_CONTROL : TT_USER;
    }
    for (uint32_t id = 0; !st && id < nv; id++) {
        if (tokens[id]) continue;
        pads[id] = malloc(24);
        if (!pads[id]) {
            st = ds4_fail(DS4_ERR_NOMEM, "tokenizer: out of memory");
            break;
        }
        snprintf(pads[id], 24, "[PAD%u]", id);
        tokens[id] = pads[id];
        types[id] = TT_UNUSED;
    }
    if (!st) json_array_foreach(merges, i, a) {
        if (json_is_string(a)) {
            merge_strs[i] = json_string_value(a);
        } else if (json_is_array(a) && json_array_size(a) == 2 && json_is_string(json_array_get(a, 0)) &&
                   json_is_string(json_array_get(a, 1))) {
            const char *l = json_string_value(json_array_get(a, 0)), *r = json_string_value(json_array_get(a, 1));
            size_t n = strlen(l) + strlen(r) + 2;
            merge_buf[i] = malloc(n);
            if (!merge_buf[i]) {
                st = ds4_fail(DS4_ERR_NOMEM, "tokenizer: out of memory");
                break;
            }
            snprintf(merge_buf[i], n, "%s %s", l, r);
            merge_strs[i] = merge_buf[i];
        } else {
            st = ds4_fail(DS4_ERR_FORMAT, "tokenizer: %s: merges[%zu] is neither \"a b\" nor [a, b]", path, i);
            break;
        }
    }

    /* special ids: tokenizer_config.json beside tokenizer.json, else config.json */
    int64_t bos = cfg->bos_id, eos = cfg->eos_id, pad = -1;
    bool add_bos = false, add_eos = false;
    if (!st) {
        const char *slash = strrchr(path, '/');
        size_t dlen = slash ? (size_t)(slash - path + 1) : 0;
        char *tc_path = malloc(dlen + 32);
        if (tc_path) {
            snprintf(tc_path, dlen + 32, "%.*stokenizer_config.json", (int)dlen, path);
            json_t *tc = json_load_file(tc_path, 0, &jerr);
            if (tc) {
                int64_t id;
                if ((id = id_of(vocab, added, token_str(json_object_get(tc, "bos_token")))) >= 0) bos = id;
                if ((id = id_of(vocab, added, token_str(json_object_get(tc, "eos_token")))) >= 0) eos = id;
                pad = id_of(vocab, added, token_str(json_object_get(tc, "pad_token")));
                add_bos = json_is_true(json_object_get(tc, "add_bos_token"));
                add_eos = json_is_true(json_object_get(tc, "add_eos_token"));
                json_decref(tc);
            }
            free(tc_path);
        }
        if (pad < 0) pad = eos;
    }
    if (!st) st = ds4_gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2");
    if (!st) st = ds4_gguf_writer_add_str(w, "tokenizer.ggml.pre", "joyai-llm");
    if (!st) st = ds4_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", tokens, NULL, nv);
    if (!st) st = ds4_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", DS4_GGUF_I32, types, nv);
    if (!st) st = ds4_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", merge_strs, NULL, n_merges);
    if (!st) st = ds4_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos);
    if (!st) st = ds4_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
    if (!st) st = ds4_gguf_writer_add_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)pad);
    if (!st) st = ds4_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", add_bos);
    if (!st) st = ds4_gguf_writer_add_bool(w, "tokenizer.ggml.add_eos_token", add_eos);

    if (pads)
        for (uint32_t id = 0; id < nv; id++) free(pads[id]);
    if (merge_buf)
        for (size_t k = 0; k < n_merges; k++) free(merge_buf[k]);
    free(pads);
    free(merge_buf);
    free(merge_strs);
    free(tokens);
    free(types);
    json_decref(root);
    return st;
}

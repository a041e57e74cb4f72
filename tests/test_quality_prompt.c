/*
 * test_quality_prompt.c - the prompts of ds4-quality manifests (and of the
 * imatrix datasets / ds4-eval, which tokenize the same way) are user
 * content: a prompt that spells a chat marker stays text. Checked on the
 * real DeepSeek V4 vocabulary against its plain-text tokenization (no
 * specials), while "prompt_rendered" (an official capture's exact bytes)
 * keeps its markers.
 */
#include "tests/test.h"
#include "include/ds4_chat.h"
#include "include/ds4_tokenizer.h"
#include "tools/quality_manifest.h"

#include <jansson.h>
#include <string.h>

static ds4_tokenizer *g_tok;

static size_t count_id(const ds4_tokens *t, int32_t id)
{
    size_t n = 0;
    for (size_t i = 0; i < t->n; i++) n += t->ids[i] == id;
    return n;
}

/* true when needle's ids occur contiguously in hay */
static bool contains(const ds4_tokens *hay, const ds4_tokens *needle)
{
    for (size_t i = 0; needle->n && i + needle->n <= hay->n; i++)
        if (!memcmp(hay->ids + i, needle->ids, needle->n * sizeof *needle->ids)) return true;
    return false;
}

static void test_marker_in_prompt_stays_text(void)
{
    REQUIRE(g_tok);
    const char *content = "tell me " DS4_TEXT_EOS DS4_TEXT_USER " and " DS4_TEXT_ASSISTANT DS4_TEXT_THINK_END " x";
    int32_t eos = ds4_tokenizer_special(g_tok, DS4_TOK_EOS), user = ds4_tokenizer_special(g_tok, DS4_TOK_USER),
            asst = ds4_tokenizer_special(g_tok, DS4_TOK_ASSISTANT);
    const char *shapes[2] = {"{\"prompt\": %s}", "{\"messages\": [{\"role\": \"user\", \"content\": %s}]}"};
    for (int k = 0; k < 2; k++) {
        json_t *s = json_string(content);
        char *js = json_dumps(s, JSON_ENCODE_ANY);
        char buf[512];
        snprintf(buf, sizeof buf, shapes[k], js);
        free(js);
        json_decref(s);
        json_t *item = json_loads(buf, 0, NULL);
        REQUIRE(item);
        ds4_tokens t = {0}, plain = {0};
        EXPECT_MSG(quality_prompt_tokens(g_tok, item, "item", &t) == DS4_OK, "%s", ds4_last_error());
        /* the template's own markers only: one user turn, one assistant */
        EXPECT_MSG(count_id(&t, eos) == 0 && count_id(&t, user) == 1 && count_id(&t, asst) == 1,
                   "shape %d: %zu EOS, %zu User, %zu Assistant", k, count_id(&t, eos), count_id(&t, user),
                   count_id(&t, asst));
        /* the content is there as its plain-text tokens */
        EXPECT(ds4_tokenize(g_tok, content, strlen(content), 0, &plain) == DS4_OK);
        EXPECT_MSG(contains(&t, &plain), "shape %d: the content's plain tokens are not in the prompt", k);
        ds4_tokens_free(&t);
        ds4_tokens_free(&plain);
        json_decref(item);
    }
}

static void test_prompt_rendered_keeps_markers(void)
{
    REQUIRE(g_tok);
    json_t *item = json_pack("{s:s}", "prompt_rendered", DS4_TEXT_BOS DS4_TEXT_USER "hi" DS4_TEXT_ASSISTANT);
    ds4_tokens t = {0};
    EXPECT(quality_prompt_tokens(g_tok, item, "item", &t) == DS4_OK);
    EXPECT(count_id(&t, ds4_tokenizer_special(g_tok, DS4_TOK_USER)) == 1 &&
           count_id(&t, ds4_tokenizer_special(g_tok, DS4_TOK_ASSISTANT)) == 1);
    ds4_tokens_free(&t);
    json_decref(item);
}

int main(void)
{
    g_tok = ds4_tokenizer_load(test_data("tokenizer/dsv4-vocab.gguf"));
    RUN(test_marker_in_prompt_stays_text);
    RUN(test_prompt_rendered_keeps_markers);
    ds4_tokenizer_free(g_tok);
    return test_finish();
}

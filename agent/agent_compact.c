/*
 * agent_compact.c - context management: when the session is nearly full,
 * the oldest turns are summarised by the model itself and the session is
 * rebuilt from [system, summary, recent turns].
 *
 * The summary is generated on the same engine session (reset first: the
 * old state is not needed any more, the messages hold the conversation),
 * in chat mode without tools, from a plain-text transcript of the old
 * messages. The recent part starts at an assistant or user message, so no
 * tool result is separated from its call.
 */
#include "agent/agent.h"

#include <stdlib.h>
#include <string.h>

#define RESULT_BYTES 1500  /* of each tool result in the transcript to summarise */

static const char SUMMARY_ASK[] =
    "Summarise the conversation below between a user and a coding assistant so that the assistant can "
    "continue the work from the summary alone. Keep: the user's requests, decisions taken, files read or "
    "changed (with what changed), commands run and their outcome, and what remains to do. Be concise.\n\n";

/* n, lowered so that s[0..n) does not end inside a UTF-8 character (the
 * transcript goes into a JSON string, which must stay valid UTF-8). */
static size_t utf8_floor(const char *s, size_t n, size_t len)
{
    while (n > 0 && n < len && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
    return n;
}

static void put_text(agent_buf *b, const json_t *v, size_t max)
{
    const char *s = json_string_value(v);
    if (!s) return;
    size_t l = strlen(s), k = l > max ? utf8_floor(s, max, l) : l;
    agent_buf_add(b, s, k);
    if (k < l) agent_buf_printf(b, " [... %zu bytes more]", l - k);
}

static char *transcript(const json_t *msgs, size_t from, size_t to, size_t max_bytes)
{
    agent_buf b = {0};
    for (size_t i = from; i < to; i++) {
        const json_t *m = json_array_get(msgs, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role) continue;
        if (!strcmp(role, "user")) {
            agent_buf_puts(&b, "USER: ");
            put_text(&b, json_object_get(m, "content"), 8000);
        } else if (!strcmp(role, "assistant")) {
            agent_buf_puts(&b, "ASSISTANT: ");
            put_text(&b, json_object_get(m, "content"), 4000);
            json_t *calls = json_object_get(m, "tool_calls");
            for (size_t k = 0; k < json_array_size(calls); k++) {
                json_t *fn = json_object_get(json_array_get(calls, k), "function");
                agent_buf_printf(&b, "\nCALL %s ", json_string_value(json_object_get(fn, "name")));
                put_text(&b, json_object_get(fn, "arguments"), 600);
            }
        } else if (!strcmp(role, "tool")) {
            agent_buf_puts(&b, "RESULT: ");
            put_text(&b, json_object_get(m, "content"), RESULT_BYTES);
        } else {
            continue;
        }
        agent_buf_puts(&b, "\n\n");
    }
    /* keep the end when too long: the latest work matters most */
    if (!b.oom && b.n > max_bytes) {
        size_t cut = b.n - max_bytes;
        while (cut < b.n && ((unsigned char)b.p[cut] & 0xC0) == 0x80) cut++; /* to a character start */
        max_bytes = b.n - cut;
        memmove(b.p, b.p + cut, max_bytes);
        b.n = max_bytes;
        b.p[b.n] = '\0';
    }
    return agent_buf_take(&b);
}

bool agent_compact(agent *a)
{
    size_t n = json_array_size(a->messages);
    /* the recent part: about the last third of the messages */
    size_t keep = n / 3 > 2 ? n / 3 : 2;
    size_t cut = n > keep ? n - keep : 0;
    while (cut < n) {
        const char *r = json_string_value(json_object_get(json_array_get(a->messages, cut), "role"));
        if (r && (!strcmp(r, "assistant") || !strcmp(r, "user"))) break;
        cut++;
    }
    if (cut <= 1 || cut >= n) {
        fprintf(stderr, "ds4-agent: the context is nearly full and there is nothing older to compact\n");
        return false;
    }
    size_t before = a->live.n;
    fprintf(a->s.out, "[context %zu/%lld tokens: summarising %zu earlier messages]\n", before, (long long)a->eng->ctx,
            cut - 1);
    fflush(a->s.out);
    /* at one token per byte at worst, the transcript takes half the context */
    char *old = transcript(a->messages, 1, cut, (size_t)(a->eng->ctx / 2));
    if (!old) return false;
    agent_buf ask = {0};
    agent_buf_puts(&ask, SUMMARY_ASK);
    agent_buf_puts(&ask, old);
    free(old);
    char *ask_s = agent_buf_take(&ask);
    if (!ask_s) return false;

    /* a side conversation on the reset session */
    json_t *keep_msgs = a->messages;
    agent_settings keep_s = a->s;
    long keep_id = a->next_call_id;
    a->messages = json_array();
    json_array_append_new(a->messages, json_pack("{s:s,s:s}", "role", "system", "content",
                                                 "You write concise, factual summaries."));
    json_array_append_new(a->messages, json_pack("{s:s,s:s}", "role", "user", "content", ask_s));
    free(ask_s);
    a->s.thinking = false;
    a->s.think_max = false;
    a->s.n_predict = (int)(a->eng->ctx / 8 < 2048 ? a->eng->ctx / 8 : 2048);
    json_t *schemas = a->schemas;
    a->schemas = NULL;
    a->n_in_session = 0;
    a->pending_eos = false;
    a->eng->reset(a->eng);
    a->live.n = 0;
    a->live_text.n = 0;
    bool ok = agent_sync(a);
    json_t *ans = ok ? agent_generate(a, false, true, NULL) : NULL;
    const char *summary = json_string_value(json_object_get(ans, "content"));
    char *sum = summary && *summary ? strdup(summary) : NULL;
    json_decref(a->messages);
    a->messages = keep_msgs;
    a->s = keep_s;
    a->schemas = schemas;
    a->next_call_id = keep_id;
    /* the session now holds the side conversation: rebuild from scratch */
    a->eng->reset(a->eng);
    a->live.n = 0;
    a->live_text.n = 0;
    a->n_in_session = 0;
    a->pending_eos = false;
    if (!sum) {
        fprintf(stderr, "ds4-agent: compaction failed: the model gave no summary\n");
        return false;
    }
    json_t *fresh = json_array();
    json_array_append(fresh, json_array_get(a->messages, 0));
    agent_buf b = {0};
    agent_buf_puts(&b, "[Summary of the earlier conversation, which was compacted to save context]\n\n");
    agent_buf_puts(&b, sum);
    free(sum);
    char *bs = agent_buf_take(&b);
    json_array_append_new(fresh, json_pack("{s:s,s:s}", "role", "user", "content", bs ? bs : ""));
    free(bs);
    for (size_t i = cut; i < n; i++) json_array_append(fresh, json_array_get(a->messages, i));
    json_decref(a->messages);
    a->messages = fresh;
    a->compactions++;
    fprintf(a->s.out, "[context compacted: %zu earlier messages replaced by a summary]\n", cut - 1);
    fflush(a->s.out);
    return true;
}

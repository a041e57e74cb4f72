/*
 * test_eval_check.c - the answer rules of ds4-eval (tools/eval_check.c)
 * on hand-written answers, and the suite's own invariants (at least 60
 * questions, unique ids, the five categories, every expectation usable by
 * its rule: each question's expected answer written out passes its own
 * check).
 */
#include "tests/test.h"
#include "tools/eval_suite.h"

#include <string.h>

static bool chk(eval_rule r, const char *expected, const char *answer)
{
    eval_question q = {"t", "x", "p", r, expected, NULL};
    char why[160];
    return eval_check(&q, answer, NULL, why, sizeof why);
}

static bool chk_tool(const char *tool, const char *expected, const char *calls_json)
{
    eval_question q = {"t", "tools", "p", EVAL_TOOL, expected, tool};
    json_t *calls = json_loads(calls_json, 0, NULL);
    char why[160];
    bool ok = eval_check(&q, "", calls, why, sizeof why);
    json_decref(calls);
    return ok;
}

static void test_rules(void)
{
    EXPECT(chk(EVAL_NUMBER, "42", "17 + 25 = 42."));
    EXPECT(chk(EVAL_NUMBER, "1000", "The answer is 1,000"));
    EXPECT(chk(EVAL_NUMBER, "-1", "-1"));
    EXPECT(chk(EVAL_NUMBER, "0.875", "0.875"));
    EXPECT(!chk(EVAL_NUMBER, "42", "42 is not 43"));
    EXPECT(!chk(EVAL_NUMBER, "42", "forty-two"));
    EXPECT(chk(EVAL_EXACT, "ababab", "  `ababab`\n"));
    EXPECT(chk(EVAL_EXACT, "object", "Object."));
    EXPECT(!chk(EVAL_EXACT, "ababab", "It prints ababab"));
    EXPECT(chk(EVAL_EXACT_CASE, "YES", "YES"));
    EXPECT(!chk(EVAL_EXACT_CASE, "YES", "Yes"));
    EXPECT(chk(EVAL_CONTAINS, "Rome|Roma", "The capital of Italy is rome."));
    EXPECT(chk(EVAL_CONTAINS, "carbon dioxide|CO2", "They absorb CO2."));
    EXPECT(!chk(EVAL_CONTAINS, "Paris", "Lyon"));
    EXPECT(chk(EVAL_REGEX, "^([1-9]|10)$", "7"));
    EXPECT(!chk(EVAL_REGEX, "^([1-9]|10)$", "11"));
    EXPECT(chk(EVAL_REGEX, "^1,\\s*2,\\s*3,\\s*4,\\s*5\\.?$", "1, 2, 3, 4, 5"));
    EXPECT(chk(EVAL_LINES, "3", "Red\nBlue\n\nYellow\n"));
    EXPECT(!chk(EVAL_LINES, "3", "Red, Blue, Yellow"));
    EXPECT(chk(EVAL_WORDS_MAX, "8", "The sea is vast and blue."));
    EXPECT(!chk(EVAL_WORDS_MAX, "8", "The sea is a vast and restless expanse of deep blue water."));
    EXPECT(!chk(EVAL_WORDS_MAX, "8", "   "));
    EXPECT(chk(EVAL_JSON_EQ, "{\"name\": \"Ada\", \"age\": 36}", "```json\n{\"age\": 36, \"name\": \"Ada\"}\n```"));
    EXPECT(!chk(EVAL_JSON_EQ, "{\"name\": \"Ada\", \"age\": 36}", "{\"name\": \"Ada\", \"age\": \"36\"}"));
    EXPECT(!chk(EVAL_JSON_EQ, "{\"name\": \"Ada\"}", "name: Ada"));
}

static void test_tool_rule(void)
{
    const char *c = "[{\"type\":\"function\",\"function\":{\"name\":\"add\",\"arguments\":\"{\\\"a\\\": \\\"1234\\\", \\\"b\\\": 4321}\"}}]";
    EXPECT(chk_tool("add", "{\"a\": 1234, \"b\": 4321}", c)); /* a number sent as a string */
    EXPECT(!chk_tool("add", "{\"a\": 1234, \"b\": 4322}", c));
    EXPECT(!chk_tool("get_time", "{\"city\": \"Oslo\"}", c));
    const char *w = "[{\"type\":\"function\",\"function\":{\"name\":\"search_web\",\"arguments\":{\"query\":\"deepseek v4 release\"}}}]";
    EXPECT(chk_tool("search_web", "{\"~query\": \"DeepSeek\"}", w));
    EXPECT(!chk_tool("search_web", "{\"query\": \"DeepSeek\"}", w));
    EXPECT(!chk_tool("add", "{\"a\": 1}", "[]"));
    EXPECT(!chk_tool("add", "{\"a\": 1}", "null"));
}

static void test_suite_invariants(void)
{
    EXPECT_MSG(eval_n_questions >= 60, "%d questions", eval_n_questions);
    const char *cats[] = {"arithmetic", "code", "facts", "format", "tools"};
    int per[5] = {0};
    json_t *tools = json_loads(eval_tools_json, 0, NULL);
    EXPECT(json_is_array(tools) && json_array_size(tools) == 6);
    for (int i = 0; i < eval_n_questions; i++) {
        const eval_question *q = &eval_questions[i];
        int c = 0;
        while (c < 5 && strcmp(cats[c], q->category) != 0) c++;
        EXPECT_MSG(c < 5, "%s: unknown category %s", q->id, q->category);
        if (c < 5) per[c]++;
        for (int j = 0; j < i; j++) EXPECT_MSG(strcmp(eval_questions[j].id, q->id) != 0, "duplicate id %s", q->id);
        EXPECT_MSG((q->rule == EVAL_TOOL) == (q->tool != NULL), "%s: tool name iff tool rule", q->id);
        /* The expectation is satisfiable: written as the answer it passes
         * (the rules without a literal answer are covered in test_rules). */
        char why[160];
        if (q->rule == EVAL_NUMBER || q->rule == EVAL_EXACT || q->rule == EVAL_EXACT_CASE || q->rule == EVAL_JSON_EQ)
            EXPECT_MSG(eval_check(q, q->expected, NULL, why, sizeof why), "%s: %s", q->id, why);
        if (q->rule == EVAL_TOOL) {
            bool declared = false;
            size_t k;
            json_t *t;
            json_array_foreach(tools, k, t) declared |= strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")), q->tool) == 0;
            EXPECT_MSG(declared, "%s: tool %s is not declared", q->id, q->tool);
        }
    }
    for (int c = 0; c < 5; c++) EXPECT_MSG(per[c] >= 10, "category %s has %d questions", cats[c], per[c]);
    json_decref(tools);
}

int main(void)
{
    RUN(test_rules);
    RUN(test_tool_rule);
    RUN(test_suite_invariants);
    return test_finish();
}

/*
 * eval_check.c - the answer rules of `ds4-eval` (see eval_suite.h).
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tools/eval_suite.h"

#include <ctype.h>
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char *eval_rule_name(eval_rule r)
{
    static const char *const n[] = {"number", "exact", "exact_case", "contains", "regex",
                                    "lines", "words_max", "json_eq", "tool"};
    return (unsigned)r < sizeof n / sizeof n[0] ? n[r] : "?";
}

/* The answer trimmed of whitespace; for the exact rules also of
 * surrounding quotes or backticks and one final period. malloc'd. */
static char *normalized(const char *s, bool exact)
{
    while (isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) n--;
    while (exact && n >= 2 && ((s[0] == '"' && s[n - 1] == '"') || (s[0] == '`' && s[n - 1] == '`') ||
                      (s[0] == '\'' && s[n - 1] == '\''))) {
        s++;
        n -= 2;
    }
    if (exact && n && s[n - 1] == '.') n--;
    char *o = malloc(n + 1);
    if (o) {
        memcpy(o, s, n);
        o[n] = 0;
    }
    return o;
}

/* The last number in s ("1,000" = 1000; a leading '-' counts). */
static bool last_number(const char *s, double *out)
{
    bool found = false;
    for (const char *p = s; *p; p++) {
        if (!isdigit((unsigned char)*p)) continue;
        const char *start = p > s && p[-1] == '-' ? p - 1 : p;
        char buf[64];
        size_t n = 0;
        for (const char *q = start; *q && n < sizeof buf - 1; q++) {
            if (*q == ',' && isdigit((unsigned char)q[1]) && q > start) continue; /* thousands separator */
            if (!(isdigit((unsigned char)*q) || *q == '-' || (*q == '.' && isdigit((unsigned char)q[1])))) break;
            if (*q == '-' && q != start) break;
            buf[n++] = *q;
            p = q;
        }
        buf[n] = 0;
        *out = strtod(buf, NULL);
        found = true;
    }
    return found;
}

static bool contains_ci(const char *hay, const char *needle, size_t nl)
{
    for (const char *p = hay; *p; p++)
        if (strncasecmp(p, needle, nl) == 0) return true;
    return false;
}

static bool regex_match(const char *pattern, const char *s, char *why, size_t cap)
{
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &err, &off, NULL);
    if (!re) {
        snprintf(why, cap, "bad pattern in the suite at %zu", (size_t)off);
        return false;
    }
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    int rc = md ? pcre2_match(re, (PCRE2_SPTR)s, strlen(s), 0, 0, md, NULL) : -1;
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return rc >= 0;
}

/* Argument value v against expected e (see eval_suite.h). */
static bool arg_equal(const json_t *e, const json_t *v, bool substring)
{
    if (json_is_number(e)) {
        double want = json_number_value(e), got;
        if (json_is_number(v)) got = json_number_value(v);
        else if (json_is_string(v)) {
            char *end;
            got = strtod(json_string_value(v), &end);
            if (end == json_string_value(v) || *end) return false;
        } else return false;
        return fabs(got - want) <= 1e-9 * (fabs(want) + 1);
    }
    if (json_is_string(e) && json_is_string(v)) {
        char *a = normalized(json_string_value(v), true);
        bool ok = a && (substring ? contains_ci(a, json_string_value(e), json_string_length(e))
                                  : strcasecmp(a, json_string_value(e)) == 0);
        free(a);
        return ok;
    }
    return json_equal((json_t *)e, (json_t *)v);
}

static bool check_tool(const eval_question *q, const json_t *calls, char *why, size_t cap)
{
    json_t *want = json_loads(q->expected, 0, NULL);
    if (!want) {
        snprintf(why, cap, "bad expectation in the suite");
        return false;
    }
    bool named = false, ok = false;
    size_t i;
    const json_t *c;
    json_array_foreach(calls, i, c) {
        const json_t *fn = json_object_get(c, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (!name || strcmp(name, q->tool) != 0) continue;
        named = true;
        const json_t *a = json_object_get(fn, "arguments");
        json_t *args = json_is_string(a) ? json_loads(json_string_value(a), 0, NULL) : json_incref((json_t *)a);
        bool all = json_is_object(args);
        const char *k;
        json_t *ev;
        json_object_foreach(want, k, ev) {
            bool sub = k[0] == '~';
            if (!all || !arg_equal(ev, json_object_get(args, sub ? k + 1 : k), sub)) {
                all = false;
                break;
            }
        }
        json_decref(args);
        if (all) {
            ok = true;
            break;
        }
    }
    json_decref(want);
    if (!ok) snprintf(why, cap, named ? "%s called with other arguments" : "no call of %s", q->tool);
    return ok;
}

bool eval_check(const eval_question *q, const char *content, const json_t *calls, char *why, size_t cap)
{
    why[0] = 0;
    if (q->rule == EVAL_TOOL) return check_tool(q, calls, why, cap);
    if (!content) content = "";
    char *a = normalized(content, q->rule == EVAL_EXACT || q->rule == EVAL_EXACT_CASE);
    if (!a) {
        snprintf(why, cap, "out of memory");
        return false;
    }
    bool ok = false;
    switch (q->rule) {
    case EVAL_NUMBER: {
        double got;
        ok = last_number(a, &got) && fabs(got - strtod(q->expected, NULL)) <= 1e-9 * (fabs(got) + 1);
        if (!ok) snprintf(why, cap, "last number is not %s", q->expected);
        break;
    }
    case EVAL_EXACT: ok = strcasecmp(a, q->expected) == 0; break;
    case EVAL_EXACT_CASE: ok = strcmp(a, q->expected) == 0; break;
    case EVAL_CONTAINS:
        for (const char *p = q->expected; !ok && *p;) {
            const char *bar = strchr(p, '|');
            size_t n = bar ? (size_t)(bar - p) : strlen(p);
            ok = n && contains_ci(a, p, n);
            p = bar ? bar + 1 : p + n;
        }
        break;
    case EVAL_REGEX: ok = regex_match(q->expected, a, why, cap); break;
    case EVAL_LINES: {
        int lines = 0;
        for (const char *p = a; *p;) {
            const char *nl = strchr(p, '\n');
            size_t n = nl ? (size_t)(nl - p) : strlen(p);
            bool blank = true;
            for (size_t i = 0; i < n; i++) blank &= isspace((unsigned char)p[i]) != 0;
            lines += !blank;
            p = nl ? nl + 1 : p + n;
        }
        ok = lines == atoi(q->expected);
        if (!ok) snprintf(why, cap, "%d non-empty lines, not %s", lines, q->expected);
        break;
    }
    case EVAL_WORDS_MAX: {
        int words = 0;
        for (const char *p = a; *p; p++)
            if (!isspace((unsigned char)*p) && (p == a || isspace((unsigned char)p[-1]))) words++;
        ok = words >= 1 && words <= atoi(q->expected);
        if (!ok) snprintf(why, cap, "%d words", words);
        break;
    }
    case EVAL_JSON_EQ: {
        const char *j = a;
        size_t n = strlen(a);
        if (strncmp(j, "```", 3) == 0) { /* a fenced block: drop the fence lines */
            const char *nl = strchr(j, '\n');
            j = nl ? nl + 1 : j + n;
            n = strlen(j);
            if (n >= 3 && strcmp(j + n - 3, "```") == 0) n -= 3;
        }
        json_t *got = json_loadb(j, n, 0, NULL), *want = json_loads(q->expected, 0, NULL);
        ok = got && want && json_equal(got, want);
        if (!ok) snprintf(why, cap, got ? "other JSON" : "not JSON");
        json_decref(got);
        json_decref(want);
        break;
    }
    case EVAL_TOOL: break;
    }
    if (!ok && !why[0]) snprintf(why, cap, "answer does not satisfy %s %s", eval_rule_name(q->rule), q->expected);
    free(a);
    return ok;
}

/*
 * eval_questions.c - the questions of `ds4-eval`, written for this
 * project (see eval_suite.h for the rules). Short answers on purpose: the
 * suite measures whether a quantization or a kernel change broke what a
 * model can do, not how well it writes essays, so every answer is checked
 * by a rule and a run takes minutes, not hours.
 */
#include "tools/eval_suite.h"

#define N EVAL_NUMBER
#define X EVAL_EXACT
#define XC EVAL_EXACT_CASE
#define C EVAL_CONTAINS
#define R EVAL_REGEX
#define L EVAL_LINES
#define W EVAL_WORDS_MAX
#define J EVAL_JSON_EQ
#define T EVAL_TOOL

#define NUM_ONLY " Answer with the number only."
#define OUT_ONLY " Reply with the exact output only."

const eval_question eval_questions[] = {
    /* ---- arithmetic ------------------------------------------------- */
    {"arith_add", "arithmetic", "What is 17 + 25?" NUM_ONLY, N, "42", 0},
    {"arith_div", "arithmetic", "What is 144 divided by 12?" NUM_ONLY, N, "12", 0},
    {"arith_mul", "arithmetic", "What is 23 times 19?" NUM_ONLY, N, "437", 0},
    {"arith_sub", "arithmetic", "What is 1000 minus 387?" NUM_ONLY, N, "613", 0},
    {"arith_pow", "arithmetic", "What is 2 to the power of 10?" NUM_ONLY, N, "1024", 0},
    {"arith_percent", "arithmetic", "What is 15% of 240?" NUM_ONLY, N, "36", 0},
    {"arith_series", "arithmetic", "What is the sum of the integers from 1 to 20?" NUM_ONLY, N, "210", 0},
    {"arith_factorial", "arithmetic", "What is 7 factorial?" NUM_ONLY, N, "5040", 0},
    {"arith_sqrt", "arithmetic", "What is the square root of 169?" NUM_ONLY, N, "13", 0},
    {"arith_fraction", "arithmetic", "What is 3/4 + 1/8, written as a decimal?" NUM_ONLY, N, "0.875", 0},
    {"arith_distance", "arithmetic",
     "A train travels at 60 km/h for 2.5 hours. How many kilometres does it cover?" NUM_ONLY, N, "150", 0},
    {"arith_parens", "arithmetic", "Compute (12 + 8) * 3 - 5." NUM_ONLY, N, "55", 0},
    {"arith_mod", "arithmetic", "What is the remainder when 100 is divided by 7?" NUM_ONLY, N, "2", 0},
    {"arith_decimal", "arithmetic", "What is 0.1 multiplied by 0.2?" NUM_ONLY, N, "0.02", 0},
    {"arith_minutes", "arithmetic", "How many minutes are there in 3.5 hours?" NUM_ONLY, N, "210", 0},
    {"arith_carry", "arithmetic", "What is 999 + 1?" NUM_ONLY, N, "1000", 0},

    /* ---- code output ------------------------------------------------ */
    {"code_len", "code", "What does this Python print?\nprint(len(\"hello world\"))" OUT_ONLY, N, "11", 0},
    {"code_range_sum", "code", "What does this Python print?\nprint(sum(range(5)))" OUT_ONLY, N, "10", 0},
    {"code_str_repeat", "code", "What does this Python print?\nprint(\"ab\" * 3)" OUT_ONLY, X, "ababab", 0},
    {"code_sort", "code", "What does this Python print?\nx = [3, 1, 2]\nx.sort()\nprint(x[0])" OUT_ONLY, N, "1", 0},
    {"code_divmod", "code", "What does this Python print?\nprint(10 // 3, 10 % 3)" OUT_ONLY, X, "3 1", 0},
    {"code_c_intdiv", "code", "What does this C program print?\n#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 7 / 2); return 0; }" OUT_ONLY, N, "3", 0},
    {"code_reverse", "code", "What does this Python print?\nprint(\"Hello\"[::-1])" OUT_ONLY, XC, "olleH", 0},
    {"code_pow_assoc", "code", "What does this Python print?\nprint(2 ** 3 ** 2)" OUT_ONLY, N, "512", 0},
    {"code_js_typeof", "code", "What does this JavaScript print?\nconsole.log(typeof null)" OUT_ONLY, X, "object", 0},
    {"code_bool_empty", "code", "What does this Python print?\nprint(bool(\"\"))" OUT_ONLY, XC, "False", 0},
    {"code_map", "code", "What does this Python print?\nprint(list(map(lambda v: v * v, [1, 2, 3])))" OUT_ONLY, X, "[1, 4, 9]", 0},
    {"code_c_hex", "code", "What does this C program print?\n#include <stdio.h>\nint main(void) { printf(\"%x\\n\", 255); return 0; }" OUT_ONLY, X, "ff", 0},
    {"code_set", "code", "What does this Python print?\nprint(len(set(\"mississippi\")))" OUT_ONLY, N, "4", 0},
    {"code_js_indexof", "code", "What does this JavaScript print?\nconsole.log([1, 2, 3].indexOf(4))" OUT_ONLY, N, "-1", 0},

    /* ---- facts ------------------------------------------------------ */
    {"fact_capital_france", "facts", "What is the capital of France?", C, "Paris", 0},
    {"fact_capital_japan", "facts", "What is the capital of Japan?", C, "Tokyo", 0},
    {"fact_capital_italy", "facts", "What is the capital of Italy?", C, "Rome|Roma", 0},
    {"fact_capital_germany", "facts", "What is the capital of Germany?", C, "Berlin", 0},
    {"fact_gold_symbol", "facts", "What is the chemical symbol for gold? Answer with the symbol only.", XC, "Au", 0},
    {"fact_red_planet", "facts", "Which planet is known as the Red Planet?", C, "Mars", 0},
    {"fact_romeo", "facts", "Who wrote Romeo and Juliet?", C, "Shakespeare", 0},
    {"fact_ocean", "facts", "What is the largest ocean on Earth?", C, "Pacific", 0},
    {"fact_continents", "facts", "How many continents are there on Earth (the usual count)?" NUM_ONLY, N, "7", 0},
    {"fact_boiling", "facts", "At sea level, at how many degrees Celsius does water boil?" NUM_ONLY, N, "100", 0},
    {"fact_relativity", "facts", "Who developed the theory of general relativity?", C, "Einstein", 0},
    {"fact_photosynthesis", "facts", "Which gas do plants take from the air for photosynthesis?", C, "carbon dioxide|CO2|CO₂", 0},
    {"fact_prime", "facts", "What is the smallest prime number?" NUM_ONLY, N, "2", 0},
    {"fact_hexagon", "facts", "How many sides does a hexagon have?" NUM_ONLY, N, "6", 0},
    {"fact_ww2", "facts", "In which year did the Second World War end?" NUM_ONLY, N, "1945", 0},
    {"fact_manzoni", "facts", "Who wrote the Italian novel I promessi sposi?", C, "Manzoni", 0},

    /* ---- format following ------------------------------------------- */
    {"fmt_yes", "format", "Reply with exactly the word YES in capital letters and nothing else.", XC, "YES", 0},
    {"fmt_lines", "format", "List three primary colours, one per line, with nothing else.", L, "3", 0},
    {"fmt_upper", "format", "Write the word banana in uppercase letters, and nothing else.", XC, "BANANA", 0},
    {"fmt_json", "format",
     "Output only a JSON object with the keys \"name\" and \"age\" for a person named Ada who is 36 years old.", J,
     "{\"name\": \"Ada\", \"age\": 36}", 0},
    {"fmt_short", "format", "Describe the sea in one sentence of at most 8 words.", W, "8", 0},
    {"fmt_range", "format", "Give one whole number between 1 and 10, and nothing else.", R, "^([1-9]|10)$", 0},
    {"fmt_hyphens", "format", "Spell the word cat with a hyphen between each letter, and nothing else.", X, "c-a-t", 0},
    {"fmt_lower", "format", "Write the word done in lowercase, and nothing else.", XC, "done", 0},
    {"fmt_prefix", "format", "Start your answer with \"Sure:\" and then name one fruit.", R, "^Sure:\\s*\\S+", 0},
    {"fmt_count", "format", "Count from 1 to 5, separated by commas, and nothing else.", R,
     "^1,\\s*2,\\s*3,\\s*4,\\s*5\\.?$", 0},

    /* ---- tool calls ------------------------------------------------- */
    {"tool_weather_oslo", "tools", "What's the weather in Oslo?", T, "{\"location\": \"Oslo\"}", "get_weather"},
    {"tool_time_tokyo", "tools", "What time is it in Tokyo?", T, "{\"city\": \"Tokyo\"}", "get_time"},
    {"tool_add", "tools", "Use the add tool to sum 1234 and 4321.", T, "{\"a\": 1234, \"b\": 4321}", "add"},
    {"tool_weather_f", "tools", "What is the weather like in Paris? Use fahrenheit.", T,
     "{\"location\": \"Paris\", \"unit\": \"fahrenheit\"}", "get_weather"},
    {"tool_email", "tools", "Send an email to bob@example.com that says hello.", T, "{\"to\": \"bob@example.com\"}",
     "send_email"},
    {"tool_currency", "tools", "Convert 100 US dollars to euros.", T,
     "{\"amount\": 100, \"from\": \"USD\", \"to\": \"EUR\"}", "convert_currency"},
    {"tool_search", "tools", "Search the web for the release date of DeepSeek V4.", T, "{\"~query\": \"DeepSeek\"}",
     "search_web"},
    {"tool_time_london", "tools", "Tell me the time in London.", T, "{\"city\": \"London\"}", "get_time"},
    {"tool_weather_cairo", "tools", "Weather in Cairo please", T, "{\"location\": \"Cairo\"}", "get_weather"},
    {"tool_add_small", "tools", "Please add 250 and 750.", T, "{\"a\": 250, \"b\": 750}", "add"},
};

const int eval_n_questions = (int)(sizeof eval_questions / sizeof eval_questions[0]);

const char eval_tools_json[] =
    "["
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Current weather in a city\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"location\":{\"type\":\"string\",\"description\":\"City name\"},"
    "\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\",\"fahrenheit\"]}},\"required\":[\"location\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"description\":\"Current local time in a city\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"add\",\"description\":\"Add two numbers\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\"},\"b\":{\"type\":\"number\"}},"
    "\"required\":[\"a\",\"b\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"send_email\",\"description\":\"Send an email\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"to\":{\"type\":\"string\"},\"subject\":{\"type\":\"string\"},"
    "\"body\":{\"type\":\"string\"}},\"required\":[\"to\",\"body\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"convert_currency\",\"description\":\"Convert an amount between "
    "currencies (ISO codes)\",\"parameters\":{\"type\":\"object\",\"properties\":{\"amount\":{\"type\":\"number\"},"
    "\"from\":{\"type\":\"string\"},\"to\":{\"type\":\"string\"}},\"required\":[\"amount\",\"from\",\"to\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"search_web\",\"description\":\"Search the web\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"query\":{\"type\":\"string\"}},\"required\":[\"query\"]}}}"
    "]";

#!/usr/bin/env bash
# tool_choice enforcement at the HTTP level: raw requests with curl against
# `ds4-server --test-engine`, whose scripted "model" answers a greeting in
# plain text ("Hello! You said: ..."), so every call seen here was made by
# the enforcement (docs/SERVER.md "tool_choice"). For each case the
# non-streaming body and the SSE stream of the same request are checked
# against each other and against the expected call; the exact completion
# token count proves the forced text plus the script's continuation is the
# canonical DSML block (the test engine spends one token per byte and one
# per ｜DSML｜ marker). A second server without exact replay then shows the
# forced turn re-rendered canonically still extends the live session.
# JSON is read with node; without curl or node the test is skipped.
set -u
cd "$(dirname "$0")/.."
. tests/server_lib.sh
srv_need_tools curl node
srv_start_test main
srv_start_test canon --disable-exact-dsml-tool-replay
# shellcheck disable=SC2154
base="http://127.0.0.1:$port_main"
# shellcheck disable=SC2154
canon="http://127.0.0.1:$port_canon"

# req NAME URL PATH BODY: the non-streaming body to NAME.json, the same
# request with "stream":true to NAME.sse
req() {
    curl -s -H 'content-type: application/json' -H 'anthropic-version: 2023-06-01' "$2$3" -d "$4" >"$tmp/$1.json"
    curl -s -N -H 'content-type: application/json' -H 'anthropic-version: 2023-06-01' "$2$3" \
        -d "${4%\}},\"stream\":true}" >"$tmp/$1.sse"
}
# check NAME DESCRIPTION JS: JS sees j (the body), ev (the SSE data
# objects), calls(j)/scalls(ev) helpers, and must evaluate to true
check() {
    if out=$(node - "$tmp/$1.json" "$tmp/$1.sse" "$3" 2>&1 <<'JS'
const fs = require('fs');
const [jf, sf, expr] = process.argv.slice(2);
const j = JSON.parse(fs.readFileSync(jf, 'utf8'));
const ev = fs.readFileSync(sf, 'utf8').split('\n').filter((l) => l.startsWith('data: ') && l !== 'data: [DONE]')
  .map((l) => JSON.parse(l.slice(6)));
// test-engine tokens of a generated text: one per byte, one per ｜DSML｜
const toks = (s) => Buffer.byteLength(s.replaceAll('｜DSML｜', '')) + s.split('｜DSML｜').length - 1;
const D = '｜DSML｜';
const block = (calls) => '\n\n<' + D + 'tool_calls>\n' + calls.map(([n, k, v]) => '<' + D + `invoke name="${n}">\n` +
  '<' + D + `parameter name="${k}" string="true">${v}</` + D + 'parameter>\n</' + D + 'invoke>').join('\n') +
  '\n</' + D + 'tool_calls>';
// OpenAI chat: calls of the body and of the stream (name, parsed arguments)
const calls = (b) => (b.choices[0].message.tool_calls ?? []).map((c) => [c.function.name, JSON.parse(c.function.arguments)]);
const scalls = (e) => {
  const acc = [];
  for (const c of e) for (const t of c.choices?.[0]?.delta?.tool_calls ?? []) {
    acc[t.index] ??= ['', ''];
    acc[t.index][0] += t.function?.name ?? '';
    acc[t.index][1] += t.function?.arguments ?? '';
  }
  return acc.map(([n, a]) => [n, JSON.parse(a)]);
};
const sfinish = (e) => e.map((c) => c.choices?.[0]?.finish_reason).filter(Boolean).at(-1);
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
const ok = eval(expr);
if (ok !== true) { console.log('body: ' + JSON.stringify(j).slice(0, 600)); process.exit(1); }
JS
    ); then
        echo "  ok - $2"; pass=$((pass + 1))
    else
        echo "  FAIL - $2"; printf '%s\n' "$out" | sed 's/^/    /'; fail=$((fail + 1))
    fi
}

W='{"type":"function","function":{"name":"get_weather","description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}}'
R='{"type":"function","function":{"name":"read_file","description":"Read","parameters":{"type":"object","properties":{"path":{"type":"string"}}}}}'
hi='"messages":[{"role":"user","content":"Hi there"}]'

# the same request without enforcement: plain text (what the script says)
req auto "$base" /v1/chat/completions "{\"model\":\"deepseek-chat\",$hi,\"tools\":[$W,$R]}"
check auto 'auto: the scripted model answers in text' \
    'j.choices[0].message.content === "Hello! You said: Hi there." && j.choices[0].finish_reason === "stop"'

req req_chat "$base" /v1/chat/completions "{\"model\":\"deepseek-chat\",$hi,\"tools\":[$W,$R],\"tool_choice\":\"required\"}"
check req_chat 'required, chat mode: a call instead of the text, stream = body, canonical block' \
    'same(calls(j), [["get_weather", {city: "Hi there"}]]) && same(scalls(ev), calls(j)) &&
     j.choices[0].finish_reason === "tool_calls" && sfinish(ev) === "tool_calls" &&
     j.usage.completion_tokens === toks(block([["get_weather", "city", "Hi there"]]))'

req named_think "$base" /v1/chat/completions "{\"model\":\"deepseek-reasoner\",$hi,\"tools\":[$W,$R],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"read_file\"}}}"
check named_think 'named, thinking: reasoning kept, then the named call right after </think>' \
    'j.choices[0].message.reasoning_content === "The user wrote 8 bytes; I will answer." &&
     same(calls(j), [["read_file", {path: "Hi there"}]]) && same(scalls(ev), calls(j)) &&
     sfinish(ev) === "tool_calls" &&
     j.usage.completion_tokens === toks("The user wrote 8 bytes; I will answer.") + 1 + toks(block([["read_file", "path", "Hi there"]]))'

req mask "$base" /v1/chat/completions "{\"model\":\"deepseek-chat\",\"messages\":[{\"role\":\"user\",\"content\":\"weather please\"}],\"tools\":[$R],\"tool_choice\":\"required\"}"
check mask 'required: the name is limited to declared tools (the script wanted get_weather)' \
    'same(calls(j), [["read_file", {path: "weather please"}]]) && same(scalls(ev), calls(j))'

two='"messages":[{"role":"user","content":"two calls"}]'
req two_req "$base" /v1/chat/completions "{\"model\":\"deepseek-chat\",$two,\"tools\":[$W,$R],\"tool_choice\":\"required\"}"
check two_req 'required: the model may make several calls' \
    'same(calls(j), [["get_weather", {city: "two calls"}], ["read_file", {path: "two calls"}]]) && same(scalls(ev), calls(j))'
req two_named "$base" /v1/chat/completions "{\"model\":\"deepseek-chat\",$two,\"tools\":[$W,$R],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}}"
check two_named 'named: the block is closed after the named call' \
    'same(calls(j), [["get_weather", {city: "two calls"}]]) && same(scalls(ev), calls(j)) &&
     j.choices[0].finish_reason === "tool_calls" &&
     j.usage.completion_tokens === toks(block([["get_weather", "city", "two calls"]]))'

req short "$base" /v1/chat/completions "{\"model\":\"deepseek-chat\",$hi,\"tools\":[$W,$R],\"tool_choice\":\"required\",\"max_tokens\":40}"
check short 'required with a budget that ends inside the call: finish length, no call' \
    'j.choices[0].finish_reason === "length" && calls(j).length === 0 && sfinish(ev) === "length"'

req tiny "$base" /v1/chat/completions "{\"model\":\"deepseek-chat\",$hi,\"tools\":[$W,$R],\"tool_choice\":\"required\",\"max_tokens\":5}"
check tiny 'required with a budget smaller than the forced opening: length, nothing over budget' \
    'j.choices[0].finish_reason === "length" && j.usage.completion_tokens === 0 && sfinish(ev) === "length"'

A='{"name":"get_weather","description":"Weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}'
req anth_any "$base" /v1/messages "{\"model\":\"deepseek-chat\",\"max_tokens\":300,$hi,\"tools\":[$A],\"tool_choice\":{\"type\":\"any\"}}"
check anth_any 'Anthropic any: a tool_use block, stop_reason tool_use, in the stream too' \
    'j.stop_reason === "tool_use" && same(j.content.map((b) => [b.type, b.name, b.input]), [["tool_use", "get_weather", {city: "Hi there"}]]) &&
     ev.some((e) => e.type === "content_block_start" && e.content_block.type === "tool_use" && e.content_block.name === "get_weather") &&
     ev.find((e) => e.type === "message_delta").delta.stop_reason === "tool_use"'

req anth_tool "$base" /v1/messages "{\"max_tokens\":300,$hi,\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":100},\"tools\":[$A],\"tool_choice\":{\"type\":\"tool\",\"name\":\"get_weather\"}}"
check anth_tool 'Anthropic tool, thinking: thinking block, then the tool_use' \
    'j.stop_reason === "tool_use" && same(j.content.map((b) => b.type), ["thinking", "tool_use"]) && j.content[1].input.city === "Hi there" &&
     ev.find((e) => e.type === "message_delta").delta.stop_reason === "tool_use"'

req resp_named "$base" /v1/responses "{\"model\":\"deepseek-chat\",\"input\":\"Hi there\",\"tools\":[{\"type\":\"function\",\"name\":\"read_file\",\"parameters\":{\"type\":\"object\",\"properties\":{\"path\":{\"type\":\"string\"}}}}],\"tool_choice\":{\"type\":\"function\",\"name\":\"read_file\"}}"
check resp_named 'Responses named function: a function_call item, in the stream too; tool_choice echoed' \
    'same(j.output.filter((o) => o.type === "function_call").map((o) => [o.name, JSON.parse(o.arguments)]), [["read_file", {path: "Hi there"}]]) &&
     same(j.tool_choice, {type: "function", name: "read_file"}) &&
     same(ev.find((e) => e.type === "response.completed").response.tool_choice, {type: "function", name: "read_file"}) &&
     ev.some((e) => e.type === "response.function_call_arguments.done" && JSON.parse(e.arguments).path === "Hi there")'

# Canonical replay: without exact replay the next turn renders the forced
# call from the client's JSON; it must still extend the live session.
curl -s -H 'content-type: application/json' "$canon/v1/chat/completions" \
    -d "{\"model\":\"deepseek-chat\",$hi,\"tools\":[$W,$R],\"tool_choice\":\"required\"}" >"$tmp/t1.json"
next=$(node -e '
const j = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
const m = j.choices[0].message;
console.log(JSON.stringify({ model: "deepseek-chat", tools: JSON.parse(process.argv[2]), messages: [
  { role: "user", content: "Hi there" }, { role: "assistant", content: m.content, tool_calls: m.tool_calls },
  { role: "tool", tool_call_id: m.tool_calls[0].id, content: "sunny" }] }));' "$tmp/t1.json" "[$W,$R]")
curl -s -H 'content-type: application/json' "$canon/v1/chat/completions" -d "$next" >"$tmp/t2.json"
cp "$tmp/t2.json" "$tmp/replay.json"; : >"$tmp/replay.sse"
t1_live=$(node -e 'const u = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).usage; console.log(u.prompt_tokens + u.completion_tokens)' "$tmp/t1.json")
check replay 'a forced call rendered back canonically extends the live session (no exact replay)' \
    "j.usage.prompt_tokens_details.cached_tokens === $t1_live && j.choices[0].message.content === 'The tool said: sunny' &&
     ['token-prefix', 'text-prefix'].includes(j.ds4.cache)"

echo "RESULT $pass $fail 0"
[ "$fail" -eq 0 ]

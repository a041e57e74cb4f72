// openai.test.mjs - the official `openai` npm client against ds4-server:
// chat completions (plain, streaming, tools), text completions, Responses
// (plain, streaming, tools), usage counts, prefix reuse, API keys.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import {
  startServer, singleTurnPromptTokens, chatReply, reasoningFor, bytes,
} from './helpers.mjs';

const KEY = 'sk-test-' + Math.random().toString(16).slice(2);
let srv;
let client;

before(async () => {
  srv = await startServer(['--api-key', KEY]);
  client = new OpenAI({ apiKey: KEY, baseURL: `${srv.base}/v1`, maxRetries: 0 });
});
after(async () => { await srv.stop(); });

const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Get the weather for a city',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string' }, days: { type: 'integer' } },
      required: ['city'],
    },
  },
};

test('models list and lookup', async () => {
  const list = await client.models.list();
  const ids = list.data.map((m) => m.id);
  assert.ok(ids.includes('deepseek-v4-flash'));
  assert.ok(ids.includes('deepseek-chat'));
  const one = await client.models.retrieve('deepseek-reasoner');
  assert.equal(one.id, 'deepseek-reasoner');
  await assert.rejects(client.models.retrieve('gpt-17'), (e) => e.status === 404);
});

test('chat completion, non-thinking alias: content and exact usage', async () => {
  const text = 'What is the capital of Italy?';
  const r = await client.chat.completions.create({
    model: 'deepseek-chat', messages: [{ role: 'user', content: text }],
  });
  const msg = r.choices[0].message;
  assert.equal(msg.content, chatReply(text));
  assert.equal(msg.reasoning_content, undefined);
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.usage.prompt_tokens, singleTurnPromptTokens(text));
  assert.equal(r.usage.completion_tokens, bytes(chatReply(text)));
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.match(r.id, /^chatcmpl-[0-9a-f]{32}$/);
});

test('chat completion, thinking (default): reasoning_content is separate', async () => {
  const text = 'Why is the sky blue?';
  const r = await client.chat.completions.create({
    model: 'deepseek-v4-flash', messages: [{ role: 'user', content: text }],
  });
  assert.equal(r.choices[0].message.reasoning_content, reasoningFor(text));
  assert.equal(r.choices[0].message.content, chatReply(text));
  assert.ok(r.usage.completion_tokens_details.reasoning_tokens > 0);
});

test('chat streaming: deltas add up, usage chunk, [DONE]', async () => {
  const text = 'Stream me «something» ünïcode';
  const stream = await client.chat.completions.create({
    model: 'deepseek-v4-flash', messages: [{ role: 'user', content: text }],
    stream: true, stream_options: { include_usage: true },
  });
  let content = '';
  let reasoning = '';
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const c of stream) {
    chunks++;
    if (c.usage) usage = c.usage;
    const ch = c.choices[0];
    if (!ch) continue;
    if (ch.delta.content) content += ch.delta.content;
    if (ch.delta.reasoning_content) reasoning += ch.delta.reasoning_content;
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  assert.ok(chunks > 10);
  assert.equal(reasoning, reasoningFor(text));
  assert.equal(content, chatReply(text));
  assert.equal(finish, 'stop');
  assert.equal(usage.prompt_tokens, singleTurnPromptTokens(text));
});

test('max_tokens stops with finish_reason length', async () => {
  const r = await client.chat.completions.create({
    model: 'deepseek-chat', max_tokens: 5, messages: [{ role: 'user', content: 'Hello there' }],
  });
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 5);
  assert.equal(r.choices[0].message.content, 'Hello');
});

test('stop sequences cut the answer', async () => {
  const r = await client.chat.completions.create({
    model: 'deepseek-chat', stop: ['said'], messages: [{ role: 'user', content: 'x' }],
  });
  assert.equal(r.choices[0].message.content, 'Hello! You ');
  assert.equal(r.choices[0].finish_reason, 'stop');
});

test('second turn prefills only its suffix (prefix reuse)', async () => {
  const q1 = 'Remember the number 42.';
  const r1 = await client.chat.completions.create({
    model: 'deepseek-chat', messages: [{ role: 'user', content: q1 }],
  });
  const a1 = r1.choices[0].message.content;
  const q2 = 'What number?';
  const r2 = await client.chat.completions.create({
    model: 'deepseek-chat',
    messages: [{ role: 'user', content: q1 }, { role: 'assistant', content: a1 }, { role: 'user', content: q2 }],
  });
  // live session = turn-1 prompt + its answer; the suffix is
  // <EOS><User>q2<Assistant></think>
  const live = r1.usage.prompt_tokens + r1.usage.completion_tokens;
  assert.equal(r2.usage.prompt_tokens_details.cached_tokens, live);
  assert.equal(r2.usage.prompt_tokens, live + 4 + bytes(q2));
  assert.equal(r2.ds4.prefilled_tokens, 4 + bytes(q2));
  assert.ok(['token-prefix', 'text-prefix'].includes(r2.ds4.cache));
});

test('tool call round trip (thinking + tools): call, result, exact replay', async () => {
  const messages = [
    { role: 'system', content: 'You are a helpful assistant.' },
    { role: 'user', content: 'What is the weather in Rome?' },
  ];
  const r1 = await client.chat.completions.create({ model: 'deepseek-v4-flash', messages, tools: [weatherTool] });
  const m1 = r1.choices[0].message;
  assert.equal(r1.choices[0].finish_reason, 'tool_calls');
  assert.equal(m1.tool_calls.length, 1);
  const call = m1.tool_calls[0];
  assert.match(call.id, /^call_[0-9a-f]{32}$/);
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Rome', days: 2 });
  messages.push({ role: 'assistant', content: m1.content ?? '', reasoning_content: m1.reasoning_content, tool_calls: m1.tool_calls });
  messages.push({ role: 'tool', tool_call_id: call.id, content: 'sunny, 24C' });
  const r2 = await client.chat.completions.create({ model: 'deepseek-v4-flash', messages, tools: [weatherTool] });
  assert.equal(r2.choices[0].message.content, 'The tool said: sunny, 24C');
  // the history re-rendered with the exact sampled DSML extends the live session
  assert.equal(r2.usage.prompt_tokens_details.cached_tokens, r1.usage.prompt_tokens + r1.usage.completion_tokens);
});

test('tool call streaming: arguments arrive as deltas', async () => {
  const stream = await client.chat.completions.create({
    model: 'deepseek-v4-flash', stream: true, tools: [weatherTool],
    messages: [{ role: 'user', content: 'weather in Rome please' }],
  });
  const calls = {};
  let argDeltas = 0;
  let finish = null;
  for await (const c of stream) {
    const ch = c.choices[0];
    if (!ch) continue;
    for (const tc of ch.delta.tool_calls ?? []) {
      calls[tc.index] ??= { id: '', name: '', args: '' };
      if (tc.id) calls[tc.index].id = tc.id;
      if (tc.function?.name) calls[tc.index].name = tc.function.name;
      if (tc.function?.arguments) { calls[tc.index].args += tc.function.arguments; argDeltas++; }
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  assert.equal(finish, 'tool_calls');
  assert.equal(calls[0].name, 'get_weather');
  assert.ok(argDeltas > 3, `arguments came in ${argDeltas} deltas`);
  assert.deepEqual(JSON.parse(calls[0].args), { city: 'Rome', days: 2 });
});

test('tool_choice none hides the tools', async () => {
  const r = await client.chat.completions.create({
    model: 'deepseek-chat', tools: [weatherTool], tool_choice: 'none',
    messages: [{ role: 'user', content: 'weather in Rome?' }],
  });
  assert.equal(r.choices[0].message.tool_calls, undefined);
  assert.equal(r.choices[0].message.content, chatReply('weather in Rome?'));
});

// tool_choice enforcement: the scripted model answers "Hi there" in plain
// text (chatReply), so every call below was forced by the server; the
// script then fills the first schema property with the user's text.
const readTool = {
  type: 'function',
  function: {
    name: 'read_file', description: 'Read a file',
    parameters: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] },
  },
};

test('tool_choice required and named: a text answer becomes the call, streamed or not', async () => {
  const text = 'Hi there';
  const cases = [
    ['required', 'get_weather', { city: text }],
    [{ type: 'function', function: { name: 'read_file' } }, 'read_file', { path: text }],
  ];
  for (const [tool_choice, name, args] of cases) {
    for (const model of ['deepseek-chat', 'deepseek-v4-flash']) {
      const req = { model, tools: [weatherTool, readTool], tool_choice, messages: [{ role: 'user', content: text }] };
      const r = await client.chat.completions.create(req);
      const what = `${JSON.stringify(tool_choice)} ${model}`;
      assert.equal(r.choices[0].finish_reason, 'tool_calls', what);
      const calls = r.choices[0].message.tool_calls;
      assert.deepEqual(calls.map((c) => [c.function.name, JSON.parse(c.function.arguments)]), [[name, args]], what);
      assert.equal(r.choices[0].message.reasoning_content, model === 'deepseek-chat' ? undefined : reasoningFor(text));
      // the SDK's stream helper assembles the same message
      const final = await client.chat.completions.stream({ ...req, stream_options: { include_usage: true } })
        .finalChatCompletion();
      assert.equal(final.choices[0].finish_reason, 'tool_calls', what);
      const sc = final.choices[0].message.tool_calls;
      assert.deepEqual(sc.map((c) => [c.function.name, JSON.parse(c.function.arguments)]), [[name, args]], what);
      assert.equal(final.usage.completion_tokens, r.usage.completion_tokens, what);
    }
  }
  // without enforcement the same request is the scripted text
  const plain = await client.chat.completions.create({
    model: 'deepseek-chat', tools: [weatherTool, readTool], messages: [{ role: 'user', content: text }],
  });
  assert.equal(plain.choices[0].message.content, chatReply(text));
});

test('tool_choice: a forced call, its result and the next turn reuse the session', async () => {
  const messages = [{ role: 'user', content: 'Hi there' }];
  const r1 = await client.chat.completions.create({
    model: 'deepseek-chat', tools: [weatherTool], tool_choice: { type: 'function', function: { name: 'get_weather' } }, messages,
  });
  const m1 = r1.choices[0].message;
  messages.push({ role: 'assistant', content: m1.content, tool_calls: m1.tool_calls });
  messages.push({ role: 'tool', tool_call_id: m1.tool_calls[0].id, content: 'windy' });
  const r2 = await client.chat.completions.create({ model: 'deepseek-chat', tools: [weatherTool], messages });
  assert.equal(r2.choices[0].message.content, 'The tool said: windy');
  assert.equal(r2.usage.prompt_tokens_details.cached_tokens, r1.usage.prompt_tokens + r1.usage.completion_tokens);
});

test('tool_choice required without tools is a 400 naming tool_choice', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: 'x', tool_choice: 'required', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e.status === 400 && e.param === 'tool_choice',
  );
});

test('thinking without tools: the second turn restores the snapshot taken before <think>', async () => {
  // turn 1 prompt: <BOS><User>q1<Assistant><think>; its reasoning is
  // dropped from turn 2, which reads <BOS><User>q1<Assistant></think>a1
  // <EOS><User>q2<Assistant><think>: only what follows <Assistant> is new.
  const q1 = 'Remember the colour blue.';
  const q2 = 'Which colour?';
  const r1 = await client.chat.completions.create({ model: 'deepseek-v4-flash', messages: [{ role: 'user', content: q1 }] });
  const m1 = r1.choices[0].message;
  assert.equal(m1.reasoning_content, reasoningFor(q1));
  const turn2 = [{ role: 'user', content: q1 },
    { role: 'assistant', content: m1.content, reasoning_content: m1.reasoning_content }, { role: 'user', content: q2 }];
  const r2 = await client.chat.completions.create({ model: 'deepseek-v4-flash', messages: turn2 });
  assert.equal(r2.ds4.cache, 'memory');
  assert.equal(r2.usage.prompt_tokens_details.cached_tokens, 3 + bytes(q1));
  // </think> a1 <EOS> <User> q2 <Assistant> <think>
  assert.equal(r2.ds4.prefilled_tokens, 1 + bytes(m1.content) + 3 + bytes(q2) + 1);
  assert.equal(r2.usage.prompt_tokens, 3 + bytes(q1) + r2.ds4.prefilled_tokens);
  assert.equal(r2.choices[0].message.content, chatReply(q2));
});

test('text completions', async () => {
  const r = await client.completions.create({ model: 'deepseek-chat', prompt: 'Once upon a time' });
  assert.equal(r.choices[0].text, chatReply('Once upon a time'));
  assert.equal(r.usage.prompt_tokens, singleTurnPromptTokens('Once upon a time'));
  const s = await client.completions.create({ model: 'deepseek-chat', prompt: 'abc', stream: true });
  let t = '';
  for await (const c of s) t += c.choices[0]?.text ?? '';
  assert.equal(t, chatReply('abc'));
});

test('responses: plain, streaming and function calls', async () => {
  const r = await client.responses.create({
    model: 'deepseek-v4-flash', instructions: 'Be brief.', input: 'Hi there',
  });
  assert.equal(r.status, 'completed');
  assert.equal(r.output_text, chatReply('Hi there'));
  assert.ok(r.output.some((o) => o.type === 'reasoning'));
  // </think> is one special token
  assert.equal(r.usage.output_tokens, bytes(reasoningFor('Hi there')) + 1 + bytes(chatReply('Hi there')));

  const stream = await client.responses.create({ model: 'deepseek-chat', input: 'Stream this', stream: true });
  let text = '';
  const types = new Set();
  let completed = null;
  let streamedItemId = null;
  for await (const ev of stream) {
    types.add(ev.type);
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.output_item.added') streamedItemId = ev.item.id;
    if (ev.type === 'response.completed') completed = ev.response;
  }
  assert.equal(text, chatReply('Stream this'));
  for (const t of ['response.created', 'response.output_item.added', 'response.content_part.added',
    'response.output_text.done', 'response.output_item.done', 'response.completed']) assert.ok(types.has(t), t);
  assert.equal(completed.usage.input_tokens, singleTurnPromptTokens('Stream this'));
  // the final object names the items the stream announced
  assert.equal(completed.output.at(-1).id, streamedItemId);

  const tools = [{ type: 'function', name: 'get_weather', parameters: weatherTool.function.parameters }];
  const fc = await client.responses.create({ model: 'deepseek-v4-flash', input: 'weather in Rome?', tools });
  const call = fc.output.find((o) => o.type === 'function_call');
  assert.equal(call.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.arguments), { city: 'Rome', days: 2 });
  const next = await client.responses.create({
    model: 'deepseek-v4-flash', tools,
    input: [{ role: 'user', content: 'weather in Rome?' }, ...fc.output,
      { type: 'function_call_output', call_id: call.call_id, output: 'rainy' }],
  });
  assert.equal(next.output_text, 'The tool said: rainy');
});

test('API key: missing or wrong key is 401 with an error body', async () => {
  const bad = new OpenAI({ apiKey: 'wrong', baseURL: `${srv.base}/v1`, maxRetries: 0 });
  await assert.rejects(
    bad.chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'hi' }] }),
    (e) => e.status === 401 && /API key/.test(e.message),
  );
  const res = await fetch(`${srv.base}/v1/models`);
  assert.equal(res.status, 401);
  assert.ok((await res.json()).error.message);
  // health stays open for load balancers
  assert.equal((await fetch(`${srv.base}/health`)).status, 200);
});

test('validation errors are 400 naming the field (through the SDK)', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'x' }], temperature: 7 }),
    (e) => e.status === 400 && e.param === 'temperature',
  );
});

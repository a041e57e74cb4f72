// demo.test.mjs - the shipped demo model (models/ds4-demo.gguf, trained on
// DSML tool use; models/README.md) behind ds4-server, driven by the official
// SDK clients: a declared tool is called with the right name and JSON
// arguments, the tool result is accepted and answered, greedy streaming
// deltas reassemble to the non-streaming answer, and tool_choice turns a
// question the model answers in text into a call.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, repoRoot } from './helpers.mjs';

const model = path.join(repoRoot, 'models', 'ds4-demo.gguf');
const skip = existsSync(model) ? false : 'models/ds4-demo.gguf missing';
let srv;
before(async () => {
  if (!skip) srv = await startServer(['-m', model, '--ctx', '2048', '-t', '2'], { testEngine: false });
});
after(async () => { if (srv) await srv.stop(); });

const openai = () => new OpenAI({ apiKey: 'x', baseURL: `${srv.base}/v1`, maxRetries: 0 });
const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather', description: 'Get the current weather for a city',
    parameters: {
      type: 'object',
      properties: {
        location: { type: 'string', description: 'The city name' },
        unit: { type: 'string', enum: ['celsius', 'fahrenheit'], description: 'Temperature unit' },
      },
      required: ['location'],
    },
  },
};
const ask = [{ role: 'system', content: 'You are a helpful assistant' },
  { role: 'user', content: "What's the weather in Oslo?" }];
const greedy = { model: 'deepseek-chat', temperature: 0, max_tokens: 120 };

test('OpenAI chat: a tool call, then the answer from the tool result', { skip }, async () => {
  const c = openai();
  const r = await c.chat.completions.create({ ...greedy, messages: ask, tools: [weatherTool] });
  const ch = r.choices[0];
  assert.equal(ch.finish_reason, 'tool_calls');
  assert.equal(ch.message.tool_calls.length, 1);
  const call = ch.message.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  const args = JSON.parse(call.function.arguments);
  assert.equal(args.location, 'Oslo');
  assert.ok(r.usage.prompt_tokens > 0 && r.usage.completion_tokens > 0);

  const r2 = await c.chat.completions.create({
    ...greedy, tools: [weatherTool],
    messages: [...ask, ch.message,
      { role: 'tool', tool_call_id: call.id, content: JSON.stringify({ temperature: 12, condition: 'rainy' }) }],
  });
  assert.equal(r2.choices[0].finish_reason, 'stop');
  const answer = r2.choices[0].message.content;
  assert.match(answer, /Oslo/);
  assert.match(answer, /rainy/);
});

test('OpenAI chat: streaming deltas reassemble to the non-streaming answer (greedy)', { skip }, async () => {
  const c = openai();
  const messages = [{ role: 'user', content: 'What is the capital of France?' }];
  const full = await c.chat.completions.create({ ...greedy, messages });
  const stream = await c.chat.completions.create({ ...greedy, messages, stream: true });
  let content = '', reasoning = '';
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta ?? {};
    content += d.content ?? '';
    reasoning += d.reasoning_content ?? '';
  }
  assert.equal(content, full.choices[0].message.content);
  assert.equal(reasoning, full.choices[0].message.reasoning_content ?? '');
  assert.match(content, /Paris/);

  // The same with a tool call: streamed argument deltas equal the final arguments.
  const t1 = await c.chat.completions.create({ ...greedy, messages: ask, tools: [weatherTool] });
  const ts = await c.chat.completions.create({ ...greedy, messages: ask, tools: [weatherTool], stream: true });
  let name = '', argText = '';
  for await (const chunk of ts) {
    for (const tc of chunk.choices[0]?.delta?.tool_calls ?? []) {
      name += tc.function?.name ?? '';
      argText += tc.function?.arguments ?? '';
    }
  }
  assert.equal(name, 'get_weather');
  assert.deepEqual(JSON.parse(argText), JSON.parse(t1.choices[0].message.tool_calls[0].function.arguments));
});

test('Anthropic messages: tool_use block, tool_result answered', { skip }, async () => {
  const c = new Anthropic({ apiKey: 'x', baseURL: srv.base, maxRetries: 0 });
  const tools = [{ name: 'get_weather', description: weatherTool.function.description,
    input_schema: weatherTool.function.parameters }];
  const base = { model: 'deepseek-chat', max_tokens: 120, temperature: 0, tools,
    system: 'You are a helpful assistant', thinking: { type: 'disabled' } };
  const m = await c.messages.create({ ...base, messages: [{ role: 'user', content: "What's the weather in Oslo?" }] });
  assert.equal(m.stop_reason, 'tool_use');
  const use = m.content.find((b) => b.type === 'tool_use');
  assert.ok(use, JSON.stringify(m.content));
  assert.equal(use.name, 'get_weather');
  assert.equal(use.input.location, 'Oslo');
  const m2 = await c.messages.create({
    ...base,
    messages: [{ role: 'user', content: "What's the weather in Oslo?" }, { role: 'assistant', content: m.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '{"temperature": 12, "condition": "rainy"}' }] }],
  });
  assert.equal(m2.stop_reason, 'end_turn');
  const text = m2.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  assert.match(text, /Oslo/);
});

test('tool_choice required and named on a real model: the text answer becomes a call', { skip }, async () => {
  const c = openai();
  const addTool = { type: 'function', function: { name: 'add', description: 'Add two numbers',
    parameters: { type: 'object', properties: { a: { type: 'number' }, b: { type: 'number' } }, required: ['a', 'b'] } } };
  const messages = [{ role: 'system', content: 'You are a helpful assistant' },
    { role: 'user', content: 'What is the capital of France?' }];
  const plain = await c.chat.completions.create({ ...greedy, messages, tools: [weatherTool, addTool] });
  assert.equal(plain.choices[0].finish_reason, 'stop');
  assert.equal(plain.choices[0].message.tool_calls, undefined);
  assert.match(plain.choices[0].message.content, /Paris/);
  for (const tool_choice of ['required', { type: 'function', function: { name: 'get_weather' } }]) {
    const req = { ...greedy, messages, tools: [weatherTool, addTool], tool_choice };
    const r = await c.chat.completions.create(req);
    const ch = r.choices[0];
    assert.equal(ch.finish_reason, 'tool_calls', JSON.stringify(ch.message));
    assert.ok(ch.message.tool_calls.length >= 1);
    for (const call of ch.message.tool_calls) {
      assert.ok(['get_weather', 'add'].includes(call.function.name), call.function.name);
      JSON.parse(call.function.arguments);
    }
    if (typeof tool_choice === 'object') {
      assert.equal(ch.message.tool_calls.length, 1);
      assert.equal(ch.message.tool_calls[0].function.name, 'get_weather');
    }
    const final = await c.chat.completions.stream(req).finalChatCompletion();
    assert.equal(final.choices[0].finish_reason, 'tool_calls');
    assert.deepEqual(final.choices[0].message.tool_calls.map((t) => [t.function.name, JSON.parse(t.function.arguments)]),
      ch.message.tool_calls.map((t) => [t.function.name, JSON.parse(t.function.arguments)]));
  }
});

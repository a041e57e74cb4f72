// anthropic.test.mjs - the official `@anthropic-ai/sdk` client against
// ds4-server's /v1/messages: plain, streaming (thinking, text, tool_use
// blocks), a tool round trip, usage counts and API-key rejection.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, singleTurnPromptTokens, chatReply, reasoningFor, bytes } from './helpers.mjs';

const KEY = 'sk-ant-test-' + Math.random().toString(16).slice(2);
let srv;
let client;

before(async () => {
  srv = await startServer(['--api-key', KEY]);
  client = new Anthropic({ apiKey: KEY, baseURL: srv.base, maxRetries: 0 });
});
after(async () => { await srv.stop(); });

const tools = [{
  name: 'get_weather',
  description: 'Get the weather for a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] },
}];

test('message without thinking: one text block, exact usage', async () => {
  const text = 'Tell me something.';
  const m = await client.messages.create({
    model: 'deepseek-v4-flash', max_tokens: 200, thinking: { type: 'disabled' },
    messages: [{ role: 'user', content: text }],
  });
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.equal(m.stop_reason, 'end_turn');
  assert.deepEqual(m.content.map((b) => b.type), ['text']);
  assert.equal(m.content[0].text, chatReply(text));
  assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, singleTurnPromptTokens(text));
  assert.equal(m.usage.output_tokens, bytes(chatReply(text)));
});

test('message with thinking: thinking block then text', async () => {
  const text = 'Think first.';
  const m = await client.messages.create({
    model: 'deepseek-v4-flash', max_tokens: 300, system: 'Be kind.',
    thinking: { type: 'enabled', budget_tokens: 1024 },
    messages: [{ role: 'user', content: text }],
  });
  assert.deepEqual(m.content.map((b) => b.type), ['thinking', 'text']);
  assert.equal(m.content[0].thinking, reasoningFor(text));
  assert.equal(m.content[1].text, chatReply(text));
});

test('max_tokens gives stop_reason max_tokens', async () => {
  const m = await client.messages.create({
    model: 'deepseek-chat', max_tokens: 3, messages: [{ role: 'user', content: 'hi' }],
  });
  assert.equal(m.stop_reason, 'max_tokens');
  assert.equal(m.usage.output_tokens, 3);
});

test('stop_sequences: stop_reason stop_sequence names the string that matched', async () => {
  const req = {
    model: 'deepseek-chat', max_tokens: 200, stop_sequences: ['never-there', 'said'],
    messages: [{ role: 'user', content: 'x' }],
  };
  const m = await client.messages.create(req);
  assert.equal(m.stop_reason, 'stop_sequence');
  assert.equal(m.stop_sequence, 'said');
  assert.equal(m.content[0].text, 'Hello! You ');
  const final = await client.messages.stream(req).finalMessage();
  assert.equal(final.stop_reason, 'stop_sequence');
  assert.equal(final.stop_sequence, 'said');
  assert.equal(final.content[0].text, 'Hello! You ');
  const plain = await client.messages.create({ ...req, stop_sequences: ['never-there'] });
  assert.equal(plain.stop_reason, 'end_turn');
  assert.equal(plain.stop_sequence, null);
});

test('streaming: events in order, the SDK assembles the final message', async () => {
  const text = 'Stream please';
  const stream = client.messages.stream({
    model: 'deepseek-v4-flash', max_tokens: 300, messages: [{ role: 'user', content: text }],
  });
  const seen = [];
  stream.on('streamEvent', (e) => seen.push(e.type));
  const final = await stream.finalMessage();
  assert.equal(seen[0], 'message_start');
  assert.equal(seen.at(-1), 'message_stop');
  assert.ok(seen.includes('content_block_delta'));
  assert.deepEqual(final.content.map((b) => b.type), ['thinking', 'text']);
  assert.equal(final.content[0].thinking, reasoningFor(text));
  assert.equal(final.content[1].text, chatReply(text));
  assert.equal(final.stop_reason, 'end_turn');
  assert.equal(final.usage.output_tokens, bytes(reasoningFor(text)) + 1 + bytes(chatReply(text)));
});

test('tool use round trip, streamed and replayed', async () => {
  const messages = [{ role: 'user', content: 'What is the weather in Rome?' }];
  const stream = client.messages.stream({ model: 'deepseek-v4-flash', max_tokens: 500, tools, messages });
  let jsonDeltas = 0;
  stream.on('streamEvent', (e) => { if (e.type === 'content_block_delta' && e.delta.type === 'input_json_delta') jsonDeltas++; });
  const m1 = await stream.finalMessage();
  assert.equal(m1.stop_reason, 'tool_use');
  const use = m1.content.find((b) => b.type === 'tool_use');
  assert.match(use.id, /^toolu_[0-9a-f]{32}$/);
  assert.equal(use.name, 'get_weather');
  assert.deepEqual(use.input, { city: 'Rome', days: 2 });
  assert.ok(jsonDeltas > 3);
  messages.push({ role: 'assistant', content: m1.content });
  messages.push({ role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'cloudy' }] });
  const m2 = await client.messages.create({ model: 'deepseek-v4-flash', max_tokens: 500, tools, messages });
  assert.equal(m2.content.at(-1).text, 'The tool said: cloudy');
  // prefix reuse through exact DSML replay: everything generated before is cached
  assert.equal(m2.usage.cache_read_input_tokens, m1.usage.input_tokens + m1.usage.cache_read_input_tokens + m1.usage.output_tokens);
});

test('tool_choice any and tool: the text answer becomes a tool_use block', async () => {
  const text = 'Hi there'; // the scripted answer is plain text
  const more = [...tools, { name: 'read_file', description: 'Read a file',
    input_schema: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] } }];
  const cases = [
    [{ type: 'any' }, 'get_weather', { city: text }],
    [{ type: 'tool', name: 'read_file' }, 'read_file', { path: text }],
  ];
  for (const [tool_choice, name, input] of cases) {
    for (const thinking of [{ type: 'disabled' }, { type: 'enabled', budget_tokens: 1024 }]) {
      const req = { model: 'deepseek-v4-flash', max_tokens: 500, tools: more, tool_choice, thinking,
        messages: [{ role: 'user', content: text }] };
      const what = `${JSON.stringify(tool_choice)} ${thinking.type}`;
      const m = await client.messages.create(req);
      assert.equal(m.stop_reason, 'tool_use', what);
      const uses = m.content.filter((b) => b.type === 'tool_use');
      assert.deepEqual(uses.map((b) => [b.name, b.input]), [[name, input]], what);
      assert.equal(m.content[0].type, thinking.type === 'enabled' ? 'thinking' : 'tool_use', what);
      const final = await client.messages.stream(req).finalMessage();
      assert.equal(final.stop_reason, 'tool_use', what);
      assert.deepEqual(final.content.filter((b) => b.type === 'tool_use').map((b) => [b.name, b.input]), [[name, input]], what);
      assert.equal(final.usage.output_tokens, m.usage.output_tokens, what);
    }
  }
});

test('API key: wrong key is 401 authentication_error', async () => {
  const bad = new Anthropic({ apiKey: 'nope', baseURL: srv.base, maxRetries: 0 });
  await assert.rejects(
    bad.messages.create({ model: 'x', max_tokens: 5, messages: [{ role: 'user', content: 'hi' }] }),
    (e) => e.status === 401 && e.error?.error?.type === 'authentication_error',
  );
});

test('invalid request: 400 invalid_request_error', async () => {
  await assert.rejects(
    client.messages.create({ model: 'x', max_tokens: 5, messages: [{ role: 'robot', content: 'hi' }] }),
    (e) => e.status === 400 && e.error?.error?.type === 'invalid_request_error',
  );
});

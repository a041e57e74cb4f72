// model.test.mjs - ds4-server on a real (small, synthetic-weights) DeepSeek
// V4 model with the real tokenizer, built by tests/test_server_sdk.sh with
// `ds4-quantize --synthetic` and passed in DS4_TEST_MODEL. The weights are
// random, so the text is noise; what is checked is the serving machinery on
// the real engine: token counts from the real tokenizer, greedy determinism,
// prefix reuse, the memory snapshot of thinking turns and the disk cache
// giving the same tokens as a cold run, a --warmup server answering as a
// server without it.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer } from './helpers.mjs';

const model = process.env.DS4_TEST_MODEL;
const skip = model ? false : 'DS4_TEST_MODEL not set (tests/test_server_sdk.sh builds it)';
const base = ['-m', model ?? '', '--ctx', '2048', '-t', '2'];
const startReal = (extra = []) => startServer([...base, ...extra], { testEngine: false });
const client = (s) => new OpenAI({ apiKey: 'x', baseURL: `${s.base}/v1`, maxRetries: 0 });
const greedy = { model: 'deepseek-chat', temperature: 0, max_tokens: 6 };

let srv;
before(async () => { if (!skip) srv = await startReal(); });
after(async () => { if (srv) await srv.stop(); });

test('real tokenizer counts: the §5.1 example prompt is 17 tokens', { skip }, async () => {
  const r = await client(srv).chat.completions.create({
    ...greedy,
    messages: [{ role: 'system', content: 'You are a helpful assistant.' },
      { role: 'user', content: 'What is the capital of Italy?' }],
  });
  assert.equal(r.usage.prompt_tokens, 17);
  assert.equal(r.usage.completion_tokens, 6);
  assert.equal(r.choices[0].finish_reason, 'length');
});

test('greedy decoding is deterministic, streaming equals non-streaming', { skip }, async () => {
  const messages = [{ role: 'user', content: 'Count to three.' }];
  const a = await client(srv).chat.completions.create({ ...greedy, messages });
  const b = await client(srv).chat.completions.create({ ...greedy, messages });
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  const s = await client(srv).chat.completions.create({ ...greedy, messages, stream: true });
  let t = '';
  for await (const c of s) t += c.choices[0]?.delta?.content ?? '';
  assert.equal(t, a.choices[0].message.content);
});

test('a --warmup server answers as one without it, token for token', { skip }, async () => {
  const messages = [{ role: 'user', content: 'Name a color.' }];
  const cold = await client(srv).chat.completions.create({ ...greedy, messages });
  const w = await startReal(['--warmup', '-np', '2']);
  try {
    const warm = await client(w).chat.completions.create({ ...greedy, messages });
    assert.equal(warm.choices[0].message.content, cold.choices[0].message.content);
    assert.deepEqual(warm.usage, cold.usage);
  } finally {
    await w.stop();
  }
});

test('prefix reuse and the disk cache give the same tokens as a cold run', { skip }, async (t) => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ds4-model-kv-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const disk = ['--kv-disk-dir', dir, '--kv-cache-min-tokens', '1'];
  const q1 = [{ role: 'user', content: 'Tell me about the sea.' }];
  const a = await startReal(disk);
  let r1, r2;
  try {
    r1 = await client(a).chat.completions.create({ ...greedy, messages: q1 });
    const turn2 = [...q1, { role: 'assistant', content: r1.choices[0].message.content }, { role: 'user', content: 'And the sky?' }];
    r2 = await client(a).chat.completions.create({ ...greedy, messages: turn2 });
    assert.ok(['token-prefix', 'text-prefix'].includes(r2.ds4.cache), r2.ds4.cache);
    assert.ok(r2.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens);
    assert.ok(r2.ds4.prefilled_tokens < r2.usage.prompt_tokens);
    // the same turn on another server's cold session
    const c2 = await client(srv).chat.completions.create({ ...greedy, messages: turn2 });
    assert.equal(c2.ds4.cache, 'cold');
    assert.equal(r2.choices[0].message.content, c2.choices[0].message.content);
  } finally { assert.equal(await a.stop(), 0); }
  // a restarted server answers turn 2 from the disk snapshot of turn 1
  const b = await startReal(disk);
  try {
    const turn2 = [...q1, { role: 'assistant', content: r1.choices[0].message.content }, { role: 'user', content: 'And the sky?' }];
    const d2 = await client(b).chat.completions.create({ ...greedy, messages: turn2 });
    assert.equal(d2.ds4.cache, 'disk');
    assert.ok(d2.usage.prompt_tokens_details.cached_tokens > 0);
    assert.equal(d2.choices[0].message.content, r2.choices[0].message.content);
  } finally { await b.stop(); }
});

test('thinking without tools: turn 2 prefills only its 13 new tokens (chat-format §5.2), same answer as cold', { skip }, async () => {
  // §5.2: turn 1 is <BOS><User>What is 17*3?<Assistant><think>; turn 2
  // drops its reasoning: <BOS><User>What is 17*3?<Assistant></think>51.<EOS>
  // <User>And 17*4?<Assistant><think>, 23 tokens, of which the first 10
  // (through <Assistant>) are the snapshot taken before turn 1's <think>.
  const think = { model: 'deepseek-reasoner', temperature: 0, max_tokens: 6 };
  const q1 = [{ role: 'user', content: 'What is 17*3?' }];
  const a = await startReal();
  try {
    const r1 = await client(a).chat.completions.create({ ...think, messages: q1 });
    assert.equal(r1.usage.prompt_tokens, 11);
    const turn2 = [...q1, { role: 'assistant', content: '51.', reasoning_content: r1.choices[0].message.reasoning_content },
      { role: 'user', content: 'And 17*4?' }];
    const r2 = await client(a).chat.completions.create({ ...think, messages: turn2 });
    assert.equal(r2.ds4.cache, 'memory');
    assert.equal(r2.usage.prompt_tokens, 23);
    assert.equal(r2.usage.prompt_tokens_details.cached_tokens, 10);
    assert.equal(r2.ds4.prefilled_tokens, 13);
    const c2 = await client(srv).chat.completions.create({ ...think, messages: turn2 });
    assert.equal(c2.ds4.cache, 'cold');
    assert.equal(c2.ds4.prefilled_tokens, 23);
    assert.equal(r2.choices[0].message.reasoning_content, c2.choices[0].message.reasoning_content);
    assert.equal(r2.choices[0].message.content, c2.choices[0].message.content);
    assert.equal(r2.usage.completion_tokens, c2.usage.completion_tokens);
  } finally { await a.stop(); }
});

// mtp.test.mjs - speculative decoding in ds4-server (--mtp, per slot) on the
// shipped demo model and its trained MTP block (models/ds4-demo-mtp.gguf),
// driven by the official OpenAI SDK. The reference is a second server on the
// same model without --mtp: greedy answers (text, reasoning, tool calls,
// finish reason, token counts) must be identical, streamed deltas must
// reassemble to them, stop strings that end inside the confirmed drafts
// must cut exactly where the plain server cuts, and with --parallel 2
// greedy slots next to a sampling one must answer as the plain server.
// Sampled requests speculate too (the speculative-sampling rule: the same
// distribution, not the same draws as the plain server); they must be
// reproducible from their seed and keep DSML structure greedy.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, repoRoot } from './helpers.mjs';

const model = path.join(repoRoot, 'models', 'ds4-demo.gguf');
const mtp = path.join(repoRoot, 'models', 'ds4-demo-mtp.gguf');
const skip = existsSync(model) && existsSync(mtp) ? false : 'models/ds4-demo.gguf or ds4-demo-mtp.gguf missing';
const base = ['-m', model, '--ctx', '1024', '-t', '2', '--parallel', '2'];
let plain, spec, dir;
before(async () => {
  if (skip) return;
  dir = mkdtempSync(path.join(os.tmpdir(), 'ds4-mtp-'));
  plain = await startServer(base, { testEngine: false });
  spec = await startServer([...base, '--mtp', mtp, '--mtp-draft', '2', '--trace', path.join(dir, 'trace')],
    { testEngine: false });
});
after(async () => {
  if (plain) await plain.stop();
  if (spec) await spec.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const client = (s) => new OpenAI({ apiKey: 'x', baseURL: `${s.base}/v1`, maxRetries: 0 });
const greedy = { model: 'deepseek-chat', temperature: 0, max_tokens: 80 };
const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather', description: 'Get the current weather for a city',
    parameters: { type: 'object', properties: { location: { type: 'string' } }, required: ['location'] },
  },
};
const asks = [
  { messages: [{ role: 'user', content: 'What is the capital of Japan?' }] },
  { messages: [{ role: 'user', content: 'What is the opposite of hot?' }] },
  { messages: [{ role: 'user', content: 'Count from 1 to 5.' }] },
  { messages: [{ role: 'system', content: 'You are a helpful assistant' },
    { role: 'user', content: "What's the weather in Oslo?" }], tools: [weatherTool] },
];
const answer = (r) => ({
  content: r.choices[0].message.content,
  reasoning: r.choices[0].message.reasoning_content ?? '',
  calls: (r.choices[0].message.tool_calls ?? []).map((c) => [c.function.name, c.function.arguments]),
  finish: r.choices[0].finish_reason,
  tokens: r.usage.completion_tokens,
});

test('greedy answers with --mtp equal the plain server, token counts included', { skip }, async () => {
  let drafted = 0, accepted = 0;
  for (const a of asks) {
    const p = await client(plain).chat.completions.create({ ...greedy, ...a });
    const s = await client(spec).chat.completions.create({ ...greedy, ...a });
    assert.deepEqual(answer(s), answer(p), JSON.stringify(a.messages));
    assert.equal(p.ds4.mtp_drafted, undefined);
    drafted += s.ds4.mtp_drafted ?? 0;
    accepted += s.ds4.mtp_accepted ?? 0;
  }
  assert.ok(drafted > 0 && accepted > 0 && accepted <= drafted, `${accepted} of ${drafted} drafts accepted`);
  // the tool call came out of speculated steps too
  const r = await client(spec).chat.completions.create({ ...greedy, ...asks[3] });
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.ok(r.ds4.mtp_accepted > 0, JSON.stringify(r.ds4));
});

test('streaming with --mtp: one delta per token, reassembling to the answer', { skip }, async () => {
  const a = asks[0];
  const full = await client(spec).chat.completions.create({ ...greedy, ...a });
  const stream = await client(spec).chat.completions.create({ ...greedy, ...a, stream: true,
    stream_options: { include_usage: true } });
  let content = '', reasoning = '', deltas = 0, usage = null;
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta ?? {};
    if (d.content || d.reasoning_content) deltas++;
    content += d.content ?? '';
    reasoning += d.reasoning_content ?? '';
    if (chunk.usage) usage = chunk.usage;
  }
  assert.equal(content, full.choices[0].message.content);
  assert.equal(reasoning, full.choices[0].message.reasoning_content ?? '');
  assert.equal(usage.completion_tokens, full.usage.completion_tokens);
  // accepted drafts are streamed token by token, not as one block per step
  // (a few tokens carry no visible text: the </think> marker, partial UTF-8)
  assert.ok(deltas >= full.usage.completion_tokens - 3, `${deltas} deltas for ${full.usage.completion_tokens} tokens`);
});

test('stop strings inside the drafts cut where the plain server cuts', { skip }, async () => {
  const a = asks[2];
  const ref = await client(plain).chat.completions.create({ ...greedy, ...a });
  const text = ref.choices[0].message.content;
  // stops at several places of the answer: some end inside confirmed drafts
  const words = [...new Set(text.split(/[^0-9A-Za-z]+/).filter((w) => w.length > 0))].slice(0, 5);
  assert.ok(words.length >= 3, text);
  for (const stop of words) {
    const p = await client(plain).chat.completions.create({ ...greedy, ...a, stop: [stop] });
    const s = await client(spec).chat.completions.create({ ...greedy, ...a, stop: [stop] });
    assert.deepEqual(answer(s), answer(p), `stop ${JSON.stringify(stop)}`);
  }
  // some of them did end inside a step's confirmed drafts, which the
  // server then trimmed (test_mtp checks a trimmed state byte for byte)
  const trace = readFileSync(path.join(dir, 'trace'), 'utf8');
  assert.match(trace, /mtp: the request ended at token \d+ of the \d+ fed/);
  // max_tokens inside a speculated step: never more tokens than asked
  for (const max_tokens of [3, 7, 12]) {
    const p = await client(plain).chat.completions.create({ ...greedy, ...a, max_tokens });
    const s = await client(spec).chat.completions.create({ ...greedy, ...a, max_tokens });
    assert.deepEqual(answer(s), answer(p), `max_tokens ${max_tokens}`);
    assert.equal(s.usage.completion_tokens, max_tokens);
  }
});

test('--parallel 2: greedy slots next to a sampling one; sampled answers follow their seed', { skip }, async () => {
  const sampled = { model: 'deepseek-chat', temperature: 0.8, seed: 7, max_tokens: 60, ...asks[1] };
  const g = { ...greedy, ...asks[0] };
  const run = (s) => Promise.all([client(s).chat.completions.create(g), client(s).chat.completions.create(sampled),
    client(s).chat.completions.create({ ...greedy, ...asks[2] })]);
  const [pg, , pc] = await run(plain);
  const [sg, ss, sc] = await run(spec);
  assert.deepEqual(answer(sg), answer(pg));
  assert.deepEqual(answer(sc), answer(pc));
  assert.ok(sg.ds4.mtp_drafted > 0 && ss.ds4.mtp_drafted > 0);
  // the same seed alone on the server: the same sampled answer
  const again = await client(spec).chat.completions.create(sampled);
  assert.deepEqual(answer(again), answer(ss));
});

test('sampled tool calls with --mtp: the DSML structure stays greedy, the call parses', { skip }, async () => {
  let calls = 0, drafted = 0;
  for (const seed of [1, 2, 3]) {
    const r = await client(spec).chat.completions.create({ model: 'deepseek-chat', temperature: 0.8, seed,
      max_tokens: 120, ...asks[3] });
    drafted += r.ds4.mtp_drafted ?? 0;
    for (const c of r.choices[0].message.tool_calls ?? []) {
      assert.equal(c.function.name, 'get_weather');
      assert.equal(typeof JSON.parse(c.function.arguments).location, 'string');
      calls++;
    }
  }
  assert.ok(calls >= 2, `${calls} calls in 3 sampled answers`);
  assert.ok(drafted > 0);
});

test('tool_choice required with --mtp: forced text and the name filter, as the plain server', { skip }, async () => {
  const req = { ...greedy, ...asks[0], tools: [weatherTool], tool_choice: 'required' };
  const p = await client(plain).chat.completions.create(req);
  const s = await client(spec).chat.completions.create(req);
  assert.deepEqual(answer(s), answer(p));
  assert.equal(s.choices[0].finish_reason, 'tool_calls');
});

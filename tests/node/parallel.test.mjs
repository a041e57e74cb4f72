// parallel.test.mjs - `--parallel N`: N slots, each its own engine session,
// served together (docs/SERVER.md "Parallel requests"). Checked from the
// outside: concurrent clients get exactly what each gets alone from a
// one-slot server (content, reasoning, tool calls, finish, usage); the
// decode steps advance several sessions at once (/health's decode
// counters); a client that leaves stops only its own generation; the queue
// bound still answers 503; a slot keeps its conversation for the next
// turn; a long prefill is chunked between the other streams' tokens. Then
// the same equality on the shipped demo model.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, chatReply, singleTurnPromptTokens, bytes, repoRoot } from './helpers.mjs';

const openai = (s) => new OpenAI({ apiKey: 'x', baseURL: `${s.base}/v1`, maxRetries: 0 });
const anthropic = (s) => new Anthropic({ apiKey: 'x', baseURL: s.base, maxRetries: 0 });
const health = async (s) => (await fetch(`${s.base}/health`)).json();
// the scripted reply to a "long story" request: 200 words
const story = Array.from({ length: 200 }, (_, i) => `word${i} `).join('');

const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather', description: 'Get the weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] },
  },
};
const readTool = {
  type: 'function',
  function: { name: 'read_file', description: 'Read a file', parameters: { type: 'object', properties: { path: { type: 'string' } } } },
};

// One streamed chat completion, reduced to what a client sees (no ids).
async function chatStream(s, req) {
  const st = await openai(s).chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  const out = { content: '', reasoning: '', calls: [], finish: null, usage: null };
  for await (const c of st) {
    const d = c.choices[0]?.delta ?? {};
    out.content += d.content ?? '';
    out.reasoning += d.reasoning_content ?? '';
    for (const t of d.tool_calls ?? []) {
      out.calls[t.index] ??= ['', ''];
      out.calls[t.index][0] += t.function?.name ?? '';
      out.calls[t.index][1] += t.function?.arguments ?? '';
    }
    out.finish = c.choices[0]?.finish_reason ?? out.finish;
    if (c.usage) out.usage = { prompt: c.usage.prompt_tokens, completion: c.usage.completion_tokens };
  }
  out.calls = out.calls.map(([n, a]) => [n, JSON.parse(a)]);
  return out;
}

async function chatPlain(s, req) {
  const r = await openai(s).chat.completions.create(req);
  const m = r.choices[0].message;
  return {
    content: m.content ?? '', reasoning: m.reasoning_content ?? '',
    calls: (m.tool_calls ?? []).map((t) => [t.function.name, JSON.parse(t.function.arguments)]),
    finish: r.choices[0].finish_reason, usage: { prompt: r.usage.prompt_tokens, completion: r.usage.completion_tokens },
  };
}

async function messagesStream(s, req) {
  const m = await anthropic(s).messages.stream(req).finalMessage();
  return {
    blocks: m.content.map((b) => (b.type === 'tool_use' ? { type: b.type, name: b.name, input: b.input } : b)),
    stop: m.stop_reason, usage: [m.usage.input_tokens, m.usage.output_tokens],
  };
}

// A mixed load: plain, thinking, long, max_tokens, stop sequences, a tool
// call, tool_choice required and named, Anthropic streaming, non-streaming.
const mix = [
  (s) => chatStream(s, { model: 'deepseek-chat', messages: [{ role: 'user', content: 'client one: a long story' }] }),
  (s) => chatStream(s, { model: 'deepseek-reasoner', messages: [{ role: 'user', content: 'client two thinks' }] }),
  (s) => chatStream(s, { model: 'deepseek-chat', max_tokens: 40, messages: [{ role: 'user', content: 'three: a long story' }] }),
  (s) => chatStream(s, { model: 'deepseek-chat', stop: ['word17 '], messages: [{ role: 'user', content: 'four: a long story' }] }),
  (s) => chatStream(s, { model: 'deepseek-chat', tools: [weatherTool, readTool], messages: [{ role: 'user', content: 'the weather in Rome?' }] }),
  (s) => chatStream(s, { model: 'deepseek-chat', tools: [weatherTool, readTool], tool_choice: 'required', messages: [{ role: 'user', content: 'say hi' }] }),
  (s) => chatStream(s, { model: 'deepseek-reasoner', tools: [weatherTool, readTool],
    tool_choice: { type: 'function', function: { name: 'read_file' } }, messages: [{ role: 'user', content: 'open a.txt' }] }),
  (s) => messagesStream(s, { model: 'deepseek-chat', max_tokens: 300, stop_sequences: ['word40'],
    messages: [{ role: 'user', content: 'eight: a long story' }] }),
  (s) => chatPlain(s, { model: 'deepseek-chat', messages: [{ role: 'user', content: 'nine: a long story' }] }),
];

test('--parallel 4: concurrent clients get exactly what each gets alone on one slot', async () => {
  const one = await startServer(['--test-engine-delay-us', '300']);
  const four = await startServer(['--parallel', '4', '--test-engine-delay-us', '300']);
  try {
    const alone = [];
    for (const run of mix) alone.push(await run(one)); // one after another, one slot
    const together = await Promise.all(mix.map((run) => run(four)));
    assert.deepEqual(together, alone);
    // what the script says, so that "equal" is not "equally wrong"
    assert.equal(alone[0].content, story);
    assert.equal(alone[2].content, story.slice(0, 40));
    assert.deepEqual(alone[2].usage, { prompt: singleTurnPromptTokens('three: a long story'), completion: 40 });
    assert.equal(alone[3].finish, 'stop');
    assert.equal(alone[3].content, story.slice(0, story.indexOf('word17 ')));
    assert.deepEqual(alone[4].calls, [['get_weather', { city: 'Rome', days: 2 }]]);
    assert.deepEqual(alone[5].calls, [['get_weather', { city: 'say hi' }]]);
    assert.deepEqual(alone[6].calls, [['read_file', { path: 'open a.txt' }]]);
    assert.ok(alone[6].reasoning.length > 0);
    assert.equal(alone[7].stop, 'stop_sequence');
    assert.equal(alone[7].blocks.map((b) => b.text).join(''), story.slice(0, story.indexOf('word40')));
    const h1 = await health(one);
    const h4 = await health(four);
    assert.equal(h1.slots, 1);
    assert.equal(h1.decode.max_batch, 1);
    assert.equal(h1.decode.batched_steps, 0);
    assert.equal(h4.slots, 4);
    assert.equal(h4.busy, 0);
    // the same tokens were decoded, in fewer steps
    assert.equal(h4.decode.tokens, h1.decode.tokens);
    assert.ok(h4.decode.batched_steps > 0, JSON.stringify(h4));
    assert.ok(h4.decode.steps < h1.decode.steps, JSON.stringify([h1, h4]));
  } finally {
    assert.equal(await one.stop(), 0);
    assert.equal(await four.stop(), 0);
  }
});

test('--parallel 4: four long streams advance together, one batched step per token', async () => {
  const srv = await startServer(['--parallel', '4', '--test-engine-delay-us', '1000']);
  try {
    const texts = ['alpha: a long story', 'beta: a long story', 'gamma: a long story', 'delta: a long story'];
    const rs = await Promise.all(texts.map((t) => chatStream(srv, { model: 'deepseek-chat', messages: [{ role: 'user', content: t }] })));
    for (const [i, r] of rs.entries()) {
      assert.equal(r.content, story);
      assert.deepEqual(r.usage, { prompt: singleTurnPromptTokens(texts[i]), completion: bytes(story) });
    }
    const h = await health(srv);
    // each stream is ~1400 one-millisecond steps; all four overlap
    assert.equal(h.decode.max_batch, 4, JSON.stringify(h));
    assert.equal(h.decode.tokens, 4 * bytes(story));
    assert.ok(h.decode.steps < 2 * bytes(story), JSON.stringify(h));
  } finally { assert.equal(await srv.stop(), 0); }
});

// Reads an SSE chat stream until `until(content)` holds; returns the reader.
async function readUntil(res, until) {
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  let content = '';
  while (!until(content)) {
    const { value, done } = await reader.read();
    assert.ok(!done, 'the stream ended early');
    buf += dec.decode(value, { stream: true });
    const lines = buf.split('\n');
    buf = lines.pop();
    for (const l of lines) {
      if (!l.startsWith('data: {')) continue;
      content += JSON.parse(l.slice(6)).choices[0]?.delta?.content ?? '';
    }
  }
  return { reader, content };
}

const post = (s, body, signal) => fetch(`${s.base}/v1/chat/completions`, {
  method: 'POST', signal, headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
});

test('--parallel 3: a client that disconnects stops only its own generation', async () => {
  const tracePath = path.join(os.tmpdir(), `ds4-par-trace-${process.pid}.txt`);
  const srv = await startServer(['--parallel', '3', '--test-engine-delay-us', '2000', '--trace', tracePath]);
  try {
    const ac = new AbortController();
    const leaving = await post(srv, { model: 'deepseek-chat', stream: true, messages: [{ role: 'user', content: 'leaver: a long story' }] }, ac.signal);
    const stay = ['stayer one: a long story', 'stayer two: a long story']
      .map((t) => chatStream(srv, { model: 'deepseek-chat', messages: [{ role: 'user', content: t }] }));
    await readUntil(leaving, (c) => c.includes('word2 '));
    ac.abort();
    for (const r of await Promise.all(stay)) {
      assert.equal(r.content, story);
      assert.equal(r.finish, 'stop');
    }
    const h = await health(srv);
    assert.equal(h.busy, 0);
    assert.ok(h.decode.max_batch >= 2, JSON.stringify(h));
    // and the freed slot serves again
    const again = await chatPlain(srv, { model: 'deepseek-chat', messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(again.content, chatReply('hi'));
  } finally { await srv.stop(); }
  const trace = readFileSync(tracePath, 'utf8');
  rmSync(tracePath, { force: true });
  const done = [...trace.matchAll(/slot (\d): done: (\d+) tokens[^\n]*/g)].map((m) => m[0]);
  const gone = done.filter((l) => l.includes('client gone'));
  assert.equal(gone.length, 1, done.join('\n'));
  assert.ok(Number(gone[0].match(/done: (\d+)/)[1]) < bytes(story), gone[0]);
  assert.equal(done.filter((l) => l.includes(`done: ${bytes(story)} tokens, finish 0,`)).length, 2, done.join('\n'));
  assert.match(trace, /decode: 3 sessions per step \(slots 0,1,2\)/);
});

test('--parallel 2 --max-queue 1: slots busy, one request waits, the next gets 503', async () => {
  const srv = await startServer(['--parallel', '2', '--max-queue', '1', '--test-engine-delay-us', '2000']);
  try {
    const ac = new AbortController();
    // one after the other: two requests sent at once could both be waiting
    // (the bound is 1) before the worker takes the first
    for (const t of ['h1: a long story', 'h2: a long story']) {
      const res = await post(srv, { model: 'deepseek-chat', stream: true, messages: [{ role: 'user', content: t }] }, ac.signal);
      assert.equal(res.status, 200);
      await readUntil(res, (c) => c.length > 0);
    }
    assert.equal((await health(srv)).busy, 2);
    const waiting = chatPlain(srv, { model: 'deepseek-chat', messages: [{ role: 'user', content: 'patient' }] });
    while ((await health(srv)).queue < 1) await new Promise((r) => setTimeout(r, 20));
    const r = await post(srv, { model: 'deepseek-chat', messages: [{ role: 'user', content: 'one too many' }] });
    assert.equal(r.status, 503);
    assert.match((await r.json()).error.message, /busy/);
    ac.abort(); // the holders leave: the waiting request gets a slot
    assert.equal((await waiting).content, chatReply('patient'));
  } finally { await srv.stop(); }
});

test('--parallel 2: each conversation keeps its slot, the next turn reuses it', async () => {
  const srv = await startServer(['--parallel', '2']);
  try {
    const c = openai(srv);
    const turn = async (msgs) => c.chat.completions.create({ model: 'deepseek-chat', messages: msgs });
    const a1m = [{ role: 'user', content: 'conversation A' }];
    const b1m = [{ role: 'user', content: 'conversation B' }];
    const a1 = await turn(a1m);
    const b1 = await turn(b1m); // takes the other (never used) slot
    assert.equal(b1.ds4.cache, 'cold');
    const a2m = [...a1m, { role: 'assistant', content: a1.choices[0].message.content }, { role: 'user', content: 'more A' }];
    const b2m = [...b1m, { role: 'assistant', content: b1.choices[0].message.content }, { role: 'user', content: 'more B' }];
    for (const [prev, m] of [[a1, a2m], [b1, b2m]]) {
      const r = await turn(m);
      assert.ok(['token-prefix', 'text-prefix'].includes(r.ds4.cache), r.ds4.cache);
      // the whole previous turn (prompt and answer) was live in the slot
      assert.equal(r.usage.prompt_tokens_details.cached_tokens, prev.usage.prompt_tokens + prev.usage.completion_tokens);
    }
  } finally { await srv.stop(); }
  // one slot: the conversations evict each other
  const one = await startServer([]);
  try {
    const c = openai(one);
    const a1 = await c.chat.completions.create({ model: 'deepseek-chat', messages: [{ role: 'user', content: 'conversation A' }] });
    await c.chat.completions.create({ model: 'deepseek-chat', messages: [{ role: 'user', content: 'conversation B' }] });
    const a2 = await c.chat.completions.create({ model: 'deepseek-chat', messages: [{ role: 'user', content: 'conversation A' },
      { role: 'assistant', content: a1.choices[0].message.content }, { role: 'user', content: 'more A' }] });
    assert.equal(a2.ds4.cache, 'cold');
  } finally { await one.stop(); }
});

test('--parallel 2: each slot keeps its own thinking snapshot; every slot is saved to disk at shutdown', async (t) => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ds4-par-kv-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const args = ['--parallel', '2', '--kv-disk-dir', dir, '--kv-cache-min-tokens', '1'];
  const think = { model: 'deepseek-reasoner' };
  const qs = [['Remember the colour blue.', 'Which colour?'], ['Remember the number nine.', 'Which number?']];
  const turn2 = (q, m) => [{ role: 'user', content: q[0] },
    { role: 'assistant', content: m.content, reasoning_content: m.reasoning_content }, { role: 'user', content: q[1] }];
  const a = await startServer(args);
  let first;
  try {
    const c = openai(a);
    // two thinking conversations at once, then both second turns at once
    first = await Promise.all(qs.map((q) => c.chat.completions.create({ ...think, messages: [{ role: 'user', content: q[0] }] })));
    const second = await Promise.all(qs.map((q, i) => c.chat.completions.create({ ...think, messages: turn2(q, first[i].choices[0].message) })));
    for (const [i, r] of second.entries()) {
      // <BOS><User>q1<Assistant> came from the slot's own snapshot
      assert.equal(r.ds4.cache, 'memory');
      assert.equal(r.usage.prompt_tokens_details.cached_tokens, 3 + bytes(qs[i][0]));
      assert.equal(r.choices[0].message.content, chatReply(qs[i][1]));
    }
  } finally { assert.equal(await a.stop(), 0); }
  assert.equal((a.stderr().match(/saved [0-9a-f]{40} \(shutdown/g) ?? []).length, 2, a.stderr());
  // a restarted server finds both conversations on disk
  const b = await startServer(args);
  try {
    const c = openai(b);
    const again = await Promise.all(qs.map((q, i) => c.chat.completions.create({ ...think, messages: turn2(q, first[i].choices[0].message) })));
    for (const [i, r] of again.entries()) {
      assert.equal(r.ds4.cache, 'disk');
      assert.ok(r.usage.prompt_tokens_details.cached_tokens >= 3 + bytes(qs[i][0]));
      assert.equal(r.choices[0].message.content, chatReply(qs[i][1]));
    }
  } finally { await b.stop(); }
});

test('--parallel 2: a long prefill is chunked between the other stream\'s tokens', async () => {
  const srv = await startServer(['--parallel', '2', '--test-engine-delay-us', '1000']);
  try {
    const first = await post(srv, { model: 'deepseek-chat', stream: true, messages: [{ role: 'user', content: 'first: a long story' }] });
    const r1 = await readUntil(first, (c) => c.includes('word1 '));
    // count the first stream's tokens from the moment a 3000-token prompt
    // (24 chunks of 128 tokens, each 128 ms here) is sent until its
    // answer's first content
    let sent = false, secondStarted = false, during = 0;
    const pump = (async () => {
      const dec = new TextDecoder();
      let buf = '';
      for (;;) {
        const { value, done } = await r1.reader.read();
        if (done) return;
        buf += dec.decode(value, { stream: true });
        const lines = buf.split('\n');
        buf = lines.pop();
        if (sent && !secondStarted) during += lines.filter((l) => l.includes('"content":"')).length;
      }
    })().catch(() => {});
    sent = true;
    const res2 = await post(srv, { model: 'deepseek-chat', stream: true, max_tokens: 3, messages: [{ role: 'user', content: 'p'.repeat(3000) }] });
    await readUntil(res2, (c) => c.length > 0);
    secondStarted = true;
    // a prefill run whole would let no token through; chunked, about one
    // token per chunk gets through
    assert.ok(during >= 10, `${during} tokens of the first stream during the 3000-token prefill`);
    await r1.reader.cancel();
    await pump;
  } finally { await srv.stop(); }
});

// ---- the real demo model ------------------------------------------------------------

const demo = path.join(repoRoot, 'models', 'ds4-demo.gguf');
const skipDemo = existsSync(demo) ? false : 'models/ds4-demo.gguf missing';

test('demo model, --parallel 4: four concurrent greedy streams equal each alone, decoded in batched steps', { skip: skipDemo }, async () => {
  const args = ['-m', demo, '--ctx', '2048', '-t', '2'];
  const questions = ['What is the capital of France?', 'Tell me about the sea.', 'What is 2+2?', "What's the weather in Oslo?"];
  const reqs = questions.map((q, i) => ({
    model: i === 1 ? 'deepseek-reasoner' : 'deepseek-chat', temperature: 0, max_tokens: i === 3 ? 120 : 48,
    messages: [{ role: 'system', content: 'You are a helpful assistant' }, { role: 'user', content: q }],
    ...(i === 3 ? { tools: [weatherTool] } : {}),
  }));
  const one = await startServer(args, { testEngine: false });
  const alone = [];
  try {
    for (const r of reqs) alone.push(await chatStream(one, r));
  } finally { await one.stop(); }
  const four = await startServer([...args, '--parallel', '4'], { testEngine: false });
  try {
    const together = await Promise.all(reqs.map((r) => chatStream(four, r)));
    assert.deepEqual(together, alone);
    assert.match(alone[0].content, /Paris/);
    assert.deepEqual(alone[3].calls.map((c) => c[0]), ['get_weather']);
    const h = await health(four);
    assert.ok(h.decode.batched_steps > 0 && h.decode.max_batch >= 2, JSON.stringify(h));
    assert.equal(h.decode.tokens, alone.reduce((n, r) => n + r.usage.completion, 0));
  } finally { assert.equal(await four.stop(), 0); }
});

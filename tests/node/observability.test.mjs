// observability.test.mjs - what the server says about what it does: the
// request log line (endpoint, client model, prompt / reused / prefilled,
// generated, finish, time, rates), an error line for every 4xx/5xx, the
// prefill progress of a long prompt, the startup report, --log-format
// json, GET /metrics (Prometheus text), POST /v1/messages/count_tokens and
// context_length in /v1/models. On the scripted test engine, whose token
// counts follow from the text (helpers.mjs), so every number is checked
// against a value computed here, not read back from the server.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { startServer, postJson, singleTurnPromptTokens, chatReply, bytes } from './helpers.mjs';

const wait = (ms) => new Promise((r) => setTimeout(r, ms));
// the log lines matching re, once there are at least `want` (the line of a
// request is written when it ends, which may be just after the client saw it)
async function logged(srv, re, want = 1, ms = 5000) {
  let l = [];
  for (let t = 0; t < ms; t += 50) {
    l = srv.stderr().split('\n').filter((x) => re.test(x));
    if (l.length >= want) return l;
    await wait(50);
  }
  return l;
}

// Prometheus text format 0.0.4: `name{labels} value` samples, # HELP/# TYPE
function parseMetrics(text) {
  const m = new Map();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const mm = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$/);
    assert.ok(mm, `not a Prometheus sample line: ${line}`);
    m.set(mm[1] + (mm[2] ?? ''), Number(mm[3]));
  }
  return m;
}

test('text log: a line per request with its numbers, a line per error, the startup report', async () => {
  const srv = await startServer(['--ctx', '4096']);
  try {
    const text = 'Hi log';
    const c = new OpenAI({ apiKey: 'x', baseURL: `${srv.base}/v1`, maxRetries: 0 });
    const r = await c.chat.completions.create({ model: 'my-client-model', messages: [{ role: 'user', content: text }],
      max_tokens: 100, reasoning_effort: 'none' });
    assert.equal(r.choices[0].message.content, chatReply(text));
    const gen = bytes(chatReply(text));
    const [line] = await logged(srv, /POST \/v1\/chat\/completions model=my-client-model/);
    assert.ok(line, srv.stderr());
    const p = singleTurnPromptTokens(text);
    assert.match(line, new RegExp(`status=200 prompt=${p} reused=0 prefilled=${p} cache=cold generated=${gen} \\(reasoning 0\\) finish=stop time=`));
    assert.match(line, /decode \d+\.\d+s at \d+(\.\d)? tok\/s\)/);
    // a second turn on the same session: the first prompt's tokens are reused
    await c.chat.completions.create({ model: 'my-client-model', max_tokens: 100, reasoning_effort: 'none',
      messages: [{ role: 'user', content: text }, { role: 'assistant', content: chatReply(text) }, { role: 'user', content: 'again' }] });
    const lines = await logged(srv, /POST \/v1\/chat\/completions model=my-client-model/, 2);
    assert.equal(lines.length, 2);
    const reused = Number(lines[1].match(/reused=(\d+)/)[1]);
    assert.ok(reused >= p + gen, lines[1]);
    assert.match(lines[1], /cache=(token|text)-prefix/);
    // errors: each with its status and reason
    await postJson(srv.base, '/v1/chat/completions', { messages: [], model: 'm' });
    await fetch(`${srv.base}/v1/nothing`);
    assert.equal((await logged(srv, /POST \/v1\/chat\/completions status=400 error: 'messages' must not be empty/)).length, 1);
    assert.equal((await logged(srv, /GET \/v1\/nothing status=404 error: no such endpoint/)).length, 1);
    // startup report
    assert.match(srv.stderr(), /startup: ds4-server \d+\.\d+\.\d+ \(commit \S+, backends: cpu/);
    assert.match(srv.stderr(), /startup: model deepseek-v4-flash \(test engine\), ctx 4096, 1 slot/);
  } finally { await srv.stop(); }
});

test('prefill progress of a long prompt; --log-format json lines', async () => {
  const srv = await startServer(['--ctx', '16384', '--log-format', 'json']);
  try {
    const text = 'x'.repeat(6000); // 6004 prompt tokens on the test engine
    const r = await postJson(srv.base, '/v1/messages', { model: 'claude-test', max_tokens: 50,
      thinking: { type: 'disabled' }, messages: [{ role: 'user', content: text }] });
    assert.equal(r.status, 200);
    await postJson(srv.base, '/v1/messages', { model: 'claude-test', messages: [] });
    await wait(200);
    const objs = srv.stderr().split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l));
    const req = objs.find((o) => o.event === 'request');
    assert.ok(req, srv.stderr());
    assert.equal(req.endpoint, '/v1/messages');
    assert.equal(req.model, 'claude-test');
    assert.equal(req.prompt_tokens, singleTurnPromptTokens(text));
    assert.equal(req.prefilled_tokens, singleTurnPromptTokens(text));
    assert.equal(req.generated_tokens, Math.min(50, bytes(chatReply(text))));
    assert.equal(req.finish, 'length');
    const progress = objs.filter((o) => o.event === 'prefill');
    assert.equal(progress.length, 3, JSON.stringify(progress)); // at 25, 50 and 75 %
    assert.match(progress[0].message, /slot 0: \d+\/6004 tokens \(2\d%\)/);
    const err = objs.find((o) => o.event === 'error');
    assert.equal(err.status, 400);
    assert.equal(err.reason, "'max_tokens' is required");
    assert.ok(objs.some((o) => o.event === 'startup'));
  } finally { await srv.stop(); }
});

test('GET /metrics counts requests, tokens, cache sources, slots', async () => {
  const srv = await startServer(['--ctx', '4096', '--parallel', '2']);
  try {
    const a = new Anthropic({ apiKey: 'x', baseURL: srv.base, maxRetries: 0 });
    const text = 'count me';
    await a.messages.create({ model: 'm', max_tokens: 100, thinking: { type: 'disabled' }, messages: [{ role: 'user', content: text }] });
    await postJson(srv.base, '/v1/messages', { model: 'm', messages: [] });
    const res = await fetch(`${srv.base}/metrics`);
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type'), /^text\/plain; version=0\.0\.4/);
    const m = parseMetrics(await res.text());
    assert.equal(m.get('ds4_requests_total{endpoint="/v1/messages",status="2xx"}'), 1);
    assert.equal(m.get('ds4_requests_total{endpoint="/v1/messages",status="4xx"}'), 1);
    assert.equal(m.get('ds4_prompt_tokens_total'), singleTurnPromptTokens(text));
    assert.equal(m.get('ds4_prompt_tokens_prefilled_total'), singleTurnPromptTokens(text));
    assert.equal(m.get('ds4_generated_tokens_total'), bytes(chatReply(text)));
    assert.equal(m.get('ds4_prompt_cache_total{source="cold"}'), 1);
    assert.equal(m.get('ds4_slots'), 2);
    assert.equal(m.get('ds4_slots_busy'), 0);
    assert.equal(m.get('ds4_queue_depth'), 0);
    assert.equal(m.get('ds4_context_length'), 4096);
    assert.ok(m.get('ds4_decode_seconds_total') > 0);
  } finally { await srv.stop(); }
});

test('count_tokens equals the prompt tokens of the same request; /v1/models has context_length', async () => {
  const srv = await startServer(['--ctx', '8192']);
  try {
    const a = new Anthropic({ apiKey: 'x', baseURL: srv.base, maxRetries: 0 });
    const body = { model: 'm', system: 'Be brief.', messages: [{ role: 'user', content: 'How many tokens?' }],
      tools: [{ name: 'f', description: 'd', input_schema: { type: 'object', properties: { a: { type: 'string' } } } }] };
    const counted = await a.messages.countTokens(body);
    const m = await a.messages.create({ ...body, max_tokens: 20 });
    assert.equal(counted.input_tokens, m.usage.input_tokens + (m.usage.cache_read_input_tokens ?? 0));
    // without tools, a known count: BOS + system + <User> text <Assistant> <think>
    const c2 = await a.messages.countTokens({ model: 'm', messages: [{ role: 'user', content: 'abc' }] });
    assert.equal(c2.input_tokens, singleTurnPromptTokens('abc'));
    const bad = await postJson(srv.base, '/v1/messages/count_tokens', { messages: 'x' });
    assert.equal(bad.status, 400);
    const models = await (await fetch(`${srv.base}/v1/models`)).json();
    for (const d of models.data) assert.equal(d.context_length, 8192);
    const one = await (await fetch(`${srv.base}/v1/models/deepseek-chat`)).json();
    assert.equal(one.context_length, 8192);
  } finally { await srv.stop(); }
});

// The KV state a session takes for the whole context, computed here from
// the demo model's Hugging Face config (models/ds4-demo.config.json) with
// the state layout of dsv4-model.md §5.1 as docs/SERVER.md spells it out:
// every layer a ring of sliding_window rows of head_dim floats; a
// compressed layer of ratio r (CSA 4, HCA 32) a compressor with its two
// pending buffers (r rows, twice as wide when overlapping, CSA) and, when
// overlapping, the previous window's two (r rows), plus ctx/r + 1
// compressed rows; a CSA layer the same for its indexer keys
// (index_head_dim wide). f32 everywhere.
test('startup report: the KV state per slot at the full context equals the model dims', async (t) => {
  const { existsSync, readFileSync } = await import('node:fs');
  const path = (await import('node:path')).default;
  const { repoRoot } = await import('./helpers.mjs');
  const gguf = path.join(repoRoot, 'models', 'ds4-demo.gguf');
  if (!existsSync(gguf)) return t.skip('models/ds4-demo.gguf missing');
  const cfg = JSON.parse(readFileSync(path.join(repoRoot, 'models', 'ds4-demo.config.json'), 'utf8'));
  const ctx = 4096;
  const comp = (r, d, overlap) => 4 * (2 * r * d * (overlap ? 2 : 1) + (overlap ? 2 * r * d : 0) + (Math.floor(ctx / r) + 1) * d);
  let want = 0;
  for (const kind of cfg.layer_types) {
    want += 4 * cfg.sliding_window * cfg.head_dim;
    const r = cfg.compress_rates[kind];
    if (!r) continue;
    want += comp(r, cfg.head_dim, r === 4);
    if (r === 4) want += comp(r, cfg.index_head_dim, true);
  }
  const srv = await startServer(['-m', gguf, '--ctx', String(ctx), '-t', '2', '--parallel', '2'], { testEngine: false });
  try {
    const line = srv.stderr().split('\n').find((l) => /startup: backend/.test(l));
    assert.ok(line, srv.stderr());
    const m = line.match(/weights ([\d.]+) MiB \(mapped file\), KV state ([\d.]+) MiB \((\d+) bytes\) per slot at ctx (\d+), work buffers ([\d.]+) MiB per slot \(prefill chunk (\d+)\), planned ([\d.]+) MiB in all/);
    assert.ok(m, line);
    assert.equal(Number(m[3]), want);
    assert.equal(Number(m[4]), ctx);
    assert.ok(Math.abs(Number(m[2]) - want / 1048576) < 0.05);
    const weights = readFileSync(gguf).length / 1048576;
    assert.ok(Math.abs(Number(m[1]) - weights) < 0.05);
    // the CPU's prefill chunk (docs/SERVER.md), and the work buffers hold
    // the logits buffer's 64 rows (model/dsv4_state.h DSV4_LOGIT_ROWS),
    // not the chunk's 128
    assert.equal(Number(m[6]), 128);
    assert.ok(Number(m[5]) >= 64 * cfg.vocab_size * 4 / 1048576 - 0.05);
    assert.ok(Number(m[5]) < 128 * cfg.vocab_size * 4 / 1048576, `work buffers ${m[5]} MiB: 128 logits rows?`);
    assert.ok(Math.abs(Number(m[7]) - (weights + 2 * (want / 1048576 + Number(m[5])))) < 0.2);
  } finally {
    await srv.stop();
  }
});

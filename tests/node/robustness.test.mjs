// robustness.test.mjs - bad input, disconnects, keep-alives and load.
// Every bad request must get a 4xx with an error body, and the server must
// keep serving afterwards.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { readFileSync, rmSync } from 'node:fs';
import OpenAI from 'openai';
import { startServer, postJson, chatReply } from './helpers.mjs';

let srv;

before(async () => { srv = await startServer(['--max-body-bytes', '65536', '--max-queue', '64']); });
after(async () => { await srv.stop(); });

async function healthy() {
  const r = await fetch(`${srv.base}/health`);
  assert.equal(r.status, 200);
  assert.equal((await r.json()).status, 'ok');
}

function rawExchange(bytes, port = srv.port) {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    let out = '';
    s.on('data', (d) => { out += d; });
    s.on('close', () => resolve(out));
    s.on('error', () => resolve(out));
    s.setTimeout(3000, () => s.destroy());
    s.write(bytes);
    setTimeout(() => s.end(), 300);
  });
}

test('malformed JSON, wrong types, missing fields: 400 with the field named', async () => {
  const cases = [
    ['/v1/chat/completions', '{"messages": [', null],
    ['/v1/chat/completions', '"just a string"', null],
    ['/v1/chat/completions', { messages: 'hello' }, 'messages'],
    ['/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], max_tokens: 'many' }, 'max_tokens'],
    ['/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], top_p: 3 }, 'top_p'],
    ['/v1/completions', { prompt: { a: 1 } }, 'prompt'],
    ['/v1/responses', { input: 42 }, 'input'],
    ['/v1/messages', { messages: [{ role: 'user', content: 'x' }] }, 'max_tokens'],
  ];
  for (const [p, body, param] of cases) {
    const r = await postJson(srv.base, p, body);
    assert.equal(r.status, 400, `${p} ${JSON.stringify(body)} -> ${r.status} ${r.text}`);
    const err = r.json.error;
    assert.ok(err && err.message, r.text);
    // OpenAI bodies carry param; Anthropic bodies name the field in the message
    if (param && p !== '/v1/messages') assert.equal(err.param, param);
    if (param) assert.ok(err.message.includes(`'${param}'`), err.message);
  }
  await healthy();
});

test('unknown endpoints are 404 JSON, wrong methods 405', async () => {
  let r = await fetch(`${srv.base}/v1/engines`);
  assert.equal(r.status, 404);
  assert.match((await r.json()).error.message, /no such endpoint/);
  r = await fetch(`${srv.base}/v1/chat/completions`);
  assert.equal(r.status, 405);
  assert.ok((await r.json()).error);
  r = await fetch(`${srv.base}/v1/messages/batches`, { method: 'POST', body: '{}' });
  assert.equal(r.status, 404);
  assert.equal((await r.json()).type, 'error');
  await healthy();
});

test('oversized bodies are 413 (declared and chunked)', async () => {
  const big = JSON.stringify({ messages: [{ role: 'user', content: 'x'.repeat(100000) }] });
  const r = await postJson(srv.base, '/v1/chat/completions', big);
  assert.equal(r.status, 413);
  assert.match(r.json.error.message, /limit/);
  // no Content-Length: chunked upload past the limit
  const chunked = await rawExchange(
    'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n' +
    `${(70000).toString(16)}\r\n${'y'.repeat(70000)}\r\n0\r\n\r\n`);
  assert.match(chunked, /^HTTP\/1\.1 413/);
  assert.match(chunked, /"error"/);
  await healthy();
});

test('HTTP garbage on a raw socket gets a 4xx and the server keeps serving', async () => {
  for (const junk of ['GARBAGE\r\n\r\n', 'GET / HTTP/9.9\r\n\r\n', '\x00\x01\x02\xff\r\n\r\n',
    'POST /v1/chat/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n']) {
    const out = await rawExchange(junk);
    assert.ok(out === '' || /^HTTP\/1\.[01] [45]\d\d/.test(out), JSON.stringify(out.slice(0, 80)));
  }
  await healthy();
});

test('a client that disconnects mid-stream stops its generation', async () => {
  const tracePath = path.join(os.tmpdir(), `ds4-trace-${process.pid}.txt`);
  const slow = await startServer(['--test-engine-delay-us', '20000', '--keepalive-ms', '100', '--trace', tracePath]);
  try {
    const ac = new AbortController();
    const res = await fetch(`${slow.base}/v1/chat/completions`, {
      method: 'POST', signal: ac.signal, headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'deepseek-chat', stream: true, messages: [{ role: 'user', content: 'a long story' }] }),
    });
    // read until the generation is under way (past the prefill), then leave
    const reader = res.body.getReader();
    let content = '';
    let buf = '';
    const dec = new TextDecoder();
    while (!content.includes('word1')) {
      const { value, done } = await reader.read();
      assert.ok(!done, 'the stream ended before the generation got going');
      buf += dec.decode(value, { stream: true });
      for (const m of buf.matchAll(/"content":"([^"]*)"/g)) content += m[1];
      buf = buf.slice(buf.lastIndexOf('\n') + 1);
    }
    ac.abort();
    // the scripted reply is ~1400 tokens (28 s at 20 ms each); a freed worker
    // answers the next short request in well under that
    const t0 = Date.now();
    const r = await postJson(slow.base, '/v1/chat/completions',
      { model: 'deepseek-chat', max_tokens: 3, messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(r.status, 200);
    assert.ok(Date.now() - t0 < 10000, `next request waited ${Date.now() - t0} ms`);
  } finally { await slow.stop(); }
  // the trace shows the rendered prompt, the cache decision, the
  // generation and that the client went away
  const trace = readFileSync(tracePath, 'utf8');
  assert.match(trace, /prompt \(chat\) \(\d+ bytes\)\n<｜begin▁of▁sentence｜><｜User｜>a long story<｜Assistant｜><\/think>/);
  assert.match(trace, /cache: cold: 0 tokens reused/);
  assert.match(trace, /client gone/);
  assert.match(trace, /generated \(\d+ bytes\)\nword0 word1/);
  rmSync(tracePath, { force: true });
});

test('keep-alive comments flow during a long prefill', async () => {
  const slow = await startServer(['--test-engine-delay-us', '5000', '--keepalive-ms', '100']);
  try {
    const res = await fetch(`${slow.base}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'deepseek-chat', stream: true, max_tokens: 2, messages: [{ role: 'user', content: 'p'.repeat(300) }] }),
    });
    const text = await res.text();
    const firstData = text.indexOf('data: ');
    const ka = (text.match(/^: keep-alive$/gm) || []).length;
    assert.ok(ka >= 3, `only ${ka} keep-alives in ${text.length} bytes`);
    assert.ok(firstData >= 0);
    assert.match(text, /data: \[DONE\]/);
  } finally { await slow.stop(); }
});

test('32 concurrent clients: all answered or cleanly rejected, memory flat', async (t) => {
  const client = new OpenAI({ apiKey: 'x', baseURL: `${srv.base}/v1`, maxRetries: 0 });
  const round = async () => {
    const results = { ok: 0, busy: 0, other: [] };
    await Promise.all(Array.from({ length: 32 }, async (_, i) => {
      const text = `client ${i} says hi`;
      try {
        if (i % 2) {
          const s = await client.chat.completions.create({ model: 'deepseek-chat', stream: true, messages: [{ role: 'user', content: text }] });
          let c = '';
          for await (const ch of s) c += ch.choices[0]?.delta?.content ?? '';
          assert.equal(c, chatReply(text));
        } else {
          const r = await client.chat.completions.create({ model: 'deepseek-chat', messages: [{ role: 'user', content: text }] });
          assert.equal(r.choices[0].message.content, chatReply(text));
        }
        results.ok++;
      } catch (e) {
        if (e.status === 503) results.busy++;
        else results.other.push(String(e));
      }
    }));
    return results;
  };
  await round();
  const rss0 = srv.rssKb();
  const deadline = Date.now() + 4000;
  let rounds = 0;
  let answered = 0;
  while (Date.now() < deadline) {
    const r = await round();
    assert.deepEqual(r.other, []);
    assert.equal(r.ok + r.busy, 32);
    answered += r.ok;
    rounds++;
  }
  const rss1 = srv.rssKb();
  assert.ok(rounds >= 2 && answered > 0);
  // ASan's allocator caches grow RSS for ~10 s before they plateau, so the
  // flatness check is only meaningful on the plain build (measured there:
  // 13.0 -> 13.2 MB over 25k requests).
  if (/asan/.test(process.env.DS4_BIN_DIR ?? '')) t.diagnostic(`asan build: RSS ${rss0} -> ${rss1} kB not checked`);
  else assert.ok(rss1 - rss0 < 20000, `RSS grew from ${rss0} kB to ${rss1} kB over ${rounds} rounds`);
  await healthy();
});

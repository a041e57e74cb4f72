// kvcache.test.mjs - the disk KV cache across server restarts.
//
// Server A answers turn 1 cold (saving the prompt state, "cold") and saves
// its live session when stopped ("shutdown"). Server B, started on the same
// directory, must answer turn 2 from the disk snapshot: only the new suffix
// is prefilled, visible in usage (cached tokens) and in the "ds4" field.
// Then every cache file is damaged; server C must reject them (removed, with
// a log line) and answer cold, correctly.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, readFileSync, writeFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, singleTurnPromptTokens, chatReply, bytes } from './helpers.mjs';

const dir = mkdtempSync(path.join(os.tmpdir(), 'ds4-kvdisk-'));
const args = ['--kv-disk-dir', dir, '--kv-cache-min-tokens', '1', '--kv-disk-space-mb', '16'];
const q1 = 'Please remember: the password is swordfish.';
const q2 = 'What is the password?';

const clientFor = (srv) => new OpenAI({ apiKey: 'x', baseURL: `${srv.base}/v1`, maxRetries: 0 });
const conversation = (a1) => [{ role: 'user', content: q1 }, { role: 'assistant', content: a1 }, { role: 'user', content: q2 }];

test('a restarted server continues the conversation from disk; corrupt files are rejected', async (t) => {
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const a = await startServer(args);
  let r1;
  try {
    r1 = await clientFor(a).chat.completions.create({ model: 'deepseek-chat', messages: [{ role: 'user', content: q1 }] });
    assert.equal(r1.ds4.cache, 'cold');
  } finally {
    assert.equal(await a.stop('SIGTERM'), 0);
  }
  assert.match(a.stderr(), /saved [0-9a-f]{40} \(cold/);
  assert.match(a.stderr(), /saved [0-9a-f]{40} \(shutdown/);
  const files = readdirSync(dir).filter((f) => /^[0-9a-f]{40}\.kv$/.test(f));
  assert.equal(files.length, 2);

  const a1 = r1.choices[0].message.content;
  const live = r1.usage.prompt_tokens + r1.usage.completion_tokens;
  const b = await startServer(args);
  try {
    const c = clientFor(b);
    const r2 = await c.chat.completions.create({ model: 'deepseek-chat', messages: conversation(a1) });
    assert.equal(r2.ds4.cache, 'disk');
    assert.equal(r2.usage.prompt_tokens_details.cached_tokens, live);
    assert.equal(r2.ds4.prefilled_tokens, 4 + bytes(q2));
    assert.equal(r2.choices[0].message.content, chatReply(q2));
    // the very first request again: the "cold" file covers its whole prompt
    const r3 = await c.chat.completions.create({ model: 'deepseek-chat', messages: [{ role: 'user', content: q1 }] });
    assert.equal(r3.ds4.cache, 'disk');
    assert.equal(r3.usage.prompt_tokens_details.cached_tokens, singleTurnPromptTokens(q1));
    assert.equal(r3.choices[0].message.content, a1);
  } finally { await b.stop(); }

  // damage every file: flip a byte in the middle of the payload
  for (const f of readdirSync(dir).filter((n) => n.endsWith('.kv'))) {
    const p = path.join(dir, f);
    const buf = readFileSync(p);
    buf[buf.length - 40] ^= 0xff;
    writeFileSync(p, buf);
  }
  const c = await startServer(args);
  try {
    const r4 = await clientFor(c).chat.completions.create({ model: 'deepseek-chat', messages: conversation(a1) });
    assert.equal(r4.ds4.cache, 'cold');
    assert.equal(r4.usage.prompt_tokens_details.cached_tokens, 0);
    assert.equal(r4.choices[0].message.content, chatReply(q2));
    // stderr and the HTTP answer travel separately: give the line a moment
    for (let t = 0; t < 40 && !/removing .*checksum mismatch/.test(c.stderr()); t++) await new Promise((r) => setTimeout(r, 50));
    assert.match(c.stderr(), /removing .*checksum mismatch/);
  } finally { await c.stop(); }
});

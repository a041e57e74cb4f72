// steering.test.mjs - ds4-server's disk KV cache is keyed on directional
// steering: a prompt state saved by a server steered with one direction
// file and scale is restored only by a server steered the same way (same
// file content, same scales), never under another file, another scale or
// no steering, and the states of each setting are kept side by side (the
// demo model, models/ds4-demo.gguf; the direction files are random unit
// rows written here, n_layer x n_embd f32 as ds4-steer writes them).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, repoRoot } from './helpers.mjs';

const model = path.join(repoRoot, 'models', 'ds4-demo.gguf');
const skip = existsSync(model) ? false : 'models/ds4-demo.gguf missing';
const N_LAYER = 6, N_EMBD = 64; // models/ds4-demo.config.json

function directions(file, seed) {
  const v = new Float32Array(N_LAYER * N_EMBD);
  let x = seed >>> 0;
  for (let l = 0; l < N_LAYER; l++) {
    let n2 = 0;
    for (let e = 0; e < N_EMBD; e++) {
      x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
      v[l * N_EMBD + e] = x / 4294967296 - 0.5;
      n2 += v[l * N_EMBD + e] ** 2;
    }
    for (let e = 0; e < N_EMBD; e++) v[l * N_EMBD + e] /= Math.sqrt(n2);
  }
  writeFileSync(file, Buffer.from(v.buffer));
}

test('the disk cache never restores a prefix saved under other steering settings', { skip }, async (t) => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ds4-steer-kv-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const fa = path.join(dir, 'a.f32'), fb = path.join(dir, 'b.f32');
  directions(fa, 1);
  directions(fb, 2);
  const kv = path.join(dir, 'kv');
  const base = ['-m', model, '--ctx', '1024', '-t', '2', '--kv-disk-dir', kv, '--kv-cache-min-tokens', '1'];
  const req = { model: 'deepseek-chat', temperature: 0, max_tokens: 24,
    messages: [{ role: 'user', content: 'What is the capital of Japan?' }] };
  // one request on a fresh server with these flags: its cache decision and answer
  const ask = async (flags) => {
    const s = await startServer([...base, ...flags], { testEngine: false });
    try {
      const r = await new OpenAI({ apiKey: 'x', baseURL: `${s.base}/v1`, maxRetries: 0 }).chat.completions.create(req);
      return { cache: r.ds4.cache, text: r.choices[0].message.content, reasoning: r.choices[0].message.reasoning_content };
    } finally { assert.equal(await s.stop(), 0); } // the shutdown save
  };
  const A = ['--dir-steering-file', fa, '--dir-steering-ffn', '3'];
  const a1 = await ask(A);
  assert.equal(a1.cache, 'cold');
  // another direction file (same scale), another scale, no steering: cold
  for (const flags of [['--dir-steering-file', fb, '--dir-steering-ffn', '3'],
    ['--dir-steering-file', fa, '--dir-steering-ffn', '2'], []]) {
    const r = await ask(flags);
    assert.equal(r.cache, 'cold', `flags ${flags.join(' ')}: a state saved under other steering was reused`);
  }
  // the same steering again (each setting's states are kept): from disk, the same answer
  const a2 = await ask(A);
  assert.equal(a2.cache, 'disk');
  assert.deepEqual(a2, { ...a1, cache: 'disk' });
  // and the unsteered states too
  const p2 = await ask([]);
  assert.equal(p2.cache, 'disk');
  // scale 0 steers nothing: it shares the unsteered states
  const z = await ask(['--dir-steering-file', fa, '--dir-steering-ffn', '0']);
  assert.equal(z.cache, 'disk');
  assert.equal(z.text, p2.text);
  assert.ok(readdirSync(kv).filter((f) => f.startsWith('steer-')).length === 3, readdirSync(kv).join(' '));
});

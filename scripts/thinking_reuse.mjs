#!/usr/bin/env node
// thinking_reuse.mjs - how much of each turn a thinking-mode conversation
// without tools prefills: the measurement behind docs/SERVER.md ("Prefix
// reuse across thinking turns").
//
//   node scripts/thinking_reuse.mjs ./ds4-server -m models/ds4-demo.gguf --ctx 4096 -t 2
//
// Starts the given server with the given flags on a free port (plus
// --trace to a temporary file), holds a conversation of four user turns in
// thinking mode (greedy, the client sending back each answer with its
// reasoning, which the official rendering then drops), and prints per turn
// the server's cache decision, reused and prefilled tokens, prefill time and
// the answer (greedy: the same whatever the cache did), then the trace's
// cache lines. No npm packages needed (fetch only).
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const [bin, ...flags] = process.argv.slice(2);
if (!bin) {
  console.error('usage: node scripts/thinking_reuse.mjs SERVER [server flags...]');
  process.exit(2);
}
const dir = mkdtempSync(path.join(os.tmpdir(), 'ds4-reuse-'));
const trace = path.join(dir, 'trace.txt');
const proc = spawn(bin, [...flags, '--port', '0', '--trace', trace], { stdio: ['ignore', 'pipe', 'inherit'] });
const port = await new Promise((resolve, reject) => {
  let out = '';
  proc.stdout.on('data', (d) => {
    out += d;
    const m = out.match(/listening (\d+)/);
    if (m) resolve(Number(m[1]));
  });
  proc.on('exit', (c) => reject(new Error(`server exited ${c}`)));
});

const system = 'You are a helpful assistant. Answer briefly and precisely. '.repeat(8).trim();
const questions = ['What is the capital of France?', 'What is the capital of Italy?',
  'What is the capital of Spain?', 'What is the capital of Japan?'];
const messages = [{ role: 'system', content: system }];
try {
  console.log('turn  prompt  cache         reused  prefilled  prefill_ms  answer');
  for (let i = 0; i < questions.length; i++) {
    messages.push({ role: 'user', content: questions[i] });
    const res = await fetch(`http://127.0.0.1:${port}/v1/chat/completions`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'deepseek-reasoner', temperature: 0, max_tokens: 64, messages }),
    });
    const r = await res.json();
    if (!r.choices) throw new Error(JSON.stringify(r));
    const m = r.choices[0].message;
    messages.push({ role: 'assistant', content: m.content ?? '', reasoning_content: m.reasoning_content });
    console.log(`${String(i + 1).padStart(4)}  ${String(r.usage.prompt_tokens).padStart(6)}  ` +
      `${r.ds4.cache.padEnd(12)}  ${String(r.ds4.reused_tokens).padStart(6)}  ` +
      `${String(r.ds4.prefilled_tokens).padStart(9)}  ${r.ds4.prefill_ms.toFixed(1).padStart(10)}  ` +
      JSON.stringify(m.content));
  }
} finally {
  proc.kill('SIGTERM');
  await new Promise((r) => proc.on('exit', r));
  console.log(readFileSync(trace, 'utf8').split('\n').filter((l) => l.includes(' cache: ')).join('\n'));
  rmSync(dir, { recursive: true, force: true });
}

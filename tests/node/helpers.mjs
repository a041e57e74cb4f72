// helpers.mjs - start and stop a ds4-server for the SDK tests.
//
// The server runs the scripted test engine (--test-engine) on a free
// loopback port (--port 0; it prints "listening N" on stdout). Its replies
// are fixed by server/engine_test.c: "Hello! You said: <user text>." in
// chat mode, preceded by the reasoning "The user wrote N bytes; I will
// answer." in thinking mode, and a get_weather DSML call when tools are
// declared and the user asks about the weather. Its tokens are the 7
// special tokens plus one token per byte, which lets the tests compute
// token counts independently of the server.
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const repoRoot = path.resolve(here, '..', '..');
const binDir = process.env.DS4_BIN_DIR ? path.resolve(repoRoot, process.env.DS4_BIN_DIR) : repoRoot;
export const serverBin = path.join(binDir, 'ds4-server');

export async function startServer(extra = [], { testEngine = true } = {}) {
  const args = [...(testEngine ? ['--test-engine'] : []), '--port', '0', ...extra];
  const proc = spawn(serverBin, args, {
    cwd: repoRoot, stdio: ['ignore', 'pipe', 'pipe'],
    // Under `make asan` a small quarantine keeps freed memory from looking
    // like growth in the memory-flatness check (leaks are still reported).
    env: { ...process.env, ASAN_OPTIONS: process.env.ASAN_OPTIONS ?? 'quarantine_size_mb=4' },
  });
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d; });
  const port = await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error('server did not start: ' + stderr)), 30000);
    proc.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening (\d+)/);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`server exited ${code}: ${stderr}`)); });
  });
  const base = `http://127.0.0.1:${port}`;
  return {
    port, base, proc,
    stderr: () => stderr,
    rssKb: () => {
      const m = readFileSync(`/proc/${proc.pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/);
      return m ? Number(m[1]) : 0;
    },
    async stop(signal = 'SIGTERM') {
      if (proc.exitCode !== null) return proc.exitCode;
      const done = new Promise((r) => proc.on('exit', (code, sig) => r(code ?? sig)));
      proc.kill(signal);
      return done;
    },
  };
}

// Token counts of the test engine: specials count 1, other text 1 per byte.
export const bytes = (s) => Buffer.byteLength(s, 'utf8');
// <BOS><User>text<Assistant></think> or <think>
export const singleTurnPromptTokens = (userText) => 4 + bytes(userText);
export const chatReply = (userText) => `Hello! You said: ${userText}.`;
export const reasoningFor = (userText) => `The user wrote ${bytes(userText)} bytes; I will answer.`;

export async function postJson(base, p, body, headers = {}) {
  const res = await fetch(base + p, {
    method: 'POST', headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, text, json };
}

#!/usr/bin/env node
// parallel_bench.mjs - aggregate generation throughput of ds4-server with C
// concurrent streaming clients: the measurement behind docs/SERVER.md
// ("Parallel requests").
//
//   node scripts/parallel_bench.mjs [--clients 1,4] [--requests 8] [--tokens 96] [--rounds 3] \
//        ./ds4-server -m models/ds4-demo.gguf --ctx 2048 -t 2 --parallel 4
//
// Starts the given server with the given flags on a free port. For each
// client count C, C clients each send --requests greedy streaming chat
// requests one after another (distinct short questions, max_tokens N; a
// client's next request goes out when its stream ends), and the round
// measures, from the first request sent to the last stream ended:
// completion tokens (the usage chunks) / seconds = aggregate tokens/s.
// Prefill is included, as in serving (the demo model's answers are short).
// Each C is run --rounds times; the best round is printed with the others.
// Next to wall-clock throughput it prints tokens per CPU-second of the
// server process (/proc/PID/stat utime + stime), which other load on the
// machine disturbs less than wall time. /health's decode counters say how
// many sessions the decode steps held. Linux; no npm packages (fetch only).
import { execSync, spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';

const argv = process.argv.slice(2);
const opt = { clients: [1, 4], requests: 8, tokens: 96, rounds: 3 };
while (['--clients', '--requests', '--tokens', '--rounds'].includes(argv[0])) {
  const [k, v] = argv.splice(0, 2);
  if (k === '--clients') opt.clients = v.split(',').map(Number);
  else opt[k.slice(2)] = Number(v);
}
const [bin, ...flags] = argv;
if (!bin) {
  console.error('usage: node scripts/parallel_bench.mjs [--clients 1,4] [--requests K] [--tokens N] [--rounds R] SERVER [flags...]');
  process.exit(2);
}
const proc = spawn(bin, [...flags, '--port', '0'], { stdio: ['ignore', 'pipe', 'inherit'] });
const port = await new Promise((resolve, reject) => {
  let out = '';
  proc.stdout.on('data', (d) => {
    out += d;
    const m = out.match(/listening (\d+)/);
    if (m) resolve(Number(m[1]));
  });
  proc.on('exit', (c) => reject(new Error(`server exited ${c}`)));
});
const base = `http://127.0.0.1:${port}`;
const tck = Number(execSync('getconf CLK_TCK').toString()) || 100;
// CPU seconds the server has used (user + system)
const cpu = () => {
  const f = readFileSync(`/proc/${proc.pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(f[11]) + Number(f[12])) / tck;
};

const questions = ['Tell me about the sea.', 'Describe a forest in spring.', 'Write a poem about the moon.',
  'Explain how rain forms.', 'Tell me a story about a cat.', 'Describe a busy city street.',
  'What do you know about mountains?', 'Tell me about the history of bread.'];

// One streaming request; resolves to its completion tokens.
async function one(i) {
  const res = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      model: 'deepseek-chat', temperature: 0, max_tokens: opt.tokens, stream: true,
      stream_options: { include_usage: true }, messages: [{ role: 'user', content: questions[i % questions.length] }],
    }),
  });
  const text = await res.text();
  const m = [...text.matchAll(/"completion_tokens":(\d+)/g)].at(-1);
  if (!m) throw new Error(`no usage in the stream: ${text.slice(-300)}`);
  return Number(m[1]);
}

try {
  await one(0); // warm-up: weights paged in, first allocations done
  console.log(`server: ${[bin, ...flags].join(' ')}`);
  console.log(`clients  round  tokens  seconds  aggregate_tok_s  cpu_s  tok_per_cpu_s   (${opt.requests} requests per client)`);
  for (const c of opt.clients) {
    let best = 0, bestCpu = 0;
    for (let r = 0; r < opt.rounds; r++) {
      const c0 = cpu();
      const t0 = process.hrtime.bigint();
      const client = async (i) => {
        let n = 0;
        for (let k = 0; k < opt.requests; k++) n += await one(i * opt.requests + k + r);
        return n;
      };
      const toks = await Promise.all(Array.from({ length: c }, (_, i) => client(i)));
      const s = Number(process.hrtime.bigint() - t0) / 1e9;
      const cs = cpu() - c0;
      const n = toks.reduce((a, b) => a + b, 0);
      best = Math.max(best, n / s);
      bestCpu = Math.max(bestCpu, n / cs);
      console.log(`${String(c).padStart(7)}  ${String(r + 1).padStart(5)}  ${String(n).padStart(6)}  ` +
        `${s.toFixed(2).padStart(7)}  ${(n / s).toFixed(1).padStart(15)}  ${cs.toFixed(2).padStart(5)}  ${(n / cs).toFixed(1).padStart(13)}`);
    }
    console.log(`${String(c).padStart(7)}   best                   ${best.toFixed(1).padStart(15)}         ${bestCpu.toFixed(1).padStart(13)}`);
  }
  console.log('health:', JSON.stringify(await (await fetch(`${base}/health`)).json()));
} finally {
  proc.kill('SIGTERM');
}

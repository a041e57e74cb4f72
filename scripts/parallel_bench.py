#!/usr/bin/env python3
"""parallel_bench.py - aggregate generation throughput of ds4-server with C
concurrent streaming clients: the measurement behind docs/SERVER.md
("Parallel requests") and the GPU machine's `server` step
(bench/h200_run.sh), which has Python but no Node.

  python3 scripts/parallel_bench.py [--clients 1,4] [--requests 8] [--tokens 96] \\
      [--rounds 3] [--temperature 0] [--long-prompt N] [--csv FILE] \\
      ./ds4-server -m models/ds4-demo.gguf --ctx 2048 -t 2 --parallel 4

Starts the given server with the given flags on a free port (--port 0, it
prints `listening N`). For each client count C, C clients each send
--requests streaming chat requests one after another (distinct short
questions, max_tokens N; a client's next request goes out when its stream
ends), and the round measures, from the first request sent to the last
stream ended: completion tokens (the usage chunks) / seconds = aggregate
tokens/s. Prefill is included, as in serving. Each C is run --rounds times;
the best round is printed with the others. Next to wall-clock throughput it
prints tokens per CPU-second of the server process (/proc/PID/stat utime +
stime), which other load on the machine disturbs less than wall time.
--long-prompt N first times one request of about N prompt tokens (a
numbered sentence repeated, so nothing of it is cached) and 1 output
token: its prompt tokens (usage) / seconds is the server's prefill rate,
the --prefill-chunk steps included.
/health's decode counters (steps, the sessions they held) come last; the
completion tokens the clients counted must add up to /health's decoded
tokens over the run (each answer's last token is sampled, not decoded, so
the server decodes one token fewer an answer that ends at its budget).
Linux; the standard library only."""
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time

QUESTIONS = ['Tell me about the sea.', 'Describe a forest in spring.', 'Write a poem about the moon.',
             'Explain how rain forms.', 'Tell me a story about a cat.', 'Describe a busy city street.',
             'What do you know about mountains?', 'Tell me about the history of bread.']


def parse_args(argv):
    opt = {'clients': [1, 4], 'requests': 8, 'tokens': 96, 'rounds': 3, 'temperature': 0.0, 'csv': None,
           'long-prompt': 0}
    while argv and argv[0] in ('--clients', '--requests', '--tokens', '--rounds', '--temperature', '--csv',
                               '--long-prompt'):
        if len(argv) < 2:
            sys.exit(f'parallel_bench: {argv[0]} needs a value')
        k, v = argv[0][2:], argv[1]
        argv = argv[2:]
        try:
            if k == 'clients':
                opt[k] = [int(x) for x in v.split(',') if x]
            elif k == 'temperature':
                opt[k] = float(v)
            elif k == 'csv':
                opt[k] = v
            else:
                opt[k] = int(v)
        except ValueError:
            sys.exit(f'parallel_bench: --{k} {v}: not a number')
    if not argv:
        sys.exit('usage: python3 scripts/parallel_bench.py [--clients 1,4] [--requests K] [--tokens N] '
                 '[--rounds R] [--temperature T] [--long-prompt N] [--csv FILE] SERVER [flags...]')
    return opt, argv


def start_server(cmd, timeout_s):
    proc = subprocess.Popen(cmd + ['--port', '0'], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    port = [None]

    def read():  # the port line, then keep draining stdout so the server never blocks on it
        for line in proc.stdout:
            m = re.match(r'listening (\d+)', line)
            if m and port[0] is None:
                port[0] = int(m.group(1))
    threading.Thread(target=read, daemon=True).start()
    t0 = time.time()
    while port[0] is None:
        if proc.poll() is not None:
            sys.exit(f'parallel_bench: the server exited with {proc.returncode} before listening')
        if time.time() - t0 > timeout_s:
            proc.kill()
            sys.exit(f'parallel_bench: the server did not listen within {timeout_s} s')
        time.sleep(0.05)
    return proc, port[0]


def cpu_seconds(pid):
    with open(f'/proc/{pid}/stat') as f:
        fields = f.read().rsplit(') ', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def one(port, i, opt, content=None, max_tokens=None, usage='completion_tokens'):
    """One streaming request; returns its completion tokens (the usage chunk),
    or the usage field named."""
    body = json.dumps({
        'model': 'deepseek-chat', 'temperature': opt['temperature'], 'seed': i,
        'max_tokens': max_tokens or opt['tokens'], 'stream': True, 'stream_options': {'include_usage': True},
        'messages': [{'role': 'user', 'content': content or QUESTIONS[i % len(QUESTIONS)] + f' ({i})'}]})
    c = http.client.HTTPConnection('127.0.0.1', port, timeout=600)
    try:
        c.request('POST', '/v1/chat/completions', body, {'content-type': 'application/json'})
        r = c.getresponse()
        text = r.read().decode('utf-8', 'replace')
    finally:
        c.close()
    if r.status != 200:
        raise RuntimeError(f'status {r.status}: {text[:300]}')
    m = re.findall(r'"' + usage + r'":(\d+)', text)
    if not m:
        raise RuntimeError(f'no usage in the stream: {text[-300:]}')
    return int(m[-1])


def health(port):
    c = http.client.HTTPConnection('127.0.0.1', port, timeout=60)
    try:
        c.request('GET', '/health')
        return json.loads(c.getresponse().read())
    finally:
        c.close()


def main():
    opt, cmd = parse_args(sys.argv[1:])
    proc, port = start_server(cmd, float(os.environ.get('PARALLEL_BENCH_START_S', '600')))
    rows = []
    try:
        one(port, 0, opt)  # warm-up: weights paged in, first allocations done
        print(f'server: {" ".join(cmd)}')
        long_row = None
        if opt['long-prompt'] > 0:
            # ~11 tokens a sentence; numbered, so no two sentences (and no
            # earlier request) share a prefix beyond the template
            text = ' '.join(f'Line {k}: the river runs past the old mill.' for k in range(opt['long-prompt'] // 11))
            t0 = time.perf_counter()
            n = one(port, 10**6, opt, content=text + ' What runs past the mill?', max_tokens=1, usage='prompt_tokens')
            s = time.perf_counter() - t0
            long_row = (n, s)
            print(f'long prompt: {n} tokens and 1 generated in {s:.2f} s: {n / s:.1f} prompt tok/s')
        print(f'clients  round  tokens  seconds  aggregate_tok_s  cpu_s  tok_per_cpu_s   '
              f'({opt["requests"]} requests per client)')
        for nc in opt['clients']:
            best = best_cpu = 0.0
            for rnd in range(opt['rounds']):
                h0, c0, t0 = health(port), cpu_seconds(proc.pid), time.perf_counter()
                counts, errors = [0] * nc, []

                def client(k):
                    try:
                        for q in range(opt['requests']):
                            counts[k] += one(port, 1 + (rnd * nc + k) * opt['requests'] + q, opt)
                    except Exception as e:  # noqa: BLE001 - reported below, the round fails
                        errors.append(f'client {k}: {e}')
                th = [threading.Thread(target=client, args=(k,)) for k in range(nc)]
                for t in th:
                    t.start()
                for t in th:
                    t.join()
                s, cs, h1 = time.perf_counter() - t0, cpu_seconds(proc.pid) - c0, health(port)
                if errors:
                    sys.exit('parallel_bench: ' + '; '.join(errors[:4]))
                n = sum(counts)
                decoded = h1['decode']['tokens'] - h0['decode']['tokens']
                steps = h1['decode']['steps'] - h0['decode']['steps']
                best, best_cpu = max(best, n / s), max(best_cpu, n / cs if cs > 0 else 0)
                rows.append((nc, rnd + 1, n, s, n / s, cs, n / cs if cs > 0 else 0, decoded, steps))
                print(f'{nc:7d}  {rnd + 1:5d}  {n:6d}  {s:7.2f}  {n / s:15.1f}  {cs:5.2f}  '
                      f'{(n / cs if cs > 0 else 0):13.1f}   decoded {decoded} in {steps} steps')
                # every completion token but an answer's last was decoded (fed back)
                if not n - nc * opt['requests'] <= decoded <= n:
                    sys.exit(f'parallel_bench: the clients counted {n} completion tokens, /health {decoded} '
                             f'decoded: not between {n - nc * opt["requests"]} and {n}')
            print(f'{nc:7d}   best                   {best:15.1f}         {best_cpu:13.1f}')
        print('health:', json.dumps(health(port)))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    if opt['csv']:
        with open(opt['csv'], 'w') as f:
            f.write(f'# server: {" ".join(cmd)}\n# requests per client {opt["requests"]}, max_tokens '
                    f'{opt["tokens"]}, temperature {opt["temperature"]}\n')
            f.write('clients,round,tokens,seconds,aggregate_tok_s,cpu_s,tok_per_cpu_s,decoded,decode_steps\n')
            for r in rows:
                f.write(f'{r[0]},{r[1]},{r[2]},{r[3]:.3f},{r[4]:.1f},{r[5]:.2f},{r[6]:.1f},{r[7]},{r[8]}\n')
            if long_row:
                f.write(f'# long prompt: {long_row[0]} tokens in {long_row[1]:.3f} s, '
                        f'{long_row[0] / long_row[1]:.1f} prompt tok/s\n')


if __name__ == '__main__':
    main()

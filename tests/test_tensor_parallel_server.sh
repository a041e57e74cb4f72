#!/usr/bin/env bash
# ds4-server with --tensor-parallel 2 on the CPU backend (docs/TENSOR-PARALLEL.md):
# four requests at once on the demo model (models/ds4-demo.gguf), so the
# worker feeds them in batched decode steps over the TP sessions, against
# the same server on one device. Greedy answers must be the same, the
# France one the training data's own answer, and /health must show
# batched steps. Each server has a disk KV cache that keeps even these
# short prompts: round 1 saves the TP sessions' snapshots, round 2 repeats
# the prompts and restores them (the log's reused= counts).
set -u
cd "$(dirname "$0")/.."
. tests/server_lib.sh
srv_need curl node

start() { # start NAME FLAGS...: sets port_NAME
    mkdir -p "$tmp/kv-$1"
    srv_start "$1" -- --parallel 4 --kv-disk-dir "$tmp/kv-$1" --kv-cache-min-tokens 4 "${@:2}"
}
start tp --tensor-parallel 2
start one
[ -n "$port_tp" ] || { bad start_tp "$(cat "$tmp/tp.err")"; echo "RESULT $pass $fail 0"; exit 1; }
[ -n "$port_one" ] || { bad start_one "$(cat "$tmp/one.err")"; echo "RESULT $pass $fail 0"; exit 1; }

srv_rounds tp one
curl -s "http://127.0.0.1:$port_tp/health" >"$tmp/tp.health"
reused=$(grep -c 'reused=[1-9]' "$tmp/tp.err")
[ "$reused" -ge 1 ] && ok "tp_snapshot_restored ($reused requests reused a saved TP session)" \
    || bad tp_snapshot_restored "no request reused a cached prefix: $(grep POST "$tmp/tp.err" | tail -4)"

node - "$tmp" <<'JS' >"$tmp/result" 2>&1
const fs = require('fs');
const dir = process.argv[2];
const text = (n) => { try { return JSON.parse(fs.readFileSync(`${dir}/${n}.json`, 'utf8')).choices[0].message.content; } catch (e) { return null; } };
let out = [];
for (const r of [1, 2]) for (let i = 0; i < 4; i++) {
  const a = text(`tp.${r}.${i}`), b = text(`one.${r}.${i}`);
  out.push(a !== null && a === b ? `PASS same_answer_round${r}_prompt${i}` : `FAIL same_answer_round${r}_prompt${i}: tp ${JSON.stringify(a)} one ${JSON.stringify(b)}`);
}
const fr = text('tp.1.0');
out.push(fr === 'The capital of France is Paris.' ? 'PASS tp_france_answer' : `FAIL tp_france_answer: ${JSON.stringify(fr)}`);
let h = null; try { h = JSON.parse(fs.readFileSync(`${dir}/tp.health`, 'utf8')); } catch (e) {}
out.push(h && h.decode && h.decode.batched_steps > 0 ? `PASS tp_batched_steps (${h.decode.batched_steps}, max batch ${h.decode.max_batch})` : `FAIL tp_batched_steps: ${JSON.stringify(h)}`);
console.log(out.join('\n'));
JS
srv_count "$tmp/result"
srv_result

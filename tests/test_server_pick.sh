#!/usr/bin/env bash
# ds4-server's greedy slots take the decode step's own pick
# (ds4_session_decode_batch_pick; server/engine_ds4.c): on a backend that
# picks on its side the logits row is only read by a slot that samples. The
# CPU backend picks on its side with DS4_CPU_PICK=1 (test-only), so this runs
# the server's pick bookkeeping without a GPU: the same requests on the demo
# model (models/ds4-demo.gguf) to a server with it and one without must give
# the same answers, greedy (temperature 0) and sampled (temperature 0.8,
# a seed) side by side in batched steps, in two rounds: the second restores
# the first's saved prefixes from the disk KV cache, so a stale pick of the
# slot's last request would show. Three greedy answers are the training
# data's own.
set -u
cd "$(dirname "$0")/.."
. tests/server_lib.sh
srv_need curl node

start() { # start NAME VAR=VALUE: sets port_NAME
    mkdir -p "$tmp/kv-$1"
    srv_start "$1" "$2" -- --parallel 4 --kv-disk-dir "$tmp/kv-$1" --kv-cache-min-tokens 4
}
start pick DS4_CPU_PICK=1
start host DS4_CPU_PICK=0
[ -n "$port_pick" ] || { bad start_pick "$(cat "$tmp/pick.err")"; echo "RESULT $pass $fail 0"; exit 1; }
[ -n "$port_host" ] || { bad start_host "$(cat "$tmp/host.err")"; echo "RESULT $pass $fail 0"; exit 1; }

SRV_ASK_SAMPLED=1 srv_rounds pick host
curl -s "http://127.0.0.1:$port_pick/health" >"$tmp/pick.health"
reused=$(grep -c 'reused=[1-9]' "$tmp/pick.err")
[ "$reused" -ge 1 ] && ok "pick_prefix_restored ($reused requests reused a saved prefix)" \
    || bad pick_prefix_restored "no request reused a cached prefix: $(grep POST "$tmp/pick.err" | tail -4)"

node - "$tmp" <<'JS' >"$tmp/result" 2>&1
const fs = require('fs');
const dir = process.argv[2];
const text = (n) => { try { return JSON.parse(fs.readFileSync(`${dir}/${n}.json`, 'utf8')).choices[0].message.content; } catch (e) { return null; } };
let out = [];
for (const r of [1, 2]) for (let i = 0; i < 5; i++) {
  const a = text(`pick.${r}.${i}`), b = text(`host.${r}.${i}`);
  const what = i < 4 ? `greedy${i}` : 'sampled';
  out.push(a !== null && a === b ? `PASS same_answer_round${r}_${what}` : `FAIL same_answer_round${r}_${what}: pick ${JSON.stringify(a)} host ${JSON.stringify(b)}`);
}
const fr = text('pick.1.0');
// the demo model's training data answers these three (its Spain answer is not one)
for (const [i, c, city] of [[0, 'France', 'Paris'], [1, 'Japan', 'Tokyo'], [2, 'Italy', 'Rome']]) {
  const got = text(`pick.1.${i}`), want = `The capital of ${c} is ${city}.`;
  out.push(got === want ? `PASS pick_answer_${c}` : `FAIL pick_answer_${c}: ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
}
let h = null; try { h = JSON.parse(fs.readFileSync(`${dir}/pick.health`, 'utf8')); } catch (e) {}
out.push(h && h.decode && h.decode.batched_steps > 0 ? `PASS pick_batched_steps (${h.decode.batched_steps}, max batch ${h.decode.max_batch})` : `FAIL pick_batched_steps: ${JSON.stringify(h)}`);
console.log(out.join('\n'));
JS
srv_count "$tmp/result"
srv_result

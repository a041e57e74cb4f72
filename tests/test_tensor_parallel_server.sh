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
bin="${DS4_BIN_DIR:-.}/ds4-server"
model=models/ds4-demo.gguf
for tool in curl node; do
    if ! command -v $tool >/dev/null 2>&1; then echo "skip: $tool is not installed"; echo "RESULT 0 0 1"; exit 0; fi
done
[ -f "$model" ] || { echo "skip: $model missing"; echo "RESULT 0 0 1"; exit 0; }
[ -x "$bin" ] || { echo "fail: $bin not built"; echo "RESULT 0 1 0"; exit 1; }
tmp=$(mktemp -d)
pids=()
cleanup() { [ -n "${KEEP:-}" ] && { echo "kept $tmp"; }; for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; [ -n "${KEEP:-}" ] || rm -rf "$tmp"; }
trap cleanup EXIT
pass=0; fail=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1: $2"; fail=$((fail + 1)); }

start() { # start NAME FLAGS...: sets port_NAME
    local name=$1; shift
    mkdir -p "$tmp/kv-$name"
    DS4_BACKEND=cpu "$bin" -m "$model" --port 0 --parallel 4 --threads 2 --kv-disk-dir "$tmp/kv-$name" \
        --kv-cache-min-tokens 4 "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
    pids+=($!)
    for _ in $(seq 1 200); do grep -q '^listening' "$tmp/$name.out" 2>/dev/null && break; sleep 0.1; done
    eval "port_$name=$(sed -n 's/^listening //p' "$tmp/$name.out")"
}
start tp --tensor-parallel 2
start one
[ -n "$port_tp" ] || { bad start_tp "$(cat "$tmp/tp.err")"; echo "RESULT $pass $fail 0"; exit 1; }
[ -n "$port_one" ] || { bad start_one "$(cat "$tmp/one.err")"; echo "RESULT $pass $fail 0"; exit 1; }

prompts=("What is the capital of France?" "What is the capital of Japan?" "What is the capital of Italy?"
         "What is the capital of Spain?")
ask() { # ask NAME PORT ROUND: every prompt at once, answers to NAME.ROUND.i.json
    local i
    for i in 0 1 2 3; do
        curl -s -o "$tmp/$1.$3.$i.json" "http://127.0.0.1:$2/v1/chat/completions" -H 'content-type: application/json' \
            -d "{\"model\":\"deepseek-chat\",\"temperature\":0,\"max_tokens\":40,\"messages\":[{\"role\":\"user\",\"content\":\"${prompts[$i]}\"}]}" &
    done
    wait
}
for round in 1 2; do
    # the waits of `ask` would wait on the servers too: run each round in a subshell
    ( ask tp "$port_tp" $round ) ; ( ask one "$port_one" $round )
done
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
while IFS= read -r line; do
    case "$line" in
        PASS*) echo "$line"; pass=$((pass + 1)) ;;
        FAIL*) echo "$line"; fail=$((fail + 1)) ;;
        *) echo "$line" ;;
    esac
done <"$tmp/result"
echo "RESULT $pass $fail 0"
[ "$fail" -eq 0 ]

#!/usr/bin/env bash
# test_h200_run_server.sh - bench/h200_run.sh's `server` step, which runs
# on the GPU machine, run here on the CPU so that it cannot rot between
# device sessions: the real ds4-quantize makes a 1-layer synthetic Flash
# (the step's model script with a small shape), the real ds4-server serves
# it on the CPU backend, scripts/parallel_bench.py times a long prompt and
# drives 1 and 2 clients, and the step's summary lines and CSV must report
# the prompt (also at another --prefill-chunk) and both client counts with
# the tokens the clients counted equal to the server's decode counters.
# Prints "RESULT passed failed skipped".
set -u
cd "$(dirname "$0")/.."
bindir="${DS4_BIN_DIR:-.}"
for p in ds4-server ds4-quantize; do
    [ -x "$bindir/$p" ] || { echo "fail: $bindir/$p not built"; echo "RESULT 0 1 0"; exit 1; }
done
command -v python3 >/dev/null 2>&1 || { echo "skip: python3 is not installed"; echo "RESULT 0 0 1"; exit 0; }
. tests/h200_run_lib.sh
mkdir -p "$tmp/pkg/bin" "$tmp/pkg/tests" "$tmp/shm"
for p in ds4-server ds4-quantize; do ln -s "$(cd "$bindir" && pwd)/$p" "$tmp/pkg/bin/$p"; done

OUT="$tmp/o" SHM="$tmp/shm" PKG="$tmp/pkg" BIG_TMP="$tmp/shm" NEED_GIB=1 SYNTH_ARGS="--layers 1 --n-experts 8" \
    SRV_BACKEND=cpu SRV_CLIENTS=1,2 SRV_PARALLEL=2 SRV_REQUESTS=1 SRV_TOKENS=8 SRV_ROUNDS=1 SRV_CTX=1024 SRV_LONG=300 SRV_CHUNKS=64 \
    bash bench/h200_run.sh server > "$tmp/run.log" 2>&1
sum=$(cat "$tmp/o/summary.txt" 2>/dev/null)
line=$(printf '%s\n' "$sum" | grep '^server default:')
case "$line" in
*"rc 0 "*"1 best"*"2 best"*) ok "summary line: $line" ;;
*) bad "summary line" "$(tail -5 "$tmp/run.log")" ;;
esac
# the long prompt, and again at --prefill-chunk 64 on one slot: its tokens as the server counted them
case "$line" in
*"long prompt: "[1-9]*" tokens and 1 generated"*) ok "long prompt timed" ;;
*) bad "long prompt timed" "$line" ;;
esac
chunk=$(printf '%s\n' "$sum" | grep '^server --prefill-chunk 64:')
case "$chunk" in
*"rc 0 long prompt: "[1-9]*" tokens and 1 generated"*) ok "long prompt at chunk 64: $chunk" ;;
*) bad "long prompt at chunk 64" "[$chunk] $(tail -3 "$tmp/run.log")" ;;
esac
csv="$tmp/o/server_default.csv"
# clients,round,tokens,...,decoded,decode_steps: one row each for 1 and 2 clients,
# each answer at most its 8-token budget, the decoded tokens those counted
if awk -F, '/^[12],1,/ {n++; if ($3 < 1 || $3 > 8 * $1 || $8 > $3) bad = 1} END {exit !(n == 2 && !bad)}' "$csv" 2>/dev/null; then
    ok "csv rows for 1 and 2 clients"
else
    bad "csv rows" "$(cat "$csv" 2>/dev/null)"
fi
h2_result

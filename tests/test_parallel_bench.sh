#!/usr/bin/env bash
# scripts/parallel_bench.py (the server throughput bench, also run on the
# GPU machine by bench/h200_run.sh's `server` step) against the real server
# on the demo model: it must start the server, count every stream's
# completion tokens, agree with the server's own /health decode counters
# (the script exits non-zero when they disagree) and write its CSV; with 4
# clients on 4 slots the decode steps must hold several sessions.
set -u
cd "$(dirname "$0")/.."
. tests/server_lib.sh
srv_need python3

python3 scripts/parallel_bench.py --clients 1,4 --requests 2 --tokens 24 --rounds 1 --csv "$tmp/p.csv" \
    "$bin" -m "$model" --ctx 2048 -t 2 --parallel 4 --backend cpu >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc = 0 ] && ok "bench_ran" || bad bench_ran "rc $rc: $(tail -3 "$tmp/out" "$tmp/err")"
rows=$(grep -c '^[14],1,' "$tmp/p.csv" 2>/dev/null)
[ "$rows" = 2 ] && ok "csv_rows" || bad csv_rows "$(cat "$tmp/p.csv" 2>/dev/null)"
# 4 clients x 2 requests: the decode steps of the 4-client round hold
# more than one session on average (tokens > steps)
awk -F, '$1 == 4 && $8 > $9 && $3 > 0 {found = 1} END {exit !found}' "$tmp/p.csv" &&
    ok "four_clients_batched" || bad four_clients_batched "$(grep '^4,' "$tmp/p.csv")"
# the server's log agrees: 2 + 8 requests answered 200, plus the warm-up
n200=$(grep -c 'status=200' "$tmp/err")
[ "$n200" = 11 ] && ok "server_answered_all ($n200)" || bad server_answered_all "$n200 answered 200"
srv_result

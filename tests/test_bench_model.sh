#!/usr/bin/env bash
# test_bench_model.sh - ds4-bench's model mode end to end on a tiny
# synthetic model (tests/data/bench/synthetic-tiny.json, real tokenizer):
# the CSV (header, one row per frontier, ctx increasing, prefill_tokens the
# intervals, every number positive), the --plot SVG well-formed, --warmup
# (logged, the same rows after it), --host-pick against the pick on the
# backend (both run, the same picks), and usage
# errors (exit 2) / run errors (exit 1) with a message naming the cause.
# No timing is asserted.
set -u
BIN=${DS4_BIN_DIR:-.}
. tests/counters_lib.sh
TEXT=tests/data/bench/promessi_sposi.txt
HEADER="ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes,weight_bytes_per_token,roofline_tps"

"$BIN/ds4-quantize" --synthetic tests/data/bench/synthetic-tiny.json --out "$tmp/tiny.gguf" \
    --tokenizer tests/data/tokenizer/dsv4-vocab.gguf --quiet 2>"$tmp/err"
if [ ! -s "$tmp/tiny.gguf" ]; then
    bad "synthetic model: $(cat "$tmp/err")"; echo "RESULT $pass $fail $skip"; exit 1
fi

"$BIN/ds4-bench" -m "$tmp/tiny.gguf" --prompt-file "$TEXT" --ctx-start 32 --ctx-max 160 --step-mul 2 \
    --gen-tokens 4 --threads 2 --csv "$tmp/out.csv" --plot "$tmp/out.svg" 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] && ok run || bad "run: rc $rc $(cat "$tmp/err")"

[ "$(head -1 "$tmp/out.csv")" = "$HEADER" ] && ok csv_header || bad "csv_header: $(head -1 "$tmp/out.csv")"
# frontiers 32, 64, 128, 160: four rows of eight fields
awk -F, -v want="32 64 128 160" '
    NR == 1 { next }
    { split(want, w, " "); r = NR - 1
      if (NF != 8) { print "row " r ": " NF " fields"; bad = 1 }
      if ($1 != w[r]) { print "row " r ": ctx " $1 ", want " w[r]; bad = 1 }
      if ($2 != $1 - prev) { print "row " r ": prefill_tokens " $2 ", want " $1 - prev; bad = 1 }
      if ($4 != 4) { print "row " r ": gen_tokens " $4; bad = 1 }
      for (i = 1; i <= 8; i++) if (!($i + 0 > 0)) { print "row " r ": field " i " = " $i; bad = 1 }
      if ($6 + 0 <= kv) { print "row " r ": kvcache_bytes not growing"; bad = 1 }
      prev = $1; kv = $6 + 0; n++ }
    END { if (n != 4) { print n " rows, want 4"; bad = 1 } exit bad }' "$tmp/out.csv" >"$tmp/awk" \
    && ok csv_rows || bad "csv_rows: $(cat "$tmp/awk")"

if command -v xmllint >/dev/null; then
    xmllint --noout "$tmp/out.svg" 2>"$tmp/xerr" && ok svg_xml || bad "svg_xml: $(cat "$tmp/xerr")"
else
    # structural check: one root, as many closing as opening non-empty elements
    head -2 "$tmp/out.svg" | grep -q '<svg ' && tail -1 "$tmp/out.svg" | grep -q '^</svg>$' \
        && [ "$(grep -c '<text' "$tmp/out.svg")" = "$(grep -c '</text>' "$tmp/out.svg")" ] \
        && ok svg_structure || bad svg_structure
fi
grep -q 'polyline' "$tmp/out.svg" && grep -q 'roofline' "$tmp/out.svg" && ok svg_series || bad svg_series

# CSV on stdout when --csv is absent; step-incr walk 40, 50, 60
"$BIN/ds4-bench" -m "$tmp/tiny.gguf" --prompt-file "$TEXT" --ctx-start 40 --ctx-max 60 --step-incr 10 \
    --gen-tokens 2 --threads 1 --numerics hf >"$tmp/stdout.csv" 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] && [ "$(head -1 "$tmp/stdout.csv")" = "$HEADER" ] \
    && [ "$(tail -n +2 "$tmp/stdout.csv" | cut -d, -f1 | tr '\n' ' ')" = "40 50 60 " ] \
    && ok stdout_incr || bad "stdout_incr: rc $rc $(cat "$tmp/stdout.csv" "$tmp/err")"

# --batch-sessions: two more columns, the batch size and a positive aggregate
"$BIN/ds4-bench" -m "$tmp/tiny.gguf" --prompt-file "$TEXT" --ctx-start 40 --ctx-max 80 --step-mul 2 \
    --gen-tokens 3 --threads 1 --cpu --batch-sessions 3 >"$tmp/batch.csv" 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] && [ "$(head -1 "$tmp/batch.csv")" = "$HEADER,batch_sessions,batch_gen_tps" ] \
    && awk -F, 'NR > 1 { n++; if (NF != 10 || $9 != 3 || !($10 + 0 > 0)) bad = 1 } END { exit bad || n != 2 }' \
        "$tmp/batch.csv" && ok batch_sessions || bad "batch_sessions: rc $rc $(cat "$tmp/batch.csv" "$tmp/err")"

# --batch-loop: one more column, the same steps session by session, same picks
"$BIN/ds4-bench" -m "$tmp/tiny.gguf" --prompt-file "$TEXT" --ctx-start 40 --ctx-max 40 \
    --gen-tokens 3 --threads 1 --cpu --batch-sessions 2 --batch-loop >"$tmp/loop.csv" 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] && [ "$(head -1 "$tmp/loop.csv")" = "$HEADER,batch_sessions,batch_gen_tps,loop_gen_tps" ] \
    && awk -F, 'NR > 1 { n++; if (NF != 11 || $9 != 2 || !($10 + 0 > 0) || !($11 + 0 > 0)) bad = 1 } END { exit bad || n != 1 }' \
        "$tmp/loop.csv" && ! grep -q "other than the batched" "$tmp/err" \
    && ok batch_loop || bad "batch_loop: rc $rc $(cat "$tmp/loop.csv" "$tmp/err")"

# --host-pick (each step's row downloaded and picked on the host, the path
# before ds4_session_decode_pick) against the default with DS4_CPU_PICK=1
# (the CPU backend then takes the device path: the rows stay in the states,
# only the picks come back): both run, each loop picks what its batch
# picked, and the two batches pick as many distinct tokens at each frontier
for mode in host device; do
    if [ $mode = host ]; then set -- --host-pick; else set --; fi
    env $([ $mode = device ] && echo DS4_CPU_PICK=1) "$BIN/ds4-bench" -m "$tmp/tiny.gguf" --prompt-file "$TEXT" \
        --ctx-start 40 --ctx-max 80 --step-mul 2 --gen-tokens 4 --threads 1 --cpu --batch-sessions 3 --batch-loop \
        "$@" >"$tmp/pick_$mode.csv" 2>"$tmp/pick_$mode.err"
    echo $? >"$tmp/pick_$mode.rc"
done
[ "$(cat "$tmp/pick_host.rc") $(cat "$tmp/pick_device.rc")" = "0 0" ] \
    && ! grep -q "other than the batched" "$tmp/pick_host.err" "$tmp/pick_device.err" \
    && [ "$(grep -c 'distinct tokens per step' "$tmp/pick_device.err")" = 2 ] \
    && [ "$(grep 'distinct tokens per step' "$tmp/pick_host.err")" = "$(grep 'distinct tokens per step' "$tmp/pick_device.err")" ] \
    && ok host_pick || bad "host_pick: $(cat "$tmp/pick_host.rc" "$tmp/pick_device.rc" "$tmp/pick_host.err" "$tmp/pick_device.err")"

# --warmup: an untimed prefill step and decode first (logged), then the walk as without it
"$BIN/ds4-bench" -m "$tmp/tiny.gguf" --prompt-file "$TEXT" --ctx-start 40 --ctx-max 80 --step-incr 40 \
    --gen-tokens 2 --threads 1 --cpu --warmup >"$tmp/warm.csv" 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] && grep -q "warm-up (one prefill step and a decode, untimed)" "$tmp/err" \
    && [ "$(tail -n +2 "$tmp/warm.csv" | cut -d, -f1,2 | tr '\n' ' ')" = "40,40 80,40 " ] \
    && ok warmup || bad "warmup: rc $rc $(cat "$tmp/warm.csv" "$tmp/err")"

expect_rc() { # name want_rc grep_pattern args...
    local name=$1 want=$2 pat=$3; shift 3
    "$BIN/ds4-bench" "$@" >/dev/null 2>"$tmp/err"; local rc=$?
    [ $rc -eq "$want" ] && grep -q -- "$pat" "$tmp/err" && ok "$name" || bad "$name: rc $rc $(cat "$tmp/err")"
}
expect_rc no_prompt 2 "prompt-file" -m "$tmp/tiny.gguf"
expect_rc bad_step_mul 2 "step-mul" -m "$tmp/tiny.gguf" --prompt-file "$TEXT" --step-mul 0.5
expect_rc start_above_max 2 "ctx-start" -m "$tmp/tiny.gguf" --prompt-file "$TEXT" --ctx-start 300 --ctx-max 200
expect_rc ctx_too_small 2 "ctx" -m "$tmp/tiny.gguf" --prompt-file "$TEXT" --ctx-max 200 --gen-tokens 8 --ctx 100
expect_rc bad_batch 2 "batch-sessions" -m "$tmp/tiny.gguf" --prompt-file "$TEXT" --batch-sessions 0
expect_rc loop_without_batch 2 "batch-loop needs --batch-sessions" -m "$tmp/tiny.gguf" --prompt-file "$TEXT" --batch-loop
expect_rc bad_backend 2 "cpu or cuda" -m "$tmp/tiny.gguf" --prompt-file "$TEXT" --backend tpu
expect_rc unknown_option 2 "--frobnicate" -m "$tmp/tiny.gguf" --prompt-file "$TEXT" --frobnicate 1
printf 'Renzo' >"$tmp/short.txt"
expect_rc short_prompt 1 "ctx-max 64" -m "$tmp/tiny.gguf" --prompt-file "$tmp/short.txt" --ctx-start 32 --ctx-max 64
expect_rc missing_model 1 "$tmp/none.gguf" -m "$tmp/none.gguf" --prompt-file "$TEXT"
expect_rc prompt_is_dir 1 "not a regular file" -m "$tmp/tiny.gguf" --prompt-file "$tmp"
expect_rc missing_prompt 1 "$tmp/none.txt" -m "$tmp/tiny.gguf" --prompt-file "$tmp/none.txt"

echo "RESULT $pass $fail $skip"

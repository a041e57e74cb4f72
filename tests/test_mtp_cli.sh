#!/usr/bin/env bash
# test_mtp_cli.sh - speculative decoding through ds4 on the demo model:
# greedy output with --mtp (1..4 drafts) is byte-identical to plain
# decoding on the test prompts; bad --mtp files and flags are refused.
# The MTP block: models/ds4-demo-mtp.gguf (trained) when present, else
# the fixture block tests/data/mtp/demo-mtp.gguf.
set -u
D=${DS4_BIN_DIR:-.}
. tests/counters_lib.sh
M=models/ds4-demo.gguf
MTP=models/ds4-demo-mtp.gguf
if [ ! -f $M ] || [ ! -f $MTP ]; then echo "SKIP mtp_cli: $M or $MTP missing"; echo "RESULT 0 0 1"; exit 0; fi

prompts=("What is the capital of France?" "What is 12 + 7?"
         "Count from 1 to 5." "What is the opposite of hot?")
i=0
for p in "${prompts[@]}"; do
    i=$((i + 1))
    for mode in --nothink --think; do
        base=$("$D/ds4" -m $M -p "$p" $mode --temp 0 -n 48 -t 2 2>/dev/null)
        for nd in 1 3; do
            s=$("$D/ds4" -m $M -p "$p" $mode --temp 0 -n 48 -t 2 --mtp $MTP --mtp-draft $nd 2>"$tmp/err")
            [ -n "$base" ] && [ "$base" = "$s" ] && grep -q "ds4: mtp: .* drafts accepted" "$tmp/err" \
                && ok "greedy_same_p${i}${mode}_d$nd" || bad "greedy_same_p${i}${mode}_d$nd: '$base' vs '$s'"
        done
    done
done
# sampling runs and ends (the distribution is tested in test_mtp)
s=$("$D/ds4" -m $M -p "What is the capital of Italy?" --temp 0.7 --seed 3 -n 40 -t 2 --mtp $MTP 2>/dev/null); rc=$?
[ $rc -eq 0 ] && [ -n "$s" ] && ok sampling_runs || bad "sampling_runs: rc $rc"

"$D/ds4" -m $M -p x --mtp auto >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -ne 0 ] && grep -q "mtp.0.* is missing" "$tmp/err" && ok mtp_auto_missing || bad "mtp_auto_missing: $(cat "$tmp/err")"
head -c 4000 $MTP > "$tmp/cut.gguf"
"$D/ds4" -m $M -p x --mtp "$tmp/cut.gguf" >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -ne 0 ] && grep -q "cut.gguf" "$tmp/err" && ok mtp_truncated_file || bad "mtp_truncated_file: $(cat "$tmp/err")"
"$D/ds4" -m $M -p x --mtp-draft 2 >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 2 ] && grep -q "needs --mtp" "$tmp/err" && ok mtp_draft_without_mtp || bad mtp_draft_without_mtp
"$D/ds4" -m $M -p x --mtp $MTP --mtp-draft 0 >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 2 ] && grep -q "1..16" "$tmp/err" && ok mtp_draft_range || bad mtp_draft_range
# ds4-bench: the speculative probe's columns (tokens/s, acceptance)
"$D/ds4-bench" -m $M --prompt-file tests/data/bench/promessi_sposi.txt --ctx-start 64 --ctx-max 64 --gen-tokens 16 \
    -t 2 --mtp $MTP --mtp-draft 2 --csv "$tmp/b.csv" 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] && head -1 "$tmp/b.csv" | grep -q ",mtp_draft,mtp_gen_tps,mtp_accept,mtp_full_gen_tps,mtp_rb_us,mtp_full_rb_us$" \
    && awk -F, 'NR==2 { exit !($1 == 64 && $9 == 2 && $10 > 0 && $11 >= 0 && $11 <= 1 && $12 > 0 && $13 > 0 && $14 > 0) }' "$tmp/b.csv" \
    && ! grep -q "different drafts" "$tmp/err" \
    && ok bench_mtp_columns || bad "bench_mtp_columns: rc $rc $(cat "$tmp/b.csv" "$tmp/err" | tail -3)"
# the server takes --mtp (tests/node/mtp.test.mjs drives it); a missing
# block file stops it at start with the file named
"$D/ds4-server" -m $M --mtp "$tmp/none.gguf" --port 0 >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -ne 0 ] && grep -q "none.gguf" "$tmp/err" && ok server_mtp_missing_file || bad "server_mtp_missing_file: $(cat "$tmp/err")"
echo "RESULT $pass $fail 0"

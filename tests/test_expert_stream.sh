#!/usr/bin/env bash
# test_expert_stream.sh - expert streaming from the command line, as a user
# runs it (docs/STREAMING.md): on a Flash-shaped synthetic model with q2
# experts (tests/data/stream/flash-shaped.json: 6 experts per token, hash
# layers, sliding/CSA/HCA layers; generated here by ds4-quantize), the
# logits of `ds4 --ssd-streaming --ssd-streaming-cache-experts K
# --dump-logits` equal bit for bit those of the plain run, for K from one
# expert to every expert, for prefill, decode and both together, with both
# eviction policies; --expert-profile counts tokens x layers x 6 selections
# and merges; ds4-hotlist turns profiles into a hot list that preloads;
# bad values and malformed files fail with a message naming the cause.
set -u
BIN=${DS4_BIN_DIR:-.}
. tests/counters_lib.sh

"$BIN/ds4-quantize" --synthetic tests/data/stream/flash-shaped.json --out "$tmp/m.gguf" --quiet --threads 2 \
    2>"$tmp/err"
if [ ! -s "$tmp/m.gguf" ]; then
    bad "synthetic model: $(cat "$tmp/err")"; echo "RESULT $pass $fail $skip"; exit 1
fi
L=5; E=32; K=6; N=40
seq 1000 37 $((1000 + 37 * (N - 1))) | tr '\n' ' ' > "$tmp/ids"
dump() { "$BIN/ds4" -m "$tmp/m.gguf" --token-ids "$tmp/ids" --cpu --threads 2 --prefill-chunk 8 "$@"; }

# 1. bit-identical logits at every budget; prefill only, decode only, both
for from in 40 1 20; do
    dump --decode-from $from --dump-logits "$tmp/ref$from" 2>/dev/null || bad "plain run (decode from $from)"
done
all_same=1; detail=""
check() { # budget decode_from policy
    if ! dump --decode-from $2 --dump-logits "$tmp/s" --ssd-streaming --ssd-streaming-cache-experts $1 \
            --ssd-streaming-evict $3 2>"$tmp/err"; then
        all_same=0; detail="$detail [K=$1 from=$2 $3 failed: $(tail -1 "$tmp/err")]"
    elif ! cmp -s "$tmp/s" "$tmp/ref$2"; then
        all_same=0; detail="$detail [K=$1 from=$2 $3 differs]"
    fi
}
# every budget on the mixed schedule (prefill in chunks, then decode) ...
for budget in 1 $L $((L * K)) 80 $((L * E)); do check $budget 20 lru; done
for budget in 1 $((L * K)); do check $budget 20 freq; done
# ... and the smallest budgets on pure prefill and pure decode
for budget in 1 $L; do check $budget 40 lru; check $budget 1 freq; done
[ $all_same = 1 ] && ok stream_logits_identical_all_budgets || bad "stream_logits_identical_all_budgets:$detail"

# 2. the small cache reads from the file (misses reported) and warns in GiB
dump --dump-logits "$tmp/s" --ssd-streaming --ssd-streaming-cache-experts 3 2>"$tmp/err"
if grep -q "under twice one token's routed working set" "$tmp/err" && grep -q "GiB" "$tmp/err" &&
   grep -Eq "[1-9][0-9]* misses" "$tmp/err"; then ok stream_warns_small_cache
else bad "stream_warns_small_cache: $(cat "$tmp/err")"; fi
dump --dump-logits "$tmp/s" --ssd-streaming --ssd-streaming-cache-experts 100 2>"$tmp/err"
grep -q "under twice" "$tmp/err" && bad "stream_no_warning_large_cache: $(cat "$tmp/err")" || ok stream_no_warning_large_cache
# a budget in GiB: 0.01 GiB holds every expert of this small model
dump --dump-logits "$tmp/s" --ssd-streaming --ssd-streaming-cache-experts 0.003GB 2>"$tmp/err" &&
    cmp -s "$tmp/s" "$tmp/ref40" && ok stream_budget_in_gb || bad "stream_budget_in_gb: $(tail -2 "$tmp/err")"

# 3. bad values: clear errors, non-zero exit
expect_err() { # name, grep pattern, args...
    local name=$1 pat=$2; shift 2
    if dump --dump-logits "$tmp/s" "$@" 2>"$tmp/err"; then bad "$name: accepted"
    elif grep -q -- "$pat" "$tmp/err"; then ok "$name"
    else bad "$name: message [$(cat "$tmp/err")]"; fi
}
expect_err stream_budget_zero "at least 1 expert" --ssd-streaming --ssd-streaming-cache-experts 0
expect_err stream_budget_zero_gb "above 0" --ssd-streaming --ssd-streaming-cache-experts 0GB
expect_err stream_budget_too_big "more than the model's 160 routed experts" --ssd-streaming --ssd-streaming-cache-experts 161
expect_err stream_budget_too_big_gb "more than the model" --ssd-streaming --ssd-streaming-cache-experts 2GB
expect_err stream_budget_garbage "ssd-streaming-cache-experts" --ssd-streaming --ssd-streaming-cache-experts 12QB
expect_err stream_budget_fraction "whole number" --ssd-streaming --ssd-streaming-cache-experts 2.5
expect_err stream_budget_negative "ssd-streaming-cache-experts" --ssd-streaming --ssd-streaming-cache-experts -4
expect_err stream_needs_flag "needs --ssd-streaming" --ssd-streaming-cache-experts 4
expect_err stream_bad_policy "lru or freq" --ssd-streaming --ssd-streaming-evict mru
expect_err numa_bad_mode "off or interleave" --numa spread
expect_err stream_bad_preload "ssd-streaming-preload-experts" --ssd-streaming --ssd-streaming-preload-experts x
printf 'ds4-expert-hotlist 1 layers 5 experts 32\n1 2\n1 32\n' > "$tmp/badhot"
expect_err stream_malformed_hotlist "line 3" --ssd-streaming --ssd-streaming-hotlist "$tmp/badhot"
printf 'ds4-expert-profile 1 layers 5 experts 32\n1 2 x\n' > "$tmp/badprof"
expect_err stream_malformed_profile "line 2" --expert-profile "$tmp/badprof"
grep -q "1 2 x" "$tmp/badprof" && ok stream_malformed_profile_untouched || bad stream_malformed_profile_untouched

# 4. profiles: N tokens x L layers x K experts selections, merged run after run
dump --dump-logits "$tmp/s" --expert-profile "$tmp/prof" 2>/dev/null
sum_prof() { awk '/^[0-9]+ [0-9]+ [0-9]+$/ { s += $3 } END { print s + 0 }' "$1"; }
t1=$(sum_prof "$tmp/prof")
[ "$t1" = $((N * L * K)) ] && ok profile_counts || bad "profile_counts: $t1, expected $((N * L * K))"
dump --dump-logits "$tmp/s" --expert-profile "$tmp/prof" --ssd-streaming --ssd-streaming-cache-experts 20 2>/dev/null
t2=$(sum_prof "$tmp/prof")
[ "$t2" = $((2 * N * L * K)) ] && ok profile_merges || bad "profile_merges: $t2"

# 5. ds4-hotlist: profile -> hot list, hottest first; it preloads
"$BIN/ds4-hotlist" --top 25 -o "$tmp/hot" "$tmp/prof" 2>"$tmp/err" || bad "hotlist_tool: $(cat "$tmp/err")"
n=$(grep -cE '^[0-9]+ [0-9]+$' "$tmp/hot")
first=$(grep -E '^[0-9]+ [0-9]+$' "$tmp/hot" | head -1)
max=$(awk '/^[0-9]+ [0-9]+ [0-9]+$/ { if ($3 > m) m = $3 } END { print m }' "$tmp/prof")
top=$(awk -v k="$first" '/^[0-9]+ [0-9]+ [0-9]+$/ && ($1 " " $2) == k { print $3 }' "$tmp/prof")
[ "$n" = 25 ] && [ "$top" = "$max" ] && ok hotlist_tool_ranks || bad "hotlist_tool_ranks: $n entries, first $first ($top vs max $max)"
dump --dump-logits "$tmp/s" --ssd-streaming --ssd-streaming-cache-experts 60 --ssd-streaming-hotlist "$tmp/hot" \
    --ssd-streaming-preload-experts 20 2>"$tmp/err"
grep -q "20 preloaded" "$tmp/err" && cmp -s "$tmp/s" "$tmp/ref40" && ok hotlist_preloads ||
    bad "hotlist_preloads: $(tail -1 "$tmp/err")"
dump --dump-logits "$tmp/s" --ssd-streaming --ssd-streaming-cache-experts 60 --ssd-streaming-hotlist "$tmp/hot" \
    --ssd-streaming-cold 2>"$tmp/err"
grep -q " 0 preloaded" "$tmp/err" && ok hotlist_cold || bad "hotlist_cold: $(tail -1 "$tmp/err")"
"$BIN/ds4-hotlist" -o "$tmp/h2" "$tmp/badprof" 2>"$tmp/err" && bad hotlist_tool_bad_profile ||
    { grep -q "line 2" "$tmp/err" && ok hotlist_tool_bad_profile || bad "hotlist_tool_bad_profile: $(cat "$tmp/err")"; }

# 6. the chat command takes the flags too (and --help lists them)
help=$("$BIN/ds4" --help)
miss=""
for f in --ssd-streaming --ssd-streaming-cache-experts --ssd-streaming-preload-experts --ssd-streaming-cold \
         --ssd-streaming-hotlist --ssd-streaming-evict --expert-profile; do
    grep -q -- "$f" <<<"$help" || miss="$miss $f"
done
[ -z "$miss" ] && ok stream_help || bad "stream_help: missing$miss"

echo "RESULT $pass $fail $skip"

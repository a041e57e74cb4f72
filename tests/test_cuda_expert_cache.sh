#!/usr/bin/env bash
# test_cuda_expert_cache.sh - the CUDA VRAM expert cache from the command
# line, as a user runs it (docs/STREAMING.md "CUDA"): on a Flash-shaped
# synthetic model whose routed experts have Flash's matrix shapes and q2
# types (tests/data/stream/flash-experts.json, generated here by
# ds4-quantize), `ds4 --cuda --gpu-expert-cache K --dump-logits` equals bit
# for bit the same CUDA build without the cache, for K from one token's
# experts of a layer to every expert, prefill only, decode only and both,
# both eviction policies; the cache reports hits and misses; bad values
# fail with a message naming the cause (these run without a GPU too). The
# exactness part skips, saying why, without a GPU or a CUDA build.
set -u
BIN=${DS4_BIN_DIR:-.}
pass=0; fail=0; skip=0
ok()  { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
skp() { echo "SKIP $1"; skip=$((skip + 1)); }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

"$BIN/ds4-quantize" --synthetic tests/data/stream/flash-experts.json --experts q2 --out "$tmp/m.gguf" --quiet \
    --threads 2 2>"$tmp/err"
if [ ! -s "$tmp/m.gguf" ]; then
    bad "synthetic model: $(cat "$tmp/err")"; echo "RESULT $pass $fail $skip"; exit 1
fi
L=3; E=8; K=6; N=24
seq 3 37 $((3 + 37 * (N - 1))) | tr '\n' ' ' > "$tmp/ids"
dump() { "$BIN/ds4" -m "$tmp/m.gguf" --token-ids "$tmp/ids" --cuda --prefill-chunk 8 "$@"; }

# 1. bad values: clear errors, non-zero exit (sizing happens before any GPU work)
expect_err() { # name, grep pattern, args...
    local name=$1 pat=$2; shift 2
    if dump --dump-logits "$tmp/s" "$@" 2>"$tmp/err"; then bad "$name: accepted"
    elif grep -q -- "$pat" "$tmp/err"; then ok "$name"
    else bad "$name: message [$(cat "$tmp/err")]"; fi
}
expect_err gpu_cache_zero "at least 1 expert" --gpu-expert-cache 0
expect_err gpu_cache_zero_gb "above 0" --gpu-expert-cache 0GB
expect_err gpu_cache_under_a_token "under one token's 6 experts of a layer" --gpu-expert-cache 5
expect_err gpu_cache_too_big "more than the model's 24 routed experts" --gpu-expert-cache 25
expect_err gpu_cache_too_big_gb "more than the model" --gpu-expert-cache 2GB
expect_err gpu_cache_garbage "gpu-expert-cache" --gpu-expert-cache 12QB
expect_err gpu_cache_missing "needs a value" --gpu-expert-cache
expect_err gpu_cache_not_with_ssd "exclude each other" --gpu-expert-cache 10 --ssd-streaming
expect_err gpu_cache_cpu_size_flag "the GPU cache's size is --gpu-expert-cache" --ssd-streaming-cache-experts 10
printf 'ds4-expert-hotlist 1 layers 3 experts 8\n1 2\n1 8\n' > "$tmp/badhot"
expect_err gpu_cache_malformed_hotlist "line 3" --gpu-expert-cache 10 --ssd-streaming-hotlist "$tmp/badhot"
help=$("$BIN/ds4" --help)
grep -q -- --gpu-expert-cache <<<"$help" && ok gpu_cache_help || bad gpu_cache_help

# 2. bit-identical logits at every budget, on a GPU
if ! dump --decode-from $N --dump-logits "$tmp/ref$N" 2>"$tmp/err"; then
    skp "gpu_cache_logits_identical: no CUDA run here ($(tail -1 "$tmp/err"))"
    echo "RESULT $pass $fail $skip"; exit $((fail > 0))
fi
for from in 1 12; do
    dump --decode-from $from --dump-logits "$tmp/ref$from" 2>/dev/null || bad "plain CUDA run (decode from $from)"
done
all_same=1; detail=""
check() { # budget decode_from policy
    if ! dump --decode-from $2 --dump-logits "$tmp/s" --gpu-expert-cache $1 --ssd-streaming-evict $3 2>"$tmp/err"
    then
        all_same=0; detail="$detail [K=$1 from=$2 $3 failed: $(tail -1 "$tmp/err")]"
    elif ! cmp -s "$tmp/s" "$tmp/ref$2"; then
        all_same=0; detail="$detail [K=$1 from=$2 $3 differs]"
    fi
}
for budget in $K $((L * K - 1)) 12 $((L * E - 1)) $((L * E)); do check $budget 12 lru; done
for budget in $K $((L * E / 2)); do check $budget 12 freq; done
for budget in $K 9; do check $budget $N freq; check $budget 1 lru; done
[ $all_same = 1 ] && ok gpu_cache_logits_identical || bad "gpu_cache_logits_identical:$detail"

# 2b. seeded from a hot list (copied in at start): same logits, reported as preloaded
printf 'ds4-expert-hotlist 1 layers 3 experts 8\n0 1\n1 2\n2 3\n0 4\n1 5\n2 6\n' > "$tmp/hot"
dump --decode-from 12 --dump-logits "$tmp/s" --gpu-expert-cache 9 --ssd-streaming-hotlist "$tmp/hot" 2>"$tmp/err"
if cmp -s "$tmp/s" "$tmp/ref12" && grep -q "misses [0-9]* (hit rate [0-9.]*%), 4 preloaded" "$tmp/err"; then
    ok gpu_cache_hotlist_preload
else bad "gpu_cache_hotlist_preload: $(grep -h 'expert cache' "$tmp/err")"; fi

# 3. the cache reports its work: a small one misses and copies
dump --dump-logits "$tmp/s" --gpu-expert-cache 7 2>"$tmp/err"
if grep -Eq "cuda expert cache: 7 slots .* misses [1-9]" "$tmp/err" && grep -q "under twice" "$tmp/err"; then
    ok gpu_cache_reports
else bad "gpu_cache_reports: $(cat "$tmp/err")"; fi
echo "RESULT $pass $fail $skip"

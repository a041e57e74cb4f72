#!/usr/bin/env bash
# test_cuda_prefetch.sh - the prefetch hint (backend/ops.h; CUDA:
# backend/cuda/cuda_l2_prefetch.cu) moves weights into L2 and nothing
# else: on a Flash-shaped synthetic model whose routed experts have
# Flash's matrix shapes (tests/data/stream/flash-experts.json, so one
# token's experts take the kernels the hint runs beside), `ds4 --cuda
# --dump-logits` gives bit for bit the logits of the same build with the
# hints off (DS4_CUDA_L2PF=0), with a 1 MB budget (each hint cut short),
# with the experts' hint alone off, and with the VRAM expert cache (the
# experts at pool slots), prefill only and decode (the replayed graph);
# the per-op profile shows the hint ran once per site and layer with it
# on and never with it off. Skips, saying why, without a GPU or a CUDA
# build.
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
N=24
seq 3 37 $((3 + 37 * (N - 1))) | tr '\n' ' ' > "$tmp/ids"
dump() { "$BIN/ds4" -m "$tmp/m.gguf" --token-ids "$tmp/ids" --cuda --prefill-chunk 8 "$@"; }

if ! DS4_CUDA_L2PF=0 dump --decode-from 12 --dump-logits "$tmp/off12" 2>"$tmp/err"; then
    skp "prefetch_logits_identical: no CUDA run here ($(tail -1 "$tmp/err"))"
    echo "RESULT $pass $fail $skip"; exit 0
fi
DS4_CUDA_L2PF=0 dump --decode-from $N --dump-logits "$tmp/off$N" 2>/dev/null || bad "hints off, prefill only"
all_same=1; detail=""
check() { # name decode_from env... [-- ds4 args]
    local name=$1 from=$2; shift 2
    local envs=() args=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
    [ $# -gt 0 ] && shift && args=("$@")
    if ! env "${envs[@]}" "$BIN/ds4" -m "$tmp/m.gguf" --token-ids "$tmp/ids" --cuda --prefill-chunk 8 \
        --decode-from "$from" --dump-logits "$tmp/s" "${args[@]}" 2>"$tmp/err"; then
        all_same=0; detail="$detail [$name from $from failed: $(tail -1 "$tmp/err")]"
    elif ! cmp -s "$tmp/s" "$tmp/off$from"; then
        all_same=0; detail="$detail [$name from $from differs]"
    fi
}
for from in 12 $N; do
    check default $from DS4_CUDA_L2PF=1
    check budget1mb $from DS4_CUDA_L2PF_MB=1
    check experts_off $from DS4_CUDA_L2PF_EXP=0
    check vram_cache $from DS4_CUDA_L2PF=1 -- --gpu-expert-cache 9
done
[ $all_same = 1 ] && ok prefetch_logits_identical || bad "prefetch_logits_identical:$detail"

# the hint runs: 3 layers x 4 sites a step (Q path, o_a, router, shared
# expert) in the per-op profile; none with DS4_CUDA_L2PF=0
calls() { awk '$1 == "prefetch" { print $2 }' "$1"; }
DS4_CUDA_PROFILE=1 dump --decode-from 12 --dump-logits "$tmp/s" 2>"$tmp/prof_on" >/dev/null
DS4_CUDA_PROFILE=1 DS4_CUDA_L2PF=0 dump --decode-from 12 --dump-logits "$tmp/s" 2>"$tmp/prof_off" >/dev/null
on=$(calls "$tmp/prof_on"); off=$(calls "$tmp/prof_off")
# 12 decoded tokens + prefill chunks of 8 (T <= 16 takes the hint too)
if [ -n "$on" ] && [ $((on % 12)) = 0 ] && [ "$on" -ge $((12 * 12)) ] && [ -z "$off" ]; then
    ok prefetch_hint_runs
else bad "prefetch_hint_runs: $on calls with the hints on, '${off}' off"; fi
echo "RESULT $pass $fail $skip"
exit $((fail > 0))

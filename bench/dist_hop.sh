#!/usr/bin/env bash
# dist_hop.sh - what a decode step pays for going through ranks
# (docs/DISTRIBUTED.md "Measured"). On the tiny-a golden model (6 layers,
# converted here; compute per token is a fraction of a millisecond, so the
# messages dominate) it times `ds4 --dump-logits` over N tokens as N decode
# steps and as one prefill, for 1, 2 and 3 ranks (--threads 1 each); the
# difference over N is the cost of a decode step beyond the prefill. Per
# step, 2 ranks add one stream hop plus the logits' hop back; each further
# rank adds one stream hop. Prints ranks,step_ms and the two differences.
#
# usage: bench/dist_hop.sh [N=400] [ROUNDS=3]
set -eu
n=${1:-400} rounds=${2:-3}
BIN=${DS4_BIN_DIR:-.}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$BIN/ds4-quantize" --hf tests/data/dsv4-tiny-a --out "$tmp/m.gguf" --type f32 --experts f32 >/dev/null 2>&1
python3 -c "
import json; t = json.load(open('tests/data/dsv4-tiny-a/manifest.json'))['sequences'][0]['tokens']
print(' '.join(map(str, (t * 4)[:$n])))" > "$tmp/ids"
run() { # ranks decode_from -> seconds
    local pre=()
    [ "$1" -gt 1 ] && pre=(mpirun --oversubscribe --bind-to none -np "$1")
    local s e
    s=$(date +%s.%N)
    "${pre[@]}" "$BIN/ds4" -m "$tmp/m.gguf" --token-ids "$tmp/ids" --threads 1 --decode-from "$2" \
        --prefill-chunk "$n" --dump-logits "$tmp/out" 2>/dev/null
    e=$(date +%s.%N)
    echo "$e - $s" | bc -l
}
echo "ranks,step_ms"
for r in $(seq 1 "$rounds"); do
    for ranks in 1 2 3; do
        a=$(run $ranks 1); b=$(run $ranks "$n")
        printf '%d,%.3f\n' "$ranks" "$(echo "($a - $b) * 1000 / ($n - 1)" | bc -l)"
    done
done | tee "$tmp/steps.csv"
awk -F, 'NR > 0 { s[$1] += $2; c[$1]++ } END {
    for (k in s) m[k] = s[k] / c[k]
    printf "mean step: 1 process %.3f ms, 2 ranks %.3f ms, 3 ranks %.3f ms\n", m[1], m[2], m[3]
    printf "2 ranks - 1 process (one stream hop + the logits back): %.3f ms; 3 - 2 ranks (one stream hop): %.3f ms\n", m[2] - m[1], m[3] - m[2] }' "$tmp/steps.csv"

#!/usr/bin/env bash
# dist_hop.sh - what a decode step pays for going through ranks
# (docs/DISTRIBUTED.md "Measured"). On the demo model (6 layers, 18 M
# parameters: a decode step computes in a fraction of a millisecond, so
# the messages show) ds4-bench times GEN greedy decode steps after a
# 64-token prompt, over 1, 2 and 3 ranks (--threads 1 each), ROUNDS times
# in turn. Per step, 2 ranks add one stream hop plus the logits' hop back
# (n_vocab floats); each further rank adds one stream hop. Prints
# round,ranks,step_ms, then the means and the differences.
#
# usage: bench/dist_hop.sh [GEN=300] [ROUNDS=3]
set -eu
gen=${1:-300} rounds=${2:-3}
BIN=${DS4_BIN_DIR:-.}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
B=("$BIN/ds4-bench" -m models/ds4-demo.gguf --prompt-file tests/data/bench/promessi_sposi.txt --threads 1
   --ctx-start 64 --ctx-max 64 --gen-tokens "$gen")
echo "round,ranks,step_ms"
for r in $(seq 1 "$rounds"); do
    for ranks in 1 2 3; do
        pre=()
        [ "$ranks" -gt 1 ] && pre=(mpirun --oversubscribe --bind-to none -np "$ranks")
        "${pre[@]}" "${B[@]}" --csv "$tmp/o.csv" 2>/dev/null
        tail -1 "$tmp/o.csv" | awk -F, -v r="$r" -v n="$ranks" '{ printf "%d,%d,%.3f\n", r, n, 1000 / $5 }'
    done
done | tee "$tmp/steps.csv"
awk -F, '{ s[$2] += $3; c[$2]++ } END {
    for (k in s) m[k] = s[k] / c[k]
    printf "mean step: 1 process %.3f ms, 2 ranks %.3f ms, 3 ranks %.3f ms\n", m[1], m[2], m[3]
    printf "2 ranks - 1 process (one stream hop + the logits back): %.3f ms; 3 - 2 ranks (one stream hop): %.3f ms\n", m[2] - m[1], m[3] - m[2] }' "$tmp/steps.csv"

#!/usr/bin/env bash
# dist_bench.sh - distributed runs against one process, same run, same
# machine (docs/DISTRIBUTED.md "Measured"). For each round, in turn:
# ds4-bench over 1 process, then over 2 ranks (mpirun), every process with
# --threads 1, on the model given (a Flash-shaped synthetic file, see the
# doc), a prompt of PROMPT tokens prefilled in micro-chunks of CHUNK
# tokens, then GEN decode steps. Prints one CSV row per run:
#   round,ranks,prefill_tps,gen_tps
# and the ratios (2 ranks / 1 process) of each round at the end.
#
# LAYERS="0:2 2:4" gives the two ranks their layers (MPMD); without it
# the automatic split by bytes (which puts the embedding's bytes with rank
# 0, so it balances memory, not the prefill's compute).
#
# usage: [LAYERS="A:B B:C"] bench/dist_bench.sh MODEL.gguf [PROMPT=256] [CHUNK=32] [GEN=8] [ROUNDS=2]
set -eu
model=$1 prompt=${2:-256} chunk=${3:-32} gen=${4:-8} rounds=${5:-2}
layers=${LAYERS:-}
BIN=${DS4_BIN_DIR:-.}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
B=("$BIN/ds4-bench" -m "$model" --prompt-file tests/data/bench/promessi_sposi.txt --threads 1
   --prefill-chunk "$chunk" --ctx-start "$prompt" --ctx-max "$prompt" --gen-tokens "$gen")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "round,ranks,prefill_tps,gen_tps"
for r in $(seq 1 "$rounds"); do
    "${B[@]}" --csv "$tmp/one.csv" 2>/dev/null
    if [ -n "$layers" ]; then
        set -- $layers
        mpirun --oversubscribe --bind-to none -np 1 "${B[@]}" --csv "$tmp/two.csv" --layers "$1" : \
            -np 1 "${B[@]}" --csv "$tmp/two.csv" --layers "$2" 2>/dev/null
    else
        mpirun --oversubscribe --bind-to none -np 2 "${B[@]}" --csv "$tmp/two.csv" 2>/dev/null
    fi
    for f in one two; do
        n=$([ $f = one ] && echo 1 || echo 2)
        tail -1 "$tmp/$f.csv" | awk -F, -v r="$r" -v n="$n" '{print r "," n "," $3 "," $5}'
    done | tee -a "$tmp/all.csv"
done
awk -F, '{ if ($2 == 1) { p = $3; g = $4 } else printf "round %d: 2 ranks / 1 process: prefill %.2fx, decode %.2fx\n", $1, $3 / p, $4 / g }' "$tmp/all.csv"

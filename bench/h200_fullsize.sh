#!/usr/bin/env bash
# h200_fullsize.sh - the full-size benchmark: synthetic Flash q2 (~81 GiB,
# every published tensor name, type and shape), resident on one GPU, walked
# with ds4-bench over the standard text to context frontiers.
#
#   bench/h200_fullsize.sh OUTDIR              # frontiers 2048..65536 step 2048
#   CTX_START=2048 CTX_MAX=16384 bench/h200_fullsize.sh OUTDIR   # a shorter walk
#   BATCH=16 bench/h200_fullsize.sh OUTDIR     # also 16 sessions decoded at once
#     (LOOP=1 adds --batch-loop: the same steps one session after the other.
#     The CUDA sessions share one device copy of the weights, so the batch
#     costs only its sessions' KV state and activations; docs/CUDA.md)
#   WARMUP=1 bench/h200_fullsize.sh OUTDIR    # ds4-bench --warmup: an untimed prefill
#     step and decode first, so the first row leaves out the process's one-time costs
#   smoke test of the script itself on any machine (a 1-layer file):
#   BIG_TMP=/tmp NEED_GIB=1 SYNTH_ARGS="--layers 1 --n-experts 8" CTX_START=64 \
#     CTX_MAX=128 STEP=64 GEN=4 bench/h200_fullsize.sh /tmp/fs-out
#
# Needs ./ds4-quantize and ./ds4-bench built (make, or on a GPU machine
# without the Debian -dev packages: bench/h200_pack.sh here, then
# bench/h200_run.sh full there, which links them into place). The file goes to a RAM filesystem
# ($BIG_TMP, default /dev/shm): /dev/shm is half the RAM by default (64 GiB on
# a 128 GiB machine), so it is grown when it is too small and we are root.
# Writes OUTDIR/flash-q2.csv, OUTDIR/flash-q2.svg and the logs.
set -euo pipefail
out=${1:-bench-fullsize}
mkdir -p "$out"
model=$(bench/h200_synth_model.sh "$out")
args=(-m "$model" --prompt-file tests/data/bench/promessi_sposi.txt
      --ctx-start "${CTX_START:-2048}" --ctx-max "${CTX_MAX:-65536}" --step-incr "${STEP:-2048}"
      --gen-tokens "${GEN:-128}" --csv "$out/flash-q2.csv" --plot "$out/flash-q2.svg")
[ -n "${PREFILL_CHUNK:-}" ] && args+=(--prefill-chunk "$PREFILL_CHUNK")
[ -n "${BATCH:-}" ] && args+=(--batch-sessions "$BATCH")
[ -n "${BATCH:-}" ] && [ -n "${LOOP:-}" ] && args+=(--batch-loop)
[ -n "${WARMUP:-}" ] && args+=(--warmup)
[ -n "${HOST_PICK:-}" ] && args+=(--host-pick)
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1 || true
./ds4-bench "${args[@]}" 2>&1 | tee "$out/bench.log"

#!/usr/bin/env bash
# tp_compare.sh - tensor parallel vs one device in the same run
# (docs/TENSOR-PARALLEL.md): the synthetic full-size Flash (q2 and q4 routed
# experts) walked by ds4-bench over the standard text at context frontiers
# 2K..32K, first on one device, then with --tensor-parallel N, then both with
# 16 sessions decoded at once; writes the CSVs and a ratio table.
#
#   bench/tp_compare.sh OUTDIR                      # a 2-GPU CUDA machine
#   N=4 GPUS=0,1,2,3 bench/tp_compare.sh OUTDIR     # 4 GPUs
#   TYPES=q2 bench/tp_compare.sh OUTDIR             # q2 only (q4 needs 153 GiB per run)
#   smoke test on the CPU backend (1-layer files, a short walk; ~1 min here):
#   BACKEND=--cpu BIG_TMP=/tmp SYNTH_ARGS="--layers 1 --n-experts 8" CTX_START=64 \
#     CTX_MAX=128 GEN=4 BATCH=3 bench/tp_compare.sh /tmp/tpc
#
# OUTDIR gets flash-TYPE-{one,tpN}.csv (+ -batch for the 16-session walk),
# ratio-TYPE.csv (ctx, prefill and decode tokens/s of N ranks over one
# device, and the batched aggregate's) and the logs. Needs ./ds4-quantize
# and ./ds4-bench. The file goes to a RAM filesystem ($BIG_TMP, default
# /dev/shm), as bench/h200_fullsize.sh does.
set -euo pipefail
out=${1:-bench-tp}
mkdir -p "$out"
tmp=${BIG_TMP:-/dev/shm}
n=${N:-2}
gpus=${GPUS:-$(seq -s, 0 $((n - 1)))}
backend=${BACKEND:---cuda}
dev=()
[ "$backend" = "--cuda" ] && dev=(--gpu-devices "$gpus")
for type in ${TYPES:-q2 q4}; do
    model=$tmp/ds4-flash-$type-synthetic.gguf
    if [ ! -s "$model" ]; then
        ./ds4-quantize --synthetic flash --experts "$type" ${SYNTH_ARGS:-} --out "$model" \
            --tokenizer tests/data/tokenizer/dsv4-vocab.gguf 2>&1 | tee "$out/quantize-$type.log"
    fi
    walk=(-m "$model" --prompt-file tests/data/bench/promessi_sposi.txt "$backend"
          --ctx-start "${CTX_START:-2048}" --ctx-max "${CTX_MAX:-32768}" --step-mul 2 --gen-tokens "${GEN:-64}")
    run() { # run NAME ARGS...: one ds4-bench walk into OUTDIR/flash-TYPE-NAME.csv
        local name=$1; shift
        ./ds4-bench "${walk[@]}" "$@" --csv "$out/flash-$type-$name.csv" 2>&1 | tee "$out/bench-$type-$name.log"
    }
    run one
    run "tp$n" --tensor-parallel "$n" "${dev[@]}"
    run one-batch --batch-sessions "${BATCH:-16}"
    run "tp$n-batch" --batch-sessions "${BATCH:-16}" --tensor-parallel "$n" "${dev[@]}"
    # ratio of N ranks over one device, frontier by frontier (the walks have
    # the same frontiers in the same order; columns of ds4-bench's CSV:
    # 1 ctx_tokens, 3 prefill_tps, 5 gen_tps, 10 batch_gen_tps)
    { echo "ctx_tokens,prefill_ratio,decode_ratio,batch_decode_ratio"
      paste -d, "$out/flash-$type-one.csv" "$out/flash-$type-tp$n.csv" "$out/flash-$type-one-batch.csv" \
          "$out/flash-$type-tp$n-batch.csv" | tail -n +2 |
          awk -F, -v w1=8 -v w2=8 -v w3=10 '{ a = 0; b = w1; c = w1 + w2; d = c + w3
              if ($1 != $(b + 1) || $1 != $(c + 1) || $1 != $(d + 1)) { print "frontiers differ: " $0 > "/dev/stderr"; exit 1 }
              printf "%s,%.3f,%.3f,%.3f\n", $1, $(b + 3) / $3, $(b + 5) / $5, $(d + 10) / $(c + 10) }'
    } >"$out/ratio-$type.csv"
    echo "tp_compare: $type, $n ranks over one device:"; cat "$out/ratio-$type.csv"
done

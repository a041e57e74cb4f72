#!/usr/bin/env bash
# h200_stream.sh - the VRAM expert cache on the full-size synthetic Flash q2
# (80.8 GiB; the file bench/h200_fullsize.sh writes to /dev/shm): ds4-bench
# at one context frontier with every routed expert resident (the baseline),
# then with --gpu-expert-cache of each budget in $BUDGETS (default "64GB
# 40GB": a 141 GB H200 simulating 80 and 48-64 GB cards), and the
# host->device copy bandwidth measured in the same run (cudaMemcpy from
# pinned and pageable memory: the roofline of the copies). Writes
# OUTDIR/stream.csv:
#   config,cache_gib,prefill_tps,decode_tps,decode_vs_resident,hit_rate,gib_copied,
#   pcie_pinned_gbs,copy_bound_decode_tps,pinned_weights
# copy_bound_decode_tps = pinned bandwidth / (miss rate x one token's routed
# bytes): the decode speed if copies were the only cost (the miss rate is the
# run's, prefill included, so it is a rough bound). Then OUTDIR/*.log.
#
#   bench/h200_stream.sh OUTDIR
#   CTX=1024 GEN=32 BUDGETS="64GB 40GB" bench/h200_stream.sh OUTDIR
#   smoke test of the script on any CUDA machine (a 2-layer file):
#   BIG_TMP=/tmp NEED_GIB=1 SYNTH_ARGS="--layers 2 --n-experts 16" BUDGETS="20" CTX=64 GEN=4 \
#     bench/h200_stream.sh /tmp/st-out
#
# Needs ./ds4-quantize and ./ds4-bench (bench/h200_run.sh stream links them).
set -euo pipefail
out=${1:-bench-stream}
mkdir -p "$out"
model=$(bench/h200_synth_model.sh "$out")
ctx=${CTX:-1024}
args=(-m "$model" --prompt-file tests/data/bench/promessi_sposi.txt --cuda
      --ctx-start "$ctx" --ctx-max "$ctx" --step-incr "$ctx" --gen-tokens "${GEN:-32}")
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt" 2>&1 || true
csv=$out/stream.csv
echo "config,cache_gib,prefill_tps,decode_tps,decode_vs_resident,hit_rate,gib_copied,pcie_pinned_gbs,copy_bound_decode_tps,pinned_weights" > "$csv"
field() { # CSV file, column name -> value of the last row
    awk -F, -v c="$2" '/^#/ {next} NR0 == 0 {for (i = 1; i <= NF; i++) if ($i == c) k = i; NR0 = 1; next} {v = $k} END {print v}' "$1"
}
base_dec=""
for cfg in resident ${BUDGETS:-64GB 40GB}; do
    extra=()
    [ "$cfg" != resident ] && extra=(--gpu-expert-cache "$cfg")
    log=$out/$cfg.log
    if ! timeout "${RUN_TIMEOUT:-240}" ./ds4-bench "${args[@]}" "${extra[@]}" --csv "$out/$cfg.csv" > "$log" 2>&1; then
        echo "$cfg,,,,,,,,,failed: $(tail -1 "$log" | tr ',' ';')" >> "$csv"
        continue
    fi
    pre=$(field "$out/$cfg.csv" prefill_tps); dec=$(field "$out/$cfg.csv" gen_tps)
    [ "$cfg" = resident ] && base_dec=$dec
    line=$(grep 'cuda expert cache:' "$log" | tail -1 || true)
    gib=$(sed -n 's/.*slots (\([0-9.]*\) GiB).*/\1/p' <<<"$line")
    hits=$(sed -n 's/.*hits \([0-9]*\),.*/\1/p' <<<"$line"); miss=$(sed -n 's/.*misses \([0-9]*\) .*/\1/p' <<<"$line")
    copied=$(sed -n 's/.*, \([0-9.]*\) GiB copied.*/\1/p' <<<"$line")
    pinned=$(sed -n 's/.*pinned \([a-z]*\).*/\1/p' <<<"$line")
    pcie=$(sed -n 's/.*copy bandwidth \([0-9.]*\) GB\/s pinned.*/\1/p' "$log" | tail -1)
    # one token's routed bytes: 43 layers x 6 experts x one expert (gate+up+down) of this file
    eb=$(awk -v g="$gib" -v l="$line" 'BEGIN { split(l, a, " "); n = a[4]; if (n > 0) print g * 1073741824 / n }' || true)
    python3 - "$cfg" "${gib:-}" "$pre" "$dec" "${base_dec:-}" "${hits:-}" "${miss:-}" "${copied:-}" "${pcie:-}" \
        "${eb:-}" "${pinned:-}" >> "$csv" <<'PY'
import sys
cfg, gib, pre, dec, base, hits, miss, copied, pcie, eb, pinned = sys.argv[1:]
f = lambda s: float(s) if s else None
ratio = f"{f(dec) / f(base):.3f}" if base and dec and f(base) else ""
hr = f"{f(hits) / (f(hits) + f(miss)):.3f}" if hits and miss and f(hits) + f(miss) > 0 else ""
bound = ""
if hr and pcie and eb and 1 - float(hr) > 0:
    bound = f"{f(pcie) * 1e9 / ((1 - float(hr)) * 43 * 6 * f(eb)):.2f}"
print(",".join([cfg, gib, pre, dec, ratio, hr, copied, pcie, bound, pinned]))
PY
done
cat "$csv"

#!/usr/bin/env bash
# h200_synth_model.sh - the full-size synthetic Flash q2 file that the
# GPU-machine benchmarks share (h200_fullsize.sh, h200_stream.sh): made once
# in $BIG_TMP (default /dev/shm, grown to 110G when it is smaller than
# NEED_GIB, default 84) with ./ds4-quantize ($QUANTIZE names another) --synthetic flash --experts q2
# $SYNTH_ARGS; its log goes to OUTDIR/quantize.log. Prints the file's path.
#
#   model=$(bench/h200_synth_model.sh OUTDIR)
set -euo pipefail
out=${1:?usage: h200_synth_model.sh OUTDIR}
mkdir -p "$out"
tmp=${BIG_TMP:-/dev/shm}
# the shape in the name: a file of other SYNTH_ARGS left in $tmp by an
# earlier call is not taken for this one
tag=$(printf '%s' "${SYNTH_ARGS:-}" | tr -cs 'A-Za-z0-9' '_' | sed 's/^_//; s/_$//')
model=$tmp/ds4-flash-q2-synthetic${tag:+-$tag}.gguf
need=$(( ${NEED_GIB:-84} * 1024 * 1024 * 1024 ))
if [ ! -s "$model" ]; then
    avail=$(df -B1 --output=avail "$tmp" | tail -1)
    if [ "$avail" -lt "$need" ]; then
        mount -o remount,size=110G "$tmp" 2>/dev/null ||
            { echo "h200_synth_model: need ${NEED_GIB:-84} GiB free in $tmp, have $((avail >> 30)) GiB" >&2; exit 1; }
    fi
    t0=$(date +%s)
    # shellcheck disable=SC2086
    "${QUANTIZE:-./ds4-quantize}" --synthetic flash --experts q2 ${SYNTH_ARGS:-} --out "$model" \
        --tokenizer tests/data/tokenizer/dsv4-vocab.gguf --quiet > "$out/quantize.log" 2>&1
    echo "synthetic file written in $(( $(date +%s) - t0 )) s" >> "$out/quantize.log"
fi
echo "$model"

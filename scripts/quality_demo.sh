#!/usr/bin/env bash
# quality_demo.sh - the imatrix experiment of docs/QUALITY.md on the demo
# model, end to end: an f32-expert reference, an imatrix collected from
# chat-format text, the experts quantized without and with it, a manifest
# of the reference's own greedy answers, and ds4-quality scores of every
# variant against it. Prints the commands it runs and the comparison.
#
#   scripts/quality_demo.sh [WORKDIR] [EXPERT_TYPE] [MODEL]
#   (defaults: /tmp/ds4-quality-demo, mxfp4, models/ds4-demo.gguf)
#
# The demo model's expert rows are 64 (gate/up) and 128 (down) values long,
# shorter than the 256-value blocks of q2 (IQ2_XXS/Q2_K), so q2 cannot be
# applied to it (ds4-quantize says so); MXFP4 (32-value blocks, 4 bits) is
# the quantizer that takes an imatrix at these widths.
set -eu
cd "$(dirname "$0")/.."
W=${1:-/tmp/ds4-quality-demo}
E=${2:-mxfp4}
M=${3:-models/ds4-demo.gguf}
mkdir -p "$W"
run() { echo "+ $*" >&2; "$@"; }
run python3 scripts/quality_demo_data.py "$W/calib.jsonl" "$W/prompts.jsonl"
run ./ds4-quantize --gguf $M --experts f32 --out "$W/ref-f32.gguf" --quiet
run ./ds4 -m "$W/ref-f32.gguf" --cpu --nothink --imatrix-dataset "$W/calib.jsonl" --imatrix-out "$W/demo.imatrix"
run ./ds4-quantize --gguf "$W/ref-f32.gguf" --experts "$E" --out "$W/$E-plain.gguf" --quiet
run ./ds4-quantize --gguf "$W/ref-f32.gguf" --experts "$E" --imatrix "$W/demo.imatrix" --out "$W/$E-imatrix.gguf" --quiet
run ./ds4-quality manifest "$W/ref-f32.gguf" "$W/prompts.jsonl" "$W/manifest.json" --steps 32 --cpu
for v in ref-f32 "$E-plain" "$E-imatrix"; do
    run ./ds4-quality score "$W/$v.gguf" "$W/manifest.json" "$W/$v.tsv" --cpu
done
run ./ds4-quality compare "$W/$E-plain.tsv" "$W/$E-imatrix.tsv"

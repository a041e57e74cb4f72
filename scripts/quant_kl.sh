#!/usr/bin/env bash
# quant_kl.sh - mean KL divergence of quantized conversions from the f32 one.
#
# Writes a random checkpoint whose expert rows are multiples of 256 (so the
# K-quants apply; the golden tiny models' rows are not), converts it with
# --experts f32 / q8_0 / q4 / q2 (and --type q8_0 for q8_0), dumps the
# logits of the tiny-a token sequence with hf numerics and prints, per type,
# the mean and max KL(f32 || quantized) over positions and top-1 agreement.
# Random weights are not a trained model: the numbers compare types with
# each other, they do not predict quality on real weights.
# Needs numpy (/usr/bin/python3). Run from the repository root after make.
set -eu
BIN=${DS4_BIN_DIR:-.}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/hf"
/usr/bin/python3 scripts/rand_checkpoint.py "$tmp/hf" >/dev/null
/usr/bin/python3 -c "
import json; m=json.load(open('tests/data/dsv4-tiny-a/manifest.json'))
print(' '.join(map(str, m['sequences'][0]['tokens'])))" > "$tmp/ids.txt"
for e in f32 q8_0 q4 q2; do
    t=f32; [ "$e" = q8_0 ] && t=q8_0
    "$BIN/ds4-quantize" --hf "$tmp/hf" --out "$tmp/$e.gguf" --type $t --experts $e --quiet
    "$BIN/ds4" -m "$tmp/$e.gguf" --token-ids "$tmp/ids.txt" --dump-logits "$tmp/$e.f32" --numerics hf
done
/usr/bin/python3 - "$tmp" <<'PY'
import sys, numpy as np
d = sys.argv[1]
def logsoftmax(x):
    x = x.astype(np.float64); m = x.max(1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(1, keepdims=True))
f = np.fromfile(d + '/f32.f32', '<f4').reshape(-1, 1024); lf = logsoftmax(f); pf = np.exp(lf)
for e in ['q8_0', 'q4', 'q2']:
    g = np.fromfile(d + '/%s.f32' % e, '<f4').reshape(-1, 1024)
    kl = (pf * (lf - logsoftmax(g))).sum(1)
    print('%-5s mean KL %.4g  max KL %.3g  top-1 agreement %.3f' % (e, kl.mean(), kl.max(), (f.argmax(1) == g.argmax(1)).mean()))
PY

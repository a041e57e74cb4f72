#!/usr/bin/env bash
# test_quality_cli.sh - the quality tools on the demo model (docs/QUALITY.md):
# ds4 --perplexity-file and --imatrix-dataset. Expected numbers come from
# outside the code under test: the perplexity is recomputed in Python from
# the logits of `ds4 --dump-logits` (the golden-tested forward, one call per
# chunk), the imatrix is read back with Python's struct module.
set -u
BIN=${DS4_BIN_DIR:-.}
M=models/ds4-demo.gguf
pass=0; fail=0; skip=0
ok()  { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
if [ ! -f "$M" ]; then echo "SKIP quality: $M missing"; echo "RESULT 0 0 1"; exit 0; fi

# ---- perplexity ------------------------------------------------------------
head -c 3000 tests/data/bench/promessi_sposi.txt > "$tmp/text.txt"
out=$("$BIN/ds4" -m $M --cpu --perplexity-file "$tmp/text.txt" --ctx 32 --chunks 2 2>"$tmp/err"); rc=$?
ppl=$(printf '%s\n' "$out" | sed -n 's/^Final estimate: PPL = \([0-9.]*\) +\/- \([0-9.]*\)$/\1 \2/p')
if [ $rc -ne 0 ] || [ -z "$ppl" ]; then
    bad "ppl_runs: rc $rc out '$out' err '$(cat "$tmp/err")'"
else
    grep -q "chunk 2/2" "$tmp/err" && [[ "$out" == "[1]"*",[2]"* ]] && ok ppl_progress || bad "ppl_progress: '$out'"
    "$BIN/ds4" -m $M --dump-tokens --prompt-file "$tmp/text.txt" 2>/dev/null | cut -f1 > "$tmp/ids.txt"
    for c in 0 1; do
        sed -n "$((c * 32 + 1)),$((c * 32 + 32))p" "$tmp/ids.txt" | sed '1s/.*/0/' > "$tmp/c$c.txt"
        "$BIN/ds4" -m $M --cpu --token-ids "$tmp/c$c.txt" --dump-logits "$tmp/c$c.bin" 2>/dev/null
    done
    python3 - "$tmp" $ppl <<'PY' && ok ppl_matches_dump_logits || bad "ppl_matches_dump_logits (ds4: $ppl)"
import array, math, sys
tmp, ppl, err = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
nll = []
for c in (0, 1):
    ids = [int(x) for x in open(f"{tmp}/c{c}.txt").read().split()]
    a = array.array("f"); a.frombytes(open(f"{tmp}/c{c}.bin", "rb").read())
    V = len(a) // 32
    for j in range(16, 31):  # llama-perplexity: second half, logits j predict token j+1
        row = a[j * V:(j + 1) * V]; m = max(row)
        nll.append(math.log(sum(math.exp(x - m) for x in row)) + m - row[ids[j + 1]])
n = len(nll); mean = sum(nll) / n
var = sum(x * x for x in nll) / n - mean * mean
want, want_err = math.exp(mean), math.exp(mean) * math.sqrt(var / (n - 1))
print(f"   python: PPL {want:.4f} +/- {want_err:.5f}, ds4: {ppl} +/- {err}")
sys.exit(0 if abs(want - ppl) <= 1e-3 * want and abs(want_err - err) <= 1e-2 * want_err else 1)
PY
fi
: > "$tmp/empty.txt"
out=$("$BIN/ds4" -m $M --perplexity-file "$tmp/empty.txt" 2>&1); rc=$?
[ $rc -eq 1 ] && [[ "$out" == *"empty"* ]] && ok ppl_empty_file || bad "ppl_empty_file: rc $rc '$out'"
printf 'too short' > "$tmp/short.txt"
out=$("$BIN/ds4" -m $M --perplexity-file "$tmp/short.txt" --ctx 64 2>&1); rc=$?
[ $rc -eq 1 ] && [[ "$out" == *"needs at least 64"* ]] && ok ppl_short_text || bad "ppl_short_text: rc $rc '$out'"
out=$("$BIN/ds4" -m $M --perplexity-file "$tmp/nope.txt" 2>&1); rc=$?
[ $rc -eq 1 ] && [[ "$out" == *"nope.txt"* ]] && ok ppl_missing_file || bad "ppl_missing_file: rc $rc '$out'"
out=$("$BIN/ds4" -m "$tmp/nope.gguf" --perplexity-file "$tmp/text.txt" 2>&1); rc=$?
[ $rc -eq 1 ] && [[ "$out" == *"nope.gguf"* ]] && ok ppl_missing_model || bad "ppl_missing_model: rc $rc '$out'"

echo "RESULT $pass $fail $skip"

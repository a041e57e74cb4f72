#!/usr/bin/env bash
# test_exactness_tools.sh - the tools behind the CPU vs CUDA exactness
# figures (docs/CUDA.md, "Exactness on synthetic models"):
#   - scripts/gguf_perturb.py moves every value of one F32 tensor by one
#     ulp (its lowest mantissa bit, nothing else in the file) and refuses a
#     missing tensor or one that is not F32, naming it;
#   - scripts/compare_logits.py on two dumps of the same file: 100% top-1,
#     no difference; on the perturbed model's dump: a first differing
#     position;
#   - ds4-quantize --expert-share: a fraction from 0 to 1, for --synthetic
#     only (exit 2 otherwise).
set -u
BIN=${DS4_BIN_DIR:-.}
DS4=$BIN/ds4
QUANT=$BIN/ds4-quantize
VOCAB=tests/data/tokenizer/dsv4-vocab.gguf
. tests/counters_lib.sh

if [ ! -x "$QUANT" ] || ! command -v python3 >/dev/null; then
    skipt "exactness_tools: needs $QUANT and python3"
    echo "RESULT $pass $fail $skip"; exit 0
fi
MODEL=$tmp/tiny.gguf
if ! "$QUANT" --synthetic tests/data/cli/tiny-chat-config.json --tokenizer "$VOCAB" \
        --type f32 --experts f32 --seed 5 --quiet --out "$MODEL" >"$tmp/q.log" 2>&1; then
    bad "exactness_model: ds4-quantize failed: $(tail -2 "$tmp/q.log")"
    echo "RESULT $pass $fail $skip"; exit 0
fi

# perturb: exactly the tensor's values change, each in its lowest bit
T=blk.0.attn_norm.weight
n=$("$BIN/ds4-gguf" info "$MODEL" | awk -v t="$T" '$NF == t {print $3}' | tr -d '[]' | head -1)
if python3 scripts/gguf_perturb.py "$MODEL" "$tmp/ulp.gguf" "$T" > "$tmp/p.log" 2>&1; then
    # bytes that differ, and how many of them differ in more than the lowest bit
    diffs=$(python3 -c 'import sys
a, b = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
d = [x ^ y for x, y in zip(a, b) if x != y]
print(len(d), sum(1 for x in d if x != 1))' "$MODEL" "$tmp/ulp.gguf")
    [ -n "$n" ] && [ "$diffs" = "$n 0" ] && [ "$(stat -c %s "$MODEL")" = "$(stat -c %s "$tmp/ulp.gguf")" ] &&
        ok "perturb_one_ulp ($n values)" || bad "perturb_one_ulp: want $n bytes each one bit off, got '$diffs'"
else
    bad "perturb_one_ulp: $(cat "$tmp/p.log")"
fi
python3 scripts/gguf_perturb.py "$MODEL" "$tmp/x.gguf" no.such.tensor > "$tmp/e1" 2>&1; rc=$?
[ $rc -ne 0 ] && grep -q "no tensor no.such.tensor" "$tmp/e1" && [ ! -e "$tmp/x.gguf" ] &&
    ok perturb_missing_tensor || bad "perturb_missing_tensor: rc $rc $(cat "$tmp/e1")"
python3 scripts/gguf_perturb.py "$MODEL" "$tmp/x.gguf" blk.0.ffn_gate_tid2eid.weight > "$tmp/e2" 2>&1; rc=$?
[ $rc -ne 0 ] && grep -q "not F32" "$tmp/e2" && [ ! -e "$tmp/x.gguf" ] &&
    ok perturb_not_f32 || bad "perturb_not_f32: rc $rc $(cat "$tmp/e2")"
printf 'GGUX' > "$tmp/bad.gguf"
python3 scripts/gguf_perturb.py "$tmp/bad.gguf" "$tmp/x.gguf" "$T" > "$tmp/e3" 2>&1; rc=$?
[ $rc -ne 0 ] && grep -q "not a GGUF file" "$tmp/e3" && ok perturb_not_gguf || bad "perturb_not_gguf: rc $rc $(cat "$tmp/e3")"

# compare: a dump against itself, then against the perturbed model's
printf '0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15' > "$tmp/ids.txt"
if "$DS4" -m "$MODEL" --cpu --token-ids "$tmp/ids.txt" --dump-logits "$tmp/a.f32" > /dev/null 2>"$tmp/d1" &&
   "$DS4" -m "$tmp/ulp.gguf" --cpu --token-ids "$tmp/ids.txt" --dump-logits "$tmp/b.f32" > /dev/null 2>"$tmp/d2"; then
    same=$(python3 scripts/compare_logits.py "$tmp/a.f32" "$tmp/a.f32" 16 --from 8)
    [[ "$same" == *"positions 16, top-1 agreement 100.00%, max |dlogit| 0,"* ]] &&
        [[ "$same" == *"from 8: positions 8,"* ]] && [[ "$same" == *"first differing position: none"* ]] &&
        ok compare_same || bad "compare_same: $same"
    other=$(python3 scripts/compare_logits.py "$tmp/a.f32" "$tmp/b.f32" 16)
    [[ "$other" =~ first\ differing\ position:\ [0-9]+ ]] && ok compare_perturbed || bad "compare_perturbed: $other"
    python3 scripts/compare_logits.py "$tmp/a.f32" "$tmp/a.f32" 7 > "$tmp/e4" 2>&1; rc=$?
    [ $rc -ne 0 ] && grep -q "do not divide by 7" "$tmp/e4" && ok compare_bad_count || bad "compare_bad_count: rc $rc"
else
    bad "compare: ds4 --dump-logits failed: $(tail -2 "$tmp/d1" "$tmp/d2")"
fi

# --expert-share
"$QUANT" --synthetic flash --layers 1 --n-experts 8 --expert-share 1.5 --out "$tmp/s.gguf" 2>"$tmp/e5"; rc=$?
[ $rc -eq 2 ] && grep -q -- "--expert-share 1.5" "$tmp/e5" && ok share_out_of_range || bad "share_out_of_range: rc $rc"
"$QUANT" --hf tests/data/dsv4-tiny-a --expert-share 0.5 --out "$tmp/s.gguf" 2>"$tmp/e6"; rc=$?
[ $rc -eq 2 ] && grep -q "for --synthetic" "$tmp/e6" && [ ! -e "$tmp/s.gguf" ] && ok share_synthetic_only ||
    bad "share_synthetic_only: rc $rc $(cat "$tmp/e6")"

echo "RESULT $pass $fail $skip"

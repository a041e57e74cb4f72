#!/usr/bin/env bash
# test_ppl_llamacpp.sh - `ds4 --perplexity-file --kld-base` against the
# file mainline llama.cpp's llama-perplexity wrote for the same tiny
# synthetic model and text (tests/data/llamacpp/README.md says how it was
# made).
#
# Checked against llama.cpp's file:
# - the same header, token ids and size: llama-perplexity's chunking, its
#   BOS rule (none: the vocabulary's add_bos_token is false) and its row
#   layout, which bench/vs_llamacpp.sh relies on when it feeds our file
#   to a peer's --kl-divergence;
# - log-probabilities of llama.cpp's 32 most likely tokens within 0.12 of
#   ours on the median row. Rows where the engines route a near-tied
#   expert differently are allowed to be far off; that is why the median.
# - a perplexity within 5%.
set -u
BIN=${DS4_BIN_DIR:-.}
D=tests/data/llamacpp
. tests/counters_lib.sh

"$BIN/ds4-quantize" --synthetic $D/tiny-config.json --out "$tmp/tiny.gguf" \
    --tokenizer tests/data/tokenizer/dsv4-vocab.gguf --quiet 2>"$tmp/err"
if [ ! -s "$tmp/tiny.gguf" ]; then
    bad "synthetic model: $(cat "$tmp/err")"; echo "RESULT $pass $fail $skip"; exit 1
fi
head -c 3000 tests/data/bench/promessi_sposi.txt > "$tmp/t3k.txt"
out=$("$BIN/ds4" -m "$tmp/tiny.gguf" --cpu -t 2 --perplexity-file "$tmp/t3k.txt" --ctx 32 --chunks 2 \
    --numerics hf --kld-base "$tmp/ours.kld" 2>"$tmp/err"); rc=$?
ppl=$(printf '%s\n' "$out" | sed -n 's/^Final estimate: PPL = \([0-9.]*\) .*/\1/p')
if [ $rc -ne 0 ] || [ -z "$ppl" ] || [ ! -s "$tmp/ours.kld" ]; then
    bad "ppl_run: rc $rc '$out' $(tail -2 "$tmp/err")"; echo "RESULT $pass $fail $skip"; exit 1
fi
grep -q "no BOS (tokenizer.ggml.add_bos_token is false)" "$tmp/err" && ok ppl_says_bos_rule || bad "ppl_says_bos_rule: $(cat "$tmp/err")"

python3 - $D/tiny-kld-base-top32.json "$tmp/ours.kld" "$ppl" > "$tmp/py.out" 2>&1 <<'PY'
import array, json, math, struct, sys
ref = json.load(open(sys.argv[1]))
b = open(sys.argv[2], "rb").read()
ppl = float(sys.argv[3])
def res(name, cond, detail=""):
    print(("PASS " if cond else "FAIL ") + name + ("" if cond else ": " + detail))
head = struct.unpack("<3i", b[8:20])
res("kld_magic", b[:8] == b"_logits_", repr(b[:8]))
res("kld_header_as_llamacpp", head == (ref["n_ctx"], ref["n_vocab"], ref["n_chunk"]), repr(head))
n_ctx, n_vocab, n_chunk = ref["n_ctx"], ref["n_vocab"], ref["n_chunk"]
toks = list(struct.unpack("<%di" % (n_ctx * n_chunk), b[20:20 + 4 * n_ctx * n_chunk]))
res("kld_tokens_as_llamacpp", toks == ref["tokens"], "first ids %s vs %s" % (toks[:4], ref["tokens"][:4]))
res("kld_size_as_llamacpp", len(b) == ref["file_bytes"], "%d vs %d bytes" % (len(b), ref["file_bytes"]))
nv = 2 * ((n_vocab + 1) // 2) + 4
off = 20 + 4 * n_ctx * n_chunk
d, nll_ours, nll_ref = [], 0.0, 0.0
for r, row in enumerate(ref["rows"]):
    a = array.array("H")
    a.frombytes(b[off + r * 2 * nv: off + (r + 1) * 2 * nv])
    if len(a) < nv:
        break
    scale, minlp = struct.unpack("<2f", a[:4].tobytes())
    ours = lambda i: scale * a[4 + i] + minlp
    theirs = lambda q: row["scale"] * q + row["min_log_prob"]
    d.append(sum(abs(ours(i) - theirs(q)) for i, q in row["top"]) / len(row["top"]))
    t, q = row["target"]
    nll_ours -= ours(t)
    nll_ref -= theirs(q)
n = len(ref["rows"])
if len(d) == n:
    med = sorted(d)[n // 2]
    print("   median |log p ours - log p llama.cpp| over its top 32: %.4f (rows %.4f .. %.4f)" % (med, min(d), max(d)))
    res("kld_logprobs_near_llamacpp", med < 0.12, "median %.4f" % med)
    p_file, p_ref = math.exp(nll_ours / n), math.exp(nll_ref / n)
    print("   perplexity: ours %.1f (file %.1f), llama.cpp %.1f" % (ppl, p_file, p_ref))
    res("kld_ppl_matches_stdout", abs(p_file / ppl - 1) < 1e-3, "%.1f vs %.1f" % (p_file, ppl))
    res("ppl_near_llamacpp", abs(ppl / p_ref - 1) < 0.05, "%.1f vs %.1f" % (ppl, p_ref))
else:
    res("kld_rows", False, "%d rows of %d" % (len(d), n))
PY
prc=$?
cat "$tmp/py.out"
pass=$((pass + $(grep -c '^PASS ' "$tmp/py.out")))
fail=$((fail + $(grep -c '^FAIL ' "$tmp/py.out")))
[ $prc -eq 0 ] || bad "python check: exit $prc"

# the same text in the old convention (BOS replaces each chunk's first token)
# cannot make a KL-divergence base: llama-perplexity would not read it so
out=$("$BIN/ds4" -m "$tmp/tiny.gguf" --cpu --perplexity-file "$tmp/t3k.txt" --ctx 32 --ppl-bos --kld-base "$tmp/x.kld" 2>&1); rc=$?
[ $rc -ne 0 ] && [[ "$out" == *"--kld-base and --ppl-bos"* ]] && [ ! -e "$tmp/x.kld" ] && ok kld_refuses_ppl_bos \
    || bad "kld_refuses_ppl_bos: rc $rc '$out'"
out=$("$BIN/ds4" -m "$tmp/tiny.gguf" --cpu --perplexity-file "$tmp/t3k.txt" --ctx 32 --chunks 1 \
    --kld-base "$tmp/no/such/dir/x.kld" 2>&1); rc=$?
[ $rc -eq 1 ] && [[ "$out" == *"no/such/dir/x.kld"* ]] && ok kld_unwritable_named || bad "kld_unwritable_named: rc $rc '$out'"
echo "RESULT $pass $fail $skip"

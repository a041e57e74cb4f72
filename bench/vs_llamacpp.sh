#!/usr/bin/env bash
# vs_llamacpp.sh - DwarfStar's CPU prefill and decode against mainline
# llama.cpp and ik_llama.cpp on the same GGUF, same thread count, rounds
# alternated, medians and ratios (docs/BENCHMARKS.md "Side by side with
# llama.cpp and ik_llama.cpp").
#
#   bench/vs_llamacpp.sh MODEL.gguf [OUT.csv]
#
# The peers are builds you provide (this script converts nothing; bench/
# build_peers.sh DIR builds both at the pinned commits, then
# PATH=DIR/bin:$PATH): llama-bench binaries named by LLAMA_BENCH (mainline)
# and IK_BENCH (ik_llama.cpp), or found on the PATH as llama-bench /
# ik-llama-bench. A peer that is missing is left out and said so. For the
# "same model" check it also wants their perplexity tools, LLAMA_PPL and
# IK_PPL (llama-perplexity, which must have --kl-divergence); without them
# the check is skipped with a message. CPU only: the peers run with -ngl 0.
#
# Environment: THREADS (2), ROUNDS (5), LENS ("512 2048": prefill of L
# tokens from an empty context, and decode at depth L), GEN (16 decode
# tokens), DS4_BENCH (./ds4-bench), DS4 (./ds4), TEXT (the prompt text,
# tests/data/bench/promessi_sposi.txt), PPL_CTX (128), PPL_CHUNKS (2; 0
# skips the same-model check, e.g. to re-time peers already checked) and
# OURS_FLAGS (--warm-weights: extra ds4-bench options), ML_FLAGS and
# IK_FLAGS (extra llama-bench options of each peer, e.g. IK_FLAGS="-rtr 1").
#
# Why alternate: on a shared machine the load drifts over minutes, so each
# round runs every engine once per test (in a rotating order) and the
# ratios are taken per round (paired) as well as between medians.
#
# Peers read deepseek4.nextn_predict_layers differently: ik_llama.cpp takes
# a value of 1 as an MTP block at the end of the file and silently runs one
# layer fewer. The script refuses a model with a non-zero value unless
# FIX_NEXTN=1, which sets it to 0 in place (the value of a u32 key in the
# header; DwarfStar ignores the key, and ds4-quantize writes no MTP block).
set -u
M=${1:?usage: bench/vs_llamacpp.sh MODEL.gguf [OUT.csv]}
OUT=${2:-bench/results/vs_llamacpp-$(date -u +%Y-%m-%d).csv}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-5}
LENS=${LENS:-512 2048}
GEN=${GEN:-16}
DS4_BENCH=${DS4_BENCH:-./ds4-bench}
DS4=${DS4:-./ds4}
TEXT=${TEXT:-tests/data/bench/promessi_sposi.txt}
PPL_CTX=${PPL_CTX:-128}
PPL_CHUNKS=${PPL_CHUNKS:-2}
# llama-bench maps the weights in during its untimed warm-up run; ours
# runs one timed prefill per process, so --warm-weights maps them in at
# open, keeping page faults out of the timed prefill on both sides
OURS_FLAGS=${OURS_FLAGS---warm-weights}
# extra llama-bench options for each peer (ik_llama.cpp's users often run
# -rtr 1: its weights repacked at load for its fastest CPU kernels)
ML_FLAGS=${ML_FLAGS:-}
IK_FLAGS=${IK_FLAGS:-}
find_bin() { # $1 env value, $2 PATH name
    if [ -n "$1" ]; then [ -x "$1" ] && echo "$1"; return; fi
    command -v "$2" 2>/dev/null
}
ML=$(find_bin "${LLAMA_BENCH:-}" llama-bench)
IK=$(find_bin "${IK_BENCH:-}" ik-llama-bench)
ML_PPL=$(find_bin "${LLAMA_PPL:-}" llama-perplexity)
IK_PPL=$(find_bin "${IK_PPL:-}" ik-llama-perplexity)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

[ -f "$M" ] || { echo "vs_llamacpp: no model file $M" >&2; exit 2; }
[ -x "$DS4_BENCH" ] || { echo "vs_llamacpp: $DS4_BENCH not built (make ds4-bench)" >&2; exit 2; }
[ -f "$TEXT" ] || { echo "vs_llamacpp: no prompt text $TEXT" >&2; exit 2; }
[ -n "$ML" ] || echo "vs_llamacpp: mainline llama-bench not found (LLAMA_BENCH, or llama-bench on the PATH): left out" >&2
[ -n "$IK" ] || echo "vs_llamacpp: ik_llama.cpp llama-bench not found (IK_BENCH, or ik-llama-bench on the PATH): left out" >&2

# ---- the model's header: nextn_predict_layers --------------------------------
nextn=$(python3 bench/gguf_u32.py "$M" deepseek4.nextn_predict_layers) || exit 2
if [ "$nextn" != "absent" ] && [ "$nextn" != 0 ]; then
    if [ "${FIX_NEXTN:-0}" = 1 ]; then
        python3 bench/gguf_u32.py "$M" deepseek4.nextn_predict_layers 0 || exit 2
        echo "vs_llamacpp: set deepseek4.nextn_predict_layers $nextn -> 0 in $M" >&2
    else
        echo "vs_llamacpp: $M has deepseek4.nextn_predict_layers = $nextn: ik_llama.cpp would run one layer" \
             "fewer; run with FIX_NEXTN=1 to set it to 0 in place" >&2
        exit 2
    fi
fi
gating=$(python3 bench/gguf_u32.py "$M" deepseek4.expert_gating_func)
[ "$gating" = 4 ] || echo "vs_llamacpp: deepseek4.expert_gating_func is $gating: mainline llama.cpp wants 4" >&2

echo "# model $M ($(du -h "$M" | cut -f1)), threads $THREADS, rounds $ROUNDS, lengths $LENS, decode $GEN tokens"
echo "# ours: $($DS4_BENCH --version 2>/dev/null | head -1)"
echo "# flags: ours $OURS_FLAGS; mainline ${ML_FLAGS:-none}; ik_llama.cpp ${IK_FLAGS:-none}"
for p in "$ML" "$IK"; do
    [ -n "$p" ] || continue
    # mainline's llama-bench has no --version (it says so on stderr)
    v=$("$p" --version 2>&1 | grep -m1 -i "^version\|^build")
    echo "# peer: $p${v:+ ($v)}"
done
echo "# $(nproc) CPUs, load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

# ---- same model? the peers' KL divergence from ours on the same tokens -------
# ds4 --perplexity-file scores the text in llama-perplexity's convention
# (chunks of PPL_CTX tokens, the second half of each scored, BOS only where
# the file's tokenizer.ggml.add_bos_token asks for it) and writes its
# log-probabilities as llama-perplexity's --kl-divergence-base file; each
# peer's own llama-perplexity then runs the same tokens (--kl-divergence)
# and reports its perplexity, its KL divergence from ours per scored token
# and how often the top token agrees. Ours runs with --numerics hf: neither
# peer simulates the official model's FP8 KV round trip and FP4 indexer
# (dsv4-model.md section 4.1, D1/D2; ours does by default), so that is the
# same function; the default numerics' perplexity is printed beside it.
# Measured on the 4-layer 256-expert random Flash file (docs/BENCHMARKS.md,
# 2 chunks of 128): mainline against ours-hf, median KLD 0.0008 and a
# perplexity 0.14% away; against ours with the official numerics, 0.0045;
# mainline running the same weights without the last layer (what
# ik_llama.cpp does with nextn_predict_layers = 1), 0.150, while its
# perplexity moved only 5% +/- 5%: the KL divergence is the test, the
# perplexity a second look.
KLD_TOL=${KLD_TOL:-0.003}    # median KL divergence (nats) allowed for "same model"
PPL_TOL=${PPL_TOL:-0.01}     # |ln(PPL ratio)| allowed beyond 2 standard errors
head -c 20000 "$TEXT" > "$tmp/text.txt"
ppl_of() { sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' "$1" | tail -1; }
ours_ppl="" ours_off=""
if [ "$PPL_CHUNKS" = 0 ]; then
    echo "# same-model check: skipped (PPL_CHUNKS=0)"
elif [ -x "$DS4" ]; then
    "$DS4" -m "$M" --cpu -t "$THREADS" --perplexity-file "$tmp/text.txt" --ctx "$PPL_CTX" --chunks "$PPL_CHUNKS" \
        --numerics hf --kld-base "$tmp/ours.kld" > "$tmp/ppl.ours" 2>&1
    ours_ppl=$(ppl_of "$tmp/ppl.ours")
    "$DS4" -m "$M" --cpu -t "$THREADS" --perplexity-file "$tmp/text.txt" --ctx "$PPL_CTX" --chunks "$PPL_CHUNKS" \
        > "$tmp/ppl.ours-official" 2>&1
    ours_off=$(ppl_of "$tmp/ppl.ours-official")
    echo "# same-model check: ctx $PPL_CTX, $PPL_CHUNKS chunks, $(grep -o 'BOS starts[^;]*\|no BOS[^;]*' "$tmp/ppl.ours" | head -1)"
    echo "# same-model check: ours --numerics hf PPL ${ours_ppl:-FAILED} (the peers' math); ours default numerics" \
         "(official: FP8 KV, FP4 indexer) PPL ${ours_off:-FAILED}"
    [ -n "$ours_ppl" ] || sed 's/^/#   /' "$tmp/ppl.ours" | tail -3
fi
for pair in "mainline:$ML_PPL" "ik_llama.cpp:$IK_PPL"; do
    name=${pair%%:*}; bin=${pair#*:}
    [ "$PPL_CHUNKS" = 0 ] && break
    if [ -z "$bin" ] || [ -z "$ours_ppl" ]; then
        echo "# same-model check: $name skipped (no perplexity tool given, or ours did not run)"
        continue
    fi
    # from the scratch directory: ik_llama.cpp's tools write llama.log into the current one
    (cd "$tmp" && "$(readlink -f "$bin")" -m "$(readlink -f "$M")" -t "$THREADS" -ngl 0 -c "$PPL_CTX" -b "$PPL_CTX" \
        --kl-divergence-base "$tmp/ours.kld" --kl-divergence) > "$tmp/kld.$name" 2>&1
    python3 - "$tmp/kld.$name" "$name" "$ours_ppl" "${ours_off:-0}" "$KLD_TOL" "$PPL_TOL" <<'PY'
import math, re, sys
path, name, ours, off, kld_tol, ppl_tol = sys.argv[1], sys.argv[2], *map(float, sys.argv[3:])
t = open(path, errors="replace").read()
def num(label):
    m = re.search(re.escape(label) + r"\s*:\s*([-0-9.]+)(?:\s*±\s*([0-9.]+))?", t)
    return (float(m.group(1)), float(m.group(2)) if m.group(2) else 0.0) if m else (None, None)
q, _ = num("Mean PPL(Q)")
lr, lr_unc = num("Mean ln(PPL(Q)/PPL(base))")
kmean, _ = num("Mean    KLD")
kmed, _ = num("Median  KLD")
top, _ = num("Same top p")
if q is None or kmed is None:
    err = [l for l in t.splitlines() if re.search("error|fail", l, re.I)][:2]
    print(f"# same-model check: {name} FAILED to run its --kl-divergence pass: {' / '.join(err)}")
    sys.exit(0)
ok = kmed < kld_tol and abs(lr) < ppl_tol + 2 * lr_unc
verdict = "same model" if ok else "DIFFERENT MODEL"
print(f"# same-model check: {name} PPL {q:.4f}, ln(PPL/ours-hf) {lr:+.5f} +/- {lr_unc:.5f}, KL divergence from "
      f"ours-hf median {kmed:.6f} mean {kmean:.6f}, same top token {top:.1f}% -> {verdict} "
      f"(median KLD < {kld_tol:g} and |ln ratio| < {ppl_tol:g} + 2 s.e.)")
if off > 0:
    print(f"# same-model check: {name} PPL / ours with the official numerics: {q / off:.4f} "
          f"({name} computes without the FP8 KV round trip and FP4 indexer the official model runs)")
PY
    # What a file this short cannot show: the indexer picks index_topk of the
    # compressed rows only past index_topk x ratio tokens (2048 for Flash).
    # Found for mainline on a 4-layer f32 model (docs/BENCHMARKS.md).
    [ "$name" = mainline ] && echo "# same-model check: mainline also breaks exact ties of the indexer's top-k" \
        "(rows scoring exactly 0) in its own order, not the spec's (score descending, index ascending):" \
        "6 of 58 selections on a 4-layer f32 test model; no selection happens at this check's length"
done

# ---- alternated rounds -----------------------------------------------------------
echo "round,engine,test,tps" > "$OUT"
run_ours() { # $1 L -> "pp tg"
    # shellcheck disable=SC2086 # OURS_FLAGS is a list of options
    "$DS4_BENCH" -m "$M" --cpu -t "$THREADS" --prompt-file "$TEXT" --ctx-start "$1" --ctx-max "$1" \
        --gen-tokens "$GEN" $OURS_FLAGS --csv "$tmp/ours.csv" > /dev/null 2> "$tmp/ours.err" || { echo "- -"; return; }
    awk -F, 'NR == 2 { print $3, $5 }' "$tmp/ours.csv"
}
avg_ts() { # llama-bench -o csv: the avg_ts column of the last row
    python3 -c "import csv,sys; r=list(csv.DictReader(open(sys.argv[1]))); print(r[-1]['avg_ts'] if r else '-')" "$1" 2>/dev/null || echo -
}
run_peer() { # $1 name $2 bin $3 L -> "pp tg"
    local pp tg flags=$ML_FLAGS
    [ "$1" = mainline ] || flags=$IK_FLAGS
    # shellcheck disable=SC2086 # the FLAGS are lists of options
    "$2" -m "$M" -t "$THREADS" -ngl 0 -r 1 $flags -p "$3" -n 0 -o csv > "$tmp/pp.csv" 2> "$tmp/pp.err"
    pp=$(avg_ts "$tmp/pp.csv")
    # shellcheck disable=SC2086
    if [ "$1" = mainline ]; then
        "$2" -m "$M" -t "$THREADS" -ngl 0 -r 1 $flags -p 0 -n "$GEN" -d "$3" -o csv > "$tmp/tg.csv" 2> "$tmp/tg.err"
    else
        "$2" -m "$M" -t "$THREADS" -ngl 0 -r 1 $flags -p 0 -n 0 -gp "$3,$GEN" -o csv > "$tmp/tg.csv" 2> "$tmp/tg.err"
    fi
    tg=$(avg_ts "$tmp/tg.csv")
    echo "$pp $tg"
}
engines=(ours)
[ -n "$ML" ] && engines+=(mainline)
[ -n "$IK" ] && engines+=(ik_llama.cpp)
ne=${#engines[@]}
for ((r = 1; r <= ROUNDS; r++)); do
    for L in $LENS; do
        for ((k = 0; k < ne; k++)); do
            e=${engines[$(((k + r) % ne))]}
            case $e in
            ours) res=$(run_ours "$L") ;;
            mainline) res=$(run_peer mainline "$ML" "$L") ;;
            *) res=$(run_peer ik "$IK" "$L") ;;
            esac
            set -- $res
            echo "$r,$e,pp$L,$1" >> "$OUT"
            echo "$r,$e,tg@$L,$2" >> "$OUT"
            echo "round $r $e L=$L: prefill $1 tok/s, decode $2 tok/s (load $(cut -d' ' -f1 /proc/loadavg))" >&2
        done
    done
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

# ---- medians and ratios ---------------------------------------------------------
python3 - "$OUT" <<'PY'
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["tps"] not in ("-", "")]
tests = list(dict.fromkeys(r["test"] for r in rows))
engines = list(dict.fromkeys(r["engine"] for r in rows))
val = {(r["round"], r["engine"], r["test"]): float(r["tps"]) for r in rows}
med = {(e, t): statistics.median([v for (rr, ee, tt), v in val.items() if ee == e and tt == t])
       for e in engines for t in tests if any(ee == e and tt == t for (_, ee, tt) in val)}
print("| tokens/s (median) | " + " | ".join(tests) + " |")
print("| --- |" + " --- |" * len(tests))
for e in engines:
    print("| %s | " % e + " | ".join("%.2f" % med[(e, t)] if (e, t) in med else "-" for t in tests) + " |")
for e in engines:
    if e == "ours":
        continue
    cells = []
    for t in tests:
        paired = [val[(r, "ours", t)] / val[(r, e, t)] for (r, ee, tt) in val
                  if ee == e and tt == t and (r, "ours", t) in val and val[(r, e, t)] > 0]
        if (("ours", t) in med) and ((e, t) in med) and paired:
            cells.append("%.2fx (paired %.2fx)" % (med[("ours", t)] / med[(e, t)], statistics.median(paired)))
        else:
            cells.append("-")
    print("| ours / %s | " % e + " | ".join(cells) + " |")
PY

#!/usr/bin/env bash
# cpu_profile.sh - where CPU prefill and decode time goes, per op class
# and per context frontier (docs/BENCHMARKS.md "Where the CPU's time goes
# by context").
#
#   bench/cpu_profile.sh MODEL.gguf OUTDIR [ds4-bench options]
#
# Runs ds4-bench on the CPU under `perf record -k CLOCK_MONOTONIC`
# (sampling at FREQ Hz, default 499, every thread of the process) and
# splits the samples by the phase bounds ds4-bench prints on the same clock
# ("phases (CLOCK_MONOTONIC s): prefill A B decode C D" for each frontier):
# for every frontier, the prefill of its new tokens and the decode at its
# depth. Each sample is put in an op class by its symbol (the table in the
# Python below); a class's "CPU ms per token" is its samples / FREQ over
# the phase's tokens, summed over threads (on 2 threads a wall ms is up to
# 2 CPU ms). Writes OUTDIR/perf.data, OUTDIR/bench.err (ds4-bench's
# stderr), OUTDIR/bench.csv and OUTDIR/profile.md (the tables), and prints
# the tables.
#
# Defaults (override by passing ds4-bench options after OUTDIR): -t 2
# --warm-weights --prompt-file tests/data/bench/promessi_sposi.txt
# --ctx-start 512 --ctx-max 32768 --step-mul 4 --gen-tokens 32, i.e.
# frontiers 512, 2048, 8192 and 32768. Needs perf (linux-perf) and a
# kernel that lets this user sample (kernel.perf_event_paranoid <= 2 for
# one's own processes); in a VM without hardware counters perf samples the
# CPU clock, which is what the tables count.
set -eu
M=${1:?usage: bench/cpu_profile.sh MODEL.gguf OUTDIR [ds4-bench options]}
OUT=${2:?usage: bench/cpu_profile.sh MODEL.gguf OUTDIR [ds4-bench options]}
shift 2
FREQ=${FREQ:-499}
DS4_BENCH=${DS4_BENCH:-./ds4-bench}
command -v perf > /dev/null || { echo "cpu_profile: perf is needed (apt-get install linux-perf)" >&2; exit 2; }
[ -x "$DS4_BENCH" ] || { echo "cpu_profile: $DS4_BENCH not built (make ds4-bench)" >&2; exit 2; }
[ -f "$M" ] || { echo "cpu_profile: no model file $M" >&2; exit 2; }
mkdir -p "$OUT"
if [ $# -eq 0 ]; then
    set -- -t 2 --warm-weights --prompt-file tests/data/bench/promessi_sposi.txt --ctx-start 512 --ctx-max 32768 \
        --step-mul 4 --gen-tokens 32
fi
echo "# $(date -u +%FT%TZ) $(nproc) CPUs, load average before: $(cut -d' ' -f1-3 /proc/loadavg)" > "$OUT/run.txt"
echo "# command: perf record -k CLOCK_MONOTONIC -F $FREQ -o $OUT/perf.data -- $DS4_BENCH -m $M --cpu $* --csv $OUT/bench.csv" \
    >> "$OUT/run.txt"
perf record -q -k CLOCK_MONOTONIC -F "$FREQ" -o "$OUT/perf.data" -- \
    "$DS4_BENCH" -m "$M" --cpu "$@" --csv "$OUT/bench.csv" 2> "$OUT/bench.err" > /dev/null || {
    echo "cpu_profile: the profiled run failed:" >&2
    tail -5 "$OUT/bench.err" >&2
    exit 1
}
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/run.txt"
perf script -i "$OUT/perf.data" -F time,ip,sym,dso > "$OUT/samples.txt" 2> /dev/null
python3 - "$OUT/bench.err" "$OUT/bench.csv" "$FREQ" "$OUT/run.txt" "$OUT/samples.txt" > "$OUT/profile.md" <<'PY'
import collections, csv, re, sys

err, csv_path, freq, run_txt, samples = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5]
# Op classes, first match wins; a pattern is searched in the symbol name.
CLASSES = [
    ("weight packing for the GEMM (prefill)", r"^pack_w"),
    ("activation packing / quantization", r"pack_x|act_quantize|quantize_row|q8_k|cvt_act"),
    ("Q8_0 products", r"q8_0"),
    ("IQ2_XXS products", r"iq2_xxs"),
    ("Q2_K products", r"q2_k|q2_K|i8_q2"),
    ("int8 GEMM microkernel (prefill)", r"gemm_i8"),
    ("F16 / F32 / BF16 products (HC, router, compressor)", r"gemm_f16|gemm_f32|gemm_bf16|f16_dot|matvec_f"),
    ("attention, indexer, compressor", r"attn|index|compress|topk|softmax"),
    ("pool sync and scheduling", r"sched_yield|futex|worker_main|pool_run|pool_wait|spin|gemm_task|pvm_irq|"
                                 r"schedule|pthread_cond|do_syscall|entry_SYSCALL|__x64_sys"),
    ("page faults and page-cache reads", r"fault|filemap|page|folio|clear_page|memcg|lru|do_anonymous"),
    ("memcpy / memset", r"mem(cpy|move|set)"),
]
phases = []  # (frontier, name, start, end)
for line in open(err, errors="replace"):
    m = re.search(r"ctx (\d+): phases \(CLOCK_MONOTONIC s\): prefill ([\d.]+) ([\d.]+) decode ([\d.]+) ([\d.]+)", line)
    if m:
        c = int(m.group(1))
        phases.append((c, "prefill", float(m.group(2)), float(m.group(3))))
        phases.append((c, "decode", float(m.group(4)), float(m.group(5))))
if not phases:
    sys.exit("cpu_profile: no phase lines in " + err)
rows = {int(r["ctx_tokens"]): r for r in csv.DictReader(open(csv_path))}
counts = {p: collections.Counter() for p in range(len(phases))}
syms = {p: collections.Counter() for p in range(len(phases))}
for line in open(samples, errors="replace"):
    m = re.match(r"\s*([\d.]+):\s+\S*\s*(\S.*?)\s+\((.*)\)\s*$", line)
    if not m:
        continue
    t, sym, dso = float(m.group(1)), m.group(2), m.group(3)
    for i, (_, _, a, b) in enumerate(phases):
        if a <= t < b:
            cls = "other"
            for name, pat in CLASSES:
                if re.search(pat, sym):
                    cls = name
                    break
            if cls == "other" and "kernel" in dso:
                cls = "other kernel time"
            counts[i][cls] += 1
            syms[i][sym] += 1
            break
names = [n for n, _ in CLASSES] + ["other kernel time", "other"]
print(open(run_txt).read().rstrip())
for kind in ("prefill", "decode"):
    idx = [i for i, p in enumerate(phases) if p[1] == kind]
    print(f"\n## {kind}: share of the phase's samples / CPU ms per token (both threads)\n")
    hdr = []
    for i in idx:
        c = phases[i][0]
        r = rows.get(c, {})
        if kind == "prefill":
            hdr.append(f"{kind} to {c} ({r.get('prefill_tokens', '?')} tok, {float(r.get('prefill_tps', 0)):.1f} tok/s)")
        else:
            hdr.append(f"{kind} @{c} ({r.get('gen_tokens', '?')} tok, {float(r.get('gen_tps', 0)):.2f} tok/s)")
    print("| op class | " + " | ".join(hdr) + " |")
    print("| --- |" + " --- |" * len(idx))
    for n in names:
        if not any(counts[i][n] for i in idx):
            continue
        cells = []
        for i in idx:
            tot = sum(counts[i].values()) or 1
            c = phases[i][0]
            r = rows.get(c, {})
            tok = float(r.get("prefill_tokens" if kind == "prefill" else "gen_tokens", 0) or 0)
            ms = counts[i][n] / freq * 1000 / tok if tok else 0
            cells.append(f"{100 * counts[i][n] / tot:.1f}% / {ms:.2f}")
        print(f"| {n} | " + " | ".join(cells) + " |")
    cells = []
    for i in idx:
        c, _, a, b = phases[i]
        r = rows.get(c, {})
        tok = float(r.get("prefill_tokens" if kind == "prefill" else "gen_tokens", 0) or 0)
        tot = sum(counts[i].values())
        cells.append(f"{tot / freq * 1000 / tok:.2f} CPU, {(b - a) * 1000 / tok:.2f} wall" if tok else "-")
    print("| all: ms per token | " + " | ".join(cells) + " |")
    for i in idx:
        tot = sum(syms[i].values()) or 1
        top = ", ".join(f"{s} {100 * k / tot:.1f}%" for s, k in syms[i].most_common(8))
        print(f"\n{kind} at {phases[i][0]}, top symbols: {top}")
PY
rm -f "$OUT/samples.txt"
cat "$OUT/profile.md"

#!/usr/bin/env python3
"""ncu_sass_mix.py - where a kernel's instructions and stall samples go, from
ncu's per-instruction SASS listing:

    ncu --import REP.ncu-rep --page source --print-source sass --csv > src.csv
    scripts/ncu_sass_mix.py src.csv

Groups the instructions by how many times each was executed (a loop body's
instructions share a count: once a warp, once a unit, ...) and by opcode,
each with its share of the executed instructions and of the warp-state
samples, and the largest stall reasons of each group."""
import collections
import csv
import sys


def main(path):
    rows = list(csv.reader(open(path, newline="")))
    # one listing a kernel: a "Kernel Name" line, the column names, the rows
    starts = [i for i, r in enumerate(rows) if r and r[0] == "Kernel Name"]
    if not starts or len(rows) < starts[0] + 3:
        sys.exit(f"{path}: no SASS rows (want ncu --page source --print-source sass --csv)")
    for k, i in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(rows)
        print(f"== {rows[i][1] if len(rows[i]) > 1 else '?'}")
        mix(path, rows[i + 1], rows[i + 2:end])


def mix(path, hdr, body):
    ix = {h: i for i, h in enumerate(hdr)}
    for need in ("Source", "Instructions Executed", "Warp Stall Sampling (All Samples)"):
        if need not in ix:
            sys.exit(f"{path}: no column {need!r}")
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    by_count = collections.defaultdict(lambda: [0, 0, 0])
    reasons = collections.defaultdict(collections.Counter)
    by_op = collections.defaultdict(lambda: [0, 0])
    tot_n = tot_s = 0
    for r in body:
        if len(r) < len(hdr):
            continue
        n = int(r[ix["Instructions Executed"]] or 0)
        s = int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)
        tot_n += n
        tot_s += s
        g = by_count[n]
        g[0] += 1
        g[1] += n
        g[2] += s
        for h in stalls:
            reasons[n][h[len("stall_"):]] += int(r[ix[h]] or 0)
        words = r[ix["Source"]].split()
        if not words:
            continue
        op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
        by_op[op.split(".")[0]][0] += n
        by_op[op.split(".")[0]][1] += s
    tot_n, tot_s = max(tot_n, 1), max(tot_s, 1)
    print(f"{tot_n} instructions executed, {tot_s} samples")
    print("executed  static  instr%  samples%  largest stalls")
    for n, (k, ni, s) in sorted(by_count.items(), key=lambda kv: -kv[1][2])[:12]:
        top = ", ".join(f"{h} {c}" for h, c in reasons[n].most_common(4) if c)
        print(f"{n:8d} {k:7d} {100 * ni / tot_n:6.1f}  {100 * s / tot_s:7.1f}   {top}")
    print("opcode   instr%  samples%")
    for op, (ni, s) in sorted(by_op.items(), key=lambda kv: -kv[1][0])[:16]:
        print(f"{op:8s} {100 * ni / tot_n:6.1f}  {100 * s / tot_s:7.1f}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])

#!/usr/bin/env python3
"""Sum an `ncu --metrics gpu__time_duration.sum --csv` log by kernel name.

    scripts/ncu_summary.py ncu.csv [--last-step KERNEL] [--tail N] [--calls PREFIX] [--metric NAME]

Prints kernels by total GPU time: calls, microseconds per call, total, and
share of the profiled launches (bench/h200_run.sh's profile step). With
--last-step, only the launches from the second-to-last call of KERNEL (a
name prefix, e.g. cb_embed_kernel, the first kernel of a decode step) up
to the one before its last call: the last whole decode step in the log
(the layerprof step). With --calls, each launch of the kernels whose
name starts with PREFIX is listed after the table, in launch order with
its microseconds (a kernel that serves several shapes: which call is which).
With --tail, only the last N launches (a log of one kernel's launches, the
kncu step: its last step's calls). With --metric, another metric the log
holds (ncu --metrics gpu__time_duration.sum,NAME; e.g. the kncu step's
KN_METRICS) is summed and averaged per kernel over the same launches.
"""
import csv
import sys
from collections import defaultdict


def kernel_name(r):
    name = r["Kernel Name"].split("(")[0]
    return name[5:] if name.startswith("void ") else name


def read_metric(path, metric):
    """(kernel, value) of each launch's row of metric, in launch order"""
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    return [(kernel_name(r), float(r["Metric Value"].replace(",", "")))
            for r in csv.DictReader(lines) if r.get("Metric Name") == metric]


def read_rows(path):
    rows = []
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "nsecond")
        v = float(r["Metric Value"].replace(",", ""))
        us = v / 1000.0 if unit.startswith("n") else v if unit.startswith("u") else v * 1000.0
        rows.append((kernel_name(r), us))
    return rows


def last_step(rows, first):
    starts = [i for i, (n, _) in enumerate(rows) if n.startswith(first)]
    if len(starts) < 2:
        sys.exit(f"ncu_summary: fewer than two launches of {first}: no whole step in the log")
    return rows[starts[-2]:starts[-1]]


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    rows = read_rows(args[0])
    if "--last-step" in args:
        rows = last_step(rows, args[args.index("--last-step") + 1])
    if "--tail" in args:
        rows = rows[-int(args[args.index("--tail") + 1]):]
    by = defaultdict(lambda: [0, 0.0])
    for n, us in rows:
        by[n][0] += 1
        by[n][1] += us
    tot = sum(v[1] for v in by.values()) or 1.0
    print(f"{len(rows)} launches, {tot:.1f} us of GPU time")
    print(f"{'kernel':60s} {'calls':>6s} {'us/call':>8s} {'total us':>9s} {'share':>6s}")
    for n, (c, us) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"{n[:60]:60s} {c:6d} {us / c:8.2f} {us:9.1f} {100 * us / tot:5.1f}%")
    if "--metric" in args:
        metric = args[args.index("--metric") + 1]
        vals = read_metric(args[0], metric)
        if "--last-step" in args or len(vals) != len(read_rows(args[0])):
            sys.exit(f"ncu_summary: --metric takes a log with {metric} beside each launch's time, without --last-step")
        if "--tail" in args:
            vals = vals[-int(args[args.index("--tail") + 1]):]
        mby = defaultdict(list)
        for n, v in vals:
            mby[n].append(v)
        print(f"{metric} by kernel (sum, mean a launch):")
        for n, v in sorted(mby.items(), key=lambda kv: -sum(kv[1])):
            print(f"  {n[:58]:58s} {sum(v):14.6g} {sum(v) / len(v):12.6g}")
    if "--calls" in args:
        prefix = args[args.index("--calls") + 1]
        calls = [(i, n, us) for i, (n, us) in enumerate(rows) if n.startswith(prefix)]
        print(f"launches of {prefix}* (index in the step, kernel, us):")
        for i, n, us in calls:
            print(f"  {i:5d} {n[:50]:50s} {us:9.2f}")


if __name__ == "__main__":
    main()

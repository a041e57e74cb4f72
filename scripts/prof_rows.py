#!/usr/bin/env python3
"""Per-op wall time of each ds4-bench row from a DS4_CUDA_PROFILE=2 log.

    scripts/prof_rows.py bench.log

DS4_CUDA_PROFILE=2 writes "cuda op NAME US us" as each op ends (the stream
synchronized before and after it); ds4-bench writes "ctx N: phases ..."
after each row's prefill and decode, and "ds4-bench: warm-up ..." after
--warmup's untimed step (a row of its own, "warm-up"). The ops between two
such lines are one row's. Prints, per op name, the calls and total milliseconds of every row,
then each row's slowest calls: a row that pays a one-time cost (a first
launch, a buffer's growth, a library's first call) shows it there against
the rows after it.
"""
import re
import sys
from collections import defaultdict

OP = re.compile(r"^cuda op (\S+) ([0-9.]+) us$")
ROW = re.compile(r"ctx (\d+): phases")
WARM = re.compile(r"ds4-bench: warm-up")


def read_rows(path):
    rows, cur = [], []
    with open(path, errors="replace") as f:
        for line in f:
            m = OP.match(line.strip())
            if m:
                cur.append((m.group(1), float(m.group(2))))
                continue
            m = ROW.search(line)
            if m:
                rows.append(("ctx " + m.group(1), cur))
                cur = []
            elif WARM.search(line):
                rows.append(("warm-up", cur))
                cur = []
    return rows


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: prof_rows.py bench.log")
    rows = read_rows(sys.argv[1])
    if not rows:
        sys.exit("prof_rows.py: no 'ctx N: phases' rows with 'cuda op' lines in " + sys.argv[1])
    names = []
    per = []
    for _, ops in rows:
        d = defaultdict(lambda: [0, 0.0])
        for name, us in ops:
            if name not in names:
                names.append(name)
            d[name][0] += 1
            d[name][1] += us
        per.append(d)
    print("op (calls, total ms) per row: " + " | ".join(c for c, _ in rows))
    for name in names:
        cells = ["%4d %9.2f" % (d[name][0], d[name][1] / 1e3) for d in per]
        print("  %-18s %s" % (name, " | ".join(cells)))
    print("  %-18s %s" % ("all", " | ".join("%4d %9.2f" % (len(ops), sum(u for _, u in ops) / 1e3)
                                           for _, ops in rows)))
    for (ctx, ops) in rows:
        top = sorted(enumerate(ops), key=lambda x: -x[1][1])[:8]
        print("%s slowest calls (index, op, us): %s" % (
            ctx, ", ".join("%d %s %.0f" % (i, n, u) for i, (n, u) in top)))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Compare two `ds4 --dump-logits` files (float32 [n_tokens, vocab]).

    scripts/compare_logits.py A.bin B.bin N_TOKENS [--from K]

Prints the top-1 agreement and the max / median per-position max |dlogit|,
over all positions and over positions >= K (e.g. the decoded ones when the
dumps were made with --decode-from K). Used for the CUDA-vs-CPU exactness
figures in docs/BENCHMARKS.md.
"""
import sys

import numpy as np


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    a = np.fromfile(sys.argv[1], dtype="<f4")
    b = np.fromfile(sys.argv[2], dtype="<f4")
    n = int(sys.argv[3])
    k = int(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[4] == "--from" else 0
    if a.size != b.size or a.size % n:
        sys.exit(f"sizes differ or do not divide by {n}: {a.size} vs {b.size}")
    a = a.reshape(n, -1)
    b = b.reshape(n, -1)
    for name, lo in (("all", 0), (f"from {k}", k)) if k else (("all", 0),):
        x, y = a[lo:], b[lo:]
        top = np.mean(np.argmax(x, 1) == np.argmax(y, 1))
        d = np.max(np.abs(x.astype(np.float64) - y), 1)
        print(f"{name}: positions {len(x)}, top-1 agreement {100 * top:.2f}%, "
              f"max |dlogit| {d.max():.4g}, median per-position max {np.median(d):.4g}, "
              f"logit range {x.min():.3g}..{x.max():.3g}, finite {bool(np.isfinite(y).all())}")


if __name__ == "__main__":
    main()

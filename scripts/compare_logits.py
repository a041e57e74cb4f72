#!/usr/bin/env python3
"""Compare two `ds4 --dump-logits` files (float32 [n_tokens, vocab]).

    scripts/compare_logits.py A.bin B.bin N_TOKENS [--from K]

Prints the top-1 agreement and the max / median per-position max |dlogit|,
over all positions and over positions >= K (e.g. the decoded ones when the
dumps were made with --decode-from K), and the first position whose logits
differ at all. Used for the CUDA-vs-CPU exactness figures in
docs/BENCHMARKS.md. Runs with NumPy where it is installed, in plain Python
(slower, the same figures) where it is not.
"""
import array
import sys

try:
    import numpy as np
except ImportError:  # plain Python below
    np = None


def rows_numpy(a_path, b_path, n):
    a = np.fromfile(a_path, dtype="<f4")
    b = np.fromfile(b_path, dtype="<f4")
    if a.size != b.size or a.size % n:
        sys.exit(f"sizes differ or do not divide by {n}: {a.size} vs {b.size}")
    a = a.reshape(n, -1)
    b = b.reshape(n, -1)
    same = np.argmax(a, 1) == np.argmax(b, 1)
    d = np.max(np.abs(a.astype(np.float64) - b), 1)
    return list(same), list(d), float(a.min()), float(a.max()), bool(np.isfinite(b).all())


def rows_plain(a_path, b_path, n):
    a, b = array.array("f"), array.array("f")
    with open(a_path, "rb") as f:
        a.frombytes(f.read())
    with open(b_path, "rb") as f:
        b.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
        b.byteswap()
    if len(a) != len(b) or len(a) % n:
        sys.exit(f"sizes differ or do not divide by {n}: {len(a)} vs {len(b)}")
    v = len(a) // n
    same, d = [], []
    for i in range(n):
        ra, rb = a[i * v:(i + 1) * v], b[i * v:(i + 1) * v]
        same.append(max(range(v), key=ra.__getitem__) == max(range(v), key=rb.__getitem__))
        d.append(max(abs(float(x) - float(y)) for x, y in zip(ra, rb)))
    finite = all(y == y and abs(y) != float("inf") for y in b)
    return same, d, min(a), max(a), finite


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    n = int(sys.argv[3])
    k = int(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[4] == "--from" else 0
    same, d, lo_v, hi_v, finite = (rows_numpy if np is not None else rows_plain)(sys.argv[1], sys.argv[2], n)
    first = next((i for i, x in enumerate(d) if x > 0), None)
    for name, lo in (("all", 0), (f"from {k}", k)) if k else (("all", 0),):
        s, dd = same[lo:], sorted(d[lo:])
        med = dd[len(dd) // 2] if len(dd) % 2 else 0.5 * (dd[len(dd) // 2 - 1] + dd[len(dd) // 2])
        print(f"{name}: positions {len(s)}, top-1 agreement {100 * sum(s) / len(s):.2f}%, "
              f"max |dlogit| {dd[-1]:.4g}, median per-position max {med:.4g}, "
              f"logit range {lo_v:.3g}..{hi_v:.3g}, finite {finite}")
    print(f"first differing position: {first if first is not None else 'none'}")


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# sass_same.sh - the CUDA kernels a change compiles differently: every
# backend/cuda/*.cu compiled for one architecture (default sm_90) at REV
# (default HEAD) and in the working tree, each file's kernels compared by
# scripts/cubin_text.py. Prints the differing kernels under their file's
# name; nothing under a file means its kernels are byte for byte REV's.
#
#   scripts/sass_same.sh [REV] [ARCH]        # e.g. scripts/sass_same.sh fb693d3 90
set -euo pipefail
rev=${1:-HEAD}
arch=${2:-90}
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$nvcc" ] || { echo "sass_same: no nvcc (NVCC names one)" >&2; exit 1; }
cd "$(dirname "$0")/.."
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/tree" "$tmp/old" "$tmp/new"
git archive "$rev" | tar x -C "$tmp/tree"
flags=(-O3 -std=c++17 "-gencode=arch=compute_$arch,code=sm_$arch" -cubin)
for f in backend/cuda/*.cu; do
    b=$(basename "$f" .cu)
    [ -f "$tmp/tree/$f" ] && "$nvcc" "${flags[@]}" -I"$tmp/tree" "$tmp/tree/$f" -o "$tmp/old/$b.cubin" &
    "$nvcc" "${flags[@]}" -I. "$f" -o "$tmp/new/$b.cubin" &
    while [ "$(jobs -r | wc -l)" -ge "$(nproc)" ]; do sleep 1; done
done
wait
for f in "$tmp"/new/*.cubin; do
    b=$(basename "$f" .cubin)
    echo "== $b"
    if [ -f "$tmp/old/$b.cubin" ]; then python3 scripts/cubin_text.py "$tmp/old/$b.cubin" "$f"; else echo "(new file)"; fi
done

#!/usr/bin/env bash
# test_cubin_text.sh - scripts/cubin_text.py, the kernel-by-kernel compare
# behind scripts/sass_same.sh: two small CUDA files compiled for sm_90, one
# kernel the same in both, one changed, one only in the second; exactly the
# last two are named. Skips without nvcc. Prints "RESULT passed failed skipped".
set -u
cd "$(dirname "$0")/.."
. tests/counters_lib.sh
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [ ! -x "$nvcc" ]; then
    skipt "all: no nvcc"
    echo "RESULT $pass $fail $skip"
    exit 0
fi
cat > "$tmp/a.cu" <<'EOS'
__global__ void k_same(float *y) { y[threadIdx.x] *= 2.0f; }
__global__ void k_changed(float *y) { y[threadIdx.x] += 1.0f; }
EOS
cat > "$tmp/b.cu" <<'EOS'
__global__ void k_same(float *y) { y[threadIdx.x] *= 2.0f; }
__global__ void k_changed(float *y) { y[threadIdx.x] = y[threadIdx.x] * y[threadIdx.x] + 3.0f; }
__global__ void k_added(int *y) { y[threadIdx.x] ^= 5; }
EOS
for v in a b; do
    "$nvcc" -O3 -gencode=arch=compute_90,code=sm_90 -cubin "$tmp/$v.cu" -o "$tmp/$v.cubin" 2> "$tmp/$v.err" ||
        bad "nvcc $v.cu: $(head -3 "$tmp/$v.err")"
done
out=$(python3 scripts/cubin_text.py "$tmp/a.cubin" "$tmp/b.cubin" 2>&1); rc=$?
names=$(printf '%s\n' "$out" | awk '{print $NF}' | tr '\n' ' ')
if [ $rc -eq 0 ] && [ "$names" = "_Z7k_addedPi _Z9k_changedPf " ] &&
    printf '%s\n' "$out" | grep -qE '^ +0 -> +[1-9][0-9]* instructions  _Z7k_addedPi$'; then
    ok "the changed and the added kernel, and only they"
else
    bad "compare: rc $rc, '$out'"
fi
out=$(python3 scripts/cubin_text.py "$tmp/a.cubin" "$tmp/a.cubin" 2>&1); rc=$?
[ $rc -eq 0 ] && [ -z "$out" ] && ok "a file against itself: nothing" || bad "self: rc $rc, '$out'"
out=$(python3 scripts/cubin_text.py "$tmp/a.cu" "$tmp/b.cubin" 2>&1); rc=$?
[ $rc -ne 0 ] && printf '%s' "$out" | grep -q 'not a 64-bit ELF file' && ok "a file that is no cubin is refused, named" ||
    bad "not a cubin: rc $rc, '$out'"
# scripts/sass_loops.py: a kernel without a loop has none, one with a
# run-time loop has a backward branch, and the opcode names read the
# straight kernel's end (EXIT) and its loads and stores
cat > "$tmp/l.cu" <<'EOS'
__global__ void k_loop(float *y, int n) { float s = 0.0f; for (int i = 0; i < n; i++) s += y[i * 37]; y[0] = s; }
EOS
"$nvcc" -O3 -gencode=arch=compute_90,code=sm_90 -cubin "$tmp/l.cu" -o "$tmp/l.cubin" 2> "$tmp/l.err" ||
    bad "nvcc l.cu: $(head -3 "$tmp/l.err")"
out=$(python3 scripts/sass_loops.py "$tmp/l.cubin" k_loop 2>&1); rc=$?
[ $rc -eq 0 ] && printf '%s' "$out" | grep -qE '^_Z6k_loopPfi: [0-9]+ instructions; loops \(first, last, length\): \([0-9]+,[0-9]+,[0-9]+\)' &&
    ok "sass_loops: the run-time loop found" || bad "sass_loops loop: rc $rc, '$out'"
out=$(python3 scripts/sass_loops.py "$tmp/a.cubin" k_same 2>&1); rc=$?
[ $rc -eq 0 ] && printf '%s' "$out" | grep -qE '^_Z6k_samePf: [0-9]+ instructions; loops \(first, last, length\): *$' &&
    ok "sass_loops: no loop in straight code" || bad "sass_loops straight: rc $rc, '$out'"
echo "RESULT $pass $fail $skip"
[ "$fail" = 0 ]

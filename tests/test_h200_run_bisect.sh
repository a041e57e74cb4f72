#!/usr/bin/env bash
# test_h200_run_bisect.sh - bench/h200_run.sh's bisection: a configuration
# of several switches whose GPU tests fail, or whose logits are not the
# defaults' bits, is tried one switch at a time in the same call, and the
# summary names the switch that does it. Run with a stand-in package (a
# "ds4" whose logits change under one switch, a test binary that fails under
# another), so no GPU is needed. Prints "RESULT passed failed skipped".
set -u
cd "$(dirname "$0")/.."
. tests/h200_run_lib.sh
pkg=$tmp/pkg
mkdir -p "$pkg/bin" "$pkg/tests" "$tmp/shm"
echo "1 2 3" > "$pkg/ids512.txt"
# the stand-ins: ds4-quantize makes its --out file; ds4 dumps "logits" that
# DS4_CUDA_ROUTE_REG=1 changes; test_cuda_ops fails under DS4_CUDA_IS_NARROW=1
cat > "$pkg/bin/ds4-quantize" <<'EOF'
#!/usr/bin/env bash
while [ $# -gt 0 ]; do [ "$1" = --out ] && echo model > "$2"; shift; done
EOF
cat > "$pkg/bin/ds4" <<'EOF'
#!/usr/bin/env bash
while [ $# -gt 0 ]; do
    [ "$1" = --dump-logits ] && echo "logits ${DS4_CUDA_ROUTE_REG:-0}" > "$2"
    shift
done
EOF
for t in test_cuda_decode test_cuda_kernels test_cuda_session test_cuda_moe test_model_golden test_decode_batch; do
    printf '#!/usr/bin/env bash\necho "PASS stand-in"\necho "RESULT 1 0 0"\n' > "$pkg/tests/$t"
done
cat > "$pkg/tests/test_cuda_ops" <<'EOF'
#!/usr/bin/env bash
if [ "${DS4_CUDA_IS_NARROW:-0}" = 1 ]; then echo "FAIL indexer ids"; echo "RESULT 0 1 0"; exit 1; fi
echo "PASS indexer ids"; echo "RESULT 1 0 0"
EOF
chmod +x "$pkg"/bin/* "$pkg"/tests/*

out=$(OUT="$tmp/o" SHM="$tmp/shm" PKG="$pkg" TEST_CFGS="isn1+rreg1 qbn1" SAME_CFGS="isn1+rreg1 qbn1" \
    bash bench/h200_run.sh tests same 2>&1)
sum=$(cat "$tmp/o/summary.txt" 2>/dev/null)
has() { printf '%s\n' "$sum" | grep -qF -- "$1"; }
if has "tests (isn1+rreg1) bisect: isn1 alone on test_cuda_ops: 0 passed, 1 failed" &&
    has "tests (isn1+rreg1) bisect: rreg1 alone on test_cuda_ops: 1 passed, 0 failed"; then
    ok "a failing test configuration is bisected to its switch"
else
    bad "tests bisect" "summary: $sum"
fi
if has "tests (qbn1): 6 passed, 0 failed" && ! has "tests (qbn1) bisect"; then
    ok "a passing configuration is not bisected"
else
    bad "tests pass" "summary: $sum"
fi
if has "same: isn1+rreg1 DIFFERS" && has "same (isn1+rreg1) bisect: isn1 alone gives the defaults' bits" &&
    has "same (isn1+rreg1) bisect: rreg1 alone DIFFERS"; then
    ok "a configuration that changes the logits is bisected to its switch"
else
    bad "same bisect" "summary: $sum"
fi
if has "same: qbn1 gives the defaults' logits bit for bit" && ! has "same (qbn1) bisect"; then
    ok "a configuration that keeps the bits is not bisected"
else
    bad "same keeps" "summary: $sum"
fi
[ -s "$tmp/shm/syn8.gguf" ] && [ -s "$tmp/shm/same_new.bin" ] && [ -s "$tmp/shm/same_p.bin" ] &&
    ok "models and logits go to SHM" || bad "scratch" "nothing in SHM ($tmp/shm): $(ls "$tmp/shm")"

out=$(OUT="$tmp/o2" SHM="$tmp/shm" PKG="$pkg" BISECT=0 SAME_CFGS="isn1+rreg1" TEST_CFGS="isn1+rreg1" \
    bash bench/h200_run.sh tests same 2>&1)
if printf '%s\n' "$out" | grep -q "DIFFERS from the defaults" && ! printf '%s\n' "$out" | grep -q "bisect"; then
    ok "BISECT=0 reports without bisecting"
else
    bad "BISECT=0" "output: $out"
fi
out=$(OUT="$tmp/o3" SHM="$tmp/shm" PKG="$pkg" BISECT_UNTIL=0 SAME_CFGS="isn1+rreg1" \
    bash bench/h200_run.sh same 2>&1)
if printf '%s\n' "$out" | grep -q "same (isn1+rreg1): bisect stopped, out of time"; then
    ok "a bisection past its time stops and says so"
else
    bad "BISECT_UNTIL" "output: $out"
fi
h2_result

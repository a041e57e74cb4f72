#!/usr/bin/env bash
# test_cuda_optin_forms.sh - the GPU tests of the routed experts under the
# opt-in kernel forms that no GPU has run yet (docs/CUDA.md "The routed
# kernels' SASS under ncu's source view"): DS4_CUDA_IQ2_PRMT=1 (the IQ2_XXS
# selector form through prmt.b32, batch and one token) and
# DS4_CUDA_MOE_DOWN_ENDS=1 (the batch's routed down fetching its output
# values with its rows), and DS4_CUDA_IQ2_ROW256=1 (the batch's gate+up on
# tables of 256-byte grid rows, section "The batch's gate+up on 256-byte
# grid rows"), and DS4_CUDA_MOE_DOWN_PAIR=1 (the batch's routed down by
# warp pairs, three activations a warp: cuda_moe_down_pair.cu). Each binary holds the GPU's numbers to the CPU's
# and each batched token's to its own decode step, so a form that changed
# a bit fails here. The switches are read once a process, hence one run a
# set. Skips, saying why, where the binaries skip (no GPU, no CUDA build).
set -u
BIN=${DS4_BIN_DIR:-.}
# the test binaries: make's build/tests, or a bench/h200_pack.sh package's
# tests/ beside its bin/
T=${DS4_TEST_DIR:-build/tests}
[ -z "${DS4_TEST_DIR:-}" ] && [ -d "$BIN/../tests" ] && T=$BIN/../tests
pass=0; fail=0; skip=0
ok()  { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
skp() { echo "SKIP $1"; skip=$((skip + 1)); }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

run() { # name, env..., binary
    local name=$1; shift
    local bin=${*: -1}
    if [ ! -x "$bin" ]; then skp "$name: $bin not built"; return; fi
    env "$@" > "$tmp/out" 2>&1
    local rc=$? res np nf
    res=$(grep '^RESULT' "$tmp/out" | tail -1)
    read -r _ np nf _ <<< "$res"
    if [ "$rc" -ne 0 ] || [ -z "$res" ] || [ "${nf:-1}" != 0 ]; then
        bad "$name: rc $rc, ${res:-no RESULT line}; $(grep -m3 '^FAIL' "$tmp/out" | tr '\n' ' ')"
    elif [ "${np:-0}" = 0 ]; then
        skp "$name: $(grep -m1 '^SKIP' "$tmp/out" || echo 'nothing ran')"
    else
        ok "$name: $res"
    fi
}

# test_decode_batch passes on the CPU alone: without a GPU these runs would
# say nothing about the forms
if ! nvidia-smi -L > /dev/null 2>&1; then
    skp "the opt-in forms: no CUDA device (nvidia-smi -L fails)"
    echo "RESULT $pass $fail $skip"
    exit 0
fi
forms=(DS4_CUDA_IQ2_PRMT=1 DS4_CUDA_MOE_DOWN_ENDS=1)
run "test_cuda_moe, ${forms[*]}" "${forms[@]}" "$T/test_cuda_moe"
run "test_cuda_moe, ${forms[*]} DS4_CUDA_IQ2_SEL=1 (one token's selector form)" "${forms[@]}" DS4_CUDA_IQ2_SEL=1 \
    "$T/test_cuda_moe"
run "test_decode_batch, ${forms[*]}" "${forms[@]}" "$T/test_decode_batch"
run "test_cuda_moe, DS4_CUDA_IQ2_ROW256=1" DS4_CUDA_IQ2_ROW256=1 "$T/test_cuda_moe"
run "test_decode_batch, DS4_CUDA_IQ2_ROW256=1" DS4_CUDA_IQ2_ROW256=1 "$T/test_decode_batch"
run "test_cuda_moe, DS4_CUDA_MOE_DOWN_PAIR=1" DS4_CUDA_MOE_DOWN_PAIR=1 "$T/test_cuda_moe"
run "test_decode_batch, DS4_CUDA_MOE_DOWN_PAIR=1" DS4_CUDA_MOE_DOWN_PAIR=1 "$T/test_decode_batch"
echo "RESULT $pass $fail $skip"
[ "$fail" = 0 ]

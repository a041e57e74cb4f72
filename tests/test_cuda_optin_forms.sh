#!/usr/bin/env bash
# test_cuda_optin_forms.sh - the GPU tests of the routed experts under
# their kernels' other forms, which the defaults leave to shapes they do
# not take or to A/B runs. Since the fiftieth session the batch's gate+up
# runs on tables of 256-byte grid rows (DS4_CUDA_IQ2_ROW256) where its grid
# fits and otherwise through the raw prmt (DS4_CUDA_IQ2_PRMT), and the
# batch's routed down by warp pairs (DS4_CUDA_MOE_DOWN_PAIR) where a pair
# has at most 64 rows and otherwise from registers with its rows' end
# values fetched with them (DS4_CUDA_MOE_DOWN_ENDS); docs/CUDA.md "The
# fiftieth session's defaults". Here: the
# fallbacks (ROW256=0 PAIR=0), the forms before them (all four 0), and one
# token's opt-in selector form (DS4_CUDA_IQ2_SEL=1) on its three tables:
# the 256-byte grid rows (with ROW256 on, its default: SEL 3 of
# cuda_moe_g1.cuh), through the raw prmt (ROW256=0: SEL 2), and the first
# form (PRMT=0: SEL 1); and one token's down with three stages a warp
# (DS4_CUDA_MOE1_DCFG=16x3: both of a warp's units asked for before the
# dependency wait).
# Each binary holds the GPU's numbers to the CPU's and each batched
# token's to its own decode step, so a form that changed a bit fails here.
# The switches are read once a process, hence one run a set. Skips, saying
# why, where the binaries skip (no GPU, no CUDA build).
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
    skp "the routed experts' other forms: no CUDA device (nvidia-smi -L fails)"
    echo "RESULT $pass $fail $skip"
    exit 0
fi
fallback=(DS4_CUDA_IQ2_ROW256=0 DS4_CUDA_MOE_DOWN_PAIR=0)
before=(DS4_CUDA_IQ2_ROW256=0 DS4_CUDA_MOE_DOWN_PAIR=0 DS4_CUDA_IQ2_PRMT=0 DS4_CUDA_MOE_DOWN_ENDS=0)
run "test_cuda_moe, ${fallback[*]}" "${fallback[@]}" "$T/test_cuda_moe"
run "test_decode_batch, ${fallback[*]}" "${fallback[@]}" "$T/test_decode_batch"
run "test_cuda_moe, ${before[*]}" "${before[@]}" "$T/test_cuda_moe"
run "test_decode_batch, ${before[*]}" "${before[@]}" "$T/test_decode_batch"
run "test_cuda_moe, DS4_CUDA_IQ2_SEL=1 (one token's selector form, 256-byte grid rows)" DS4_CUDA_IQ2_SEL=1 "$T/test_cuda_moe"
run "test_decode_batch, DS4_CUDA_IQ2_SEL=1" DS4_CUDA_IQ2_SEL=1 "$T/test_decode_batch"
run "test_cuda_moe, DS4_CUDA_IQ2_SEL=1 DS4_CUDA_IQ2_ROW256=0 (prmt)" DS4_CUDA_IQ2_SEL=1 DS4_CUDA_IQ2_ROW256=0 "$T/test_cuda_moe"
run "test_cuda_moe, DS4_CUDA_IQ2_SEL=1 DS4_CUDA_IQ2_PRMT=0" DS4_CUDA_IQ2_SEL=1 DS4_CUDA_IQ2_PRMT=0 "$T/test_cuda_moe"
run "test_cuda_moe, DS4_CUDA_MOE1_DCFG=16x3 (one token's down, three stages)" DS4_CUDA_MOE1_DCFG=16x3 "$T/test_cuda_moe"
echo "RESULT $pass $fail $skip"
[ "$fail" = 0 ]
